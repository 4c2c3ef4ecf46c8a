//! Kernels agree with a naive reference on every layout: operands are contiguous, transposed,
//! step-sliced or expanded (stride-0) views, and the reference reads them element by element
//! from the storage through `strides()` / `storage_offset()` — independently of the kernels'
//! own stride walking — then computes in f64.

use ferrite_tensor::{DType, Device, Generator, Tensor};
use proptest::prelude::*;

/// Row-major values of a logical shape.
#[derive(Clone, Debug)]
struct Host {
    shape: Vec<usize>,
    data: Vec<f64>,
}

impl Host {
    fn at(&self, idx: &[usize]) -> f64 {
        let mut lin = 0;
        for (i, &d) in idx.iter().zip(&self.shape) {
            lin = lin * d + i;
        }
        self.data[lin]
    }
}

fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|mut lin| {
            let mut idx = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                idx[d] = lin % shape[d];
                lin /= shape[d];
            }
            idx
        })
        .collect()
}

/// The tensor's values read straight from its storage (`base` is the contiguous owner).
fn read(view: &Tensor, base: &Tensor) -> Host {
    let storage = base.to_vec_f64().unwrap();
    let data = indices(view.shape())
        .iter()
        .map(|idx| storage[view.storage_offset() + idx.iter().zip(view.strides()).map(|(i, s)| i * s).sum::<usize>()])
        .collect();
    Host { shape: view.shape().to_vec(), data }
}

fn host_of(t: &Tensor) -> Host {
    let c = t.contiguous().unwrap();
    Host { shape: t.shape().to_vec(), data: c.to_vec_f64().unwrap() }
}

/// A view of `shape` in layout `kind` (0 contiguous, 1 transposed, 2 step-sliced, 3 expanded)
/// and the contiguous tensor owning its storage.
fn make(shape: &[usize], kind: u8, dtype: DType, seed: u64) -> (Tensor, Tensor) {
    let mut g = Generator::new(seed);
    let r = shape.len();
    let mut s = shape.to_vec();
    match kind {
        1 if r >= 2 => s.swap(0, r - 1),
        2 if r >= 1 => s[r - 1] = s[r - 1] * 2 + 1,
        3 if r >= 1 => s[0] = 1,
        _ => {}
    }
    let base = Tensor::randn_with(&s, dtype, &Device::Cpu, &mut g).unwrap();
    let view = match kind {
        1 if r >= 2 => base.transpose(0, (r - 1) as i64).unwrap(),
        2 if r >= 1 => base.slice((r - 1) as i64, 1, s[r - 1] as i64, 2).unwrap(),
        3 if r >= 1 => base.expand(shape).unwrap(),
        _ => base.clone(),
    };
    assert_eq!(view.shape(), shape);
    (view, base)
}

fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            if da == db || db == 1 {
                Some(da)
            } else if da == 1 {
                Some(db)
            } else {
                None
            }
        })
        .collect()
}

fn bidx(idx: &[usize], shape: &[usize]) -> Vec<usize> {
    let lead = idx.len() - shape.len();
    shape.iter().enumerate().map(|(k, &d)| if d == 1 { 0 } else { idx[lead + k] }).collect()
}

fn assert_close(got: &Host, want: &Host, tol: f64, what: &str) {
    assert_eq!(got.shape, want.shape, "{what}: shape");
    for (i, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..5, 0..4)
}

fn tol(d: DType) -> f64 {
    if d == DType::F32 { 1e-5 } else { 1e-12 }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn elementwise_with_broadcasting(sa in shape_strategy(), sb in shape_strategy(), ka in 0u8..4, kb in 0u8..4,
                                     f32_ in any::<bool>(), seed in any::<u64>()) {
        let dtype = if f32_ { DType::F32 } else { DType::F64 };
        // Make b broadcastable: keep a suffix of a's shape with some dims set to 1.
        let sb: Vec<usize> = sa.iter().rev().zip(sb.iter().rev()).map(|(&a, &b)| if b % 2 == 0 { 1 } else { a }).rev().collect();
        let (a, abase) = make(&sa, ka, dtype, seed);
        let (b, bbase) = make(&sb, kb, dtype, seed ^ 9);
        let (ha, hb) = (read(&a, &abase), read(&b, &bbase));
        let out_shape = broadcast(&sa, &sb).unwrap();
        let reference = |f: fn(f64, f64) -> f64| Host {
            shape: out_shape.clone(),
            data: indices(&out_shape).iter().map(|i| f(ha.at(&bidx(i, &sa)), hb.at(&bidx(i, &sb)))).collect(),
        };
        assert_close(&host_of(&a.add(&b).unwrap()), &reference(|x, y| x + y), tol(dtype), "add");
        assert_close(&host_of(&b.sub(&a).unwrap()), &reference(|x, y| y - x), tol(dtype), "sub");
        assert_close(&host_of(&a.mul(&b).unwrap()), &reference(|x, y| x * y), tol(dtype), "mul");
        assert_close(&host_of(&a.maximum(&b).unwrap()), &reference(f64::max), tol(dtype), "maximum");
        assert_close(&host_of(&a.gt(&b).unwrap().to_dtype(DType::F64).unwrap()), &reference(|x, y| (x > y) as u8 as f64), 0.0, "gt");
        let e = Host { shape: sa.clone(), data: ha.data.iter().map(|v| v.exp()).collect() };
        assert_close(&host_of(&a.exp().unwrap()), &e, tol(dtype), "exp");
        assert_close(&host_of(&a.contiguous().unwrap()), &ha, 0.0, "contiguous");
        // In place into a fresh copy of a (dst contiguous) and into a strided destination.
        let dst = a.deep_clone().unwrap();
        dst.add_(&b.expand(&sa).unwrap_or(b.clone())).unwrap_or(());
        if out_shape == sa {
            assert_close(&host_of(&dst), &reference(|x, y| x + y), tol(dtype), "add_");
        }
        if ka != 3 && out_shape == sa {
            let before = read(&a, &abase);
            a.mul_(&b).unwrap();
            let want = Host { shape: sa.clone(), data: indices(&sa).iter().map(|i| before.at(i) * hb.at(&bidx(i, &sb))).collect() };
            assert_close(&read(&a, &abase), &want, tol(dtype), "mul_ on a strided view");
        }
    }

    #[test]
    fn reductions_and_softmax(sa in prop::collection::vec(1usize..6, 1..4), ka in 0u8..4, dim in 0usize..3, keep in any::<bool>(),
                              f32_ in any::<bool>(), seed in any::<u64>()) {
        let dtype = if f32_ { DType::F32 } else { DType::F64 };
        let dim = dim % sa.len();
        let (a, abase) = make(&sa, ka, dtype, seed);
        let ha = read(&a, &abase);
        let mut out_shape = sa.clone();
        out_shape[dim] = 1;
        let rows = |f: &dyn Fn(&[f64]) -> f64| -> Host {
            let data = indices(&out_shape).iter().map(|i| {
                let col: Vec<f64> = (0..sa[dim]).map(|k| { let mut j = i.clone(); j[dim] = k; ha.at(&j) }).collect();
                f(&col)
            }).collect();
            let mut shape = out_shape.clone();
            if !keep { shape.remove(dim); }
            Host { shape, data }
        };
        assert_close(&host_of(&a.sum_dims(&[dim as i64], keep).unwrap()), &rows(&|c| c.iter().sum()), tol(dtype), "sum");
        assert_close(&host_of(&a.mean_dims(&[dim as i64], keep).unwrap()), &rows(&|c| c.iter().sum::<f64>() / c.len() as f64), tol(dtype), "mean");
        assert_close(&host_of(&a.max_dim(dim as i64, keep).unwrap().0), &rows(&|c| c.iter().cloned().fold(f64::NEG_INFINITY, f64::max)), 0.0, "max");
        let argmax = |c: &[f64]| c.iter().enumerate().fold((0, f64::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as f64;
        assert_close(&host_of(&a.argmax(dim as i64, keep).unwrap()), &rows(&argmax), 0.0, "argmax");
        if sa[dim] > 1 {
            let var = |c: &[f64]| { let m = c.iter().sum::<f64>() / c.len() as f64; c.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (c.len() - 1) as f64 };
            assert_close(&host_of(&a.var_dims(&[dim as i64], 1, keep).unwrap()), &rows(&var), tol(dtype) * 10.0, "var");
        }
        // softmax along dim: compare every element.
        let sm = host_of(&a.softmax(dim as i64).unwrap());
        let want = Host { shape: sa.clone(), data: indices(&sa).iter().map(|i| {
            let col: Vec<f64> = (0..sa[dim]).map(|k| { let mut j = i.clone(); j[dim] = k; ha.at(&j) }).collect();
            let m = col.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = col.iter().map(|v| (v - m).exp()).sum();
            (ha.at(i) - m).exp() / z
        }).collect() };
        assert_close(&sm, &want, tol(dtype), "softmax");
    }

    #[test]
    fn matmul_batched_broadcast(batch_a in prop::collection::vec(1usize..3, 0..3), batch_b in prop::collection::vec(1usize..3, 0..3),
                                m in 1usize..6, k in 1usize..6, n in 1usize..6, ka in 0u8..4, kb in 0u8..4,
                                f32_ in any::<bool>(), seed in any::<u64>()) {
        let dtype = if f32_ { DType::F32 } else { DType::F64 };
        let batch_b: Vec<usize> = batch_a.iter().rev().zip(batch_b.iter().rev()).map(|(&a, &b)| if b == 1 { 1 } else { a }).rev().collect();
        let sa: Vec<usize> = batch_a.iter().cloned().chain([m, k]).collect();
        let sb: Vec<usize> = batch_b.iter().cloned().chain([k, n]).collect();
        let (a, abase) = make(&sa, ka, dtype, seed);
        let (b, bbase) = make(&sb, kb, dtype, seed ^ 5);
        let (ha, hb) = (read(&a, &abase), read(&b, &bbase));
        let batch = broadcast(&batch_a, &batch_b).unwrap();
        let out_shape: Vec<usize> = batch.iter().cloned().chain([m, n]).collect();
        let data = indices(&out_shape).iter().map(|i| {
            let r = i.len();
            (0..k).map(|kk| {
                let mut ia: Vec<usize> = bidx(&i[..r - 2], &batch_a); ia.extend([i[r - 2], kk]);
                let mut ib: Vec<usize> = bidx(&i[..r - 2], &batch_b); ib.extend([kk, i[r - 1]]);
                ha.at(&ia) * hb.at(&ib)
            }).sum()
        }).collect();
        assert_close(&host_of(&a.matmul(&b).unwrap()), &Host { shape: out_shape, data }, tol(dtype) * 10.0, "matmul");
    }

    #[test]
    fn joins_and_gathers(sa in prop::collection::vec(1usize..5, 1..4), ka in 0u8..4, kb in 0u8..4, dim in 0usize..3,
                         picks in prop::collection::vec(0usize..100, 1..6), seed in any::<u64>()) {
        let dim = dim % sa.len();
        let (a, abase) = make(&sa, ka, DType::F64, seed);
        let (b, bbase) = make(&sa, kb, DType::F64, seed ^ 3);
        let (ha, hb) = (read(&a, &abase), read(&b, &bbase));
        // cat along dim
        let mut cs = sa.clone();
        cs[dim] *= 2;
        let want = Host { shape: cs.clone(), data: indices(&cs).iter().map(|i| {
            if i[dim] < sa[dim] { ha.at(i) } else { let mut j = i.clone(); j[dim] -= sa[dim]; hb.at(&j) }
        }).collect() };
        assert_close(&host_of(&Tensor::cat(&[&a, &b], dim as i64).unwrap()), &want, 0.0, "cat");
        // index_select along dim
        let idx: Vec<i64> = picks.iter().map(|p| (p % sa[dim]) as i64).collect();
        let it = Tensor::from_vec(idx.clone(), &[idx.len()], &Device::Cpu).unwrap();
        let mut os = sa.clone();
        os[dim] = idx.len();
        let want = Host { shape: os.clone(), data: indices(&os).iter().map(|i| { let mut j = i.clone(); j[dim] = idx[i[dim]] as usize; ha.at(&j) }).collect() };
        assert_close(&host_of(&a.index_select(dim as i64, &it).unwrap()), &want, 0.0, "index_select");
        // gather along dim with an index of the same shape
        let gi: Vec<i64> = (0..sa.iter().product::<usize>()).map(|i| (picks[i % picks.len()] % sa[dim]) as i64).collect();
        let gt = Tensor::from_vec(gi.clone(), &sa, &Device::Cpu).unwrap();
        let hg = Host { shape: sa.clone(), data: gi.iter().map(|&v| v as f64).collect() };
        let want = Host { shape: sa.clone(), data: indices(&sa).iter().map(|i| { let mut j = i.clone(); j[dim] = hg.at(i) as usize; ha.at(&j) }).collect() };
        assert_close(&host_of(&a.gather(dim as i64, &gt).unwrap()), &want, 0.0, "gather");
        // permute + reshape round trip
        let perm: Vec<i64> = (0..sa.len() as i64).rev().collect();
        let p = a.permute(&perm).unwrap().reshape(&[-1]).unwrap();
        let rev: Vec<usize> = sa.iter().rev().cloned().collect();
        let want = Host { shape: vec![ha.data.len()], data: indices(&rev).iter().map(|i| { let j: Vec<usize> = i.iter().rev().cloned().collect(); ha.at(&j) }).collect() };
        assert_close(&host_of(&p), &want, 0.0, "permute+reshape");
    }
}

/// Sums over leading dims of contiguous inputs (bias and norm-weight gradients) take a path of
/// their own: rows are added in blocks of 64 (in f32 inside a block, f64 across blocks, in a fixed
/// order); tall, narrow inputs sum their blocks in parallel, wide ones split by column chunks. Shapes straddle the block size (64 rows), the
/// 256-column chunk, the 1024-row group and odd column tails, in f32 and bf16, for sum and mean.
#[test]
fn leading_dim_sums_match_reference_across_block_and_column_splits() {
    let cases: &[(&[usize], &[i64])] = &[
        (&[65, 3], &[0]),
        (&[64, 257], &[0]),
        (&[64 * 5 + 7, 257], &[0]),
        (&[4096, 256], &[0]),
        (&[3, 70, 5], &[0, 1]),
        (&[130, 8193], &[0]),
        (&[2, 9000], &[0]),
        (&[2 * 1024 + 65, 75], &[0]),
        (&[1100, 300], &[0]),
        (&[3000, 9], &[0]),
    ];
    for &dtype in &[DType::F32, DType::BF16] {
        for (shape, dims) in cases {
            let mut g = Generator::new(7);
            let a = Tensor::randn_with(shape, DType::F32, &Device::Cpu, &mut g).unwrap().to_dtype(dtype).unwrap();
            let x = host_of(&a);
            let rn: usize = shape[..dims.len()].iter().product();
            let m = x.data.len() / rn;
            let want: Vec<f64> = (0..m).map(|c| (0..rn).map(|r| x.data[r * m + c]).sum()).collect();
            let got = host_of(&a.sum_dims(dims, false).unwrap());
            assert_eq!(got.shape, shape[dims.len()..].to_vec(), "{shape:?}");
            // One rounding of the f64 sum to the output dtype, plus the f32 sums inside each
            // 64-row block: at most 64 roundings of a partial sum, ≤ 64·ε·Σ|x| per column.
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            for c in 0..m {
                let abs: f64 = (0..rn).map(|r| x.data[r * m + c].abs()).sum();
                let bound = tol * (1.0 + want[c].abs()) + 64.0 * f32::EPSILON as f64 * abs;
                assert!(
                    (got.data[c] - want[c]).abs() <= bound,
                    "sum {shape:?} {dtype:?} column {c}: got {}, want {}",
                    got.data[c],
                    want[c]
                );
            }
            let mean = host_of(&a.mean_dims(dims, false).unwrap());
            let want_mean: Vec<f64> = want.iter().map(|s| s / rn as f64).collect();
            assert_close(&mean, &Host { shape: mean.shape.clone(), data: want_mean }, tol, &format!("mean {shape:?}"));
        }
    }
}

/// `x.sum(0)` of f32 follows its documented fixed order bit for bit (`backend/cpu/reduce.rs`
/// `prefix_sum`): each column summed in f32 over blocks of 64 rows, row by row; block sums added
/// in f64 within groups of 16 blocks; group sums in f64 in group order; one rounding to f32. The
/// order names no thread count, so matching it means the result is the same for any.
#[test]
fn leading_dim_f32_sum_follows_the_fixed_block_order_bit_for_bit() {
    for (rows, cols) in [(2 * 1024 + 65, 75usize), (4096, 256), (100, 33), (64, 8)] {
        let mut g = Generator::new(11);
        let a = Tensor::randn_with(&[rows, cols], DType::F32, &Device::Cpu, &mut g).unwrap();
        let x = a.to_vec::<f32>().unwrap();
        let want: Vec<f32> = (0..cols)
            .map(|c| {
                let mut total = 0f64;
                for g0 in (0..rows).step_by(1024) {
                    let mut group = 0f64;
                    for b0 in (g0..(g0 + 1024).min(rows)).step_by(64) {
                        let mut block = 0f32;
                        for r in b0..(b0 + 64).min(rows) {
                            block += x[r * cols + c];
                        }
                        group += block as f64;
                    }
                    total += group;
                }
                total as f32
            })
            .collect();
        let got = a.sum_dims(&[0], false).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(got, want, "[{rows}, {cols}]");
    }
}

/// Layer norm's weight and bias gradients are summed down the rows in an order fixed by the
/// shape alone — f32 within groups of 64 rows, f64 across the groups in order — so they have
/// the same bits on any thread count. Rows of `±s` pairs have mean 0 and variance 1 exactly, so
/// `x̂ = x · 1/√(1 + eps)` is known here bit for bit.
#[test]
fn layer_norm_parameter_gradients_follow_the_fixed_group_order_bit_for_bit_and_dx_its_formula() {
    for (rows, cols) in [(2 * 64 + 5, 70usize), (4096, 256), (3 * 64, 8), (1, 2)] {
        let mut g = Generator::new(5);
        let signs = Tensor::randn_with(&[rows, cols / 2], DType::F32, &Device::Cpu, &mut g).unwrap();
        let signs = signs.to_vec::<f32>().unwrap();
        let xv: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let s = if signs[i / 2] < 0.0 { -1.0 } else { 1.0 };
                if i % 2 == 0 { s } else { -s }
            })
            .collect();
        let x = Tensor::from_vec(xv.clone(), &[rows, cols], &Device::Cpu).unwrap().requires_grad_(true).unwrap();
        let w = Tensor::randn_with(&[cols], DType::F32, &Device::Cpu, &mut g).unwrap().requires_grad_(true).unwrap();
        let b = Tensor::randn_with(&[cols], DType::F32, &Device::Cpu, &mut g).unwrap().requires_grad_(true).unwrap();
        let dy = Tensor::randn_with(&[rows, cols], DType::F32, &Device::Cpu, &mut g).unwrap();
        let y = ferrite_tensor::functional::layer_norm(&x, &[cols], Some(&w), Some(&b), 1e-5).unwrap();
        y.backward_with(&dy, false).unwrap();
        let dyv = dy.to_vec::<f32>().unwrap();
        let rstd = 1.0f32 / (1.0f32 + 1e-5f32).sqrt();
        let order = |term: &dyn Fn(usize) -> f32| -> Vec<f32> {
            (0..cols)
                .map(|c| {
                    let mut total = 0f64;
                    for g0 in (0..rows).step_by(64) {
                        let mut group = 0f32;
                        for r in g0..(g0 + 64).min(rows) {
                            group += term(r * cols + c);
                        }
                        total += group as f64;
                    }
                    total as f32
                })
                .collect()
        };
        let want_b = order(&|i| dyv[i]);
        let want_w = order(&|i| dyv[i] * (xv[i] * rstd));
        assert_eq!(b.grad().unwrap().to_vec::<f32>().unwrap(), want_b, "bias [{rows}, {cols}]");
        assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), want_w, "weight [{rows}, {cols}]");
        // dx row by row (rows in fours and the rows left over take different loops), against
        // `a·(g·w − mean(g·w) − x̂·mean(g·w·x̂))` in f64.
        let wv = w.to_vec::<f32>().unwrap();
        let dx = x.grad().unwrap().to_vec::<f32>().unwrap();
        let a = rstd as f64;
        for r in 0..rows {
            let row = r * cols..(r + 1) * cols;
            let gw: Vec<f64> = row.clone().map(|i| dyv[i] as f64 * wv[i - r * cols] as f64).collect();
            let xh: Vec<f64> = row.clone().map(|i| xv[i] as f64 * a).collect();
            let mg = gw.iter().sum::<f64>() / cols as f64;
            let mgx = gw.iter().zip(&xh).map(|(g, x)| g * x).sum::<f64>() / cols as f64;
            for (c, i) in row.enumerate() {
                let want = a * (gw[c] - mg - xh[c] * mgx);
                assert!(
                    (dx[i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "dx[{r}, {c}] of [{rows}, {cols}]: {} vs {want}",
                    dx[i]
                );
            }
        }
    }
}

/// Set in the child processes of the thread-count test below: run the products and print their
/// bits' hashes instead of spawning.
const BMM_BITS_CHILD_ENV: &str = "FERRITE_TEST_BMM_BITS_CHILD";

/// Batched products whose path depends on whether the batch is spread over the kernel team (one
/// product per thread on 2+ threads, each product threaded on 1): tiny `m·n` with depths past
/// one depth block (256), the transposed-key form of attention, products past the small path's
/// size, and ones the packed path splits over threads when the batch is not spread.
fn thread_count_cases() -> Vec<(String, Tensor, Tensor)> {
    let mut g = Generator::new(23);
    let mut r = |shape: &[usize]| Tensor::randn_with(shape, DType::F32, &Device::Cpu, &mut g).unwrap();
    let mut cases = Vec::new();
    for (batch, m, k, n) in [
        (64usize, 4usize, 300usize, 4usize),
        (64, 8, 257, 8),
        (32, 4, 1000, 4),
        (12, 64, 520, 64),
        (16, 96, 300, 96),
        (8, 160, 300, 160),
        (6, 37, 200, 45),
    ] {
        cases.push((format!("[{batch}, {m}, {k}] x [{batch}, {k}, {n}]"), r(&[batch, m, k]), r(&[batch, k, n])));
        let bt = r(&[batch, n, k]).transpose(-1, -2).unwrap();
        cases.push((format!("[{batch}, {m}, {k}] x [{batch}, {n}, {k}]ᵀ"), r(&[batch, m, k]), bt));
    }
    cases
}

/// FNV-1a over the bits of a product's values.
fn bits_hash(v: &[f32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ x.to_bits() as u64).wrapping_mul(0x0100_0000_01b3))
}

/// A batched f32 matmul gives the same bits on 1 and on 2 kernel threads (`RAYON_NUM_THREADS`
/// sizes the team once per process, so each count runs in a child process of this test): with 2
/// threads the batch is spread one product per thread, with 1 each product runs whole, and the
/// path each product takes (small or packed) must not change its multiply-add chains.
#[test]
fn batched_matmul_bits_do_not_depend_on_the_thread_count() {
    let name = "batched_matmul_bits_do_not_depend_on_the_thread_count";
    if std::env::var_os(BMM_BITS_CHILD_ENV).is_some() {
        // The kernel team is sized from rayon's thread count (`kernels/team.rs`).
        println!("BITS threads {}", rayon::current_num_threads());
        for (what, a, b) in thread_count_cases() {
            println!("BITS {what}: {:016x}", bits_hash(&a.matmul(&b).unwrap().to_vec::<f32>().unwrap()));
        }
        return;
    }
    let run = |threads: &str| -> Vec<String> {
        let text =
            ferrite_test_support::run_in_child(name, &[(BMM_BITS_CHILD_ENV, "1"), ("RAYON_NUM_THREADS", threads)]);
        // libtest's `test NAME ... ` has no newline before the test's first line.
        text.lines().filter_map(|l| l.find("BITS ").map(|i| l[i..].to_string())).collect()
    };
    let (one, two) = (run("1"), run("2"));
    assert_eq!(one.first().map(String::as_str), Some("BITS threads 1"), "{one:?}");
    assert_eq!(two.first().map(String::as_str), Some("BITS threads 2"), "{two:?}");
    assert_eq!(one.len(), thread_count_cases().len() + 1, "every case ran on 1 thread: {one:?}");
    assert_eq!(two.len(), one.len(), "every case ran on 2 threads: {two:?}");
    for (a, b) in one.iter().zip(&two).skip(1) {
        assert_eq!(a, b, "1 thread vs 2 threads");
    }
}
