//! ZeRO-1 and ZeRO-2 against DDP, same model and step as `ddp_bench`, for BENCHMARKS.md. Run
//! under MPI, one thread per rank:
//!
//! ```text
//! cargo build --release -p ferrite-parallel --features mpi --example zero_bench
//! RAYON_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 -x RAYON_NUM_THREADS target/release/examples/zero_bench --steps 30
//! ```
//!
//! Three replicas of the model are built (identical weights), one wrapped by DDP, one by ZeRO-1,
//! one by ZeRO-2, and their full training steps (forward, backward with the gradient exchange,
//! AdamW step; under ZeRO the sharded step with its all-gather) are timed in alternating blocks
//! of 5 so that all three see the same load on a shared machine. Prints (rank 0; a step's time is
//! the slower rank's median) samples/s of each and ZeRO's throughput relative to DDP's, and for
//! DDP and ZeRO-1 (whose gradient all-reduce runs in DDP's buckets during backward) the share of
//! the all-reduce hidden behind backward. ZeRO-2's reduce-scatter runs after backward (see
//! `grad_reduce_scatter.rs`): nothing of it is hidden.

use std::time::Instant;

use ferrite_nn::{Module, Sequential};
use ferrite_optim::{AdamConfig, AdamRule, Optim, Optimizer};
use ferrite_parallel::distributed::{
    DdpOptions, DistributedDataParallel, ProcessGroup, ZeroOptions, ZeroRedundancy, ZeroStage,
};
use ferrite_tensor::Tensor;

#[path = "bench_common/mod.rs"]
mod bench_common;

use bench_common::{D_MODEL, LOCAL_BATCH, Res, SEQ, WARMUP, median, model, rank_batch, slowest};

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
    let loss_of = |m: &Sequential| -> Res<Tensor> {
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
    let zero_step = |(m, z, opt): &mut (Sequential, ZeroRedundancy, Optim<AdamRule>)| -> Res<(f64, f64, f64)> {
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
    }
    let (mut t_ddp, mut t_z1, mut t_z2, mut comm_ddp, mut hidden_ddp, mut comm_z1, mut hidden_z1) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
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
        done += block;
    }
    let (s_ddp, s_z1, s_z2) =
        (slowest(&comm, median(t_ddp))?, slowest(&comm, median(t_z1))?, slowest(&comm, median(t_z2))?);
    let (c, h, c1, h1) = (median(comm_ddp), median(hidden_ddp), median(comm_z1), median(hidden_z1));
    if rank == 0 {
        let sps = |s: f64| (world * LOCAL_BATCH) as f64 / s;
        println!("world {world}, local batch {LOCAL_BATCH} x seq {SEQ} x d_model {D_MODEL}, {steps} steps each");
        println!("DDP    step {:.1} ms, {:.1} samples/s", s_ddp * 1e3, sps(s_ddp));
        println!("ZeRO-1 step {:.1} ms, {:.1} samples/s: {:.2}x DDP's throughput", s_z1 * 1e3, sps(s_z1), s_ddp / s_z1);
        println!("ZeRO-2 step {:.1} ms, {:.1} samples/s: {:.2}x DDP's throughput", s_z2 * 1e3, sps(s_z2), s_ddp / s_z2);
        let share = |c: f64, h: f64| if c > 0.0 { 100.0 * (h / c).min(1.0) } else { 100.0 };
        println!(
            "gradient all-reduce hidden behind backward: DDP {:.0}% of {:.2} ms, ZeRO-1 {:.0}% of {:.2} ms; ZeRO-2's reduce-scatter runs after backward: 0% hidden",
            share(c, h),
            c * 1e3,
            share(c1, h1),
            c1 * 1e3
        );
    }
    for (_, z, _) in zeros {
        z.finish()?;
    }
    ddp.finish()?;
    Ok(())
}
