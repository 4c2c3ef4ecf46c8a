//! `ferrite train --model lstm|transformer` seen from outside: character-level language models on
//! the Jargon File and on a text file, truncated BPTT whose memory does not grow with the text,
//! bit-identical resume, and the errors a user meets.

mod common;

use std::path::Path;

use common::{ferrite, ok};
use ferrite_data::char_text::JARGON_PATH;

fn failure(args: &[&str], dir: &Path) -> String {
    let o = ferrite(args, dir);
    assert_eq!(o.status.code(), Some(1), "{args:?} should fail with status 1");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The number after `key ` in `line` (`validation loss 2.78 (…)` → 2.78).
fn figure(line: &str, key: &str) -> f64 {
    let at = line.find(key).unwrap_or_else(|| panic!("no `{key}` in {line}")) + key.len();
    line[at..].trim_start().split(|c: char| !(c.is_ascii_digit() || c == '.')).next().unwrap().parse().unwrap()
}

/// The epoch lines of a run's output.
fn epochs(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("epoch ")).collect()
}

/// A text with structure a small model learns within one epoch: words from a small vocabulary
/// in a repeating but not periodic order (a linear congruential walk).
fn write_text(dir: &Path, name: &str, chars: usize) -> String {
    let words = ["the ", "cat ", "sat ", "on ", "a ", "mat ", "and ", "dog ", "ran ", "far. ", "then ", "slept.\n"];
    let (mut text, mut state) = (String::new(), 7u64);
    while text.len() < chars {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        text.push_str(words[(state >> 33) as usize % words.len()]);
    }
    text.truncate(chars);
    std::fs::write(dir.join(name), &text).unwrap();
    name.to_string()
}

#[test]
fn the_lstm_beats_the_unigram_model_on_the_jargon_file_within_one_epoch() {
    let present = Path::new(JARGON_PATH).is_file();
    if !ferrite_test_support::present_or_skip(
        present,
        "the Jargon File is missing",
        "run bash .ci/run or install jargon-text",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = ok(
        &[
            "train",
            "--model",
            "lstm",
            "--hidden",
            "128",
            "--bptt",
            "32",
            "--batch-size",
            "32",
            "--train-subset",
            "120000",
            "--no-progress",
        ],
        dir.path(),
    );
    let line = epochs(&out)[0];
    let (val, unigram) = (figure(line, "validation loss"), figure(line, "unigram"));
    println!("LSTM on the Jargon File, one epoch of 120k characters: validation loss {val} vs unigram {unigram}");
    assert!(val < unigram, "{out}");
    assert!(out.contains("truncated BPTT every 32 characters"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("sample: ")), "{out}");
    assert!(out.contains("ferrite memory summary, device cpu"), "{out}");
}

#[test]
fn the_transformer_learns_a_text_file_and_writes_gpt_style_weights() {
    let dir = tempfile::tempdir().unwrap();
    let text = write_text(dir.path(), "story.txt", 60_000);
    let out = ok(
        &[
            "train",
            "--model",
            "transformer",
            "--dataset",
            &text,
            "--d-model",
            "32",
            "--heads",
            "2",
            "--seq",
            "32",
            "--batch-size",
            "16",
            "--no-progress",
        ],
        dir.path(),
    );
    let line = epochs(&out)[0];
    let (val, unigram) = (figure(line, "validation loss"), figure(line, "unigram"));
    println!("transformer on a 60k-character text, one epoch: validation loss {val} vs unigram {unigram}");
    assert!(val < unigram, "{out}");
    let weights = ferrite_io::read(dir.path().join("ferrite-story-transformer.safetensors")).unwrap();
    let names: Vec<String> = weights.tensors().into_iter().map(|(n, _)| n).collect();
    for key in ["tok_emb.weight", "pos_emb.weight", "blocks.1.self_attn.out_proj.weight", "norm.bias", "head.weight"] {
        assert!(names.iter().any(|n| n == key), "no {key} in {names:?}");
    }
}

#[test]
fn truncated_bptt_memory_does_not_grow_with_the_text() {
    // The same chunk length over a 4x longer text: the graph never spans more than one chunk, so
    // the forward+backward peak is the same; only the epoch gets longer.
    let dir = tempfile::tempdir().unwrap();
    let peak = |chars: usize| {
        let text = write_text(dir.path(), &format!("t{chars}.txt"), chars);
        let out = ok(
            &[
                "train",
                "--model",
                "lstm",
                "--dataset",
                &text,
                "--hidden",
                "32",
                "--bptt",
                "16",
                "--batch-size",
                "8",
                "--device",
                "sim:1GiB",
                "--no-progress",
            ],
            dir.path(),
        );
        let line = epochs(&out)[0].to_string();
        let fb = line.split("forward+backward ").nth(1).and_then(|s| s.split(')').next()).unwrap().to_string();
        (fb, line)
    };
    let (short, a) = peak(6_000);
    let (long, b) = peak(24_000);
    println!("LSTM forward+backward peak: {short} over 6k characters, {long} over 24k");
    assert_eq!(short, long, "\n{a}\n{b}");
}

#[test]
fn language_models_resume_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let text = write_text(dir.path(), "story.txt", 12_000);
    for model in ["lstm", "transformer"] {
        let common = [
            "train",
            "--model",
            model,
            "--dataset",
            &text,
            "--hidden",
            "24",
            "--d-model",
            "24",
            "--heads",
            "2",
            "--seq",
            "16",
            "--batch-size",
            "8",
            "--dropout",
            "0.1",
            "--accum-steps",
            "2",
            "--amp",
            "f16",
            "--workers",
            "2",
            "--checkpoint-activations",
            "--no-progress",
        ];
        let run = |extra: &[&str]| {
            let args: Vec<&str> = common.iter().copied().chain(extra.iter().copied()).collect();
            ok(&args, dir.path())
        };
        run(&["--epochs", "2", "--out", "straight.safetensors"]);
        run(&["--epochs", "1", "--out", "half.safetensors", "--save-checkpoint", "run.ckpt"]);
        let resumed = run(&["--epochs", "2", "--out", "resumed.safetensors", "--resume", "run.ckpt"]);
        assert!(resumed.contains("resumed from run.ckpt after epoch 1"), "{resumed}");
        let a = std::fs::read(dir.path().join("straight.safetensors")).unwrap();
        let b = std::fs::read(dir.path().join("resumed.safetensors")).unwrap();
        let half = std::fs::read(dir.path().join("half.safetensors")).unwrap();
        assert_ne!(a, half, "{model}: one epoch alone differs");
        assert_eq!(a, b, "{model}: 1 + 1 epochs with a resume equal 2 epochs, byte for byte");
    }
    // A resume with another model family (the last checkpoint is the transformer's) is refused
    // with the setting named.
    let err = failure(&["train", "--model", "lstm", "--dataset", &text, "--resume", "run.ckpt"], dir.path());
    assert!(err.contains("--model transformer") && err.contains("--model lstm"), "{err}");
}

#[test]
fn language_model_mistakes_are_errors_that_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let text = write_text(dir.path(), "small.txt", 500);
    let cases: [(&[&str], &str); 6] = [
        (&["train", "--model", "transformer", "--dataset", &text, "--heads", "3"], "divide --d-model"),
        (&["train", "--model", "lstm", "--dataset", "digits"], "use --model mlp"),
        (&["train", "--model", "lstm", "--dataset", &text, "--batch-size", "64", "--seq", "8"], "fewer than the 513"),
        (&["train", "--model", "lstm", "--dataset", &text, "--seq", "64"], "the validation text (the last 10 %)"),
        (&["train", "--model", "lstm", "--dataset", "no/such/file.txt"], "no/such/file.txt"),
        (&["train", "--model", "transformer", "--dataset", &text, "--seq", "0"], "--seq 0"),
    ];
    for (args, want) in cases {
        let err = failure(args, dir.path());
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
