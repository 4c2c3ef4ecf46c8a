//! The unfolded image of a convolution as the GEMM's right-hand side, packed straight from the
//! image: implicit GEMM on the CPU.
//!
//! Why: unfold + GEMM writes the whole unfolded matrix (`C·kh·kw × oh·ow` per sample, 9× the
//! image for a 3×3 layer) and the GEMM's packing then reads it back, only to copy it again into
//! `KC × NR` panels. A `perf` profile of the ResNet basic block put 9 % of its time in that
//! im2col and a further share in re-reading its output (BENCHMARKS.md, issue 32). Packing the
//! panels from the image itself does the one copy the GEMM needs anyway, from a source that
//! stays in cache (the image is a ninth of its unfolding), and the convolution allocates no
//! unfolded tensor at all.
//!
//! The panel layout is exactly [`MicroKernel::pack_b`](super::MicroKernel::pack_b)'s, so the
//! register tiles, the blocking and the order of every sum are those of the product over the
//! unfolded matrix: the same bits.

use super::MatPtr;
use super::micro_kernel::{MicroKernel, PackB};

/// `B[r, j]` of one image's unfolding (one group's channels): row `r = (c, i, j')` is channel
/// `c`'s tap `(i, j')`, column `j = (p, q)` its window; the value is the pixel
/// `(p·stride₀ − padding₀ + i·dilation₀, q·stride₁ − padding₁ + j'·dilation₁)` of plane `c`, or 0
/// where that falls outside the image. The kernel-side twin of the backend's `ConvGeometry`
/// (the kernels do not depend on the backend).
#[derive(Clone, Copy, Debug)]
pub(crate) struct UnfoldedImage {
    /// Plane 0 of the channels this product reads: `channels` contiguous `h × w` planes.
    pub img: *const f32,
    pub channels: usize,
    pub input: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub output: [usize; 2],
}
// SAFETY: a read-only view of an image the caller keeps alive and unmodified during the product.
unsafe impl Send for UnfoldedImage {}
// SAFETY: as above.
unsafe impl Sync for UnfoldedImage {}

/// The output columns `[lo, hi)` of a window row whose tap at column offset `off` (tap index
/// times dilation, minus padding) lands inside an input row of `w` pixels:
/// `0 ≤ col·stride + off < w`. Shared with the CPU's explicit unfold (`backend/cpu/conv.rs`).
#[inline]
pub(crate) fn valid_span(off: isize, stride: usize, w: usize, ow: usize) -> (usize, usize) {
    let s = stride as isize;
    // First col with col·s + off ≥ 0, and first with col·s + off ≥ w.
    let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
    let hi = if (w as isize) <= off { 0 } else { ((w as isize - off) + s - 1) / s };
    let lo = (lo as usize).min(ow);
    (lo, (hi as usize).clamp(lo, ow))
}

impl UnfoldedImage {
    /// Rows of the unfolded matrix (the product's depth): `channels·kh·kw`.
    pub(crate) fn rows(&self) -> usize {
        self.channels * self.kernel[0] * self.kernel[1]
    }

    /// Columns of the unfolded matrix: `oh·ow`.
    pub(crate) fn cols(&self) -> usize {
        self.output[0] * self.output[1]
    }

    /// Pack rows `p0..p0+kc`, columns `j0..j0+nr` (`nr ≤ width`) as `[p][j]` with `width` values
    /// per row (columns past `nr` zero).
    ///
    /// # Safety
    /// `img` holds `channels` initialised planes of `h·w` values; `dst` is writable for
    /// `kc·width` values; `p0 + kc ≤ rows()`, `j0 + nr ≤ cols()`.
    pub(crate) unsafe fn pack_panel(&self, p0: usize, kc: usize, j0: usize, nr: usize, width: usize, dst: *mut f32) {
        let [h, w] = self.input;
        let [_, ow] = self.output;
        let [kh, kw] = self.kernel;
        let [sh, sw] = self.stride;
        let [ph, pw] = self.padding;
        let [dh, dw] = self.dilation;
        // SAFETY: the caller's contract: the image's planes and the panel.
        let (img, dst) = unsafe {
            (
                std::slice::from_raw_parts(self.img, self.channels * h * w),
                std::slice::from_raw_parts_mut(dst, kc * width),
            )
        };
        let taps = kh * kw;
        // The row's channel and tap, advanced one row at a time (no division per row).
        let (mut c, mut ki, mut kj) = (p0 / taps, (p0 % taps) / kw, p0 % kw);
        let (oy0, ox0) = (j0 / ow, j0 % ow);
        for row in dst.chunks_exact_mut(width) {
            let plane = &img[c * h * w..][..h * w];
            let off_w = (kj * dw) as isize - pw as isize;
            let (lo, hi) = valid_span(off_w, sw, w, ow);
            let (mut oy, mut ox, mut done) = (oy0, ox0, 0);
            while done < nr {
                let len = (ow - ox).min(nr - done);
                let out = &mut row[done..][..len];
                let iy = (oy * sh + ki * dh) as isize - ph as isize;
                if iy < 0 || iy >= h as isize {
                    out.fill(0.0);
                } else {
                    // Columns ox..ox+len of this window row; the taps of [a, b) are inside it.
                    let a = lo.clamp(ox, ox + len);
                    let b = hi.clamp(a, ox + len);
                    out[..a - ox].fill(0.0);
                    out[b - ox..].fill(0.0);
                    if a < b {
                        let line = &plane[iy as usize * w..][..w];
                        let first = ((a * sw) as isize + off_w) as usize;
                        let valid = &mut out[a - ox..b - ox];
                        if sw == 1 {
                            valid.copy_from_slice(&line[first..][..b - a]);
                        } else {
                            for (k, o) in valid.iter_mut().enumerate() {
                                *o = line[first + k * sw];
                            }
                        }
                    }
                }
                done += len;
                ox = 0;
                oy += 1;
            }
            row[nr..].fill(0.0);
            kj += 1;
            if kj == kw {
                kj = 0;
                ki += 1;
                if ki == kh {
                    ki = 0;
                    c += 1;
                }
            }
        }
    }
}

impl PackB for UnfoldedImage {
    #[inline]
    unsafe fn pack<K: MicroKernel>(&self, p0: usize, kc: usize, j0: usize, nr: usize, dst: *mut f32) {
        // SAFETY: forwarded (the packers' contract: the block lies inside B, `dst` holds
        // `kc·NR` values).
        unsafe { self.pack_panel(p0, kc, j0, nr, K::NR, dst) }
    }

    fn rows_in_place(&self) -> Option<MatPtr> {
        None
    }
}
