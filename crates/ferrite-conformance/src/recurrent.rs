//! The recurrent cases of `models/` (`rnn_tanh`, `gru`, `lstm`; packed sequences included)
//! through ferrite-nn's `RNN`, `GRU` and `LSTM`: the layer is configured from the attributes
//! (batch-first), its state dict must have exactly PyTorch's keys in `attrs.param_order`, the
//! fixture's parameters are loaded through `load_state_dict`, and packed cases run
//! `pack_padded_sequence` → the layer → `pad_packed_sequence(total_length)` as the generator did.
//! The output, `h_n` (and `c_n`) and every gradient of `grad_inputs` (the input, then each
//! parameter in `param_order`) are compared.

use std::path::Path;

use ferrite_nn::{
    GRU, LSTM, Module, Nonlinearity, PackedSequence, RNN, RecurrentConfig, StateDict, pack_padded_sequence,
    pad_packed_sequence,
};
use ferrite_tensor::{Device, Generator, Tensor};
use serde_json::Value;

use crate::ConformanceError;
use crate::closeness::check_close;
use crate::fixture::{CaseSpec, Fixture, bool_or, indices};
use crate::grad_case::run_model_cases;
use crate::report::Outcome;

pub(crate) const OPS: [&str; 3] = ["gru", "rnn_tanh", "lstm"];

pub(crate) fn run(dir: &Path, device: &Device) -> Result<Vec<(String, Outcome)>, ConformanceError> {
    run_model_cases(dir, &OPS, |models, c| one(models, c, device))
}

/// A layer of the case's kind and shape.
enum Layer {
    Rnn(RNN),
    Gru(GRU),
    Lstm(LSTM),
}

/// Output, h_n and (LSTM) c_n.
type Ran<T> = (T, Tensor, Option<Tensor>);

impl Layer {
    fn build(op: &str, a: &Value, input_size: usize, dev: &Device) -> Result<Layer, String> {
        let hidden = a.get("hidden_size").and_then(Value::as_u64).ok_or("attrs.hidden_size is missing")? as usize;
        let mut cfg = RecurrentConfig::new(input_size, hidden)
            .num_layers(a.get("num_layers").and_then(Value::as_u64).unwrap_or(1) as usize)
            .bidirectional(bool_or(a, "bidirectional", false))
            .batch_first(true);
        if a.get("nonlinearity").and_then(Value::as_str) == Some("relu") {
            cfg = cfg.nonlinearity(Nonlinearity::Relu);
        }
        let g = &mut Generator::new(0);
        let layer = match op {
            "rnn_tanh" | "rnn_relu" => RNN::from_config(cfg, dev, g).map(Layer::Rnn),
            "gru" => GRU::from_config(cfg, dev, g).map(Layer::Gru),
            "lstm" => LSTM::from_config(cfg, dev, g).map(Layer::Lstm),
            other => return Err(format!("no runner for recurrent op `{other}`")),
        };
        layer.map_err(|e| e.to_string())
    }

    fn module(&mut self) -> &mut dyn Module {
        match self {
            Layer::Rnn(m) => m,
            Layer::Gru(m) => m,
            Layer::Lstm(m) => m,
        }
    }

    fn forward_padded(&self, x: &Tensor) -> Result<Ran<Tensor>, String> {
        match self {
            Layer::Rnn(m) => m.forward_with_state(x, None).map(|(y, h)| (y, h, None)),
            Layer::Gru(m) => m.forward_with_state(x, None).map(|(y, h)| (y, h, None)),
            Layer::Lstm(m) => m.forward_with_state(x, None).map(|(y, (h, c))| (y, h, Some(c))),
        }
        .map_err(|e| e.to_string())
    }

    fn forward_packed(&self, p: &PackedSequence) -> Result<Ran<PackedSequence>, String> {
        match self {
            Layer::Rnn(m) => m.forward_packed(p, None).map(|(y, h)| (y, h, None)),
            Layer::Gru(m) => m.forward_packed(p, None).map(|(y, h)| (y, h, None)),
            Layer::Lstm(m) => m.forward_packed(p, None).map(|(y, (h, c))| (y, h, Some(c))),
        }
        .map_err(|e| e.to_string())
    }
}

fn one(models: &Path, c: &Value, dev: &Device) -> Result<f64, String> {
    let spec = CaseSpec::of(c)?;
    let a = spec.attrs;
    let (rtol, atol) = (spec.rtol, spec.atol);
    let fx = Fixture::read(&models.join(format!("{}.safetensors", spec.name)))?;
    let order: Vec<String> = a
        .get("param_order")
        .and_then(Value::as_array)
        .ok_or("attrs.param_order is missing")?
        .iter()
        .map(|v| v.as_str().map(String::from).ok_or("attrs.param_order holds a non-string"))
        .collect::<Result<_, _>>()?;
    let grads = CaseSpec::grad_inputs(c)?;
    let x0 = fx.get("input.0")?;
    let input_size = *x0.shape().get(2).ok_or("input.0 is not (batch, seq, feature)")?;
    let mut layer = Layer::build(spec.op, a, input_size, dev)?;
    let m = layer.module();
    let ours: Vec<String> = m.state_dict().keys().map(String::from).collect();
    if ours != order {
        return Err(format!("state_dict keys {ours:?}, PyTorch's are {order:?}"));
    }
    let sd: StateDict = order
        .iter()
        .enumerate()
        .map(|(i, k)| Ok((k.clone(), fx.get(&format!("input.{}", i + 1))?.clone())))
        .collect::<Result<_, String>>()?;
    m.load_state_dict(&sd, true).map_err(|e| format!("load_state_dict: {e}"))?;
    let x = fx.on("input.0", dev)?.requires_grad_(grads.contains(&0)).map_err(|e| e.to_string())?;
    let (out, h_n, c_n) = match a.get("lengths") {
        None => layer.forward_padded(&x)?,
        Some(l) => {
            let lengths = indices(l, "lengths")?;
            let packed = pack_padded_sequence(&x, &lengths, true, bool_or(a, "enforce_sorted", true))
                .map_err(|e| format!("pack_padded_sequence: {e}"))?;
            let (out, h_n, c_n) = layer.forward_packed(&packed)?;
            let total = a.get("total_length").and_then(Value::as_u64).map(|t| t as usize);
            let (padded, back) =
                pad_packed_sequence(&out, true, 0.0, total).map_err(|e| format!("pad_packed_sequence: {e}"))?;
            if back != lengths {
                return Err(format!("pad_packed_sequence gave lengths {back:?}, the caller's were {lengths:?}"));
            }
            (padded, h_n, c_n)
        }
    };
    let mut worst = check_close("output", &out, fx.get("output")?, rtol, atol)?;
    for e in CaseSpec::extra_outputs(c) {
        let got = match e.as_str() {
            "h_n" => h_n.clone(),
            "c_n" => c_n.clone().ok_or("the layer gave no c_n")?,
            other => return Err(format!("unknown extra output `{other}`")),
        };
        worst = worst.max(check_close(&e, &got, fx.get(&format!("extra.{e}"))?, rtol, atol)?);
    }
    out.backward_with(&fx.on("grad_output", dev)?, false).map_err(|e| format!("backward: {e}"))?;
    let params = layer.module().named_parameters();
    for &i in &grads {
        let g = if i == 0 {
            x.grad()
        } else {
            let (n, p) =
                params.get(i - 1).ok_or_else(|| format!("grad_inputs names input {i}, beyond the parameters"))?;
            if *n != order[i - 1] {
                return Err(format!("parameter {i} is `{n}`, PyTorch's is `{}`", order[i - 1]));
            }
            p.grad()
        }
        .ok_or_else(|| format!("input {i} received no gradient"))?;
        worst =
            worst.max(check_close(&format!("grad_input.{i}"), &g, fx.get(&format!("grad_input.{i}"))?, rtol, atol)?);
    }
    Ok(worst)
}
