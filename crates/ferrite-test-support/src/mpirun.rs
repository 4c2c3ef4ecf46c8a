//! The `mpirun` command every multi-process test starts its ranks with.
//!
//! Why one place: Open MPI's launcher creates a session directory (`ompi.<host>.<uid>` under its
//! temporary directory) when it starts, and two launches at the same moment — test binaries run
//! their tests in parallel, several of them start `mpirun` — race on that `mkdir`: one fails with
//! "A call to mkdir was unable to create the desired directory … File exists" before any rank
//! runs (seen in CI, in `distributed_zero`). Each launch here gets its own empty base directory
//! (`orte_tmpdir_base`), so launches never share one. Only the launcher's directory moves: the
//! ranks' `TMPDIR`, which tests may use, is left alone.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `mpirun` with a session directory base of its own (see the module note); the caller adds
/// its options and arguments.
pub fn mpirun_command() -> Command {
    static LAUNCHES: AtomicUsize = AtomicUsize::new(0);
    let base: PathBuf = std::env::temp_dir().join("ferrite-mpirun").join(format!(
        "{}-{}",
        std::process::id(),
        LAUNCHES.fetch_add(1, Ordering::Relaxed)
    ));
    let mut cmd = Command::new("mpirun");
    // Open MPI 4 (orte) names the parameter `orte_tmpdir_base`; if the directory cannot be made,
    // mpirun falls back to its default and the launch is no worse than before.
    if std::fs::create_dir_all(&base).is_ok() {
        cmd.env("OMPI_MCA_orte_tmpdir_base", &base);
    }
    cmd
}
