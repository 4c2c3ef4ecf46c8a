//! Shared helpers of the integration tests: the PyTorch reference folder, a safetensors reader
//! into `StateDict`, closeness checks and the allocator figures of a `sim` device.
#![allow(dead_code)]

use std::path::PathBuf;

use ferrite_nn::StateDict;
use ferrite_tensor::{Device, Tensor};

/// The reference folder, or `None` after the shared skip-or-fail rule
/// (`ferrite_test_support::reference_or_skip`).
pub fn reference_or_skip() -> Option<PathBuf> {
    ferrite_test_support::reference_or_skip("ops/manifest.json")
}

/// Every tensor of a safetensors file (F32 and I64), in file order.
pub fn load_safetensors(path: &PathBuf) -> StateDict {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut named: Vec<(String, safetensors::tensor::TensorView<'_>)> = st.tensors();
    named.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    let mut sd = StateDict::new();
    for (name, view) in named {
        let t = match view.dtype() {
            safetensors::Dtype::F32 => {
                let v: Vec<f32> =
                    view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                Tensor::from_vec(v, view.shape(), &Device::Cpu).unwrap()
            }
            safetensors::Dtype::I64 => {
                let v: Vec<i64> =
                    view.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
                Tensor::from_vec(v, view.shape(), &Device::Cpu).unwrap()
            }
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        sd.insert(name, t);
    }
    sd
}

pub fn get<'a>(sd: &'a StateDict, k: &str) -> &'a Tensor {
    sd.get(k).unwrap_or_else(|| panic!("fixture lacks `{k}`"))
}

/// Panics with the worst element unless `got` ≈ `want` within `atol + rtol·|want|`.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let g = got.to_vec_f64().unwrap();
    let w = want.to_vec_f64().unwrap();
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= atol + rtol * b.abs(), "{what}: element {i} is {a} but PyTorch gives {b}");
    }
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
