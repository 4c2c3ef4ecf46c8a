//! The LoRA flags of `ferrite train --hf-model`, `plan`, `eval` and `generate` (issue 34) on the
//! tiny Hugging Face folders of `ferrite-models/tests/data/hf` and the PEFT adapters of
//! `ferrite-models/tests/data/lora` (`FERRITE_HF_FIXTURES` / `FERRITE_LORA_FIXTURES` run them on a
//! twin set). The numerics are tested against PEFT in `ferrite-models/tests/lora_parity.rs`; here:
//! the wiring (what is written, what trains), the plan of the LoRA step against the measured run
//! on `sim`, and the errors.
mod common;

use std::path::{Path, PathBuf};

use common::{err_of, json, ok};

fn hf(name: &str) -> String {
    common::hf_fixtures().join(name).display().to_string()
}

fn peft_adapter(name: &str) -> String {
    ferrite_test_support::lora_fixtures().join(name).join("adapter").display().to_string()
}

fn text() -> String {
    hf("text.txt")
}

fn eval_loss(model: &str, lora: Option<&str>, dir: &Path) -> f64 {
    let t = text();
    let mut args = vec!["eval", "--hf-model", model, "--data", &t, "--seq", "16", "--json"];
    if let Some(l) = lora {
        args.extend(["--lora", l]);
    }
    json(&ok(&args, dir))["loss"].as_f64().unwrap()
}

/// Training with `--lora-rank` writes a PEFT adapter folder; the same run with `--merge-lora`
/// writes a full model that evaluates to what base + adapter evaluates to.
#[test]
fn lora_training_writes_an_adapter_and_merge_lora_the_same_model_merged() {
    let dir = tempfile::tempdir().unwrap();
    for (name, targets) in [("llama", "q_proj,v_proj"), ("gpt2", "c_attn")] {
        let (adapter, merged) = (dir.path().join(format!("{name}-a")), dir.path().join(format!("{name}-m")));
        let (a, m, t, base) = (adapter.display().to_string(), merged.display().to_string(), text(), hf(name));
        let run = |out: &str, extra: &[&str]| {
            let mut args = vec![
                "train",
                "--hf-model",
                &base,
                "--data",
                &t,
                "--seq",
                "16",
                "--steps",
                "4",
                "--lr",
                "1e-2",
                "--no-progress",
                "--lora-rank",
                "4",
                "--lora-alpha",
                "16",
                "--out",
                out,
            ];
            args.extend(extra);
            ok(&args, dir.path())
        };
        let out = run(&a, &[]);
        assert!(out.contains("LoRA r=4 alpha=16") && out.contains(targets), "{out}");
        assert!(out.contains("PeftModel.from_pretrained"), "{out}");
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap()).unwrap();
        assert_eq!((cfg["r"].as_u64(), cfg["lora_alpha"].as_f64()), (Some(4), Some(16.0)));
        assert_eq!(cfg["peft_type"], "LORA");
        assert!(adapter.join("adapter_model.safetensors").is_file() && !adapter.join("model.safetensors").exists());
        run(&m, &["--merge-lora"]);
        assert!(merged.join("model.safetensors").is_file() && merged.join("config.json").is_file());
        let with_adapter = eval_loss(&base, Some(&a), dir.path());
        let merged_loss = eval_loss(&m, None, dir.path());
        let base_loss = eval_loss(&base, None, dir.path());
        assert!((with_adapter - merged_loss).abs() <= 1e-5 * merged_loss, "{name}: {with_adapter} vs {merged_loss}");
        assert!(
            with_adapter < base_loss,
            "{name}: training the adapter lowered nothing ({with_adapter} vs {base_loss})"
        );
    }
}

/// A PEFT adapter folder works with `eval` and `generate`; one made for another base model is
/// refused naming the base it was made for.
#[test]
fn eval_and_generate_take_peft_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let (base, adapter) = (hf("llama"), peft_adapter("llama"));
    let with = eval_loss(&base, Some(&adapter), dir.path());
    let without = eval_loss(&base, None, dir.path());
    assert!((with - without).abs() > 1e-3, "the adapter changes the loss: {with} vs {without}");
    let out = ok(
        &[
            "generate",
            "--hf-model",
            &base,
            "--lora",
            &adapter,
            "--prompt",
            "the allocator keeps",
            "--max-new-tokens",
            "4",
            "--json",
        ],
        dir.path(),
    );
    assert_eq!(json(&out)["ids"].as_array().map(Vec::len), Some(4));
    let e = err_of(
        &["eval", "--hf-model", &base, "--lora", &peft_adapter("gpt2"), "--data", &text(), "--seq", "16"],
        dir.path(),
    );
    assert!(e.contains("ferrite-tests/gpt2") && e.contains("c_attn"), "{e}");
}

/// `ferrite plan` with the LoRA flags predicts the peak `ferrite train` with the same flags
/// measures on the simulated GPU (within 2 %); at one sample it allocates less than the full
/// fine-tuning plan.
#[test]
fn plan_with_lora_predicts_what_lora_training_measures() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [("llama", vec!["--base-dtype", "bf16"]), ("gpt2", vec![])] {
        let m = hf(name);
        let mut shape = vec!["--seq", "32", "--device", "sim:t4-16gb"];
        let mut lora = vec!["--lora-rank", "8", "--lora-targets", "all-linear"];
        lora.extend(&extra);
        let plan = |flags: &[&str], batch: &str| {
            let mut args = vec!["plan", "--hf-model", &m, "--json"];
            args.extend(&shape);
            args.extend(flags);
            args.extend(["--batch-size", batch]);
            json(&ok(&args, dir.path()))
        };
        let predicted = plan(&lora, "16")["peak_reserved_bytes"].as_f64().unwrap();
        // Model states dominate at one sample (at 16 the tiny model's logits do, and the adapters
        // add activations): there LoRA's frozen base, without gradients or AdamW moments, shows.
        let allocated = |flags: &[&str]| plan(flags, "1")["peak_allocated_bytes"].as_f64().unwrap();
        let (full, with_lora) = (allocated(&[]), allocated(&lora));
        assert!(with_lora < 0.85 * full, "{name}: LoRA plan allocates {with_lora}, the full one {full}");
        let out_dir = dir.path().join(name).display().to_string();
        let t = text();
        let mut train =
            vec!["train", "--hf-model", &m, "--data", &t, "--steps", "3", "--no-progress", "--out", &out_dir];
        train.append(&mut shape);
        train.extend(["--batch-size", "16"]);
        train.extend(&lora);
        let out = ok(&train, dir.path());
        let line = out.lines().find(|l| l.starts_with("| GPU reserved memory")).unwrap();
        let measured = common::size(line.split('|').nth(3).unwrap());
        let err = (predicted - measured) / measured;
        assert!(err.abs() <= 0.02, "{name}: predicted {predicted} measured {measured}\n{out}");
    }
}

#[test]
fn bad_lora_flags_get_errors_that_name_them() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = (hf("llama"), text());
    let out = dir.path().join("out").display().to_string();
    let train = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--hf-model",
            &m,
            "--data",
            &t,
            "--seq",
            "16",
            "--steps",
            "1",
            "--no-progress",
            "--out",
            &out,
        ];
        args.extend(extra);
        err_of(&args, dir.path())
    };
    let e = train(&["--merge-lora"]);
    assert!(e.contains("--merge-lora") && e.contains("--lora-rank"), "{e}");
    let e = train(&["--lora-rank", "4", "--lora-targets", "q_proj,c_attn"]);
    assert!(e.contains("c_attn") && e.contains("q_proj"), "{e}");
    let e = train(&["--lora-rank", "0"]);
    assert!(e.contains("--lora-rank 0"), "{e}");
    let e = train(&["--lora-rank", "1000"]);
    assert!(e.contains("1000") && e.contains("min(in, out)"), "{e}");
    let e = train(&["--lora-rank", "4", "--lora-targets", "input_layernorm"]);
    assert!(e.contains("RMSNorm") && e.contains("cannot adapt"), "{e}");
    let e = train(&["--lora-alpha", "16"]);
    assert!(e.contains("--lora-rank"), "{e}");
    let e = train(&["--lora-rank", "4", "--base-dtype", "int8"]);
    assert!(e.contains("bf16"), "{e}");
    let e = err_of(
        &["plan", "--hf-model", &m, "--seq", "16", "--batch-size", "1", "--lora-rank", "4", "--lora-targets", "nope"],
        dir.path(),
    );
    assert!(e.contains("nope"), "{e}");
}

/// T5 from the command line: `train --lora-rank` writes a PEFT adapter folder of task
/// `SEQ_2_SEQ_LM` on T5's `q`/`v` projections, `eval --lora` of it equals the `--merge-lora`
/// folder and is below the base's loss, `generate --lora` runs, and (with `FERRITE_PYTHON`) PEFT
/// loads the adapter onto transformers' T5 to the logits of the merged folder.
#[test]
fn t5_lora_trains_saves_merges_and_loads_in_peft() {
    let dir = tempfile::tempdir().unwrap();
    let (base, data) = (hf("t5"), hf("seq2seq.jsonl"));
    let (adapter, merged) = (dir.path().join("t5-a"), dir.path().join("t5-m"));
    let (a, m) = (adapter.display().to_string(), merged.display().to_string());
    let train = |out: &str, extra: &[&str]| {
        let mut args = vec!["train", "--hf-model", &base, "--data", &data, "--seq", "16", "--steps", "4"];
        args.extend(["--lr", "1e-2", "--no-progress", "--lora-rank", "4", "--lora-alpha", "16", "--out", out]);
        args.extend(extra);
        ok(&args, dir.path())
    };
    let out = train(&a, &[]);
    assert!(out.contains("LoRA r=4 alpha=16") && out.contains("(q,v)"), "{out}");
    assert!(out.contains("AutoModelForSeq2SeqLM"), "{out}");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(cfg["task_type"], "SEQ_2_SEQ_LM");
    assert_eq!(cfg["target_modules"], serde_json::json!(["q", "v"]));
    train(&m, &["--merge-lora"]);
    let loss = |model: &str, lora: Option<&str>| {
        let mut args = vec!["eval", "--hf-model", model, "--data", &data, "--seq", "16", "--json"];
        args.extend(lora.map(|l| ["--lora", l]).iter().flatten());
        json(&ok(&args, dir.path()))["loss"].as_f64().unwrap()
    };
    let (with_adapter, merged_loss, base_loss) = (loss(&base, Some(&a)), loss(&m, None), loss(&base, None));
    assert!((with_adapter - merged_loss).abs() <= 1e-5 * merged_loss, "{with_adapter} vs {merged_loss}");
    assert!(with_adapter < base_loss, "training the adapter lowered nothing ({with_adapter} vs {base_loss})");
    let g = ok(
        &["generate", "--hf-model", &base, "--lora", &a, "--prompt", "the cat", "--max-new-tokens", "3", "--json"],
        dir.path(),
    );
    assert!(json(&g)["ids"].as_array().is_some_and(|ids| !ids.is_empty()), "{g}");
    if let Some(python) = ferrite_test_support::python_or_skip("torch, transformers, peft, safetensors") {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ferrite-models/tests/data/check_lora_folders.py");
        let o = std::process::Command::new(python).arg(script).args(["seq2seq", &base, &a, &m]).output().unwrap();
        assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    }
}
