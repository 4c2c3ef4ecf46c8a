//! What the tests that run `ferrite` under `mpirun` share: whether they can run here, the launch
//! itself (killed after a deadline, so a hang fails instead of blocking CI), and the comparison
//! of the weights two runs end with.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// No mpirun of these tests may take longer.
const DEADLINE: Duration = Duration::from_secs(300);

/// Whether the mpirun tests can run here: this build has the `mpi` feature and `mpirun` is on
/// PATH. Otherwise they skip loudly, or fail when FERRITE_REQUIRE_SYSTEM_DEPS=1.
pub fn mpi_ready(test: &str) -> bool {
    if !cfg!(feature = "mpi") {
        let required = std::env::var("FERRITE_REQUIRE_SYSTEM_DEPS").is_ok_and(|v| v == "1");
        assert!(!required, "{test}: FERRITE_REQUIRE_SYSTEM_DEPS=1 but ferrite-cli was built without the `mpi` feature");
        eprintln!("SKIPPED {test}: ferrite-cli built without the `mpi` feature (--features ferrite-cli/mpi)");
        return false;
    }
    super::require_or_skip("mpirun", "openmpi-bin libopenmpi-dev")
}

/// `mpirun -np RANKS ferrite ARGS` in `dir`; (success, stdout, stderr).
pub fn mpirun_ferrite(ranks: usize, args: &[&str], dir: &Path) -> (bool, String, String) {
    let mut all: Vec<String> = vec!["-np".into(), ranks.to_string(), env!("CARGO_BIN_EXE_ferrite").into()];
    all.extend(args.iter().map(|s| s.to_string()));
    mpirun(&all, &[], dir, false)
}

/// `mpirun ARGS` in `dir` (ARGS: everything after mpirun's own options) with `env` exported to
/// every rank, killed after the deadline; (success, stdout, stderr). With `every_rank`, every
/// rank may finish (Open MPI otherwise ends the job when the first rank exits with an error,
/// maybe before the others printed theirs); the exit status is then 0 whatever the ranks' are.
pub fn mpirun(args: &[String], env: &[(&str, &str)], dir: &Path, every_rank: bool) -> (bool, String, String) {
    let (out_path, err_path) = (dir.join("mpirun.out"), dir.join("mpirun.err"));
    let mut cmd = ferrite_test_support::mpirun_command();
    cmd.args(["--allow-run-as-root", "--oversubscribe"]);
    if every_rank {
        cmd.args(["--mca", "orte_abort_on_non_zero_status", "0"]);
    }
    for (k, v) in env {
        cmd.env(k, v).args(["-x", k]);
    }
    let mut child = cmd
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::from(std::fs::File::create(&out_path).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&err_path).unwrap()))
        .spawn()
        .expect("mpirun starts");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(status.is_some(), "mpirun {args:?} did not end within {DEADLINE:?}; killed.\n{out}\n{err}");
    (status.is_some_and(|s| s.success()), out, err)
}

/// Every parameter of a weights file (safetensors or a ferrite checkpoint), by name, as f32.
pub fn weights(path: &Path) -> Vec<(String, Vec<f32>)> {
    ferrite_io::load_state_dict(path, &ferrite_io::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        // bf16 weights (`--zero-comm-dtype bf16`) widen exactly.
        .map(|(n, t)| (n, t.to_dtype(ferrite_tensor::DType::F32).unwrap().to_vec::<f32>().unwrap()))
        .collect()
}

/// The largest `|a - b| / (1 + |b|)` over every weight (names must agree), and where: relative
/// for weights above 1, absolute below.
///
/// With `skip_key_bias`, the key third of attention's `in_proj_bias` is left out: its gradient
/// is zero but for rounding (softmax ignores a shift shared by all keys), and AdamW turns that
/// rounding into lr-sized steps of either sign, so a sum over ranks in another order moves it
/// differently.
pub fn worst_relative(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)], skip_key_bias: bool) -> (f32, String) {
    assert_eq!(a.iter().map(|(n, _)| n).collect::<Vec<_>>(), b.iter().map(|(n, _)| n).collect::<Vec<_>>());
    let mut worst = (0f32, String::new());
    for ((name, x), (_, y)) in a.iter().zip(b) {
        let key_bias =
            if skip_key_bias && name.ends_with("in_proj_bias") { x.len() / 3..2 * x.len() / 3 } else { 0..0 };
        for (i, (p, q)) in x.iter().zip(y).enumerate().filter(|(i, _)| !key_bias.contains(i)) {
            let r = (p - q).abs() / (1.0 + q.abs());
            if r > worst.0 {
                worst = (r, format!("{name}[{i}] ({p} vs {q}, {} values)", x.len()));
            }
        }
    }
    worst
}
