//! The losses' gradients against central finite differences in f64, for every operand that gets
//! one — also those the PyTorch fixtures leave out (targets of BCE, BCE-with-logits and KL, the
//! weighted forms, `log_target`) — plus the weighted means of NLL / cross-entropy computed by
//! hand, and the typed errors of bad arguments.

use ferrite_tensor::functional::{
    CrossEntropyOptions, KlDivReduction, Reduction, binary_cross_entropy, binary_cross_entropy_with_logits,
    cross_entropy, huber_loss, kl_div, nll_loss, smooth_l1_loss,
};
use ferrite_tensor::{DType, Device, Generator, Tensor, TensorError};

const SHAPE: [usize; 2] = [3, 4];

fn rand(g: &mut Generator, lo: f64, hi: f64) -> Vec<f64> {
    (0..12).map(|_| lo + (hi - lo) * g.uniform_f64()).collect()
}

fn t(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &SHAPE, &Device::Cpu).unwrap()
}

type Loss = fn(&Tensor, &Tensor) -> ferrite_tensor::Result<Tensor>;

/// Check d loss / d input and d loss / d target (sum reduction) against finite differences.
fn gradcheck(name: &str, f: Loss, x: &[f64], y: &[f64], check_target: bool) {
    let xt = t(x).requires_grad_(true).unwrap();
    let yt = t(y).requires_grad_(check_target).unwrap();
    f(&xt, &yt).unwrap().backward().unwrap();
    let value = |x: &[f64], y: &[f64]| f(&t(x), &t(y)).unwrap().item().unwrap();
    let h = 1e-6;
    let mut operands = vec![(0usize, xt.grad().unwrap().to_vec::<f64>().unwrap())];
    if check_target {
        operands.push((1, yt.grad().unwrap().to_vec::<f64>().unwrap()));
    }
    for (which, analytic) in operands {
        for i in 0..x.len() {
            let (mut a, mut b) = (x.to_vec(), y.to_vec());
            let (mut c, mut d) = (x.to_vec(), y.to_vec());
            if which == 0 {
                a[i] += h;
                c[i] -= h;
            } else {
                b[i] += h;
                d[i] -= h;
            }
            let numeric = (value(&a, &b) - value(&c, &d)) / (2.0 * h);
            let err = (numeric - analytic[i]).abs();
            assert!(
                err <= 1e-6 * (1.0 + numeric.abs()),
                "{name}: d/d{} [{i}] analytic {} vs numeric {numeric}",
                if which == 0 { "input" } else { "target" },
                analytic[i]
            );
        }
    }
    println!("{name}: gradients match finite differences");
}

#[test]
fn pointwise_loss_gradients_match_finite_differences() {
    let mut g = Generator::new(3);
    let probs = rand(&mut g, 0.05, 0.95);
    let soft = rand(&mut g, 0.1, 0.9);
    let logits = rand(&mut g, -4.0, 4.0);
    let other = rand(&mut g, -4.0, 4.0);
    gradcheck("binary_cross_entropy", |x, y| binary_cross_entropy(x, y, None, Reduction::Sum), &probs, &soft, true);
    gradcheck(
        "binary_cross_entropy weighted",
        |x, y| {
            let w = Tensor::from_vec(vec![0.5f64, 1.0, 2.0, 3.0], &[4], &Device::Cpu)?;
            binary_cross_entropy(x, y, Some(&w), Reduction::Sum)
        },
        &probs,
        &soft,
        true,
    );
    gradcheck(
        "binary_cross_entropy_with_logits pos_weight + weight",
        |x, y| {
            let pw = Tensor::from_vec(vec![1.0f64, 2.0, 0.5, 4.0], &[4], &Device::Cpu)?;
            let w = Tensor::from_vec(vec![2.0f64, 0.25, 1.0], &[3, 1], &Device::Cpu)?;
            binary_cross_entropy_with_logits(x, y, Some(&w), Some(&pw), Reduction::Sum)
        },
        &logits,
        &soft,
        true,
    );
    gradcheck("smooth_l1_loss beta 0.7", |x, y| smooth_l1_loss(x, y, 0.7, Reduction::Sum), &logits, &other, true);
    gradcheck("huber_loss delta 1.3", |x, y| huber_loss(x, y, 1.3, Reduction::Sum), &logits, &other, true);
    gradcheck("kl_div", |x, y| kl_div(x, y, KlDivReduction::Sum, false), &other, &soft, true);
    gradcheck("kl_div log_target", |x, y| kl_div(x, y, KlDivReduction::Sum, true), &other, &logits, true);
}

#[test]
fn reductions_divide_as_pytorch() {
    let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3], &Device::Cpu).unwrap();
    let y = x.zeros_like().unwrap();
    let sum = huber_loss(&x, &y, 10.0, Reduction::Sum).unwrap().item().unwrap();
    assert_eq!(sum, 0.5 * (1.0 + 4.0 + 9.0 + 16.0 + 25.0));
    assert!((huber_loss(&x, &y, 10.0, Reduction::Mean).unwrap().item().unwrap() - sum / 6.0).abs() < 1e-6);
    assert_eq!(huber_loss(&x, &y, 10.0, Reduction::None).unwrap().shape(), &[2, 3]);
    // kl_div: batchmean divides the sum by the batch (dim 0), mean by every element.
    let q = Tensor::from_vec(vec![0.2f32, 0.3, 0.5, 0.6, 0.3, 0.1], &[2, 3], &Device::Cpu).unwrap();
    let lp = Tensor::from_vec(vec![0.1f32, 0.1, 0.8, 0.3, 0.3, 0.4], &[2, 3], &Device::Cpu).unwrap().log().unwrap();
    let s = kl_div(&lp, &q, KlDivReduction::Sum, false).unwrap().item().unwrap();
    let bm = kl_div(&lp, &q, KlDivReduction::BatchMean, false).unwrap().item().unwrap();
    let m = kl_div(&lp, &q, KlDivReduction::Mean, false).unwrap().item().unwrap();
    assert!((bm - s / 2.0).abs() < 1e-7 && (m - s / 6.0).abs() < 1e-7, "{s} {bm} {m}");
    // A zero target contributes 0 (xlogy), not NaN.
    let z = Tensor::from_vec(vec![0.0f32, 1.0], &[1, 2], &Device::Cpu).unwrap();
    let lz = Tensor::from_vec(vec![-1.0f32, -0.5], &[1, 2], &Device::Cpu).unwrap();
    assert_eq!(kl_div(&lz, &z, KlDivReduction::Sum, false).unwrap().item().unwrap(), 0.5);
}

#[test]
fn weighted_nll_and_cross_entropy_divide_by_the_targets_weights() {
    let mut g = Generator::new(9);
    let logits = Tensor::randn_with(&[5, 4], DType::F64, &Device::Cpu, &mut g).unwrap();
    let lp = logits.log_softmax(1).unwrap();
    let lpv = lp.to_vec::<f64>().unwrap();
    let target = [1i64, -100, 3, 0, 2];
    let w = [0.5f64, 2.0, 1.0, 3.0];
    let tt = Tensor::from_vec(target.to_vec(), &[5], &Device::Cpu).unwrap();
    let wt = Tensor::from_vec(w.to_vec(), &[4], &Device::Cpu).unwrap();
    let rows: Vec<(usize, usize)> =
        target.iter().enumerate().filter(|(_, c)| **c >= 0).map(|(r, c)| (r, *c as usize)).collect();
    let wsum: f64 = rows.iter().map(|(_, c)| w[*c]).sum();
    let want_nll = -rows.iter().map(|(r, c)| w[*c] * lpv[r * 4 + c]).sum::<f64>() / wsum;
    let opts = CrossEntropyOptions { weight: Some(wt.clone()), ..Default::default() };
    let got = nll_loss(&lp, &tt, &opts).unwrap().item().unwrap();
    assert!((got - want_nll).abs() < 1e-12, "weighted NLL mean {got} vs {want_nll}");
    // Label smoothing with weights and an ignored row: both terms share the denominator.
    let eps = 0.2;
    let smooth: f64 = rows.iter().map(|(r, _)| -(0..4).map(|k| w[k] * lpv[r * 4 + k]).sum::<f64>()).sum();
    let want_ce = (1.0 - eps) * want_nll + eps / 4.0 * smooth / wsum;
    let opts = CrossEntropyOptions { weight: Some(wt), label_smoothing: eps, ..Default::default() };
    let got = cross_entropy(&logits, &tt, &opts).unwrap().item().unwrap();
    assert!((got - want_ce).abs() < 1e-12, "weighted smoothed CE {got} vs {want_ce}");
}

#[test]
fn bad_arguments_are_typed_errors_naming_the_values() {
    let d = Device::Cpu;
    let x = Tensor::from_vec(vec![0.5f32; 6], &[2, 3], &d).unwrap();
    let y3 = Tensor::from_vec(vec![0.5f32; 3], &[3], &d).unwrap();
    let msg = |r: ferrite_tensor::Result<Tensor>| r.unwrap_err().to_string();
    let e = msg(binary_cross_entropy(&x, &y3, None, Reduction::Mean));
    assert!(e.contains("binary_cross_entropy: target has shape [3], expected shape [2, 3]"), "{e}");
    let w5 = Tensor::from_vec(vec![1.0f32; 5], &[5], &d).unwrap();
    let e = msg(binary_cross_entropy_with_logits(&x, &x, None, Some(&w5), Reduction::Mean));
    assert!(e.contains("pos_weight has shape [5], expected a shape that broadcasts to [2, 3]"), "{e}");
    let e = msg(binary_cross_entropy(&x, &x, Some(&w5), Reduction::Mean));
    assert!(e.contains("binary_cross_entropy: weight has shape [5], expected a shape that broadcasts"), "{e}");
    let big = Tensor::from_vec(vec![0.5f32, 1.5, 0.5, 0.5, 0.5, 0.5], &[2, 3], &d).unwrap();
    let e = msg(binary_cross_entropy(&big, &x, None, Reduction::Mean));
    assert!(e.contains("all elements of input should be between 0 and 1, found 1.5"), "{e}");
    assert!(matches!(smooth_l1_loss(&x, &x, -1.0, Reduction::Mean), Err(TensorError::InvalidArgument { .. })));
    assert!(msg(smooth_l1_loss(&x, &x, f64::NAN, Reduction::Mean)).contains("got NaN"));
    let e = msg(huber_loss(&x, &x, 0.0, Reduction::Mean));
    assert!(e.contains("delta must be a finite number > 0") && e.ends_with("got 0"), "{e}");
    let ints = Tensor::from_vec(vec![1i64; 6], &[2, 3], &d).unwrap();
    assert!(matches!(
        kl_div(&ints, &x, KlDivReduction::Sum, false),
        Err(TensorError::UnsupportedDType { op: "kl_div", dtype: DType::I64 })
    ));
    let meta = Tensor::zeros(&[2, 3], DType::F32, &Device::Meta).unwrap();
    assert!(matches!(huber_loss(&x, &meta, 1.0, Reduction::Mean), Err(TensorError::DeviceMismatch { .. })));
}

#[test]
fn meta_runs_allocate_like_real_runs() {
    // Shapes and grads on meta, no data touched.
    let x = Tensor::zeros(&[8, 5], DType::F32, &Device::Meta).unwrap().requires_grad_(true).unwrap();
    let y = Tensor::zeros(&[8, 5], DType::F32, &Device::Meta).unwrap();
    let pw = Tensor::zeros(&[5], DType::F32, &Device::Meta).unwrap();
    for loss in [
        binary_cross_entropy_with_logits(&x, &y, None, Some(&pw), Reduction::Mean).unwrap(),
        binary_cross_entropy(&x, &y, None, Reduction::Sum).unwrap(),
        smooth_l1_loss(&x, &y, 0.5, Reduction::Mean).unwrap(),
        kl_div(&x, &y, KlDivReduction::BatchMean, true).unwrap(),
    ] {
        assert!(loss.is_meta() && loss.shape().is_empty());
        loss.backward().unwrap();
        let g = x.grad().unwrap();
        assert!(g.is_meta() && g.shape() == [8, 5]);
        x.set_grad(None).unwrap();
    }
}
