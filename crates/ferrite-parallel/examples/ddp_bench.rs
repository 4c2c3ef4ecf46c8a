//! DistributedDataParallel figures for BENCHMARKS.md. Run under MPI, one thread per rank:
//!
//! ```text
//! cargo build --release -p ferrite-parallel --features mpi --example ddp_bench
//! RAYON_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 1 -x RAYON_NUM_THREADS target/release/examples/ddp_bench
//! RAYON_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 -x RAYON_NUM_THREADS target/release/examples/ddp_bench
//! ```
//!
//! Prints (rank 0): the transformer step's samples/s, the time of a local backward, of a backward
//! with the bucketed all-reduce overlapping it, and of the same all-reduce alone (how much of it
//! hides behind backward), and bucketed vs one plain MPI_Allreduce of the same bytes.

use std::time::Instant;

use ferrite_nn::{Linear, Module, Sequential, TransformerBlock, TransformerConfig};
use ferrite_optim::{AdamConfig, AdamRule, Optim, Optimizer};
use ferrite_parallel::distributed::{DdpOptions, DistributedDataParallel, ProcessGroup};
use ferrite_tensor::{DType, Device, Generator, Tensor};

const D_MODEL: usize = 128;
const SEQ: usize = 64;
const LOCAL_BATCH: usize = 8;
const WARMUP: usize = 2;
const STEPS: usize = 10;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn model() -> Res<Sequential> {
    let mut g = Generator::new(1);
    let cfg = TransformerConfig::new(D_MODEL, 4).dim_feedforward(4 * D_MODEL).dropout(0.0).causal(true);
    Ok(Sequential::new()
        .append(TransformerBlock::new_with(cfg.clone(), &Device::Cpu, &mut g)?)
        .append(TransformerBlock::new_with(cfg, &Device::Cpu, &mut g)?)
        .append(Linear::new_with(D_MODEL, D_MODEL, true, &Device::Cpu, &mut g)?))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Res<()> {
    let group = ProcessGroup::init()?;
    let (rank, world) = (group.rank(), group.world_size());
    let ddp = DistributedDataParallel::new(model()?, &group, DdpOptions::default())?;
    let params = ddp.module().parameters();
    let bytes: usize = params.iter().map(|p| p.numel() * 4).sum();
    let mut opt = Optim::<AdamRule>::new(params.clone(), AdamConfig::adamw(1e-3))?;
    let mut g = Generator::new(100 + rank as u64);
    let x = Tensor::randn_with(&[LOCAL_BATCH, SEQ, D_MODEL], DType::F32, &Device::Cpu, &mut g)?;
    let y = Tensor::randn_with(&[LOCAL_BATCH, SEQ, D_MODEL], DType::F32, &Device::Cpu, &mut g)?;
    let loss_of = |ddp: &DistributedDataParallel<Sequential>| -> Res<Tensor> {
        let d = ddp.forward(&x)?.sub(&y)?;
        Ok(d.mul(&d)?.mean()?)
    };

    // Full steps: samples/s of this world size.
    let mut step_s = Vec::new();
    for i in 0..WARMUP + STEPS {
        let t = Instant::now();
        let loss = loss_of(&ddp)?;
        ddp.backward(&loss)?;
        opt.step()?;
        opt.zero_grad()?;
        if i >= WARMUP {
            step_s.push(t.elapsed().as_secs_f64());
        }
    }
    let step = median(step_s);

    // Backward alone (no communication) and backward with the overlapped all-reduce.
    let (mut local, mut synced, mut bucketed, mut plain) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..STEPS {
        opt.zero_grad()?;
        let loss = loss_of(&ddp)?;
        let t = Instant::now();
        {
            let _n = ddp.no_sync();
            ddp.backward(&loss)?;
        }
        local.push(t.elapsed().as_secs_f64());
        opt.zero_grad()?;
        let loss = loss_of(&ddp)?;
        let t = Instant::now();
        ddp.backward(&loss)?;
        synced.push(t.elapsed().as_secs_f64());
        // The all-reduce alone: every bucket from the gradients now held (status word included).
        let t = Instant::now();
        ddp_sync(&ddp)?;
        bucketed.push(t.elapsed().as_secs_f64());
        // One plain MPI_Allreduce of the same bytes.
        let flat: Vec<f32> = vec![1.0; bytes / 4];
        let t = Instant::now();
        group.comm().all_reduce_sum(flat)?.wait()?;
        plain.push(t.elapsed().as_secs_f64());
    }
    let (local, synced, bucketed, plain) = (median(local), median(synced), median(bucketed), median(plain));
    let exposed = (synced - local).max(0.0);
    if rank == 0 {
        println!(
            "world {world}, {} buckets, gradients {:.2} MiB, local batch {LOCAL_BATCH} x seq {SEQ} x d_model {D_MODEL}",
            ddp.bucket_sizes().len(),
            bytes as f64 / (1 << 20) as f64
        );
        println!("step {:.1} ms, {:.1} samples/s (all ranks)", step * 1e3, (world * LOCAL_BATCH) as f64 / step);
        println!(
            "backward local {:.1} ms, with all-reduce {:.1} ms; all-reduce alone {:.2} ms: {:.0}% hidden behind backward",
            local * 1e3,
            synced * 1e3,
            bucketed * 1e3,
            if bucketed > 0.0 { 100.0 * (1.0 - (exposed / bucketed).min(1.0)) } else { 100.0 }
        );
        println!(
            "bucketed all-reduce {:.2} ms vs plain MPI_Allreduce {:.2} ms of the same bytes: {:.0}% of plain's speed",
            bucketed * 1e3,
            plain * 1e3,
            100.0 * plain / bucketed
        );
    }
    ddp.finish()?;
    Ok(())
}

/// Average the gradients held now through the buckets (GradientSync::synchronize).
fn ddp_sync(ddp: &DistributedDataParallel<Sequential>) -> Res<()> {
    ddp.synchronize()?;
    Ok(())
}
