//! Reading the reference fixtures: their safetensors files (F32 and I64 tensors, in file order),
//! the manifests' cases, and the nested number lists and sizes of case attributes.

use std::path::{Path, PathBuf};

use ferrite_tensor::{Device, Tensor};
use serde_json::Value;

use crate::error::ConformanceError;

/// Every tensor of a safetensors file (F32 and I64) on the CPU, in file order.
pub fn read_safetensors(path: &Path) -> Result<Vec<(String, Tensor)>, ConformanceError> {
    let unreadable = |reason: String| ConformanceError::Unreadable { path: path.to_path_buf(), reason };
    let bytes = std::fs::read(path).map_err(|e| unreadable(e.to_string()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| unreadable(e.to_string()))?;
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
            other => return Err(unreadable(format!("{name}: dtype {other:?}, expected F32 or I64"))),
        }
        .map_err(|e| unreadable(format!("{name}: {e}")))?;
        out.push((name, t));
    }
    Ok(out)
}

/// One fixture file's tensors, looked up by name.
pub(crate) struct Fixture {
    tensors: Vec<(String, Tensor)>,
}

impl Fixture {
    pub(crate) fn read(path: &Path) -> Result<Fixture, String> {
        read_safetensors(path).map(|tensors| Fixture { tensors }).map_err(|e| e.to_string())
    }

    pub(crate) fn get(&self, name: &str) -> Result<&Tensor, String> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t).ok_or_else(|| format!("fixture lacks `{name}`"))
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.tensors.iter().any(|(n, _)| n == name)
    }

    /// `name` moved to `device`, detached from any graph (a fresh leaf).
    pub(crate) fn on(&self, name: &str, device: &Device) -> Result<Tensor, String> {
        self.get(name)?.detach().to_device(device).map_err(|e| format!("{name} to {device}: {e}"))
    }
}

/// The parsed JSON file `rel` of the fixture folder `dir`.
pub(crate) fn json(dir: &Path, rel: &str) -> Result<Value, ConformanceError> {
    let path: PathBuf = dir.join(rel);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ConformanceError::Unreadable { path: path.clone(), reason: e.to_string() })?;
    serde_json::from_str(&text).map_err(|e| ConformanceError::BadManifest { path, reason: e.to_string() })
}

/// The `cases` list of the manifest `rel` (`ops/manifest.json`, `models/manifest.json`, ...).
pub(crate) fn cases(dir: &Path, rel: &str) -> Result<Vec<Value>, ConformanceError> {
    let m = json(dir, rel)?;
    m["cases"]
        .as_array()
        .cloned()
        .ok_or_else(|| ConformanceError::BadManifest { path: dir.join(rel), reason: "it has no `cases` list".into() })
}

/// The common fields of a manifest case.
pub(crate) struct CaseSpec<'a> {
    pub name: &'a str,
    pub op: &'a str,
    pub attrs: &'a Value,
    pub inputs: usize,
    pub rtol: f64,
    pub atol: f64,
}

impl<'a> CaseSpec<'a> {
    pub(crate) fn of(c: &'a Value) -> Result<CaseSpec<'a>, String> {
        let field = |k: &str| c.get(k).ok_or_else(|| format!("the case has no `{k}`"));
        Ok(CaseSpec {
            name: field("name")?.as_str().ok_or("`name` is not a string")?,
            op: field("op")?.as_str().ok_or("`op` is not a string")?,
            attrs: c.get("attrs").unwrap_or(&Value::Null),
            inputs: field("inputs")?.as_u64().ok_or("`inputs` is not a count")? as usize,
            rtol: field("rtol")?.as_f64().ok_or("`rtol` is not a number")?,
            atol: field("atol")?.as_f64().ok_or("`atol` is not a number")?,
        })
    }

    /// The `models/` manifest's `grad_inputs`: the inputs whose gradients are compared.
    pub(crate) fn grad_inputs(c: &Value) -> Result<Vec<usize>, String> {
        indices(c.get("grad_inputs").ok_or("the case has no `grad_inputs`")?, "grad_inputs")
    }

    /// The `models/` manifest's `extra_outputs` (empty when absent).
    pub(crate) fn extra_outputs(c: &Value) -> Vec<String> {
        c.get("extra_outputs")
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(|s| s.as_str().map(String::from)).collect())
            .unwrap_or_default()
    }
}

/// A JSON list of non-negative integers.
pub(crate) fn indices(v: &Value, what: &str) -> Result<Vec<usize>, String> {
    v.as_array()
        .ok_or_else(|| format!("`{what}` is not a list"))?
        .iter()
        .map(|x| x.as_u64().map(|u| u as usize).ok_or_else(|| format!("`{what}` holds {x}, not a size")))
        .collect()
}

/// A list of sizes, or one size repeated for both spatial dimensions (`kernel_size: 2`).
pub(crate) fn sizes(v: &Value, what: &str) -> Result<Vec<usize>, String> {
    match v {
        Value::Number(n) => {
            let s = n.as_u64().ok_or_else(|| format!("`{what}` is {n}, not a size"))? as usize;
            Ok(vec![s, s])
        }
        _ => indices(v, what),
    }
}

/// Attribute `key` as exactly `N` sizes, `default` in every place when absent or null.
pub(crate) fn sizes_n<const N: usize>(a: &Value, key: &str, default: usize) -> Result<[usize; N], String> {
    match a.get(key) {
        None | Some(Value::Null) => Ok([default; N]),
        Some(v) => {
            let s = sizes(v, key)?;
            let s = if N == 1 && s.len() == 2 && s[0] == s[1] { vec![s[0]] } else { s };
            s.try_into().map_err(|s: Vec<usize>| format!("attrs.{key} = {s:?} does not have {N} entries"))
        }
    }
}

/// Attribute `key` as a number, `default` when absent.
pub(crate) fn f64_or(a: &Value, key: &str, default: f64) -> f64 {
    a.get(key).and_then(Value::as_f64).unwrap_or(default)
}

/// Attribute `key` as a flag, `default` when absent.
pub(crate) fn bool_or(a: &Value, key: &str, default: bool) -> bool {
    a.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// A nested JSON list of numbers (a case attribute such as a target or a weight) as its values in
/// row-major order and its shape (`[]` for a single number); `None` when something in it is not a
/// number or the rows are ragged.
pub fn nested(v: &Value) -> Option<(Vec<f64>, Vec<usize>)> {
    match v.as_array() {
        None => Some((vec![v.as_f64()?], vec![])),
        Some(items) => {
            let parts: Vec<(Vec<f64>, Vec<usize>)> = items.iter().map(nested).collect::<Option<_>>()?;
            let inner = parts.first().map(|p| p.1.clone()).unwrap_or_default();
            if parts.iter().any(|p| p.1 != inner) {
                return None;
            }
            let mut shape = vec![items.len()];
            shape.extend(inner);
            Some((parts.into_iter().flat_map(|p| p.0).collect(), shape))
        }
    }
}

/// Attribute `key` (a nested number list) as an f32 tensor on `device`.
pub(crate) fn float_tensor(a: &Value, key: &str, device: &Device) -> Result<Tensor, String> {
    let (v, shape) = a.get(key).and_then(nested).ok_or_else(|| format!("attrs.{key} is not a list of numbers"))?;
    Tensor::from_vec(v.into_iter().map(|x| x as f32).collect(), &shape, device).map_err(|e| e.to_string())
}

/// Attribute `key` (a nested list of class indices) as an i64 tensor on `device`.
pub(crate) fn class_tensor(a: &Value, key: &str, device: &Device) -> Result<Tensor, String> {
    let (v, shape) = a.get(key).and_then(nested).ok_or_else(|| format!("attrs.{key} is not a list of numbers"))?;
    Tensor::from_vec(v.into_iter().map(|x| x as i64).collect(), &shape, device).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_lists_give_values_and_shape_and_ragged_ones_none() {
        let v: Value = serde_json::from_str("[[1, 2, 3], [4, 5, 6]]").unwrap();
        assert_eq!(nested(&v), Some((vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], vec![2, 3])));
        assert_eq!(nested(&Value::from(2.5)), Some((vec![2.5], vec![])));
        assert_eq!(nested(&serde_json::from_str("[[1], [2, 3]]").unwrap()), None);
        assert_eq!(nested(&serde_json::from_str("[\"a\"]").unwrap()), None);
    }

    #[test]
    fn sizes_accept_one_number_for_both_dimensions() {
        let a: Value = serde_json::from_str(r#"{"k": 3, "s": [1, 2], "n": null}"#).unwrap();
        assert_eq!(sizes_n::<2>(&a, "k", 0), Ok([3, 3]));
        assert_eq!(sizes_n::<2>(&a, "s", 0), Ok([1, 2]));
        assert_eq!(sizes_n::<2>(&a, "n", 7), Ok([7, 7]));
        assert_eq!(sizes_n::<1>(&a, "k", 0), Ok([3]));
        assert!(sizes_n::<1>(&a, "s", 0).is_err());
    }
}
