//! Reading the PyTorch reference fixtures into ferrite tensors: their safetensors files, the
//! `models/` manifest's cases and the nested number lists of their attributes. One reader instead
//! of one per test file, so every suite reads the same bytes the same way.

use std::path::{Path, PathBuf};

use ferrite_tensor::{DType, Tensor};
use serde_json::Value;

/// Every tensor of a safetensors file (F32 and I64) on the CPU, in file order; `Err` naming the
/// file or tensor when it cannot be read (ferrite-conformance's reader, which the conformance
/// check and `ferrite doctor --check-device` use too).
pub fn try_load(path: &Path) -> Result<Vec<(String, Tensor)>, String> {
    ferrite_conformance::read_safetensors(path).map_err(|e| e.to_string())
}

/// [`try_load`], panicking with its message.
pub fn load(path: &Path) -> Vec<(String, Tensor)> {
    try_load(path).unwrap_or_else(|e| panic!("{e}"))
}

/// [`load`] for files whose tensors are all F32 (the op and layer cases); a tensor of another
/// dtype fails the test.
pub fn load_f32(path: &Path) -> Vec<(String, Tensor)> {
    let fx = load(path);
    for (name, t) in &fx {
        assert_eq!(t.dtype(), DType::F32, "{}: {name}", path.display());
    }
    fx
}

/// The tensor `name` of a loaded fixture; `Err` when the file lacks it.
pub fn try_get<'a>(fx: &'a [(String, Tensor)], name: &str) -> Result<&'a Tensor, String> {
    fx.iter().find(|(n, _)| n == name).map(|(_, t)| t).ok_or_else(|| format!("fixture lacks `{name}`"))
}

/// [`try_get`], panicking with its message.
pub fn get<'a>(fx: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    try_get(fx, name).unwrap_or_else(|e| panic!("{e}"))
}

/// The cases of the fixtures' `models/manifest.json` whose `op` is one of `ops` (every case when
/// `ops` is empty), with the `models/` folder their files are in; `None` after
/// [`reference_or_skip`](crate::reference_or_skip)'s message when the fixtures are missing.
pub fn model_cases(ops: &[&str]) -> Option<(PathBuf, Vec<Value>)> {
    let dir = crate::reference_or_skip("models/manifest.json")?.join("models");
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("models/manifest.json is readable");
    let m: Value = serde_json::from_str(&text).expect("models/manifest.json is valid JSON");
    let all = m["cases"].as_array().expect("models/manifest.json has a `cases` list");
    let cases =
        all.iter().filter(|c| ops.is_empty() || ops.contains(&c["op"].as_str().unwrap_or(""))).cloned().collect();
    Some((dir, cases))
}

/// A nested JSON list of numbers (a case attribute such as a target or a weight) as its values in
/// row-major order and its shape (`[]` for a single number); panics on anything else.
pub fn nested(v: &Value) -> (Vec<f64>, Vec<usize>) {
    ferrite_conformance::nested(v).unwrap_or_else(|| panic!("not a nested list of numbers: {v}"))
}
