//! Options of the normalisation and pooling ops that the PyTorch reference fixtures do not
//! exercise (ceil_mode, dilation, count_include_pad, divisor_override, non-dividing adaptive
//! windows, batch norm without affine or running statistics, half precision), checked across
//! devices: every device under test must agree with the CPU backend, whose window arithmetic the
//! unit tests check by hand. The fixture cases themselves (`batch_norm*`, `group_norm`,
//! `rms_norm`, the pools) run on every device in ferrite-conformance's check.

use ferrite_tensor::functional::{
    AvgPool2dOptions, BatchNormOptions, MaxPool2dOptions, adaptive_avg_pool2d, avg_pool2d, batch_norm, group_norm,
    max_pool2d, rms_norm,
};
use ferrite_tensor::{DType, Device, Tensor};

/// One forward + backward on `dev` of `f` applied to copies of `inputs` (all requiring grad):
/// the output and every input's gradient, read back to the CPU as f64.
fn run_on(name: &str, dev: &Device, inputs: &[Tensor], f: &dyn Fn(&[Tensor]) -> Tensor) -> Vec<Vec<f64>> {
    // Fresh leaves on every device (never the caller's handles, which would share the grads).
    let xs: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.detach().deep_clone().unwrap().to_device(dev).unwrap().requires_grad_(true).unwrap())
        .collect();
    let y = f(&xs);
    // A fixed, non-uniform upstream gradient so every route through the op is weighted.
    let n = y.numel();
    let g: Vec<f32> = (0..n).map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.3).collect();
    let gt = Tensor::from_vec(g, y.shape(), &Device::Cpu).unwrap().to_dtype(y.dtype()).unwrap().to_device(dev).unwrap();
    y.backward_with(&gt, false).unwrap();
    let mut out = vec![y.to_vec_f64().unwrap()];
    out.extend(xs.iter().enumerate().map(|(i, x)| {
        x.grad().unwrap_or_else(|| panic!("{dev} {name}: input {i} has no gradient")).to_vec_f64().unwrap()
    }));
    out
}

#[test]
fn options_beyond_the_fixtures_agree_across_devices() {
    type Op = Box<dyn Fn(&[Tensor]) -> Tensor>;
    let mut g = ferrite_tensor::Generator::new(7);
    let mut rand = |shape: &[usize], dtype: DType| {
        Tensor::randn_with(shape, DType::F32, &Device::Cpu, &mut g).unwrap().to_dtype(dtype).unwrap()
    };
    let dilated = MaxPool2dOptions {
        stride: Some([2, 1]),
        padding: [1, 1],
        dilation: [2, 2],
        ceil_mode: true,
        ..MaxPool2dOptions::new([3, 3])
    };
    let overlapping = MaxPool2dOptions { stride: Some([1, 1]), ..MaxPool2dOptions::new([2, 3]) };
    let avg_ceil = AvgPool2dOptions {
        stride: Some([2, 2]),
        padding: [1, 1],
        ceil_mode: true,
        count_include_pad: false,
        ..AvgPool2dOptions::new([3, 3])
    };
    let avg_div = AvgPool2dOptions {
        stride: Some([1, 2]),
        padding: [1, 1],
        divisor_override: Some(5),
        ..AvgPool2dOptions::new([2, 3])
    };
    let cases: Vec<(&str, Vec<Tensor>, Op, f64)> = vec![
        (
            "max_pool2d dilated ceil",
            vec![rand(&[2, 3, 9, 10], DType::F32)],
            Box::new(move |x| max_pool2d(&x[0], &dilated).unwrap()),
            1e-6,
        ),
        (
            "max_pool2d overlapping",
            vec![rand(&[3, 7, 6], DType::F32)],
            Box::new(move |x| max_pool2d(&x[0], &overlapping).unwrap()),
            1e-6,
        ),
        (
            "max_pool2d f16",
            vec![rand(&[2, 2, 6, 6], DType::F16)],
            Box::new(move |x| max_pool2d(&x[0], &overlapping).unwrap()),
            1e-3,
        ),
        (
            "avg_pool2d ceil no pad count",
            vec![rand(&[2, 3, 9, 8], DType::F32)],
            Box::new(move |x| avg_pool2d(&x[0], &avg_ceil).unwrap()),
            1e-5,
        ),
        (
            "avg_pool2d divisor_override",
            vec![rand(&[2, 3, 7, 8], DType::F32)],
            Box::new(move |x| avg_pool2d(&x[0], &avg_div).unwrap()),
            1e-5,
        ),
        (
            "adaptive_avg_pool2d 7x9->4x5",
            vec![rand(&[2, 3, 7, 9], DType::F32)],
            Box::new(|x| adaptive_avg_pool2d(&x[0], [Some(4), Some(5)]).unwrap()),
            1e-5,
        ),
        (
            "adaptive_avg_pool2d keep height",
            vec![rand(&[3, 5, 6], DType::F32)],
            Box::new(|x| adaptive_avg_pool2d(&x[0], [None, Some(4)]).unwrap()),
            1e-5,
        ),
        (
            "batch_norm (N, C, L) train, running stats, affine",
            vec![rand(&[4, 3, 5], DType::F32), rand(&[3], DType::F32), rand(&[3], DType::F32)],
            Box::new(|x| {
                let dev = x[0].device();
                let (rm, rv) =
                    (Tensor::zeros(&[3], DType::F32, dev).unwrap(), Tensor::ones(&[3], DType::F32, dev).unwrap());
                let opts = BatchNormOptions { training: true, momentum: 0.3, eps: 1e-3 };
                let y = batch_norm(&x[0], Some(&rm), Some(&rv), Some(&x[1]), Some(&x[2]), &opts).unwrap();
                // The running statistics join the compared values through the output.
                y.add(&rm.unsqueeze(1).unwrap()).unwrap().add(&rv.unsqueeze(1).unwrap()).unwrap()
            }),
            1e-4,
        ),
        (
            "batch_norm (N, C) eval, no affine",
            vec![rand(&[6, 4], DType::F32)],
            Box::new(|x| {
                let dev = x[0].device();
                let rm = Tensor::from_vec(vec![0.5f32, -1.0, 0.0, 2.0], &[4], dev).unwrap();
                let rv = Tensor::from_vec(vec![1.5f32, 0.25, 1.0, 4.0], &[4], dev).unwrap();
                batch_norm(&x[0], Some(&rm), Some(&rv), None, None, &BatchNormOptions::default()).unwrap()
            }),
            1e-5,
        ),
        (
            "batch_norm train without running stats",
            vec![rand(&[3, 2, 4, 4], DType::F32), rand(&[2], DType::F32)],
            Box::new(|x| {
                batch_norm(
                    &x[0],
                    None,
                    None,
                    Some(&x[1]),
                    None,
                    &BatchNormOptions { training: true, ..Default::default() },
                )
                .unwrap()
            }),
            1e-4,
        ),
        (
            "group_norm G=1 no affine",
            vec![rand(&[2, 6, 3, 3], DType::F32)],
            Box::new(|x| group_norm(&x[0], 1, None, None, 1e-5).unwrap()),
            1e-4,
        ),
        (
            "group_norm G=C (N, C, L)",
            vec![rand(&[3, 4, 7], DType::F32), rand(&[4], DType::F32), rand(&[4], DType::F32)],
            Box::new(|x| group_norm(&x[0], 4, Some(&x[1]), Some(&x[2]), 1e-5).unwrap()),
            1e-4,
        ),
        (
            "group_norm f16",
            vec![rand(&[2, 4, 5], DType::F16)],
            Box::new(|x| group_norm(&x[0], 2, None, None, 1e-5).unwrap()),
            2e-2,
        ),
        (
            "rms_norm 2-D shape no weight",
            vec![rand(&[3, 4, 5], DType::F32)],
            Box::new(|x| rms_norm(&x[0], &[4, 5], None, None).unwrap()),
            1e-5,
        ),
        (
            "rms_norm bf16 weight",
            vec![rand(&[5, 8], DType::BF16), rand(&[8], DType::BF16)],
            Box::new(|x| rms_norm(&x[0], &[8], Some(&x[1]), Some(1e-5)).unwrap()),
            5e-2,
        ),
    ];
    let wants: Vec<_> =
        cases.iter().map(|(name, inputs, op, _)| run_on(name, &Device::Cpu, inputs, op.as_ref())).collect();
    ferrite_test_support::for_each_device_where(
        |d| !matches!(d, Device::Cpu | Device::Meta),
        |dev| {
            for ((name, inputs, op, tol), want) in cases.iter().zip(&wants) {
                let got = run_on(name, dev, inputs, op.as_ref());
                for (k, (g, w)) in got.iter().zip(want).enumerate() {
                    assert_eq!(g.len(), w.len(), "{dev} {name}: result {k} length");
                    for (i, (a, b)) in g.iter().zip(w).enumerate() {
                        let ok = (a - b).abs() <= tol + tol * b.abs() || (a.is_nan() && b.is_nan());
                        assert!(ok, "{dev} {name}: result {k} element {i} is {a}, cpu {b}");
                    }
                }
                println!("{dev} agrees with cpu: {name}");
            }
        },
    );
}
