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
        MemoryCommand::Replay { trace, device, alloc_conf, json } => run_replay(&trace, device, alloc_conf, json),
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

fn run_replay(path: &PathBuf, device: Option<String>, alloc_conf: Option<String>, json: bool) -> CliResult {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
    let trace = Trace::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let spec = device.or_else(|| trace.device.clone()).ok_or(
        "the trace names no device; pass --device (e.g. --device sim:a100-40gb)",
    )?;
    let device = Device::parse(&spec)?;
    let config = match alloc_conf {
        Some(s) => AllocatorConfig::parse(&s)?,
        None => AllocatorConfig::from_env()?,
    };
    let report = replay(&trace, device, config)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
        return Ok(());
    }
    let s = &report.stats;
    println!("replayed {} events on {} (alloc conf: \"{}\")", report.events, report.device, report.config);
    println!(
        "allocated: {} now, {} peak | reserved: {} now, {} peak | OOMs: {} | retries: {}",
        format_size(s.allocated_bytes.all.current as u64),
        format_size(s.allocated_bytes.all.peak as u64),
        format_size(s.reserved_bytes.all.current as u64),
        format_size(s.reserved_bytes.all.peak as u64),
        s.num_ooms,
        s.num_alloc_retries
    );
    print!("{}", report.summary);
    for o in &report.ooms {
        println!("\nOOM at event {} (id {}, {} bytes): {}\n{}", o.event_index, o.id, o.size, o.diagnosis, o.message);
    }
    Ok(())
}
