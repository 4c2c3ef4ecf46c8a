//! Faults across ranks, on purpose: `mpirun -np 3 ferrite train --distributed` with one rank
//! killed by SIGKILL at a chosen point (`FERRITE_FAULT_INJECT`, the testing hook of
//! `ferrite_io::fault_point`) — during the weights' broadcast, in the middle of a step's
//! all-reduce (through the communication thread and through non-blocking MPI), while rank 0 writes
//! a checkpoint, during evaluation — and checks that
//! - the victim died by SIGKILL where it was told to;
//! - every surviving rank exits non-zero with the typed error naming the dead rank
//!   (`rank N died during ...`) within `FERRITE_DDP_TIMEOUT_S` + 1 s of the kill;
//! - every checkpoint on disk reads back;
//! - a restart from the last complete checkpoint (`--resume`, the same 3 ranks) ends with the
//!   same weights, bit for bit, and the same per-epoch losses and accuracies as a run that was
//!   never interrupted.
//!
//! mpirun runs with `--enable-recovery`: by default Open MPI's mpirun ends the whole job as soon as
//! one rank dies (which is also a fine outcome for users, and names the rank), but then the
//! survivors' own detection — what a launcher that does not do so relies on — would go untested.
//! Each rank runs under `sh`, which records its exit status and the time it ended.
//! Skips loudly without MPI (or the `mpi` feature) unless FERRITE_REQUIRE_SYSTEM_DEPS=1. The
//! counts it prints are the ones in BENCHMARKS.md.

mod common;

use common::mpi::mpi_ready;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const RANKS: usize = 3;
/// `FERRITE_DDP_TIMEOUT_S` of the runs: a survivor must stop within this + 1 s of the kill.
const TIMEOUT_S: u64 = 3;
const EPOCHS: usize = 3;
/// No run of this harness may take longer (mpirun is killed after it: a hang fails, not blocks).
const RUN_LIMIT: Duration = Duration::from_secs(180);

/// The training every run does (digits, a small MLP, a checkpoint after every epoch), writing its
/// weights to `out`, plus `extra`.
fn train_args(out: &str, extra: &[&str]) -> Vec<String> {
    let epochs = EPOCHS.to_string();
    let base = ["train", "--distributed", "--epochs", &epochs, "--hidden", "32", "--lr", "0.01", "--no-progress"];
    base.iter().chain(["--save-checkpoint", "ck.ft", "--out", out].iter()).chain(extra).map(|s| s.to_string()).collect()
}

/// How one rank ended: its exit status as `sh` saw it (128 + N for signal N) and when.
#[derive(Debug, Clone, Copy)]
struct RankExit {
    code: i32,
    at: f64,
}

struct Run {
    /// mpirun's stdout (rank 0's; the other ranks print nothing).
    stdout: String,
    /// mpirun's own stderr.
    log: String,
    /// Each rank's stderr and exit (`None`: the rank never recorded one).
    errs: Vec<String>,
    exits: Vec<Option<RankExit>>,
}

impl Run {
    fn describe(&self) -> String {
        let mut s = format!("stdout:\n{}\nmpirun:\n{}\n", self.stdout, self.log);
        for (r, (e, x)) in self.errs.iter().zip(&self.exits).enumerate() {
            s.push_str(&format!("rank {r} exit {x:?}, stderr:\n{e}\n"));
        }
        s
    }
}

/// `mpirun -np 3 --enable-recovery sh -c 'ferrite ARGS; record status'` in `dir`, with `env`
/// exported to every rank; killed after [`RUN_LIMIT`].
fn launch(dir: &Path, args: &[String], env: &[(&str, &str)]) -> Run {
    for r in 0..RANKS {
        let _ = std::fs::remove_file(dir.join(format!("rank{r}.exit")));
        let _ = std::fs::remove_file(dir.join(format!("rank{r}.err")));
    }
    let script =
        r#"r=${OMPI_COMM_WORLD_RANK:-0}; "$0" "$@" 2>"rank$r.err"; c=$?; echo "$c $(date +%s.%N)" >"rank$r.exit""#;
    let mut cmd = ferrite_test_support::mpirun_command();
    cmd.args(["--allow-run-as-root", "--oversubscribe", "--enable-recovery", "-np", &RANKS.to_string()]);
    cmd.env("FERRITE_DDP_TIMEOUT_S", TIMEOUT_S.to_string()).args(["-x", "FERRITE_DDP_TIMEOUT_S"]);
    for (k, v) in env {
        cmd.env(k, v).args(["-x", k]);
    }
    let (out_path, log_path) = (dir.join("mpirun.out"), dir.join("mpirun.log"));
    let mut child = cmd
        .args(["sh", "-c", script, env!("CARGO_BIN_EXE_ferrite")])
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("mpirun.out"))
        .stderr(File::create(&log_path).expect("mpirun.log"))
        .spawn()
        .expect("mpirun starts");
    let start = Instant::now();
    let finished = common::wait_for(RUN_LIMIT, || child.try_wait().ok().flatten());
    if finished.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    let run = Run {
        stdout: read(out_path),
        log: read(log_path),
        errs: (0..RANKS).map(|r| read(dir.join(format!("rank{r}.err")))).collect(),
        exits: (0..RANKS)
            .map(|r| {
                let text = read(dir.join(format!("rank{r}.exit")));
                let mut it = text.split_whitespace();
                let code = it.next()?.parse().ok()?;
                let at = it.next()?.parse().ok()?;
                Some(RankExit { code, at })
            })
            .collect(),
    };
    assert!(finished.is_some(), "mpirun still running after {:?}: a hang\n{}", start.elapsed(), run.describe());
    run
}

/// Every parameter of a safetensors weights file, by name, as raw bits.
fn weights(path: &Path) -> Vec<(String, Vec<u32>)> {
    ferrite_io::load_state_dict(path, &ferrite_io::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .map(|(n, t)| (n, t.to_vec::<f32>().unwrap().into_iter().map(f32::to_bits).collect()))
        .collect()
}

/// Rank 0's per-epoch lines, up to the memory figures: `epoch   2/3  loss … test acc …`.
fn epoch_lines(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| l.starts_with("epoch "))
        .map(|l| l.split(" | ").next().unwrap_or(l).trim_end().to_string())
        .collect()
}

/// One fault to inject.
struct Fault {
    name: &'static str,
    victim: usize,
    /// `FERRITE_FAULT_INJECT` without the rank.
    at: &'static str,
    env: &'static [(&'static str, &'static str)],
}

const FAULTS: &[Fault] = &[
    // The second broadcast is rank 0's weights (the first, the parameter list): the root dies.
    Fault { name: "broadcast (rank 0, the root)", victim: 0, at: "at:broadcast,after:1", env: &[] },
    // 8 steps an epoch, one bucket a step: the 12th all-reduce is step 4 of epoch 2.
    Fault { name: "all-reduce (rank 1, communication thread)", victim: 1, at: "at:allreduce,after:11", env: &[] },
    Fault {
        name: "all-reduce (rank 2, non-blocking MPI)",
        victim: 2,
        at: "at:allreduce,after:11",
        env: &[("FERRITE_DDP_COMM_THREAD", "0")],
    },
    // Rank 0 writes the checkpoints: it dies writing the second (after epoch 2).
    Fault { name: "checkpoint save (rank 0)", victim: 0, at: "at:save,after:1", env: &[] },
    // Two evaluation batches an epoch on each rank: the 3rd is epoch 2's first.
    Fault { name: "evaluation (rank 2)", victim: 2, at: "at:eval,after:2", env: &[] },
    Fault { name: "evaluation (rank 0)", victim: 0, at: "at:eval,after:3", env: &[] },
];

/// What one fault gave.
#[derive(Default)]
struct Tally {
    injected: usize,
    survivors: usize,
    detected_in_time: usize,
    slowest_s: f64,
    checkpoints: usize,
    checkpoints_intact: usize,
    resumes: usize,
    resumes_identical: usize,
    leftovers: usize,
}

#[test]
fn a_rank_killed_anywhere_is_named_by_every_survivor_in_time_and_the_run_resumes_bit_identically() {
    let test = "a_rank_killed_anywhere_is_named_by_every_survivor_in_time_and_the_run_resumes_bit_identically";
    if !mpi_ready(test) {
        return;
    }
    // The run that is never interrupted.
    let reference_dir = tempfile::tempdir().unwrap();
    let reference = launch(reference_dir.path(), &train_args("w.safetensors", &[]), &[]);
    for (r, x) in reference.exits.iter().enumerate() {
        assert_eq!(x.map(|x| x.code), Some(0), "rank {r} of the uninterrupted run\n{}", reference.describe());
    }
    let reference_epochs = epoch_lines(&reference.stdout);
    assert_eq!(reference_epochs.len(), EPOCHS, "{}", reference.describe());
    let reference_weights = weights(&reference_dir.path().join("w.safetensors"));

    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for fault in FAULTS {
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("rank:{},{}", fault.victim, fault.at);
        let mut env = vec![("FERRITE_FAULT_INJECT", spec.as_str())];
        env.extend_from_slice(fault.env);
        let run = launch(dir.path(), &train_args("w.safetensors", &[]), &env);
        let mut fail = |what: String| failures.push(format!("{}: {what}\n{}", fault.name, run.describe()));

        // The victim died by SIGKILL where it was told to, and said when.
        let said = run.errs[fault.victim].lines().find(|l| l.contains("kills itself with SIGKILL")).unwrap_or("");
        let killed_at: Option<f64> =
            said.rsplit("unix time ").next().and_then(|t| t.trim_end_matches(')').trim().parse().ok());
        let Some(killed_at) = killed_at.filter(|_| run.exits[fault.victim].is_some_and(|x| x.code == 128 + 9)) else {
            fail(format!("rank {} was not killed by the hook", fault.victim));
            continue;
        };
        tally.injected += 1;

        // Every survivor: non-zero, the typed error naming the victim, in time.
        let named = format!("rank {} died during ", fault.victim);
        let mut report = format!("{}: rank {} killed ({said})", fault.name, fault.victim);
        for r in (0..RANKS).filter(|r| *r != fault.victim) {
            tally.survivors += 1;
            let Some(x) = run.exits[r] else {
                fail(format!("survivor rank {r} recorded no exit"));
                continue;
            };
            let after = x.at - killed_at;
            tally.slowest_s = tally.slowest_s.max(after);
            let err = &run.errs[r];
            let line = err.lines().find(|l| l.starts_with("error: ") && l.contains(&named));
            let typed = line.is_some();
            report.push_str(&format!(
                "\n  rank {r}: exit {} after {after:.2} s: {}",
                x.code,
                line.unwrap_or("(no such error)")
            ));
            if x.code == 0 || x.code > 128 {
                fail(format!("survivor rank {r} exited with {} (want a plain failure)", x.code));
            } else if !typed {
                fail(format!("survivor rank {r}'s error does not say `{named}`"));
            } else if after > TIMEOUT_S as f64 + 1.0 {
                fail(format!("survivor rank {r} stopped {after:.2} s after the kill (limit {} s)", TIMEOUT_S + 1));
            } else {
                tally.detected_in_time += 1;
            }
        }

        // Every checkpoint on disk reads back (a hidden temporary file of a save that was cut
        // short is not a checkpoint: no loader picks it up).
        let ck = dir.path().join("ck.ft");
        let leftovers: Vec<String> = std::fs::read_dir(dir.path())
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let leftovers: Vec<&String> = leftovers.iter().filter(|n| n.starts_with(".ck.ft.tmp-")).collect();
        report.push_str(&format!(
            "\n  ck.ft: {}; temporary files of a save cut short: {leftovers:?}",
            if ck.exists() { "present" } else { "none yet" }
        ));
        tally.leftovers += leftovers.len();
        println!("{report}");
        if ck.exists() {
            tally.checkpoints += 1;
            match ferrite_io::Checkpoint::load(&ck) {
                Ok(_) => tally.checkpoints_intact += 1,
                Err(e) => fail(format!("ck.ft does not read back: {e}")),
            }
            // The restart from it: the same weights and epochs as the uninterrupted run.
            tally.resumes += 1;
            let resumed = launch(dir.path(), &train_args("resumed.safetensors", &["--resume", "ck.ft"]), &[]);
            if resumed.exits.iter().any(|x| x.is_none_or(|x| x.code != 0)) {
                fail(format!("the resume failed\n{}", resumed.describe()));
                continue;
            }
            let epochs = epoch_lines(&resumed.stdout);
            let first = EPOCHS.saturating_sub(epochs.len());
            println!(
                "  resumed: {}",
                resumed.stdout.lines().find(|l| l.contains("resumed from")).unwrap_or("?").trim()
            );
            let same_epochs = !epochs.is_empty() && epochs[..] == reference_epochs[first..];
            let same_weights = weights(&dir.path().join("resumed.safetensors")) == reference_weights;
            if same_epochs && same_weights {
                tally.resumes_identical += 1;
            } else {
                fail(format!(
                    "the resumed run differs from the uninterrupted one (epochs equal: {same_epochs}, weights bit-identical: {same_weights})\nresumed:\n{}\nuninterrupted:\n{}",
                    epochs.join("\n"),
                    reference_epochs.join("\n")
                ));
            }
        }
    }
    println!(
        "fault injection, {} ranks, FERRITE_DDP_TIMEOUT_S={TIMEOUT_S}: faults injected {}/{}; survivors that stopped with the error naming the dead rank within {} s: {}/{} (slowest {:.2} s after the kill); checkpoints intact {}/{}; resumes bit-identical to the uninterrupted run {}/{}; hidden temporary files left by killed saves {}",
        RANKS,
        tally.injected,
        FAULTS.len(),
        TIMEOUT_S + 1,
        tally.detected_in_time,
        tally.survivors,
        tally.slowest_s,
        tally.checkpoints_intact,
        tally.checkpoints,
        tally.resumes_identical,
        tally.resumes,
        tally.leftovers
    );
    assert!(failures.is_empty(), "{}", failures.join("\n-----\n"));
    assert_eq!(tally.injected, FAULTS.len());
    assert!(tally.resumes >= 4, "the faults after epoch 1 each leave a checkpoint to resume from");
}
