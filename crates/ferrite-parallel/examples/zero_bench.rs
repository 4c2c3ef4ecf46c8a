//! ZeRO-1, ZeRO-2 and ZeRO-3 against DDP, same model and step as `ddp_bench`, for BENCHMARKS.md.
//! Run under MPI, one thread per rank:
//!
//! ```text
//! cargo build --release -p ferrite-parallel --features mpi --example zero_bench
//! RAYON_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 -x RAYON_NUM_THREADS target/release/examples/zero_bench --steps 30
//! ```
//!
//! Four replicas of the model are built (identical weights), wrapped by DDP, ZeRO-1, ZeRO-2 and
//! ZeRO-3, and their full training steps (forward, backward with the gradient exchange, AdamW
//! step; under ZeRO the sharded step with its all-gather) are timed in alternating blocks of 5 so
//! that all four see the same load on a shared machine. Prints (rank 0; a step's time is the
//! slower rank's median) samples/s of each and ZeRO's throughput relative to DDP's, and the share
//! of communication hidden behind computation: for DDP and ZeRO-1 (whose gradient all-reduce runs
//! in DDP's buckets during backward) the all-reduce's; ZeRO-2's reduce-scatter runs after
//! backward (see `grad_reduce_scatter.rs`): nothing of it is hidden; for ZeRO-3 the share of the
//! communication thread's busy time (`Comm::busy_time`: gathers, reduce-scatters, the step's
//! exchanges) during which the training thread was not waiting for it
//! (`FullySharded::take_waited`, and the step's collectives, which are synchronous).
//!
//! ZeRO-3 runs on a thread of its own: its layer-mark listener and backward hook belong to the
//! thread that runs its model, and would otherwise hear the other replicas' forward passes. The
//! main thread hands it a block of steps and waits, so the collectives stay in one order.

use std::sync::mpsc;
use std::time::Instant;

use ferrite_nn::Module;
use ferrite_optim::{AdamConfig, AdamRule, Optim, Optimizer};
use ferrite_parallel::distributed::{
    Comm, DdpOptions, DistributedDataParallel, FullySharded, ProcessGroup, ZeroOptions, ZeroRedundancy, ZeroStage,
};
use ferrite_tensor::Tensor;

#[path = "bench_common/mod.rs"]
mod bench_common;

use bench_common::{Blocks, D_MODEL, LOCAL_BATCH, Res, SEQ, WARMUP, median, model, rank_batch, slowest};

/// One ZeRO-3 step's (time, communication busy time, of which the training thread waited).
type Timed = (f64, f64, f64);

/// The ZeRO-3 replica's thread: ready after building (its first reply is empty), then runs each
/// block of steps it is sent and replies with their timings; 0 ends it.
fn zero3_thread(rank: usize, comm: Comm, go: mpsc::Receiver<usize>, done: mpsc::Sender<Result<Vec<Timed>, String>>) {
    let run = || -> Res<()> {
        let (x, y) = rank_batch(rank)?;
        let m = model()?;
        let f = FullySharded::new(&m, "Blocks", comm.clone(), ZeroOptions::new(ZeroStage::Three))?;
        let mut opt = f.shard_optimizer(&Optim::<AdamRule>::new(m.parameters(), AdamConfig::adamw(1e-3))?)?;
        done.send(Ok(Vec::new()))?;
        while let Ok(n) = go.recv() {
            if n == 0 {
                break;
            }
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                let (t, b0) = (Instant::now(), comm.busy_time());
                let d = m.forward(&x)?.sub(&y)?;
                f.backward(&d.mul(&d)?.mean()?)?;
                let waited = f.take_waited();
                let b1 = comm.busy_time();
                f.step(&mut opt, None, None)?;
                f.zero_grad(&mut opt)?;
                let b2 = comm.busy_time();
                v.push((t.elapsed().as_secs_f64(), (b2 - b0).as_secs_f64(), (waited + (b2 - b1)).as_secs_f64()));
            }
            done.send(Ok(v))?;
        }
        f.finish()?;
        Ok(())
    };
    if let Err(e) = run() {
        let _ = done.send(Err(e.to_string()));
    }
}

fn main() -> Res<()> {
    let mut steps = 10usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--steps" => steps = it.next().ok_or("--steps needs a value")?.parse::<usize>()?.max(1),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let group = ProcessGroup::init()?;
    let comm = group.comm();
    let (rank, world) = (group.rank(), group.world_size());
    let (x, y) = rank_batch(rank)?;
    let loss_of = |m: &Blocks| -> Res<Tensor> {
        let d = m.forward(&x)?.sub(&y)?;
        Ok(d.mul(&d)?.mean()?)
    };

    let ddp = DistributedDataParallel::new(model()?, &group, DdpOptions::default())?;
    let mut ddp_opt = Optim::<AdamRule>::new(ddp.module().parameters(), AdamConfig::adamw(1e-3))?;
    let mut zeros = Vec::new();
    for stage in [ZeroStage::One, ZeroStage::Two] {
        let m = model()?;
        let z = ZeroRedundancy::new(&m, comm.clone(), ZeroOptions::new(stage))?;
        let opt = z.shard_optimizer(&Optim::<AdamRule>::new(m.parameters(), AdamConfig::adamw(1e-3))?)?;
        zeros.push((m, z, opt));
    }
    let mut ddp_step = || -> Res<(f64, f64, f64)> {
        let t = Instant::now();
        ddp.backward(&loss_of(ddp.module())?)?;
        let timings = ddp.last_timings();
        ddp_opt.step()?;
        ddp_opt.zero_grad()?;
        Ok((t.elapsed().as_secs_f64(), timings.communication.as_secs_f64(), timings.hidden.as_secs_f64()))
    };
    // (step time, all-reduce time, the part of it during backward): the last two for ZeRO-1.
    let (go, go_rx) = mpsc::channel::<usize>();
    let (done_tx, done) = mpsc::channel::<Result<Vec<Timed>, String>>();
    let z3_comm = comm.clone();
    let z3 = std::thread::spawn(move || zero3_thread(rank, z3_comm, go_rx, done_tx));
    // Built now, after the other replicas, on every rank in the same order.
    done.recv()??;
    let zero3 = |n: usize| -> Res<Vec<Timed>> {
        go.send(n)?;
        Ok(done.recv()??)
    };
    let zero_step = |(m, z, opt): &mut (Blocks, ZeroRedundancy, Optim<AdamRule>)| -> Res<(f64, f64, f64)> {
        let t = Instant::now();
        z.backward(&loss_of(m)?)?;
        let timings = z.last_timings();
        z.step(opt, None, None)?;
        z.zero_grad(opt)?;
        let (c, h) = timings.map_or((0.0, 0.0), |t| (t.communication.as_secs_f64(), t.hidden.as_secs_f64()));
        Ok((t.elapsed().as_secs_f64(), c, h))
    };
    for _ in 0..WARMUP {
        ddp_step()?;
        for z in &mut zeros {
            zero_step(z)?;
        }
        zero3(1)?;
    }
    let (mut t_ddp, mut t_z1, mut t_z2, mut comm_ddp, mut hidden_ddp, mut comm_z1, mut hidden_z1) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut z3_steps: Vec<Timed> = Vec::new();
    let mut done = 0;
    while done < steps {
        let block = (steps - done).min(5);
        for _ in 0..block {
            let (t, c, h) = ddp_step()?;
            t_ddp.push(t);
            comm_ddp.push(c);
            hidden_ddp.push(h);
        }
        comm.all_gather_f64(vec![0.0])?;
        for _ in 0..block {
            let (t, c, h) = zero_step(&mut zeros[0])?;
            t_z1.push(t);
            comm_z1.push(c);
            hidden_z1.push(h);
        }
        comm.all_gather_f64(vec![0.0])?;
        for _ in 0..block {
            t_z2.push(zero_step(&mut zeros[1])?.0);
        }
        comm.all_gather_f64(vec![0.0])?;
        z3_steps.extend(zero3(block)?);
        comm.all_gather_f64(vec![0.0])?;
        done += block;
    }
    let (s_ddp, s_z1, s_z2) =
        (slowest(&comm, median(t_ddp))?, slowest(&comm, median(t_z1))?, slowest(&comm, median(t_z2))?);
    let s_z3 = slowest(&comm, median(z3_steps.iter().map(|t| t.0).collect()))?;
    let (busy3, waited3) =
        (median(z3_steps.iter().map(|t| t.1).collect()), median(z3_steps.iter().map(|t| t.2).collect()));
    let (c, h, c1, h1) = (median(comm_ddp), median(hidden_ddp), median(comm_z1), median(hidden_z1));
    if rank == 0 {
        let sps = |s: f64| (world * LOCAL_BATCH) as f64 / s;
        println!("world {world}, local batch {LOCAL_BATCH} x seq {SEQ} x d_model {D_MODEL}, {steps} steps each");
        println!("DDP    step {:.1} ms, {:.1} samples/s", s_ddp * 1e3, sps(s_ddp));
        println!("ZeRO-1 step {:.1} ms, {:.1} samples/s: {:.2}x DDP's throughput", s_z1 * 1e3, sps(s_z1), s_ddp / s_z1);
        println!("ZeRO-2 step {:.1} ms, {:.1} samples/s: {:.2}x DDP's throughput", s_z2 * 1e3, sps(s_z2), s_ddp / s_z2);
        println!("ZeRO-3 step {:.1} ms, {:.1} samples/s: {:.2}x DDP's throughput", s_z3 * 1e3, sps(s_z3), s_ddp / s_z3);
        let share = |c: f64, h: f64| if c > 0.0 { 100.0 * (h / c).min(1.0) } else { 100.0 };
        println!(
            "gradient all-reduce hidden behind backward: DDP {:.0}% of {:.2} ms, ZeRO-1 {:.0}% of {:.2} ms; ZeRO-2's reduce-scatter runs after backward: 0% hidden",
            share(c, h),
            c * 1e3,
            share(c1, h1),
            c1 * 1e3
        );
        println!(
            "ZeRO-3 communication (gathers, reduce-scatters, the step's exchanges) hidden behind computation: {:.0}% of {:.2} ms (the training thread waited {:.2} ms)",
            share(busy3, (busy3 - waited3).max(0.0)),
            busy3 * 1e3,
            waited3 * 1e3
        );
    }
    go.send(0)?;
    z3.join().map_err(|_| "the ZeRO-3 thread panicked")?;
    for (_, z, _) in zeros {
        z.finish()?;
    }
    ddp.finish()?;
    Ok(())
}
