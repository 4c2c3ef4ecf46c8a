//! Shared helpers for ferrite-io's integration tests.
#![allow(dead_code)]

pub mod pt_builder;

use std::path::PathBuf;

/// `../shared/fixtures/pytorch-reference` relative to the workspace root, or
/// `$FERRITE_PYTORCH_REFERENCE`. `None` (with a loud message) if absent.
pub fn reference_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("FERRITE_PYTORCH_REFERENCE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/pytorch-reference"),
    };
    if dir.join("pytorch").is_dir() {
        Some(dir)
    } else {
        eprintln!("SKIPPED: PyTorch reference fixtures not found at {}; set FERRITE_PYTORCH_REFERENCE", dir.display());
        None
    }
}

pub fn pytorch_file(name: &str) -> Option<PathBuf> {
    reference_dir().map(|d| d.join("pytorch").join(name))
}

pub fn expected() -> Option<serde_json::Value> {
    let p = pytorch_file("expected.json")?;
    Some(serde_json::from_str(&std::fs::read_to_string(p).expect("read expected.json")).expect("parse expected.json"))
}

/// Relative closeness for f64 sums computed in different orders.
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Whether a system dependency may be skipped (not in CI).
pub fn may_skip() -> bool {
    std::env::var("FERRITE_REQUIRE_SYSTEM_DEPS").as_deref() != Ok("1")
}
