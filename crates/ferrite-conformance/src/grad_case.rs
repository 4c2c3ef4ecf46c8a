//! The shape most reference cases share: the fixture's inputs on the device (those whose gradient
//! is checked requiring grad), the op, its output and extra outputs against PyTorch's, then one
//! backward from PyTorch's `grad_output` and each input gradient against PyTorch's. Also the guard
//! every case runs under, so a device that panics fails that case instead of the whole check.

use std::panic::{AssertUnwindSafe, catch_unwind};

use ferrite_tensor::{Device, Tensor};

use crate::closeness::check_close;
use crate::fixture::{CaseSpec, Fixture};
use crate::report::Outcome;

/// What a case's op returns: the output and its extra outputs by name (batch norm's running
/// statistics, a recurrent layer's `h_n`).
pub(crate) type Produced = (Tensor, Vec<(String, Tensor)>);

/// Runs the case `spec` of fixture `fx` on `device` through `op`; the largest |difference| of every
/// compared tensor, or the first that is out of tolerance.
pub(crate) fn run(
    fx: &Fixture,
    spec: &CaseSpec<'_>,
    grads: &[usize],
    extras: &[String],
    device: &Device,
    op: impl FnOnce(&[Tensor]) -> Result<Produced, String>,
) -> Result<f64, String> {
    let inputs: Vec<Tensor> = (0..spec.inputs)
        .map(|i| {
            let t = fx.on(&format!("input.{i}"), device)?;
            if grads.contains(&i) { t.requires_grad_(true).map_err(|e| e.to_string()) } else { Ok(t) }
        })
        .collect::<Result<_, String>>()?;
    let (out, produced) = op(&inputs)?;
    let (rtol, atol) = (spec.rtol, spec.atol);
    let mut worst = check_close("output", &out, fx.get("output")?, rtol, atol)?;
    for extra in extras {
        let got = produced
            .iter()
            .find(|(n, _)| n == extra)
            .map(|(_, t)| t)
            .ok_or_else(|| format!("the op produced no `{extra}`"))?;
        worst = worst.max(check_close(&format!("extra.{extra}"), got, fx.get(&format!("extra.{extra}"))?, rtol, atol)?);
    }
    if !grads.is_empty() {
        let go = fx.on("grad_output", device)?;
        out.backward_with(&go, false).map_err(|e| format!("backward: {e}"))?;
        for &i in grads {
            let g = inputs[i].grad().ok_or_else(|| format!("input {i} received no gradient"))?;
            worst = worst.max(check_close(
                &format!("grad_input.{i}"),
                &g,
                fx.get(&format!("grad_input.{i}"))?,
                rtol,
                atol,
            )?);
        }
    }
    Ok(worst)
}

/// Runs `case` and turns its result — or its panic — into an [`Outcome`].
pub(crate) fn guarded(case: impl FnOnce() -> Result<f64, String>) -> Outcome {
    match catch_unwind(AssertUnwindSafe(case)) {
        Ok(Ok(max_abs_diff)) => Outcome::Passed { max_abs_diff },
        Ok(Err(reason)) => Outcome::Failed { reason },
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into());
            Outcome::Failed { reason: format!("panicked: {msg}") }
        }
    }
}

/// The `models/` manifest's cases whose op is in `ops`, each run through `one`, plus one failed
/// result per op of `ops` that has no case (a fixture folder that lost a family must not pass).
pub(crate) fn run_model_cases(
    dir: &std::path::Path,
    ops: &[&str],
    mut one: impl FnMut(&std::path::Path, &serde_json::Value) -> Result<f64, String>,
) -> Result<Vec<(String, Outcome)>, crate::ConformanceError> {
    let models = dir.join("models");
    let cases = crate::fixture::cases(dir, "models/manifest.json")?;
    let mut out = Vec::new();
    for op in ops {
        if !cases.iter().any(|c| c["op"] == *op) {
            out.push((
                format!("{op} (no case)"),
                Outcome::Failed { reason: format!("models/manifest.json has no `{op}` case") },
            ));
        }
    }
    for c in cases.iter().filter(|c| ops.contains(&c["op"].as_str().unwrap_or(""))) {
        let name = c["name"].as_str().unwrap_or("?").to_string();
        out.push((name, guarded(|| one(&models, c))));
    }
    Ok(out)
}
