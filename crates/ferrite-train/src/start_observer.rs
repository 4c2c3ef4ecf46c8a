//! The run's metrics outputs started for a training run and announced on stdout.
use ferrite_tensor::Device;

use crate::error::TrainError;
use crate::observe::{ObserveSettings, RunInfo, RunObserver};

/// The run's metrics outputs (`--metrics-addr`, `--metrics-file`), announced on stdout.
pub fn start_observer(
    observe: &ObserveSettings,
    model: String,
    dataset: &str,
    device: &Device,
) -> Result<RunObserver, TrainError> {
    let info = RunInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        model,
        dataset: dataset.to_string(),
        device: device.to_string(),
    };
    // Batches are collated on the host before they are staged to the device: report both.
    let mut devices = vec![device.clone()];
    if *device != Device::Cpu {
        devices.push(Device::Cpu);
    }
    let run = RunObserver::start(observe, info, devices)?;
    if let Some(url) = run.metrics_url() {
        println!("  metrics: serving {url}");
    }
    if let Some(path) = &observe.metrics_file {
        println!("  metrics: appending JSON lines to {}", path.display());
    }
    Ok(run)
}
