//! `ferrite plan` from the command line: the JSON keys tools read, text output, bad input.
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

#[test]
fn json_has_the_keys_and_measure_adds_the_measured_peaks() {
    let (ok, out, err) = ferrite(&[
        "plan",
        "--model",
        "transformer",
        "--layers",
        "2",
        "--d-model",
        "64",
        "--heads",
        "4",
        "--seq",
        "32",
        "--batch",
        "4",
        "--device",
        "sim:a100-40gb",
        "--amp",
        "bf16",
        "--json",
        "--measure",
    ]);
    assert!(ok, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    for k in [
        "fits",
        "parameters",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "capacity_bytes",
        "breakdown",
        "measured_peak_allocated_bytes",
        "measured_peak_reserved_bytes",
    ] {
        assert!(j.get(k).is_some(), "{k} missing in {out}");
    }
    assert_eq!(j["fits"], true);
    assert_eq!(j["capacity_bytes"], 42_505_273_344u64);
}

#[test]
fn text_output_names_the_peak_and_the_breakdown() {
    let (ok, out, err) = ferrite(&["plan", "--hf-config", &data("gpt2.json"), "--batch", "2", "--seq", "256"]);
    assert!(ok, "{err}");
    assert!(out.contains("124439808 parameters"), "{out}");
    assert!(out.contains("FITS") && out.contains("optimizer state") && out.contains("the peak is in"), "{out}");
    assert!(out.contains("transformer.h.0\u{2013}11") && out.contains(" each"), "{out}");
}

#[test]
fn searches_answer_in_json() {
    let base = ["plan", "--hf-config", &data("tiny-gpt2.json"), "--seq", "32", "--device", "sim:64MiB", "--json"];
    let (ok, out, err) = ferrite(&[&base[..], &["--find-batch-size"]].concat());
    assert!(ok, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(j["max_batch_size"].as_u64().unwrap() >= 1);
    let (ok, out, err) = ferrite(&[&base[..], &["--sweep-batch", "1,2,4"]].concat());
    assert!(ok, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["sweep"].as_array().unwrap().len(), 3);
    let (ok, out, err) = ferrite(&[&base[..], &["--jobs", "2"]].concat());
    assert!(ok, "{err}");
    assert!(out.contains("memory_fraction"), "{out}");
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    for (args, expect) in [
        (vec!["plan", "--device", "sim:a100-41gb"], "a100-41gb"),
        (vec!["plan", "--d-model", "100", "--heads", "3"], "divide"),
        (vec!["plan", "--hf-config", "/no/such/config.json"], "config.json"),
        (vec!["plan", "--batch", "0"], "--batch 0"),
        (vec!["plan", "--device", "sim:1MiB", "--find-batch-size"], "even --batch 1"),
        (vec!["plan", "--sweep-batch", "0,2"], "sweep-batch"),
    ] {
        let (ok, _, err) = ferrite(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn train_batch_size_auto_prints_the_chosen_plan() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["train", "--device", "sim:t4-16gb", "--batch-size", "auto", "--epochs", "1", "--train-subset", "64"])
        .args(["--no-progress", "--out", "w.safetensors"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("batch size auto:") && text.contains("fits on sim:t4-16gb"), "{text}");
    let (ok, _, err) = ferrite(&["train", "--batch-size", "auto", "--epochs", "1"]);
    assert!(!ok && err.contains("simulated GPU"), "{err}");
}

#[test]
fn an_out_of_memory_run_ends_with_the_planners_remedies() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["train", "--device", "sim:24MiB", "--hidden", "1024", "--layers", "3", "--batch-size", "1024"])
        .args(["--epochs", "1", "--no-progress"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("out of memory") || err.contains("Out of memory") || err.contains("exhausted"), "{err}");
    assert!(
        err.contains("Ranked remedies (ferrite plan, for this model on sim:24MiB):") && err.contains("saves"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn plot_draws_the_planned_step_with_its_peak_and_categories() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("plan.svg");
    let (ok, out, err) = ferrite(&[
        "plan",
        "--model",
        "mlp",
        "--batch",
        "64",
        "--device",
        "sim:t4-16gb",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the plot parses as SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let labels: Vec<String> =
        doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).map(str::to_string).collect();
    // The peak marked is the plan's peak reserved, in the plot's units.
    let peak = plan["peak_reserved_bytes"].as_u64().unwrap();
    let peak_label = format!("peak reserved {}", ferrite_memory::format_size(peak));
    assert!(labels.iter().any(|l| l.contains(&peak_label)), "no `{peak_label}` among {labels:?}");
    for category in ["parameters", "gradients", "optimizer state", "activations"] {
        assert!(labels.iter().any(|l| l.contains(category)), "no legend entry `{category}` in {labels:?}");
    }
    // HTML by extension; a directory is refused with an error, not a panic.
    let html = dir.path().join("plan.html");
    let (ok, _, err) = ferrite(&["plan", "--model", "mlp", "--plot", html.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(std::fs::read_to_string(&html).unwrap().contains("<svg"));
    let (ok, _, err) = ferrite(&["plan", "--model", "mlp", "--plot", dir.path().to_str().unwrap()]);
    assert!(!ok && err.starts_with("error:") && !err.contains("panicked"), "{err}");
}

/// `--zero` from the command line: DeepSpeed's rows for t5-3b on 1 node x 8 GPUs come out of the
/// plan's own model (the oracle is DeepSpeed's docs, memory.rst: ZeRO-2 15.93 GB per GPU without
/// offload, 5.31 with the optimizer offloaded; ZeRO-3 6.10 from the real counts), in text and JSON.
#[test]
fn zero_estimate_reproduces_deepspeeds_t5_3b_rows_in_text_and_json() {
    let base = ["plan", "--hf-config", &data("t5-3b.json"), "--seq", "8", "--batch", "1", "--device", "sim:a100-80gb"];
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--zero", "2", "--gpus-per-node", "8", "--json"]);
    let (ok, out, err) = ferrite(&args);
    assert!(ok, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["parameters"], 2_851_598_336u64, "{out}");
    assert_eq!(j["zero"]["deepspeed"]["per_gpu_printed"], "15.93", "{out}");
    let rows = j["zero"]["deepspeed_table"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["per_gpu_printed"] == "5.31"), "{out}");
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--zero", "3", "--gpus-per-node", "8"]);
    let (ok, out, err) = ferrite(&args);
    assert!(ok, "{err}");
    assert!(out.contains("6.10GB") && out.contains("<- this run"), "{out}");
    // ferrite runs ZeRO-3 itself: its own layout's model states next to DeepSpeed's.
    assert!(out.contains("ferrite's ZeRO-3 over 8 ranks keeps"), "{out}");
    // ZeRO-2 cannot offload parameters: a typed error, not a panic.
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--zero", "2", "--offload", "param"]);
    let (ok, _, err) = ferrite(&args);
    assert!(!ok && !err.contains("panicked"), "{err}");
}
