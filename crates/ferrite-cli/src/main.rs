//! The `ferrite` command. With no arguments it trains the built-in demo (`ferrite train` with its
//! defaults), so `cargo run --release` from the repository root is the main job.

use ferrite_cli::commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ferrite", version, about = "Deep-learning training with predictable device memory")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

// The train command's flags make its variant large; the value is parsed once per process.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Train a model (default: an MLP on the built-in digits dataset).
    Train(commands::train::TrainArgs),
    /// A Hugging Face model's loss and perplexity on a text file (`--hf-model DIR --data FILE --seq N`).
    Eval(commands::eval::EvalArgs),
    /// Continue a prompt with a Hugging Face model (greedy or sampled, with a key/value cache).
    Generate(commands::generate::GenerateArgs),
    /// Predict a training step's memory on a named GPU without it: fits, peak, breakdown, the
    /// largest batch, ranked plans.
    Plan(commands::plan::PlanArgs),
    /// Allocator tools: replay a trace, list the GPU catalogue.
    Memory(commands::memory::MemoryArgs),
    /// List the tensors of a .pt/.pth/.safetensors file.
    Inspect(commands::inspect::InspectArgs),
    /// Convert a PyTorch .pt/.pth file to .safetensors.
    Convert(commands::convert::ConvertArgs),
    /// List the devices ferrite can compute on: cpu, meta, and every GPU adapter with its limits.
    Devices(commands::devices::DevicesArgs),
    /// Watch a running `ferrite train --metrics-addr`: memory per device, loss, throughput.
    Monitor(commands::monitor::MonitorArgs),
    /// Check this installation: CPU, memory, container limits, devices, datasets, environment.
    Doctor(commands::doctor::DoctorArgs),
}

fn main() -> ExitCode {
    restore_sigpipe();
    quiet_mesa_device_select();
    let cli = Cli::parse();
    let result = match cli.command {
        None => commands::train::run(commands::train::TrainArgs::default_demo()),
        Some(Command::Train(a)) => commands::train::run(a),
        Some(Command::Plan(a)) => commands::plan::run(a),
        Some(Command::Eval(a)) => commands::eval::run(a),
        Some(Command::Generate(a)) => commands::generate::run(a),
        Some(Command::Memory(a)) => commands::memory::run(a),
        Some(Command::Inspect(a)) => commands::inspect::run(a),
        Some(Command::Convert(a)) => commands::convert::run(a),
        Some(Command::Devices(a)) => commands::devices::run(a),
        Some(Command::Monitor(a)) => commands::monitor::run(a),
        Some(Command::Doctor(a)) => commands::doctor::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One write per message: the ranks of an MPI job share one stderr, and a line written
            // in pieces (as `eprintln!` writes it) interleaves with the other ranks' lines.
            let line = format!("error: {e}\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
            ExitCode::FAILURE
        }
    }
}

/// On a headless machine Mesa's device-select Vulkan layer prints `error: XDG_RUNTIME_DIR is
/// invalid or not set in the environment.` whenever wgpu creates an instance; turn the layer off
/// with its own switch, `NODEVICE_SELECT=1`, unless the user has set that variable or a runtime
/// directory exists (see `ferrite_cli::headless`).
fn quiet_mesa_device_select() {
    use ferrite_cli::headless::{NODEVICE_SELECT, XDG_RUNTIME_DIR};
    let (user, xdg) = (std::env::var_os(NODEVICE_SELECT), std::env::var_os(XDG_RUNTIME_DIR));
    if ferrite_cli::headless::should_quiet_device_select(user.as_deref(), xdg.as_deref()) {
        // SAFETY: `set_var` is unsound only when another thread reads or writes the environment
        // at the same time. This runs second thing in `main` (after `restore_sigpipe`, which
        // starts nothing), before argument parsing, before any thread is spawned and before any
        // wgpu instance or library that reads the environment exists: the process is
        // single-threaded here.
        unsafe { std::env::set_var(NODEVICE_SELECT, "1") };
        ferrite_cli::headless::mark_device_select_quieted();
    }
}

/// `ferrite train | head` must end quietly, like `cat` or `grep` would, not panic inside
/// `println!` with "failed printing to stdout: Broken pipe". Rust ignores SIGPIPE by default;
/// restore the default disposition so a closed pipe ends the process.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: `signal` with a valid signal number and `SIG_DFL` has no memory-safety
    // preconditions; it runs first thing in `main`, before any thread exists, so no other code
    // observes the disposition change mid-way.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
