//! `ferrite eval`, `generate`, `train --hf-model` and `plan --hf-model` on the tiny Hugging Face
//! folders of `ferrite-models/tests/data/hf` (made with transformers by `make_hf_fixtures.py`;
//! every expected number is read from their `expected.safetensors`, and
//! `FERRITE_HF_FIXTURES=DIR` runs the same tests on a twin set).
mod common;

use std::path::PathBuf;

use common::{err_of, json, ok};
use ferrite_io::LoadOptions;
use ferrite_models::{HfFolder, HfLoadOptions};
use ferrite_tensor::{Device, Tensor};

fn fixtures() -> PathBuf {
    common::hf_fixtures()
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
    // The checkpoint of the one-epoch run, converted to a folder, is that run's `--out` folder.
    let converted = ok(&["convert", &d("ck"), &d("from-ck"), "--hf-model", &model("llama")], dir.path());
    assert!(converted.contains("AutoModelForCausalLM.from_pretrained"), "{converted}");
    let half = HfFolder::open(d("half")).unwrap().load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap().0;
    let from_ck = HfFolder::open(d("from-ck")).unwrap();
    assert!(from_ck.tokenizer_file().is_some(), "the tokenizer is copied");
    let from_ck = from_ck.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap().0;
    let (sh, sc) = (half.state_dict(), from_ck.state_dict());
    assert_eq!(sh.len(), sc.len());
    for (k, t) in sh.iter() {
        assert_eq!(t.to_vec::<f32>().unwrap(), sc.get(k).unwrap().to_vec::<f32>().unwrap(), "{k}: converted differs");
    }
    // Into another architecture's folder: a typed error naming both.
    let e = err_of(&["convert", &d("ck"), &d("wrong"), "--hf-model", &model("gpt2")], dir.path());
    assert!(e.contains("does not fit the model of") && e.contains("gpt2"), "{e}");
    // The trained folder evaluates with `ferrite eval`.
    let v = json(&ok(&["eval", "--hf-model", &d("full"), "--data", &text(), "--seq", "16", "--json"], dir.path()));
    assert!(v["loss"].as_f64().unwrap() < expected("llama", "eval_loss").to_vec_f64().unwrap()[0]);
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
        let measured = common::size(line.split('|').nth(3).unwrap());
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
    // --hf-model without --data.
    let e = err_of(&["train", "--hf-model", &model("llama")], dir.path());
    assert!(e.contains("--data") || e.contains("data"), "{e}");
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

fn pairs() -> String {
    fixtures().join("seq2seq.jsonl").display().to_string()
}

/// T5 on the command line: `eval` (the sequence-to-sequence loss transformers computes on the
/// padded, cut pairs), greedy `generate` (transformers' ids), `train` writing a folder that loads
/// with every key matched and evaluates lower than before.
#[test]
fn t5_eval_generate_and_train_on_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["t5", "t5v11"] {
        let v =
            json(&ok(&["eval", "--hf-model", &model(name), "--data", &pairs(), "--seq", "16", "--json"], dir.path()));
        let want = expected(name, "seq2seq_loss").to_vec_f64().unwrap()[0];
        let loss = v["loss"].as_f64().unwrap();
        assert!((loss - want).abs() <= 1e-4 * want, "{name}: {loss} vs transformers {want}");
        let tokens = expected(name, "seq2seq_target_tokens").to_vec::<i64>().unwrap()[0] as u64;
        assert_eq!(v["target_tokens"].as_u64(), Some(tokens));

        let want: Vec<i64> = expected(name, "greedy_ids").to_vec().unwrap();
        let n = want.len().to_string();
        let args = ["generate", "--hf-model", &model(name), "--prompt", "the allocator keeps", "--max-new-tokens", &n];
        let v = json(&ok(&[&args[..], &["--json"]].concat(), dir.path()));
        let ids: Vec<i64> = v["ids"].as_array().unwrap().iter().map(|i| i.as_i64().unwrap()).collect();
        assert_eq!(ids, want, "{name}");
    }
    let out_dir = dir.path().join("tuned").display().to_string();
    let train = [
        "train",
        "--hf-model",
        &model("t5v11"),
        "--data",
        &pairs(),
        "--seq",
        "16",
        "--batch-size",
        "8",
        "--epochs",
        "3",
        "--lr",
        "3e-3",
        "--no-progress",
        "--out",
        &out_dir,
    ];
    let out = ok(&train, dir.path());
    assert!(out.contains("epoch   3/3") && out.contains("validation loss") && out.contains("texts cut"), "{out}");
    assert!(out.contains("AutoModelForSeq2SeqLM"), "{out}");
    let folder = HfFolder::open(&out_dir).unwrap();
    assert!(folder.is_t5() && folder.tokenizer_file().is_some());
    let (_, keys) = folder.load_t5(&Device::Cpu, &HfLoadOptions::default()).unwrap();
    assert!(keys.missing_keys.is_empty() && keys.unexpected_keys.is_empty(), "{keys:?}");
    let v = json(&ok(&["eval", "--hf-model", &out_dir, "--data", &pairs(), "--seq", "16", "--json"], dir.path()));
    let before = expected("t5v11", "seq2seq_loss").to_vec_f64().unwrap()[0];
    assert!(v["loss"].as_f64().unwrap() < before, "training lowered the loss: {v} vs {before}");
}

/// `ferrite plan --hf-model T5DIR` predicts the peak reserved memory that `ferrite train
/// --hf-model T5DIR` measures on the same simulated GPU, within 2 %.
#[test]
fn plan_t5_predicts_what_train_measures() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [("t5", None), ("t5v11", Some("--checkpoint-activations"))] {
        let mut shape = vec!["--seq", "16", "--batch-size", "16", "--device", "sim:t4-16gb"];
        shape.extend(extra);
        let m = model(name);
        let mut plan = vec!["plan", "--hf-model", &m];
        plan.extend(&shape);
        plan.push("--json");
        let predicted = json(&ok(&plan, dir.path()))["peak_reserved_bytes"].as_f64().unwrap();
        let out_dir = dir.path().join(name).display().to_string();
        let p = pairs();
        let mut train =
            vec!["train", "--hf-model", &m, "--data", &p, "--steps", "2", "--no-progress", "--out", &out_dir];
        train.extend(&shape);
        let out = ok(&train, dir.path());
        let line = out.lines().find(|l| l.starts_with("| GPU reserved memory")).unwrap();
        let measured = common::size(line.split('|').nth(3).unwrap());
        let err = (predicted - measured) / measured;
        assert!(err.abs() <= 0.02, "{name} {extra:?}: predicted {predicted} measured {measured}\n{out}");
    }
}

/// Bad T5 input: a line without the input field, an empty target, a config with an option
/// ferrite does not build — each a typed error naming the file, line, field or key.
#[test]
fn bad_t5_input_gets_errors_that_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("pairs.jsonl");
    let run = |lines: &str| {
        std::fs::write(&data, lines).unwrap();
        err_of(&["train", "--hf-model", &model("t5"), "--data", data.to_str().unwrap(), "--seq", "16"], dir.path())
    };
    let e = run("{\"input\": \"a b\", \"target\": \"c\"}\n{\"source\": \"a\", \"target\": \"c\"}\n");
    assert!(e.contains("pairs.jsonl, line 2") && e.contains("no field `input`") && e.contains("--input-field"), "{e}");
    let e = run("{\"input\": \"a b\", \"target\": \"\"}\n");
    assert!(e.contains("line 1") && e.contains("`target` is empty"), "{e}");
    // Other field names are accepted with the flags.
    std::fs::write(&data, "{\"src\": \"the memory\", \"tgt\": \"memory the\"}\n".repeat(4)).unwrap();
    let out_dir = dir.path().join("o").display().to_string();
    ok(
        &[
            "train",
            "--hf-model",
            &model("t5"),
            "--data",
            data.to_str().unwrap(),
            "--seq",
            "8",
            "--input-field",
            "src",
            "--target-field",
            "tgt",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--no-progress",
            "--out",
            &out_dir,
        ],
        dir.path(),
    );
    // A config whose option ferrite does not build: UMT5's per-layer position bias, an unknown
    // feed-forward.
    let bad = dir.path().join("umt5");
    std::fs::create_dir(&bad).unwrap();
    for f in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixtures().join("t5").join(f), bad.join(f)).unwrap();
    }
    let config = std::fs::read_to_string(fixtures().join("t5/config.json")).unwrap();
    std::fs::write(bad.join("config.json"), config.replace("\"model_type\": \"t5\"", "\"model_type\": \"umt5\""))
        .unwrap();
    let e = err_of(&["eval", "--hf-model", bad.to_str().unwrap(), "--data", &pairs(), "--seq", "16"], dir.path());
    assert!(e.contains("umt5") && e.contains("model_type"), "{e}");
    std::fs::write(
        bad.join("config.json"),
        config.replace("\"feed_forward_proj\": \"relu\"", "\"feed_forward_proj\": \"swish\""),
    )
    .unwrap();
    let e = err_of(&["generate", "--hf-model", bad.to_str().unwrap(), "--prompt", "x"], dir.path());
    assert!(e.contains("feed_forward_proj") && e.contains("swish"), "{e}");
    std::fs::write(bad.join("config.json"), config.replace("\"dropout_rate\": 0.0", "\"dropout_rate\": 1.5")).unwrap();
    let e = err_of(&["train", "--hf-model", bad.to_str().unwrap(), "--data", &pairs(), "--seq", "16"], dir.path());
    assert!(e.contains("dropout_rate") && e.contains("1.5"), "{e}");
}

/// `train --hf-model --devices 0,1` (DataParallel over two simulated GPUs, each replica half of
/// every batch) ends with the weights and validation loss one device reaches on the same global
/// batches, with the same cosine schedule (made over the replicas' optimizer): equal up to the
/// rounding of summing the two halves' gradients.
#[test]
fn hf_data_parallel_equals_one_device() {
    let dir = tempfile::tempdir().unwrap();
    // Llama and T5: no parameter whose gradient is only rounding noise (GPT-2's key biases
    // cannot change the output; AdamW turns their noise into full-size steps, different on
    // each side).
    // T5's loss is a mean over target tokens, and DataParallel (as PyTorch's) averages the
    // replicas' means: equal to one device's when every target has the same length, as here.
    let same_length = dir.path().join("same_length.jsonl");
    let lines: Vec<String> = std::fs::read_to_string(pairs())
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            serde_json::json!({"input": v["input"], "target": "the memory of a device"}).to_string()
        })
        .collect();
    std::fs::write(&same_length, lines.join("\n")).unwrap();
    for name in ["t5", "llama"] {
        let data = if name == "t5" { same_length.display().to_string() } else { text() };
        let out = |tag: &str| dir.path().join(format!("{name}-{tag}")).display().to_string();
        let m = model(name);
        let run = |tag: &str, devices: &[&str]| {
            let o = out(tag);
            let mut args = vec![
                "train",
                "--hf-model",
                &m,
                "--data",
                &data,
                "--seq",
                "16",
                "--batch-size",
                "8",
                "--steps",
                "4",
                "--lr",
                "3e-3",
                "--lr-schedule",
                "cosine",
                "--warmup-steps",
                "1",
                "--device",
                "sim:a100-40gb",
                "--no-progress",
                "--out",
                &o,
            ];
            args.extend(devices);
            ok(&args, dir.path())
        };
        let one = run("one", &[]);
        let two = run("two", &["--devices", "0,1"]);
        assert!(two.contains("DataParallel over sim:a100-40gb"), "{two}");
        assert!(!one.contains("DataParallel"), "{one}");
        use ferrite_nn::Module;
        let load = |tag: &str| {
            let f = HfFolder::open(out(tag)).unwrap();
            if name == "t5" {
                f.load_t5(&Device::Cpu, &HfLoadOptions::default()).unwrap().0.state_dict()
            } else {
                f.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap().0.state_dict()
            }
        };
        let validation = |out: &str| {
            let line = out.lines().rfind(|l| l.starts_with("trained ")).unwrap_or_else(|| panic!("{out}"));
            line.split("validation loss ").nth(1).unwrap().split(';').next().unwrap().to_string()
        };
        assert_eq!(validation(&one), validation(&two), "{name}: validation loss\n{one}\n{two}");
        let (a, b) = (load("one"), load("two"));
        let original = HfFolder::open(&m).unwrap().read_state_dict(ferrite_tensor::DType::F32).unwrap();
        let mut moved = false;
        for (k, t) in a.iter() {
            let (x, y): (Vec<f32>, Vec<f32>) = (t.to_vec().unwrap(), b.get(k).unwrap().to_vec().unwrap());
            let scale = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (p, q)) in x.iter().zip(&y).enumerate() {
                assert!((p - q).abs() <= 1e-5 * scale + 1e-7, "{name}: {k}[{i}]: one device {p}, two {q}");
            }
            if let Some(o) = original.get(k) {
                moved |= o.to_vec::<f32>().unwrap() != x;
            }
        }
        assert!(moved, "{name}: training changed the weights");
    }
}

/// `--steps` that stop the run inside an epoch leave no checkpoint of it (checkpoints are written
/// at an epoch's end), and the run says so instead of leaving the user to find out at `--resume`.
#[test]
fn steps_inside_an_epoch_say_that_no_checkpoint_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).display().to_string();
    let args = ["train", "--hf-model", &model("llama"), "--data", &text(), "--seq", "16", "--batch-size", "8"];
    let out = ok(
        &[&args[..], &["--steps", "3", "--no-progress", "--save-checkpoint", &d("ck"), "--out", &d("o")]].concat(),
        dir.path(),
    );
    assert!(out.contains("inside epoch 1") && out.contains("nothing from this run"), "{out}");
    assert!(!dir.path().join("ck").exists(), "no checkpoint of a partial epoch");
    assert!(dir.path().join("o/model.safetensors").exists(), "the weights are written");
}
