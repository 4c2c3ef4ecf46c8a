//! `ferrite plan`'s ZeRO flags: a zero count is a typed error naming its flag, and a ZeRO flag
//! given without `--zero` (where it would shape nothing) is a typed error too, as is `--plot` or
//! `--zero` beside a question that does not print the plan of one step.

use std::process::Command;

fn plan(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .arg("plan")
        .args(["--model", "mlp", "--device", "sim:t4-16gb"])
        .args(args)
        .env("NODEVICE_SELECT", "1")
        .output()
        .expect("ferrite runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn refused(args: &[&str], needles: &[&str]) {
    let (ok, out, err) = plan(args);
    assert!(!ok, "{args:?} was accepted:\n{out}");
    assert!(err.starts_with("error: ") && !err.contains("panicked"), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: no `{n}` in {err}");
    }
}

#[test]
fn zero_gpus_or_nodes_are_refused_naming_the_flag() {
    refused(&["--zero", "2", "--gpus-per-node", "0"], &["--gpus-per-node 0", "at least one GPU"]);
    refused(&["--zero", "3", "--nodes", "0"], &["--nodes 0"]);
    // Without --zero the zero is still named (not "has no effect").
    refused(&["--nodes", "0"], &["--nodes 0", "at least one"]);
    refused(&["--gpus-per-node", "0"], &["--gpus-per-node 0"]);
}

#[test]
fn zero_flags_without_zero_are_refused() {
    refused(&["--gpus-per-node", "8"], &["--gpus-per-node 8", "has no effect without --zero"]);
    refused(&["--nodes", "2", "--offload", "optimizer"], &["--nodes 2 --offload optimizer", "without --zero"]);
    refused(&["--offload", "none"], &["--offload none", "without --zero"]);
}

#[test]
fn zero_flags_with_zero_and_the_defaults_work() {
    let (ok, out, err) = plan(&["--zero", "2", "--gpus-per-node", "4", "--nodes", "2", "--offload", "optimizer"]);
    assert!(ok, "{err}");
    assert!(out.contains("on 2 nodes x 4 GPUs"), "{out}");
    let (ok, out, err) = plan(&["--zero", "3"]);
    assert!(ok, "{err}");
    assert!(out.contains("on 1 node x 1 GPU"), "{out}");
    let (ok, _, err) = plan(&[]);
    assert!(ok, "{err}");
}

#[test]
fn plot_or_zero_beside_another_question_is_refused() {
    refused(&["--find-batch-size", "--plot", "p.svg"], &["--plot with --find-batch-size"]);
    refused(&["--sweep-batch", "1,2", "--zero", "2"], &["--zero with --sweep-batch"]);
    refused(&["--jobs", "2", "--plot", "p.png"], &["--plot with --jobs"]);
    assert!(!std::path::Path::new("p.svg").exists());
}
