//! `RNN`, `GRU` and `LSTM` against PyTorch on the recurrent cases of the reference fixtures'
//! `models/` folder (`gru__batch_first`, `rnn_tanh__batch_first`, `lstm__2layer_bidir`,
//! `lstm__packed_total_length`, `gru__packed_bidir`), on every device under test
//! (`FERRITE_TEST_DEVICES`, default cpu and every GPU adapter).
//!
//! Each layer is configured from the case's attributes (hidden size, layers, directions,
//! nonlinearity; the input is batch-first), its state dict must have exactly the keys of
//! `attrs.param_order` (PyTorch's names and order), and the fixture's parameters are loaded
//! through `load_state_dict`. Packed cases run `pack_padded_sequence(x, lengths, batch_first,
//! enforce_sorted)` → the layer → `pad_packed_sequence(total_length)` as the generator did. The
//! output, `h_n` (and `c_n`) and every gradient listed in `grad_inputs` (the input, then each
//! parameter in `param_order`) must be within the case's rtol/atol. Every number comes from the
//! fixture files; a recurrent case without a runner fails the test.

mod common;

use common::{assert_close, get, load_safetensors};
use ferrite_nn::{
    GRU, LSTM, Module, Nonlinearity, PackedSequence, RNN, RecurrentConfig, StateDict, pack_padded_sequence,
    pad_packed_sequence,
};
use ferrite_tensor::{Device, Generator, Tensor};
use serde_json::Value;

/// The recurrent ops of the manifest this test runs.
const OPS: [&str; 3] = ["gru", "rnn_tanh", "lstm"];

/// The cases this test must find (the list).
const REQUIRED: [&str; 5] = [
    "gru__batch_first",
    "rnn_tanh__batch_first",
    "lstm__2layer_bidir",
    "lstm__packed_total_length",
    "gru__packed_bidir",
];

fn manifest() -> Option<(std::path::PathBuf, Vec<Value>)> {
    let dir = ferrite_test_support::reference_or_skip("models/manifest.json")?.join("models");
    let m: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    Some((dir, m["cases"].as_array().unwrap().clone()))
}

/// A layer of the case's kind and shape, built on `dev`.
enum Layer {
    Rnn(RNN),
    Gru(GRU),
    Lstm(LSTM),
}

impl Layer {
    fn module(&mut self) -> &mut dyn Module {
        match self {
            Layer::Rnn(m) => m,
            Layer::Gru(m) => m,
            Layer::Lstm(m) => m,
        }
    }
    /// Output, h_n and (LSTM) c_n of a padded run from zero state.
    fn forward_padded(&self, x: &Tensor) -> (Tensor, Tensor, Option<Tensor>) {
        match self {
            Layer::Rnn(m) => m.forward_with_state(x, None).map(|(y, h)| (y, h, None)),
            Layer::Gru(m) => m.forward_with_state(x, None).map(|(y, h)| (y, h, None)),
            Layer::Lstm(m) => m.forward_with_state(x, None).map(|(y, (h, c))| (y, h, Some(c))),
        }
        .unwrap()
    }
    fn forward_packed(&self, p: &PackedSequence) -> (PackedSequence, Tensor, Option<Tensor>) {
        match self {
            Layer::Rnn(m) => m.forward_packed(p, None).map(|(y, h)| (y, h, None)),
            Layer::Gru(m) => m.forward_packed(p, None).map(|(y, h)| (y, h, None)),
            Layer::Lstm(m) => m.forward_packed(p, None).map(|(y, (h, c))| (y, h, Some(c))),
        }
        .unwrap()
    }
}

fn build(op: &str, a: &Value, input_size: usize, dev: &Device) -> Layer {
    let mut cfg = RecurrentConfig::new(input_size, a["hidden_size"].as_u64().unwrap() as usize)
        .num_layers(a.get("num_layers").and_then(Value::as_u64).unwrap_or(1) as usize)
        .bidirectional(a.get("bidirectional").and_then(Value::as_bool).unwrap_or(false))
        .batch_first(true);
    if a.get("nonlinearity").and_then(Value::as_str) == Some("relu") {
        cfg = cfg.nonlinearity(Nonlinearity::Relu);
    }
    let g = &mut Generator::new(0);
    match op {
        "rnn_tanh" | "rnn_relu" => Layer::Rnn(RNN::from_config(cfg, dev, g).unwrap()),
        "gru" => Layer::Gru(GRU::from_config(cfg, dev, g).unwrap()),
        "lstm" => Layer::Lstm(LSTM::from_config(cfg, dev, g).unwrap()),
        other => panic!("no runner for recurrent op `{other}`"),
    }
}

#[test]
fn recurrent_layers_match_pytorch_on_every_device() {
    let Some((dir, cases)) = manifest() else { return };
    let cases: Vec<&Value> = cases.iter().filter(|c| OPS.contains(&c["op"].as_str().unwrap_or(""))).collect();
    for name in REQUIRED {
        assert!(cases.iter().any(|c| c["name"] == name), "models/manifest.json lacks the case {name}");
    }
    ferrite_test_support::for_each_device(|dev| {
        for c in &cases {
            let (name, op, a) = (c["name"].as_str().unwrap(), c["op"].as_str().unwrap(), &c["attrs"]);
            let (rtol, atol) = (c["rtol"].as_f64().unwrap(), c["atol"].as_f64().unwrap());
            let fx = load_safetensors(&dir.join(format!("{name}.safetensors")));
            let order: Vec<String> =
                a["param_order"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
            let grads: Vec<usize> =
                c["grad_inputs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
            let x0 = get(&fx, "input.0");
            let mut layer = build(op, a, x0.shape()[2], dev);
            let m = layer.module();
            let ours: Vec<String> = m.state_dict().keys().map(String::from).collect();
            assert_eq!(ours, order, "{name}: state_dict keys must be PyTorch's, in its order");
            let sd: StateDict = order
                .iter()
                .enumerate()
                .map(|(i, k)| (k.clone(), get(&fx, &format!("input.{}", i + 1)).clone()))
                .collect();
            m.load_state_dict(&sd, true).unwrap();
            let x = x0.detach().to_device(dev).unwrap().requires_grad_(grads.contains(&0)).unwrap();
            let (out, h_n, c_n) = match a.get("lengths") {
                None => layer.forward_padded(&x),
                Some(l) => {
                    let lengths: Vec<usize> =
                        l.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
                    let enforce = a.get("enforce_sorted").and_then(Value::as_bool).unwrap_or(true);
                    let total = a.get("total_length").and_then(Value::as_u64).map(|t| t as usize);
                    let packed = pack_padded_sequence(&x, &lengths, true, enforce).unwrap();
                    let (out, h_n, c_n) = layer.forward_packed(&packed);
                    let (padded, back) = pad_packed_sequence(&out, true, 0.0, total).unwrap();
                    assert_eq!(back, lengths, "{name}: pad_packed_sequence returns the caller's lengths");
                    (padded, h_n, c_n)
                }
            };
            let mut worst = assert_close(&format!("{dev} {name} output"), &out, get(&fx, "output"), rtol, atol);
            for extra in c["extra_outputs"].as_array().unwrap() {
                let e = extra.as_str().unwrap();
                let got = match e {
                    "h_n" => h_n.clone(),
                    "c_n" => c_n.clone().unwrap_or_else(|| panic!("{name}: no c_n")),
                    other => panic!("{name}: unknown extra output {other}"),
                };
                worst = worst.max(assert_close(
                    &format!("{dev} {name} {e}"),
                    &got,
                    get(&fx, &format!("extra.{e}")),
                    rtol,
                    atol,
                ));
            }
            out.backward_with(&get(&fx, "grad_output").to_device(dev).unwrap(), false).unwrap();
            let params = layer.module().named_parameters();
            for &i in &grads {
                let g = if i == 0 {
                    x.grad()
                } else {
                    let (n, p) = &params[i - 1];
                    assert_eq!(n, &order[i - 1]);
                    p.grad()
                }
                .unwrap_or_else(|| panic!("{dev} {name}: input {i} received no gradient"));
                let want = get(&fx, &format!("grad_input.{i}"));
                worst = worst.max(assert_close(&format!("{dev} {name} grad_input.{i}"), &g, want, rtol, atol));
            }
            println!("recurrent parity {dev:<6} {name:<26} ok (max |diff| {worst:.2e}, rtol {rtol}, atol {atol})");
        }
    });
}
