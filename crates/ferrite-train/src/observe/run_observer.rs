//! The one hook a training loop calls: [`RunObserver`].
//!
//! A trainer makes one with [`RunObserver::start`] (a no-op observer when no output was asked
//! for), wraps its loader's epoch iterator in [`RunObserver::time_loader`] (which measures how
//! long each batch waited for data), and reports each batch, each optimizer step and each epoch.
//! Every call is a few clock reads and atomic stores on the training thread; serving and writing
//! happen on background threads ([`super::metrics_server`], [`super::metrics_file`]).

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferrite_memory::Device;

use super::exposition::RunMetrics;
use super::metrics_file::MetricsFile;
use super::metrics_server::MetricsServer;
use super::{ObserveError, ObserveSettings};

pub use super::run_figures::RunInfo;

/// Samples per second and the loader-wait share are published after windows of this length
/// (and at each epoch's end).
const WINDOW: Duration = Duration::from_secs(1);

/// What an optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// False when the GradScaler skipped the step (inf/NaN gradients).
    pub applied: bool,
    pub learning_rate: f64,
    /// The GradScaler's scale after its update, when loss scaling is on.
    pub grad_scale: Option<f64>,
}

/// What one training batch did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchReport {
    pub samples: usize,
    pub loss: f64,
}

/// Reports a run to the outputs `ObserveSettings` asked for.
pub struct RunObserver {
    inner: Option<Inner>,
}

struct Inner {
    metrics: Arc<RunMetrics>,
    server: Option<MetricsServer>,
    file: Option<MetricsFile>,
    /// When the current batch started waiting for the loader, and how long it waited.
    batch_start: Cell<Option<(Instant, Duration)>>,
    window: Cell<Window>,
}

#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    /// End of the last batch in the window.
    last: Instant,
    samples: u64,
    wait: Duration,
}

impl Window {
    fn new(now: Instant) -> Window {
        Window { start: now, last: now, samples: 0, wait: Duration::ZERO }
    }
}

impl RunObserver {
    /// An observer that reports nowhere (every call is a branch on `None`).
    pub fn disabled() -> RunObserver {
        RunObserver { inner: None }
    }

    /// Start the outputs `args` asks for, reporting allocator figures of `devices` (the training
    /// device first). Fails, before any training, when an output cannot start (port in use,
    /// unwritable file).
    pub fn start(args: &ObserveSettings, info: RunInfo, devices: Vec<Device>) -> Result<RunObserver, ObserveError> {
        if !args.any() {
            return Ok(RunObserver::disabled());
        }
        let metrics = RunMetrics::new(info, devices);
        let server = args.metrics_addr.as_ref().map(|a| MetricsServer::start(a, metrics.clone())).transpose()?;
        let file = args.metrics_file.as_ref().map(|p| MetricsFile::start(p, metrics.clone())).transpose()?;
        let now = Instant::now();
        Ok(RunObserver {
            inner: Some(Inner {
                metrics,
                server,
                file,
                batch_start: Cell::new(None),
                window: Cell::new(Window::new(now)),
            }),
        })
    }

    /// The scrape URL, when serving.
    pub fn metrics_url(&self) -> Option<String> {
        self.inner.as_ref()?.server.as_ref().map(MetricsServer::url)
    }

    /// The shared figures.
    #[cfg(test)]
    pub fn metrics(&self) -> Option<&Arc<RunMetrics>> {
        self.inner.as_ref().map(|i| &i.metrics)
    }

    /// An epoch (1-based) of `epochs` begins; the throughput window restarts so evaluation time
    /// between epochs does not count as training.
    pub fn epoch_started(&self, epoch: usize, epochs: usize) {
        let Some(i) = &self.inner else { return };
        i.metrics.live.epoch.store(epoch as u64, Ordering::Relaxed);
        i.metrics.live.epochs.store(epochs as u64, Ordering::Relaxed);
        i.window.set(Window::new(Instant::now()));
    }

    /// Wrap an epoch's batches: each `next` is timed as loader wait.
    pub fn time_loader<I: Iterator>(&self, batches: I) -> TimedLoader<'_, I> {
        TimedLoader { observer: self, batches }
    }

    /// A batch was trained on (forward and backward done, and the optimizer step if it ended one).
    pub fn batch(&self, report: BatchReport) {
        let Some(i) = &self.inner else { return };
        let now = Instant::now();
        let live = &i.metrics.live;
        let wait = match i.batch_start.take() {
            Some((start, wait)) => {
                let secs = now.duration_since(start).as_secs_f64();
                i.metrics.batch_seconds.observe(secs);
                live.batches.fetch_add(1, Ordering::Relaxed);
                live.batch_seconds_total.store(live.batch_seconds_total.load() + secs);
                wait
            }
            None => Duration::ZERO,
        };
        live.samples.fetch_add(report.samples as u64, Ordering::Relaxed);
        live.loss.store(report.loss);
        let mut w = i.window.get();
        w.samples += report.samples as u64;
        w.wait += wait;
        w.last = now;
        if now.duration_since(w.start) >= WINDOW {
            publish(i, &w);
            w = Window::new(now);
        }
        i.window.set(w);
    }

    /// An optimizer step ran (or was skipped by the GradScaler).
    pub fn step(&self, report: StepReport) {
        let Some(i) = &self.inner else { return };
        let live = &i.metrics.live;
        if report.applied {
            live.steps.fetch_add(1, Ordering::Relaxed);
        } else {
            live.skipped_steps.fetch_add(1, Ordering::Relaxed);
        }
        live.learning_rate.store(report.learning_rate);
        live.grad_scale.store(report.grad_scale.unwrap_or(f64::NAN));
    }

    /// Set the step counter (a resumed run starts at its checkpoint's step).
    pub fn set_steps(&self, steps: u64) {
        let Some(i) = &self.inner else { return };
        i.metrics.live.steps.store(steps, Ordering::Relaxed);
    }

    /// The epoch's training is done: publish its last window and queue an `epoch_end` record.
    pub fn epoch_finished(&self) {
        let Some(i) = &self.inner else { return };
        let w = i.window.get();
        if w.samples > 0 {
            publish(i, &w);
        }
        i.window.set(Window::new(Instant::now()));
        if let Some(f) = &i.file {
            f.send(i.metrics.record("epoch_end"));
        }
    }

    /// The run is over: write the `end` record and stop serving.
    pub fn finish(self) {
        let Some(mut i) = self.inner else { return };
        i.metrics.live.finished.store(true, Ordering::Relaxed);
        if let Some(f) = i.file.take() {
            f.stop();
        }
        drop(i.server.take());
    }
}

/// Samples per second and the loader-wait share of window `w`.
fn publish(i: &Inner, w: &Window) {
    let secs = w.last.duration_since(w.start).as_secs_f64();
    if secs > 0.0 {
        i.metrics.live.samples_per_second.store(w.samples as f64 / secs);
        i.metrics.live.loader_wait_ratio.store((w.wait.as_secs_f64() / secs).min(1.0));
    }
}

/// An epoch iterator whose `next` is timed (see [`RunObserver::time_loader`]).
pub struct TimedLoader<'a, I> {
    observer: &'a RunObserver,
    batches: I,
}

impl<I: Iterator> Iterator for TimedLoader<'_, I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        let Some(i) = &self.observer.inner else { return self.batches.next() };
        let start = Instant::now();
        let item = self.batches.next();
        let wait = start.elapsed();
        if item.is_some() {
            let secs = wait.as_secs_f64();
            i.metrics.loader_wait_seconds.observe(secs);
            let live = &i.metrics.live;
            live.loader_wait_seconds_total.store(live.loader_wait_seconds_total.load() + secs);
            i.batch_start.set(Some((start, wait)));
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observer(dir: &std::path::Path) -> RunObserver {
        let args = ObserveSettings { metrics_addr: None, metrics_file: Some(dir.join("m.jsonl")) };
        let info = RunInfo { version: "v".into(), model: "m".into(), dataset: "d".into(), device: "cpu".into() };
        RunObserver::start(&args, info, vec![Device::Cpu]).unwrap()
    }

    #[test]
    fn batches_steps_and_waits_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let run = observer(dir.path());
        run.epoch_started(1, 3);
        let slow = (0..3).inspect(|_| std::thread::sleep(Duration::from_millis(20)));
        for _ in run.time_loader(slow) {
            run.batch(BatchReport { samples: 8, loss: 0.5 });
            run.step(StepReport { applied: true, learning_rate: 1e-3, grad_scale: None });
        }
        run.step(StepReport { applied: false, learning_rate: 1e-3, grad_scale: Some(32768.0) });
        run.epoch_finished();
        let m = run.metrics().unwrap().clone();
        let t = m.train_figures();
        assert_eq!((t.samples_total, t.steps_total, t.skipped_steps_total, t.epoch, t.epochs), (24, 3, 1, 1, 3));
        assert_eq!(t.batches_total, 3);
        assert!(t.loader_wait_seconds_total >= 0.06, "{t:?}");
        // Nearly all of each batch was spent waiting for data.
        assert!(t.loader_wait_ratio > 0.8 && t.loader_wait_ratio <= 1.0, "{t:?}");
        assert!(t.samples_per_second > 0.0 && t.samples_per_second < 8.0 / 0.02 * 1.01, "{t:?}");
        assert_eq!(t.grad_scale, Some(32768.0));
        run.finish();
        let lines = std::fs::read_to_string(dir.path().join("m.jsonl")).unwrap();
        let last: serde_json::Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
        assert_eq!(last["event"], "end");
        assert_eq!(last["train"]["samples_total"], 24);
    }

    #[test]
    fn a_disabled_observer_passes_batches_through() {
        let run = RunObserver::disabled();
        assert_eq!(run.time_loader(0..5).sum::<i32>(), 10);
        run.batch(BatchReport { samples: 1, loss: 1.0 });
        assert!(run.metrics().is_none() && run.metrics_url().is_none());
        run.finish();
    }
}
