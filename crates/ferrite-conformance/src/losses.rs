//! The loss cases of `models/` (`nll_loss`, `cross_entropy`, `bce_with_logits`,
//! `binary_cross_entropy`, `smooth_l1_loss`, `huber_loss`, `kl_div`). Targets, weights and the
//! reduction come from the attributes; `attrs.applied_to` names the function PyTorch applied to
//! `input.0` before the loss (`log_softmax(input)`, `sigmoid(input)`), which is applied here too,
//! so `grad_input.0` is checked through it.

use std::path::Path;

use ferrite_tensor::functional::{
    CrossEntropyOptions, KlDivReduction, Reduction, binary_cross_entropy, binary_cross_entropy_with_logits,
    cross_entropy, huber_loss, kl_div, nll_loss, smooth_l1_loss,
};
use ferrite_tensor::{Device, Tensor};
use serde_json::Value;

use crate::ConformanceError;
use crate::fixture::{CaseSpec, Fixture, bool_or, class_tensor, f64_or, float_tensor};
use crate::grad_case::{self, Produced, run_model_cases};
use crate::report::Outcome;

pub(crate) const OPS: [&str; 7] =
    ["nll_loss", "cross_entropy", "bce_with_logits", "binary_cross_entropy", "smooth_l1_loss", "huber_loss", "kl_div"];

pub(crate) fn run(dir: &Path, device: &Device) -> Result<Vec<(String, Outcome)>, ConformanceError> {
    run_model_cases(dir, &OPS, |models, c| {
        let spec = CaseSpec::of(c)?;
        let fx = Fixture::read(&models.join(format!("{}.safetensors", spec.name)))?;
        let grads = CaseSpec::grad_inputs(c)?;
        grad_case::run(&fx, &spec, &grads, &[], device, |x| forward(spec.op, spec.attrs, x, device))
    })
}

fn reduction(a: &Value) -> Result<Reduction, String> {
    match a.get("reduction").and_then(Value::as_str).unwrap_or("mean") {
        "mean" => Ok(Reduction::Mean),
        "sum" => Ok(Reduction::Sum),
        "none" => Ok(Reduction::None),
        other => Err(format!("unknown reduction `{other}`")),
    }
}

/// What PyTorch applied to `input.0` before the loss.
fn applied(a: &Value, x: &Tensor) -> Result<Tensor, String> {
    match a.get("applied_to").and_then(Value::as_str) {
        None => Ok(x.clone()),
        Some("log_softmax(input)") => x.log_softmax(-1).map_err(|e| e.to_string()),
        Some("sigmoid(input)") => x.sigmoid().map_err(|e| e.to_string()),
        Some(other) => Err(format!("unknown applied_to `{other}`")),
    }
}

/// An optional float attribute as a tensor.
fn optional(a: &Value, key: &str, dev: &Device) -> Result<Option<Tensor>, String> {
    a.get(key).map(|_| float_tensor(a, key, dev)).transpose()
}

/// The loss `op` on `x`.
pub(crate) fn forward(op: &str, a: &Value, x: &[Tensor], dev: &Device) -> Result<Produced, String> {
    let second = || x.get(1).ok_or_else(|| format!("`{op}` takes two inputs"));
    let y = match op {
        "nll_loss" => {
            let opts = CrossEntropyOptions { reduction: reduction(a)?, ..Default::default() };
            nll_loss(&applied(a, &x[0])?, &class_tensor(a, "target", dev)?, &opts)
        }
        "cross_entropy" => {
            let opts = CrossEntropyOptions {
                ignore_index: a.get("ignore_index").and_then(Value::as_i64).unwrap_or(-100),
                label_smoothing: f64_or(a, "label_smoothing", 0.0),
                reduction: reduction(a)?,
                weight: None,
            };
            cross_entropy(&applied(a, &x[0])?, &class_tensor(a, "target", dev)?, &opts)
        }
        "bce_with_logits" => binary_cross_entropy_with_logits(
            &applied(a, &x[0])?,
            &float_tensor(a, "target", dev)?,
            optional(a, "weight", dev)?.as_ref(),
            optional(a, "pos_weight", dev)?.as_ref(),
            reduction(a)?,
        ),
        "binary_cross_entropy" => binary_cross_entropy(
            &applied(a, &x[0])?,
            &float_tensor(a, "target", dev)?,
            optional(a, "weight", dev)?.as_ref(),
            reduction(a)?,
        ),
        "smooth_l1_loss" => smooth_l1_loss(&x[0], second()?, f64_or(a, "beta", 1.0), reduction(a)?),
        "huber_loss" => huber_loss(&x[0], second()?, f64_or(a, "delta", 1.0), reduction(a)?),
        "kl_div" => {
            let red = match a.get("reduction").and_then(Value::as_str).unwrap_or("mean") {
                "batchmean" => KlDivReduction::BatchMean,
                "mean" => KlDivReduction::Mean,
                "sum" => KlDivReduction::Sum,
                "none" => KlDivReduction::None,
                other => return Err(format!("unknown reduction `{other}`")),
            };
            kl_div(&applied(a, &x[0])?, &float_tensor(a, "target", dev)?, red, bool_or(a, "log_target", false))
        }
        other => return Err(format!("no runner for loss `{other}`")),
    };
    y.map(|y| (y, vec![])).map_err(|e| e.to_string())
}
