//! A run's figures as Prometheus metrics: names, types, units and help texts.
//!
//! Names follow Prometheus conventions: a `ferrite_` prefix, base units in the name
//! (`_bytes`, `_seconds`, `_ratio`), counters ending in `_total`, one `device` label for
//! allocator figures. `prometheus-client` writes the text format (escaping, histogram buckets,
//! `# HELP`/`# TYPE`); the figures themselves are read when a scraper asks (a `Collector`), so the
//! training thread never formats a metric.

use std::sync::Arc;

use ferrite_memory::Device;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::Serialize;

use super::run_figures::{DeviceFigures, LiveFigures, RunInfo, TrainFigures};

/// The `Content-Type` of what [`RunMetrics::encode_text`] returns.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The name every ferrite run exports (with labels `version`, `model`, `dataset`, `device`);
/// `ferrite monitor` refuses an endpoint without it.
pub const RUN_INFO_METRIC: &str = "ferrite_run_info";

/// Upper bounds of the step-time histogram, seconds (100 µs to 1 min).
const BATCH_BUCKETS: [f64; 17] =
    [1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0];
/// Upper bounds of the loader-wait histogram, seconds (1 µs to 10 s).
const WAIT_BUCKETS: [f64; 15] =
    [1e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1, 0.5, 1.0, 10.0];

/// Everything one run exports: the live figures, the two histograms, and the registry that
/// writes them out.
#[derive(Debug)]
pub struct RunMetrics {
    pub info: RunInfo,
    pub live: Arc<LiveFigures>,
    /// Wall time of each training batch: waiting for data, forward, backward, and the optimizer
    /// step when the batch ends one.
    pub batch_seconds: Histogram,
    /// Time each batch waited for the data loader.
    pub loader_wait_seconds: Histogram,
    devices: Vec<Device>,
    registry: Registry,
}

/// One JSON-lines record: the same figures as `/metrics`.
#[derive(Debug, Clone, Serialize)]
pub struct MetricsRecord {
    /// Seconds since the Unix epoch.
    pub time: f64,
    /// `start`, `progress` (every interval), `epoch_end`, `end`.
    pub event: &'static str,
    pub run: RunInfo,
    pub train: TrainFigures,
    pub devices: Vec<DeviceFigures>,
}

impl RunMetrics {
    /// Metrics of a run on `devices` (the training device first).
    pub fn new(info: RunInfo, devices: Vec<Device>) -> Arc<RunMetrics> {
        let live = Arc::new(LiveFigures::default());
        let batch_seconds = Histogram::new(BATCH_BUCKETS);
        let loader_wait_seconds = Histogram::new(WAIT_BUCKETS);
        let mut registry = Registry::with_prefix("ferrite");
        registry.register_collector(Box::new(FiguresCollector {
            info: info.clone(),
            live: live.clone(),
            batch_seconds: batch_seconds.clone(),
            loader_wait_seconds: loader_wait_seconds.clone(),
            devices: devices.clone(),
        }));
        Arc::new(RunMetrics { info, live, batch_seconds, loader_wait_seconds, devices, registry })
    }

    /// The Prometheus text format (version 0.0.4) of every metric now.
    pub fn encode_text(&self) -> String {
        let mut out = String::with_capacity(8192);
        // Writing into a String cannot fail; an encoder error would be a bug in a metric name.
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry) {
            out.push_str(&format!("# ferrite: encoding the metrics failed: {e}\n"));
        }
        out
    }

    /// The figures now, as one JSON-lines record.
    pub fn record(&self, event: &'static str) -> MetricsRecord {
        let time =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        MetricsRecord {
            time,
            event,
            run: self.info.clone(),
            train: self.train_figures(),
            devices: self.devices.iter().map(DeviceFigures::read).collect(),
        }
    }

    pub fn train_figures(&self) -> TrainFigures {
        TrainFigures::read(&self.live)
    }
}

/// Reads the live figures and the allocators at each scrape (and writes the histograms, which
/// share their counts with the ones the training thread observes into).
#[derive(Debug)]
struct FiguresCollector {
    info: RunInfo,
    live: Arc<LiveFigures>,
    batch_seconds: Histogram,
    loader_wait_seconds: Histogram,
    devices: Vec<Device>,
}

fn counter(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge<N: prometheus_client::encoding::EncodeGaugeValue + std::fmt::Debug>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    v: N,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A per-device metric family: one sample per device, labelled `device`.
fn per_device(
    encoder: &mut DescriptorEncoder<'_>,
    figures: &[DeviceFigures],
    name: &str,
    help: &str,
    metric_type: MetricType,
    value: impl Fn(&DeviceFigures) -> Option<u64>,
) -> Result<(), std::fmt::Error> {
    if figures.iter().all(|f| value(f).is_none()) {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
    for f in figures {
        let Some(v) = value(f) else { continue };
        let labels = [("device", f.device.as_str())];
        let metric = family.encode_family(&labels)?;
        match metric_type {
            MetricType::Counter => ConstCounter::new(v).encode(metric)?,
            _ => ConstGauge::new(v).encode(metric)?,
        }
    }
    Ok(())
}

impl Collector for FiguresCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let labels = [
            ("version", self.info.version.as_str()),
            ("model", self.info.model.as_str()),
            ("dataset", self.info.dataset.as_str()),
            ("device", self.info.device.as_str()),
        ];
        let info = e.encode_descriptor("run", "What this ferrite process trains, and where", None, MetricType::Info)?;
        let mut info = info;
        info.encode_info(&labels)?;

        let t = TrainFigures::read(&self.live);
        counter(
            &mut e,
            "train_steps",
            "Optimizer steps taken (a resumed run counts from its checkpoint)",
            t.steps_total,
        )?;
        counter(
            &mut e,
            "train_skipped_steps",
            "Optimizer steps the GradScaler skipped because gradients had inf or NaN",
            t.skipped_steps_total,
        )?;
        counter(&mut e, "train_samples", "Training samples processed by this process", t.samples_total)?;
        gauge(&mut e, "train_epoch", "The epoch running, 1-based (0 before the first)", t.epoch)?;
        gauge(&mut e, "train_epochs", "Epochs this run trains in total", t.epochs)?;
        if let Some(loss) = t.loss {
            gauge(&mut e, "train_loss", "Loss of the last training batch", loss)?;
        }
        if let Some(lr) = t.learning_rate {
            gauge(&mut e, "train_learning_rate", "Learning rate of the first parameter group", lr)?;
        }
        gauge(
            &mut e,
            "train_samples_per_second",
            "Training samples per second over the last window (about one second, or the epoch)",
            t.samples_per_second,
        )?;
        gauge(
            &mut e,
            "train_loader_wait_ratio",
            "Share of the last window's training time spent waiting for the data loader (near 1: the device is starved)",
            t.loader_wait_ratio,
        )?;
        if let Some(scale) = t.grad_scale {
            gauge(&mut e, "train_grad_scale", "The GradScaler's loss scale (f16 mixed precision)", scale)?;
        }
        let h = &self.batch_seconds;
        h.encode(e.encode_descriptor(
            "train_batch_duration_seconds",
            "Wall time of one training batch: waiting for data, forward, backward, and the optimizer step when the batch ends one",
            None,
            h.metric_type(),
        )?)?;
        let h = &self.loader_wait_seconds;
        h.encode(e.encode_descriptor(
            "train_loader_wait_seconds",
            "Time one training batch waited for the data loader",
            None,
            h.metric_type(),
        )?)?;

        let figures: Vec<DeviceFigures> = self.devices.iter().map(DeviceFigures::read).collect();
        type Pick = fn(&DeviceFigures) -> Option<u64>;
        let families: [(&str, &str, MetricType, Pick); 12] = [
            ("memory_allocated_bytes", "Bytes held by live tensors (memory_allocated)", MetricType::Gauge, |f| {
                Some(f.allocated_bytes)
            }),
            (
                "memory_reserved_bytes",
                "Bytes the caching allocator holds from the device (memory_reserved; what nvidia-smi shows)",
                MetricType::Gauge,
                |f| Some(f.reserved_bytes),
            ),
            (
                "memory_peak_allocated_bytes",
                "Peak of allocated bytes since the process started",
                MetricType::Gauge,
                |f| Some(f.peak_allocated_bytes),
            ),
            (
                "memory_peak_reserved_bytes",
                "Peak of reserved bytes since the process started",
                MetricType::Gauge,
                |f| Some(f.peak_reserved_bytes),
            ),
            (
                "memory_capacity_bytes",
                "What the allocator may reserve on the device in total (absent when unknown)",
                MetricType::Gauge,
                |f| f.capacity_bytes,
            ),
            (
                "memory_reserved_unallocated_bytes",
                "Reserved but unallocated bytes: cached free memory (fragmentation when requests do not fit it)",
                MetricType::Gauge,
                |f| Some(f.reserved_unallocated_bytes),
            ),
            (
                "memory_largest_free_block_bytes",
                "The largest cached free block; a larger request needs a new segment",
                MetricType::Gauge,
                |f| Some(f.largest_free_block_bytes),
            ),
            ("memory_segments", "Segments reserved from the device", MetricType::Gauge, |f| Some(f.segments)),
            ("memory_allocations", "Blocks handed out by the allocator", MetricType::Counter, |f| {
                Some(f.allocations_total)
            }),
            ("memory_frees", "Blocks returned to the allocator", MetricType::Counter, |f| Some(f.frees_total)),
            ("memory_ooms", "Allocations that ended in an out-of-memory error", MetricType::Counter, |f| {
                Some(f.ooms_total)
            }),
            (
                "memory_alloc_retries",
                "Allocations retried after releasing every cached block (a sign of memory pressure)",
                MetricType::Counter,
                |f| Some(f.alloc_retries_total),
            ),
        ];
        for (name, help, metric_type, pick) in families {
            per_device(&mut e, &figures, name, help, metric_type, pick)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::metrics_text::parse_metrics_text;

    fn metrics() -> Arc<RunMetrics> {
        let info = RunInfo {
            version: "0.1.0".into(),
            model: "mlp 4-2".into(),
            dataset: "digits".into(),
            device: "sim:1GiB:91".into(),
        };
        RunMetrics::new(info, vec![Device::parse("sim:1GiB:91").unwrap(), Device::Cpu])
    }

    #[test]
    fn exposition_has_conventional_names_and_parses_back() {
        let m = metrics();
        m.live.steps.store(7, std::sync::atomic::Ordering::Relaxed);
        m.live.loss.store(0.25);
        m.batch_seconds.observe(0.003);
        m.live.batches.store(1, std::sync::atomic::Ordering::Relaxed);
        let text = m.encode_text();
        for needle in [
            "# TYPE ferrite_run_info gauge",
            "ferrite_run_info{version=\"0.1.0\",model=\"mlp 4-2\",dataset=\"digits\",device=\"sim:1GiB:91\"} 1",
            "# TYPE ferrite_train_steps_total counter",
            "ferrite_train_steps_total 7",
            "ferrite_train_loss 0.25",
            "ferrite_memory_allocated_bytes{device=\"sim:1GiB:91\"}",
            "ferrite_memory_allocated_bytes{device=\"cpu\"}",
            "ferrite_memory_capacity_bytes{device=\"sim:1GiB:91\"} 1073741824",
            "# TYPE ferrite_memory_ooms_total counter",
            "ferrite_train_batch_duration_seconds_bucket{le=\"0.005\"} 1",
            "ferrite_train_batch_duration_seconds_count 1",
        ] {
            assert!(text.contains(needle), "missing `{needle}` in\n{text}");
        }
        assert!(!text.contains("ferrite_train_grad_scale"), "no scale without a GradScaler");
        let parsed = parse_metrics_text(&text).unwrap();
        assert_eq!(parsed.value("ferrite_train_steps_total", &[]), Some(7.0));
    }

    #[test]
    fn a_record_carries_the_same_figures() {
        let m = metrics();
        m.live.samples.store(640, std::sync::atomic::Ordering::Relaxed);
        m.live.loader_wait_seconds_total.store(0.5);
        let r = m.record("progress");
        assert_eq!(r.train.samples_total, 640);
        assert_eq!(r.train.loader_wait_seconds_total, 0.5);
        assert_eq!(r.devices.len(), 2);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["event"], "progress");
        assert_eq!(json["devices"][0]["device"], "sim:1GiB:91");
        assert_eq!(json["devices"][0]["capacity_bytes"], 1u64 << 30);
    }
}
