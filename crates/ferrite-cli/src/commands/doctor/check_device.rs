//! `ferrite doctor --check-device DEVICE`: does this device compute what PyTorch computes? Runs
//! every PyTorch reference case (ops, layers, losses, recurrent layers, optimizer trajectories,
//! GradScaler) on the device through ferrite-conformance — the same code the test suites run on
//! `cpu` and `gpu:N` — and prints one line per case and a summary; exit status 1 when a case fails.
//!
//! Why in the binary: a GPU machine often has no Rust toolchain. The `ferrite` executable and the
//! fixture folder (580 KiB) are all that must travel there, and a user can ask the same question of
//! their own GPU.

use std::path::{Path, PathBuf};

use ferrite_conformance::{REFERENCE_ENV, Report};
use ferrite_tensor::{DType, Device, Tensor};

use crate::commands::CliResult;

/// Why the check could not run, or that it ran and cases failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckDeviceError {
    #[error(
        "`--check-device {given}`: {reason}; devices are spelled cpu, gpu:N or cuda:N (`ferrite devices` lists them)"
    )]
    BadDevice { given: String, reason: String },
    #[error(
        "no PyTorch reference fixture folder found (looked in: {searched}); pass `--fixtures DIR` \
         (the folder with ops/, models/ and train/, shared/fixtures/pytorch-reference in the \
         repository) or set {REFERENCE_ENV}"
    )]
    NoFixtures { searched: String },
    #[error("cannot put a tensor on {device}: {reason}")]
    DeviceUnusable { device: String, reason: String },
    #[error("{failed} of {total} PyTorch reference cases failed on {device} (the lines marked FAILED)")]
    CasesFailed { device: String, failed: usize, total: usize },
}

/// The folder to read: `--fixtures`, else `$FERRITE_PYTORCH_REFERENCE`, else the first of
/// `fixtures/` beside the executable, `./fixtures`, `./shared/fixtures/pytorch-reference` and
/// `../shared/fixtures/pytorch-reference` that holds `ops/manifest.json`.
pub fn fixture_folder(given: Option<&Path>) -> Result<PathBuf, CheckDeviceError> {
    if let Some(dir) = given {
        return Ok(dir.to_path_buf());
    }
    if let Some(dir) = std::env::var_os(REFERENCE_ENV) {
        return Ok(PathBuf::from(dir));
    }
    let mut candidates = Vec::new();
    if let Some(exe_dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        candidates.push(exe_dir.join("fixtures"));
    }
    for rel in ["fixtures", "shared/fixtures/pytorch-reference", "../shared/fixtures/pytorch-reference"] {
        candidates.push(PathBuf::from(rel));
    }
    candidates.iter().find(|d| d.join("ops").join("manifest.json").is_file()).cloned().ok_or_else(|| {
        CheckDeviceError::NoFixtures {
            searched: candidates.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
        }
    })
}

/// Runs the check and prints it (text, or the report as JSON).
pub fn run(device: &str, fixtures: Option<&Path>, json: bool) -> CliResult {
    let dev = Device::parse(device)
        .map_err(|e| CheckDeviceError::BadDevice { given: device.to_string(), reason: e.to_string() })?;
    let dir = fixture_folder(fixtures)?;
    // One tensor first: a device that cannot hold one (no driver, no kernels, no adapter) is one
    // clear error, not the same failure once per case.
    Tensor::zeros(&[1], DType::F32, &dev)
        .and_then(|t| t.to_vec_f64())
        .map_err(|e| CheckDeviceError::DeviceUnusable { device: dev.to_string(), reason: e.to_string() })?;
    let report: Report = ferrite_conformance::check_device(&dev, &dir)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    if !report.all_passed() {
        let failed = report.failed().count();
        return Err(CheckDeviceError::CasesFailed { device: dev.to_string(), failed, total: report.cases.len() }.into());
    }
    Ok(())
}
