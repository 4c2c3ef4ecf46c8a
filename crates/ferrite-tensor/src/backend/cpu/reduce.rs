//! CPU reductions: sums (accumulated in f64 and rounded once, so results do not depend on how the
//! work is split across threads), max/min with indices, variance.

use crate::backend::Plan;
use crate::element::{Element, Float};
use crate::error::{Result, TensorError};
use crate::kernels::simd::vectorize;
use crate::kernels::strided::{SendPtr, Walk, par_ranges};
use crate::{DType, Tensor, dispatch_all};

pub(super) fn sum(out: &Tensor, x: &Tensor, p: &Plan, scale: f64) -> Result<()> {
    match x.dtype() {
        DType::F32 => sum_kernel::<f32>(x, p, out, scale),
        DType::F64 => sum_kernel::<f64>(x, p, out, scale),
        DType::F16 => sum_kernel::<half::f16>(x, p, out, scale),
        DType::BF16 => sum_kernel::<half::bf16>(x, p, out, scale),
        d => {
            if scale != 1.0 {
                return Err(TensorError::UnsupportedDType { op: "sum", dtype: d });
            }
            dispatch_all!(d, T => sum_int_kernel::<T>(x, p, out))
        }
    }
}

pub(super) fn arg_extreme(x: &Tensor, p: &Plan, values: Option<&Tensor>, indices: &Tensor, is_max: bool) -> Result<()> {
    dispatch_all!(x.dtype(), T => argext_kernel::<T>(x, p, values, indices, is_max))
}

pub(super) fn var(out: &Tensor, x: &Tensor, p: &Plan, denom: f64) -> Result<()> {
    crate::dispatch_float!(x.dtype(), "var", T => var_kernel::<T>(x, p, out, denom))
}

/// For each output index in parallel, feed its reduced elements (as strided rows) to `f`.
fn for_each_output<T: Copy + Send + Sync>(
    base: SendPtr<T>,
    p: &Plan,
    n_out: usize,
    f: impl Fn(usize, &mut dyn FnMut(&mut dyn FnMut(*const T, usize, usize))) + Sync + Send,
) {
    let w = Walk::new(&p.permuted.shape, [p.permuted.strides.as_slice()], [p.permuted.offset]);
    let [inner_stride] = w.inner_strides();
    let rn = p.rn;
    par_ranges(n_out, rn.max(1), |s, e| {
        let base = base;
        for o in s..e {
            let mut visit = |g: &mut dyn FnMut(*const T, usize, usize)| {
                w.rows(o * rn, (o + 1) * rn, |[off], len, _| {
                    // SAFETY: offsets come from the input's validated layout.
                    g(unsafe { base.0.add(off) }, len, inner_stride)
                });
            };
            f(o, &mut visit);
        }
    });
}

/// Σ x in f64, in 8 independent lanes (vectorises; the order is fixed, so results do not depend
/// on threads).
#[inline(always)]
fn sum_f64_lanes<T: Float>(s: &[T]) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = s.chunks_exact(8);
    let rest = chunks.remainder();
    for ch in chunks {
        for k in 0..8 {
            lanes[k] += T::acc_to_f64(ch[k].to_acc());
        }
    }
    let mut t: f64 = lanes.iter().sum();
    for &v in rest {
        t += T::acc_to_f64(v.to_acc());
    }
    t
}

fn sum_kernel<T: Float>(x: &Tensor, p: &Plan, out: &Tensor, scale: f64) -> Result<()> {
    let n_out = out.numel();
    let op = SendPtr(out.ptr::<T>("sum")?);
    // Fast path: contiguous input reduced over a leading block of dims (bias / norm-weight
    // gradients): accumulate whole rows, which vectorises.
    let l = x.layout();
    let prefix = l.is_contiguous() && {
        let k = p.reduced.iter().take_while(|&&r| r).count();
        p.reduced.iter().skip(k).all(|&r| !r) && k > 0 && k < p.reduced.len()
    };
    if prefix && p.rn > 1 {
        let xp = SendPtr(x.ptr::<T>("sum")?);
        prefix_sum::<T>(xp, p.rn, n_out, op, scale);
        return Ok(());
    }
    let base = SendPtr(x.storage_base_ptr::<T>("sum")?);
    for_each_output::<T>(base, p, n_out, |o, visit| {
        let op = op;
        let mut total = 0f64;
        visit(&mut |ptr, len, stride| {
            // SAFETY: ptr..ptr+len*stride lies within the input (from its layout).
            unsafe {
                if stride == 1 {
                    let s = std::slice::from_raw_parts(ptr, len);
                    total += if len >= 64 {
                        vectorize(
                            #[inline(always)]
                            || sum_f64_lanes(s),
                        )
                    } else {
                        sum_f64_lanes(s)
                    };
                } else {
                    for i in 0..len {
                        total += T::acc_to_f64((*ptr.add(i * stride)).to_acc());
                    }
                }
            }
        });
        // SAFETY: output o belongs to this task.
        unsafe { *op.0.add(o) = T::from_f64(total * scale) };
    });
    Ok(())
}

/// Rows summed in the element type's accumulator before widening to f64. Fixed (never derived
/// from the thread count), like [`GROUP_BLOCKS`], so the association of the sums, and so the
/// result, is the same on every machine and for every thread count.
const ROW_BLOCK: usize = 64;
/// Row blocks per f64 partial sum (1024 rows): the unit a tall input is split into among threads.
const GROUP_BLOCKS: usize = 16;
/// Columns per task (their f64 sums stay in L1; each row read is 1 KiB of contiguous f32).
const COL_CHUNK: usize = 256;

/// Σ over the leading `rn` rows of a contiguous `[rn, m]` input (bias and norm-weight
/// gradients, `x.sum(0)`). Fixed order, whatever the threads: each column is summed in blocks of
/// [`ROW_BLOCK`] rows in the element type's accumulator (f32 for f32/f16/bf16 — at most 64 terms,
/// so the rounding stays at PyTorch's level, which sums in f32 throughout — f64 for f64), row by
/// row; the block sums of each group of [`GROUP_BLOCKS`] blocks are added in f64 in block order,
/// and the group sums in f64 in group order. The work is split into (group, column chunk) tasks;
/// when there is more than one group the tasks write f64 partials that a second pass adds in
/// group order. f32 blocks are summed by `kernels/col_sum.rs` with the accumulators in vector
/// registers (AVX2 / AVX-512 / portable, one body), other types by a plain loop.
fn prefix_sum<T: Float>(xp: SendPtr<T>, rn: usize, m: usize, op: SendPtr<T>, scale: f64) {
    // Σ of rows [r0, r1) (one block), columns [c0, c0 + acc.len()), added into `acc` in f64.
    #[inline(always)]
    fn add_block<T: Float>(xp: SendPtr<T>, m: usize, r0: usize, r1: usize, c0: usize, acc: &mut [f64]) {
        if T::DTYPE == crate::DType::F32 {
            // SAFETY: T is f32 (checked above); rows [r0, r1), columns [c0, c0 + acc.len()) of a
            // contiguous [rn, m] input.
            unsafe {
                crate::kernels::col_sum::add_column_sums(
                    xp.0.add(r0 * m + c0) as *const f32,
                    m,
                    r1 - r0,
                    acc.len(),
                    acc,
                )
            };
            return;
        }
        vectorize(
            #[inline(always)]
            || {
                let mut block = [<T::Acc as num_traits::Zero>::zero(); COL_CHUNK];
                let block = &mut block[..acc.len()];
                for r in r0..r1 {
                    // SAFETY: row r, columns [c0, c0 + acc.len()) of a contiguous [rn, m] input.
                    let row = unsafe { std::slice::from_raw_parts(xp.0.add(r * m + c0), acc.len()) };
                    for (b, &v) in block.iter_mut().zip(row) {
                        *b += v.to_acc();
                    }
                }
                for (a, &b) in acc.iter_mut().zip(block.iter()) {
                    *a += T::acc_to_f64(b);
                }
            },
        )
    }
    let group_rows = ROW_BLOCK * GROUP_BLOCKS;
    let groups = rn.div_ceil(group_rows);
    let chunks = m.div_ceil(COL_CHUNK);
    // Σ of group g over columns [c0, c0 + acc.len()) into the zeroed `acc`, block by block.
    let group_sum = |g: usize, c0: usize, acc: &mut [f64]| {
        let end = ((g + 1) * group_rows).min(rn);
        let mut r0 = g * group_rows;
        while r0 < end {
            let r1 = (r0 + ROW_BLOCK).min(end);
            add_block::<T>(xp, m, r0, r1, c0, acc);
            r0 = r1;
        }
    };
    let columns_of = |chunk: usize| (chunk * COL_CHUNK, ((chunk + 1) * COL_CHUNK).min(m));
    if groups == 1 {
        par_ranges(chunks, rn * COL_CHUNK, |s, e| {
            let op = op;
            let mut acc = [0f64; COL_CHUNK];
            for chunk in s..e {
                let (c0, c1) = columns_of(chunk);
                let a = &mut acc[..c1 - c0];
                a.fill(0.0);
                group_sum(0, c0, a);
                for (i, &v) in a.iter().enumerate() {
                    // SAFETY: this task owns output columns [c0, c1).
                    unsafe { *op.0.add(c0 + i) = T::from_f64(v * scale) };
                }
            }
        });
        return;
    }
    // Group partials `[groups, m]`, then their sums in group order.
    let mut partial = vec![0f64; groups * m];
    let pp = SendPtr(partial.as_mut_ptr());
    par_ranges(groups * chunks, group_rows * COL_CHUNK, |s, e| {
        let pp = pp;
        for task in s..e {
            let (g, chunk) = (task / chunks, task % chunks);
            let (c0, c1) = columns_of(chunk);
            // SAFETY: this task alone owns row g, columns [c0, c1) of the zeroed partials.
            let a = unsafe { std::slice::from_raw_parts_mut(pp.0.add(g * m + c0), c1 - c0) };
            group_sum(g, c0, a);
        }
    });
    par_ranges(m, groups, |s, e| {
        let op = op;
        let mut acc = [0f64; COL_CHUNK];
        let mut c0 = s;
        while c0 < e {
            let c1 = (c0 + COL_CHUNK).min(e);
            let a = &mut acc[..c1 - c0];
            a.fill(0.0);
            for g in 0..groups {
                for (t, &v) in a.iter_mut().zip(&partial[g * m + c0..g * m + c1]) {
                    *t += v;
                }
            }
            for (i, &v) in a.iter().enumerate() {
                // SAFETY: this task owns output columns [s, e).
                unsafe { *op.0.add(c0 + i) = T::from_f64(v * scale) };
            }
            c0 = c1;
        }
    });
}

fn sum_int_kernel<T: Element>(x: &Tensor, p: &Plan, out: &Tensor) -> Result<()> {
    let op = SendPtr(out.ptr::<i64>("sum")?);
    let base = SendPtr(x.storage_base_ptr::<T>("sum")?);
    for_each_output::<T>(base, p, out.numel(), |o, visit| {
        let op = op;
        let mut total = 0i64;
        visit(&mut |ptr, len, stride| {
            for i in 0..len {
                // SAFETY: within the input's layout.
                total = total.wrapping_add(unsafe { *ptr.add(i * stride) }.to_f64() as i64);
            }
        });
        // SAFETY: output o belongs to this task.
        unsafe { *op.0.add(o) = total };
    });
    Ok(())
}

fn argext_kernel<T: Element>(x: &Tensor, p: &Plan, vals: Option<&Tensor>, idx: &Tensor, is_max: bool) -> Result<()> {
    let ip = SendPtr(idx.ptr::<i64>("max")?);
    let vp = match vals {
        Some(v) => Some(SendPtr(v.ptr::<T>("max")?)),
        None => None,
    };
    let base = SendPtr(x.storage_base_ptr::<T>("max")?);
    for_each_output::<T>(base, p, idx.numel(), |o, visit| {
        let (ip, vp) = (ip, vp);
        let mut best: Option<(f64, T)> = None;
        let mut best_i = 0i64;
        let mut i = 0i64;
        let mut found_nan = false;
        visit(&mut |ptr, len, stride| {
            for k in 0..len {
                // SAFETY: within the input's layout.
                let v = unsafe { *ptr.add(k * stride) };
                let f = v.to_f64();
                if !found_nan {
                    if f.is_nan() {
                        found_nan = true;
                        best = Some((f, v));
                        best_i = i;
                    } else {
                        let better = match best {
                            None => true,
                            Some((b, _)) => {
                                if is_max {
                                    f > b
                                } else {
                                    f < b
                                }
                            }
                        };
                        if better {
                            best = Some((f, v));
                            best_i = i;
                        }
                    }
                }
                i += 1;
            }
        });
        // SAFETY: output o belongs to this task.
        unsafe {
            *ip.0.add(o) = best_i;
            if let (Some(vp), Some((_, v))) = (vp, best) {
                *vp.0.add(o) = v;
            }
        }
    });
    Ok(())
}

fn var_kernel<T: Float>(x: &Tensor, p: &Plan, out: &Tensor, denom: f64) -> Result<()> {
    let op = SendPtr(out.ptr::<T>("var")?);
    let base = SendPtr(x.storage_base_ptr::<T>("var")?);
    for_each_output::<T>(base, p, out.numel(), |o, visit| {
        let op = op;
        // Two passes in f64: mean, then squared deviations.
        let (mut s, mut n) = (0f64, 0usize);
        visit(&mut |ptr, len, st| {
            for i in 0..len {
                // SAFETY: within the input's layout.
                s += T::acc_to_f64(unsafe { *ptr.add(i * st) }.to_acc());
            }
            n += len;
        });
        let mean = s / n as f64;
        let mut ss = 0f64;
        visit(&mut |ptr, len, st| {
            for i in 0..len {
                // SAFETY: within the input's layout.
                let d = T::acc_to_f64(unsafe { *ptr.add(i * st) }.to_acc()) - mean;
                ss += d * d;
            }
        });
        let v = if denom > 0.0 { ss / denom } else { f64::NAN };
        // SAFETY: output o belongs to this task.
        unsafe { *op.0.add(o) = T::from_f64(v) };
    });
    Ok(())
}
