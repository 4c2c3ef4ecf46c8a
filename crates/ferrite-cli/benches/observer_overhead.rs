//! What watching a run costs the training thread: the [`RunObserver`] calls a trainer makes per
//! batch (a timed loader `next`, `batch`, `step`), without outputs, with the metrics endpoint and
//! file on, and with a scraper hammering `/metrics` from another thread the whole time; and what
//! one scrape costs the server thread (encoding every metric, reading two allocators).
//!
//! Run: `cargo bench -p ferrite-cli --bench observer_overhead`
//! Compare the per-batch figures with a digits batch (≈ 200 µs: the epoch time `ferrite train`
//! prints divided by its 23 batches plus evaluation); `bench/metrics_overhead.py` measures the
//! whole epoch end to end.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ferrite_memory::Device;
use ferrite_train::observe::exposition::RunMetrics;
use ferrite_train::observe::metrics_addr::parse_listen_addr;
use ferrite_train::observe::{BatchReport, ObserveSettings, RunInfo, RunObserver, StepReport};

fn info() -> RunInfo {
    RunInfo { version: "bench".into(), model: "mlp".into(), dataset: "digits".into(), device: "cpu".into() }
}

/// One batch's worth of observer calls, as `ferrite train` makes them.
fn one_batch(run: &RunObserver) {
    for x in run.time_loader(std::iter::once(black_box(1u32))) {
        black_box(x);
        run.step(StepReport { applied: true, learning_rate: 1e-3, grad_scale: None });
        run.batch(BatchReport { samples: 64, loss: black_box(0.5) });
    }
}

fn per_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("observer_per_batch");
    let off = RunObserver::disabled();
    g.bench_function("off", |b| b.iter(|| one_batch(&off)));

    let dir = tempfile::tempdir().unwrap();
    let args = ObserveSettings {
        metrics_addr: Some(parse_listen_addr("127.0.0.1:0").unwrap()),
        metrics_file: Some(dir.path().join("run.jsonl")),
    };
    let on = RunObserver::start(&args, info(), vec![Device::Cpu]).unwrap();
    on.epoch_started(1, 1);
    g.bench_function("serving_idle", |b| b.iter(|| one_batch(&on)));

    // A scraper that never pauses: the worst contention the training thread can see.
    let url = on.metrics_url().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let agent = ureq::Agent::config_builder().proxy(None).build().new_agent();
            let mut scrapes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut r) = agent.get(&url).call() {
                    let _ = r.body_mut().read_to_string();
                    scrapes += 1;
                }
            }
            scrapes
        })
    };
    g.bench_function("serving_scraped_continuously", |b| b.iter(|| one_batch(&on)));
    stop.store(true, Ordering::Relaxed);
    let scrapes = scraper.join().unwrap();
    eprintln!("({scrapes} scrapes answered during serving_scraped_continuously)");
    g.finish();
    on.finish();
}

fn scrape(c: &mut Criterion) {
    let m = RunMetrics::new(info(), vec![Device::parse("sim:a100-40gb").unwrap(), Device::Cpu]);
    c.bench_function("encode_metrics_two_devices", |b| b.iter(|| black_box(m.encode_text())));
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = per_batch, scrape
}
criterion_main!(benches);
