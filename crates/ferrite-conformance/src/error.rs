//! The errors of the conformance check: a fixture folder that cannot be read as one. A case that
//! fails is not an error (it is a result of the check).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    #[error(
        "{dir} is not a PyTorch reference fixture folder (no ops/manifest.json); pass the folder \
         that holds ops/, models/ and train/ (shared/fixtures/pytorch-reference), or set \
         FERRITE_PYTORCH_REFERENCE to it"
    )]
    NotAFixtureFolder { dir: PathBuf },
    #[error("cannot read {path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("{path} is not a fixture manifest: {reason}")]
    BadManifest { path: PathBuf, reason: String },
}
