//! A scraped `/metrics` read back into the figures a run exported ([`TrainFigures`],
//! [`DeviceFigures`]): the monitor shows the same structures the run filled, so a name changed
//! on one side and not the other fails a test rather than showing an empty column.

use ferrite_train::observe::RunInfo;
use ferrite_train::observe::exposition::RUN_INFO_METRIC;
use ferrite_train::observe::metrics_text::MetricsText;
use ferrite_train::observe::run_figures::{DeviceFigures, TrainFigures};

/// What one scrape says about a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunView {
    pub info: RunInfo,
    pub train: TrainFigures,
    /// The training device first, as the run lists them.
    pub devices: Vec<DeviceFigures>,
}

impl RunView {
    /// Read a parsed exposition; an error says why it is not a ferrite run's.
    pub fn from_metrics(m: &MetricsText) -> Result<RunView, String> {
        let Some(info) = m.find(RUN_INFO_METRIC, &[]) else {
            return Err(if m.samples.iter().any(|s| s.name.starts_with("ferrite_")) {
                format!("it has ferrite_ metrics but no `{RUN_INFO_METRIC}` (a ferrite of another version?)")
            } else if m.samples.is_empty() {
                "its answer has no metrics at all".to_string()
            } else {
                format!(
                    "it serves {} Prometheus samples, none of them ferrite's (no `{RUN_INFO_METRIC}`): another exporter on that port?",
                    m.samples.len()
                )
            });
        };
        let label = |k: &str| info.label(k).unwrap_or("?").to_string();
        let info = RunInfo {
            version: label("version"),
            model: label("model"),
            dataset: label("dataset"),
            device: label("device"),
        };
        let req = |name: &str| m.value(name, &[]).ok_or_else(|| format!("`{name}` is missing from its answer"));
        let opt = |name: &str| m.value(name, &[]).filter(|v| v.is_finite());
        let train = TrainFigures {
            steps_total: count(req("ferrite_train_steps_total")?, "ferrite_train_steps_total")?,
            skipped_steps_total: count(req("ferrite_train_skipped_steps_total")?, "ferrite_train_skipped_steps_total")?,
            samples_total: count(req("ferrite_train_samples_total")?, "ferrite_train_samples_total")?,
            epoch: count(req("ferrite_train_epoch")?, "ferrite_train_epoch")?,
            epochs: count(req("ferrite_train_epochs")?, "ferrite_train_epochs")?,
            loss: opt("ferrite_train_loss"),
            learning_rate: opt("ferrite_train_learning_rate"),
            samples_per_second: req("ferrite_train_samples_per_second")?,
            loader_wait_ratio: req("ferrite_train_loader_wait_ratio")?,
            grad_scale: opt("ferrite_train_grad_scale"),
            batches_total: count(
                req("ferrite_train_batch_duration_seconds_count")?,
                "ferrite_train_batch_duration_seconds_count",
            )?,
            batch_seconds_total: req("ferrite_train_batch_duration_seconds_sum")?,
            loader_wait_seconds_total: req("ferrite_train_loader_wait_seconds_sum")?,
        };
        let mut devices = Vec::new();
        for s in m.all("ferrite_memory_allocated_bytes") {
            let Some(device) = s.label("device") else {
                return Err("`ferrite_memory_allocated_bytes` has a sample without a `device` label".into());
            };
            let get = |name: &str| -> Result<u64, String> {
                let v = m
                    .value(name, &[("device", device)])
                    .ok_or_else(|| format!("`{name}` is missing for device {device}"))?;
                count(v, name)
            };
            devices.push(DeviceFigures {
                device: device.to_string(),
                allocated_bytes: count(s.value, "ferrite_memory_allocated_bytes")?,
                reserved_bytes: get("ferrite_memory_reserved_bytes")?,
                peak_allocated_bytes: get("ferrite_memory_peak_allocated_bytes")?,
                peak_reserved_bytes: get("ferrite_memory_peak_reserved_bytes")?,
                capacity_bytes: m
                    .value("ferrite_memory_capacity_bytes", &[("device", device)])
                    .map(|v| count(v, "ferrite_memory_capacity_bytes"))
                    .transpose()?,
                reserved_unallocated_bytes: get("ferrite_memory_reserved_unallocated_bytes")?,
                largest_free_block_bytes: get("ferrite_memory_largest_free_block_bytes")?,
                segments: get("ferrite_memory_segments")?,
                allocations_total: get("ferrite_memory_allocations_total")?,
                frees_total: get("ferrite_memory_frees_total")?,
                ooms_total: get("ferrite_memory_ooms_total")?,
                alloc_retries_total: get("ferrite_memory_alloc_retries_total")?,
            });
        }
        if devices.is_empty() {
            return Err("it reports no device memory (`ferrite_memory_allocated_bytes`)".into());
        }
        Ok(RunView { info, train, devices })
    }

    /// The training device's figures.
    pub fn main_device(&self) -> &DeviceFigures {
        self.devices.iter().find(|d| d.device == self.info.device).unwrap_or(&self.devices[0])
    }
}

/// A count or byte figure: finite, non-negative, whole.
fn count(v: f64, name: &str) -> Result<u64, String> {
    if v.is_finite() && v >= 0.0 && v <= u64::MAX as f64 {
        Ok(v as u64)
    } else {
        Err(format!("`{name}` has the value {v}, not a count"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_memory::Device;
    use ferrite_train::observe::exposition::RunMetrics;
    use ferrite_train::observe::metrics_text::parse_metrics_text;
    use proptest::prelude::*;

    #[test]
    fn what_a_run_exports_reads_back_identically() {
        let dev = Device::parse("sim:t4-16gb:5").unwrap();
        let info = RunInfo {
            version: "0.1.0".into(),
            model: "mlp 2-3".into(),
            dataset: "digits".into(),
            device: dev.to_string(),
        };
        let m = RunMetrics::new(info.clone(), vec![dev.clone(), Device::Cpu]);
        let _held = ferrite_memory::allocator(&dev).allocate(5 << 20).unwrap();
        m.live.loss.store(1.25);
        m.live.grad_scale.store(65536.0);
        m.batch_seconds.observe(0.01);
        m.live.batches.store(1, std::sync::atomic::Ordering::Relaxed);
        m.live.batch_seconds_total.store(0.01);
        m.loader_wait_seconds.observe(0.002);
        m.live.loader_wait_seconds_total.store(0.002);
        let record = m.record("progress");
        let view = RunView::from_metrics(&parse_metrics_text(&m.encode_text()).unwrap()).unwrap();
        assert_eq!(view.info, info);
        assert_eq!(view.train, record.train);
        assert_eq!(view.devices[0], record.devices[0]);
        assert_eq!(view.main_device().allocated_bytes, 5 << 20);
        assert_eq!(view.devices[1].device, "cpu");
    }

    #[test]
    fn another_exporter_is_named_as_such() {
        let node = parse_metrics_text("# TYPE node_load1 gauge\nnode_load1 0.5\nup 1\n").unwrap();
        let e = RunView::from_metrics(&node).unwrap_err();
        assert!(e.contains("none of them ferrite's") && e.contains("2 Prometheus samples"), "{e}");
        let e = RunView::from_metrics(&MetricsText::default()).unwrap_err();
        assert!(e.contains("no metrics"), "{e}");
        let partial = parse_metrics_text("ferrite_run_info{device=\"cpu\"} 1\n").unwrap();
        let e = RunView::from_metrics(&partial).unwrap_err();
        assert!(e.contains("ferrite_train_steps_total") && e.contains("missing"), "{e}");
    }

    proptest! {
        /// Any parsed exposition (here: ferrite's own with values replaced by arbitrary ones)
        /// gives a view or an error, never a panic.
        #[test]
        fn arbitrary_values_never_panic(values in proptest::collection::vec(any::<f64>(), 64)) {
            let m = RunMetrics::new(
                RunInfo { version: "v".into(), model: "m".into(), dataset: "d".into(), device: "cpu".into() },
                vec![Device::Cpu],
            );
            let mut parsed = parse_metrics_text(&m.encode_text()).unwrap();
            for (s, v) in parsed.samples.iter_mut().zip(values) {
                s.value = v;
            }
            let _ = RunView::from_metrics(&parsed);
        }
    }
}
