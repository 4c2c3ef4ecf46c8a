//! CPU unfold/fold (im2col/col2im) of a convolution: the only convolution arithmetic a backend
//! owns besides its GEMM (see `functional/conv.rs`). Both walk the image one `(sample, channel)`
//! plane per task on the kernel team, so every task writes memory no other task touches (col2im
//! needs no atomics), and each inner loop is one window row: a run of `ow` columns whose valid
//! middle is a plain copy (stride 1) or a strided gather, with the padded ends filled or skipped
//! once per row instead of tested per element.

use crate::backend::{ConvGeometry, conv_products};
use crate::element::Float;
use crate::error::Result;
use crate::kernels::gemm::unfolded::valid_span;
use crate::kernels::gemm::{self, Isa, MatPtr, UnfoldedImage};
use crate::kernels::strided::{SendPtr, par_ranges};
use crate::{DType, Tensor, dispatch_float};

pub(super) fn im2col(cols: &Tensor, x: &Tensor, g: &ConvGeometry) -> Result<()> {
    dispatch_float!(x.dtype(), "im2col", T => unfold::<T>(cols, x, g))
}

pub(super) fn col2im(x: &Tensor, cols: &Tensor, g: &ConvGeometry) -> Result<()> {
    dispatch_float!(x.dtype(), "col2im", T => fold::<T>(x, cols, g))
}

/// Whether this CPU computes the forward product of a convolution of `dtype` as implicit GEMM
/// ([`unfold_product`]: no unfolded tensor), which is what `meta` must then allocate too: f32
/// wherever ferrite's own GEMM runs (x86-64). f64, and f32 off x86-64 (faer's GEMM), unfold.
pub(crate) fn implicit_forward(dtype: DType) -> bool {
    dtype == DType::F32 && Isa::best().is_some()
}

/// The forward product `y[n, g] = a3[g] · U(img[n])[g]` (see
/// [`KernelBackend::conv_unfold_product`](crate::backend::KernelBackend::conv_unfold_product)),
/// which is also the input gradient of a stride-1 convolution: for f32 on x86-64, one GEMM per
/// (sample, group) whose right-hand side is packed straight from the image
/// ([`UnfoldedImage`]), so the only allocation is `y`. The products are spread over the kernel
/// team, or threaded one by one, by the rule batched products use (`gemm::spread_over_batch`),
/// and each takes the strategy the same product over an unfolded matrix would: the same sums in
/// the same order, so the same bits as unfold + GEMM. Other dtypes take the unfold + GEMM
/// default.
pub(super) fn unfold_product(img: &Tensor, a3: &Tensor, geom: &ConvGeometry, groups: usize) -> Result<Tensor> {
    let forced = gemm::forced();
    let isa = forced.map(|f| f.isa).or_else(Isa::best);
    let (Some(isa), DType::F32) = (isa, img.dtype()) else {
        return conv_products::unfold_product(img, a3, geom, groups);
    };
    let n = img.shape()[0];
    let (win, m) = (geom.windows(), a3.shape()[1]);
    let kc = geom.rows() / groups;
    let y = img.empty_like_shape(&[n, groups * m, geom.output[0], geom.output[1]], DType::F32)?;
    if y.numel() == 0 {
        return Ok(y);
    }
    let threads = crate::kernels::team::threads();
    let products = n * groups;
    let spread =
        forced.and_then(|f| f.spread).unwrap_or_else(|| gemm::spread_over_batch(products, m, win, kc, threads));
    let per_product = if spread { 1 } else { threads };
    let strategy = match forced.and_then(|f| f.strategy) {
        Some(s) => s.with_threads(per_product),
        // The unfolded matrix's rows are contiguous: what `matmul` over it would be told.
        None => gemm::strategy_in_batch(m, win, kc, per_product, spread, true),
    };
    let group_channels = geom.channels / groups;
    let (ip, ap, yp) =
        (SendPtr(img.ptr::<f32>("conv2d")?), SendPtr(a3.ptr::<f32>("conv2d")?), SendPtr(y.ptr::<f32>("conv2d")?));
    let (a_rs, a_cs) = (a3.strides()[1] as isize, a3.strides()[2] as isize);
    let a_group = a3.strides()[0];
    let product = |u: usize| {
        let (ip, ap, yp) = (ip, ap, yp); // capture the Sync wrappers, not their raw fields
        let (s, g) = (u / groups, u % groups);
        // SAFETY: `img` is a contiguous [n, channels, h, w] f32 tensor, so sample `s`'s group `g`
        // is `group_channels` planes at this offset; `a3` is the f32 [groups, m, kc] weight at its
        // own strides; `y` is a fresh contiguous [n, groups·m, oh·ow] buffer distinct from both,
        // and product `u` writes only its own m × win block; `isa` is supported (`best`, or a
        // test that checked it).
        unsafe {
            let b = UnfoldedImage {
                img: ip.0.add((s * geom.channels + g * group_channels) * geom.pixels()),
                channels: group_channels,
                input: geom.input,
                kernel: geom.kernel,
                stride: geom.stride,
                padding: geom.padding,
                dilation: geom.dilation,
                output: geom.output,
            };
            let a = MatPtr { ptr: ap.0.add(g * a_group), rs: a_rs, cs: a_cs };
            gemm::sgemm_unfolded(isa, strategy, m, win, kc, a, &b, yp.0.add(u * m * win), win);
        }
    };
    if spread {
        gemm::split(products, threads, &|u0, u1| (u0..u1).for_each(product));
    } else {
        (0..products).for_each(product);
    }
    Ok(y)
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

    /// Geometries with every edge the packing handles: padding on both sides, strides and
    /// dilations, windows narrower and wider than a register tile (so a panel spans several
    /// window rows, or a window row several panels), and an asymmetric extra output column.
    fn geometries() -> Vec<ConvGeometry> {
        let g = |channels,
                 input: [usize; 2],
                 kernel: [usize; 2],
                 stride: [usize; 2],
                 padding: [usize; 2],
                 dilation: [usize; 2],
                 extra: [usize; 2]| {
            let o =
                |d: usize| (input[d] + 2 * padding[d] + extra[d] - dilation[d] * (kernel[d] - 1) - 1) / stride[d] + 1;
            ConvGeometry { channels, input, kernel, stride, padding, dilation, output: [o(0), o(1)] }
        };
        vec![
            g(3, [5, 7], [3, 3], [1, 1], [1, 1], [1, 1], [0, 0]),
            g(2, [6, 5], [2, 3], [2, 3], [0, 2], [1, 2], [1, 0]),
            g(4, [4, 9], [3, 2], [3, 1], [2, 0], [2, 1], [0, 1]),
            g(1, [1, 8], [1, 4], [1, 2], [0, 3], [1, 3], [0, 2]),
            g(6, [11, 37], [3, 3], [1, 1], [1, 1], [1, 1], [0, 0]),
            g(2, [9, 13], [5, 5], [2, 2], [4, 4], [1, 1], [0, 0]),
        ]
    }

    /// Every block of the implicit GEMM's packing (any depth range, any column range, any panel
    /// width) is the same block of the explicitly unfolded matrix, zero-padded past `nr`.
    #[test]
    fn packing_from_the_image_is_packing_the_unfolded_matrix() {
        for g in geometries() {
            let img: Vec<f32> = (0..g.channels * g.pixels()).map(|i| (i % 97) as f32 * 0.25 - 7.0).collect();
            let mut cols = vec![f32::NAN; g.rows() * g.windows()];
            for c in 0..g.channels {
                let plane = &img[c * g.pixels()..][..g.pixels()];
                unfold_plane(&mut cols[c * g.taps() * g.windows()..][..g.taps() * g.windows()], plane, &g, 0.0);
            }
            let b = UnfoldedImage {
                img: img.as_ptr(),
                channels: g.channels,
                input: g.input,
                kernel: g.kernel,
                stride: g.stride,
                padding: g.padding,
                dilation: g.dilation,
                output: g.output,
            };
            let (rows, win) = (b.rows(), b.cols());
            assert_eq!((rows, win), (g.rows(), g.windows()));
            for width in [8usize, 16, 32] {
                for (p0, kc) in [(0, rows), (1, rows - 1), (rows / 2, rows - rows / 2), (rows - 1, 1)] {
                    for j0 in (0..win).step_by(width.min(win).max(1)).chain([1, win - 1]) {
                        let nr = width.min(win - j0);
                        let mut got = vec![f32::NAN; kc * width];
                        // SAFETY: `img` holds the planes; `got` holds kc·width values; the block
                        // lies inside the unfolded matrix.
                        unsafe { b.pack_panel(p0, kc, j0, nr, width, got.as_mut_ptr()) };
                        for p in 0..kc {
                            for j in 0..width {
                                let want = if j < nr { cols[(p0 + p) * win + j0 + j] } else { 0.0 };
                                assert_eq!(
                                    got[p * width + j].to_bits(),
                                    want.to_bits(),
                                    "{g:?} width {width} block p0 {p0} kc {kc} j0 {j0} nr {nr}: row {p} col {j}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The implicit forward product gives the bits of unfold + GEMM (`conv_products`'s default)
    /// for every instruction set this CPU runs, both GEMM paths, spread or not, with groups.
    #[test]
    fn the_implicit_forward_product_has_the_bits_of_unfold_and_gemm() {
        use crate::kernels::gemm::{Forced, Strategy, with_forced};
        use crate::{Device, Generator};
        let d = Device::Cpu;
        let mut r = Generator::new(5);
        let isas: Vec<Isa> = [Isa::Avx512, Isa::Avx2, Isa::Scalar].into_iter().filter(|i| i.supported()).collect();
        if Isa::best().is_none() {
            eprintln!("SKIPPED: no implicit GEMM off x86-64 (f32 products are faer's)");
            return;
        }
        for (gi, g) in geometries().into_iter().enumerate() {
            for (groups, m, n) in [(1usize, 5usize, 3usize), (g.channels, 2, 2), (1, 40, 1)] {
                if g.channels % groups != 0 {
                    continue;
                }
                let img = Tensor::randn_with(&[n, g.channels, g.input[0], g.input[1]], DType::F32, &d, &mut r).unwrap();
                let a3 = Tensor::randn_with(&[groups, m, g.rows() / groups], DType::F32, &d, &mut r).unwrap();
                for &isa in &isas {
                    for strategy in [None, Some(Strategy::Small { threads: 2 }), Some(Strategy::Packed { threads: 2 })]
                    {
                        for spread in [None, Some(true), Some(false)] {
                            let forced = Forced { isa, strategy, spread };
                            let (want, got) = with_forced(forced, || {
                                (
                                    conv_products::unfold_product(&img, &a3, &g, groups)
                                        .unwrap()
                                        .to_vec::<f32>()
                                        .unwrap(),
                                    unfold_product(&img, &a3, &g, groups).unwrap().to_vec::<f32>().unwrap(),
                                )
                            });
                            assert!(
                                got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                                "geometry {gi} groups {groups} m {m} n {n} {forced:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
