//! Sharded checkpoints of `mpirun -np N ferrite train --distributed --zero 1|2|3
//! --save-checkpoint DIR`: every rank writes its shard, rank 0 the index last.
//!
//! - `--resume DIR` continues at the same world size bit-identically to the uninterrupted run, and
//!   at another world size (saved on 3 ranks, resumed on 2 and on 1) exactly as DDP continues at
//!   that size from the same state (`ferrite convert DIR full.ckpt`, the ordinary one-file
//!   checkpoint, which also loads without MPI).
//! - A rank killed while saving (`FERRITE_FAULT_INJECT=...,at:save`) leaves the previous
//!   checkpoint whole (or, at the first save, no index: a typed error at resume).
//! - A shard missing or truncated, a checkpoint of another model, and ranks started with
//!   different `--zero` are typed errors on every rank, naming the file or the setting.
//!
//! Every mpirun is killed after a deadline. Skips loudly without MPI unless
//! FERRITE_REQUIRE_SYSTEM_DEPS=1.

mod common;

use std::path::Path;

use common::mpi::{mpi_ready, weights, worst_relative};

/// Collective deadline of every run: a rank left alone stops within it.
const TIMEOUT_S: &str = "20";

/// `mpirun [env] ARGS` in `dir` with every rank's collective deadline `TIMEOUT_S`; (success,
/// stdout, stderr).
fn mpirun(args: &[String], env: &[(&str, &str)], dir: &Path) -> (bool, String, String) {
    common::mpi::mpirun(args, &with_timeout(env), dir, false)
}

/// [`mpirun`] that lets every rank finish (OpenMPI otherwise ends the job when the first rank
/// exits with an error, maybe before the others printed theirs); its exit status is then 0
/// whatever the ranks' statuses.
fn mpirun_every_rank(args: &[String], dir: &Path) -> (bool, String, String) {
    common::mpi::mpirun(args, &with_timeout(&[]), dir, true)
}

/// `env` and `FERRITE_DDP_TIMEOUT_S=TIMEOUT_S`.
fn with_timeout<'a>(env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all = vec![("FERRITE_DDP_TIMEOUT_S", TIMEOUT_S)];
    all.extend_from_slice(env);
    all
}

/// `-np RANKS ferrite train <small MLP run> EXTRA`.
fn train(ranks: usize, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec!["-np".into(), ranks.to_string(), env!("CARGO_BIN_EXE_ferrite").into()];
    a.extend(train_args(extra));
    a
}

fn train_args(extra: &[&str]) -> Vec<String> {
    let base = [
        "train",
        "--distributed",
        "--no-progress",
        "--hidden",
        "30",
        "--lr",
        "0.01",
        "--batch-size",
        "32",
        "--train-subset",
        "400",
    ];
    base.iter().chain(extra).map(|s| s.to_string()).collect()
}

fn run_ok(ranks: usize, extra: &[&str], dir: &Path) -> String {
    let (ok, out, err) = mpirun(&train(ranks, extra), &[], dir);
    assert!(ok, "{ranks} ranks {extra:?} failed\n{out}\n{err}");
    out
}

fn bits(w: &[(String, Vec<f32>)]) -> Vec<(String, Vec<u32>)> {
    w.iter().map(|(n, v)| (n.clone(), v.iter().map(|x| x.to_bits()).collect())).collect()
}

fn shard_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("shard-"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_sharded_checkpoint_resumes_at_the_same_and_at_other_world_sizes() {
    let test = "zero_sharded_resume";
    if !mpi_ready(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Same world size: epoch 1, save, resume for epoch 2 = the uninterrupted 2 epochs, bit for bit.
    for stage in ["1", "2", "3"] {
        run_ok(2, &["--zero", stage, "--epochs", "2", "--out", "u.safetensors"], dir);
        run_ok(2, &["--zero", stage, "--epochs", "1", "--save-checkpoint", "ck2"], dir);
        let out = run_ok(2, &["--zero", stage, "--epochs", "2", "--resume", "ck2", "--out", "r.safetensors"], dir);
        assert!(out.contains("resumed from ck2 after epoch 1"), "{out}");
        let (u, r) = (weights(&dir.join("u.safetensors")), weights(&dir.join("r.safetensors")));
        assert!(
            bits(&u) == bits(&r),
            "{test}: ZeRO-{stage} resumed on 2 ranks differs from the uninterrupted run: {:?}",
            worst_relative(&r, &u, false)
        );
    }
    // bf16 parameters (`--zero-comm-dtype bf16`): the checkpoint keeps the f32 masters, and a
    // resume starts from them, not from the parameters' bf16 rounding: the masters at the end
    // (consolidated by `convert`) equal the uninterrupted run's bit for bit, as do the weights.
    for stage in ["2", "3"] {
        let bf16 = ["--zero", stage, "--amp", "bf16", "--zero-comm-dtype", "bf16"];
        let with = |more: &[&'static str]| -> Vec<&'static str> { [&bf16[..], more].concat() };
        run_ok(2, &with(&["--epochs", "2", "--save-checkpoint", "ubf", "--out", "ubf.safetensors"]), dir);
        run_ok(2, &with(&["--epochs", "1", "--save-checkpoint", "cbf"]), dir);
        run_ok(
            2,
            &with(&["--epochs", "2", "--resume", "cbf", "--save-checkpoint", "rbf", "--out", "rbf.safetensors"]),
            dir,
        );
        for (ck, out) in [("ubf", "ubf_m.safetensors"), ("rbf", "rbf_m.safetensors")] {
            let o = common::ferrite(&["convert", ck, out, "--key", "model"], dir);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        let (u, r) = (weights(&dir.join("ubf_m.safetensors")), weights(&dir.join("rbf_m.safetensors")));
        assert!(
            bits(&u) == bits(&r),
            "{test}: ZeRO-{stage} bf16: resumed masters differ: {:?}",
            worst_relative(&r, &u, false)
        );
        // A bf16 value is an f32 whose low 16 bits are zero.
        assert!(u.iter().flat_map(|(_, v)| v).any(|m| m.to_bits() & 0xffff != 0), "the masters are f32");
        let (u, r) = (weights(&dir.join("ubf.safetensors")), weights(&dir.join("rbf.safetensors")));
        assert!(bits(&u) == bits(&r), "{test}: ZeRO-{stage} bf16: resumed weights differ");
    }
    // Saved on 3 ranks: 3 shards and an index.
    run_ok(3, &["--zero", "2", "--epochs", "1", "--save-checkpoint", "ck3"], dir);
    let ck3 = dir.join("ck3");
    assert!(ck3.join("index.safetensors").is_file());
    let shards = shard_files(&ck3);
    assert_eq!(shards.len(), 3, "{shards:?}");
    assert!(shards[2].ends_with("-00002-of-00003.safetensors"), "{shards:?}");
    // Consolidated without MPI: the ordinary training checkpoint, and the weights alone.
    let o = common::ferrite(&["convert", "ck3", "full.ckpt"], dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = common::ferrite(&["convert", "ck3", "model.safetensors", "--key", "model"], dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let model = weights(&dir.join("model.safetensors"));
    assert!(model.iter().any(|(n, _)| n.ends_with("weight")), "{:?}", model.iter().map(|(n, _)| n).collect::<Vec<_>>());
    // Resumed on 2 and on 1 rank: as DDP continues at that size from the same state.
    for ranks in [2usize, 1] {
        let out = run_ok(ranks, &["--zero", "2", "--epochs", "2", "--resume", "ck3", "--out", "z.safetensors"], dir);
        assert!(out.contains("resumed from ck3 after epoch 1"), "{out}");
        run_ok(ranks, &["--epochs", "2", "--resume", "full.ckpt", "--out", "d.safetensors"], dir);
        let (z, d) = (weights(&dir.join("z.safetensors")), weights(&dir.join("d.safetensors")));
        let (worst, at) = worst_relative(&z, &d, false);
        println!(
            "{test}: saved on 3 ranks, ZeRO-2 resumed on {ranks} vs DDP resumed on {ranks} from the consolidated checkpoint: largest relative difference {worst:e} at {at}; bit-identical: {}",
            bits(&z) == bits(&d)
        );
        assert!(worst < 1e-6, "{test}: {ranks} ranks: {worst} at {at}");
        // DDP also resumes from the sharded directory itself, exactly as from the joined file.
        run_ok(ranks, &["--epochs", "2", "--resume", "ck3", "--out", "d_dir.safetensors"], dir);
        assert!(bits(&weights(&dir.join("d_dir.safetensors"))) == bits(&d), "{test}: DDP from ck3 on {ranks} ranks");
    }
    // ZeRO-3 writes the same shards: saved on 3 ranks, resumed on 2 as DDP resumes from the
    // consolidated file.
    run_ok(3, &["--zero", "3", "--epochs", "1", "--save-checkpoint", "ck3z3"], dir);
    let o = common::ferrite(&["convert", "ck3z3", "full3.ckpt"], dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    run_ok(2, &["--zero", "3", "--epochs", "2", "--resume", "ck3z3", "--out", "z3.safetensors"], dir);
    run_ok(2, &["--epochs", "2", "--resume", "full3.ckpt", "--out", "d3.safetensors"], dir);
    let (z, d) = (weights(&dir.join("z3.safetensors")), weights(&dir.join("d3.safetensors")));
    let (worst, at) = worst_relative(&z, &d, false);
    println!("{test}: ZeRO-3 saved on 3 ranks, resumed on 2 vs DDP: largest relative difference {worst:e} at {at}");
    assert!(worst < 1e-6, "{test}: ZeRO-3 resumed on 2 ranks: {worst} at {at}");
    // Saved again at the new size, under ZeRO-1, into the same directory: the old shards go.
    run_ok(2, &["--zero", "1", "--epochs", "2", "--resume", "ck3", "--save-checkpoint", "ck3"], dir);
    assert_eq!(shard_files(&ck3).len(), 2, "{:?}", shard_files(&ck3));
    let out = run_ok(1, &["--zero", "2", "--epochs", "3", "--resume", "ck3"], dir);
    assert!(out.contains("resumed from ck3 after epoch 2"), "{out}");
}

#[test]
fn a_rank_killed_while_saving_leaves_the_previous_checkpoint() {
    let test = "zero_sharded_crash";
    if !mpi_ready(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Rank 1 dies writing its shard of epoch 2 (its 2nd atomic save): epoch 1's checkpoint stays.
    let (ok, out, err) = mpirun(
        &train(2, &["--zero", "2", "--epochs", "2", "--save-checkpoint", "ck"]),
        &[("FERRITE_FAULT_INJECT", "rank:1,at:save,after:1")],
        dir,
    );
    assert!(!ok, "the run with a killed rank succeeded\n{out}\n{err}");
    let out = run_ok(2, &["--zero", "2", "--epochs", "2", "--resume", "ck", "--out", "r.safetensors"], dir);
    assert!(out.contains("resumed from ck after epoch 1"), "{out}");
    // Killed at the very first save: no index, so no checkpoint — a typed error at resume.
    let (ok, out, err) = mpirun(
        &train(2, &["--zero", "2", "--epochs", "1", "--save-checkpoint", "first"]),
        &[("FERRITE_FAULT_INJECT", "rank:1,at:save")],
        dir,
    );
    assert!(!ok, "{out}\n{err}");
    assert!(!dir.join("first/index.safetensors").exists());
    let (ok, out, err) = mpirun(&train(2, &["--zero", "2", "--epochs", "2", "--resume", "first"]), &[], dir);
    assert!(!ok, "{out}");
    assert!(err.contains("has no index.safetensors index"), "{err}");
}

#[test]
fn bad_sharded_checkpoints_and_disagreeing_ranks_are_typed_errors_on_every_rank() {
    let test = "zero_sharded_bad_input";
    if !mpi_ready(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    run_ok(2, &["--zero", "2", "--epochs", "1", "--save-checkpoint", "ck"], dir);
    let ck = dir.join("ck");
    let shard1 = ck.join(&shard_files(&ck)[1]);
    let bytes = std::fs::read(&shard1).unwrap();
    let resume = |ranks: usize, extra: &[&str]| -> String {
        let mut a = vec!["--zero", "2", "--epochs", "2", "--resume", "ck"];
        a.extend(extra);
        // (mpirun's status is 0 when it lets every rank finish: the output tells.)
        let (_, out, err) = mpirun_every_rank(&train(ranks, &a), dir);
        assert!(!out.contains("test accuracy"), "{test}: resume {extra:?} succeeded\n{out}");
        err
    };
    // Every rank reads every shard, so every rank names the file.
    let count = |err: &str, what: &str| err.matches(what).count();
    std::fs::write(&shard1, &bytes[..bytes.len() / 2]).unwrap();
    let err = resume(2, &[]);
    assert!(count(&err, "is truncated or was replaced") >= 2 && err.contains("rank 1"), "{err}");
    std::fs::remove_file(&shard1).unwrap();
    let err = resume(3, &[]);
    assert!(count(&err, "-00001-of-00002.safetensors` of rank 1 (of 2) is missing") >= 3, "{err}");
    std::fs::write(&shard1, &bytes).unwrap();
    // Another model: the setting is named.
    let err = resume(2, &["--hidden", "31"]);
    assert!(count(&err, "hidden") >= 2, "{err}");
    // Ranks started with different --zero (one mpirun, two command lines).
    let mut a = vec!["-np".to_string(), "1".into(), env!("CARGO_BIN_EXE_ferrite").into()];
    a.extend(train_args(&["--zero", "2", "--epochs", "1"]));
    a.extend([":".into(), "-np".into(), "1".into(), env!("CARGO_BIN_EXE_ferrite").into()]);
    a.extend(train_args(&["--epochs", "1"]));
    let (_, out, err) = mpirun_every_rank(&a, dir);
    assert!(!out.contains("test accuracy"), "{out}");
    // Every rank says it; two ranks writing to one pipe can interleave the start of their lines,
    // so count the end of the message.
    assert!(err.contains("rank 1 has --zero = not given (DDP) but rank 0 has 2"), "{err}");
    assert!(count(&err, "--zero = not given (DDP) but rank 0 has 2") >= 2, "{err}");
    // The same between ZeRO-3 and ZeRO-2.
    let mut a = vec!["-np".to_string(), "1".into(), env!("CARGO_BIN_EXE_ferrite").into()];
    a.extend(train_args(&["--zero", "3", "--epochs", "1"]));
    a.extend([":".into(), "-np".into(), "1".into(), env!("CARGO_BIN_EXE_ferrite").into()]);
    a.extend(train_args(&["--zero", "2", "--epochs", "1"]));
    let (_, out, err) = mpirun_every_rank(&a, dir);
    assert!(!out.contains("test accuracy"), "{out}");
    assert!(count(&err, "--zero = 2 but rank 0 has 3") >= 2, "{err}");
    // Ranks disagreeing on what the collectives carry.
    let mut a = vec!["-np".to_string(), "1".into(), env!("CARGO_BIN_EXE_ferrite").into()];
    a.extend(train_args(&["--zero", "2", "--amp", "bf16", "--zero-comm-dtype", "bf16", "--epochs", "1"]));
    a.extend([":".into(), "-np".into(), "1".into(), env!("CARGO_BIN_EXE_ferrite").into()]);
    a.extend(train_args(&["--zero", "2", "--amp", "bf16", "--epochs", "1"]));
    let (_, out, err) = mpirun_every_rank(&a, dir);
    assert!(!out.contains("test accuracy"), "{out}");
    assert!(count(&err, "--zero-comm-dtype = f32 but rank 0 has bf16") >= 2, "{err}");
}
