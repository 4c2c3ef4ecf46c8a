//! Parity with PyTorch: every case of `ops/manifest.json` in the PyTorch reference fixtures
//! (`../shared/fixtures/pytorch-reference`, or `$FERRITE_PYTORCH_REFERENCE`): forward output and
//! every input gradient within the case's rtol/atol. Prints one line per case and a final
//! `N passed, N failed` line; exits non-zero if any case fails.
//!
//! Every case runs on every device under test: `$FERRITE_TEST_DEVICES` (comma-separated, e.g.
//! `cpu,gpu:0`), by default `cpu` and every GPU adapter this machine has (Mesa's lavapipe counts:
//! CI runs the suite on it). Inputs are moved to the device, results read back.

use std::path::Path;

use ferrite_tensor::{Device, Tensor};
use ferrite_test_support::fixtures::try_get as get;

struct Case {
    name: String,
    op: String,
    attrs: serde_json::Value,
    inputs: usize,
    has_grad: bool,
    rtol: f64,
    atol: f64,
}

/// The fixture reader and closeness check of ferrite-test-support, as this harness's `Result`s.
fn load(path: &Path) -> Result<Vec<(String, Tensor)>, String> {
    let fx = ferrite_test_support::fixtures::try_load(path)?;
    match fx.iter().find(|(_, t)| t.dtype() != ferrite_tensor::DType::F32) {
        Some((name, t)) => Err(format!("{name}: unexpected dtype {:?}", t.dtype())),
        None => Ok(fx),
    }
}

fn close(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    ferrite_test_support::check_close(what, got, want, rtol, atol).map(|_| ())
}

fn attr_i64(a: &serde_json::Value, k: &str) -> Result<i64, String> {
    a.get(k).and_then(|v| v.as_i64()).ok_or_else(|| format!("attr `{k}` missing"))
}

/// The forward of a case; `None` = not implemented at this layer (reported as skipped).
fn forward(case: &Case, x: &[Tensor]) -> Result<Option<Tensor>, String> {
    let a = &case.attrs;
    let e = |r: ferrite_tensor::Result<Tensor>| r.map_err(|e| e.to_string()).map(Some);
    match case.op.as_str() {
        "add" => e(x[0].add(&x[1])),
        "sub" => e(x[0].sub(&x[1])),
        "mul" => e(x[0].mul(&x[1])),
        "div" => e(x[0].div(&x[1])),
        "neg" => e(x[0].neg()),
        "exp" => e(x[0].exp()),
        "log" => e(x[0].log()),
        "sqrt" => e(x[0].sqrt()),
        "pow" => e(x[0].pow_scalar(a["exponent"].as_f64().ok_or("exponent")?)),
        "relu" => e(x[0].relu()),
        "sigmoid" => e(x[0].sigmoid()),
        "tanh" => e(x[0].tanh()),
        "gelu" => match a["approximate"].as_str() {
            Some("tanh") => e(x[0].gelu_tanh()),
            _ => e(x[0].gelu()),
        },
        "silu" => e(x[0].silu()),
        "sum" => match a.get("dim") {
            Some(d) => e(x[0].sum_dims(&[d.as_i64().ok_or("dim")?], a["keepdim"].as_bool().unwrap_or(false))),
            None => e(x[0].sum()),
        },
        "mean" => e(x[0].mean_dims(&[attr_i64(a, "dim")?], a["keepdim"].as_bool().unwrap_or(false))),
        "max" => x[0].max_dim(attr_i64(a, "dim")?, false).map(|(v, _)| Some(v)).map_err(|e| e.to_string()),
        "softmax" => e(x[0].softmax(attr_i64(a, "dim")?)),
        "log_softmax" => e(x[0].log_softmax(attr_i64(a, "dim")?)),
        "transpose" => e(x[0].transpose(attr_i64(a, "dim0")?, attr_i64(a, "dim1")?)),
        "permute" => {
            let dims: Vec<i64> = a["dims"].as_array().ok_or("dims")?.iter().filter_map(|v| v.as_i64()).collect();
            e(x[0].permute(&dims))
        }
        "reshape" => {
            let s: Vec<i64> = a["shape"].as_array().ok_or("shape")?.iter().filter_map(|v| v.as_i64()).collect();
            e(x[0].reshape(&s))
        }
        "narrow" => {
            e(x[0].narrow(attr_i64(a, "dim")?, attr_i64(a, "start")? as usize, attr_i64(a, "length")? as usize))
        }
        "cat" => e(Tensor::cat(&x.iter().collect::<Vec<_>>(), attr_i64(a, "dim")?)),
        "matmul" => e(x[0].matmul(&x[1])),
        "linear" => e(x[0].linear(&x[1], Some(&x[2]))),
        "layer_norm" => {
            let ns: Vec<usize> = a["normalized_shape"]
                .as_array()
                .ok_or("normalized_shape")?
                .iter()
                .filter_map(|v| v.as_u64().map(|u| u as usize))
                .collect();
            e(ferrite_tensor::functional::layer_norm(
                &x[0],
                &ns,
                Some(&x[1]),
                Some(&x[2]),
                a["eps"].as_f64().unwrap_or(1e-5),
            ))
        }
        "cross_entropy" => {
            let t: Vec<i64> = a["target"].as_array().ok_or("target")?.iter().filter_map(|v| v.as_i64()).collect();
            let n = t.len();
            let target = Tensor::from_vec(t, &[n], x[0].device()).map_err(|e| e.to_string())?;
            e(ferrite_tensor::functional::cross_entropy(&x[0], &target, &Default::default()))
        }
        "mse_loss" => e(ferrite_tensor::functional::mse_loss(&x[0], &x[1])),
        "embedding" => {
            let rows = a["indices"].as_array().ok_or("indices")?;
            let shape = [rows.len(), rows.first().and_then(|r| r.as_array()).map(|r| r.len()).unwrap_or(0)];
            let flat: Vec<i64> = rows
                .iter()
                .flat_map(|r| r.as_array().cloned().unwrap_or_default())
                .filter_map(|v| v.as_i64())
                .collect();
            let idx = Tensor::from_vec(flat, &shape, x[0].device()).map_err(|e| e.to_string())?;
            e(ferrite_tensor::functional::embedding(&idx, &x[0]))
        }
        "sdpa" => e(ferrite_tensor::functional::scaled_dot_product_attention(
            &x[0],
            &x[1],
            &x[2],
            None,
            a["is_causal"].as_bool().unwrap_or(false),
            None,
        )),
        "lstm" => {
            let (out, _) = ferrite_tensor::functional::lstm(&x[0], &x[1], &x[2], Some(&x[3]), Some(&x[4]), None, true)
                .map_err(|e| e.to_string())?;
            Ok(Some(out))
        }
        other => Err(format!("unknown op `{other}`")),
    }
}

fn run_case(dir: &Path, case: &Case, device: &Device) -> Result<bool, String> {
    let fx = load(&dir.join("ops").join(format!("{}.safetensors", case.name)))?;
    let inputs: Vec<Tensor> = (0..case.inputs)
        .map(|i| {
            let t = get(&fx, &format!("input.{i}"))?.to_device(device).map_err(|e| e.to_string())?;
            if case.has_grad && fx.iter().any(|(n, _)| n == &format!("grad_input.{i}")) {
                t.requires_grad_(true).map_err(|e| e.to_string())
            } else {
                Ok(t)
            }
        })
        .collect::<Result<_, _>>()?;
    let Some(out) = forward(case, &inputs)? else { return Ok(false) };
    close("output", &out, get(&fx, "output")?, case.rtol, case.atol)?;
    if case.has_grad {
        let go = get(&fx, "grad_output")?.to_device(device).map_err(|e| e.to_string())?;
        out.backward_with(&go, false).map_err(|e| e.to_string())?;
        for (i, t) in inputs.iter().enumerate() {
            if let Ok(want) = get(&fx, &format!("grad_input.{i}")) {
                let g = t.grad().ok_or_else(|| format!("input {i} received no gradient"))?;
                close(&format!("grad_input.{i}"), &g, want, case.rtol, case.atol)?;
            }
        }
    }
    Ok(true)
}

fn main() {
    let Some(dir) = ferrite_test_support::reference_or_skip("ops/manifest.json") else { return };
    let manifest = dir.join("ops/manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    let m: serde_json::Value = serde_json::from_str(&text).expect("manifest.json is valid JSON");
    let cases = m["cases"].as_array().expect("manifest has cases");
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    ferrite_test_support::for_each_device(|device| {
        for c in cases {
            let case = Case {
                name: c["name"].as_str().unwrap_or("?").to_string(),
                op: c["op"].as_str().unwrap_or("?").to_string(),
                attrs: c["attrs"].clone(),
                inputs: c["inputs"].as_u64().unwrap_or(0) as usize,
                has_grad: c["has_grad"].as_bool().unwrap_or(false),
                rtol: c["rtol"].as_f64().unwrap_or(1e-5),
                atol: c["atol"].as_f64().unwrap_or(1e-5),
            };
            match run_case(&dir, &case, device) {
                Ok(true) => {
                    passed += 1;
                    println!("parity {:<6} {:<24} ok", device.to_string(), case.name);
                }
                Ok(false) => {
                    skipped += 1;
                    println!(
                        "parity {:<6} {:<24} skipped (layer of ferrite-nn; checked by its parity suite)",
                        device.to_string(),
                        case.name
                    );
                }
                Err(e) => {
                    failed += 1;
                    println!("parity {:<6} {:<24} FAILED: {e}", device.to_string(), case.name);
                }
            }
        }
    });
    println!("{passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        std::process::exit(1);
    }
}
