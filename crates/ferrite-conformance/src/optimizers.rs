//! The `train/` cases: optimizer trajectories (SGD with momentum, Adam, AdamW with gradient
//! accumulation) on PyTorch's fixed `Linear(8,16) - Tanh - Linear(16,3)` with cross-entropy, every
//! step's loss and the final parameters within 1e-5 of PyTorch's; and GradScaler's dynamic loss
//! scale over a sequence of real overflows, equal to PyTorch's at every step.

use std::path::Path;

use ferrite_optim::{Adam, AdamConfig, GradScaler, GradScalerConfig, Optimizer, Sgd, SgdConfig};
use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
use ferrite_tensor::{Device, Tensor};
use serde_json::Value;

use crate::ConformanceError;
use crate::fixture::{Fixture, cases, f64_or, json};
use crate::grad_case::guarded;
use crate::report::Outcome;

/// The largest difference from PyTorch a trajectory may have (losses and final parameters).
const TRAJECTORY_TOLERANCE: f64 = 1e-5;

/// PyTorch's parameter names of the fixed model.
const PARAM_NAMES: [&str; 4] = ["0.weight", "0.bias", "2.weight", "2.bias"];

pub(crate) fn run_trajectories(dir: &Path, device: &Device) -> Result<Vec<(String, Outcome)>, ConformanceError> {
    let cases = cases(dir, "train/manifest.json")?;
    let mut out = Vec::new();
    if cases.is_empty() {
        out.push(("trajectories".into(), Outcome::Failed { reason: "train/manifest.json lists no case".into() }));
    }
    for c in &cases {
        let name = c["name"].as_str().unwrap_or("?").to_string();
        out.push((name, guarded(|| trajectory(&dir.join("train"), c, device))));
    }
    Ok(out)
}

fn count(c: &Value, key: &str) -> Result<usize, String> {
    c.get(key).and_then(Value::as_u64).map(|v| v as usize).ok_or_else(|| format!("the case has no `{key}`"))
}

fn optimizer(spec: &Value, params: Vec<Tensor>) -> Result<Box<dyn Optimizer>, String> {
    let kind = spec.get("kind").and_then(Value::as_str).ok_or("optimizer.kind is missing")?;
    let opt: Box<dyn Optimizer> = match kind {
        "sgd" => {
            let c = SgdConfig::new(f64_or(spec, "lr", 1e-3))
                .momentum(f64_or(spec, "momentum", 0.0))
                .dampening(f64_or(spec, "dampening", 0.0))
                .weight_decay(f64_or(spec, "weight_decay", 0.0))
                .nesterov(spec.get("nesterov").and_then(Value::as_bool).unwrap_or(false));
            Box::new(Sgd::new(params, c).map_err(|e| e.to_string())?)
        }
        "adam" | "adamw" => {
            let lr = f64_or(spec, "lr", 1e-3);
            let base = if kind == "adam" { AdamConfig::adam(lr) } else { AdamConfig::adamw(lr) };
            let (b1, b2) = match spec
                .get("betas")
                .and_then(Value::as_array)
                .map(|b| (b[0].as_f64(), b.get(1).and_then(Value::as_f64)))
            {
                None => base.betas,
                Some((Some(b1), Some(b2))) => (b1, b2),
                Some(_) => return Err("optimizer.betas is not two numbers".into()),
            };
            let c = base.clone().betas(b1, b2).eps(f64_or(spec, "eps", base.eps)).weight_decay(f64_or(
                spec,
                "weight_decay",
                base.weight_decay,
            ));
            Box::new(Adam::new(params, c).map_err(|e| e.to_string())?)
        }
        other => return Err(format!("no runner for optimizer `{other}`")),
    };
    Ok(opt)
}

/// Mean cross-entropy of the model with parameters `p` on rows `x` against classes `y`.
fn mlp_loss(p: &[Tensor], x: &Tensor, y: &Tensor) -> ferrite_tensor::Result<Tensor> {
    let h = x.linear(&p[0], Some(&p[1]))?.tanh()?;
    cross_entropy(&h.linear(&p[2], Some(&p[3]))?, y, &CrossEntropyOptions::default())
}

fn trajectory(train: &Path, c: &Value, dev: &Device) -> Result<f64, String> {
    let name = c.get("name").and_then(Value::as_str).ok_or("the case has no `name`")?;
    let (steps, accum, batch) = (count(c, "steps")?, count(c, "accum")?, count(c, "batch")?);
    let fx = Fixture::read(&train.join(format!("{name}.safetensors")))?;
    let (x, y) = (fx.on("X", dev)?, fx.on("Y", dev)?);
    let want_losses = fx.get("losses")?.to_vec_f64().map_err(|e| e.to_string())?;
    let params: Vec<Tensor> = PARAM_NAMES
        .iter()
        .map(|n| {
            fx.on(&format!("init.{n}"), dev)?
                .deep_clone()
                .and_then(|t| t.requires_grad_(true))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, String>>()?;
    let mut opt = optimizer(c.get("optimizer").ok_or("the case has no `optimizer`")?, params.clone())?;
    let e = |e: ferrite_tensor::TensorError| e.to_string();
    let mut worst = 0.0f64;
    for s in 0..steps {
        let mut total = 0.0f32;
        for a in 0..accum {
            let start = (s * accum + a) * batch;
            let (xb, yb) = (x.narrow(0, start, batch).map_err(e)?, y.narrow(0, start, batch).map_err(e)?);
            let loss = mlp_loss(&params, &xb, &yb).and_then(|l| l.div_scalar(accum as f64)).map_err(e)?;
            loss.backward().map_err(e)?;
            total += loss.item().map_err(e)? as f32;
        }
        opt.step().map_err(|e| format!("step {s}: {e}"))?;
        opt.zero_grad().map_err(|e| e.to_string())?;
        let want = *want_losses.get(s).ok_or_else(|| format!("`losses` has no step {s}"))?;
        let d = (total as f64 - want).abs();
        if d.is_nan() || d > TRAJECTORY_TOLERANCE {
            return Err(format!("step {s}: loss {total}, PyTorch's {want} (|diff| {d:.3e})"));
        }
        worst = worst.max(d);
    }
    for (p, n) in params.iter().zip(PARAM_NAMES) {
        let d =
            crate::check_close(&format!("final.{n}"), p, fx.get(&format!("final.{n}"))?, 0.0, TRAJECTORY_TOLERANCE)?;
        worst = worst.max(d);
    }
    Ok(worst)
}

pub(crate) fn run_grad_scaler(dir: &Path, device: &Device) -> Result<Vec<(String, Outcome)>, ConformanceError> {
    let spec = json(dir, "train/grad_scaler.json")?;
    Ok(vec![("grad_scaler".into(), guarded(|| grad_scaler(&spec, device)))])
}

/// Scale trajectory: each step a real overflow (an infinite gradient) when the spec says
/// `found_inf`, else a finite one; the step must be skipped exactly then, leave the parameters
/// untouched, and the scale after `update` must equal PyTorch's.
fn grad_scaler(spec: &Value, dev: &Device) -> Result<f64, String> {
    let num = |k: &str| spec.get(k).and_then(Value::as_f64).ok_or_else(|| format!("grad_scaler.json has no `{k}`"));
    let cfg = GradScalerConfig {
        init_scale: num("init_scale")?,
        growth_factor: num("growth_factor")?,
        backoff_factor: num("backoff_factor")?,
        growth_interval: spec
            .get("growth_interval")
            .and_then(Value::as_i64)
            .ok_or("grad_scaler.json has no `growth_interval`")?,
        enabled: true,
    };
    let e = |e: ferrite_tensor::TensorError| e.to_string();
    let mut scaler = GradScaler::new(cfg).map_err(|e| e.to_string())?;
    let w = Tensor::from_vec(vec![0.5f32, -0.25], &[2], dev).and_then(|t| t.requires_grad_(true)).map_err(e)?;
    let mut opt = Sgd::new(vec![w.clone()], SgdConfig::new(0.01)).map_err(|e| e.to_string())?;
    let steps = spec.get("steps").and_then(Value::as_array).ok_or("grad_scaler.json has no `steps`")?;
    for (i, st) in steps.iter().enumerate() {
        let found_inf =
            st.get("found_inf").and_then(Value::as_bool).ok_or_else(|| format!("step {i} has no `found_inf`"))?;
        let factor = if found_inf { f64::INFINITY } else { 1.0 };
        let loss = w.mul_scalar(factor).and_then(|l| l.sum()).map_err(e)?;
        scaler.scale(&loss).map_err(|e| e.to_string())?.backward().map_err(e)?;
        let before = w.to_vec::<f32>().map_err(e)?;
        let stepped = scaler.step(&mut opt).map_err(|e| e.to_string())?;
        scaler.update().map_err(|e| e.to_string())?;
        opt.zero_grad().map_err(|e| e.to_string())?;
        if stepped == found_inf {
            return Err(format!("step {i}: stepped = {stepped} with found_inf = {found_inf}"));
        }
        if found_inf && w.to_vec::<f32>().map_err(e)? != before {
            return Err(format!("step {i}: a step with inf gradients changed the parameters"));
        }
        let want =
            st.get("scale_after").and_then(Value::as_f64).ok_or_else(|| format!("step {i} has no `scale_after`"))?;
        if scaler.get_scale() != want {
            return Err(format!("step {i}: scale {} after update, PyTorch's {want}", scaler.get_scale()));
        }
    }
    Ok(0.0)
}
