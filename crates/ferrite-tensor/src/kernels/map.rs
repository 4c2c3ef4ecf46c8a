//! Elementwise kernels over strided, broadcast operands into a fresh contiguous output.
//!
//! The closures are generic over element types; for f32 the conversions inline away and the
//! contiguous inner loops vectorise. Every walk over rows runs inside [`vectorize`], so those
//! loops are compiled for AVX-512 / AVX2 when the CPU has them; the element closures handed in
//! by ops must therefore be small and inlinable (they are: `#[inline(always)]` arithmetic).

use crate::Tensor;
use crate::error::Result;
use crate::kernels::simd::vectorize;
use crate::kernels::strided::{SendPtr, Walk, par_ranges};
use crate::layout::Layout;

/// Raw view of an input operand: base pointer of its storage and a layout already broadcast to
/// the output shape.
pub(crate) struct In<T> {
    pub ptr: SendPtr<T>,
    pub layout: Layout,
}

impl<T> In<T> {
    pub fn new(t: &Tensor, out_shape: &[usize], op: &'static str) -> Result<In<T>> {
        let layout = t.layout().broadcast_to(out_shape, op)?;
        let base = t.storage_base_ptr::<T>(op)?;
        Ok(In { ptr: SendPtr(base), layout })
    }
}

/// out[i] = f(a[i]) for a contiguous output tensor `out`.
pub(crate) fn map1<A: Copy + Send + Sync, O: Copy + Send + Sync>(
    out: &Tensor,
    a: &In<A>,
    f: impl Fn(A) -> O + Sync + Send,
) -> Result<()> {
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let op = SendPtr(out.ptr::<O>("map")?);
    let w = Walk::new(out.shape(), [a.layout.strides.as_slice()], [a.layout.offset]);
    let [sa] = w.inner_strides();
    let ap = a.ptr;
    par_ranges(n, 1, |start, end| {
        let (ap, op) = (ap, op);
        vectorize(
            #[inline(always)]
            || {
                w.rows(
                    start,
                    end,
                    #[inline(always)]
                    |[oa], len, lin| {
                        // SAFETY: `out` is a fresh contiguous buffer of n elements; each task writes the
                        // disjoint range [start, end). Input offsets come from a layout validated against its
                        // storage, so every read is in bounds.
                        unsafe {
                            let o = std::slice::from_raw_parts_mut(op.0.add(lin), len);
                            if sa == 1 {
                                let x = std::slice::from_raw_parts(ap.0.add(oa), len);
                                for (o, &x) in o.iter_mut().zip(x) {
                                    *o = f(x);
                                }
                            } else {
                                for (i, o) in o.iter_mut().enumerate() {
                                    *o = f(*ap.0.add(oa + i * sa));
                                }
                            }
                        }
                    },
                )
            },
        );
    });
    Ok(())
}

/// out[i] = f(a[i], b[i]).
pub(crate) fn map2<A: Copy + Send + Sync, B: Copy + Send + Sync, O: Copy + Send + Sync>(
    out: &Tensor,
    a: &In<A>,
    b: &In<B>,
    f: impl Fn(A, B) -> O + Sync + Send,
) -> Result<()> {
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let op = SendPtr(out.ptr::<O>("map")?);
    let w = Walk::new(
        out.shape(),
        [a.layout.strides.as_slice(), b.layout.strides.as_slice()],
        [a.layout.offset, b.layout.offset],
    );
    let [sa, sb] = w.inner_strides();
    let (ap, bp) = (a.ptr, b.ptr);
    par_ranges(n, 1, |start, end| {
        let (ap, bp, op) = (ap, bp, op);
        vectorize(
            #[inline(always)]
            || {
                w.rows(
                    start,
                    end,
                    #[inline(always)]
                    |[oa, ob], len, lin| {
                        // SAFETY: as in map1; the output range [lin, lin+len) belongs to this task only.
                        unsafe {
                            let o = std::slice::from_raw_parts_mut(op.0.add(lin), len);
                            match (sa, sb) {
                                (1, 1) => {
                                    let x = std::slice::from_raw_parts(ap.0.add(oa), len);
                                    let y = std::slice::from_raw_parts(bp.0.add(ob), len);
                                    for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                                        *o = f(x, y);
                                    }
                                }
                                (1, 0) => {
                                    let x = std::slice::from_raw_parts(ap.0.add(oa), len);
                                    let y = *bp.0.add(ob);
                                    for (o, &x) in o.iter_mut().zip(x) {
                                        *o = f(x, y);
                                    }
                                }
                                (0, 1) => {
                                    let x = *ap.0.add(oa);
                                    let y = std::slice::from_raw_parts(bp.0.add(ob), len);
                                    for (o, &y) in o.iter_mut().zip(y) {
                                        *o = f(x, y);
                                    }
                                }
                                _ => {
                                    for (i, o) in o.iter_mut().enumerate() {
                                        *o = f(*ap.0.add(oa + i * sa), *bp.0.add(ob + i * sb));
                                    }
                                }
                            }
                        }
                    },
                )
            },
        );
    });
    Ok(())
}

/// out[i] = f(a[i], b[i], c[i]).
pub(crate) fn map3<A: Copy + Send + Sync, B: Copy + Send + Sync, C: Copy + Send + Sync, O: Copy + Send + Sync>(
    out: &Tensor,
    a: &In<A>,
    b: &In<B>,
    c: &In<C>,
    f: impl Fn(A, B, C) -> O + Sync + Send,
) -> Result<()> {
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let op = SendPtr(out.ptr::<O>("map")?);
    let w = Walk::new(
        out.shape(),
        [a.layout.strides.as_slice(), b.layout.strides.as_slice(), c.layout.strides.as_slice()],
        [a.layout.offset, b.layout.offset, c.layout.offset],
    );
    let [sa, sb, sc] = w.inner_strides();
    let (ap, bp, cp) = (a.ptr, b.ptr, c.ptr);
    par_ranges(n, 1, |start, end| {
        let (ap, bp, cp, op) = (ap, bp, cp, op);
        vectorize(
            #[inline(always)]
            || {
                w.rows(
                    start,
                    end,
                    #[inline(always)]
                    |[oa, ob, oc], len, lin| {
                        // SAFETY: as in map1.
                        unsafe {
                            let o = std::slice::from_raw_parts_mut(op.0.add(lin), len);
                            for (i, o) in o.iter_mut().enumerate() {
                                *o = f(*ap.0.add(oa + i * sa), *bp.0.add(ob + i * sb), *cp.0.add(oc + i * sc));
                            }
                        }
                    },
                )
            },
        );
    });
    Ok(())
}

/// In place: dst[i] = f(dst[i], src[i]) where `src` is broadcast to dst's shape. `dst` may be any
/// strided view (not expanded).
pub(crate) fn update2<D: Copy + Send + Sync, S: Copy + Send + Sync>(
    dst: &Tensor,
    src: &In<S>,
    f: impl Fn(D, S) -> D + Sync + Send,
) -> Result<()> {
    let n = dst.numel();
    if n == 0 {
        return Ok(());
    }
    let dl = dst.layout();
    let dp = SendPtr(dst.storage_base_ptr::<D>("inplace")?);
    let w = Walk::new(
        dl.shape.as_slice(),
        [dl.strides.as_slice(), src.layout.strides.as_slice()],
        [dl.offset, src.layout.offset],
    );
    let [sd, ss] = w.inner_strides();
    let sp = src.ptr;
    // Overlapping self-views (e.g. an expanded destination) would race; only parallelise when dst
    // is contiguous.
    let run = |start: usize, end: usize| {
        let (dp, sp) = (dp, sp);
        vectorize(
            #[inline(always)]
            || {
                w.rows(
                    start,
                    end,
                    #[inline(always)]
                    |[od, os], len, _| {
                        // SAFETY: dst offsets come from its validated layout; tasks own disjoint element
                        // ranges of a non-overlapping (contiguous) destination.
                        unsafe {
                            if sd == 1 && ss == 1 {
                                let d = std::slice::from_raw_parts_mut(dp.0.add(od), len);
                                let s = std::slice::from_raw_parts(sp.0.add(os), len);
                                for (d, &s) in d.iter_mut().zip(s) {
                                    *d = f(*d, s);
                                }
                            } else if sd == 1 && ss == 0 {
                                // A source broadcast along the row (a per-channel bias added to
                                // NCHW planes): one value for the whole row, so the loop
                                // vectorises like the contiguous one.
                                let d = std::slice::from_raw_parts_mut(dp.0.add(od), len);
                                let s = *sp.0.add(os);
                                for d in d.iter_mut() {
                                    *d = f(*d, s);
                                }
                            } else {
                                for i in 0..len {
                                    let p = dp.0.add(od + i * sd);
                                    *p = f(*p, *sp.0.add(os + i * ss));
                                }
                            }
                        }
                    },
                )
            },
        );
    };
    if dl.is_contiguous() {
        par_ranges(n, 1, run);
    } else {
        run(0, n);
    }
    Ok(())
}

/// Fast path: out[i] = f(a[i], b[i]) for contiguous same-shape operands (no layout walking).
pub(crate) fn zip2_contig<A: Copy + Send + Sync, B: Copy + Send + Sync, O: Copy + Send + Sync>(
    out: &Tensor,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(A, B) -> O + Sync + Send,
) -> Result<()> {
    let n = out.numel();
    let (ap, bp, op) = (SendPtr(a.ptr::<A>("map")?), SendPtr(b.ptr::<B>("map")?), SendPtr(out.ptr::<O>("map")?));
    par_ranges(n, 1, |s, e| {
        let (ap, bp, op) = (ap, bp, op);
        // SAFETY: all three are contiguous with n elements (checked by the caller); each task
        // writes the disjoint output range [s, e) of the fresh output.
        unsafe {
            let x = std::slice::from_raw_parts(ap.0.add(s), e - s);
            let y = std::slice::from_raw_parts(bp.0.add(s), e - s);
            let o = std::slice::from_raw_parts_mut(op.0.add(s), e - s);
            vectorize(
                #[inline(always)]
                || {
                    for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                        *o = f(x, y);
                    }
                },
            );
        }
    });
    Ok(())
}

/// Fast path: out[i] = f(a[i]) for a contiguous operand.
pub(crate) fn map1_contig<A: Copy + Send + Sync, O: Copy + Send + Sync>(
    out: &Tensor,
    a: &Tensor,
    f: impl Fn(A) -> O + Sync + Send,
) -> Result<()> {
    let n = out.numel();
    let (ap, op) = (SendPtr(a.ptr::<A>("map")?), SendPtr(out.ptr::<O>("map")?));
    par_ranges(n, 1, |s, e| {
        let (ap, op) = (ap, op);
        // SAFETY: both contiguous with n elements (checked by the caller); disjoint output ranges.
        unsafe {
            let x = std::slice::from_raw_parts(ap.0.add(s), e - s);
            let o = std::slice::from_raw_parts_mut(op.0.add(s), e - s);
            vectorize(
                #[inline(always)]
                || {
                    for (o, &x) in o.iter_mut().zip(x) {
                        *o = f(x);
                    }
                },
            );
        }
    });
    Ok(())
}
