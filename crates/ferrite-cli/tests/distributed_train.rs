//! `mpirun -np 2 ferrite train --distributed`: trains every built-in model (mlp on digits here; the
//! transformer and the LSTM on a text file), rank 0 alone prints, the summary has every rank's
//! memory, rank 0's checkpoint resumes in a single process without MPI, and rank 0 writes the
//! `--snapshot`. The language models also match one process reading twice the streams. Without
//! the `mpi` feature the flag is a typed error. Skips loudly without MPI unless
//! FERRITE_REQUIRE_SYSTEM_DEPS=1.

mod common;

use std::path::Path;

use common::mpi::{mpi_ready, mpirun_ferrite, weights};

/// A text a small model learns from: words of a small vocabulary in a pseudo-random order.
fn write_text(dir: &Path, chars: usize) -> String {
    let words = ["the ", "cat ", "sat ", "on ", "a ", "mat ", "and ", "dog ", "ran ", "far. ", "then ", "slept.\n"];
    let (mut text, mut state) = (String::new(), 11u64);
    while text.len() < chars {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        text.push_str(words[(state >> 33) as usize % words.len()]);
    }
    text.truncate(chars);
    std::fs::write(dir.join("text.txt"), &text).unwrap();
    "text.txt".to_string()
}

/// The figure after `key ` in a language model's closing line (`validation loss 2.78 (…unigram 3.1)…`).
fn figure(out: &str, key: &str) -> f64 {
    let line =
        out.lines().find(|l| l.starts_with("validation loss ")).unwrap_or_else(|| panic!("no final line:\n{out}"));
    let at = line.find(key).unwrap_or_else(|| panic!("no `{key}` in {line}")) + key.len();
    line[at..].trim_start().split(|c: char| !(c.is_ascii_digit() || c == '.')).next().unwrap().parse().unwrap()
}

/// `mpirun -np 2 ferrite train --distributed --model MODEL ARGS --batch-size 2`, then checks what
/// a user sees, that rank 0's checkpoint resumes without MPI, that rank 0 wrote the snapshot, and
/// that one process with `--batch-size 4` (the same 4 streams) ends with the same weights and the
/// same validation loss (the ranks share the validation streams one process reads, and sum).
fn language_model_case(test: &str, model: &str, model_args: &[&str]) {
    if !mpi_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = write_text(dir.path(), 2000);
    let common: Vec<&str> =
        ["train", "--model", model, "--dataset", &text, "--seq", "16", "--lr", "0.01", "--no-progress"]
            .into_iter()
            .chain(model_args.iter().copied())
            .collect();
    let with = |extra: &[&str]| -> Vec<String> { common.iter().chain(extra).map(|s| s.to_string()).collect() };
    let dist = with(&[
        "--distributed",
        "--batch-size",
        "2",
        "--epochs",
        "2",
        "--save-checkpoint",
        "ck.ft",
        "--snapshot",
        "snap.pickle",
        "--out",
        "dist.safetensors",
    ]);
    let dist: Vec<&str> = dist.iter().map(String::as_str).collect();
    let (ok, out, err) = mpirun_ferrite(2, &dist, dir.path());
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("2 ranks x 2 streams x 16 characters per chunk"), "{out}");
    assert_eq!(out.matches("epoch   1/2").count(), 1, "one rank prints:\n{out}");
    assert_eq!(out.matches("epoch   2/2").count(), 1, "{out}");
    assert!(out.contains("rank 0: peak allocated") && out.contains("rank 1: peak allocated"), "{out}");
    let (val, unigram) = (figure(&out, "validation loss"), figure(&out, "unigram"));
    assert!(val.is_finite() && val < unigram + 0.5, "{out}");
    // Rank 0 alone wrote the snapshot, and it reads back.
    assert_eq!(err.matches("wrote memory snapshot snap.pickle").count(), 1, "{err}");
    let replay = common::ok(&["memory", "replay", "snap.pickle", "--json"], dir.path());
    assert!(replay.contains("\"devices\""), "{replay}");

    // One process, 4 streams: the same text rows and the same averaged gradients per step.
    let single = with(&["--batch-size", "4", "--epochs", "2", "--out", "single.safetensors"]);
    let single: Vec<&str> = single.iter().map(String::as_str).collect();
    let one = common::ok(&single, dir.path());
    let (d, s) = (weights(&dir.path().join("dist.safetensors")), weights(&dir.path().join("single.safetensors")));
    assert_eq!(d.iter().map(|(n, _)| n).collect::<Vec<_>>(), s.iter().map(|(n, _)| n).collect::<Vec<_>>());
    let worst = d
        .iter()
        .zip(&s)
        .flat_map(|((name, a), (_, b))| {
            // Attention's key bias (the middle third of in_proj_bias) gets a gradient that is zero
            // but for rounding (softmax ignores a shift shared by all keys), which AdamW turns into
            // lr-sized steps of either sign: it is not compared.
            let key_bias = if name.ends_with("in_proj_bias") { a.len() / 3..2 * a.len() / 3 } else { 0..0 };
            a.iter()
                .zip(b)
                .enumerate()
                .filter(move |(i, _)| !key_bias.contains(i))
                .map(|(_, (x, y))| (x - y).abs() / (1.0 + y.abs()))
        })
        .fold(0f32, f32::max);
    println!("{model}: 2 ranks x 2 streams vs 1 process x 4 streams, largest relative weight difference {worst:e}");
    assert!(worst < 1e-4, "{model}: the distributed weights differ from one process's by {worst}\n{out}\n{one}");
    let single_val = figure(&one, "validation loss");
    assert!((val - single_val).abs() < 2e-3, "{model}: validation loss {val} on 2 ranks, {single_val} in one process");

    // Rank 0's checkpoint continues in a plain process (2 streams per step now).
    let resume = with(&["--batch-size", "2", "--resume", "ck.ft", "--epochs", "3"]);
    let resume: Vec<&str> = resume.iter().map(String::as_str).collect();
    let resumed = common::ok(&resume, dir.path());
    assert!(resumed.contains("resumed from ck.ft after epoch 2"), "{resumed}");
    assert_eq!(resumed.matches("epoch   3/3").count(), 1, "{resumed}");
}

#[test]
fn two_ranks_train_the_transformer_like_one_process_with_twice_the_streams() {
    language_model_case(
        "two_ranks_train_the_transformer_like_one_process_with_twice_the_streams",
        "transformer",
        &["--d-model", "32", "--heads", "2", "--layers", "1"],
    );
}

#[test]
fn two_ranks_train_the_lstm_like_one_process_with_twice_the_streams() {
    language_model_case(
        "two_ranks_train_the_lstm_like_one_process_with_twice_the_streams",
        "lstm",
        &["--hidden", "32"],
    );
}

#[test]
fn two_ranks_train_digits_and_the_checkpoint_resumes_without_mpi() {
    if !cfg!(feature = "mpi") {
        let dir = tempfile::tempdir().unwrap();
        let o = common::ferrite(&["train", "--distributed", "--epochs", "1"], dir.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(err.contains("--features mpi") && err.contains("libopenmpi-dev"), "{err}");
        let required = std::env::var("FERRITE_REQUIRE_SYSTEM_DEPS").is_ok_and(|v| v == "1");
        assert!(!required, "FERRITE_REQUIRE_SYSTEM_DEPS=1 but ferrite-cli was built without the `mpi` feature");
        eprintln!("SKIPPED the mpirun part: ferrite-cli built without the `mpi` feature (--features ferrite-cli/mpi)");
        return;
    }
    if !common::require_or_skip("mpirun", "openmpi-bin libopenmpi-dev") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = mpirun_ferrite(
        2,
        &["train", "--distributed", "--epochs", "2", "--hidden", "32", "--lr", "0.01", "--save-checkpoint", "ck.ft"],
        dir.path(),
    );
    assert!(ok, "{out}\n{err}");
    // One rank prints: every epoch line appears once.
    assert_eq!(out.matches("epoch   1/2").count(), 1, "{out}");
    assert!(out.contains("rank 0: peak allocated") && out.contains("rank 1: peak allocated"), "{out}");
    assert!(common::final_accuracy(&out) > 50.0, "{out}");
    // Each rank evaluated its share of the test set and the counts were summed: one process
    // evaluating the whole set with the same weights (the checkpoint, no epoch left to run)
    // reports the same accuracy.
    let alone =
        common::ok(&["train", "--resume", "ck.ft", "--epochs", "2", "--hidden", "32", "--lr", "0.01"], dir.path());
    assert!(alone.contains("0 run here"), "{alone}");
    assert_eq!(common::final_accuracy(&alone), common::final_accuracy(&out), "{alone}\n{out}");
    // Rank 0's checkpoint continues in a plain process (a different number of ranks).
    let resumed =
        common::ok(&["train", "--resume", "ck.ft", "--epochs", "3", "--hidden", "32", "--lr", "0.01"], dir.path());
    assert!(resumed.contains("resumed from ck.ft after epoch 2"), "{resumed}");
    assert!(common::final_accuracy(&resumed) > 50.0, "{resumed}");
}

/// `--distributed --hf-model`: 2 ranks × 4 blocks per step end with the weights and validation
/// loss of 1 rank × 8 blocks (the ranks split one seeded permutation of the blocks, so each step
/// averages the same 8 blocks' gradients), `--zero 2` ends where DDP does, and rank 0 writes a
/// folder that loads.
#[test]
fn distributed_hf_model_matches_one_rank_with_the_ranks_batches() {
    let test = "distributed_hf_model_matches_one_rank_with_the_ranks_batches";
    if !mpi_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let hf = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ferrite-models/tests/data/hf");
    let (model, text) = (hf.join("llama").display().to_string(), hf.join("text.txt").display().to_string());
    let run = |np: &str, batch: &str, out: &str, extra: &[&str]| {
        let mut args = vec!["train", "--distributed", "--hf-model", &model, "--data", &text, "--seq", "16"];
        // 48 blocks: 6 steps of 8 blocks, one epoch (a checkpoint is written at an epoch's end).
        args.extend(["--lr", "3e-3", "--batch-size", batch, "--train-subset", "48", "--epochs", "1"]);
        args.extend(["--no-progress", "--out", out]);
        args.extend(extra);
        let ranks: usize = np.parse().unwrap();
        let (ok, stdout, stderr) = mpirun_ferrite(ranks, &args, dir.path());
        assert!(ok, "{stdout}\n{stderr}");
        stdout
    };
    let val = |out: &str| -> f64 {
        let line = out.lines().find(|l| l.starts_with("trained ")).unwrap_or_else(|| panic!("{out}"));
        let at = line.find("validation loss ").unwrap() + "validation loss ".len();
        line[at..].split(|c: char| !(c.is_ascii_digit() || c == '.')).next().unwrap().parse().unwrap()
    };
    let two = run("2", "4", "two", &[]);
    let one = run("1", "8", "one", &[]);
    // ZeRO-2 over the same 2 ranks: the optimizer state and gradients sharded, the same run.
    let zero = run("2", "4", "zero", &["--zero", "2", "--save-checkpoint", "zero-ck"]);
    assert!((val(&zero) - val(&two)).abs() < 1e-5, "ZeRO-2 {} vs DDP {}", val(&zero), val(&two));
    // The sharded checkpoint, converted without MPI, is the folder rank 0 wrote.
    common::ok(&["convert", "zero-ck", "zero-hf", "--hf-model", &model], dir.path());
    assert_eq!(
        weights(&dir.path().join("zero-hf/model.safetensors")),
        weights(&dir.path().join("zero/model.safetensors"))
    );
    // ZeRO-3: the decoder's layers gathered one at a time; the same run again, and its sharded
    // checkpoint converts to the folder rank 0 wrote.
    let zero3 = run("2", "4", "zero3", &["--zero", "3", "--save-checkpoint", "zero3-ck"]);
    assert!((val(&zero3) - val(&two)).abs() < 1e-5, "ZeRO-3 {} vs DDP {}", val(&zero3), val(&two));
    common::ok(&["convert", "zero3-ck", "zero3-hf", "--hf-model", &model], dir.path());
    assert_eq!(
        weights(&dir.path().join("zero3-hf/model.safetensors")),
        weights(&dir.path().join("zero3/model.safetensors"))
    );
    assert_eq!(two.matches("ferrite train:").count(), 1, "rank 0 alone prints:\n{two}");
    assert!(two.contains(", 2 ranks"), "{two}");
    assert!((val(&two) - val(&one)).abs() < 1e-4, "validation loss 2 ranks {} vs 1 rank {}", val(&two), val(&one));
    let (a, b) =
        (weights(&dir.path().join("two/model.safetensors")), weights(&dir.path().join("one/model.safetensors")));
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let worst = x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "{name}: 2 ranks and 1 rank differ by {worst}");
    }
}

/// `--distributed --lora-rank`: only the adapters train and are averaged over the ranks (the
/// frozen base is neither synchronised nor sharded), so 2 ranks × 4 blocks, and the same under
/// `--zero 2`, end with the adapters of 1 rank × 8 blocks; rank 0 writes the PEFT folder.
#[test]
fn distributed_lora_matches_one_rank_with_the_ranks_batches() {
    let test = "distributed_lora_matches_one_rank_with_the_ranks_batches";
    if !mpi_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let hf = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ferrite-models/tests/data/hf");
    let (model, text) = (hf.join("llama").display().to_string(), hf.join("text.txt").display().to_string());
    let run = |ranks: usize, batch: &str, out: &str, extra: &[&str]| {
        let mut args = vec!["train", "--distributed", "--hf-model", &model, "--data", &text, "--seq", "16"];
        args.extend(["--lr", "3e-3", "--batch-size", batch, "--train-subset", "48", "--epochs", "1"]);
        args.extend(["--lora-rank", "4", "--lora-targets", "q_proj,v_proj,o_proj", "--no-progress", "--out", out]);
        args.extend(extra);
        let (ok, stdout, stderr) = mpirun_ferrite(ranks, &args, dir.path());
        assert!(ok, "{stdout}\n{stderr}");
        stdout
    };
    let two = run(2, "4", "two", &[]);
    assert!(two.contains("LoRA r=4") && two.contains(", 2 ranks"), "{two}");
    run(1, "8", "one", &[]);
    run(2, "4", "zero", &["--zero", "2"]);
    let adapters = |d: &str| weights(&dir.path().join(d).join("adapter_model.safetensors"));
    let (one, two, zero) = (adapters("one"), adapters("two"), adapters("zero"));
    assert!(
        !one.is_empty() && one.iter().all(|(n, _)| n.contains("lora_")),
        "{:?}",
        one.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for (name, other) in [("2 ranks", &two), ("ZeRO-2", &zero)] {
        assert_eq!(other.len(), one.len());
        for ((n, x), (_, y)) in other.iter().zip(&one) {
            let worst = x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
            assert!(worst < 1e-4, "{name}: {n} differs from 1 rank by {worst}");
        }
    }
    // The adapters moved: B starts at zero.
    assert!(one.iter().filter(|(n, _)| n.contains("lora_B")).any(|(_, v)| v.iter().any(|x| *x != 0.0)));
}

/// `--distributed --hf-model T5DIR` (the committed tiny T5, JSONL input/target pairs): 2 ranks × 4
/// pairs per step end with the weights and validation loss of 1 rank × 8 pairs. Every target has
/// the same length, so the ranks' mean losses over target tokens average to the 8 pairs' mean
/// (DDP averages the ranks' gradients, as PyTorch's); 4 steps stay inside the first epoch.
#[test]
fn distributed_t5_matches_one_rank_with_the_ranks_batches() {
    let test = "distributed_t5_matches_one_rank_with_the_ranks_batches";
    if !mpi_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let hf = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ferrite-models/tests/data/hf");
    let model = hf.join("t5").display().to_string();
    let lines: Vec<String> = std::fs::read_to_string(hf.join("seq2seq.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            serde_json::json!({"input": v["input"], "target": "the memory of a device"}).to_string()
        })
        .collect();
    std::fs::write(dir.path().join("pairs.jsonl"), lines.join("\n")).unwrap();
    let run = |ranks: usize, batch: &str, out: &str, extra: &[&str]| {
        let mut args = vec!["train", "--distributed", "--hf-model", &model, "--data", "pairs.jsonl", "--seq", "16"];
        args.extend(["--lr", "3e-3", "--batch-size", batch, "--steps", "4", "--no-progress", "--out", out]);
        args.extend(extra);
        let (ok, stdout, stderr) = mpirun_ferrite(ranks, &args, dir.path());
        assert!(ok, "{stdout}\n{stderr}");
        stdout
    };
    let val = |out: &str| -> f64 {
        let line = out.lines().find(|l| l.starts_with("trained ")).unwrap_or_else(|| panic!("{out}"));
        let at = line.find("validation loss ").unwrap_or_else(|| panic!("{line}")) + "validation loss ".len();
        line[at..].split(|c: char| !(c.is_ascii_digit() || c == '.')).next().unwrap().parse().unwrap()
    };
    let two = run(2, "4", "two", &[]);
    let one = run(1, "8", "one", &[]);
    // ZeRO-3: encoder and decoder blocks gathered one at a time; the same weights as DDP.
    run(2, "4", "zero3", &["--zero", "3"]);
    assert_eq!(
        weights(&dir.path().join("zero3/model.safetensors")),
        weights(&dir.path().join("two/model.safetensors")),
        "T5 under ZeRO-3 differs from DDP"
    );
    assert_eq!(two.matches("ferrite train:").count(), 1, "rank 0 alone prints:\n{two}");
    assert!(two.contains(", 2 ranks"), "{two}");
    assert!((val(&two) - val(&one)).abs() < 1e-4, "validation loss 2 ranks {} vs 1 rank {}", val(&two), val(&one));
    let (a, b) =
        (weights(&dir.path().join("two/model.safetensors")), weights(&dir.path().join("one/model.safetensors")));
    let original = weights(&hf.join("t5/model.safetensors"));
    assert_eq!(a.len(), b.len());
    let mut moved = false;
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let worst = x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "{name}: 2 ranks and 1 rank differ by {worst}");
        moved |= original.iter().any(|(n, o)| n == name && o != x);
    }
    assert!(moved, "training changed the weights");
}
