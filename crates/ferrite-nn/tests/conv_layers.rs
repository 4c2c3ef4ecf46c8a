//! The convolution layers as PyTorch users know them: the `models/` fixture cases (`conv1d__*`,
//! `conv2d__*`, `conv_transpose2d__*`) run through `Conv1d`, `Conv2d` and `ConvTranspose2d` built
//! from the case's attributes and shapes, with the fixture's PyTorch-layout weight and bias
//! loaded by `load_state_dict` under PyTorch's key names — output and every gradient within the
//! case's rtol/atol, on every device under test. Then the state-dict keys and shapes, PyTorch's
//! initialisation bounds, `meta`, and the typed errors of bad configurations and inputs.

mod common;

use common::{assert_close, get, load_safetensors};
use ferrite_nn::{
    Conv1d, Conv1dConfig, Conv2d, Conv2dConfig, ConvTranspose2d, ConvTranspose2dConfig, Module, NnError, StateDict,
};
use ferrite_tensor::functional::Padding;
use ferrite_tensor::{DType, Device, ExpectedShape, Generator, Tensor, TensorError};
use serde_json::Value;

struct Case {
    name: String,
    op: String,
    attrs: Value,
    inputs: usize,
    grads: Vec<usize>,
    rtol: f64,
    atol: f64,
    fx: StateDict,
}

fn cases() -> Option<Vec<Case>> {
    let (dir, cases) = ferrite_test_support::fixtures::model_cases(&["conv1d", "conv2d", "conv_transpose2d"])?;
    let out: Vec<Case> = cases
        .iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap().to_string();
            Case {
                fx: load_safetensors(&dir.join(format!("{name}.safetensors"))),
                name,
                op: c["op"].as_str().unwrap().to_string(),
                attrs: c["attrs"].clone(),
                inputs: c["inputs"].as_u64().unwrap() as usize,
                grads: c["grad_inputs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect(),
                rtol: c["rtol"].as_f64().unwrap(),
                atol: c["atol"].as_f64().unwrap(),
            }
        })
        .collect();
    assert!(out.len() >= 3, "expected conv1d, conv2d and conv_transpose2d fixture cases, found {}", out.len());
    Some(out)
}

impl Case {
    fn input(&self, i: usize) -> Tensor {
        get(&self.fx, &format!("input.{i}")).detach()
    }
    fn sizes<const N: usize>(&self, key: &str, default: usize) -> [usize; N] {
        match self.attrs.get(key) {
            None => [default; N],
            Some(v) => {
                let v: Vec<usize> = v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
                v.try_into().unwrap_or_else(|v| panic!("{}: attrs.{key} = {v:?}", self.name))
            }
        }
    }
    fn groups(&self) -> usize {
        self.attrs.get("groups").map_or(1, |g| g.as_u64().unwrap() as usize)
    }
    fn has_bias(&self) -> bool {
        self.inputs > 2
    }

    /// The layer the case describes, built from its attributes and the weight's shape, with the
    /// fixture's weight (and bias) loaded under PyTorch's keys.
    fn layer(&self, dev: &Device) -> Box<dyn Module> {
        let w = self.input(1);
        let (g, k) = (self.groups(), &w.shape()[2..]);
        let mut rng = Generator::new(0);
        let mut m: Box<dyn Module> = match self.op.as_str() {
            "conv1d" => {
                let cfg = Conv1dConfig::new(w.shape()[1] * g, w.shape()[0], [k[0]])
                    .stride(self.sizes::<1>("stride", 1))
                    .padding(self.sizes::<1>("padding", 0))
                    .dilation(self.sizes::<1>("dilation", 1))
                    .groups(g)
                    .bias(self.has_bias());
                Box::new(Conv1d::new_with(cfg, dev, &mut rng).unwrap())
            }
            "conv2d" => {
                let cfg = Conv2dConfig::new(w.shape()[1] * g, w.shape()[0], [k[0], k[1]])
                    .stride(self.sizes::<2>("stride", 1))
                    .padding(self.sizes::<2>("padding", 0))
                    .dilation(self.sizes::<2>("dilation", 1))
                    .groups(g)
                    .bias(self.has_bias());
                Box::new(Conv2d::new_with(cfg, dev, &mut rng).unwrap())
            }
            "conv_transpose2d" => {
                let cfg = ConvTranspose2dConfig::new(w.shape()[0], w.shape()[1] * g, [k[0], k[1]])
                    .stride(self.sizes::<2>("stride", 1))
                    .padding(self.sizes::<2>("padding", 0))
                    .output_padding(self.sizes::<2>("output_padding", 0))
                    .dilation(self.sizes::<2>("dilation", 1))
                    .groups(g)
                    .bias(self.has_bias());
                Box::new(ConvTranspose2d::new_with(cfg, dev, &mut rng).unwrap())
            }
            other => panic!("no layer for `{other}`"),
        };
        // PyTorch's keys and shapes, before loading.
        let keys: Vec<(String, Vec<usize>)> =
            m.state_dict().iter().map(|(k, t)| (k.to_string(), t.shape().to_vec())).collect();
        let mut want = vec![("weight".to_string(), w.shape().to_vec())];
        if self.has_bias() {
            want.push(("bias".to_string(), self.input(2).shape().to_vec()));
        }
        assert_eq!(keys, want, "{}: state_dict keys and shapes", self.name);
        let mut sd = StateDict::new();
        sd.insert("weight".to_string(), w.to_device(dev).unwrap());
        if self.has_bias() {
            sd.insert("bias".to_string(), self.input(2).to_device(dev).unwrap());
        }
        m.load_state_dict(&sd, true).unwrap();
        m
    }
}

#[test]
fn conv_layers_match_pytorch_on_every_device() {
    let Some(cases) = cases() else { return };
    ferrite_test_support::for_each_device(|dev| {
        for c in &cases {
            let m = c.layer(dev);
            let x = c.input(0).to_device(dev).unwrap().requires_grad_(true).unwrap();
            let y = m.forward(&x).unwrap();
            assert_close(&format!("{dev} {} output", c.name), &y, get(&c.fx, "output"), c.rtol, c.atol);
            y.backward_with(&get(&c.fx, "grad_output").to_device(dev).unwrap(), false).unwrap();
            let params = m.parameters();
            for &i in &c.grads {
                let g = if i == 0 { x.grad() } else { params[i - 1].grad() };
                let g = g.unwrap_or_else(|| panic!("{dev} {}: input {i} has no gradient", c.name));
                let what = format!("{dev} {} grad_input.{i}", c.name);
                assert_close(&what, &g, get(&c.fx, &format!("grad_input.{i}")), c.rtol, c.atol);
            }
            println!("conv layer parity {dev:<6} {:<24} ({}) ok", c.name, m.type_name());
        }
    });
}

#[test]
fn state_dict_round_trips_and_init_follows_pytorch() {
    let mut g = Generator::new(1);
    let cfg = Conv2dConfig::new(6, 8, [3, 5]).groups(2).padding(Padding::Same);
    let a = Conv2d::new_with(cfg, &Device::Cpu, &mut g).unwrap();
    assert_eq!(a.weight.shape(), &[8, 3, 3, 5]);
    // kaiming_uniform_(a=√5) and the bias both draw from U(±1/√fan_in), fan_in = 3·3·5.
    let bound = 1.0 / 45f64.sqrt();
    for t in [&a.weight, a.bias.as_ref().unwrap()] {
        let v = t.to_vec_f64().unwrap();
        let max = v.iter().fold(0f64, |m, x| m.max(x.abs()));
        assert!(max <= bound && max > 0.5 * bound, "max |value| {max}, bound {bound}");
    }
    let mut b = Conv2d::new_with(cfg, &Device::Cpu, &mut g).unwrap();
    b.load_state_dict(&a.state_dict(), true).unwrap();
    let x = Tensor::randn_with(&[2, 6, 7, 9], DType::F32, &Device::Cpu, &mut g).unwrap();
    assert_eq!(a.forward(&x).unwrap().to_vec::<f32>().unwrap(), b.forward(&x).unwrap().to_vec::<f32>().unwrap());
    // Without bias there is no `bias` key; transposed weights are [in, out/groups, k…].
    let nb = Conv1d::new_with(Conv1dConfig::new(4, 2, 3).bias(false), &Device::Cpu, &mut g).unwrap();
    assert_eq!(nb.state_dict().keys().collect::<Vec<_>>(), ["weight"]);
    let t = ConvTranspose2d::new_with(ConvTranspose2dConfig::new(4, 6, 2).groups(2), &Device::Cpu, &mut g).unwrap();
    let shapes: Vec<Vec<usize>> = t.state_dict().iter().map(|(_, t)| t.shape().to_vec()).collect();
    assert_eq!(shapes, [vec![4, 3, 2, 2], vec![6]]);
    // A checkpoint of the wrong layout is refused with PyTorch's size-mismatch message.
    let mut wrong = StateDict::new();
    wrong.insert("weight", Tensor::zeros(&[6, 2, 2, 2], DType::F32, &Device::Cpu).unwrap());
    wrong.insert("bias", Tensor::zeros(&[6], DType::F32, &Device::Cpu).unwrap());
    let mut t2 = t.clone();
    let e = t2.load_state_dict(&wrong, true).unwrap_err();
    assert!(e.to_string().contains("size mismatch for weight"), "{e}");
}

#[test]
fn layers_run_on_meta_with_the_real_output_shapes() {
    let mut g = Generator::new(2);
    let conv = Conv2d::new_with(Conv2dConfig::new(3, 16, 3).stride(2).padding(1), &Device::Meta, &mut g).unwrap();
    let x = Tensor::zeros(&[8, 3, 32, 31], DType::F32, &Device::Meta).unwrap().requires_grad_(true).unwrap();
    let y = conv.forward(&x).unwrap();
    assert_eq!(y.shape(), &[8, 16, 16, 16]);
    y.sum().unwrap().backward().unwrap();
    assert_eq!(conv.weight.grad().unwrap().shape(), &[16, 3, 3, 3]);
    assert_eq!(x.grad().unwrap().shape(), &[8, 3, 32, 31]);
    let up = ConvTranspose2d::new_with(
        ConvTranspose2dConfig::new(16, 4, 3).stride(2).padding(1).output_padding(1),
        &Device::Meta,
        &mut g,
    )
    .unwrap();
    assert_eq!(up.forward(&y).unwrap().shape(), &[8, 4, 32, 32]);
    let c1 = Conv1d::new_with(Conv1dConfig::new(3, 5, 4).dilation(2), &Device::Meta, &mut g).unwrap();
    assert_eq!(
        c1.forward(&Tensor::zeros(&[2, 3, 20], DType::F32, &Device::Meta).unwrap()).unwrap().shape(),
        &[2, 5, 14]
    );
}

#[test]
fn bad_configurations_and_inputs_are_typed_errors_naming_the_layer() {
    let mut g = Generator::new(3);
    let cpu = Device::Cpu;
    match Conv2d::new_with(Conv2dConfig::new(5, 4, 3).groups(2), &cpu, &mut g).unwrap_err() {
        NnError::NotDivisible { layer, arg, value, divisor_arg, divisor } => {
            assert_eq!((layer, arg, value, divisor_arg, divisor), ("Conv2d", "in_channels", 5, "groups", 2));
        }
        other => panic!("{other:?}"),
    }
    let e = ConvTranspose2d::new_with(ConvTranspose2dConfig::new(4, 3, 3).groups(2), &cpu, &mut g).unwrap_err();
    assert!(matches!(e, NnError::NotDivisible { layer: "ConvTranspose2d", arg: "out_channels", .. }), "{e:?}");
    for (cfg, needle) in [
        (Conv2dConfig::new(3, 4, 3).stride(2).padding(Padding::Same), "padding=\"same\" is not supported"),
        (Conv2dConfig::new(3, 4, [3, 0]), "kernel_size must be positive"),
        (Conv2dConfig::new(3, 4, 3).groups(0), "groups must be a positive integer"),
    ] {
        let e = Conv2d::new_with(cfg, &cpu, &mut g).unwrap_err();
        assert!(matches!(e, NnError::InvalidConfig { layer: "Conv2d", .. }) && e.to_string().contains(needle), "{e}");
    }
    let e = ConvTranspose2d::new_with(ConvTranspose2dConfig::new(4, 4, 3).stride(2).output_padding(2), &cpu, &mut g)
        .unwrap_err();
    assert!(e.to_string().contains("output_padding [2, 2] must be smaller"), "{e}");

    let conv = Conv2d::new_with(Conv2dConfig::new(3, 4, 3), &cpu, &mut g).unwrap();
    let input_err = |x: &[usize]| match conv.forward(&Tensor::zeros(x, DType::F32, &cpu).unwrap()).unwrap_err() {
        NnError::Tensor(e) => e,
        other => panic!("{other:?}"),
    };
    match input_err(&[2, 5, 8, 8]) {
        TensorError::InvalidShape { op, arg, shape, expected } => {
            assert_eq!(
                (op, arg, shape, expected),
                ("Conv2d", "input", vec![2, 5, 8, 8], ExpectedShape::SizeAt { dim: 1, size: 3 })
            );
        }
        other => panic!("{other:?}"),
    }
    let e = input_err(&[3, 8]);
    assert!(
        e.to_string()
            .starts_with("Conv2d: input has shape [3, 8], expected a 4-D tensor [batch, channels, height, width]"),
        "{e}"
    );
    // Unbatched input counts its channels in dimension 0.
    let e = input_err(&[2, 3, 8]);
    assert_eq!(e.to_string(), "Conv2d: input has shape [2, 3, 8], expected size 3 in dimension 0");
    match input_err(&[1, 3, 2, 8]) {
        TensorError::InputTooSmall { op, input, kernel } => {
            assert_eq!((op, input, kernel), ("Conv2d", vec![2, 8], vec![3, 3]));
        }
        other => panic!("{other:?}"),
    }
    let c1 = Conv1d::new_with(Conv1dConfig::new(2, 2, 3), &cpu, &mut g).unwrap();
    let e = c1.forward(&Tensor::zeros(&[4, 2, 5, 5], DType::F32, &cpu).unwrap()).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("Conv1d: input has shape [4, 2, 5, 5], expected a 3-D tensor [batch, channels, length]"),
        "{e}"
    );
}
