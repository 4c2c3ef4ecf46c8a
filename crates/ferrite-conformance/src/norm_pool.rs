//! The normalisation and pooling cases of `models/` (`batch_norm1d`, `batch_norm2d`,
//! `group_norm`, `rms_norm`, `max_pool2d`, `avg_pool2d`, `adaptive_avg_pool2d`). Batch norm's
//! running statistics start from the case's attributes (PyTorch's zeros/ones when absent) and are
//! compared after the forward as its extra outputs.

use std::path::Path;

use ferrite_tensor::functional::{
    AvgPool2dOptions, BatchNormOptions, MaxPool2dOptions, adaptive_avg_pool2d, avg_pool2d, batch_norm, group_norm,
    max_pool2d, rms_norm,
};
use ferrite_tensor::{DType, Device, Tensor};
use serde_json::Value;

use crate::ConformanceError;
use crate::fixture::{CaseSpec, Fixture, bool_or, f64_or, float_tensor, sizes, sizes_n};
use crate::grad_case::{self, Produced, run_model_cases};
use crate::report::Outcome;

pub(crate) const OPS: [&str; 7] =
    ["batch_norm1d", "batch_norm2d", "group_norm", "rms_norm", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"];

pub(crate) fn run(dir: &Path, device: &Device) -> Result<Vec<(String, Outcome)>, ConformanceError> {
    run_model_cases(dir, &OPS, |models, c| {
        let spec = CaseSpec::of(c)?;
        let fx = Fixture::read(&models.join(format!("{}.safetensors", spec.name)))?;
        let grads = CaseSpec::grad_inputs(c)?;
        let extras = CaseSpec::extra_outputs(c);
        grad_case::run(&fx, &spec, &grads, &extras, device, |x| forward(spec.op, spec.attrs, x, device))
    })
}

/// Running statistics before the forward: from the attributes, else PyTorch's initial zeros
/// (mean) and ones (variance) for the input's channels.
fn running_before(a: &Value, x: &Tensor, dev: &Device) -> Result<(Tensor, Tensor), String> {
    let c = *x.shape().get(1).ok_or("batch norm needs an input with a channel dimension")?;
    let (mk, vk) = if bool_or(a, "training", false) {
        ("running_mean_before", "running_var_before")
    } else {
        ("running_mean", "running_var")
    };
    let or = |key: &str, fill: fn(&[usize], DType, &Device) -> ferrite_tensor::Result<Tensor>| match a.get(key) {
        Some(_) => float_tensor(a, key, dev),
        None => fill(&[c], DType::F32, dev).map_err(|e| e.to_string()),
    };
    Ok((or(mk, Tensor::zeros)?, or(vk, Tensor::ones)?))
}

/// The norm or pool `op` on `x`, with its extra outputs (batch norm's running statistics).
pub(crate) fn forward(op: &str, a: &Value, x: &[Tensor], dev: &Device) -> Result<Produced, String> {
    let e = |r: ferrite_tensor::Result<Tensor>| r.map(|y| (y, vec![])).map_err(|e| e.to_string());
    match op {
        "batch_norm1d" | "batch_norm2d" => {
            let (rm, rv) = running_before(a, &x[0], dev)?;
            let opts = BatchNormOptions {
                training: bool_or(a, "training", false),
                momentum: f64_or(a, "momentum", 0.1),
                eps: f64_or(a, "eps", 1e-5),
            };
            let y = batch_norm(&x[0], Some(&rm), Some(&rv), x.get(1), x.get(2), &opts).map_err(|e| e.to_string())?;
            Ok((y, vec![("running_mean".into(), rm), ("running_var".into(), rv)]))
        }
        "group_norm" => {
            let g = a.get("num_groups").and_then(Value::as_u64).ok_or("attrs.num_groups is missing")? as usize;
            e(group_norm(&x[0], g, x.get(1), x.get(2), f64_or(a, "eps", 1e-5)))
        }
        "rms_norm" => {
            let shape =
                sizes(a.get("normalized_shape").ok_or("attrs.normalized_shape is missing")?, "normalized_shape")?;
            e(rms_norm(&x[0], &shape, x.get(1), a.get("eps").and_then(Value::as_f64)))
        }
        "max_pool2d" => {
            let kernel = sizes_n::<2>(a, "kernel_size", 0)?;
            let opts = MaxPool2dOptions {
                kernel_size: kernel,
                stride: Some(match a.get("stride") {
                    None | Some(Value::Null) => kernel,
                    Some(_) => sizes_n::<2>(a, "stride", 1)?,
                }),
                padding: sizes_n::<2>(a, "padding", 0)?,
                dilation: sizes_n::<2>(a, "dilation", 1)?,
                ceil_mode: bool_or(a, "ceil_mode", false),
            };
            e(max_pool2d(&x[0], &opts))
        }
        "avg_pool2d" => {
            let kernel = sizes_n::<2>(a, "kernel_size", 0)?;
            let opts = AvgPool2dOptions {
                kernel_size: kernel,
                stride: Some(match a.get("stride") {
                    None | Some(Value::Null) => kernel,
                    Some(_) => sizes_n::<2>(a, "stride", 1)?,
                }),
                padding: sizes_n::<2>(a, "padding", 0)?,
                ceil_mode: bool_or(a, "ceil_mode", false),
                count_include_pad: bool_or(a, "count_include_pad", true),
                divisor_override: a.get("divisor_override").and_then(Value::as_u64).map(|d| d as usize),
            };
            e(avg_pool2d(&x[0], &opts))
        }
        "adaptive_avg_pool2d" => {
            let size = sizes_n::<2>(a, "output_size", 0)?;
            e(adaptive_avg_pool2d(&x[0], [Some(size[0]), Some(size[1])]))
        }
        other => Err(format!("no runner for `{other}`")),
    }
}
