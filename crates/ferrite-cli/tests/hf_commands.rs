//! `ferrite eval`, `generate`, `train --hf-model` and `plan --hf-model` on the tiny Hugging Face
//! folders of `ferrite-models/tests/data/hf` (made with transformers by `make_hf_fixtures.py`;
//! every expected number is read from their `expected.safetensors`, and
//! `FERRITE_HF_FIXTURES=DIR` runs the same tests on a twin set).
mod common;

use std::path::{Path, PathBuf};

use common::{ferrite, ok};
use ferrite_io::LoadOptions;
use ferrite_models::{HfFolder, HfLoadOptions};
use ferrite_tensor::{Device, Tensor};

fn fixtures() -> PathBuf {
    match std::env::var_os("FERRITE_HF_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ferrite-models/tests/data/hf"),
    }
}

fn model(name: &str) -> String {
    fixtures().join(name).display().to_string()
}

fn text() -> String {
    fixtures().join("text.txt").display().to_string()
}

fn expected(name: &str, key: &str) -> Tensor {
    let sd =
        ferrite_io::load_state_dict(fixtures().join(name).join("expected.safetensors"), &LoadOptions::new()).unwrap();
    sd.into_iter().find(|(k, _)| k == key).map(|(_, t)| t).unwrap()
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn err_of(args: &[&str], dir: &Path) -> String {
    let o = ferrite(args, dir);
    assert!(!o.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn eval_reports_the_loss_transformers_computes() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["gpt2", "qwen2"] {
        let v =
            json(&ok(&["eval", "--hf-model", &model(name), "--data", &text(), "--seq", "16", "--json"], dir.path()));
        let want = expected(name, "eval_loss").to_vec_f64().unwrap()[0];
        let loss = v["loss"].as_f64().unwrap();
        assert!((loss - want).abs() <= 1e-4 * want, "{name}: {loss} vs transformers {want}");
        let tokens = expected(name, "eval_tokens").to_vec::<i64>().unwrap()[0] as u64;
        assert_eq!(v["tokens"].as_u64(), Some(tokens));
        assert_eq!(v["blocks"].as_u64(), Some(tokens / 16));
        assert!((v["perplexity"].as_f64().unwrap() - loss.exp()).abs() < 1e-9 * loss.exp());
    }
}

#[test]
fn greedy_generate_gives_transformers_ids() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["llama", "mistral"] {
        let want: Vec<i64> = expected(name, "greedy_ids").to_vec().unwrap();
        let out = ok(
            &[
                "generate",
                "--hf-model",
                &model(name),
                "--prompt",
                "the allocator keeps",
                "--max-new-tokens",
                &want.len().to_string(),
                "--json",
            ],
            dir.path(),
        );
        let v = json(&out);
        let ids: Vec<i64> = v["ids"].as_array().unwrap().iter().map(|i| i.as_i64().unwrap()).collect();
        assert_eq!(ids, want, "{name}");
        assert!(v["text"].is_string());
    }
    // Sampling: the same seed, the same ids.
    let sample = |seed: &str| {
        ok(
            &[
                "generate",
                "--hf-model",
                &model("gpt2"),
                "--prompt",
                "the",
                "--max-new-tokens",
                "8",
                "--temperature",
                "0.9",
                "--top-k",
                "20",
                "--top-p",
                "0.9",
                "--seed",
                seed,
                "--json",
            ],
            dir.path(),
        )
    };
    assert_eq!(json(&sample("3"))["ids"], json(&sample("3"))["ids"]);
}

/// Fine-tuning writes a folder that loads with every key matched; a resumed run ends with the
/// same weights, byte for byte, as an uninterrupted one; shards and the tokenizer are written.
#[test]
fn train_writes_an_hf_folder_and_resumes_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).display().to_string();
    let base = ["train", "--hf-model", &model("llama"), "--data", &text(), "--seq", "16", "--batch-size", "8"];
    let with = |extra: &[&str]| -> Vec<String> { base.iter().chain(extra).map(|s| s.to_string()).collect() };
    let run = |args: Vec<String>| ok(&args.iter().map(String::as_str).collect::<Vec<_>>(), dir.path());
    // One schedule of 28 steps (2 epochs of 14) for the three runs; the second stops after one.
    let common = [
        "--no-progress",
        "--lr",
        "3e-3",
        "--lr-schedule",
        "cosine",
        "--warmup-steps",
        "4",
        "--accum-steps",
        "2",
        "--steps",
        "28",
    ];
    let out = run(with(&[&common[..], &["--epochs", "2", "--out", &d("full"), "--max-shard-size", "40KB"]].concat()));
    assert!(out.contains("epoch   2/2") && out.contains("validation loss"), "{out}");
    run(with(&[&common[..], &["--epochs", "1", "--save-checkpoint", &d("ck"), "--out", &d("half")]].concat()));
    run(with(&[&common[..], &["--epochs", "2", "--resume", &d("ck"), "--out", &d("resumed")]].concat()));
    let full = HfFolder::open(d("full")).unwrap();
    assert!(matches!(full.weights, ferrite_models::WeightFiles::Sharded { .. }), "{:?}", full.weights);
    assert!(full.tokenizer_file().is_some(), "the tokenizer is copied");
    let resumed = HfFolder::open(d("resumed")).unwrap();
    let a = full.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap().0;
    let b = resumed.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap().0;
    let original =
        HfFolder::open(model("llama")).unwrap().load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap().0;
    use ferrite_nn::Module;
    let (sa, sb, so) = (a.state_dict(), b.state_dict(), original.state_dict());
    for (k, t) in sa.iter() {
        let (x, y): (Vec<f32>, Vec<f32>) = (t.to_vec().unwrap(), sb.get(k).unwrap().to_vec().unwrap());
        assert_eq!(x, y, "{k}: resumed differs");
    }
    let moved = sa.iter().any(|(k, t)| t.to_vec::<f32>().unwrap() != so.get(k).unwrap().to_vec::<f32>().unwrap());
    assert!(moved, "training changed the weights");
    // The trained folder evaluates with `ferrite eval`.
    let v = json(&ok(&["eval", "--hf-model", &d("full"), "--data", &text(), "--seq", "16", "--json"], dir.path()));
    assert!(v["loss"].as_f64().unwrap() < expected("llama", "eval_loss").to_vec_f64().unwrap()[0]);
}

/// "N unit" of the memory summary (`6144 KiB`) in bytes.
fn size(text: &str) -> f64 {
    let mut it = text.split_whitespace();
    let n: f64 = it.next().unwrap().parse().unwrap();
    n * match it.next().unwrap() {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        u => panic!("unit {u}"),
    }
}

/// `ferrite plan --hf-model DIR` predicts the peak reserved memory `ferrite train --hf-model DIR`
/// measures on the same simulated GPU, within 2 %.
#[test]
fn plan_hf_model_predicts_what_train_measures() {
    let dir = tempfile::tempdir().unwrap();
    for (name, amp) in [("gpt2", None), ("llama", Some("bf16"))] {
        let mut shape = vec!["--seq", "32", "--batch-size", "16", "--device", "sim:t4-16gb"];
        if let Some(a) = amp {
            shape.extend(["--amp", a]);
        }
        let mut plan = vec!["plan", "--hf-model"];
        let m = model(name);
        plan.push(&m);
        plan.extend(&shape);
        plan.push("--json");
        let predicted = json(&ok(&plan, dir.path()))["peak_reserved_bytes"].as_f64().unwrap();
        let out_dir = dir.path().join(name).display().to_string();
        let t = text();
        let mut train =
            vec!["train", "--hf-model", &m, "--data", &t, "--steps", "3", "--no-progress", "--out", &out_dir];
        train.extend(&shape);
        let out = ok(&train, dir.path());
        let line = out.lines().find(|l| l.starts_with("| GPU reserved memory")).unwrap();
        let measured = size(line.split('|').nth(3).unwrap());
        let err = (predicted - measured) / measured;
        assert!(err.abs() <= 0.02, "{name} amp {amp:?}: predicted {predicted} measured {measured}\n{out}");
    }
}

#[test]
fn bad_hf_input_gets_errors_that_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    // No tokenizer.json.
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixtures().join("gpt2").join(f), bare.join(f)).unwrap();
    }
    let e = err_of(&["eval", "--hf-model", bare.to_str().unwrap(), "--data", &text(), "--seq", "8"], dir.path());
    assert!(e.contains("tokenizer.json") && e.contains("save_pretrained"), "{e}");
    // A tokenizer that does not parse.
    std::fs::write(bare.join("tokenizer.json"), "{ not json").unwrap();
    let e = err_of(&["generate", "--hf-model", bare.to_str().unwrap(), "--prompt", "x"], dir.path());
    assert!(e.contains("tokenizer.json") && e.contains("not a tokenizer file"), "{e}");
    // --seq beyond GPT-2's positions.
    let e = err_of(&["eval", "--hf-model", &model("gpt2"), "--data", &text(), "--seq", "4096"], dir.path());
    assert!(e.contains("--seq 4096") && e.contains("n_positions"), "{e}");
    // A text shorter than one block.
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "the").unwrap();
    let e =
        err_of(&["eval", "--hf-model", &model("llama"), "--data", short.to_str().unwrap(), "--seq", "16"], dir.path());
    assert!(e.contains("fewer than one block of 16"), "{e}");
    let e =
        err_of(&["train", "--hf-model", &model("llama"), "--data", short.to_str().unwrap(), "--seq", "16"], dir.path());
    assert!(e.contains("fewer than one block of 16"), "{e}");
    // A prompt with no tokens.
    let e = err_of(&["generate", "--hf-model", &model("llama"), "--prompt", ""], dir.path());
    assert!(e.contains("no tokens"), "{e}");
    // --hf-model without --data; with DataParallel.
    let e = err_of(&["train", "--hf-model", &model("llama")], dir.path());
    assert!(e.contains("--data") || e.contains("data"), "{e}");
    let e = err_of(&["train", "--hf-model", &model("llama"), "--data", &text(), "--devices", "0,1"], dir.path());
    assert!(e.contains("devices") && e.contains("one device"), "{e}");
    // A JSON Lines file without the text field names the line.
    let jsonl = dir.path().join("d.jsonl");
    std::fs::write(&jsonl, "{\"text\": \"the memory\"}\n{\"body\": 1}\n").unwrap();
    let e =
        err_of(&["train", "--hf-model", &model("llama"), "--data", jsonl.to_str().unwrap(), "--seq", "4"], dir.path());
    assert!(e.contains("d.jsonl, line 2") && e.contains("`text`"), "{e}");
    // A folder that is not a model.
    let e = err_of(&["eval", "--hf-model", dir.path().to_str().unwrap(), "--data", &text(), "--seq", "8"], dir.path());
    assert!(e.contains("config.json"), "{e}");
}
