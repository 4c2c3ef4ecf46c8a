//! `mpirun -np N ferrite train --distributed --zero 1|2`: the built-in models train with the
//! optimizer state (and at stage 2 the gradients) sharded over the ranks and end with the same
//! weights as the same run under DDP; every rank's memory is in the summary. `--zero` without
//! `--distributed`, or a stage this build lacks, is a typed error (sharded checkpoints:
//! distributed_zero_checkpoint.rs).
//! Every mpirun is killed after a deadline. Skips loudly without MPI unless
//! FERRITE_REQUIRE_SYSTEM_DEPS=1.

mod common;

use common::mpi::{mpi_ready, mpirun_ferrite, weights, worst_relative};

/// DDP, ZeRO-1 and ZeRO-2 runs of `args` on `ranks` ranks end with the same weights: ZeRO-1
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
    let ddp = weights(&dir.path().join("ddp.safetensors"));
    for stage in ["zero1", "zero2"] {
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
        (&["train", "--distributed", "--zero", "3", "--epochs", "1"][..], "ZeRO-3 is not implemented yet"),
    ] {
        let o = common::ferrite(args, dir.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains("--zero") && err.contains(expect), "{args:?}: {err}");
    }
}
