//! The convolution cases of `models/` (`conv1d`, `conv2d`, `conv_transpose2d`): stride, padding,
//! dilation, groups and output padding from the case's attributes, inputs in PyTorch's order
//! (input, weight, bias when present).

use std::path::Path;

use ferrite_tensor::functional::{
    Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions, conv_transpose2d, conv1d, conv2d,
};
use ferrite_tensor::{Device, Tensor};
use serde_json::Value;

use crate::ConformanceError;
use crate::fixture::{CaseSpec, Fixture, sizes_n};
use crate::grad_case::{self, Produced, run_model_cases};
use crate::report::Outcome;

pub(crate) const OPS: [&str; 3] = ["conv1d", "conv2d", "conv_transpose2d"];

pub(crate) fn run(dir: &Path, device: &Device) -> Result<Vec<(String, Outcome)>, ConformanceError> {
    run_model_cases(dir, &OPS, |models, c| {
        let spec = CaseSpec::of(c)?;
        let fx = Fixture::read(&models.join(format!("{}.safetensors", spec.name)))?;
        let grads = CaseSpec::grad_inputs(c)?;
        grad_case::run(&fx, &spec, &grads, &[], device, |x| forward(spec.op, spec.attrs, x))
    })
}

/// The convolution `op` on `x` (input, weight, bias when present).
pub(crate) fn forward(op: &str, a: &Value, x: &[Tensor]) -> Result<Produced, String> {
    if x.len() < 2 {
        return Err(format!("`{op}` takes an input and a weight, the case has {} inputs", x.len()));
    }
    let bias = x.get(2);
    let groups = a.get("groups").and_then(Value::as_u64).unwrap_or(1) as usize;
    let y = match op {
        "conv1d" => {
            let o = Conv1dOptions::new()
                .stride(sizes_n::<1>(a, "stride", 1)?)
                .padding(sizes_n::<1>(a, "padding", 0)?)
                .dilation(sizes_n::<1>(a, "dilation", 1)?)
                .groups(groups);
            conv1d(&x[0], &x[1], bias, &o)
        }
        "conv2d" => {
            let o = Conv2dOptions::new()
                .stride(sizes_n::<2>(a, "stride", 1)?)
                .padding(sizes_n::<2>(a, "padding", 0)?)
                .dilation(sizes_n::<2>(a, "dilation", 1)?)
                .groups(groups);
            conv2d(&x[0], &x[1], bias, &o)
        }
        "conv_transpose2d" => {
            let o = ConvTranspose2dOptions::new()
                .stride(sizes_n::<2>(a, "stride", 1)?)
                .padding(sizes_n::<2>(a, "padding", 0)?)
                .output_padding(sizes_n::<2>(a, "output_padding", 0)?)
                .dilation(sizes_n::<2>(a, "dilation", 1)?)
                .groups(groups);
            conv_transpose2d(&x[0], &x[1], bias, &o)
        }
        other => return Err(format!("no runner for convolution `{other}`")),
    };
    y.map(|y| (y, vec![])).map_err(|e| e.to_string())
}
