//! `ferrite memory plot`: the timelines of a ferrite trace (replayed) or of a PyTorch snapshot
//! (as recorded, and replayed under each `--alloc-conf` given), drawn by [`crate::plot`].
use std::fmt::Write;
use std::path::Path;

use ferrite_io::{DeviceReplayTrace, TorchSnapshot};
use ferrite_memory::replay::{Trace, replay_timeline};
use ferrite_memory::{AllocatorConfig, Device, format_size};

use super::{OutputResult, is_pickle, parse_alloc_conf, read_ferrite_trace, trace_device};
use crate::plot::{DeviceTimeline, PlotError, PlotFormat, TimelinePoint};

/// Builds the timelines of `trace` and writes the picture to `output` in the format its extension
/// names (`.svg`, `.html`, `.png`; `html` insists on HTML); returns the summary line.
pub fn plot_output(
    trace: &Path,
    output: &Path,
    html: bool,
    device: Option<String>,
    alloc_conf: &[String],
) -> OutputResult {
    // The output's format is checked before anything is read or replayed.
    let format = PlotFormat::from_path(output)?;
    if html && format != PlotFormat::Html {
        return Err(PlotError::HtmlFlagConflict { path: output.to_path_buf(), found: format.article_name() }.into());
    }
    let configs = alloc_conf.iter().map(|s| parse_alloc_conf(s)).collect::<Result<Vec<_>, _>>()?;
    let mut timelines = Vec::new();
    if is_pickle(trace)? {
        let snap = TorchSnapshot::read(trace).map_err(|e| format!("{}: {e}", trace.display()))?;
        let replay_device = Device::parse(device.as_deref().unwrap_or("meta"))?;
        for t in snap.replay_traces().map_err(|e| format!("{}: {e}", trace.display()))? {
            timelines.push(snapshot_timeline(&t));
            for config in &configs {
                let label = format!("device {} replayed on {replay_device}", t.device);
                timelines.push(replayed(&t.trace, &replay_device, config, label)?);
            }
        }
    } else {
        let t = read_ferrite_trace(trace)?;
        let device = trace_device(&t, device)?;
        let configs = if configs.is_empty() { vec![AllocatorConfig::from_env()?] } else { configs };
        for config in &configs {
            timelines.push(replayed(&t, &device, config, device.to_string())?);
        }
    }
    let title = format!("memory timeline of {}", trace.display());
    let doc = crate::plot::render(&timelines, format, &title)?;
    ferrite_io::write_atomically(output, |f| std::io::Write::write_all(f, &doc))?;
    let mut out = String::new();
    write!(out, "wrote {} ({} bytes):", output.display(), doc.len())?;
    for tl in &timelines {
        let peak_res = tl.points.iter().map(|p| p.reserved).max().unwrap_or(0);
        let peak_alloc = tl.points.iter().map(|p| p.allocated).max().unwrap_or(0);
        write!(
            out,
            " {}: peak reserved {}, peak allocated {};",
            tl.label,
            format_size(peak_res),
            format_size(peak_alloc)
        )?;
    }
    out.pop();
    out.push('\n');
    Ok(out)
}

/// `trace` replayed on `device` under `config`, one point per event.
fn replayed(
    trace: &Trace,
    device: &Device,
    config: &AllocatorConfig,
    label: String,
) -> Result<DeviceTimeline, ferrite_memory::MemoryError> {
    let capacity = match device {
        Device::Sim { profile, .. } => Some(profile.usable_bytes()),
        _ => None,
    };
    let conf = config.to_string();
    let label = format!("{label}, alloc conf {}", if conf.is_empty() { "default" } else { conf.as_str() });
    let (_, points) = replay_timeline(trace, device.clone(), config.clone())?;
    Ok(DeviceTimeline {
        label,
        capacity,
        x_label: "replayed event".into(),
        categories: Vec::new(),
        points: points
            .iter()
            .map(|p| TimelinePoint {
                t: p.event_index as f64,
                allocated: p.allocated,
                reserved: p.reserved,
                by_category: Vec::new(),
            })
            .collect(),
    })
}

/// One device of a snapshot, as recorded; time in ms from the first entry when the snapshot has
/// times (PyTorch 2.1+), else the entry index.
fn snapshot_timeline(t: &DeviceReplayTrace) -> DeviceTimeline {
    let timed = !t.recorded.is_empty() && t.recorded.iter().all(|p| p.time_us.is_some());
    let t0 = t.recorded.first().and_then(|p| p.time_us).unwrap_or(0);
    DeviceTimeline {
        label: format!("device {} (as recorded)", t.device),
        capacity: None,
        x_label: if timed { "time (ms)".into() } else { "trace entry".into() },
        categories: t.categories.clone(),
        points: t
            .recorded
            .iter()
            .map(|p| TimelinePoint {
                t: match (timed, p.time_us) {
                    (true, Some(us)) => (us - t0) as f64 / 1000.0,
                    _ => p.index as f64,
                },
                allocated: p.allocated,
                reserved: p.reserved,
                by_category: p.by_category.clone(),
            })
            .collect(),
    }
}
