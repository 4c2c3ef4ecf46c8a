//! `ferrite memory`: replay an allocation trace through the caching allocator, list the GPUs a
//! `sim` device can model.
use std::path::PathBuf;

use ferrite_memory::replay::{Trace, replay};
use ferrite_memory::{AllocatorConfig, Device, GpuProfile, format_size};

use super::CliResult;

#[derive(clap::Args, Debug, Clone)]
pub struct MemoryArgs {
    #[command(subcommand)]
    pub command: MemoryCommand,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum MemoryCommand {
    /// Replay an allocation trace (JSON) and print final and peak statistics and any OOMs.
    Replay {
        /// Trace file: {"device": "...", "events": [{"action": "alloc", "id": 1, "size": 614400}, ...]}
        trace: PathBuf,
        /// Device to replay on (overrides the trace's "device"), e.g. sim:a100-40gb.
        #[arg(long)]
        device: Option<String>,
        /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax (default: $FERRITE_ALLOC_CONF).
        #[arg(long)]
        alloc_conf: Option<String>,
        /// Print one JSON object: PyTorch's flattened memory_stats keys plus "ooms".
        #[arg(long)]
        json: bool,
    },
    /// List the GPU models of the sim catalogue.
    Gpus,
}

pub fn run(args: MemoryArgs) -> CliResult {
    match args.command {
        MemoryCommand::Replay { trace, device, alloc_conf, json } => {
            print!("{}", replay_output(&trace, device, alloc_conf, json)?);
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

/// The text `ferrite memory replay` prints.
fn replay_output(
    path: &PathBuf,
    device: Option<String>,
    alloc_conf: Option<String>,
    json: bool,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    use std::fmt::Write;
    if path.is_dir() {
        // Said plainly rather than as the operating system's "Is a directory (os error 21)".
        return Err(ferrite_io::IoError::NotAFile { path: path.clone(), found: "directory" }.into());
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
    let trace = Trace::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let spec = device
        .or_else(|| trace.device.clone())
        .ok_or("the trace names no device; pass --device (e.g. --device sim:a100-40gb)")?;
    let device = Device::parse(&spec)?;
    let config = match alloc_conf {
        Some(s) => AllocatorConfig::parse(&s)?,
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
        let out = replay_output(&demo_trace(), None, Some(String::new()), true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["num_ooms"], 1);
        assert_eq!(v["ooms"][0]["event_index"], 47);
        assert_eq!(v["ooms"][0]["size"], 500u64 << 20);
        assert_eq!(v["ooms"][0]["diagnosis"], "fragmented");
        assert_eq!(v["reserved_bytes.all.current"], 0);
        assert!(v["allocated_bytes.all.peak"].as_i64().unwrap() > 0);
        // another allocator setting avoids the OOM
        let out = replay_output(&demo_trace(), None, Some("max_split_size_mb:100".into()), true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["num_ooms"], 0);
        assert_eq!(v["ooms"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn replay_text_reports_the_diagnosis() {
        let out = replay_output(&demo_trace(), Some("sim:1GiB".into()), Some(String::new()), false).unwrap();
        assert!(out.contains("OOM at event 47"), "{out}");
        assert!(out.contains("Diagnosis: fragmented"), "{out}");
        assert!(out.contains("ferrite memory summary"), "{out}");
    }

    #[test]
    fn replay_errors_are_messages() {
        let e = replay_output(&demo_trace(), None, Some("bogus:1".into()), true).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = replay_output(&demo_trace(), Some("gpu:99".into()), Some(String::new()), true).unwrap_err();
        assert!(e.to_string().contains("gpu:99"), "{e}");
        let e = replay_output(&PathBuf::from("/nonexistent.json"), None, None, true).unwrap_err();
        assert!(e.to_string().contains("cannot read trace"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = replay_output(&dir.path().to_path_buf(), None, None, true).unwrap_err().to_string();
        assert!(e.contains("is a directory, not a file") && !e.contains("os error"), "{e}");
    }
}
