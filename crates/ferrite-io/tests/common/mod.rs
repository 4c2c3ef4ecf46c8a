//! Shared helpers for ferrite-io's integration tests.
#![allow(dead_code)]

pub mod pt_builder;

pub use ferrite_test_support::pytorch_file_or_skip as pytorch_file;

pub fn expected() -> Option<serde_json::Value> {
    let p = pytorch_file("expected.json")?;
    Some(serde_json::from_str(&std::fs::read_to_string(p).expect("read expected.json")).expect("parse expected.json"))
}

/// Relative closeness for f64 sums computed in different orders.
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
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
