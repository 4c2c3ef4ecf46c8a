//! Does this device compute what PyTorch computes? The PyTorch reference cases — every op of
//! `ops/`, the convolutions, normalisations, pools, losses and recurrent layers of `models/`, the
//! optimizer trajectories and the GradScaler trajectory of `train/` — run on any ferrite device
//! ([`check_device`]) and each comes back as passed (with its largest difference) or failed (with
//! the first element out of tolerance, or the error the device gave).
//!
//! Why a library and not only a test suite: a GPU machine often has no Rust toolchain, and a user
//! with a new GPU wants to ask the same question of it. `ferrite doctor --check-device cuda:0`
//! calls [`check_device`] from the release binary with the fixture folder beside it; the test
//! suites call it for `cpu` and `gpu:N`, so the CLI, CI and a user run one piece of code.
//!
//! Every expected value, tolerance and attribute comes from the fixture files; a case whose op has
//! no runner here fails (new fixture cases cannot be skipped silently), and so does a fixture
//! folder that lacks one of the case families this check promises.
mod closeness;
mod convolution;
mod error;
mod fixture;
mod grad_case;
mod losses;
mod norm_pool;
mod ops;
mod optimizers;
mod recurrent;
mod report;

use std::path::Path;

use ferrite_tensor::Device;

pub use closeness::check_close;
pub use error::ConformanceError;
pub use fixture::{nested, read_safetensors};
pub use report::{CaseResult, Outcome, Report, Suite};

/// Environment variable naming the PyTorch reference fixture folder (the layout of
/// `shared/fixtures/pytorch-reference`).
pub const REFERENCE_ENV: &str = "FERRITE_PYTORCH_REFERENCE";

/// Runs every suite of the fixture folder `dir` on `device`. A case that fails is a
/// [`Outcome::Failed`] in the report, never an error; the error is for a folder that cannot be
/// read as the fixtures (missing, a manifest that is not JSON).
pub fn check_device(device: &Device, dir: &Path) -> Result<Report, ConformanceError> {
    check_suites(device, dir, Suite::ALL)
}

/// [`check_device`] for some suites only.
pub fn check_suites(device: &Device, dir: &Path, suites: &[Suite]) -> Result<Report, ConformanceError> {
    if !dir.join("ops").join("manifest.json").is_file() {
        return Err(ConformanceError::NotAFixtureFolder { dir: dir.to_path_buf() });
    }
    let mut cases = Vec::new();
    for suite in suites {
        let results = match suite {
            Suite::Ops => ops::run(dir, device)?,
            Suite::Convolution => convolution::run(dir, device)?,
            Suite::NormPool => norm_pool::run(dir, device)?,
            Suite::Losses => losses::run(dir, device)?,
            Suite::Recurrent => recurrent::run(dir, device)?,
            Suite::Optimizers => optimizers::run_trajectories(dir, device)?,
            Suite::GradScaler => optimizers::run_grad_scaler(dir, device)?,
            Suite::Unrun => unrun(dir)?,
        };
        cases.extend(results.into_iter().map(|(name, outcome)| CaseResult { suite: *suite, name, outcome }));
    }
    let model_suites = [Suite::Convolution, Suite::NormPool, Suite::Losses, Suite::Recurrent];
    if model_suites.iter().all(|s| suites.contains(s)) && !suites.contains(&Suite::Unrun) {
        let results = unrun(dir)?;
        cases.extend(results.into_iter().map(|(name, outcome)| CaseResult { suite: Suite::Unrun, name, outcome }));
    }
    Ok(Report { device: device.to_string(), fixtures: dir.to_path_buf(), cases })
}

/// The `models/` cases whose op no suite runs, each a failure.
fn unrun(dir: &Path) -> Result<Vec<(String, Outcome)>, ConformanceError> {
    let covered: Vec<&str> =
        [&convolution::OPS[..], &norm_pool::OPS[..], &losses::OPS[..], &recurrent::OPS[..]].concat();
    Ok(fixture::cases(dir, "models/manifest.json")?
        .iter()
        .filter_map(|c| {
            let op = c["op"].as_str().unwrap_or("?");
            (!covered.contains(&op)).then(|| {
                let reason = format!("no suite runs models op `{op}`: add a runner to ferrite-conformance");
                (c["name"].as_str().unwrap_or("?").to_string(), Outcome::Failed { reason })
            })
        })
        .collect())
}
