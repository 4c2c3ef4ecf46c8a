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

/// What `expected.json`'s `files` key says about one tensor of one `.pt` file.
#[derive(Debug, Clone)]
pub struct ExpectedTensor {
    pub path: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub sum: f64,
}

/// `files[file]` of `expected.json`: every tensor (by `/`-joined path, sorted by path) and the
/// non-tensor leaves as JSON values.
pub fn expected_file(
    exp: &serde_json::Value,
    file: &str,
) -> (Vec<ExpectedTensor>, serde_json::Map<String, serde_json::Value>) {
    let entry = &exp["files"][file];
    let tensors = entry["tensors"]
        .as_object()
        .unwrap_or_else(|| panic!("expected.json: files/{file}/tensors is not an object"))
        .iter()
        .map(|(path, e)| ExpectedTensor {
            path: path.clone(),
            dtype: e["dtype"].as_str().expect("dtype").to_string(),
            shape: e["shape"].as_array().expect("shape").iter().map(|x| x.as_u64().expect("dim") as usize).collect(),
            sum: e["sum"].as_f64().expect("sum"),
        })
        .collect();
    let values = entry["values"].as_object().cloned().unwrap_or_default();
    (tensors, values)
}

/// The expected tensor at `path` of `file`.
pub fn expected_tensor(exp: &serde_json::Value, file: &str, path: &str) -> ExpectedTensor {
    expected_file(exp, file)
        .0
        .into_iter()
        .find(|t| t.path == path)
        .unwrap_or_else(|| panic!("expected.json: no tensor {path} in files/{file}"))
}
