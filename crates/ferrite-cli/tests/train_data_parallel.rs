//! `ferrite train --device sim:a100-40gb --devices 0,1,2,3`: the default MLP (whose hidden weight
//! is most of its parameters) trained with DataParallel and AdamW ends with every device's peak
//! within 10 % of the others', the spread printed, each device holding an equal share of the
//! optimizer state, and the weights saved with plain names.

mod common;

use common::ok;

/// The number before `%` after `needle` in `text`.
fn percent_after(text: &str, needle: &str) -> f64 {
    let at = text.rfind(needle).unwrap_or_else(|| panic!("no `{needle}` in:\n{text}")) + needle.len();
    let rest = text[at..].trim_start();
    let end = rest.find('%').unwrap_or_else(|| panic!("no % after `{needle}` in:\n{text}"));
    rest[..end].trim().parse().unwrap_or_else(|e| panic!("{e}: `{}`", &rest[..end]))
}

#[test]
fn four_simulated_devices_train_with_balanced_peaks_and_optimizer_state() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(
        &[
            "train",
            "--device",
            "sim:a100-40gb",
            "--devices",
            "0,1,2,3",
            "--epochs",
            "1",
            "--train-subset",
            "512",
            "--no-progress",
            "--out",
            "dp.safetensors",
        ],
        dir.path(),
    );
    for d in 0..4 {
        assert!(out.contains(&format!("sim:a100-40gb:{d}")), "{out}");
    }
    let spread = percent_after(&out, "peak spread across devices:");
    assert!(spread <= 10.0, "peaks {spread} % apart:\n{out}");
    // AdamW's state: the same share on every device.
    let line = out.lines().find(|l| l.starts_with("optimizer state per device")).unwrap_or_else(|| panic!("{out}"));
    let shares: Vec<&str> = line.split(':').nth(1).unwrap().split(';').next().unwrap().split(" / ").collect();
    assert_eq!(shares.len(), 4, "{line}");
    assert!(shares.iter().all(|s| s.trim() == shares[0].trim()), "{line}");
    assert!(dir.path().join("dp.safetensors").exists());
}

#[test]
fn data_parallel_accumulates_scales_f16_checkpoints_and_resumes() {
    // The trainer's settings work under --devices as on one device: two micro-batches per step,
    // f16 loss scaling, a checkpoint after each epoch and a resume from it.
    let dir = tempfile::tempdir().unwrap();
    let args = |epochs: &'static str, extra: &[&'static str]| {
        let mut a = vec![
            "train",
            "--device",
            "sim:a100-40gb",
            "--devices",
            "0,1",
            "--epochs",
            epochs,
            "--train-subset",
            "256",
            "--batch-size",
            "32",
            "--accum-steps",
            "2",
            "--amp",
            "f16",
            "--no-progress",
            "--save-checkpoint",
            "dp.ckpt",
            "--out",
            "dp.safetensors",
        ];
        a.extend_from_slice(extra);
        a
    };
    let first = ok(&args("1", &[]), dir.path());
    assert!(first.contains("epoch   1/1") && first.contains("peak per device"), "{first}");
    let resumed = ok(&args("2", &["--resume", "dp.ckpt"]), dir.path());
    assert!(resumed.contains("resumed from dp.ckpt after epoch 1"), "{resumed}");
    assert!(resumed.contains("epoch   2/2") && !resumed.contains("epoch   1/2"), "{resumed}");
    assert!(resumed.contains("peak spread across devices:"), "{resumed}");
}
