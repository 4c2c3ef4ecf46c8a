//! CPU unfold/fold (im2col/col2im) of a convolution: the only convolution arithmetic a backend
//! owns besides its GEMM (see `functional/conv.rs`). Both walk the image one `(sample, channel)`
//! plane per task on the kernel team, so every task writes memory no other task touches (col2im
//! needs no atomics), and each inner loop is one window row: a run of `ow` columns whose valid
//! middle is a plain copy (stride 1) or a strided gather, with the padded ends filled or skipped
//! once per row instead of tested per element.

use crate::backend::ConvGeometry;
use crate::element::Float;
use crate::error::Result;
use crate::kernels::strided::{SendPtr, par_ranges};
use crate::{Tensor, dispatch_float};

pub(super) fn im2col(cols: &Tensor, x: &Tensor, g: &ConvGeometry) -> Result<()> {
    dispatch_float!(x.dtype(), "im2col", T => unfold::<T>(cols, x, g))
}

pub(super) fn col2im(x: &Tensor, cols: &Tensor, g: &ConvGeometry) -> Result<()> {
    dispatch_float!(x.dtype(), "col2im", T => fold::<T>(x, cols, g))
}

/// The output columns `[lo, hi)` of a window row whose tap at column offset `off` (tap index times
/// dilation, minus padding) lands inside an input row of `w` pixels: `0 ≤ ow·stride + off < w`.
#[inline]
fn valid_span(off: isize, stride: usize, w: usize, ow: usize) -> (usize, usize) {
    let s = stride as isize;
    // First ow with ow·s + off ≥ 0, and first with ow·s + off ≥ w.
    let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
    let hi = if (w as isize) <= off { 0 } else { ((w as isize - off) + s - 1) / s };
    let lo = (lo as usize).min(ow);
    (lo, (hi as usize).clamp(lo, ow))
}

fn unfold<T: Float>(cols: &Tensor, x: &Tensor, g: &ConvGeometry) -> Result<()> {
    let planes = x.shape()[0] * g.channels;
    if cols.numel() == 0 {
        return Ok(());
    }
    let xp = SendPtr(x.ptr::<T>("im2col")?);
    let cp = SendPtr(cols.ptr::<T>("im2col")?);
    let (taps, windows, pixels) = (g.taps(), g.windows(), g.pixels());
    let zero = T::from_f64(0.0);
    par_ranges(planes, taps * windows, |p0, p1| {
        let (xp, cp) = (xp, cp);
        for plane in p0..p1 {
            // SAFETY: plane `plane` of the contiguous image and its `taps` rows of the contiguous
            // cols; planes are disjoint between tasks and cols is not aliased by x.
            let (src, dst) = unsafe {
                (
                    std::slice::from_raw_parts(xp.0.add(plane * pixels), pixels),
                    std::slice::from_raw_parts_mut(cp.0.add(plane * taps * windows), taps * windows),
                )
            };
            unfold_plane(dst, src, g, zero);
        }
    });
    Ok(())
}

/// The `taps × windows` rows of one image plane.
fn unfold_plane<T: Copy>(dst: &mut [T], src: &[T], g: &ConvGeometry, zero: T) {
    let [h, w] = g.input;
    let [oh, ow] = g.output;
    let [kh, kw] = g.kernel;
    let [sh, sw] = g.stride;
    let [dh, dw] = g.dilation;
    let [ph, pw] = g.padding;
    for i in 0..kh {
        for j in 0..kw {
            let row = &mut dst[(i * kw + j) * oh * ow..][..oh * ow];
            let off_w = (j * dw) as isize - pw as isize;
            let (lo, hi) = valid_span(off_w, sw, w, ow);
            for r in 0..oh {
                let out = &mut row[r * ow..][..ow];
                let ih = (r * sh + i * dh) as isize - ph as isize;
                if ih < 0 || ih >= h as isize || lo == hi {
                    out.fill(zero);
                    continue;
                }
                let line = &src[ih as usize * w..][..w];
                out[..lo].fill(zero);
                out[hi..].fill(zero);
                let first = (lo * sw) as isize + off_w;
                if sw == 1 {
                    out[lo..hi].copy_from_slice(&line[first as usize..][..hi - lo]);
                } else {
                    for (k, o) in out[lo..hi].iter_mut().enumerate() {
                        *o = line[first as usize + k * sw];
                    }
                }
            }
        }
    }
}

fn fold<T: Float>(x: &Tensor, cols: &Tensor, g: &ConvGeometry) -> Result<()> {
    let planes = x.shape()[0] * g.channels;
    if x.numel() == 0 {
        return Ok(());
    }
    let xp = SendPtr(x.ptr::<T>("col2im")?);
    let cp = SendPtr(cols.ptr::<T>("col2im")?);
    let (taps, windows, pixels) = (g.taps(), g.windows(), g.pixels());
    par_ranges(planes, taps * windows, |p0, p1| {
        let (xp, cp) = (xp, cp);
        for plane in p0..p1 {
            // SAFETY: as in `unfold`, with the roles of the two buffers swapped: each task writes
            // only its own planes of x and reads its own rows of cols.
            let (dst, src) = unsafe {
                (
                    std::slice::from_raw_parts_mut(xp.0.add(plane * pixels), pixels),
                    std::slice::from_raw_parts(cp.0.add(plane * taps * windows), taps * windows),
                )
            };
            fold_plane(dst, src, g);
        }
    });
    Ok(())
}

/// One image plane as the sum of its `taps × windows` rows.
fn fold_plane<T: Float>(dst: &mut [T], src: &[T], g: &ConvGeometry) {
    let [h, w] = g.input;
    let [oh, ow] = g.output;
    let [kh, kw] = g.kernel;
    let [sh, sw] = g.stride;
    let [dh, dw] = g.dilation;
    let [ph, pw] = g.padding;
    dst.fill(T::from_f64(0.0));
    for i in 0..kh {
        for j in 0..kw {
            let row = &src[(i * kw + j) * oh * ow..][..oh * ow];
            let off_w = (j * dw) as isize - pw as isize;
            let (lo, hi) = valid_span(off_w, sw, w, ow);
            if lo == hi {
                continue;
            }
            for r in 0..oh {
                let ih = (r * sh + i * dh) as isize - ph as isize;
                if ih < 0 || ih >= h as isize {
                    continue;
                }
                let line = &mut dst[ih as usize * w..][..w];
                let vals = &row[r * ow + lo..r * ow + hi];
                let first = ((lo * sw) as isize + off_w) as usize;
                if sw == 1 {
                    for (d, &v) in line[first..first + vals.len()].iter_mut().zip(vals) {
                        *d = T::from_acc(d.to_acc() + v.to_acc());
                    }
                } else {
                    for (k, &v) in vals.iter().enumerate() {
                        let d = &mut line[first + k * sw];
                        *d = T::from_acc(d.to_acc() + v.to_acc());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference: the tap of window (r, q) at (i, j) reads pixel (r·s + i·d − p, q·s + j·d − p).
    fn naive(src: &[f32], g: &ConvGeometry) -> Vec<f32> {
        let mut out = vec![0.0; g.taps() * g.windows()];
        for i in 0..g.kernel[0] {
            for j in 0..g.kernel[1] {
                for r in 0..g.output[0] {
                    for q in 0..g.output[1] {
                        let y = (r * g.stride[0] + i * g.dilation[0]) as isize - g.padding[0] as isize;
                        let x = (q * g.stride[1] + j * g.dilation[1]) as isize - g.padding[1] as isize;
                        if y >= 0 && x >= 0 && (y as usize) < g.input[0] && (x as usize) < g.input[1] {
                            out[(i * g.kernel[1] + j) * g.windows() + r * g.output[1] + q] =
                                src[y as usize * g.input[1] + x as usize];
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn unfold_matches_the_definition_and_fold_is_its_adjoint() {
        for (input, kernel, stride, padding, dilation, extra) in [
            ([5, 7], [3, 3], [1, 1], [1, 1], [1, 1], [0, 0]),
            ([6, 5], [2, 3], [2, 3], [0, 2], [1, 2], [1, 0]),
            ([4, 9], [3, 2], [3, 1], [2, 0], [2, 1], [0, 1]),
            ([1, 8], [1, 4], [1, 2], [0, 3], [1, 3], [0, 2]),
        ] {
            let out = |a: usize| {
                let o = |d: usize| {
                    (input[d] + 2 * padding[d] + extra[d] - dilation[d] * (kernel[d] - 1) - 1) / stride[d] + 1
                };
                o(a)
            };
            let g = ConvGeometry { channels: 1, input, kernel, stride, padding, dilation, output: [out(0), out(1)] };
            let src: Vec<f32> = (0..g.pixels()).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut got = vec![f32::NAN; g.taps() * g.windows()];
            unfold_plane(&mut got, &src, &g, 0.0);
            assert_eq!(got, naive(&src, &g), "{g:?}");
            // <unfold(x), c> == <x, fold(c)> for any c.
            let c: Vec<f32> = (0..got.len()).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let mut folded = vec![f32::NAN; g.pixels()];
            fold_plane(&mut folded, &c, &g);
            let lhs: f64 = got.iter().zip(&c).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
            let rhs: f64 = src.iter().zip(&folded).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
            assert!((lhs - rhs).abs() < 1e-6 * (1.0 + lhs.abs()), "{g:?}: {lhs} vs {rhs}");
        }
    }
}
