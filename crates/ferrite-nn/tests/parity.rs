//! Module-level parity with PyTorch: the `ops/` cases of the reference fixtures run through
//! ferrite-nn's layers and losses, with the fixture inputs loaded as module parameters through
//! `load_state_dict`, so the test covers the wiring (names, layouts, options) as well as the
//! numbers. Forward outputs and every gradient within each case's rtol/atol.

mod common;

use common::{assert_close, get, load_safetensors, reference_or_skip};
use ferrite_nn::{
    AttentionBackend, CrossEntropyLoss, Embedding, GELU, GeluApproximation, LSTM, LayerNorm, Linear, MSELoss, Module,
    ReLU, SiLU, Sigmoid, StateDict, Tanh, attention,
};
use ferrite_tensor::{Device, Generator, Tensor};

struct Case {
    fx: StateDict,
    attrs: serde_json::Value,
    rtol: f64,
    atol: f64,
}

fn case(name: &str) -> Option<Case> {
    let dir = reference_or_skip()?;
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ops/manifest.json")).unwrap()).unwrap();
    let c = m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no case {name}"))
        .clone();
    Some(Case {
        fx: load_safetensors(&dir.join("ops").join(format!("{name}.safetensors"))),
        attrs: c["attrs"].clone(),
        rtol: c["rtol"].as_f64().unwrap(),
        atol: c["atol"].as_f64().unwrap(),
    })
}

impl Case {
    fn input(&self, i: usize) -> Tensor {
        get(&self.fx, &format!("input.{i}")).detach()
    }
    fn input_rg(&self, i: usize) -> Tensor {
        self.input(i).requires_grad_(true).unwrap()
    }
    fn check_output(&self, out: &Tensor) {
        assert_close("output", out, get(&self.fx, "output"), self.rtol, self.atol);
    }
    fn backward(&self, out: &Tensor) {
        out.backward_with(get(&self.fx, "grad_output"), false).unwrap();
    }
    fn check_grad(&self, i: usize, t: &Tensor) {
        let g = t.grad().unwrap_or_else(|| panic!("input {i} received no gradient"));
        assert_close(&format!("grad_input.{i}"), &g, get(&self.fx, &format!("grad_input.{i}")), self.rtol, self.atol);
    }
    /// Load `(key, input index)` pairs into `m` (strict: every parameter must be covered).
    fn load_into(&self, m: &mut dyn Module, keys: &[(&str, usize)]) {
        let sd: StateDict = keys.iter().map(|(k, i)| (k.to_string(), self.input(*i))).collect();
        m.load_state_dict(&sd, true).unwrap();
    }
}

#[test]
fn linear_module() {
    let Some(c) = case("linear") else { return };
    let w = c.input(1);
    let mut lin = Linear::new_with(w.shape()[1], w.shape()[0], true, &Device::Cpu, &mut Generator::new(0)).unwrap();
    c.load_into(&mut lin, &[("weight", 1), ("bias", 2)]);
    let x = c.input_rg(0);
    let y = lin.forward(&x).unwrap();
    c.check_output(&y);
    c.backward(&y);
    c.check_grad(0, &x);
    c.check_grad(1, &lin.weight);
    c.check_grad(2, lin.bias.as_ref().unwrap());
    println!("parity linear (module) ok");
}

#[test]
fn layer_norm_module() {
    let Some(c) = case("layer_norm") else { return };
    let ns: Vec<usize> =
        c.attrs["normalized_shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let mut ln = LayerNorm::new_with(&ns, c.attrs["eps"].as_f64().unwrap(), true, true, &Device::Cpu).unwrap();
    c.load_into(&mut ln, &[("weight", 1), ("bias", 2)]);
    let x = c.input_rg(0);
    let y = ln.forward(&x).unwrap();
    c.check_output(&y);
    c.backward(&y);
    c.check_grad(0, &x);
    c.check_grad(1, ln.weight.as_ref().unwrap());
    c.check_grad(2, ln.bias.as_ref().unwrap());
    println!("parity layer_norm (module) ok");
}

#[test]
fn cross_entropy_module() {
    let Some(c) = case("cross_entropy") else { return };
    let t: Vec<i64> = c.attrs["target"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let target = Tensor::from_vec(t.clone(), &[t.len()], &Device::Cpu).unwrap();
    let x = c.input_rg(0);
    let loss = CrossEntropyLoss::new().forward(&x, &target).unwrap();
    c.check_output(&loss);
    c.backward(&loss);
    c.check_grad(0, &x);
    println!("parity cross_entropy (module) ok");
}

#[test]
fn mse_loss_module() {
    let Some(c) = case("mse_loss") else { return };
    let (a, b) = (c.input_rg(0), c.input_rg(1));
    let loss = MSELoss::new().forward(&a, &b).unwrap();
    c.check_output(&loss);
    c.backward(&loss);
    c.check_grad(0, &a);
    c.check_grad(1, &b);
    println!("parity mse_loss (module) ok");
}

#[test]
fn embedding_module() {
    let Some(c) = case("embedding") else { return };
    let rows = c.attrs["indices"].as_array().unwrap();
    let shape = [rows.len(), rows[0].as_array().unwrap().len()];
    let flat: Vec<i64> = rows.iter().flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_i64().unwrap())).collect();
    let idx = Tensor::from_vec(flat, &shape, &Device::Cpu).unwrap();
    let w = c.input(0);
    let mut emb = Embedding::new_with(w.shape()[0], w.shape()[1], None, &Device::Cpu, &mut Generator::new(0)).unwrap();
    c.load_into(&mut emb, &[("weight", 0)]);
    let y = emb.forward(&idx).unwrap();
    c.check_output(&y);
    c.backward(&y);
    c.check_grad(0, &emb.weight);
    println!("parity embedding (module) ok");
}

#[test]
fn sdpa_causal_through_every_attention_backend() {
    let Some(c) = case("sdpa__causal") else { return };
    let causal = c.attrs["is_causal"].as_bool().unwrap();
    for backend in [AttentionBackend::Auto, AttentionBackend::Math, AttentionBackend::Chunked { chunk: 5 }] {
        let (q, k, v) = (c.input_rg(0), c.input_rg(1), c.input_rg(2));
        let y = attention(&q, &k, &v, None, causal, backend).unwrap();
        c.check_output(&y);
        c.backward(&y);
        c.check_grad(0, &q);
        c.check_grad(1, &k);
        c.check_grad(2, &v);
        println!("parity sdpa__causal ({backend:?}) ok");
    }
}

#[test]
fn activation_modules() {
    let cases: Vec<(&str, Box<dyn Module>)> = vec![
        ("relu", Box::new(ReLU::new())),
        ("tanh", Box::new(Tanh::new())),
        ("sigmoid", Box::new(Sigmoid::new())),
        ("silu", Box::new(SiLU::new())),
        ("gelu__erf", Box::new(GELU::new())),
        ("gelu__tanh", Box::new(GELU::with_approximation(GeluApproximation::Tanh))),
    ];
    for (name, m) in cases {
        let Some(c) = case(name) else { return };
        let x = c.input_rg(0);
        let y = m.forward(&x).unwrap();
        c.check_output(&y);
        c.backward(&y);
        c.check_grad(0, &x);
        println!("parity {name} (module) ok");
    }
}

#[test]
fn lstm_batch_first() {
    let Some(c) = case("lstm__batch_first") else { return };
    let hidden = c.attrs["hidden_size"].as_u64().unwrap() as usize;
    let order: Vec<String> =
        c.attrs["param_order"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    let x = c.input_rg(0);
    let mut lstm = LSTM::new_with(x.shape()[2], hidden, 1, true, true, &Device::Cpu, &mut Generator::new(0)).unwrap();
    // The fixture's parameter names are PyTorch's; they must be exactly ours.
    let ours: Vec<String> = lstm.state_dict().keys().map(String::from).collect();
    assert_eq!(ours, order);
    let keys: Vec<(&str, usize)> = order.iter().enumerate().map(|(i, k)| (k.as_str(), i + 1)).collect();
    c.load_into(&mut lstm, &keys);
    let y = lstm.forward(&x).unwrap();
    c.check_output(&y);
    c.backward(&y);
    c.check_grad(0, &x);
    for (i, (_, p)) in lstm.named_parameters().iter().enumerate() {
        c.check_grad(i + 1, p);
    }
    println!("parity lstm__batch_first (module) ok");
}
