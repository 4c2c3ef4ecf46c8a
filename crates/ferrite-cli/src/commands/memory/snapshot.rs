//! `ferrite memory snapshot`: ferrite's allocator snapshot as a PyTorch snapshot pickle.
use std::fmt::Write;
use std::path::Path;

use ferrite_memory::replay::replay_with_snapshot;
use ferrite_memory::{AllocatorConfig, format_size};

use super::{OutputResult, parse_alloc_conf, read_ferrite_trace, trace_device};

/// Replays `trace` with history recorded and writes the snapshot to `output`; returns the summary.
pub fn snapshot_output(
    trace: &Path,
    output: &Path,
    device: Option<String>,
    alloc_conf: Option<String>,
) -> OutputResult {
    let t = read_ferrite_trace(trace)?;
    let device = trace_device(&t, device)?;
    let config = match alloc_conf {
        Some(s) => parse_alloc_conf(&s)?,
        None => AllocatorConfig::from_env()?,
    };
    let (report, snap) = replay_with_snapshot(&t, device, config)?;
    ferrite_io::write_torch_snapshot(output, &snap)?;
    let entries: usize = snap.device_traces.iter().map(|t| t.len()).sum();
    let mut out = String::new();
    writeln!(
        out,
        "wrote {}: {} segments ({} reserved), {} trace entries, {} OOMs in the replay on {}",
        output.display(),
        snap.segments.len(),
        format_size(snap.reserved_bytes()),
        entries,
        report.ooms.len(),
        report.device
    )?;
    writeln!(
        out,
        "open it at https://pytorch.org/memory_viz or: python -m torch.cuda._memory_viz trace_plot {} -o trace.html",
        output.display()
    )?;
    Ok(out)
}
