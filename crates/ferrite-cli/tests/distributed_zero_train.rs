//! `mpirun -np N ferrite train --distributed --zero 1|2|3`: the built-in models train with the
//! optimizer state (at stage 2 the gradients, at stage 3 the parameters too) sharded over the
//! ranks and end with the same weights as the same run under DDP; every rank's memory is in the
//! summary. `--zero` without `--distributed`, a stage this build lacks, or `--zero 3` with a
//! model that has no blocks to gather one by one is a typed error (sharded checkpoints:
//! distributed_zero_checkpoint.rs).
//! Every mpirun is killed after a deadline. Skips loudly without MPI unless
//! FERRITE_REQUIRE_SYSTEM_DEPS=1.

mod common;

use common::mpi::{mpi_ready, mpirun_ferrite, weights, worst_relative};

/// DDP, ZeRO-1, ZeRO-2 and ZeRO-3 runs of `args` on `ranks` ranks end with the same weights: ZeRO-1
/// all-reduces exactly as DDP does, and so does ZeRO-2 on 2 ranks (a sum of two is the same in
/// either order); on 3 ranks MPI's reduce-scatter may add in another order than its all-reduce,
/// which AdamW's normalisation amplifies over a run to ~1e-7 on small weights.
fn zero_equals_ddp(test: &str, ranks: usize, args: &[&str]) {
    if !mpi_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    if args.contains(&"text.txt") {
        let words = ["the ", "cat ", "sat ", "on ", "a ", "mat ", "and ", "dog ", "ran ", "far. "];
        let (mut text, mut state) = (String::new(), 11u64);
        while text.len() < 2000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            text.push_str(words[(state >> 33) as usize % words.len()]);
        }
        std::fs::write(dir.path().join("text.txt"), &text).unwrap();
    }
    let run = |zero: Option<&str>, out: &str| -> String {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["--distributed", "--no-progress", "--out", out]);
        if let Some(z) = zero {
            a.extend(["--zero", z]);
        }
        let (ok, stdout, stderr) = mpirun_ferrite(ranks, &a, dir.path());
        assert!(ok, "{test}: {a:?}\n{stdout}\n{stderr}");
        for r in 0..ranks {
            assert!(stdout.contains(&format!("rank {r}: peak allocated")), "{test}: every rank's memory:\n{stdout}");
        }
        stdout
    };
    run(None, "ddp.safetensors");
    let z1 = run(Some("1"), "zero1.safetensors");
    assert!(z1.contains("ZeRO-1"), "{z1}");
    run(Some("2"), "zero2.safetensors");
    let z3 = run(Some("3"), "zero3.safetensors");
    assert!(z3.contains("ZeRO-3"), "{z3}");
    let ddp = weights(&dir.path().join("ddp.safetensors"));
    for stage in ["zero1", "zero2", "zero3"] {
        let w = weights(&dir.path().join(format!("{stage}.safetensors")));
        let (worst, at) = worst_relative(&w, &ddp, true);
        println!("{test}: {stage} vs DDP on {ranks} ranks, largest relative weight difference {worst:e} at {at}");
        assert!(worst < 1e-6, "{test}: {stage} differs from DDP by {worst} at {at}");
    }
}

#[test]
fn two_ranks_zero_trains_the_mlp_like_ddp_with_clipping_and_accumulation() {
    zero_equals_ddp(
        "two_ranks_zero_mlp",
        2,
        &["train", "--epochs", "1", "--hidden", "30", "--lr", "0.01", "--clip-grad-norm", "0.5", "--accum-steps", "2"],
    );
}

#[test]
fn three_ranks_zero_trains_the_transformer_like_ddp() {
    zero_equals_ddp(
        "three_ranks_zero_transformer",
        3,
        &[
            "train",
            "--model",
            "transformer",
            "--dataset",
            "text.txt",
            "--seq",
            "16",
            "--lr",
            "0.01",
            "--d-model",
            "20",
            "--heads",
            "2",
            "--layers",
            "1",
            "--batch-size",
            "2",
            "--epochs",
            "1",
        ],
    );
}

#[test]
fn zero_needs_distributed_and_a_known_stage() {
    let dir = tempfile::tempdir().unwrap();
    for (args, expect) in [
        (&["train", "--zero", "1", "--epochs", "1"][..], "--distributed as well"),
        (&["train", "--distributed", "--zero", "4", "--epochs", "1"][..], "3 (and parameters)"),
        (&["train", "--zero-comm-dtype", "bf16", "--epochs", "1"][..], "--zero 1|2|3 as well"),
        (
            &["train", "--distributed", "--zero", "2", "--zero-comm-dtype", "bf16", "--epochs", "1"][..],
            "--amp bf16 as well",
        ),
        (
            &["train", "--distributed", "--zero", "2", "--zero-comm-dtype", "f16", "--epochs", "1"][..],
            "not a communication dtype",
        ),
    ] {
        let o = common::ferrite(args, dir.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains("--zero") && err.contains(expect), "{args:?}: {err}");
    }
}

/// `--zero 3` gathers a model block by block: a model without blocks (the LSTM language model:
/// an encoder, one recurrent layer and a decoder) is a typed error on every rank naming the model
/// and the stage to use instead.
#[test]
fn zero_3_without_wrappable_units_is_a_typed_error_on_every_rank() {
    let test = "zero3_no_units";
    if !mpi_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("text.txt"), "the cat sat on the mat. ".repeat(40)).unwrap();
    let args = [
        "train",
        "--model",
        "lstm",
        "--dataset",
        "text.txt",
        "--seq",
        "8",
        "--hidden",
        "8",
        "--batch-size",
        "2",
        "--epochs",
        "1",
        "--distributed",
        "--no-progress",
        "--zero",
        "3",
    ];
    let mut all: Vec<String> = vec!["-np".into(), "2".into(), env!("CARGO_BIN_EXE_ferrite").into()];
    all.extend(args.iter().map(|s| s.to_string()));
    // Every rank runs to its end, so both errors are seen.
    let (_, stdout, stderr) = common::mpi::mpirun(&all, &[], dir.path(), true);
    assert!(!stdout.contains("weights written"), "{test}: trained anyway\n{stdout}");
    assert!(
        stderr.matches("no wrappable units").count() >= 2 && stderr.contains("--zero 2"),
        "{test}: every rank names the problem and the way out:\n{stderr}"
    );
}
