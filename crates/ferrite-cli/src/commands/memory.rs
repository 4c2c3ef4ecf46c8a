//! `ferrite memory`: replay an allocation trace (ferrite's JSON traces or PyTorch memory snapshot
//! pickles) through the caching allocator and compare allocator settings side by side, write
//! ferrite's snapshot as a PyTorch snapshot pickle, plot a memory timeline, list the GPUs a `sim`
//! device can model.
use std::path::{Path, PathBuf};

use ferrite_memory::replay::{Trace, replay};
use ferrite_memory::{AllocatorConfig, Device, GpuProfile, format_size};

use super::CliResult;

mod plot_input;
mod snapshot;
mod what_if;

pub use plot_input::plot_output;
pub use snapshot::snapshot_output;
pub use what_if::what_if_output;

#[derive(clap::Args, Debug, Clone)]
pub struct MemoryArgs {
    #[command(subcommand)]
    pub command: MemoryCommand,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum MemoryCommand {
    /// Replay an allocation trace and print peak statistics and any OOMs. The trace is ferrite's
    /// JSON or a PyTorch snapshot pickle (`torch.cuda.memory._dump_snapshot()`); with a snapshot,
    /// or with several --alloc-conf, each configuration is replayed and compared side by side.
    Replay {
        /// Trace file: ferrite JSON ({"device": "...", "events": [{"action": "alloc", "id": 1,
        /// "size": 614400}, ...]}) or a PyTorch memory snapshot pickle.
        trace: PathBuf,
        /// Device to replay on (overrides the trace's "device"), e.g. sim:a100-40gb. Snapshots
        /// replay on `meta` (no capacity, so no OOMs) unless a device is given.
        #[arg(long)]
        device: Option<String>,
        /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, or `default`; repeat to compare
        /// (default: $FERRITE_ALLOC_CONF; for a snapshot: its recorded settings,
        /// expandable_segments:True and max_split_size_mb:128).
        #[arg(long)]
        alloc_conf: Vec<String>,
        /// Print one JSON object (a single configuration of a ferrite trace: PyTorch's flattened
        /// memory_stats keys plus "ooms"; otherwise the comparison).
        #[arg(long)]
        json: bool,
    },
    /// Replay a ferrite trace with history recorded and write the allocator's snapshot as a
    /// PyTorch snapshot pickle (open it at pytorch.org/memory_viz or with
    /// `python -m torch.cuda._memory_viz trace_plot FILE -o out.html`).
    Snapshot {
        /// ferrite JSON trace to replay.
        trace: PathBuf,
        /// Where to write the pickle.
        #[arg(short, long)]
        output: PathBuf,
        /// Device to replay on (overrides the trace's "device").
        #[arg(long)]
        device: Option<String>,
        /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax (default: $FERRITE_ALLOC_CONF).
        #[arg(long)]
        alloc_conf: Option<String>,
    },
    /// Plot allocated and reserved memory over a trace as a self-contained SVG, an HTML page or a
    /// PNG (by the output's extension): a ferrite JSON trace (replayed), or a PyTorch snapshot
    /// pickle — including the one `ferrite train --snapshot` writes (as recorded, one panel per
    /// device, categories stacked, plus one panel per --alloc-conf replayed).
    Plot {
        /// ferrite JSON trace or PyTorch snapshot pickle.
        trace: PathBuf,
        /// Where to write the picture; its extension picks the format: `.svg`, `.html` (or `.htm`:
        /// the SVG in a page) or `.png`. Any other extension is refused.
        #[arg(short, long)]
        output: PathBuf,
        /// Write an HTML page (the output must then be named `.html`; the extension alone suffices).
        #[arg(long)]
        html: bool,
        /// Device to replay on (its capacity is drawn as a line); a snapshot replays on `meta`
        /// unless one is given.
        #[arg(long)]
        device: Option<String>,
        /// Allocator settings to replay under (PYTORCH_CUDA_ALLOC_CONF syntax or `default`); repeat
        /// for one panel each. A ferrite trace without it uses $FERRITE_ALLOC_CONF.
        #[arg(long)]
        alloc_conf: Vec<String>,
    },
    /// List the GPU models of the sim catalogue.
    Gpus,
}

pub fn run(args: MemoryArgs) -> CliResult {
    match args.command {
        MemoryCommand::Replay { trace, device, alloc_conf, json } => {
            print!("{}", replay_output(&trace, device, &alloc_conf, json)?);
            Ok(())
        }
        MemoryCommand::Snapshot { trace, output, device, alloc_conf } => {
            print!("{}", snapshot_output(&trace, &output, device, alloc_conf)?);
            Ok(())
        }
        MemoryCommand::Plot { trace, output, html, device, alloc_conf } => {
            print!("{}", plot_output(&trace, &output, html, device, &alloc_conf)?);
            Ok(())
        }
        MemoryCommand::Gpus => {
            println!("{:<14} {:<26} {:>16} {:>12} {:>12}", "KEY", "NAME", "TOTAL BYTES", "TOTAL", "USABLE");
            for p in GpuProfile::catalogue() {
                println!(
                    "{:<14} {:<26} {:>16} {:>12} {:>12}",
                    p.key,
                    p.name,
                    p.total_bytes,
                    format_size(p.total_bytes),
                    format_size(p.usable_bytes())
                );
            }
            println!("\nUse as `sim:<key>[:index]`, or `sim:<capacity>` (e.g. sim:16GiB) for a bare capacity.");
            Ok(())
        }
    }
}

type OutputResult = Result<String, Box<dyn std::error::Error + Send + Sync>>;

/// Whether a file is a pickle (a PyTorch snapshot) rather than a ferrite JSON trace.
fn is_pickle(path: &Path) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    use std::io::Read;
    if path.is_dir() {
        // Said plainly rather than as the operating system's "Is a directory (os error 21)".
        return Err(ferrite_io::IoError::NotAFile { path: path.to_path_buf(), found: "directory" }.into());
    }
    let mut first = [0u8; 1];
    let mut f = std::fs::File::open(path).map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
    let n = f.read(&mut first).map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
    Ok(n == 1 && first[0] == 0x80)
}

/// An `--alloc-conf` value: `default` (or empty) is PyTorch's defaults.
fn parse_alloc_conf(spec: &str) -> Result<AllocatorConfig, ferrite_memory::MemoryError> {
    if spec.trim().eq_ignore_ascii_case("default") {
        Ok(AllocatorConfig::default())
    } else {
        AllocatorConfig::parse(spec)
    }
}

/// A ferrite JSON trace and the device it names.
fn read_ferrite_trace(path: &Path) -> Result<Trace, Box<dyn std::error::Error + Send + Sync>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
    Ok(Trace::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))?)
}

fn trace_device(trace: &Trace, device: Option<String>) -> Result<Device, Box<dyn std::error::Error + Send + Sync>> {
    let spec = device
        .or_else(|| trace.device.clone())
        .ok_or("the trace names no device; pass --device (e.g. --device sim:a100-40gb)")?;
    Ok(Device::parse(&spec)?)
}

/// The text `ferrite memory replay` prints.
pub fn replay_output(path: &Path, device: Option<String>, alloc_conf: &[String], json: bool) -> OutputResult {
    use std::fmt::Write;
    if is_pickle(path)? || alloc_conf.len() > 1 {
        return what_if_output(path, device, alloc_conf, json);
    }
    let trace = read_ferrite_trace(path)?;
    let device = trace_device(&trace, device)?;
    let config = match alloc_conf.first() {
        Some(s) => parse_alloc_conf(s)?,
        None => AllocatorConfig::from_env()?,
    };
    let report = replay(&trace, device, config)?;
    if json {
        return Ok(serde_json::to_string_pretty(&report.to_json())? + "\n");
    }
    let s = &report.stats;
    let mut out = String::new();
    writeln!(out, "replayed {} events on {} (alloc conf: \"{}\")", report.events, report.device, report.config)?;
    writeln!(
        out,
        "allocated: {} now, {} peak | reserved: {} now, {} peak | OOMs: {} | retries: {}",
        format_size(s.allocated_bytes.all.current as u64),
        format_size(s.allocated_bytes.all.peak as u64),
        format_size(s.reserved_bytes.all.current as u64),
        format_size(s.reserved_bytes.all.peak as u64),
        s.num_ooms,
        s.num_alloc_retries
    )?;
    out.push_str(&report.summary);
    for o in &report.ooms {
        writeln!(
            out,
            "\nOOM at event {} (id {}, {} bytes): {}\n{}",
            o.event_index, o.id, o.size, o.diagnosis, o.message
        )?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo_trace() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ferrite-memory/traces/split_large_block.json")
    }

    #[test]
    fn replay_json_has_pytorch_keys_and_ooms() {
        let out = replay_output(&demo_trace(), None, &[String::new()], true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["num_ooms"], 1);
        assert_eq!(v["ooms"][0]["event_index"], 47);
        assert_eq!(v["ooms"][0]["size"], 500u64 << 20);
        assert_eq!(v["ooms"][0]["diagnosis"], "fragmented");
        assert_eq!(v["reserved_bytes.all.current"], 0);
        assert!(v["allocated_bytes.all.peak"].as_i64().unwrap() > 0);
        // another allocator setting avoids the OOM
        let out = replay_output(&demo_trace(), None, &["max_split_size_mb:100".into()], true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["num_ooms"], 0);
        assert_eq!(v["ooms"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn several_alloc_confs_compare_a_ferrite_trace() {
        let confs = ["default".to_string(), "max_split_size_mb:100".to_string()];
        let out = replay_output(&demo_trace(), None, &confs, true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["source"], "ferrite trace");
        assert!(v["devices"][0]["recorded"].is_null());
        let rows = v["devices"][0]["configs"].as_array().unwrap();
        assert_eq!((rows[0]["ooms"].as_u64(), rows[1]["ooms"].as_u64()), (Some(1), Some(0)), "{rows:?}");
        assert_eq!(rows[0]["first_oom_event"], 47);
        let text = replay_output(&demo_trace(), None, &confs, false).unwrap();
        assert!(text.contains("lowest peak reserved: max_split_size_mb:100"), "{text}");
    }

    #[test]
    fn replay_text_reports_the_diagnosis() {
        let out = replay_output(&demo_trace(), Some("sim:1GiB".into()), &[String::new()], false).unwrap();
        assert!(out.contains("OOM at event 47"), "{out}");
        assert!(out.contains("Diagnosis: fragmented"), "{out}");
        assert!(out.contains("ferrite memory summary"), "{out}");
    }

    #[test]
    fn replay_errors_are_messages() {
        let e = replay_output(&demo_trace(), None, &["bogus:1".into()], true).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = replay_output(&demo_trace(), Some("gpu:99".into()), &[String::new()], true).unwrap_err();
        assert!(e.to_string().contains("gpu:99"), "{e}");
        let e = replay_output(&PathBuf::from("/nonexistent.json"), None, &[], true).unwrap_err();
        assert!(e.to_string().contains("cannot read trace"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = replay_output(dir.path(), None, &[], true).unwrap_err().to_string();
        assert!(e.contains("is a directory, not a file") && !e.contains("os error"), "{e}");
    }
}
