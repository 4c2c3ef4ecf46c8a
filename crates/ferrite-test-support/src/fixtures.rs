//! Reading the PyTorch reference fixtures' safetensors files into ferrite tensors: one reader
//! instead of one per test file, so every suite reads the same bytes the same way.

use std::path::Path;

use ferrite_tensor::{DType, Device, Tensor};

/// Every tensor of a safetensors file (F32 and I64) on the CPU, in file order; `Err` naming the
/// file or tensor when it cannot be read.
pub fn try_load(path: &Path) -> Result<Vec<(String, Tensor)>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut named = st.tensors();
    named.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    let mut out = Vec::with_capacity(named.len());
    for (name, view) in named {
        let data = view.data();
        let t = match view.dtype() {
            safetensors::Dtype::F32 => {
                let v: Vec<f32> = data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                Tensor::from_vec(v, view.shape(), &Device::Cpu)
            }
            safetensors::Dtype::I64 => {
                let v: Vec<i64> = data
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect();
                Tensor::from_vec(v, view.shape(), &Device::Cpu)
            }
            other => return Err(format!("{}: {name}: unexpected dtype {other:?}", path.display())),
        }
        .map_err(|e| format!("{}: {name}: {e}", path.display()))?;
        out.push((name, t));
    }
    Ok(out)
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
