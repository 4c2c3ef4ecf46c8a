//! DataLoader throughput on a synthetic dataset, the Rust half of
//! `bench/dataloader_vs_pytorch.sh` (the Python half, `bench/dataloader_pytorch.py`, runs the same
//! workload through PyTorch's DataLoader).
//!
//! Workload: sample `i` busy-waits `--sample-us` microseconds (the "per-sample cost"), then
//! returns 784 `f32` values equal to `i` and the label `i % 10`. With `--collate tensor` (the
//! default, PyTorch's exact analogue) the sample is a `[784]` tensor and `StackCollate` stacks a
//! batch into `[batch, 784]` + `int64 [batch]` tensors; with `--collate buffer` samples are `Vec`s
//! concatenated into one host buffer. One warm-up epoch, then `--epochs` timed epochs of `--batches` batches each; worker
//! start-up is inside the timed region. Prints batches per second for each worker count.
//!
//! `cargo bench -p ferrite-data --bench dataloader_throughput -- --workers 0,2 --sample-us 5`

use std::time::{Duration, Instant};

use ferrite_data::{BoxError, DataLoader, Dataset, Generator, StackCollate, Tensor, collate_fn};
use ferrite_memory::Device;

const FEATURES: usize = 784;

struct Synthetic {
    len: usize,
    cost: Duration,
}

impl Dataset for Synthetic {
    type Sample = (Vec<f32>, i64);

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize, _rng: &mut Generator) -> Result<(Vec<f32>, i64), BoxError> {
        let end = Instant::now() + self.cost;
        while Instant::now() < end {
            std::hint::spin_loop();
        }
        Ok((vec![index as f32; FEATURES], (index % 10) as i64))
    }
}

/// The same samples as tensors, as PyTorch's `torch.full((784,), i)`.
struct SyntheticTensors(Synthetic);

impl Dataset for SyntheticTensors {
    type Sample = (Tensor, i64);

    fn len(&self) -> usize {
        self.0.len
    }

    fn get(&self, index: usize, rng: &mut Generator) -> Result<(Tensor, i64), BoxError> {
        let (x, y) = self.0.get(index, rng)?;
        Ok((Tensor::from_vec(x, &[FEATURES], &Device::Cpu)?, y))
    }
}

struct Args {
    workers: Vec<usize>,
    sample_us: u64,
    batches: usize,
    batch_size: usize,
    epochs: usize,
    tensor: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { workers: vec![0, 2], sample_us: 5, batches: 500, batch_size: 64, epochs: 3, tensor: true };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--bench" => {}
            "--workers" => {
                a.workers = value()?
                    .split(',')
                    .map(|w| w.trim().parse().map_err(|e| format!("--workers: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--sample-us" => a.sample_us = value()?.parse().map_err(|e| format!("--sample-us: {e}"))?,
            "--batches" => a.batches = value()?.parse().map_err(|e| format!("--batches: {e}"))?,
            "--batch-size" => a.batch_size = value()?.parse().map_err(|e| format!("--batch-size: {e}"))?,
            "--epochs" => a.epochs = value()?.parse().map_err(|e| format!("--epochs: {e}"))?,
            "--collate" => {
                a.tensor = match value()?.as_str() {
                    "tensor" => true,
                    "buffer" => false,
                    other => return Err(format!("--collate: expected tensor or buffer, got {other}")),
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "error: {e}\nusage: dataloader_throughput [--workers 0,2] [--sample-us 5] [--batches 500] [--batch-size 64] [--epochs 3] [--collate tensor|buffer]"
            );
            std::process::exit(2);
        }
    };
    for &workers in &args.workers {
        let dataset = Synthetic { len: args.batches * args.batch_size, cost: Duration::from_micros(args.sample_us) };
        let (mean, best, checksum) = if args.tensor {
            let loader = DataLoader::builder(SyntheticTensors(dataset)).collate(StackCollate);
            measure(loader, &args, workers, |(x, y): (Tensor, Tensor)| x.shape()[0] + y.shape()[0])
        } else {
            let collate = collate_fn(|samples: Vec<(Vec<f32>, i64)>, _rng: &mut Generator| {
                let mut features = Vec::with_capacity(samples.len() * FEATURES);
                let mut labels = Vec::with_capacity(samples.len());
                for (x, y) in samples {
                    features.extend_from_slice(&x);
                    labels.push(y);
                }
                Ok((features, labels))
            });
            let loader = DataLoader::builder(dataset).collate(collate);
            measure(loader, &args, workers, |(x, y): (Vec<f32>, Vec<i64>)| x.len() / FEATURES + y.len())
        };
        println!(
            "ferrite workers={workers} batch_size={} sample_us={} batches/epoch={} collate={} batches/s mean={mean:.0} best={best:.0} (checksum {checksum})",
            args.batch_size,
            args.sample_us,
            args.batches,
            if args.tensor { "tensor" } else { "buffer" }
        );
    }
}

/// One warm-up epoch, then `args.epochs` timed ones; returns (mean, best) batches/s and a checksum.
fn measure<D, C>(
    builder: ferrite_data::DataLoaderBuilder<D, C>,
    args: &Args,
    workers: usize,
    touch: impl Fn(C::Batch) -> usize,
) -> (f64, f64, usize)
where
    D: Dataset,
    C: ferrite_data::Collate<D::Sample>,
{
    let mut loader = builder
        .batch_size(args.batch_size)
        .shuffle(true)
        .seed(0)
        .num_workers(workers)
        .build()
        .unwrap_or_else(|e| panic!("building the loader: {e}"));
    let mut checksum = 0usize;
    let mut run_epoch = |loader: &mut DataLoader<D, C>| {
        let start = Instant::now();
        let mut n = 0usize;
        for batch in loader.epoch() {
            checksum += touch(batch.unwrap_or_else(|e| panic!("{e}")));
            n += 1;
        }
        n as f64 / start.elapsed().as_secs_f64()
    };
    run_epoch(&mut loader); // warm-up
    let rates: Vec<f64> = (0..args.epochs).map(|_| run_epoch(&mut loader)).collect();
    let best = rates.iter().cloned().fold(0.0, f64::max);
    (rates.iter().sum::<f64>() / rates.len() as f64, best, checksum)
}
