//! Ops on user input never panic: random shapes, dims, indices and argument values thrown at
//! every public op (forward and, when a graph was recorded, backward) must come back as `Ok` or
//! as a typed error. A panic anywhere fails the property.

use ferrite_tensor::functional::{
    CrossEntropyOptions, KlDivReduction, Reduction, binary_cross_entropy, binary_cross_entropy_with_logits,
    cross_entropy, dropout, embedding, huber_loss, kl_div, layer_norm, nll_loss, scaled_dot_product_attention,
    smooth_l1_loss,
};
use ferrite_tensor::{DType, Device, Generator, Tensor};
use proptest::prelude::*;

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..4, 0..5)
}

/// A tensor of `shape` whose layout depends on `seed`: contiguous, a transposed view, a strided
/// slice or an expanded (stride-0) view, so kernels see non-contiguous operands too.
fn make(shape: &[usize], dtype: DType, device: &Device, seed: u64, grad: bool) -> Tensor {
    let layout = Generator::new(seed ^ 0x5eed).below(4);
    let base = |s: &[usize]| {
        let mut g = Generator::new(seed);
        if dtype.is_floating_point() {
            Tensor::randn_with(s, dtype, device, &mut g).unwrap()
        } else {
            Tensor::randn_with(s, DType::F32, device, &mut g).unwrap().mul_scalar(3.0).unwrap().to_dtype(dtype).unwrap()
        }
    };
    let r = shape.len();
    let t = match layout {
        1 if r >= 2 => {
            let mut s = shape.to_vec();
            s.swap(0, r - 1);
            base(&s).transpose(0, (r - 1) as i64).unwrap()
        }
        2 if r >= 1 => {
            let mut s = shape.to_vec();
            s[0] = s[0] * 2 + 1;
            base(&s).slice(0, 1, s[0] as i64, 2).unwrap()
        }
        3 if r >= 1 && shape[0] > 0 => {
            let mut s = shape.to_vec();
            s[0] = 1;
            base(&s).expand(shape).unwrap()
        }
        _ => base(shape),
    };
    assert_eq!(t.shape(), shape);
    if grad && dtype.is_floating_point() { t.requires_grad_(true).unwrap() } else { t }
}

fn dtype_strategy() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

/// Run backward through whatever `r` produced, ignoring errors (only panics matter).
fn touch(r: ferrite_tensor::Result<Tensor>) {
    if let Ok(t) = r {
        if t.requires_grad()
            && t.dtype().is_floating_point()
            && let Ok(s) = t.sum()
        {
            let _ = s.backward();
        }
        if !t.is_meta() {
            let _ = t.to_vec_f64();
        }
    }
}

proptest! {
    // `NO_PANIC_CASES=5000` for a longer hunt.
    #![proptest_config(ProptestConfig { cases: std::env::var("NO_PANIC_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(160), .. ProptestConfig::default() })]

    #[test]
    fn unary_binary_and_comparisons(
        sa in shape_strategy(), sb in shape_strategy(), da in dtype_strategy(), db in dtype_strategy(),
        s in -3.0f64..3.0, meta in any::<bool>(), seed in any::<u64>(),
    ) {
        let dev = if meta { Device::Meta } else { Device::Cpu };
        let a = make(&sa, da, &dev, seed, true);
        let b = make(&sb, db, &dev, seed ^ 1, true);
        for r in [a.exp(), a.log(), a.sqrt(), a.rsqrt(), a.tanh(), a.sigmoid(), a.relu(), a.neg(), a.abs(), a.sin(), a.cos(),
                  a.log1p(), a.reciprocal(), a.square(), a.pow_scalar(s), a.gelu(), a.gelu_tanh(), a.silu(), a.leaky_relu(s),
                  a.clamp(Some(-s.abs()), Some(s.abs())), a.clamp(None, Some(s)), a.to_dtype(db), a.contiguous(), a.deep_clone()] {
            touch(r);
        }
        for r in [a.add(&b), a.sub(&b), a.mul(&b), a.div(&b), a.pow(&b), a.maximum(&b), a.minimum(&b), a.add_scaled(&b, s),
                  a.eq(&b), a.ne(&b), a.lt(&b), a.le(&b), a.gt(&b), a.ge(&b), a.logical_and(&b), a.logical_or(&b),
                  a.add_scalar(s), a.sub_scalar(s), a.rsub_scalar(s), a.mul_scalar(s), a.div_scalar(s), a.rdiv_scalar(s),
                  a.eq_scalar(s), a.lt_scalar(s), a.logical_not(), Tensor::where_cond(&a.gt_scalar(0.0).unwrap(), &a, &b),
                  a.masked_fill(&b.gt_scalar(0.0).unwrap(), s), a.matmul(&b)] {
            touch(r);
        }
        let c = make(&sa, da, &dev, seed, false);
        let _ = c.add_(&b);
        let _ = c.mul_(&b);
        let _ = c.sub_(&b);
        let _ = c.div_(&b);
        let _ = c.add_scaled_(&b, s);
        let _ = c.copy_(&b);
        let _ = c.add_scalar_(s);
        let _ = c.mul_scalar_(s);
        let _ = c.fill_(s);
        let _ = c.zero_();
        let _ = a.item();
    }

    #[test]
    fn reductions_and_views(
        sa in shape_strategy(), da in dtype_strategy(), dims in prop::collection::vec(-6i64..6, 0..4),
        d0 in -6i64..6, d1 in -6i64..6, start in -4i64..6, len in 0usize..5, step in 0usize..3,
        spec in prop::collection::vec(-2i64..7, 0..5), target in prop::collection::vec(0usize..5, 0..5),
        keep in any::<bool>(), meta in any::<bool>(), seed in any::<u64>(),
    ) {
        let dev = if meta { Device::Meta } else { Device::Cpu };
        let a = make(&sa, da, &dev, seed, true);
        let st = start.max(0) as usize;
        for r in [a.sum(), a.sum_dims(&dims, keep), a.mean(), a.mean_dims(&dims, keep), a.var_dims(&dims, 1, keep),
                  a.var_dims(&dims, 0, keep), a.max_dim(d0, keep).map(|x| x.0), a.min_dim(d0, keep).map(|x| x.1),
                  a.argmax(d0, keep), a.argmin(d0, keep), a.max(), a.min(), a.softmax(d0), a.log_softmax(d0),
                  a.transpose(d0, d1), a.t(), a.permute(&dims), a.narrow(d0, st, len), a.slice(d0, start, start + len as i64, step),
                  a.select(d0, start), a.expand(&target), a.unsqueeze(d0), a.squeeze(d0), a.squeeze_all(), a.view(&spec),
                  a.reshape(&spec), a.flatten(d0, d1), a.sum_to_shape(&target), a.one_hot(len)] {
            touch(r);
        }
        for v in [a.split(len, d0), a.chunk(len, d0)].into_iter().flatten() {
            for t in v {
                touch(Ok(t));
            }
        }
        let _ = a.size(d0);
    }

    #[test]
    fn joins_and_indexing(
        sa in shape_strategy(), sb in shape_strategy(), si in shape_strategy(), da in dtype_strategy(),
        idx in prop::collection::vec(-5i64..6, 0..6), d0 in -6i64..6, meta in any::<bool>(), seed in any::<u64>(),
    ) {
        let dev = if meta { Device::Meta } else { Device::Cpu };
        let a = make(&sa, da, &dev, seed, true);
        let b = make(&sb, da, &dev, seed ^ 7, true);
        let n = idx.len();
        let index = Tensor::from_vec(idx.clone(), &[n], &dev).unwrap();
        let gidx_vals: Vec<i64> = (0..si.iter().product::<usize>()).map(|i| idx.get(i % n.max(1)).copied().unwrap_or(0)).collect();
        let gidx = Tensor::from_vec(gidx_vals, &si, &dev).unwrap();
        for r in [Tensor::cat(&[&a, &b], d0), Tensor::stack(&[&a, &b], d0), Tensor::cat(&[], d0), Tensor::stack(&[&a, &a], d0),
                  a.index_select(d0, &index), a.index_select(d0, &a), a.gather(d0, &gidx), a.gather(d0, &index),
                  a.scatter_add(d0, &gidx, &b), embedding(&index, &a), embedding(&gidx, &a)] {
            touch(r);
        }
    }

    #[test]
    fn functional_forms(
        sa in shape_strategy(), sb in shape_strategy(), ns in prop::collection::vec(0usize..4, 0..3),
        tg in prop::collection::vec(-101i64..6, 0..5), p in -0.5f64..1.5, causal in any::<bool>(), meta in any::<bool>(), seed in any::<u64>(),
    ) {
        let dev = if meta { Device::Meta } else { Device::Cpu };
        let a = make(&sa, DType::F32, &dev, seed, true);
        let b = make(&sb, DType::F32, &dev, seed ^ 3, true);
        let w = make(&ns, DType::F32, &dev, seed ^ 5, true);
        let n = tg.len();
        let target = Tensor::from_vec(tg, &[n], &dev).unwrap();
        let mut g = Generator::new(seed);
        let opts = CrossEntropyOptions { label_smoothing: p.clamp(0.0, 1.0), ..CrossEntropyOptions::default() };
        for r in [layer_norm(&a, &ns, Some(&w), Some(&w), 1e-5), layer_norm(&a, &ns, None, None, 1e-5), cross_entropy(&a, &target, &opts),
                  cross_entropy(&a, &b, &opts), scaled_dot_product_attention(&a, &b, &b, None, causal, None),
                  scaled_dot_product_attention(&a, &a, &a, Some(&b), false, None), dropout(&a, p, true, &mut g), a.linear(&b, Some(&w))] {
            touch(r);
        }
    }

    #[test]
    fn losses(
        sa in shape_strategy(), sb in shape_strategy(), sw in shape_strategy(), da in dtype_strategy(), db in dtype_strategy(),
        tg in prop::collection::vec(-101i64..6, 0..5), beta in -1.0f64..2.0, red in 0u8..4, log_target in any::<bool>(),
        meta in any::<bool>(), seed in any::<u64>(),
    ) {
        let dev = if meta { Device::Meta } else { Device::Cpu };
        let a = make(&sa, da, &dev, seed, true);
        // Same shape as `a` half of the time, so the kernels run, not only the shape checks.
        let b = if seed % 2 == 0 { make(&sa, db, &dev, seed ^ 3, true) } else { make(&sb, db, &dev, seed ^ 3, true) };
        let w = make(&sw, DType::F32, &dev, seed ^ 5, false);
        let probs = a.sigmoid();
        let reduction = [Reduction::None, Reduction::Mean, Reduction::Sum][red as usize % 3];
        let kl = [KlDivReduction::None, KlDivReduction::Mean, KlDivReduction::Sum, KlDivReduction::BatchMean][red as usize];
        let n = tg.len();
        let target = Tensor::from_vec(tg, &[n], &dev).unwrap();
        let opts = CrossEntropyOptions { weight: Some(w.clone()), ..CrossEntropyOptions::default() };
        for r in [binary_cross_entropy(&a, &b, Some(&w), reduction), binary_cross_entropy_with_logits(&a, &b, Some(&w), Some(&w), reduction),
                  smooth_l1_loss(&a, &b, beta, reduction), huber_loss(&a, &b, beta, reduction), kl_div(&a, &b, kl, log_target),
                  nll_loss(&a, &target, &opts), cross_entropy(&a, &target, &opts)] {
            touch(r);
        }
        if let Ok(p) = probs {
            touch(binary_cross_entropy(&p, &b.sigmoid().unwrap_or(b.clone()), None, reduction));
        }
    }
}
