//! A training run that runs out of memory: the error's ranked remedies are the planner's, for
//! this model on this device, each with the bytes it saves — and those bytes are the ones
//! `ferrite plan` gives for the same change.
mod common;

use std::process::Command;

use ferrite_memory::format_size;

fn ferrite(args: &[&str], dir: &std::path::Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrite")).args(args).current_dir(dir).output().expect("run ferrite");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The model and device of the run (an MLP whose activations do not fit 40 MiB at batch 1442,
/// the whole digits training set).
const MODEL: [&str; 6] = ["--hidden", "512", "--layers", "8", "--device", "sim:40MiB"];

/// `ferrite plan`'s peak reserved bytes for the run's model with `extra` flags.
fn planned_peak(extra: &[&str], dir: &std::path::Path) -> u64 {
    let mut args = vec!["plan", "--model", "mlp", "--json"];
    args.extend(MODEL);
    args.extend(extra);
    let (ok, out, err) = ferrite(&args, dir);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["peak_reserved_bytes"].as_u64().unwrap()
}

/// Parses `  N. CHANGE: saves SIZE (peak reserved SIZE), fits|still does not fit`.
fn remedy_line(line: &str) -> (String, String, String, bool) {
    let (_, rest) = line.trim_start().split_once(". ").unwrap();
    let (change, rest) = rest.split_once(": saves ").unwrap();
    let (saves, rest) = rest.split_once(" (peak reserved ").unwrap();
    let (peak, verdict) = rest.split_once("), ").unwrap();
    assert!(verdict == "fits" || verdict == "still does not fit", "{line}");
    (change.to_string(), saves.to_string(), peak.to_string(), verdict == "fits")
}

#[test]
fn a_sim_oom_error_ranks_the_planners_remedies_by_bytes_saved() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["train", "--batch-size", "1442", "--epochs", "1", "--no-progress"];
    args.extend(MODEL);
    let (ok, _, err) = ferrite(&args, dir.path());
    assert!(!ok, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // One block: what happened, the numbers, the diagnosis, then the planner's remedies.
    let head = "Ranked remedies (ferrite plan, for this model on sim:40MiB):";
    let (before, after) = err.split_once(head).unwrap_or_else(|| panic!("no `{head}` in:\n{err}"));
    assert!(before.contains("CUDA out of memory. Tried to allocate") && before.contains("\nDiagnosis: "), "{err}");
    assert!(!err.contains("Suggestions") && !err.contains("Remedies planned"), "the fixed rules are replaced:\n{err}");
    let lines: Vec<&str> = after.lines().skip(1).take_while(|l| l.starts_with("  ")).collect();
    let remedies: Vec<_> = lines.iter().map(|l| remedy_line(l)).collect();
    let changes: Vec<&str> = remedies.iter().map(|r| r.0.as_str()).collect();
    for c in ["--batch-size 721 --accum-steps 2 (effective batch 1442)", "--amp bf16", "--checkpoint-activations"] {
        assert!(changes.contains(&c), "`{c}` missing from {changes:?}");
    }
    // Ranked: larger savings first.
    let saves: Vec<f64> = remedies.iter().map(|r| common::size(&r.1)).collect();
    assert!(saves.windows(2).all(|w| w[0] >= w[1]), "not ranked by bytes saved: {lines:#?}");
    // Each figure is the planner's for this model: the run's planned peak minus the peak with the change.
    let base = planned_peak(&["--batch", "1442"], dir.path());
    for (flags, change) in [
        (vec!["--batch", "1442", "--amp", "bf16"], "--amp bf16"),
        (vec!["--batch", "1442", "--checkpoint-activations"], "--checkpoint-activations"),
        (vec!["--batch", "721", "--accum-steps", "2"], "--batch-size 721 --accum-steps 2 (effective batch 1442)"),
    ] {
        let peak = planned_peak(&flags, dir.path());
        let r = remedies.iter().find(|r| r.0 == change).unwrap();
        assert_eq!(r.1, format_size(base.saturating_sub(peak)), "bytes saved by {change} (planned {base} -> {peak})");
        assert_eq!(r.2, format_size(peak), "peak with {change}");
        assert!(base > peak, "{change} lowers the planned peak for this model");
    }
}

/// On `gpu:N` with a capacity (FERRITE_GPU_MEMORY) the planner models a device of that capacity;
/// expandable segments, which wgpu buffers cannot do, are not offered. Skips without an adapter.
#[test]
fn a_gpu_with_a_capacity_gets_the_planners_remedies() {
    if !ferrite_test_support::gpu_adapter_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["train", "--device", "gpu:0", "--hidden", "4096", "--epochs", "1", "--no-progress"])
        .env("FERRITE_GPU_MEMORY", "64MiB")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("GPU out of memory"), "{err}");
    assert!(err.contains("Ranked remedies (ferrite plan, for this model on gpu:0 (64.00 MiB)):\n  1. "), "{err}");
    assert!(!err.contains("expandable_segments") && !err.contains("Suggestions"), "{err}");
}
