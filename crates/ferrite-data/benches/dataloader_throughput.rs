//! DataLoader throughput on a synthetic dataset, the Rust half of
//! `bench/dataloader_vs_pytorch.sh` (the Python half, `bench/dataloader_pytorch.py`, runs the same
//! workload through PyTorch's DataLoader).
//!
//! Workload: sample `i` busy-waits `--sample-us` microseconds (the "per-sample cost"), then
//! returns 784 `f32` values equal to `i` and the label `i % 10`; batches of `--batch-size` are
//! collated into one contiguous `[batch, 784]` buffer plus a label vector, as a tensor collate
//! does. One warm-up epoch, then `--epochs` timed epochs of `--batches` batches each; worker
//! start-up is inside the timed region. Prints batches per second for each worker count.
//!
//! `cargo bench -p ferrite-data --bench dataloader_throughput -- --workers 0,2 --sample-us 5`

use std::time::{Duration, Instant};

use ferrite_data::{collate_fn, BoxError, DataLoader, Dataset, Generator};

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

struct Args {
    workers: Vec<usize>,
    sample_us: u64,
    batches: usize,
    batch_size: usize,
    epochs: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { workers: vec![0, 2], sample_us: 5, batches: 500, batch_size: 64, epochs: 3 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--bench" => {}
            "--workers" => {
                a.workers = value()?.split(',').map(|w| w.trim().parse().map_err(|e| format!("--workers: {e}"))).collect::<Result<_, _>>()?
            }
            "--sample-us" => a.sample_us = value()?.parse().map_err(|e| format!("--sample-us: {e}"))?,
            "--batches" => a.batches = value()?.parse().map_err(|e| format!("--batches: {e}"))?,
            "--batch-size" => a.batch_size = value()?.parse().map_err(|e| format!("--batch-size: {e}"))?,
            "--epochs" => a.epochs = value()?.parse().map_err(|e| format!("--epochs: {e}"))?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}\nusage: dataloader_throughput [--workers 0,2] [--sample-us 5] [--batches 500] [--batch-size 64] [--epochs 3]");
            std::process::exit(2);
        }
    };
    for &workers in &args.workers {
        let dataset = Synthetic { len: args.batches * args.batch_size, cost: Duration::from_micros(args.sample_us) };
        let collate = collate_fn(|samples: Vec<(Vec<f32>, i64)>, _rng: &mut Generator| {
            let mut features = Vec::with_capacity(samples.len() * FEATURES);
            let mut labels = Vec::with_capacity(samples.len());
            for (x, y) in samples {
                features.extend_from_slice(&x);
                labels.push(y);
            }
            Ok((features, labels))
        });
        let mut loader = DataLoader::builder(dataset)
            .batch_size(args.batch_size)
            .shuffle(true)
            .seed(0)
            .num_workers(workers)
            .collate(collate)
            .build()
            .unwrap_or_else(|e| panic!("building the loader: {e}"));
        let mut checksum = 0.0f64;
        let mut run_epoch = |loader: &mut DataLoader<_, _>| {
            let start = Instant::now();
            let mut n = 0usize;
            for batch in loader.epoch() {
                let (features, labels): (Vec<f32>, Vec<i64>) = batch.unwrap_or_else(|e| panic!("{e}"));
                checksum += f64::from(features[0]) + labels.len() as f64;
                n += 1;
            }
            n as f64 / start.elapsed().as_secs_f64()
        };
        run_epoch(&mut loader); // warm-up
        let rates: Vec<f64> = (0..args.epochs).map(|_| run_epoch(&mut loader)).collect();
        let best = rates.iter().cloned().fold(0.0, f64::max);
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        println!(
            "ferrite workers={workers} batch_size={} sample_us={} batches/epoch={} batches/s mean={mean:.0} best={best:.0} (checksum {checksum:.0})",
            args.batch_size, args.sample_us, args.batches
        );
    }
}
