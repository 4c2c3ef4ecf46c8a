//! Helpers shared by the integration tests: the PyTorch fixture folder and a tiny MLP built from
//! raw tensors (`Linear(8,16) - Tanh - Linear(16,3)`, PyTorch's parameter order).

#![allow(dead_code)]

use std::path::PathBuf;

use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
use ferrite_tensor::{Device, Tensor};
// Re-exported: not every test binary that includes this module uses them.
#[allow(unused_imports)]
pub use ferrite_test_support::{fixtures::get, params::bits};

/// The fixture folder's `train/` subfolder, or `None` after the shared skip-or-fail rule
/// (`ferrite_test_support::reference_or_skip`).
pub fn train_dir() -> Option<PathBuf> {
    ferrite_test_support::reference_or_skip("train/manifest.json").map(|d| d.join("train"))
}

/// The fixture folder's `models/schedules.json`, parsed, or `None` after ferrite-test-support's
/// skip-or-fail rule when the fixtures are absent.
pub fn models_schedules() -> Option<serde_json::Value> {
    let f = ferrite_test_support::reference_or_skip("models/schedules.json")?.join("models").join("schedules.json");
    let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
}

/// Every tensor of a safetensors file (ferrite-test-support's reader) as a ferrite tensor on
/// `device`.
pub fn load_safetensors(path: &std::path::Path, device: &Device) -> Vec<(String, Tensor)> {
    let fx = ferrite_test_support::fixtures::load(path);
    fx.into_iter().map(|(name, t)| (name, t.to_device(device).unwrap())).collect()
}

/// PyTorch's parameter names of `Linear(8,16) - Tanh - Linear(16,3)`.
pub const PARAM_NAMES: [&str; 4] = ["0.weight", "0.bias", "2.weight", "2.bias"];

/// Fresh leaf parameters (own storage) holding `prefix.<name>` values.
pub fn leaf_params(ts: &[(String, Tensor)], prefix: &str) -> Vec<Tensor> {
    PARAM_NAMES
        .iter()
        .map(|n| get(ts, &format!("{prefix}.{n}")).deep_clone().unwrap().requires_grad_(true).unwrap())
        .collect()
}

/// Mean cross-entropy of the MLP on `x` (rows) against `y`.
pub fn mlp_loss(p: &[Tensor], x: &Tensor, y: &Tensor) -> Tensor {
    let h = x.linear(&p[0], Some(&p[1])).unwrap().tanh().unwrap();
    let logits = h.linear(&p[2], Some(&p[3])).unwrap();
    cross_entropy(&logits, y, &CrossEntropyOptions::default()).unwrap()
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}
