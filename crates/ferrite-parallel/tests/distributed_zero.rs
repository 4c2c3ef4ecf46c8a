//! ZeRO-1, 2 and 3 under a real `mpirun -np 2` and `-np 3`: in one MPI job each rank trains the
//! same model twice from the same start, once with `DistributedDataParallel` (the unsharded
//! reference) and once with `ZeroRedundancy` (stages 1, 2) or `FullySharded` (stage 3), over the
//! same batches, for several configurations; the test then checks that the two agree to 1e-6
//! relative and that every rank holds the same parameters. The model (two marked blocks, the
//! ZeRO-3 units, and a head outside them, the root) has 359 trainable values, which do not divide
//! by 2 or 3, and its first weight (208 values) is larger than a partition at 2 ranks (180) and
//! at 3 (120). Without MPI (or the `mpi` feature)
//! the tests skip loudly, unless FERRITE_REQUIRE_SYSTEM_DEPS=1, where they fail. Every mpirun
//! is killed after a deadline: a hang fails the test, it never hangs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferrite_nn::{Linear, Module};
use ferrite_tensor::{DType, Device, Generator, Tensor};

const FEATURES: usize = 16;
const LOCAL_BATCH: usize = 8;
const STEPS: usize = 5;

/// `(name, optimizer, stage, clip, accumulation, scaler with an inf on the last rank at step 2)`.
/// A name ending in `-ckpt` checkpoints the blocks (ZeRO-3 must gather them for the recompute).
const CASES: &[(&str, &str, u32, bool, usize, bool)] = &[
    ("adamw-groups-z3", "adamw", 3, false, 1, false),
    ("sgd-clip-z3", "sgd", 3, true, 1, false),
    ("rmsprop-accum-z3", "rmsprop", 3, false, 3, false),
    ("adamw-clip-scaler-inf-z3", "adamw", 3, true, 2, true),
    ("adagrad-clip-accum-z3-ckpt", "adagrad", 3, true, 2, false),
    ("adamw-groups-z1", "adamw", 1, false, 1, false),
    ("adamw-groups-z2", "adamw", 2, false, 1, false),
    ("sgd-clip-z1", "sgd", 1, true, 1, false),
    ("sgd-clip-z2", "sgd", 2, true, 1, false),
    ("rmsprop-accum-z1", "rmsprop", 1, false, 3, false),
    ("rmsprop-accum-z2", "rmsprop", 2, false, 3, false),
    ("adagrad-clip-accum-z2", "adagrad", 2, true, 2, false),
    ("adamw-clip-scaler-inf-z1", "adamw", 1, true, 1, true),
    ("adamw-clip-scaler-inf-z2", "adamw", 2, true, 2, true),
];

const TOTAL: usize = 359;

/// Two blocks (`blocks.0`, `blocks.1`: Linear + tanh, each announced with `mark_layer` as the
/// built-in models do) and a head; optionally each block checkpointed.
#[derive(Clone)]
struct Blocks {
    blocks: Vec<Linear>,
    head: Linear,
    checkpoint: bool,
    training: bool,
}

fn model(seed: u64) -> Blocks {
    let mut g = Generator::new(seed);
    let cpu = Device::Cpu;
    Blocks {
        blocks: vec![
            Linear::new_with(FEATURES, 13, true, &cpu, &mut g).unwrap(),
            Linear::new_with(13, 7, true, &cpu, &mut g).unwrap(),
        ],
        head: Linear::new_with(7, 5, true, &cpu, &mut g).unwrap(),
        checkpoint: false,
        training: true,
    }
}

impl Module for Blocks {
    fn type_name(&self) -> &'static str {
        "Blocks"
    }
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        let mut h = x.clone();
        for (i, b) in self.blocks.iter().enumerate() {
            let name = format!("blocks.{i}");
            if self.checkpoint {
                let b2 = b.clone();
                let params = b.parameters();
                h = ferrite_nn::checkpoint_with_params(
                    move |xs| {
                        ferrite_nn::mark_layer(&name);
                        Ok(b2.forward(&xs[0])?.tanh()?)
                    },
                    &[&h],
                    &params,
                )?;
            } else {
                ferrite_nn::mark_layer(&name);
                h = b.forward(&h)?.tanh()?;
            }
        }
        ferrite_nn::mark_layer("head");
        self.head.forward(&h)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut c: Vec<(String, &dyn Module)> =
            self.blocks.iter().enumerate().map(|(i, b)| (format!("blocks.{i}"), b as &dyn Module)).collect();
        c.push(("head".into(), &self.head));
        c
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut c: Vec<(String, &mut dyn Module)> =
            self.blocks.iter_mut().enumerate().map(|(i, b)| (format!("blocks.{i}"), b as &mut dyn Module)).collect();
        c.push(("head".into(), &mut self.head));
        c
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

fn data(rows: usize) -> (Tensor, Tensor) {
    let mut g = Generator::new(7);
    let x = Tensor::randn_with(&[rows, FEATURES], DType::F32, &Device::Cpu, &mut g).unwrap();
    let y = Tensor::randn_with(&[rows, 5], DType::F32, &Device::Cpu, &mut g).unwrap();
    (x, y)
}

fn mse(out: &Tensor, y: &Tensor) -> ferrite_tensor::Result<Tensor> {
    let d = out.sub(y)?;
    d.mul(&d)?.mean()
}

fn mpi_available() -> bool {
    Command::new("mpirun").arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

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
    log: String,
    success: bool,
    elapsed: Duration,
}

impl Run {
    fn file(&self, name: &str) -> PathBuf {
        self.out.path().join(name)
    }
    fn floats(&self, name: &str) -> Vec<f32> {
        let bytes =
            std::fs::read(self.file(name)).unwrap_or_else(|e| panic!("no {name} ({e}); mpirun output:\n{}", self.log));
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
    fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name))
            .unwrap_or_else(|e| panic!("no {name} ({e}); mpirun output:\n{}", self.log))
    }
}

/// `mpirun -np ranks` on this binary's `zero_worker` with `case`, killed after `deadline`.
fn launch(ranks: usize, case: &str, deadline: Duration) -> Run {
    let out = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let log_path = out.path().join("mpirun.log");
    let log_file = std::fs::File::create(&log_path).unwrap();
    let mut child = ferrite_test_support::mpirun_command()
        .args(["--allow-run-as-root", "--oversubscribe", "-np", &ranks.to_string()])
        .args(["-x", "FERRITE_ZERO_CASE", "-x", "FERRITE_ZERO_OUT", "-x", "FERRITE_DDP_TIMEOUT_S"])
        .arg(&exe)
        .args(["--exact", "zero_worker", "--nocapture", "--test-threads=1"])
        .env("FERRITE_ZERO_CASE", case)
        .env("FERRITE_ZERO_OUT", out.path())
        .env("FERRITE_DDP_TIMEOUT_S", "20")
        .stdout(Stdio::from(log_file.try_clone().unwrap()))
        .stderr(Stdio::from(log_file))
        .spawn()
        .expect("mpirun starts");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let Some(status) = status else {
        panic!("mpirun -np {ranks} ({case}) did not end within {deadline:?}; killed. Output:\n{log}")
    };
    Run { out, log, success: status.success(), elapsed: start.elapsed() }
}

fn equality(ranks: usize) {
    let test = format!("zero_equals_ddp_on_{ranks}_ranks");
    if require_mpi(&test).is_none() {
        return;
    }
    let run = launch(ranks, "equality", Duration::from_secs(240));
    assert!(run.success, "{test}: mpirun failed:\n{}", run.log);
    let start: Vec<f32> = model(100).parameters().iter().flat_map(|p| p.to_vec::<f32>().unwrap()).collect();
    for (name, _, stage, _, _, scaler) in CASES {
        let ddp = run.floats(&format!("{name}.ddp.rank0"));
        assert_ne!(ddp, start, "{name}: training moved the parameters");
        for rank in 0..ranks {
            let zero = run.floats(&format!("{name}.zero.rank{rank}"));
            assert_eq!(
                zero,
                run.floats(&format!("{name}.zero.rank0")),
                "{name}: rank {rank}'s parameters differ from rank 0's"
            );
            ferrite_test_support::assert_slices_close(&format!("{test} {name} rank {rank}"), &zero, &ddp, 1e-6, 1e-7);
            if rank == 0 {
                let worst = zero.iter().zip(&ddp).map(|(a, b)| (a - b).abs() / b.abs().max(1e-7)).fold(0f32, f32::max);
                let moved = ddp.iter().zip(&start).filter(|(a, b)| a != b).count();
                println!(
                    "{test} {name}: {moved}/{} values moved by training; ZeRO vs DDP largest relative difference {worst:e}",
                    ddp.len()
                );
            }
            let facts = run.text(&format!("{name}.facts.rank{rank}"));
            // Every rank holds ⌈359 / ranks⌉ values of optimizer state.
            assert!(facts.contains(&format!("partition {}", TOTAL.div_ceil(ranks))), "{name}: {facts}");
            if name.starts_with("adamw") {
                // AdamW's two moments for this rank's range only (DDP: 2 × 359 on every rank).
                let per = TOTAL.div_ceil(ranks);
                let mine = per.min(TOTAL - rank * per);
                assert!(facts.contains(&format!("state values {}\n", 2 * mine)), "{name} rank {rank}: {facts}");
            }
            if *stage >= 2 {
                assert!(facts.contains("full gradients after step: none"), "{name} rank {rank}: {facts}");
            }
            if *stage == 3 {
                // Between steps the blocks' parameters hold no bytes; the head (root) does.
                assert!(facts.contains("released at rest [true, true, true, true, false, false]"), "{name}: {facts}");
                // One unit's parameters hold bytes at a time (a prefetch waits in the comm buffer).
                assert!(facts.contains("most units gathered 1\n"), "{name} rank {rank}: {facts}");
            }
            if *scaler {
                // The inf was only in the last rank's shard: every rank skipped step 2.
                assert!(facts.contains("stepped [true, true, false, true, true]"), "{name} rank {rank}: {facts}");
                assert!(facts.contains("scale 32768"), "{name} rank {rank}: {facts}");
            }
        }
    }
}

#[test]
fn zero_1_2_and_3_equal_ddp_on_2_ranks() {
    equality(2);
}

#[test]
fn zero_1_2_and_3_equal_ddp_on_3_ranks() {
    equality(3);
}

/// `--zero-comm-dtype bf16`: the collectives carry bf16 and sum in bf16 (each partial sum
/// rounded, as NCCL sums bf16), the model's parameters are bf16 and the f32 masters live in the
/// shards. At 2 ranks the bf16 sum of two values has one rounding whatever the bucketing, so
/// ZeRO-2 and ZeRO-3 must agree bit for bit; each is close to the same run with an f32 wire but
/// not equal to it (the wire is really bf16); every parameter is its f32 master rounded to bf16.
#[test]
fn a_bf16_wire_sums_in_bf16_and_keeps_f32_masters_in_the_shards() {
    if require_mpi("zero_bf16_wire").is_none() {
        return;
    }
    let run = launch(2, "bf16", Duration::from_secs(240));
    assert!(run.success, "mpirun failed:\n{}", run.log);
    // The collectives themselves: 256 + 1 is not a bf16 (an f32 wire would deliver 257).
    let got = run.floats("bf16.reduce_scatter.rank0");
    assert_eq!(got, vec![256.0, bf16_round(bf16_round(1.0 / 3.0) + bf16_round(2.0 / 3.0))], "reduce-scatter");
    let gathered = run.floats("bf16.all_gather.rank1");
    let sent: Vec<f32> = (0..2).map(|r| 1.0 + 1.0 / 512.0 + r as f32 * (1.0 + 3.0 / 256.0)).collect();
    assert_eq!(gathered, sent.iter().map(|v| bf16_round(*v)).collect::<Vec<_>>(), "all-gather");
    let mut trained = Vec::new();
    for stage in [1, 2, 3] {
        let bf = run.floats(&format!("bf16.z{stage}.bf16.rank0"));
        let f32_wire = run.floats(&format!("bf16.z{stage}.f32.rank0"));
        assert_eq!(bf, run.floats(&format!("bf16.z{stage}.bf16.rank1")), "ZeRO-{stage}: ranks differ");
        for rank in 0..2 {
            let masters = run.floats(&format!("bf16.z{stage}.masters.rank{rank}"));
            let params = run.floats(&format!("bf16.z{stage}.mine.rank{rank}"));
            assert_eq!(params, masters.iter().map(|v| bf16_round(*v)).collect::<Vec<_>>(), "ZeRO-{stage} rank {rank}");
            assert!(masters.iter().any(|m| bf16_round(*m) != *m), "ZeRO-{stage}: the masters are f32, not rounded");
        }
        ferrite_test_support::assert_slices_close(
            &format!("ZeRO-{stage} bf16 vs f32 wire"),
            &bf,
            &f32_wire,
            2e-2,
            1e-3,
        );
        if stage > 1 {
            assert_ne!(bf, f32_wire, "ZeRO-{stage}: a bf16 wire must round the sums somewhere");
        }
        trained.push(bf);
    }
    assert_eq!(trained[1], trained[2], "ZeRO-2 and ZeRO-3 sum the same bf16 values once at 2 ranks");
}

/// ZeRO-3 over a model whose forward never announces its units (a plain `Sequential`: units
/// `0`, `1` by name, no `mark_layer`): the first layer meets its released weight and every rank
/// gets the typed error that says what to do — no panic, no hang.
#[test]
fn zero3_over_a_model_that_never_marks_its_units_is_a_typed_error_on_every_rank() {
    if require_mpi("zero3_unmarked").is_none() {
        return;
    }
    let run = launch(2, "unmarked", Duration::from_secs(120));
    assert!(run.success, "mpirun failed:\n{}", run.log);
    for rank in 0..2 {
        let e = run.text(&format!("unmarked.error.rank{rank}"));
        assert!(e.contains("storage was released") && e.contains("mark_layer"), "rank {rank}: {e}");
    }
}

/// `v` rounded to bf16 (round to nearest even), as f32.
fn bf16_round(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

#[test]
fn an_optimizer_over_foreign_tensors_is_a_typed_error_on_every_rank() {
    if require_mpi("foreign_optimizer").is_none() {
        return;
    }
    let run = launch(2, "foreign", Duration::from_secs(120));
    assert!(run.success, "mpirun failed:\n{}", run.log);
    for rank in 0..2 {
        let e = run.text(&format!("foreign.error.rank{rank}"));
        assert!(
            e.contains(&format!("rank {rank}")) && e.contains("[3, 3]") && e.contains("not a trainable parameter"),
            "{e}"
        );
    }
}

/// A rank that fails between backward and step (it announces its error, as a trainer does) stops
/// the others inside their next step, with an error naming it, well within the deadline.
#[test]
fn a_failing_rank_stops_every_other_rank_naming_it_at_every_stage() {
    if require_mpi("zero_failing_rank").is_none() {
        return;
    }
    for stage in ["1", "2", "3"] {
        let run = launch(3, &format!("raise{stage}"), Duration::from_secs(120));
        assert!(!run.success, "stage {stage}: the failing rank exits non-zero:\n{}", run.log);
        for rank in [0, 2] {
            let e = run.text(&format!("raise.error.rank{rank}"));
            assert!(e.contains("rank 1 failed") && e.contains("injected failure"), "stage {stage}, rank {rank}: {e}");
        }
        assert!(run.elapsed < Duration::from_secs(60), "stage {stage} took {:?}", run.elapsed);
    }
}

/// ZeRO-3: a rank that dies while the others wait in a unit's all-gather: they stop with a typed
/// error naming it within the deadline (20 s here), never hang.
#[test]
fn a_rank_dying_mid_gather_stops_the_others_naming_it() {
    if require_mpi("zero3_dead_rank").is_none() {
        return;
    }
    let run = launch(3, "die3", Duration::from_secs(120));
    assert!(!run.success, "the dead rank fails the job:\n{}", run.log);
    assert!(run.elapsed < Duration::from_secs(60), "took {:?}:\n{}", run.elapsed, run.log);
    let named = [0, 2].iter().any(|r| {
        std::fs::read_to_string(run.file(&format!("raise.error.rank{r}"))).is_ok_and(|e| e.contains("rank 1"))
    });
    assert!(named || run.log.contains("rank 1"), "no message names rank 1:\n{}", run.log);
}

/// The body of each rank (runs only under `launch`, which sets FERRITE_ZERO_CASE).
#[test]
fn zero_worker() {
    let Ok(case) = std::env::var("FERRITE_ZERO_CASE") else { return };
    #[cfg(feature = "mpi")]
    worker::run(&case, Path::new(&std::env::var("FERRITE_ZERO_OUT").unwrap()));
    #[cfg(not(feature = "mpi"))]
    panic!("zero_worker {case}: built without the mpi feature {:?}", Path::new("."));
}

#[cfg(feature = "mpi")]
mod worker {
    use super::*;
    use ferrite_optim::{
        AdagradConfig, AdagradRule, AdamConfig, AdamRule, GradScaler, GradScalerConfig, Optim, Optimizer, ParamGroup,
        RmspropConfig, RmspropRule, SgdConfig, SgdRule, UpdateRule, clip_grad_norm_,
    };
    use ferrite_parallel::distributed::{
        CommDtype, DdpOptions, DistributedDataParallel, DistributedError, FullySharded, NoSync, ProcessGroup,
        ZeroOptions, ZeroRedundancy, ZeroStage, ZeroStepOutcome,
    };

    /// ZeRO-1/2 or ZeRO-3 behind one face.
    enum Z {
        Redundancy(Box<ZeroRedundancy>),
        Full(FullySharded),
    }

    impl Z {
        fn zero(&self) -> &ZeroRedundancy {
            match self {
                Z::Redundancy(z) => z,
                Z::Full(f) => f.zero(),
            }
        }
        fn no_sync(&self) -> NoSync<'_> {
            match self {
                Z::Redundancy(z) => z.no_sync(),
                Z::Full(f) => f.no_sync(),
            }
        }
        fn backward(&self, loss: &Tensor) -> R<()> {
            match self {
                Z::Redundancy(z) => z.backward(loss),
                Z::Full(f) => f.backward(loss),
            }
        }
        fn step(&self, opt: &mut dyn Optimizer, clip: Option<f64>, sc: Option<&mut GradScaler>) -> R<ZeroStepOutcome> {
            match self {
                Z::Redundancy(z) => z.step(opt, clip, sc),
                Z::Full(f) => f.step(opt, clip, sc),
            }
        }
        fn finish(self) -> R<()> {
            match self {
                Z::Redundancy(z) => (*z).finish(),
                Z::Full(f) => f.finish(),
            }
        }
    }

    type R<T> = Result<T, DistributedError>;

    pub(super) fn run(case: &str, out: &Path) {
        let group = ProcessGroup::init().unwrap();
        let rank = group.rank();
        if case == "foreign" {
            let m = model(100);
            let zero = ZeroRedundancy::new(&m, group.comm(), ZeroOptions::new(ZeroStage::One)).unwrap();
            let stranger = Tensor::zeros(&[3, 3], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
            let full = Optim::<SgdRule>::new(vec![m.parameters()[0].clone(), stranger], SgdConfig::new(0.1)).unwrap();
            let e = zero.shard_optimizer(&full).expect_err("an error");
            std::fs::write(out.join(format!("foreign.error.rank{rank}")), e.to_string()).unwrap();
            zero.finish().unwrap();
            return;
        }
        if case == "unmarked" {
            let mut g = Generator::new(3);
            let m = ferrite_nn::Sequential::new()
                .append(Linear::new_with(FEATURES, 13, true, &Device::Cpu, &mut g).unwrap())
                .append(Linear::new_with(13, 5, true, &Device::Cpu, &mut g).unwrap());
            let f = FullySharded::new(&m, "Sequential", group.comm(), ZeroOptions::new(ZeroStage::Three)).unwrap();
            let (xb, _) = batch(0, 0, 1, rank, group.world_size());
            let e = m.forward(&xb).expect_err("a released weight");
            std::fs::write(out.join(format!("unmarked.error.rank{rank}")), e.to_string()).unwrap();
            f.finish().unwrap();
            return;
        }
        if case == "bf16" {
            bf16_wire(&group, out).unwrap();
            return;
        }
        if let Some(stage) = case.strip_prefix("raise").or_else(|| case.strip_prefix("die")) {
            let stage = ZeroStage::from_number(stage.parse().unwrap()).unwrap();
            if let Err(e) = raise(&group, stage, case.starts_with("die")) {
                std::fs::write(out.join(format!("raise.error.rank{rank}")), e.to_string()).unwrap();
            }
            return;
        }
        for &(name, kind, stage, clip, accumulation, scaler) in CASES {
            let ddp = train_ddp(&group, kind, clip, accumulation, scaler).unwrap();
            write(out, &format!("{name}.ddp.rank{rank}"), &ddp);
            let (zero, facts) = train_zero(&group, name, kind, stage, clip, accumulation, scaler).unwrap();
            write(out, &format!("{name}.zero.rank{rank}"), &zero);
            std::fs::write(out.join(format!("{name}.facts.rank{rank}")), facts).unwrap();
        }
    }

    /// Rank 1 fails after the backward of step 2; the others are then inside `step`. With `die`
    /// (ZeRO-3) rank 1 instead aborts as the forward of step 2 starts: the others are then
    /// inside the all-gather of the first unit.
    fn raise(group: &ProcessGroup, stage: ZeroStage, die: bool) -> R<()> {
        let (rank, world) = (group.rank(), group.world_size());
        let m = model(100);
        let zero = match stage {
            ZeroStage::Three => Z::Full(FullySharded::new(&m, "Blocks", group.comm(), ZeroOptions::new(stage))?),
            _ => Z::Redundancy(Box::new(ZeroRedundancy::new(&m, group.comm(), ZeroOptions::new(stage))?)),
        };
        let mut opt = shard(zero.zero(), &Optim::<SgdRule>::new(m.parameters(), SgdConfig::new(0.1)).unwrap());
        for s in 0..STEPS {
            if die && s == 2 && rank == 1 {
                std::process::abort();
            }
            let (xb, yb) = batch(s, 0, 1, rank, world);
            zero.backward(&mse(&m.forward(&xb)?, &yb)?)?;
            if !die && s == 2 && rank == 1 {
                zero.zero().announce_failure("injected failure");
                // Give the others time to report before mpirun ends the job on this exit.
                std::thread::sleep(Duration::from_secs(2));
                std::process::exit(1);
            }
            zero.step(opt.as_mut(), None, None)?;
            zero.zero().zero_grad(opt.as_mut())?;
        }
        zero.finish()
    }

    /// The bf16 collectives on fixed values, then ZeRO-1/2/3 with bf16 parameters trained with a
    /// bf16 and an f32 wire (2 ranks).
    fn bf16_wire(group: &ProcessGroup, out: &Path) -> R<()> {
        let (rank, world) = (group.rank(), group.world_size());
        let comm = group.comm();
        let mine = if rank == 0 { [256.0, 1.0 / 3.0] } else { [1.0, 2.0 / 3.0] };
        let send: Vec<f32> = (0..world).flat_map(|_| mine).collect();
        write(
            out,
            &format!("bf16.reduce_scatter.rank{rank}"),
            &comm.reduce_scatter_sum(send, CommDtype::Bf16)?.wait()?,
        );
        let value = 1.0 + 1.0 / 512.0 + rank as f32 * (1.0 + 3.0 / 256.0);
        write(
            out,
            &format!("bf16.all_gather.rank{rank}"),
            &comm.start_all_gather(vec![value], CommDtype::Bf16)?.wait()?,
        );
        for stage in [1, 2, 3] {
            for wire in [CommDtype::Bf16, CommDtype::F32] {
                let mut m = model(100 + rank as u64);
                m.to_dtype(DType::BF16)?;
                let stage = ZeroStage::from_number(stage).unwrap();
                let options = ZeroOptions::new(stage).ddp(DdpOptions::default().bucket_cap_mb(0.0005)).comm_dtype(wire);
                let zero = match stage {
                    ZeroStage::Three => Z::Full(FullySharded::new(&m, "Blocks", group.comm(), options)?),
                    _ => Z::Redundancy(Box::new(ZeroRedundancy::new(&m, group.comm(), options)?)),
                };
                let Opt::Adam(full) = optimizer("adamw", &m) else { unreachable!() };
                let mut opt = shard(zero.zero(), &full);
                for s in 0..STEPS {
                    let (xb, yb) = batch(s, 0, 1, rank, world);
                    let loss = {
                        let _amp = ferrite_nn::autocast(DType::BF16)?;
                        mse(&m.forward(&xb)?.to_dtype(DType::F32)?, &yb)?
                    };
                    zero.backward(&loss)?;
                    zero.step(opt.as_mut(), Some(1.0), None)?;
                    zero.zero().zero_grad(opt.as_mut())?;
                }
                if let Z::Full(f) = &zero {
                    f.gather_all()?;
                }
                let params: Vec<f32> = m
                    .parameters()
                    .iter()
                    .flat_map(|p| p.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap())
                    .collect();
                let tag = format!("bf16.z{}", stage.number());
                write(out, &format!("{tag}.{}.rank{rank}", wire.name()), &params);
                if wire == CommDtype::Bf16 {
                    // This rank's masters, and the same values of its parameters.
                    let z = zero.zero();
                    let masters: Vec<f32> = z.shards().iter().flat_map(|t| t.to_vec::<f32>().unwrap()).collect();
                    let per = z.partition_numel();
                    let hi = (rank * per + per).min(params.len());
                    write(out, &format!("{tag}.masters.rank{rank}"), &masters);
                    write(out, &format!("{tag}.mine.rank{rank}"), &params[rank * per..hi]);
                }
                if let Z::Full(f) = &zero {
                    f.release_all();
                }
                zero.finish()?;
            }
        }
        Ok(())
    }

    fn write(out: &Path, name: &str, v: &[f32]) {
        std::fs::write(out.join(name), v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    }

    fn flat(m: &dyn Module) -> Vec<f32> {
        m.parameters().iter().flat_map(|p| p.to_vec::<f32>().unwrap()).collect()
    }

    /// Weights and biases in two groups (biases without weight decay).
    fn groups<C: Clone>(m: &dyn Module, config: C, no_decay: C) -> Vec<ParamGroup<C>> {
        let (w, b): (Vec<_>, Vec<_>) = m.named_parameters().into_iter().partition(|(n, _)| n.ends_with("weight"));
        vec![ParamGroup::named(w, config), ParamGroup::named(b, no_decay)]
    }

    enum Opt {
        Adam(Optim<AdamRule>),
        Sgd(Optim<SgdRule>),
        Rms(Optim<RmspropRule>),
        Ada(Optim<AdagradRule>),
    }

    fn optimizer(kind: &str, m: &dyn Module) -> Opt {
        match kind {
            "adamw" => Opt::Adam(
                Optim::with_groups(groups(
                    m,
                    AdamConfig::adamw(1e-2).weight_decay(0.1),
                    AdamConfig::adamw(1e-2).weight_decay(0.0),
                ))
                .unwrap(),
            ),
            "sgd" => {
                Opt::Sgd(Optim::new(m.parameters(), SgdConfig::new(0.1).momentum(0.9).weight_decay(0.01)).unwrap())
            }
            "rmsprop" => {
                Opt::Rms(Optim::new(m.parameters(), RmspropConfig::new(0.01).momentum(0.5).centered(true)).unwrap())
            }
            _ => Opt::Ada(Optim::new(m.parameters(), AdagradConfig::new(0.1)).unwrap()),
        }
    }

    fn shard<X: UpdateRule>(zero: &ZeroRedundancy, o: &Optim<X>) -> Box<dyn Optimizer> {
        Box::new(zero.shard_optimizer(o).unwrap())
    }

    fn into_dyn(o: Opt) -> Box<dyn Optimizer> {
        match o {
            Opt::Adam(o) => Box::new(o),
            Opt::Sgd(o) => Box::new(o),
            Opt::Rms(o) => Box::new(o),
            Opt::Ada(o) => Box::new(o),
        }
    }

    fn batch(step: usize, micro: usize, accumulation: usize, rank: usize, world: usize) -> (Tensor, Tensor) {
        let global = world * LOCAL_BATCH * accumulation;
        let (x, y) = data(STEPS * global);
        let start = step * global + micro * world * LOCAL_BATCH + rank * LOCAL_BATCH;
        (x.narrow(0, start, LOCAL_BATCH).unwrap(), y.narrow(0, start, LOCAL_BATCH).unwrap())
    }

    const INF_STEP: usize = 2;

    fn scaler_for(on: bool) -> Option<GradScaler> {
        on.then(|| GradScaler::new(GradScalerConfig::default()).unwrap())
    }

    /// The reference: DDP, clipping with the local (= global, replicated) norm; with a scaler,
    /// an inf in the last parameter's gradient on every rank at INF_STEP.
    fn train_ddp(group: &ProcessGroup, kind: &str, clip: bool, accumulation: usize, scaler: bool) -> R<Vec<f32>> {
        let (rank, world) = (group.rank(), group.world_size());
        let ddp =
            DistributedDataParallel::new(model(100 + rank as u64), group, DdpOptions::default().bucket_cap_mb(0.0005))?;
        let mut opt = into_dyn(optimizer(kind, ddp.module()));
        let mut sc = scaler_for(scaler);
        for s in 0..STEPS {
            for k in 0..accumulation {
                let (xb, yb) = batch(s, k, accumulation, rank, world);
                let mut loss = mse(&ddp.forward(&xb)?, &yb)?.div_scalar(accumulation as f64)?;
                if let Some(sc) = sc.as_mut() {
                    loss = sc.scale(&loss)?;
                }
                if k + 1 < accumulation {
                    let _q = ddp.no_sync();
                    ddp.backward(&loss)?;
                } else {
                    ddp.backward(&loss)?;
                }
            }
            match sc.as_mut() {
                Some(sc) => {
                    if s == INF_STEP {
                        poison(&ddp.module().parameters().last().unwrap().grad().unwrap());
                    }
                    sc.unscale_(opt.as_mut())?;
                    if clip {
                        clip_grad_norm_(&opt.params(), 0.05)?;
                    }
                    sc.step(opt.as_mut())?;
                    sc.update()?;
                }
                None => {
                    if clip {
                        clip_grad_norm_(&opt.params(), 0.05)?;
                    }
                    opt.step()?;
                }
            }
            opt.zero_grad()?;
        }
        let m = ddp.finish()?;
        Ok(flat(&m))
    }

    fn poison(g: &Tensor) {
        let mut v = g.to_vec::<f32>().unwrap();
        let last = v.len() - 1;
        v[last] = f32::INFINITY;
        g.copy_from_slice(&v).unwrap();
    }

    fn train_zero(
        group: &ProcessGroup,
        name: &str,
        kind: &str,
        stage: u32,
        clip: bool,
        accumulation: usize,
        scaler: bool,
    ) -> R<(Vec<f32>, String)> {
        let (rank, world) = (group.rank(), group.world_size());
        let mut m = model(100 + rank as u64);
        m.checkpoint = name.ends_with("-ckpt");
        let stage = ZeroStage::from_number(stage).unwrap();
        // Small buckets: several all-reduces / reduce-scatters per step.
        let options = ZeroOptions::new(stage).ddp(DdpOptions::default().bucket_cap_mb(0.0005));
        let zero = match stage {
            ZeroStage::Three => Z::Full(FullySharded::new(&m, "Blocks", group.comm(), options)?),
            _ => Z::Redundancy(Box::new(ZeroRedundancy::new(&m, group.comm(), options)?)),
        };
        let mut opt = match optimizer(kind, &m) {
            Opt::Adam(o) => shard(zero.zero(), &o),
            Opt::Sgd(o) => shard(zero.zero(), &o),
            Opt::Rms(o) => shard(zero.zero(), &o),
            Opt::Ada(o) => shard(zero.zero(), &o),
        };
        let mut sc = scaler_for(scaler);
        let mut stepped = Vec::new();
        let mut full_grads_after_step = "none";
        let mut released = Vec::new();
        for s in 0..STEPS {
            for k in 0..accumulation {
                let (xb, yb) = batch(s, k, accumulation, rank, world);
                let mut loss = mse(&m.forward(&xb)?, &yb)?.div_scalar(accumulation as f64)?;
                if let Some(sc) = sc.as_mut() {
                    loss = sc.scale(&loss)?;
                }
                if k + 1 < accumulation {
                    let _q = zero.no_sync();
                    zero.backward(&loss)?;
                } else {
                    zero.backward(&loss)?;
                }
            }
            if sc.is_some() && s == INF_STEP && rank == world - 1 {
                // Only the last rank sees it: it owns the last parameter's last value.
                match stage {
                    ZeroStage::One => poison(&m.parameters().last().unwrap().grad().unwrap()),
                    _ => poison(&zero.zero().shards().last().unwrap().grad().unwrap()),
                }
            }
            let outcome = zero.step(opt.as_mut(), clip.then_some(0.05), sc.as_mut())?;
            if let Some(sc) = sc.as_mut() {
                sc.update()?;
            }
            stepped.push(outcome.stepped);
            if stage != ZeroStage::One && m.parameters().iter().any(|p| p.grad().is_some()) {
                full_grads_after_step = "some";
            }
            released = m.parameters().iter().map(Tensor::is_storage_released).collect::<Vec<_>>();
            zero.zero().zero_grad(opt.as_mut())?;
        }
        let most = match &zero {
            Z::Full(f) => f.max_units_gathered(),
            Z::Redundancy(_) => 0,
        };
        let state_values: usize = opt
            .state_dict()?
            .state
            .iter()
            .flat_map(|(_, entries)| entries.iter())
            .map(|(key, v)| match v {
                ferrite_optim::state_dict::StateValue::Tensor(t) if key != "step" => t.numel(),
                _ => 0,
            })
            .sum();
        let facts = format!(
            "partition {}\nstate values {state_values}\nfull gradients after step: {full_grads_after_step}\nstepped {stepped:?}\nscale {}\nreleased at rest {released:?}\nmost units gathered {most}\n",
            zero.zero().partition_numel(),
            sc.as_ref().map(|s| s.get_scale()).unwrap_or(0.0)
        );
        zero.finish()?;
        Ok((flat(&m), facts))
    }
}
