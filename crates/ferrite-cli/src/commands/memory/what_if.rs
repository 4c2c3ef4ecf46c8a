//! The what-if comparison: one trace replayed under several allocator configurations, side by
//! side with what a PyTorch snapshot recorded — "would `expandable_segments` or
//! `max_split_size_mb` have saved my run?".
use std::fmt::Write;
use std::path::Path;

use ferrite_io::TorchSnapshot;
use ferrite_memory::replay::{Trace, WhatIf, what_if};
use ferrite_memory::{Device, format_size};
use serde_json::json;

use super::{OutputResult, is_pickle, parse_alloc_conf, read_ferrite_trace, trace_device};

/// Configurations compared when a snapshot is replayed without `--alloc-conf`.
const DEFAULT_WHAT_IFS: [&str; 2] = ["expandable_segments:True", "max_split_size_mb:128"];

/// What the snapshot itself recorded for one device.
struct Recorded {
    peak_reserved: u64,
    peak_allocated: u64,
    ooms: usize,
}

/// One device's comparison.
struct DeviceRows {
    device: usize,
    trace_events: usize,
    allocated_before_trace: usize,
    recorded: Option<Recorded>,
    rows: Vec<WhatIf>,
    ignored: Vec<(String, usize)>,
}

/// The text (or JSON) of `ferrite memory replay` for a snapshot pickle or several configurations.
pub fn what_if_output(path: &Path, device: Option<String>, alloc_conf: &[String], json: bool) -> OutputResult {
    let (source, replay_device, devices) = if is_pickle(path)? {
        let snap = TorchSnapshot::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let replay_device = Device::parse(device.as_deref().unwrap_or("meta"))?;
        let mut specs: Vec<String> = alloc_conf.to_vec();
        if specs.is_empty() {
            specs.push(snap.alloc_conf.clone().unwrap_or_default());
            specs.extend(DEFAULT_WHAT_IFS.iter().map(|s| s.to_string()));
        }
        let configs = specs.iter().map(|s| parse_alloc_conf(s)).collect::<Result<Vec<_>, _>>()?;
        let mut devices = Vec::new();
        for t in snap.replay_traces().map_err(|e| format!("{}: {e}", path.display()))? {
            let rows = what_if(&t.trace, &replay_device, &configs)?;
            devices.push(DeviceRows {
                device: t.device,
                trace_events: t.recorded.len(),
                allocated_before_trace: t.allocated_before_trace,
                recorded: Some(Recorded {
                    peak_reserved: t.recorded_peak_reserved(),
                    peak_allocated: t.recorded_peak_allocated(),
                    ooms: t.recorded_ooms,
                }),
                rows,
                ignored: t.ignored_actions.into_iter().collect(),
            });
        }
        (format!("PyTorch memory snapshot ({})", snap.format), replay_device, devices)
    } else {
        let trace: Trace = read_ferrite_trace(path)?;
        let replay_device = trace_device(&trace, device)?;
        let configs = alloc_conf.iter().map(|s| parse_alloc_conf(s)).collect::<Result<Vec<_>, _>>()?;
        let rows = what_if(&trace, &replay_device, &configs)?;
        let d = DeviceRows {
            device: 0,
            trace_events: trace.events.len(),
            allocated_before_trace: 0,
            recorded: None,
            rows,
            ignored: Vec::new(),
        };
        ("ferrite trace".to_string(), replay_device, vec![d])
    };
    if json {
        return Ok(serde_json::to_string_pretty(&to_json(path, &source, &replay_device, &devices))? + "\n");
    }
    text(path, &source, &replay_device, &devices)
}

fn label(conf: &str) -> String {
    if conf.is_empty() { "default".to_string() } else { conf.to_string() }
}

fn to_json(path: &Path, source: &str, device: &Device, devices: &[DeviceRows]) -> serde_json::Value {
    json!({
        "file": path.display().to_string(),
        "source": source,
        "replay_device": device.to_string(),
        "devices": devices.iter().map(|d| json!({
            "device": d.device,
            "trace_entries": d.trace_events,
            "allocated_before_trace": d.allocated_before_trace,
            "recorded": d.recorded.as_ref().map(|r| json!({
                "peak_reserved_bytes": r.peak_reserved,
                "peak_allocated_bytes": r.peak_allocated,
                "ooms": r.ooms,
            })),
            "configs": d.rows,
            "ignored_actions": d.ignored.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
    })
}

fn text(path: &Path, source: &str, device: &Device, devices: &[DeviceRows]) -> OutputResult {
    let mut out = String::new();
    writeln!(out, "{}: {source}, replayed on {device}", path.display())?;
    if matches!(device, Device::Meta) {
        writeln!(
            out,
            "(meta has no capacity, so no replay can run out of memory; pass --device sim:<gpu> to count OOMs)"
        )?;
    }
    for d in devices {
        writeln!(out)?;
        let mut head = format!("device {}: {} trace entries", d.device, d.trace_events);
        if d.allocated_before_trace > 0 {
            write!(head, " ({} blocks were allocated before recording began)", d.allocated_before_trace)?;
        }
        writeln!(out, "{head}")?;
        writeln!(
            out,
            "  {:<34} {:>14} {:>14} {:>13} {:>5} {:>13}",
            "CONFIGURATION", "PEAK RESERVED", "PEAK ALLOC", "FRAG AT PEAK", "OOMS", "VS RECORDED"
        )?;
        if let Some(r) = &d.recorded {
            writeln!(
                out,
                "  {:<34} {:>14} {:>14} {:>13} {:>5} {:>13}",
                "recorded (the snapshot)",
                format_size(r.peak_reserved),
                format_size(r.peak_allocated),
                "-",
                r.ooms,
                "-"
            )?;
        }
        for row in &d.rows {
            let vs = match &d.recorded {
                Some(r) if r.peak_reserved > 0 => {
                    let diff = row.peak_reserved_bytes as i128 - r.peak_reserved as i128;
                    let sign = if diff < 0 { "-" } else { "+" };
                    format!("{sign}{}", format_size(diff.unsigned_abs() as u64))
                }
                _ => "-".to_string(),
            };
            writeln!(
                out,
                "  {:<34} {:>14} {:>14} {:>12.1}% {:>5} {:>13}",
                label(&row.alloc_conf),
                format_size(row.peak_reserved_bytes),
                format_size(row.peak_allocated_bytes),
                row.fragmentation_at_peak * 100.0,
                row.ooms,
                vs
            )?;
        }
        let all_equal =
            d.rows.windows(2).all(|w| (w[0].ooms, w[0].peak_reserved_bytes) == (w[1].ooms, w[1].peak_reserved_bytes));
        if d.rows.len() > 1 && all_equal {
            writeln!(out, "  no configuration changes the peak or the OOMs of this trace")?;
        } else if let Some(best) =
            d.rows.iter().min_by_key(|r| (r.ooms, r.peak_reserved_bytes)).filter(|_| d.rows.len() > 1)
        {
            writeln!(
                out,
                "  lowest peak reserved: {} ({})",
                label(&best.alloc_conf),
                format_size(best.peak_reserved_bytes)
            )?;
        }
        for (name, n) in &d.ignored {
            writeln!(out, "  note: {n} `{name}` entries were not replayed (not allocations)")?;
        }
    }
    writeln!(
        out,
        "\nPEAK ALLOC counts rounded block sizes as the replayed allocator does; the recorded row counts requested bytes. \
         FRAG AT PEAK = share of the peak reserved bytes not allocated even at the fullest moment of that peak."
    )?;
    Ok(out)
}
