//! `ferrite plan` on a step that does not fit: the ranked ways to make it fit, each a command
//! whose flags, planned again, fit with the peak the route promised; and when nothing ferrite can
//! run fits, the closest plan in human-readable sizes. The held-out example of issue 34: Mistral-7B
//! at seq 2048 on a 24 GB card gets a LoRA route, and `ferrite train` with exactly its flags on the
//! tiny Mistral folder of `ferrite-models/tests/data/hf` (`FERRITE_HF_FIXTURES` runs it on a twin)
//! measures on `sim` the peak `ferrite plan` predicts for that folder.
mod common;

use std::process::Command;

fn ferrite(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrite")).args(args).output().expect("run ferrite");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn data(name: &str) -> String {
    format!("{}/../ferrite-plan/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// GPT-2 small at seq 1024, batch 16, on a T4: 52 GiB of activations, so it does not fit as asked.
fn gpt2_on_t4() -> Vec<String> {
    ["plan", "--hf-config", &data("gpt2.json"), "--seq", "1024", "--device", "sim:t4-16gb"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn run_json(args: &[String]) -> serde_json::Value {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = ferrite(&refs);
    assert!(ok, "ferrite {}: {err}", args.join(" "));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn every_route_replanned_with_its_own_flags_fits_with_the_promised_peak() {
    let mut args = gpt2_on_t4();
    args.extend(["--batch", "16", "--json"].map(String::from));
    let j = run_json(&args);
    assert_eq!(j["fits"], false, "the premise: batch 16 does not fit");
    let routes = j["way_forward"]["routes"].as_array().expect("routes");
    assert!(!routes.is_empty(), "{}", j["way_forward"]);
    // The same training first, then adapters only; by compute within each.
    let tier = |r: &serde_json::Value| r["adapters_only"] == true;
    assert!(routes.windows(2).all(|w| !tier(&w[0]) || tier(&w[1])), "adapters after the model itself");
    // Sharded routes (ZeRO over several GPUs) rank after one GPU's; they are replanned in
    // sharded_routes_replanned_as_zero_plans_fit_with_the_promised_per_rank_peak.
    let one_gpu = |r: &&serde_json::Value| r["gpus"] == 1;
    for adapters in [false, true] {
        let costs: Vec<f64> = routes
            .iter()
            .filter(one_gpu)
            .filter(|r| tier(r) == adapters)
            .map(|r| r["relative_cost"].as_f64().unwrap())
            .collect();
        assert!(costs.windows(2).all(|w| w[0] <= w[1]), "ranked by cost: {costs:?}");
    }
    assert!(routes.iter().any(|r| !tier(r)) && routes.iter().any(tier), "both kinds fit here");
    for r in routes.iter().filter(one_gpu) {
        assert_eq!(r["fits"], true);
        assert_eq!(r["micro_batch"].as_u64().unwrap() * r["accum_steps"].as_u64().unwrap(), 16, "{r}");
        // The route's flags are `ferrite train` flags that `ferrite plan` accepts too.
        let mut again = gpt2_on_t4();
        again.extend(r["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()));
        again.push("--json".into());
        let p = run_json(&again);
        assert_eq!(p["fits"], true, "{again:?}");
        // Accumulation's memory is that of two micro-steps for any count from 2 on, so the route
        // (planned with two) promises the peak of the full count.
        assert_eq!(p["peak_reserved_bytes"], r["peak_reserved_bytes"], "{again:?}");
    }
}

#[test]
fn text_lists_the_ways_with_their_commands_and_collapses_equal_layers() {
    let mut args = gpt2_on_t4();
    args.extend(["--batch", "16"].map(String::from));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = ferrite(&refs);
    assert!(ok, "{err}");
    assert!(out.contains("DOES NOT FIT") && out.contains("ways to make it fit"), "{out}");
    assert!(out.contains("ferrite train --hf-model"), "{out}");
    assert!(out.contains("--batch-size"), "{out}");
    // Twelve equal blocks are one line.
    assert!(out.contains("transformer.h.0\u{2013}11") && out.contains(" each"), "{out}");
    assert!(!out.contains("transformer.h.5 "), "{out}");
    // Where it runs out reads as a sentence.
    assert!(out.contains("it runs out of memory in the forward pass of step 1"), "{out}");
}

#[test]
fn when_nothing_fits_it_says_by_how_much_in_readable_sizes() {
    let (ok, out, err) = ferrite(&[
        "plan",
        "--hf-config",
        &data("mistral-7b.json"),
        "--seq",
        "2048",
        "--batch",
        "1",
        "--device",
        "sim:t4-16gb",
        "--target-batch",
        "2",
    ]);
    assert!(ok, "{err}");
    // Its bf16 weights alone (13.5 GiB) nearly fill a T4: no route leaves room for the step.
    assert!(out.contains("nothing ferrite can run fits on sim:t4-16gb"), "{out}");
    assert!(out.contains("GiB more than the"), "{out}");
    assert!(!out.contains(" bytes"), "sizes must be human-readable: {out}");
    assert!(out.contains("closest: ferrite train"), "{out}");
}

#[test]
fn when_only_adapters_fit_the_way_forward_is_lora_with_a_bf16_base() {
    // GPT-2 small's weights, gradients and AdamW moments alone are ~1.9 GiB: no full fine-tuning
    // fits in one 1 GiB card, LoRA on a bf16 base does (and ZeRO-3 over several such cards).
    let args: Vec<String> = ["plan", "--hf-config", &data("gpt2.json"), "--seq", "64", "--device", "sim:1GiB"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut json_args = args.clone();
    json_args.extend(["--batch", "2", "--json"].map(String::from));
    let j = run_json(&json_args);
    assert_eq!(j["fits"], false);
    let routes = j["way_forward"]["routes"].as_array().expect("routes");
    assert!(!routes.is_empty(), "{}", j["way_forward"]);
    assert!(routes.iter().any(|r| r["adapters_only"] == true), "{}", j["way_forward"]);
    for r in routes {
        if r["gpus"].as_u64() != Some(1) {
            // Full fine-tuning fits only sharded over several cards (ZeRO-3: weights sharded too).
            assert_eq!(r["data_parallel"], "zero3", "{r}");
            continue;
        }
        assert_eq!(r["adapters_only"], true, "on one card only adapters fit: {r}");
        let flags: Vec<String> =
            r["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
        assert!(flags.windows(2).any(|w| w[0] == "--lora-rank"), "{flags:?}");
        assert!(flags.windows(2).any(|w| w[0] == "--base-dtype" && w[1] == "bf16"), "{flags:?}");
        // The route's flags, planned again, fit with the promised peak.
        let mut again = args.clone();
        again.extend(flags);
        again.push("--json".into());
        let p = run_json(&again);
        assert_eq!(p["fits"], true, "{again:?}");
        assert_eq!(p["peak_reserved_bytes"], r["peak_reserved_bytes"], "{again:?}");
    }
    let mut text_args = args.clone();
    text_args.extend(["--batch", "2"].map(String::from));
    let refs: Vec<&str> = text_args.iter().map(String::as_str).collect();
    let (ok, out, err) = ferrite(&refs);
    assert!(ok, "{err}");
    assert!(out.contains("LoRA r8 on c_attn, base weights in bf16"), "{out}");
    assert!(out.contains("--lora-rank 8 --lora-targets c_attn --base-dtype bf16"), "{out}");
}

/// An MLP of 12,156,010 parameters (weights 46 MiB): its weights, gradients and AdamW moments alone
/// (16 B/param, 185 MiB) exceed a 170 MiB card, so no single-GPU setting fits; ZeRO-2 shards the
/// optimizer state and the gradients, and fits over a few of these cards (ZeRO-3, sharding the
/// weights too, over fewer).
fn mlp_on_170mib() -> Vec<String> {
    ["plan", "--model", "mlp", "--hidden", "2000", "--layers", "4", "--batch", "8", "--device", "sim:170MiB"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[test]
fn sharded_routes_replanned_as_zero_plans_fit_with_the_promised_per_rank_peak() {
    let mut args = mlp_on_170mib();
    args.push("--json".into());
    let j = run_json(&args);
    assert_eq!(j["fits"], false, "the premise: one card is too small");
    let routes = j["way_forward"]["routes"].as_array().expect("routes");
    assert!(!routes.is_empty(), "ZeRO-2 over some cards fits: {}", j["way_forward"]);
    let fewest = routes.iter().map(|r| r["gpus"].as_u64().unwrap()).min().unwrap();
    let stage_of = |r: &serde_json::Value| match r["data_parallel"].as_str() {
        Some("zero2") => "2",
        Some("zero3") => "3",
        _ => panic!("ZeRO-1 keeps the full gradients twice (DDP's buckets), so only ZeRO-2/3 fit: {r}"),
    };
    let fewest_route = routes.iter().min_by_key(|r| r["gpus"].as_u64().unwrap()).unwrap();
    let fewest_stage = stage_of(fewest_route);
    for r in routes {
        let gpus = r["gpus"].as_u64().unwrap();
        assert!(gpus > 1, "no single-GPU route fits: {r}");
        let stage = stage_of(r);
        assert_eq!(r["launcher"], format!("mpirun -np {gpus}"));
        let flags: Vec<String> =
            r["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
        assert!(flags.windows(3).any(|w| w[0] == "--distributed" && w[1] == "--zero" && w[2] == stage), "{flags:?}");
        // Each GPU takes its share of the effective batch of 8.
        let per_gpu = r["micro_batch"].as_u64().unwrap() * r["accum_steps"].as_u64().unwrap();
        assert_eq!(per_gpu, 8u64.div_ceil(gpus), "{r}");
        // `ferrite plan --zero S --gpus-per-node N` with the route's flags plans the same rank's peak.
        let mut again = mlp_on_170mib();
        again.retain(|a| a != "--batch" && a != "8");
        again.extend(flags.iter().filter(|f| *f != "--distributed").cloned());
        again.extend(["--gpus-per-node".to_string(), gpus.to_string(), "--json".to_string()]);
        let p = run_json(&again);
        let sharded = &p["zero"]["ferrite_sharded"];
        assert_eq!(sharded["fits"], true, "{again:?}");
        let rank = r["planned_rank"].as_u64().unwrap() as usize;
        assert_eq!(sharded["ranks"][rank]["peak_reserved_bytes"], r["peak_reserved_bytes"], "{again:?}");
        assert_eq!(sharded["max_rank"].as_u64().unwrap() as usize, rank, "the planned rank is the fullest");
    }
    // The fewest: one card fewer does not fit even with the leanest settings.
    let mut fewer = mlp_on_170mib();
    fewer.retain(|a| a != "--batch" && a != "8");
    let n = (fewest - 1).to_string();
    let per_gpu = 8u64.div_ceil(fewest - 1).min(2).to_string();
    fewer.extend(
        [
            "--batch",
            "1",
            "--accum-steps",
            &per_gpu,
            "--amp",
            "bf16",
            "--checkpoint-activations",
            "--zero",
            fewest_stage,
            "--gpus-per-node",
            &n,
            "--json",
        ]
        .map(String::from),
    );
    if fewest > 2 {
        assert_eq!(run_json(&fewer)["zero"]["ferrite_sharded"]["fits"], false, "{fewer:?}");
    }
    // Text: the command that runs it, mpirun first.
    let text = mlp_on_170mib();
    let (ok, out, err) = ferrite(&text.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{err}");
    assert!(out.contains(&format!("ZeRO-{fewest_stage} over {fewest} GPUs")), "{out}");
    assert!(out.contains(&format!("mpirun -np {fewest} ferrite train --model mlp --hidden 2000 --layers 4")), "{out}");
    assert!(out.contains(&format!("--distributed --zero {fewest_stage}")), "{out}");
}

fn hf(name: &str) -> String {
    ferrite_test_support::hf_fixtures().join(name).display().to_string()
}

/// Mistral-7B (config of `mistral-7b.json`) at seq 2048 on an RTX 4090: its f32 weights alone are
/// 27 GiB, its bf16 weights 13.5 GiB. Built in bf16 from the start (`--base-dtype bf16`), LoRA
/// fits; the route's flags planned again fit with the promised peak, and `ferrite train` with
/// exactly these flags on a small Mistral folder measures the peak its plan predicts (2 %).
#[test]
fn mistral_7b_on_a_24gb_card_fits_with_lora_on_a_bf16_base_and_trains_as_planned() {
    let card = ["--device", "sim:rtx4090-24gb"];
    let args: Vec<String> = ["plan", "--hf-config", &data("mistral-7b.json"), "--seq", "2048"]
        .iter()
        .chain(&card)
        .map(|s| s.to_string())
        .collect();
    let mut asked = args.clone();
    asked.extend(["--batch", "1", "--json"].map(String::from));
    let j = run_json(&asked);
    assert_eq!(j["fits"], false, "the premise: full fine-tuning does not fit");
    let routes = j["way_forward"]["routes"].as_array().expect("routes");
    let route = routes
        .iter()
        .find(|r| {
            let f: Vec<&str> = r["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
            r["fits"] == true
                && f.windows(2).any(|w| w[0] == "--lora-rank")
                && f.windows(2).any(|w| w[0] == "--base-dtype" && w[1] == "bf16")
        })
        .unwrap_or_else(|| panic!("no fitting LoRA route: {}", j["way_forward"]));
    let (peak, usable) = (route["peak_reserved_bytes"].as_f64().unwrap(), j["usable_bytes"].as_f64().unwrap());
    // Above the bf16 weights (7.24e9 x 2 bytes), within the card.
    assert!(peak > 7.24e9 * 2.0 && peak <= usable, "{route} vs usable {usable}");
    let flags: Vec<String> =
        route["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    let mut again = args.clone();
    again.extend(flags.iter().cloned());
    again.push("--json".into());
    let p = run_json(&again);
    assert_eq!(p["fits"], true, "{again:?}");
    assert_eq!(p["peak_reserved_bytes"], route["peak_reserved_bytes"], "{again:?}");

    // The same flags on a small model of the family: planned, then trained on `sim`.
    let dir = tempfile::tempdir().unwrap();
    let (m, text, out) = (hf("mistral"), hf("text.txt"), dir.path().join("adapter").display().to_string());
    let flag_refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut plan = vec!["plan", "--hf-model", &m, "--seq", "256", "--json"];
    plan.extend(card);
    plan.extend(&flag_refs);
    let (ok, planned, err) = ferrite(&plan);
    assert!(ok, "{plan:?}: {err}");
    let planned: serde_json::Value = serde_json::from_str(&planned).unwrap();
    assert_eq!(planned["fits"], true);
    let predicted = [&planned["peak_reserved_bytes"], &planned["peak_allocated_bytes"]].map(|v| v.as_f64().unwrap());
    let mut train = vec!["train", "--hf-model", &m, "--data", &text, "--seq", "256", "--steps", "3", "--no-progress"];
    train.extend(["--out", &out]);
    train.extend(card);
    train.extend(&flag_refs);
    let (ok, stdout, err) = ferrite(&train);
    assert!(ok, "{train:?}: {err}\n{stdout}");
    assert!(stdout.contains("LoRA r=") && stdout.contains("(bfloat16)"), "{stdout}");
    // The peaks of the run's memory summary: reserved, allocated.
    for (row, predicted) in ["| GPU reserved memory", "| Allocated memory"].iter().zip(predicted) {
        let line = stdout.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("{row}: {stdout}"));
        let measured = common::size(line.split('|').nth(3).unwrap());
        let e = (predicted - measured) / measured;
        assert!(e.abs() <= 0.02, "{row}: predicted {predicted} measured {measured} ({flags:?})\n{stdout}");
    }
}
