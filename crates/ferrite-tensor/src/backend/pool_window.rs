//! Where each output element of a 2-D pooling reads: PyTorch's window arithmetic, written once
//! and used by the op layer (output sizes) and by every backend's kernels (the WGSL kernels
//! transcribe the same formulas), so a window can never differ between devices.
//!
//! Kernels see their input as contiguous planes `[P, H, W]` (`P = N·C`) and write `[P, OH, OW]`;
//! a [`Pool2d`] says how output `(oh, ow)` maps to input rows and columns:
//! - max pooling: rows `oh·sH - pH + i·dH` for `i < kH` that lie inside the input;
//! - average pooling: rows `[oh·sH - pH, min(start + kH, H + pH))` clipped to the input, divided
//!   by the padded window, the clipped window or `divisor_override` (PyTorch's
//!   `count_include_pad` rule);
//! - adaptive average pooling: rows `[⌊oh·H/OH⌋, ⌈(oh+1)·H/OH⌉)`, divided by the window's size.

/// The window rule of a 2-D pooling; sizes are `[height, width]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    Max {
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    },
    Avg {
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
        divisor_override: Option<usize>,
    },
    AdaptiveAvg,
}

/// One 2-D pooling: input plane size, output plane size and the window rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2d {
    pub input: [usize; 2],
    pub output: [usize; 2],
    pub kind: PoolKind,
}

/// A window of an average pooling: rows `h0..h1`, columns `w0..w1` (clipped to the input) and
/// the divisor of its sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgWindow {
    pub h0: usize,
    pub h1: usize,
    pub w0: usize,
    pub w1: usize,
    pub divisor: usize,
}

/// PyTorch's `pooling_output_shape`: `⌊(in + 2p - d(k-1) - 1 (+ s-1 with ceil_mode)) / s⌋ + 1`,
/// and with `ceil_mode` one fewer when the last window would start past the input and its left
/// padding. Negative or zero results mean the input is too small (the op reports it).
pub fn pool_output_size(
    input: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    ceil_mode: bool,
) -> i64 {
    let (input, kernel, stride, pad, dilation) =
        (input as i64, kernel as i64, stride as i64, pad as i64, dilation as i64);
    let numer = input + 2 * pad - dilation * (kernel - 1) - 1 + if ceil_mode { stride - 1 } else { 0 };
    let mut out = numer.div_euclid(stride) + 1;
    if ceil_mode && (out - 1) * stride >= input + pad {
        out -= 1;
    }
    out
}

/// PyTorch's adaptive `start_index`: `⌊o·in/out⌋`.
#[inline]
pub fn adaptive_start(o: usize, input: usize, output: usize) -> usize {
    (o * input) / output
}

/// PyTorch's adaptive `end_index`: `⌈(o+1)·in/out⌉`.
#[inline]
pub fn adaptive_end(o: usize, input: usize, output: usize) -> usize {
    ((o + 1) * input).div_ceil(output)
}

impl Pool2d {
    /// Max pooling: the first in-bounds row/column of output `o` along `axis` (0 = height), the
    /// step between taps and one past the last tap (`start + k·d` clipped to the input); empty
    /// when `start >= end`. Call only for [`PoolKind::Max`].
    pub fn max_taps(&self, axis: usize, o: usize) -> (usize, usize, usize) {
        let PoolKind::Max { kernel, stride, padding, dilation } = self.kind else { return (0, 1, 0) };
        let (k, s, p, d) = (kernel[axis] as i64, stride[axis] as i64, padding[axis] as i64, dilation[axis] as i64);
        let size = self.input[axis] as i64;
        let mut start = o as i64 * s - p;
        let end = (start + (k - 1) * d + 1).min(size);
        while start < 0 {
            start += d;
        }
        (start as usize, d as usize, end.max(0) as usize)
    }

    /// Average pooling (fixed or adaptive): the window of output `(oh, ow)`. For max pooling,
    /// the bounding box of its taps with divisor 1.
    pub fn avg_window(&self, oh: usize, ow: usize) -> AvgWindow {
        match self.kind {
            PoolKind::Avg { kernel, stride, padding, count_include_pad, divisor_override } => {
                let axis = |a: usize, o: usize| {
                    let (k, s, p) = (kernel[a] as i64, stride[a] as i64, padding[a] as i64);
                    let size = self.input[a] as i64;
                    let start = o as i64 * s - p;
                    let end = (start + k).min(size + p);
                    let padded = end - start;
                    (start.max(0) as usize, end.min(size).max(0) as usize, padded.max(0) as usize)
                };
                let (h0, h1, ph) = axis(0, oh);
                let (w0, w1, pw) = axis(1, ow);
                let clipped = h1.saturating_sub(h0) * w1.saturating_sub(w0);
                let divisor = match divisor_override {
                    Some(d) => d,
                    None if count_include_pad => ph * pw,
                    None => clipped,
                };
                AvgWindow { h0, h1, w0, w1, divisor }
            }
            PoolKind::Max { .. } => {
                // The bounding box of the taps (max pooling has no divisor).
                let ((h0, _, h1), (w0, _, w1)) = (self.max_taps(0, oh), self.max_taps(1, ow));
                AvgWindow { h0, h1: h1.max(h0), w0, w1: w1.max(w0), divisor: 1 }
            }
            PoolKind::AdaptiveAvg => {
                let [h, w] = self.input;
                let [oh_n, ow_n] = self.output;
                let (h0, h1) = (adaptive_start(oh, h, oh_n), adaptive_end(oh, h, oh_n));
                let (w0, w1) = (adaptive_start(ow, w, ow_n), adaptive_end(ow, w, ow_n));
                AvgWindow { h0, h1, w0, w1, divisor: (h1 - h0) * (w1 - w0) }
            }
        }
    }

    /// The outputs along `axis` whose windows may contain input index `i` (a superset; callers
    /// check membership with the window itself). Used by gather-style backward kernels.
    pub fn outputs_touching(&self, axis: usize, i: usize) -> (usize, usize) {
        let out = self.output[axis];
        let (kernel, stride, padding, dilation) = match self.kind {
            PoolKind::Max { kernel, stride, padding, dilation } => (kernel, stride, padding, dilation),
            PoolKind::Avg { kernel, stride, padding, .. } => (kernel, stride, padding, [1, 1]),
            PoolKind::AdaptiveAvg => {
                let input = self.input[axis];
                return (adaptive_start(i, out, input).min(out), adaptive_end(i, out, input).min(out));
            }
        };
        let (k, s, p, d) = (kernel[axis] as i64, stride[axis] as i64, padding[axis] as i64, dilation[axis] as i64);
        let pos = i as i64 + p;
        let reach = (k - 1) * d;
        let lo = if pos < reach { 0 } else { (pos - reach + s - 1) / s };
        let hi = (pos / s + 1).min(out as i64);
        (lo.min(out as i64) as usize, hi.max(0) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_sizes_follow_pytorch() {
        // floor mode
        assert_eq!(pool_output_size(8, 2, 2, 0, 1, false), 4);
        assert_eq!(pool_output_size(9, 3, 2, 1, 1, false), 5);
        // ceil mode adds a partial window …
        assert_eq!(pool_output_size(5, 2, 2, 0, 1, true), 3);
        // … unless it would start inside the right padding only.
        assert_eq!(pool_output_size(5, 2, 2, 1, 1, true), 3);
        assert_eq!(pool_output_size(2, 3, 1, 0, 1, false), 0);
    }

    #[test]
    fn adaptive_windows_cover_the_input() {
        let p = Pool2d { input: [7, 8], output: [3, 3], kind: PoolKind::AdaptiveAvg };
        let rows: Vec<(usize, usize)> = (0..3).map(|o| (p.avg_window(o, 0).h0, p.avg_window(o, 0).h1)).collect();
        assert_eq!(rows, vec![(0, 3), (2, 5), (4, 7)]);
        for i in 0..7 {
            let (lo, hi) = p.outputs_touching(0, i);
            for o in 0..3 {
                let w = p.avg_window(o, 0);
                assert_eq!((w.h0..w.h1).contains(&i), (lo..hi).contains(&o), "row {i} output {o}");
            }
        }
    }

    #[test]
    fn avg_divisors() {
        let kind = PoolKind::Avg {
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1],
            count_include_pad: true,
            divisor_override: None,
        };
        let p = Pool2d { input: [5, 5], output: [3, 3], kind };
        assert_eq!(p.avg_window(0, 0), AvgWindow { h0: 0, h1: 2, w0: 0, w1: 2, divisor: 9 });
        let kind = PoolKind::Avg {
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1],
            count_include_pad: false,
            divisor_override: None,
        };
        let p = Pool2d { input: [5, 5], output: [3, 3], kind };
        assert_eq!(p.avg_window(0, 0).divisor, 4);
    }

    #[test]
    fn max_taps_skip_padding_in_dilation_steps() {
        let kind = PoolKind::Max { kernel: [3, 3], stride: [1, 1], padding: [1, 1], dilation: [2, 2] };
        let p = Pool2d { input: [5, 5], output: [3, 3], kind };
        // Output 0 starts at -1: taps -1, 1, 3 → 1 and 3.
        assert_eq!(p.max_taps(0, 0), (1, 2, 4));
        for i in 0..5 {
            let (lo, hi) = p.outputs_touching(0, i);
            for o in 0..3 {
                let (s, d, e) = p.max_taps(0, o);
                let hit = (s..e).step_by(d).any(|t| t == i);
                assert!(!hit || (lo..hi).contains(&o), "row {i} output {o}");
            }
        }
    }
}
