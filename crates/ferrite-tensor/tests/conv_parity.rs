//! The convolutions of the PyTorch reference fixtures' `models/` cases (`conv1d__*`, `conv2d__*`,
//! `conv_transpose2d__*`) on `meta`: shapes and dtypes of the output and gradients, and the
//! allocator's peak and final bytes of forward + backward equal those of the same run on a `sim`
//! device (the planner's promise). Their values against PyTorch on every device are
//! ferrite-conformance's check. And the rules without a fixture: PyTorch's asymmetric
//! `padding="same"`, unbatched inputs, and the typed errors of bad input.

use ferrite_memory::allocator;
use ferrite_tensor::functional::{
    Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions, Padding, conv_transpose2d, conv1d, conv2d,
};
use ferrite_tensor::{DType, Device, ExpectedShape, Generator, Tensor, TensorError};
use ferrite_test_support::fixtures::load_f32;
use serde_json::Value;

const OPS: [&str; 3] = ["conv1d", "conv2d", "conv_transpose2d"];

struct Case {
    name: String,
    op: String,
    attrs: Value,
    inputs: usize,
    grads: Vec<usize>,
    fx: Vec<(String, Tensor)>,
}

fn cases() -> Option<Vec<Case>> {
    let (dir, cases) = ferrite_test_support::fixtures::model_cases(&OPS)?;
    let out: Vec<Case> = cases
        .iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap().to_string();
            Case {
                fx: load_f32(&dir.join(format!("{name}.safetensors"))),
                name,
                op: c["op"].as_str().unwrap().to_string(),
                attrs: c["attrs"].clone(),
                inputs: c["inputs"].as_u64().unwrap() as usize,
                grads: c["grad_inputs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect(),
            }
        })
        .collect();
    for op in OPS {
        assert!(out.iter().any(|c| c.op == op), "the fixtures have no `{op}` case");
    }
    Some(out)
}

impl Case {
    fn get(&self, name: &str) -> &Tensor {
        &self.fx.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{}: fixture lacks `{name}`", self.name)).1
    }

    fn sizes<const N: usize>(&self, key: &str, default: usize) -> [usize; N] {
        match self.attrs.get(key) {
            None => [default; N],
            Some(v) => {
                let v: Vec<usize> = v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
                v.try_into().unwrap_or_else(|v| panic!("{}: attrs.{key} = {v:?} has the wrong length", self.name))
            }
        }
    }

    fn groups(&self) -> usize {
        self.attrs.get("groups").map_or(1, |g| g.as_u64().unwrap() as usize)
    }

    /// The op on `x` (inputs in PyTorch's order: input, weight, bias when present).
    fn run(&self, x: &[Tensor]) -> Result<Tensor, TensorError> {
        let bias = x.get(2);
        match self.op.as_str() {
            "conv1d" => {
                let o = Conv1dOptions::new()
                    .stride(self.sizes::<1>("stride", 1))
                    .padding(self.sizes::<1>("padding", 0))
                    .dilation(self.sizes::<1>("dilation", 1))
                    .groups(self.groups());
                conv1d(&x[0], &x[1], bias, &o)
            }
            "conv2d" => {
                let o = Conv2dOptions::new()
                    .stride(self.sizes::<2>("stride", 1))
                    .padding(self.sizes::<2>("padding", 0))
                    .dilation(self.sizes::<2>("dilation", 1))
                    .groups(self.groups());
                conv2d(&x[0], &x[1], bias, &o)
            }
            "conv_transpose2d" => {
                let o = ConvTranspose2dOptions::new()
                    .stride(self.sizes::<2>("stride", 1))
                    .padding(self.sizes::<2>("padding", 0))
                    .output_padding(self.sizes::<2>("output_padding", 0))
                    .dilation(self.sizes::<2>("dilation", 1))
                    .groups(self.groups());
                conv_transpose2d(&x[0], &x[1], bias, &o)
            }
            other => panic!("no runner for `{other}`"),
        }
    }

    /// The fixture's inputs on `dev`, those listed in `grad_inputs` requiring grad.
    fn inputs(&self, dev: &Device) -> Vec<Tensor> {
        (0..self.inputs)
            .map(|i| {
                // Detached: another test may have made the shared fixture tensor require grad,
                // and `to_device` of such a tensor is not a leaf.
                let t = self.get(&format!("input.{i}")).detach().to_device(dev).unwrap();
                if self.grads.contains(&i) { t.requires_grad_(true).unwrap() } else { t }
            })
            .collect()
    }
}

/// (peak, final) allocated bytes above the start of forward + backward of `c` on `dev`, and the
/// shapes of the output and gradients.
fn step_on(c: &Case, dev: &Device) -> ((u64, u64), Vec<Vec<usize>>) {
    let a = allocator(dev);
    let x = c.inputs(dev);
    let grad_out = c.get("grad_output").to_device(dev).unwrap();
    let base = a.memory_allocated();
    a.reset_peak_memory_stats();
    let out = c.run(&x).unwrap();
    out.backward_with(&grad_out, false).unwrap();
    let mut shapes = vec![out.shape().to_vec()];
    for &i in &c.grads {
        let g = x[i].grad().unwrap();
        assert_eq!(g.dtype(), DType::F32);
        shapes.push(g.shape().to_vec());
    }
    let r = (a.max_memory_allocated() - base, a.memory_allocated() - base);
    drop((x, out));
    (r, shapes)
}

#[test]
fn meta_predicts_shapes_and_allocations_of_every_case() {
    let Some(cases) = cases() else { return };
    // Its own sim device index: no other test in this binary allocates there or on meta.
    let sim = Device::parse("sim:1GiB:7").unwrap();
    for c in &cases {
        let (real, real_shapes) = step_on(c, &sim);
        let (meta, meta_shapes) = step_on(c, &Device::Meta);
        let mut want = vec![c.get("output").shape().to_vec()];
        want.extend(c.grads.iter().map(|i| c.get(&format!("grad_input.{i}")).shape().to_vec()));
        assert_eq!(meta_shapes, want, "{}: shapes on meta", c.name);
        assert_eq!(real_shapes, want, "{}: shapes on sim", c.name);
        assert_eq!(meta, real, "{}: (peak, final) allocated bytes on meta vs sim", c.name);
        println!("conv meta {:<24} peak {} B, grads held {} B (same on sim)", c.name, meta.0, meta.1);
    }
}

fn randn(shape: &[usize], g: &mut Generator) -> Tensor {
    Tensor::randn_with(shape, DType::F32, &Device::Cpu, g).unwrap()
}

/// `x [n, c, h, w]` with `before`/`after` zero rows and columns around each plane.
fn zero_pad(x: &Tensor, before: [usize; 2], after: [usize; 2]) -> Tensor {
    let s = x.shape();
    let shape = [s[0], s[1], s[2] + before[0] + after[0], s[3] + before[1] + after[1]];
    let p = Tensor::zeros(&shape, DType::F32, &Device::Cpu).unwrap();
    p.narrow(2, before[0], s[2]).unwrap().narrow(3, before[1], s[3]).unwrap().copy_(x).unwrap();
    p
}

fn assert_same(what: &str, a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    for (i, (x, y)) in a.to_vec_f64().unwrap().iter().zip(b.to_vec_f64().unwrap()).enumerate() {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{what}: element {i}: {x} vs {y}");
    }
}

#[test]
fn same_padding_puts_the_odd_zero_after_as_pytorch_does() {
    let mut g = Generator::new(5);
    // Even kernels give an odd total: dilation·(k − 1) = 3 (before 1, after 2) and 2·3 = 6.
    let x = randn(&[2, 3, 7, 6], &mut g);
    let w = randn(&[4, 3, 4, 2], &mut g);
    let b = randn(&[4], &mut g);
    let same = conv2d(&x, &w, Some(&b), &Conv2dOptions::new().padding(Padding::Same).dilation([1, 3])).unwrap();
    assert_eq!(same.shape(), &[2, 4, 7, 6]);
    let explicit = conv2d(&zero_pad(&x, [1, 1], [2, 2]), &w, Some(&b), &Conv2dOptions::new().dilation([1, 3])).unwrap();
    assert_same("same vs explicit asymmetric padding", &same, &explicit);
    // Valid is no padding.
    let valid = conv2d(&x, &w, None, &Conv2dOptions::new().padding(Padding::Valid)).unwrap();
    assert_eq!(valid.shape(), &[2, 4, 4, 5]);
    // And conv1d follows the same rule.
    let x1 = randn(&[2, 3, 9], &mut g);
    let w1 = randn(&[5, 3, 4], &mut g);
    let y1 = conv1d(&x1, &w1, None, &Conv1dOptions::new().padding(Padding::Same)).unwrap();
    assert_eq!(y1.shape(), &[2, 5, 9]);
    let y2 = conv2d(
        &x1.unsqueeze(2).unwrap(),
        &w1.unsqueeze(2).unwrap(),
        None,
        &Conv2dOptions::new().padding(Padding::Same),
    )
    .unwrap();
    assert_same("conv1d same vs conv2d same", &y1, &y2.squeeze(2).unwrap());
}

#[test]
fn unbatched_inputs_and_f64_and_bf16_follow_the_batched_f32_result() {
    let mut g = Generator::new(6);
    let x = randn(&[1, 4, 6, 5], &mut g);
    let w = randn(&[6, 2, 3, 3], &mut g);
    let o = Conv2dOptions::new().groups(2).padding(1).stride([2, 1]);
    let batched = conv2d(&x, &w, None, &o).unwrap();
    let single = conv2d(&x.squeeze(0).unwrap(), &w, None, &o).unwrap();
    assert_same("unbatched", &single, &batched.squeeze(0).unwrap());
    let f64 = conv2d(&x.to_dtype(DType::F64).unwrap(), &w.to_dtype(DType::F64).unwrap(), None, &o).unwrap();
    assert_eq!(f64.dtype(), DType::F64);
    assert_same("f64", &f64, &batched);
    let bf = conv2d(&x.to_dtype(DType::BF16).unwrap(), &w.to_dtype(DType::BF16).unwrap(), None, &o).unwrap();
    assert_eq!(bf.dtype(), DType::BF16);
    for (a, b) in bf.to_vec_f64().unwrap().iter().zip(batched.to_vec_f64().unwrap()) {
        assert!((a - b).abs() <= 0.05 * (1.0 + b.abs()), "bf16 {a} vs f32 {b}");
    }
    // Transposed, unbatched.
    let wt = randn(&[4, 3, 3, 3], &mut g);
    let ot = ConvTranspose2dOptions::new().stride(2).padding(1).output_padding(1);
    let tb = conv_transpose2d(&x, &wt, None, &ot).unwrap();
    assert_eq!(tb.shape(), &[1, 3, 12, 10]);
    let ts = conv_transpose2d(&x.squeeze(0).unwrap(), &wt, None, &ot).unwrap();
    assert_same("unbatched transposed", &ts, &tb.squeeze(0).unwrap());
}

#[test]
fn batches_larger_than_one_unfold_chunk_give_the_same_result() {
    // One sample's unfolded matrix (16·9 rows × 96·96 windows × 4 B ≈ 5.3 MB) exceeds half the
    // unfold budget, so the batch runs in several chunks; every sample must equal its own run.
    let mut g = Generator::new(7);
    let x = randn(&[13, 16, 96, 96], &mut g).requires_grad_(true).unwrap();
    let w = randn(&[4, 16, 3, 3], &mut g).requires_grad_(true).unwrap();
    let o = Conv2dOptions::new().padding(1);
    let y = conv2d(&x, &w, None, &o).unwrap();
    y.sum().unwrap().backward().unwrap();
    let gw = w.grad().unwrap().to_vec_f64().unwrap();
    let mut gw_sum = vec![0.0; gw.len()];
    for i in [0usize, 12] {
        let xi = x.detach().narrow(0, i, 1).unwrap().contiguous().unwrap();
        let wi = w.detach().requires_grad_(true).unwrap();
        let yi = conv2d(&xi, &wi, None, &o).unwrap();
        assert_same(&format!("sample {i}"), &yi, &y.detach().narrow(0, i, 1).unwrap().contiguous().unwrap());
        yi.sum().unwrap().backward().unwrap();
        for (s, v) in gw_sum.iter_mut().zip(wi.grad().unwrap().to_vec_f64().unwrap()) {
            *s += v;
        }
    }
    // The weight gradient of the whole batch is the sum over samples: samples 0 and 12 (above)
    // plus samples 1..12 run as one batch.
    let rest = x.detach().narrow(0, 1, 11).unwrap().contiguous().unwrap();
    let wr = w.detach().requires_grad_(true).unwrap();
    conv2d(&rest, &wr, None, &o).unwrap().sum().unwrap().backward().unwrap();
    for ((s, r), all) in gw_sum.iter().zip(wr.grad().unwrap().to_vec_f64().unwrap()).zip(&gw) {
        assert!((s + r - all).abs() <= 1e-3 * (1.0 + all.abs()), "weight grad {} vs {all}", s + r);
    }
}

fn shape_err(e: TensorError) -> (&'static str, Vec<usize>, ExpectedShape) {
    match e {
        TensorError::InvalidShape { arg, shape, expected, .. } => (arg, shape, expected),
        other => panic!("expected InvalidShape, got {other:?}"),
    }
}

#[test]
fn bad_input_is_a_typed_error_naming_the_argument_and_shapes() {
    let mut g = Generator::new(8);
    let w = randn(&[4, 3, 3, 3], &mut g);
    let o = Conv2dOptions::new();
    // Wrong rank.
    let (arg, shape, exp) = shape_err(conv2d(&randn(&[3, 9], &mut g), &w, None, &o).unwrap_err());
    assert_eq!((arg, shape), ("input", vec![3, 9]));
    assert_eq!(exp, ExpectedShape::Named(&["batch", "channels", "height", "width"]));
    // Wrong channel count.
    let e = conv2d(&randn(&[2, 5, 9, 9], &mut g), &w, None, &o).unwrap_err();
    assert!(e.to_string().contains("conv2d: input has shape [2, 5, 9, 9], expected size 3 in dimension 1"), "{e}");
    // Weight rank, groups not dividing out_channels, bias length.
    let (arg, _, _) =
        shape_err(conv2d(&randn(&[2, 3, 9, 9], &mut g), &randn(&[4, 3, 3], &mut g), None, &o).unwrap_err());
    assert_eq!(arg, "weight");
    let (arg, _, exp) = shape_err(
        conv2d(&randn(&[2, 6, 9, 9], &mut g), &randn(&[4, 2, 3, 3], &mut g), None, &o.groups(3)).unwrap_err(),
    );
    assert_eq!((arg, exp), ("weight", ExpectedShape::MultipleAt { dim: 0, factor: 3 }));
    let (arg, _, exp) =
        shape_err(conv2d(&randn(&[2, 3, 9, 9], &mut g), &w, Some(&randn(&[5], &mut g)), &o).unwrap_err());
    assert_eq!((arg, exp), ("bias", ExpectedShape::Exact(vec![4])));
    // Kernel larger than the padded input (dilation counts).
    match conv2d(&randn(&[1, 3, 4, 9], &mut g), &w, None, &o.dilation(2)).unwrap_err() {
        TensorError::InputTooSmall { op, input, kernel } => {
            assert_eq!((op, input, kernel), ("conv2d", vec![4, 9], vec![5, 5]));
        }
        other => panic!("{other:?}"),
    }
    // Impossible options.
    let x = randn(&[1, 3, 9, 9], &mut g);
    for (opts, needle) in [
        (o.stride(0), "stride must be positive"),
        (o.groups(0), "groups must be a positive integer"),
        (o.dilation([1, 0]), "dilation must be positive"),
        (o.stride(2).padding(Padding::Same), "padding=\"same\" is not supported for strided convolutions"),
    ] {
        let e = conv2d(&x, &w, None, &opts).unwrap_err();
        assert!(matches!(e, TensorError::InvalidArgument { .. }) && e.to_string().contains(needle), "{e}");
    }
    // Integer input, and tensors on different devices.
    let xi = Tensor::zeros(&[1, 3, 5, 5], DType::I64, &Device::Cpu).unwrap();
    assert!(matches!(conv2d(&xi, &w, None, &o).unwrap_err(), TensorError::InvalidDType { arg: "input", .. }));
    let xm = Tensor::zeros(&[1, 3, 5, 5], DType::F32, &Device::Meta).unwrap();
    assert!(matches!(conv2d(&xm, &w, None, &o).unwrap_err(), TensorError::DeviceMismatch { .. }));
    // Transposed: output padding too large, an output that would be empty, channels.
    let wt = randn(&[3, 2, 3, 3], &mut g);
    let e = conv_transpose2d(&x, &wt, None, &ConvTranspose2dOptions::new().output_padding(1)).unwrap_err();
    assert!(e.to_string().contains("output_padding [1, 1] must be smaller than either the stride"), "{e}");
    let e = conv_transpose2d(&randn(&[1, 3, 1, 1], &mut g), &wt, None, &ConvTranspose2dOptions::new().padding(3))
        .unwrap_err();
    assert!(e.to_string().contains("too small"), "{e}");
    let (arg, _, exp) =
        shape_err(conv_transpose2d(&randn(&[1, 4, 5, 5], &mut g), &wt, None, &Default::default()).unwrap_err());
    assert_eq!((arg, exp), ("input", ExpectedShape::SizeAt { dim: 1, size: 3 }));
    // conv1d words its shapes in one spatial dimension.
    let e = conv1d(&randn(&[2, 3, 2], &mut g), &randn(&[4, 3, 5], &mut g), None, &Conv1dOptions::new()).unwrap_err();
    assert!(
        matches!(e, TensorError::InputTooSmall { op: "conv1d", ref input, ref kernel } if input == &[2] && kernel == &[5]),
        "{e:?}"
    );
}
