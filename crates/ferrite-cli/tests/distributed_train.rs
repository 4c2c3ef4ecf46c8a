//! `mpirun -np 2 ferrite train --distributed`: trains, rank 0 alone prints, the summary has every
//! rank's memory, and rank 0's checkpoint resumes in a single process without MPI. Without the
//! `mpi` feature the flag is a typed error. Skips loudly without MPI unless
//! FERRITE_REQUIRE_SYSTEM_DEPS=1.

mod common;

use std::process::Command;

fn mpirun_ferrite(args: &[&str], dir: &std::path::Path) -> (bool, String, String) {
    let o = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2", env!("CARGO_BIN_EXE_ferrite")])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("mpirun starts");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
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
        &["train", "--distributed", "--epochs", "2", "--hidden", "32", "--lr", "0.01", "--save-checkpoint", "ck.ft"],
        dir.path(),
    );
    assert!(ok, "{out}\n{err}");
    // One rank prints: every epoch line appears once.
    assert_eq!(out.matches("epoch   1/2").count(), 1, "{out}");
    assert!(out.contains("rank 0: peak allocated") && out.contains("rank 1: peak allocated"), "{out}");
    assert!(common::final_accuracy(&out) > 50.0, "{out}");
    // Rank 0's checkpoint continues in a plain process (a different number of ranks).
    let resumed =
        common::ok(&["train", "--resume", "ck.ft", "--epochs", "3", "--hidden", "32", "--lr", "0.01"], dir.path());
    assert!(resumed.contains("resumed from ck.ft after epoch 2"), "{resumed}");
    assert!(common::final_accuracy(&resumed) > 50.0, "{resumed}");
}
