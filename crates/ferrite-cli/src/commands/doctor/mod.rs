//! `ferrite doctor`: what is wrong with this setup? One report of ferrite's build (with MPI:
//! compiled in or not, the library loaded, `mpirun`, the rank under `mpirun`), the CPU and its
//! vector extensions, memory, container limits (cgroups), devices (GPU adapters and CUDA devices,
//! with the driver and NVRTC, through the same code as `ferrite devices`), datasets and the environment variables that change behaviour, each
//! line with a verdict (`ok`, `note`, `warning`, `error`) and, when it is not ok, the fix.
//! `--json` gives the same for bug reports, with the MPI facts as fields (`mpi`).
//! `--check-device DEVICE` runs the PyTorch reference cases on a device instead ([`check_device`]);
//! `--bench DEVICE` benchmarks a device next to the planner's prediction instead ([`bench`]).
//!
//! Every line states what was observed on this machine, for this binary: nothing is a constant
//! that could be true of one build and false of another.
//!
//! Nothing here can fail the command except printing: a file that cannot be read is itself a
//! finding. The exit status is 1 when a finding is an `error` (something that makes ferrite
//! fail, such as an invalid `FERRITE_ALLOC_CONF`), else 0.

pub mod bench;
pub mod cgroup;
pub mod check;
pub mod check_device;
mod cpu;
pub mod cuda;
mod datasets;
mod devices;
mod environment;
mod host_memory;
mod kernels;
pub mod mpi;

use serde::Serialize;

use self::check::{Check, Verdict};
use super::CliResult;

#[derive(clap::Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Print one JSON object (`{"ferrite": ..., "mpi": ..., "checks": [...], "summary": ...}`) for
    /// bug reports.
    #[arg(long)]
    pub json: bool,
    /// Also compile every CUDA kernel source of this binary with NVRTC, for each CUDA device's
    /// architecture (`sm_80` and `sm_90` without one): one line per source with its registers and
    /// spills. Needs NVRTC (`pip install nvidia-cuda-nvrtc`, or FERRITE_NVRTC), not a GPU.
    #[arg(long)]
    pub compile_kernels: bool,
    /// Instead of the report: run every PyTorch reference case (ops, layers, losses, recurrent
    /// layers, optimizer trajectories, GradScaler) on this device (`cpu`, `gpu:0`, `cuda:0`), one
    /// line per case; exit status 1 when one differs from PyTorch beyond its tolerance.
    #[arg(long, value_name = "DEVICE")]
    pub check_device: Option<String>,
    /// The PyTorch reference fixture folder for `--check-device` (default: $FERRITE_PYTORCH_REFERENCE,
    /// else `fixtures/` beside the executable, `./fixtures`, `shared/fixtures/pytorch-reference`).
    #[arg(long, value_name = "DIR", requires = "check_device")]
    pub fixtures: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub bench: bench::BenchArgs,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Report {
    pub ferrite: BuildInfo,
    pub mpi: mpi::MpiFacts,
    /// The CUDA facts (driver, devices, NVRTC) as `ferrite devices --json` gives them.
    pub cuda: serde_json::Value,
    pub checks: Vec<Check>,
    pub summary: Summary,
}

#[derive(Debug, Serialize)]
pub struct BuildInfo {
    pub version: &'static str,
    pub profile: &'static str,
    pub target: String,
    pub features: Vec<&'static str>,
}

#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub ok: usize,
    pub note: usize,
    pub warning: usize,
    pub error: usize,
}

/// The doctor found problems that make ferrite fail.
#[derive(Debug, thiserror::Error)]
#[error("ferrite doctor found {0} problem(s) that make ferrite fail (the lines marked `error`)")]
pub struct DoctorFoundErrors(pub usize);

pub fn run(args: DoctorArgs) -> CliResult {
    if let Some(device) = &args.check_device {
        return check_device::run(device, args.fixtures.as_deref(), args.json);
    }
    if let Some(device) = &args.bench.bench {
        return bench::run(device, &args.bench, args.json);
    }
    let report = collect_with(args.compile_kernels);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&report));
    }
    if report.summary.error > 0 {
        return Err(DoctorFoundErrors(report.summary.error).into());
    }
    Ok(())
}

fn build_info() -> BuildInfo {
    BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        profile: if cfg!(debug_assertions) { "debug" } else { "release" },
        target: format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS),
        features: {
            let mut f = vec!["cpu", "sim", "meta"];
            if cfg!(feature = "gpu") {
                f.push("gpu (wgpu)");
            }
            // Always compiled: the driver is loaded at run time.
            f.push("cuda (driver, NVRTC and cuBLAS loaded at run time; CUDA kernel backend)");
            f.push("metrics (Prometheus)");
            if cfg!(feature = "mpi") {
                f.push("mpi");
            }
            f
        },
    }
}

/// Run every check on this machine.
pub fn collect() -> Report {
    collect_with(false)
}

/// Run every check on this machine; `compile_kernels`: also compile the CUDA kernel sources.
pub fn collect_with(compile_kernels: bool) -> Report {
    let ferrite = build_info();
    let mut checks = vec![Check::ok(
        "ferrite",
        "build",
        format!(
            "ferrite {} ({} build, {}), devices and features: {}",
            ferrite.version,
            ferrite.profile,
            ferrite.target,
            ferrite.features.join(", ")
        ),
    )];
    let mpi = mpi::MpiFacts::observe();
    checks.extend(mpi::checks(&mpi));
    if ferrite.profile == "debug" {
        checks.push(Check::warning(
            "ferrite",
            "profile",
            "debug build",
            "kernels are many times slower without optimisation: build with `cargo build --release`",
        ));
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok();
    checks.extend(cpu::checks(cpuinfo.as_deref()));
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    checks.extend(host_memory::checks(meminfo.as_deref()));
    let physical = meminfo.as_deref().and_then(|m| host_memory::meminfo_bytes(m, "MemTotal"));
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    checks.extend(cgroup::checks(&cgroup::CgroupFs::system(), physical, threads));
    let xdg = std::env::var(crate::headless::XDG_RUNTIME_DIR).ok();
    checks.extend(devices::checks(
        &ferrite_memory::gpu::list_adapters(),
        crate::headless::device_select_quieted(),
        xdg.as_deref(),
    ));
    let cuda = cuda::CudaFacts::observe();
    checks.extend(cuda.checks());
    if compile_kernels {
        let devices = cuda.devices.as_deref().unwrap_or_default();
        checks.extend(kernels::checks(&kernels::arches(devices)));
    }
    checks.extend(datasets::checks());
    let mut vars: Vec<(String, Option<String>)> =
        std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()))).collect();
    vars.sort();
    checks.extend(environment::checks(&vars, threads));
    let mut summary = Summary::default();
    for c in &checks {
        match c.verdict {
            Verdict::Ok => summary.ok += 1,
            Verdict::Note => summary.note += 1,
            Verdict::Warning => summary.warning += 1,
            Verdict::Error => summary.error += 1,
        }
    }
    Report { ferrite, mpi, cuda: cuda.json(), checks, summary }
}

/// The human-readable report: sections, one line per check, the fix indented below.
pub fn text(r: &Report) -> String {
    let mut s = format!("ferrite doctor — ferrite {}\n", r.ferrite.version);
    let mut section = "";
    for c in &r.checks {
        if c.section != section {
            section = c.section;
            s.push_str(&format!("\n{section}\n"));
        }
        s.push_str(&format!("  {:<8} {:<24} {}\n", c.verdict.word(), c.name, c.found));
        if let Some(fix) = &c.fix {
            s.push_str(&format!("  {:<8} {:<24} fix: {fix}\n", "", ""));
        }
    }
    let plural = |n: usize, word: &str| if n == 1 { format!("{n} {word}") } else { format!("{n} {word}s") };
    s.push_str(&format!(
        "\nsummary: {} ok, {}, {}, {}\n",
        r.summary.ok,
        plural(r.summary.note, "note"),
        plural(r.summary.warning, "warning"),
        plural(r.summary.error, "error")
    ));
    s
}
