//! DistributedDataParallel figures for BENCHMARKS.md. Run under MPI, one thread per rank:
//!
//! ```text
//! cargo build --release -p ferrite-parallel --features mpi --example ddp_bench
//! RAYON_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 1 -x RAYON_NUM_THREADS target/release/examples/ddp_bench
//! RAYON_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 -x RAYON_NUM_THREADS target/release/examples/ddp_bench
//! ```
//!
//! Options (after the program name): `--bucket-cap-mb X`, `--first-bucket-mb X` (the buckets;
//! PyTorch's defaults 25 and 1 otherwise), `--steps N`.
//!
//! Prints (rank 0; step times are the slower rank's):
//! - one rank's step alone (rank 0 while the others wait), measured in the same run, and the
//!   scaling of the world against it (issue 19's target: 1.7x at 2 ranks);
//! - the transformer step's samples/s with DDP, and the same step with no communication at all
//!   (every rank on its own under `no_sync`: the ceiling that two processes sharing the cores and
//!   the memory bandwidth allow);
//! - backward without and with the bucketed all-reduce, and where the time of the synchronized
//!   backward went ([`StepTimings`]: communication, the share hidden behind backward, copying);
//! - the bucketed all-reduce of the gradients alone against one plain `MPI_Allreduce` of the same
//!   bytes, called directly on `MPI_COMM_WORLD`.

use std::time::Instant;

use ferrite_nn::Module;
use ferrite_optim::{AdamConfig, AdamRule, Optim, Optimizer};
use ferrite_parallel::distributed::{DdpOptions, DistributedDataParallel, ProcessGroup, StepTimings};
use ferrite_tensor::Tensor;
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::CommunicatorCollectives;

#[path = "bench_common/mod.rs"]
mod bench_common;

use bench_common::{D_MODEL, LOCAL_BATCH, Res, SEQ, WARMUP, median, model, rank_batch, slowest};

fn ms(s: f64) -> f64 {
    s * 1e3
}

struct Args {
    options: DdpOptions,
    steps: usize,
}

fn args() -> Res<Args> {
    let mut options = DdpOptions::default();
    let mut steps = 10;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--bucket-cap-mb" => options = options.bucket_cap_mb(value()?.parse()?),
            "--first-bucket-mb" => options = options.first_bucket_mb(value()?.parse()?),
            "--steps" => steps = value()?.parse::<usize>()?.max(1),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(Args { options, steps })
}

fn main() -> Res<()> {
    let Args { options, steps } = args()?;
    let group = ProcessGroup::init()?;
    let comm = group.comm();
    let (rank, world) = (group.rank(), group.world_size());
    let ddp = DistributedDataParallel::new(model()?, &group, options.clone())?;
    let params = ddp.module().parameters();
    let bytes: usize = params.iter().map(|p| p.numel() * 4).sum();
    let mut opt = Optim::<AdamRule>::new(params.clone(), AdamConfig::adamw(1e-3))?;
    let (x, y) = rank_batch(rank)?;
    let loss_of = |ddp: &DistributedDataParallel<bench_common::Blocks>| -> Res<Tensor> {
        let d = ddp.forward(&x)?.sub(&y)?;
        Ok(d.mul(&d)?.mean()?)
    };
    let mut full_step = |synced: bool| -> Res<f64> {
        let t = Instant::now();
        let loss = loss_of(&ddp)?;
        if synced {
            ddp.backward(&loss)?;
        } else {
            let _n = ddp.no_sync();
            ddp.backward(&loss)?;
        }
        opt.step()?;
        opt.zero_grad()?;
        Ok(t.elapsed().as_secs_f64())
    };

    // Full steps, with DDP and with no communication at all, alternated in blocks of 5 so that
    // both see the same load on a shared machine.
    let (mut step_ddp, mut step_alone) = (Vec::new(), Vec::new());
    for _ in 0..WARMUP {
        full_step(true)?;
    }
    let mut done = 0;
    while done < steps {
        let block = (steps - done).min(5);
        for _ in 0..block {
            step_ddp.push(full_step(true)?);
        }
        comm.all_gather_f64(vec![0.0])?;
        for _ in 0..block {
            step_alone.push(full_step(false)?);
        }
        comm.all_gather_f64(vec![0.0])?;
        done += block;
    }
    let step_ddp = slowest(&comm, median(step_ddp))?;
    let step_alone = slowest(&comm, median(step_alone))?;

    // The one-rank reference in the same minute: rank 0 steps alone (no communication) while
    // the other ranks wait, so the scaling figure does not mix two runs on a shared machine.
    let mut step_single = Vec::new();
    if rank == 0 {
        for _ in 0..steps {
            step_single.push(full_step(false)?);
        }
    }
    comm.all_gather_f64(vec![0.0])?;
    let step_single = if rank == 0 { median(step_single) } else { 0.0 };

    // Backward alone (no communication), backward with the overlapped all-reduce, the bucketed
    // all-reduce alone, and one plain MPI_Allreduce of the same bytes.
    let world_comm = SimpleCommunicator::world();
    let plain_send = vec![1.0f32; bytes / 4];
    let mut plain_recv = vec![0.0f32; bytes / 4];
    let (mut local, mut synced, mut bucketed, mut buckets_only, mut status, mut plain) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut timings: Vec<StepTimings> = Vec::new();
    let mut sync_timings: Vec<StepTimings> = Vec::new();
    for _ in 0..steps {
        opt.zero_grad()?;
        let loss = loss_of(&ddp)?;
        comm.all_gather_f64(vec![0.0])?;
        let t = Instant::now();
        {
            let _n = ddp.no_sync();
            ddp.backward(&loss)?;
        }
        local.push(t.elapsed().as_secs_f64());
        opt.zero_grad()?;
        let loss = loss_of(&ddp)?;
        comm.all_gather_f64(vec![0.0])?;
        let t = Instant::now();
        ddp.backward(&loss)?;
        synced.push(t.elapsed().as_secs_f64());
        timings.push(ddp.last_timings());
        // The status exchange that starts every synchronizing step, alone.
        comm.all_gather_f64(vec![0.0])?;
        let t = Instant::now();
        comm.all_gather_status(None)?;
        status.push(t.elapsed().as_secs_f64());
        // The all-reduce alone: every bucket from the gradients now held (status word included).
        comm.all_gather_f64(vec![0.0])?;
        let t = Instant::now();
        ddp.synchronize()?;
        bucketed.push(t.elapsed().as_secs_f64());
        // The same without the status exchange: copying in, the all-reduces, averaging back
        // (there is no backward here, so the copying in falls in `exposed_wait`).
        let st = ddp.last_timings();
        buckets_only.push((st.backward + st.exposed_wait + st.write_back).as_secs_f64());
        sync_timings.push(st);
        // One plain MPI_Allreduce of the same bytes, straight on MPI_COMM_WORLD (the
        // communication thread is idle now; MPI runs with MPI_THREAD_MULTIPLE).
        comm.all_gather_f64(vec![0.0])?;
        let t = Instant::now();
        world_comm.all_reduce_into(&plain_send[..], &mut plain_recv[..], SystemOperation::sum());
        plain.push(t.elapsed().as_secs_f64());
    }
    let (local, synced, bucketed, status, plain) =
        (median(local), median(synced), median(bucketed), median(status), median(plain));
    let reduce_only = median(buckets_only).max(1e-9);
    let med = |f: fn(&StepTimings) -> f64| median(timings.iter().map(f).collect());
    let comm_s = med(|t| t.communication.as_secs_f64());
    let hidden_s = med(|t| t.hidden.as_secs_f64());
    let wait_s = med(|t| t.exposed_wait.as_secs_f64());
    let flatten_s = med(|t| t.flatten.as_secs_f64());
    let write_s = med(|t| t.write_back.as_secs_f64());
    let sync_med = |f: fn(&StepTimings) -> f64| median(sync_timings.iter().map(f).collect());
    let (sync_fill, sync_comm, sync_write) = (
        sync_med(|t| t.flatten.as_secs_f64()),
        sync_med(|t| t.communication.as_secs_f64()),
        sync_med(|t| t.write_back.as_secs_f64()),
    );
    if rank == 0 {
        let sizes = ddp.bucket_sizes();
        println!(
            "world {world}, {} buckets (parameters per bucket {sizes:?}; first bucket {:.2} MiB, cap {:.2} MiB), gradients {:.2} MiB, local batch {LOCAL_BATCH} x seq {SEQ} x d_model {D_MODEL}, {steps} steps",
            sizes.len(),
            options.first_bucket_bytes as f64 / (1 << 20) as f64,
            options.bucket_cap_bytes as f64 / (1 << 20) as f64,
            bytes as f64 / (1 << 20) as f64
        );
        let sps = |s: f64| (world * LOCAL_BATCH) as f64 / s;
        println!("step with DDP {:.1} ms, {:.1} samples/s (all ranks)", ms(step_ddp), sps(step_ddp));
        println!(
            "step with no communication (ranks independent, no_sync) {:.1} ms, {:.1} samples/s (all ranks): DDP reaches {:.0}% of it",
            ms(step_alone),
            sps(step_alone),
            100.0 * step_alone / step_ddp
        );
        let single = LOCAL_BATCH as f64 / step_single;
        println!(
            "one rank alone (rank 0 while the others wait) {:.1} ms, {single:.1} samples/s: {world} ranks with DDP {:.2}x, with no communication {:.2}x (target 1.7x at 2 ranks)",
            ms(step_single),
            sps(step_ddp) / single,
            sps(step_alone) / single
        );
        println!(
            "backward local {:.1} ms, with all-reduce {:.1} ms (+{:.1} ms)",
            ms(local),
            ms(synced),
            ms(synced - local)
        );
        println!(
            "  in it: all-reduces {:.2} ms (start to seen finished), {:.2} ms of them during backward: {:.0}% hidden; waiting after backward {:.2} ms; copying into buckets {:.2} ms, averaging back {:.2} ms",
            ms(comm_s),
            ms(hidden_s),
            if comm_s > 0.0 { 100.0 * (hidden_s / comm_s).min(1.0) } else { 100.0 },
            ms(wait_s),
            ms(flatten_s),
            ms(write_s)
        );
        println!(
            "bucketed all-reduce (GradientSync::synchronize) {:.2} ms, of which the buckets {:.2} ms (status exchange alone {:.2} ms); plain MPI_Allreduce {:.2} ms of the same bytes: buckets at {:.0}% of plain's speed ({:.0}% with the status exchange)",
            ms(bucketed),
            ms(reduce_only),
            ms(status),
            ms(plain),
            100.0 * plain / reduce_only,
            100.0 * plain / bucketed
        );
        println!(
            "  in it: filling the buckets {:.2} ms (no copy where the gradients already view them), all-reduces {:.2} ms, averaging {:.2} ms",
            ms(sync_fill),
            ms(sync_comm),
            ms(sync_write)
        );
    }
    ddp.finish()?;
    Ok(())
}
