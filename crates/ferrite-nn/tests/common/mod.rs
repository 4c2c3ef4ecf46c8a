//! Shared helpers of the integration tests: the PyTorch reference folder, a safetensors reader
//! into `StateDict`, closeness checks and the allocator figures of a `sim` device.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ferrite_nn::StateDict;
use ferrite_tensor::Tensor;
// Re-exported: not every test binary that includes this module uses it.
#[allow(unused_imports)]
pub use ferrite_test_support::assert_close;

/// The reference folder, or `None` after the shared skip-or-fail rule
/// (`ferrite_test_support::reference_or_skip`).
pub fn reference_or_skip() -> Option<PathBuf> {
    ferrite_test_support::reference_or_skip("ops/manifest.json")
}

/// Every tensor of a safetensors file (F32 and I64), in file order (ferrite-test-support's reader).
pub fn load_safetensors(path: &Path) -> StateDict {
    ferrite_test_support::fixtures::load(path).into_iter().collect()
}

pub fn get<'a>(sd: &'a StateDict, k: &str) -> &'a Tensor {
    sd.get(k).unwrap_or_else(|| panic!("fixture lacks `{k}`"))
}

/// Bit-for-bit equality of two tensors' values.
pub fn assert_bits_equal(what: &str, a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape(), b.shape(), "{what}: shape");
    let (x, y) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        assert_eq!(p.to_bits(), q.to_bits(), "{what}: element {i} differs: {p} vs {q}");
    }
}

/// Bytes → MiB for printing.
pub fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}
