//! The `ops/` cases: each op of `ops/manifest.json` through ferrite's tensor API — forward output
//! and every input gradient PyTorch recorded.

use std::path::Path;

use ferrite_tensor::functional as F;
use ferrite_tensor::{Device, Tensor};
use serde_json::Value;

use crate::ConformanceError;
use crate::fixture::{CaseSpec, Fixture, cases, f64_or};
use crate::grad_case::{self, guarded};
use crate::report::Outcome;

pub(crate) fn run(dir: &Path, device: &Device) -> Result<Vec<(String, Outcome)>, ConformanceError> {
    let cases = cases(dir, "ops/manifest.json")?;
    Ok(cases
        .iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap_or("?").to_string();
            let outcome = guarded(|| {
                let spec = CaseSpec::of(c)?;
                let fx = Fixture::read(&dir.join("ops").join(format!("{}.safetensors", spec.name)))?;
                let has_grad = c.get("has_grad").and_then(Value::as_bool).unwrap_or(false);
                let grads: Vec<usize> =
                    (0..spec.inputs).filter(|i| has_grad && fx.has(&format!("grad_input.{i}"))).collect();
                grad_case::run(&fx, &spec, &grads, &[], device, |x| forward(&spec, x).map(|y| (y, vec![])))
            });
            (name, outcome)
        })
        .collect())
}

fn int(a: &Value, k: &str) -> Result<i64, String> {
    a.get(k).and_then(Value::as_i64).ok_or_else(|| format!("attrs.{k} is missing"))
}

fn ints(a: &Value, k: &str) -> Result<Vec<i64>, String> {
    a.get(k)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("attrs.{k} is missing"))?
        .iter()
        .map(|v| v.as_i64().ok_or_else(|| format!("attrs.{k} holds {v}, not an integer")))
        .collect()
}

/// The op of case `spec` on its inputs `x`.
fn forward(spec: &CaseSpec<'_>, x: &[Tensor]) -> Result<Tensor, String> {
    let a = spec.attrs;
    let need = |n: usize| {
        if x.len() < n { Err(format!("`{}` takes {n} inputs, the case has {}", spec.op, x.len())) } else { Ok(()) }
    };
    need(1)?;
    let r: ferrite_tensor::Result<Tensor> = match spec.op {
        "add" => {
            need(2)?;
            x[0].add(&x[1])
        }
        "sub" => {
            need(2)?;
            x[0].sub(&x[1])
        }
        "mul" => {
            need(2)?;
            x[0].mul(&x[1])
        }
        "div" => {
            need(2)?;
            x[0].div(&x[1])
        }
        "neg" => x[0].neg(),
        "exp" => x[0].exp(),
        "log" => x[0].log(),
        "sqrt" => x[0].sqrt(),
        "pow" => x[0].pow_scalar(a.get("exponent").and_then(Value::as_f64).ok_or("attrs.exponent is missing")?),
        "relu" => x[0].relu(),
        "sigmoid" => x[0].sigmoid(),
        "tanh" => x[0].tanh(),
        "gelu" => match a.get("approximate").and_then(Value::as_str) {
            Some("tanh") => x[0].gelu_tanh(),
            _ => x[0].gelu(),
        },
        "silu" => x[0].silu(),
        "sum" => match a.get("dim") {
            Some(_) => x[0].sum_dims(&[int(a, "dim")?], a["keepdim"].as_bool().unwrap_or(false)),
            None => x[0].sum(),
        },
        "mean" => x[0].mean_dims(&[int(a, "dim")?], a["keepdim"].as_bool().unwrap_or(false)),
        "max" => x[0].max_dim(int(a, "dim")?, false).map(|(v, _)| v),
        "softmax" => x[0].softmax(int(a, "dim")?),
        "log_softmax" => x[0].log_softmax(int(a, "dim")?),
        "transpose" => x[0].transpose(int(a, "dim0")?, int(a, "dim1")?),
        "permute" => x[0].permute(&ints(a, "dims")?),
        "reshape" => x[0].reshape(&ints(a, "shape")?),
        "narrow" => {
            let (start, len) = (int(a, "start")?, int(a, "length")?);
            if start < 0 || len < 0 {
                return Err(format!("attrs.start {start} / attrs.length {len} must not be negative"));
            }
            x[0].narrow(int(a, "dim")?, start as usize, len as usize)
        }
        "cat" => Tensor::cat(&x.iter().collect::<Vec<_>>(), int(a, "dim")?),
        "matmul" => {
            need(2)?;
            x[0].matmul(&x[1])
        }
        "linear" => {
            need(3)?;
            x[0].linear(&x[1], Some(&x[2]))
        }
        "layer_norm" => {
            need(3)?;
            let ns: Vec<usize> = ints(a, "normalized_shape")?.into_iter().map(|v| v.max(0) as usize).collect();
            F::layer_norm(&x[0], &ns, Some(&x[1]), Some(&x[2]), f64_or(a, "eps", 1e-5))
        }
        "cross_entropy" => {
            let t = ints(a, "target")?;
            let n = t.len();
            let target = Tensor::from_vec(t, &[n], x[0].device()).map_err(|e| e.to_string())?;
            F::cross_entropy(&x[0], &target, &Default::default())
        }
        "mse_loss" => {
            need(2)?;
            F::mse_loss(&x[0], &x[1])
        }
        "embedding" => {
            let (v, shape) =
                a.get("indices").and_then(crate::nested).ok_or("attrs.indices is not a list of integers")?;
            let idx = Tensor::from_vec(v.into_iter().map(|i| i as i64).collect(), &shape, x[0].device())
                .map_err(|e| e.to_string())?;
            F::embedding(&idx, &x[0])
        }
        "sdpa" => {
            need(3)?;
            F::scaled_dot_product_attention(&x[0], &x[1], &x[2], None, a["is_causal"].as_bool().unwrap_or(false), None)
        }
        "lstm" => {
            need(5)?;
            F::lstm(&x[0], &x[1], &x[2], Some(&x[3]), Some(&x[4]), None, true).map(|(out, _)| out)
        }
        other => return Err(format!("no runner for op `{other}`")),
    };
    r.map_err(|e| e.to_string())
}
