//! DistributedDataParallel under a real `mpirun -np 2`: the tests launch this test binary as two
//! MPI ranks (the `mpi_worker` entry below), then compare what the ranks wrote with the same
//! training computed in one process. Without MPI (or without the `mpi` feature) they skip loudly,
//! unless FERRITE_REQUIRE_SYSTEM_DEPS=1, where they fail.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferrite_nn::{Linear, Module, Sequential, Tanh};
use ferrite_optim::{AdamConfig, AdamRule, Optim, Optimizer, SgdConfig, SgdRule};
use ferrite_tensor::{DType, Device, Generator, Tensor};

const FEATURES: usize = 16;
const LOCAL_BATCH: usize = 32;
const STEPS: usize = 4;

fn model(seed: u64, hidden: usize) -> Sequential {
    let mut g = Generator::new(seed);
    let cpu = Device::Cpu;
    Sequential::new()
        .append(Linear::new_with(FEATURES, hidden, true, &cpu, &mut g).unwrap())
        .append(Tanh::new())
        .append(Linear::new_with(hidden, hidden, true, &cpu, &mut g).unwrap())
        .append(Tanh::new())
        .append(Linear::new_with(hidden, 4, true, &cpu, &mut g).unwrap())
}

/// The whole data set of a run: `rows` examples, the same on every rank.
fn data(rows: usize) -> (Tensor, Tensor) {
    let mut g = Generator::new(7);
    let x = Tensor::randn_with(&[rows, FEATURES], DType::F32, &Device::Cpu, &mut g).unwrap();
    let y = Tensor::randn_with(&[rows, 4], DType::F32, &Device::Cpu, &mut g).unwrap();
    (x, y)
}

fn mse(out: &Tensor, y: &Tensor) -> ferrite_tensor::Result<Tensor> {
    let d = out.sub(y)?;
    d.mul(&d)?.mean()
}

fn optimizer(kind: &str, params: Vec<Tensor>) -> Box<dyn Optimizer> {
    match kind {
        "adamw" => Box::new(Optim::<AdamRule>::new(params, AdamConfig::adamw(1e-2).weight_decay(0.01)).unwrap()),
        _ => Box::new(Optim::<SgdRule>::new(params, SgdConfig::new(0.1).momentum(0.9)).unwrap()),
    }
}

fn flat_params(m: &dyn Module) -> Vec<f32> {
    m.parameters().iter().flat_map(|p| p.to_vec::<f32>().unwrap()).collect()
}

/// One process, global batch `ranks * LOCAL_BATCH * accumulation`.
fn single_process(kind: &str, accumulation: usize) -> Vec<f32> {
    let m = model(100, 32);
    let mut opt = optimizer(kind, m.parameters());
    let global = 2 * LOCAL_BATCH * accumulation;
    let (x, y) = data(STEPS * global);
    for s in 0..STEPS {
        let xb = x.narrow(0, s * global, global).unwrap();
        let yb = y.narrow(0, s * global, global).unwrap();
        mse(&m.forward(&xb).unwrap(), &yb).unwrap().backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad().unwrap();
    }
    flat_params(&m)
}

fn mpi_available() -> bool {
    Command::new("mpirun").arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// `Some(())` when the MPI tests can run here; else skip loudly (or fail when required).
fn require_mpi(test: &str) -> Option<()> {
    let required = std::env::var("FERRITE_REQUIRE_SYSTEM_DEPS").is_ok_and(|v| v == "1");
    let why = if !cfg!(feature = "mpi") {
        "ferrite-parallel was built without the `mpi` feature (cargo test --features ferrite-parallel/mpi)"
    } else if !mpi_available() {
        "`mpirun` is not installed (apt-get install openmpi-bin libopenmpi-dev libclang-dev)"
    } else {
        return Some(());
    };
    assert!(!required, "{test}: FERRITE_REQUIRE_SYSTEM_DEPS=1 but {why}");
    eprintln!("SKIPPED {test}: {why}");
    None
}

struct Run {
    out: tempfile::TempDir,
    status: std::process::ExitStatus,
    log: String,
    elapsed: Duration,
}

impl Run {
    fn file(&self, name: &str) -> PathBuf {
        self.out.path().join(name)
    }
    fn params(&self, rank: usize) -> Vec<f32> {
        let bytes = std::fs::read(self.file(&format!("rank{rank}.params")))
            .unwrap_or_else(|e| panic!("rank {rank} wrote no parameters ({e}); mpirun output:\n{}", self.log));
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
    fn error(&self, rank: usize) -> String {
        std::fs::read_to_string(self.file(&format!("rank{rank}.error")))
            .unwrap_or_else(|e| panic!("rank {rank} wrote no error ({e}); mpirun output:\n{}", self.log))
    }
}

/// `mpirun -np 2` on this test binary's `mpi_worker` with `case`.
fn launch(case: &str) -> Run {
    let out = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let o = ferrite_test_support::mpirun_command()
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .args(["-x", "FERRITE_DDP_CASE", "-x", "FERRITE_DDP_OUT", "-x", "FERRITE_DDP_TIMEOUT_S"])
        .arg(&exe)
        .args(["--exact", "mpi_worker", "--nocapture", "--test-threads=1"])
        .env("FERRITE_DDP_CASE", case)
        .env("FERRITE_DDP_OUT", out.path())
        .env("FERRITE_DDP_TIMEOUT_S", "20")
        .output()
        .expect("mpirun starts");
    let log = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    Run { out, status: o.status, log, elapsed: start.elapsed() }
}

/// Every parameter value within 2e-5·(1 + |want|) of the single-process run.
fn assert_close(a: &[f32], b: &[f32], what: &str) {
    ferrite_test_support::assert_slices_close(what, a, b, 2e-5, 2e-5);
}

fn equality_case(test: &str, case: &str, kind: &str, accumulation: usize) {
    if require_mpi(test).is_none() {
        return;
    }
    let run = launch(case);
    assert!(run.status.success(), "{test}: mpirun failed:\n{}", run.log);
    let reference = single_process(kind, accumulation);
    let r0 = run.params(0);
    let r1 = run.params(1);
    assert_eq!(r0, r1, "{test}: the two ranks' replicas differ");
    assert_ne!(reference, flat_params(&model(100, 32)), "training moved the parameters");
    assert_close(&r0, &reference, test);
}

#[test]
fn two_ranks_sgd_equal_one_process_with_twice_the_batch() {
    equality_case("two_ranks_sgd_equal_one_process_with_twice_the_batch", "sgd", "sgd", 1);
}

#[test]
fn two_ranks_adamw_equal_one_process_with_twice_the_batch() {
    equality_case("two_ranks_adamw_equal_one_process_with_twice_the_batch", "adamw", "adamw", 1);
}

#[test]
fn two_ranks_no_sync_two_micro_batches_equal_one_process_batch_128() {
    equality_case("two_ranks_no_sync_two_micro_batches_equal_one_process_batch_128", "nosync", "sgd", 2);
}

/// Gradients zeroed in place (`zero_grad(set_to_none=false)`) instead of freed: the averaged
/// gradients are views into the buckets (PyTorch's `gradient_as_bucket_view`), the zeroing writes
/// into them, and the result still equals one process.
#[test]
fn gradients_are_bucket_views_and_in_place_zeroing_still_equals_one_process() {
    equality_case("gradients_are_bucket_views_and_in_place_zeroing_still_equals_one_process", "keep", "sgd", 1);
}

#[test]
fn unused_parameter_is_a_typed_error_on_the_rank_that_skipped_it() {
    if require_mpi("unused_parameter").is_none() {
        return;
    }
    let run = launch("unused");
    let e = run.error(0);
    assert!(e.contains("2.weight") && e.contains("find_unused_parameters"), "{e}\n{}", run.log);
    let allowed = std::fs::read_to_string(run.file("rank0.allowed")).unwrap_or_else(|_| panic!("{}", run.log));
    assert_eq!(allowed.trim(), "ok: grad of 2.weight is None");
}

#[test]
fn mismatched_shapes_are_reported_with_the_parameter_name_on_every_rank() {
    if require_mpi("mismatched_shapes").is_none() {
        return;
    }
    let run = launch("mismatch");
    for rank in 0..2 {
        let e = run.error(rank);
        assert!(e.contains("rank 1") && e.contains("0.weight [33, 16]") && e.contains("[32, 16]"), "{e}");
    }
}

#[test]
fn a_failing_rank_stops_the_other_with_an_error_naming_it() {
    if require_mpi("failing_rank").is_none() {
        return;
    }
    let run = launch("raise");
    let e = run.error(0);
    assert!(e.contains("rank 1 failed") && e.contains("injected failure"), "{e}\n{}", run.log);
    assert!(run.elapsed < Duration::from_secs(60), "took {:?}", run.elapsed);
}

#[test]
fn a_dead_rank_ends_the_job_within_60_s_naming_it() {
    if require_mpi("dead_rank").is_none() {
        return;
    }
    let run = launch("die");
    assert!(!run.status.success(), "{}", run.log);
    assert!(run.elapsed < Duration::from_secs(60), "took {:?}:\n{}", run.elapsed, run.log);
    let named = run.log.contains("rank 1") || Path::new(&run.file("rank0.error")).exists();
    assert!(named, "no message names rank 1:\n{}", run.log);
}

/// The body of each rank (runs only under `launch`, which sets FERRITE_DDP_CASE).
#[test]
fn mpi_worker() {
    let Ok(case) = std::env::var("FERRITE_DDP_CASE") else { return };
    #[cfg(feature = "mpi")]
    worker::run(&case, Path::new(&std::env::var("FERRITE_DDP_OUT").unwrap()));
    #[cfg(not(feature = "mpi"))]
    panic!("mpi_worker {case}: built without the mpi feature");
}

#[cfg(feature = "mpi")]
mod worker {
    use super::*;
    use ferrite_parallel::distributed::{DdpOptions, DistributedDataParallel, DistributedError, ProcessGroup};

    pub(super) fn run(case: &str, out: &Path) {
        let group = ProcessGroup::init().unwrap();
        let rank = group.rank();
        assert_eq!(group.world_size(), 2);
        let result = body(case, &group, out);
        match result {
            Ok(params) => std::fs::write(out.join(format!("rank{rank}.params")), bytes(&params)).unwrap(),
            Err(e) => std::fs::write(out.join(format!("rank{rank}.error")), e.to_string()).unwrap(),
        }
    }

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn body(case: &str, group: &ProcessGroup, out: &Path) -> Result<Vec<f32>, DistributedError> {
        let rank = group.rank();
        // A different initialization per rank: the wrap must broadcast rank 0's.
        let hidden = if case == "mismatch" && rank == 1 { 33 } else { 32 };
        let m = model(100 + rank as u64, hidden);
        // Small buckets: several all-reduces per step.
        let ddp = DistributedDataParallel::new(m, group, DdpOptions::default().bucket_cap_mb(0.002))?;
        assert!(ddp.bucket_sizes().len() > 1);
        let kind = if case == "adamw" { "adamw" } else { "sgd" };
        let mut opt = optimizer(kind, ddp.module().parameters());
        let accumulation = if case == "nosync" { 2 } else { 1 };
        let global = 2 * LOCAL_BATCH * accumulation;
        let (x, y) = data(STEPS * global);
        if case == "unused" {
            return unused(ddp, group, out, &x, &y);
        }
        for s in 0..STEPS {
            if s == 2 && rank == 1 {
                if case == "raise" {
                    ddp.announce_failure("injected failure");
                    // Give rank 0 time to report before mpirun ends the job on this exit.
                    std::thread::sleep(Duration::from_secs(2));
                    std::process::exit(1);
                }
                if case == "die" {
                    std::process::abort();
                }
            }
            for k in 0..accumulation {
                let start = s * global + k * 2 * LOCAL_BATCH + rank * LOCAL_BATCH;
                let xb = x.narrow(0, start, LOCAL_BATCH)?;
                let yb = y.narrow(0, start, LOCAL_BATCH)?;
                let loss = mse(&ddp.forward(&xb)?, &yb)?.div_scalar(accumulation as f64)?;
                if k + 1 < accumulation {
                    let _quiet = ddp.no_sync();
                    ddp.backward(&loss)?;
                } else {
                    ddp.backward(&loss)?;
                }
            }
            if case == "keep" {
                check_bucket_views(&ddp)?;
            }
            opt.step().unwrap();
            opt.zero_grad_with(case != "keep").unwrap();
        }
        let m = ddp.finish()?;
        Ok(flat_params(&m))
    }

    /// After a synchronizing backward every gradient views its bucket: the gradients of a bucket
    /// share one storage, and a second `synchronize` (the ranks hold equal averages, so nothing is
    /// copied in) leaves them views with the same values.
    fn check_bucket_views(ddp: &DistributedDataParallel<Sequential>) -> Result<(), DistributedError> {
        let grads: Vec<Tensor> = ddp.module().parameters().iter().map(|p| p.grad().expect("a gradient")).collect();
        let (last, before) = (&grads[grads.len() - 1], &grads[grads.len() - 2]);
        assert!(last.shares_storage(before), "the last two parameters' gradients are not views of one bucket");
        let values: Vec<Vec<f32>> = grads.iter().map(|g| g.to_vec::<f32>()).collect::<Result<_, _>>()?;
        ddp.synchronize()?;
        let again: Vec<Tensor> = ddp.module().parameters().iter().map(|p| p.grad().expect("a gradient")).collect();
        assert!(again[again.len() - 1].shares_storage(&again[again.len() - 2]), "no longer bucket views");
        for (g, v) in again.iter().zip(&values) {
            assert_eq!(&g.to_vec::<f32>()?, v, "a second synchronize changed the averaged values");
        }
        Ok(())
    }

    /// Layers 2 and 3 (the middle Linear and its Tanh) skipped by rank 0's forward, or by both.
    fn forward_skipping(m: &Sequential, xb: &Tensor, skip: bool) -> Result<Tensor, DistributedError> {
        let layer = |i: usize| m.get(i).expect("five layers");
        let mut h = layer(1).forward(&layer(0).forward(xb)?)?;
        if !skip {
            h = layer(3).forward(&layer(2).forward(&h)?)?;
        }
        Ok(layer(4).forward(&h)?)
    }

    fn unused(
        ddp: DistributedDataParallel<Sequential>,
        group: &ProcessGroup,
        out: &Path,
        x: &Tensor,
        y: &Tensor,
    ) -> Result<Vec<f32>, DistributedError> {
        let rank = group.rank();
        let xb = x.narrow(0, rank * LOCAL_BATCH, LOCAL_BATCH)?;
        let yb = y.narrow(0, rank * LOCAL_BATCH, LOCAL_BATCH)?;
        // Not declared: rank 0's error names the parameter; rank 1 learns it at its next exchange.
        let first = ddp.backward(&mse(&forward_skipping(ddp.module(), &xb, rank == 0)?, &yb)?);
        let outcome = match first {
            Err(e) => Err(e),
            Ok(()) => ddp.finish().map(|_| ()),
        };
        if let Err(e) = outcome {
            std::fs::write(out.join(format!("rank{rank}.error")), e.to_string()).unwrap();
        }
        // Declared: the same step works, and a parameter no rank used keeps no gradient.
        let ddp = DistributedDataParallel::new(
            model(100, 32),
            group,
            DdpOptions::default().bucket_cap_mb(0.002).find_unused_parameters(true),
        )?;
        ddp.backward(&mse(&forward_skipping(ddp.module(), &xb, true)?, &yb)?)?;
        let grads: Vec<(String, bool)> =
            ddp.module().named_parameters().into_iter().map(|(n, p)| (n, p.grad().is_some())).collect();
        let m = ddp.finish()?;
        let expect: Vec<bool> = grads.iter().map(|(n, _)| !n.starts_with("2.")).collect();
        let got: Vec<bool> = grads.iter().map(|(_, g)| *g).collect();
        let text = if got == expect {
            "ok: grad of 2.weight is None".to_string()
        } else {
            format!("grads present: {grads:?}")
        };
        std::fs::write(out.join(format!("rank{rank}.allowed")), text).unwrap();
        Ok(flat_params(&m))
    }
}
