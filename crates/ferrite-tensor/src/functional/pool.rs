//! 2-D pooling of `torch.nn.functional`: max pooling (with the argmax saved for backward),
//! average pooling and adaptive average pooling, on `(N, C, H, W)` or unbatched `(C, H, W)`
//! input.
//!
//! Each is one backend kernel forward and one backward (`KernelBackend::max_pool2d`,
//! `avg_pool2d`, and their `_backward`s) over the `N·C` planes, reading the input once; the
//! windows follow PyTorch's arithmetic exactly (`backend::Pool2d`: output sizes with
//! `ceil_mode`, `count_include_pad`, `divisor_override`, the adaptive start/end indices), so
//! shapes and values match PyTorch's. Max pooling saves only the int64 argmax (not the input)
//! for backward, as PyTorch does. Arguments PyTorch refuses are typed errors: a zero kernel,
//! stride or dilation, padding over half the kernel ([`TensorError::PaddingTooLarge`]), an input
//! too small for one window ([`TensorError::InputTooSmall`]).

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::backend::{Pool2d, PoolKind, pool_output_size};
use crate::error::{ExpectedShape, Result, TensorError};
use crate::ops::copy::materialize;
use crate::{DType, Tensor};

/// Options of [`max_pool2d`] (PyTorch's `F.max_pool2d` arguments; sizes are `[height, width]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2dOptions {
    pub kernel_size: [usize; 2],
    /// `None`: the kernel size (PyTorch's default).
    pub stride: Option<[usize; 2]>,
    /// Implicit negative-infinity padding on both sides; at most half the kernel.
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    /// Round the output size up: a last, partial window is kept if it starts inside the input
    /// or its left padding.
    pub ceil_mode: bool,
}

impl MaxPool2dOptions {
    /// A `kernel_size` window, stride = kernel, no padding, no dilation, floor mode.
    pub fn new(kernel_size: [usize; 2]) -> MaxPool2dOptions {
        MaxPool2dOptions { kernel_size, stride: None, padding: [0, 0], dilation: [1, 1], ceil_mode: false }
    }

    /// Error unless PyTorch would accept these arguments (`op` names the caller in the error).
    pub fn validate(&self, op: &'static str) -> Result<()> {
        check_window(op, self.kernel_size, self.stride(), self.padding)?;
        if self.dilation.contains(&0) {
            return Err(TensorError::invalid(
                op,
                format!("dilation must be greater than zero, got {:?}", self.dilation),
            ));
        }
        Ok(())
    }

    /// The effective stride.
    pub fn stride(&self) -> [usize; 2] {
        self.stride.unwrap_or(self.kernel_size)
    }
}

/// Options of [`avg_pool2d`] (PyTorch's `F.avg_pool2d` arguments; sizes are `[height, width]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool2dOptions {
    pub kernel_size: [usize; 2],
    /// `None`: the kernel size.
    pub stride: Option<[usize; 2]>,
    /// Implicit zero padding on both sides; at most half the kernel.
    pub padding: [usize; 2],
    pub ceil_mode: bool,
    /// Count the padding zeros in each window's divisor (PyTorch's default `true`).
    pub count_include_pad: bool,
    /// Divide every window's sum by this instead (non-zero).
    pub divisor_override: Option<usize>,
}

impl AvgPool2dOptions {
    /// A `kernel_size` window, stride = kernel, no padding, floor mode, padding counted.
    pub fn new(kernel_size: [usize; 2]) -> AvgPool2dOptions {
        AvgPool2dOptions {
            kernel_size,
            stride: None,
            padding: [0, 0],
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }

    /// Error unless PyTorch would accept these arguments (`op` names the caller in the error).
    pub fn validate(&self, op: &'static str) -> Result<()> {
        check_window(op, self.kernel_size, self.stride(), self.padding)?;
        if self.divisor_override == Some(0) {
            return Err(TensorError::invalid(op, "divisor_override must be non-zero (it divides every window's sum)"));
        }
        Ok(())
    }

    /// The effective stride.
    pub fn stride(&self) -> [usize; 2] {
        self.stride.unwrap_or(self.kernel_size)
    }
}

/// 2-D max pooling of `x` `(N, C, H, W)` or `(C, H, W)` (PyTorch's `F.max_pool2d`).
pub fn max_pool2d(x: &Tensor, opts: &MaxPool2dOptions) -> Result<Tensor> {
    Ok(max_pool2d_with_indices(x, opts)?.0)
}

/// [`max_pool2d`] that also returns the int64 position `h·W + w` of each maximum within its
/// plane (PyTorch's `return_indices=True`).
pub fn max_pool2d_with_indices(x: &Tensor, opts: &MaxPool2dOptions) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_pool2d";
    opts.validate(OP)?;
    let planes = Planes::of(OP, x)?;
    let stride = opts.stride();
    let output = output_size(OP, planes.hw, opts.kernel_size, stride, opts.padding, opts.dilation, opts.ceil_mode)?;
    let pool = Pool2d {
        input: planes.hw,
        output,
        kind: PoolKind::Max { kernel: opts.kernel_size, stride, padding: opts.padding, dilation: opts.dilation },
    };
    let out = x.empty_like_shape(&planes.out_shape(output), x.dtype())?;
    let indices = x.empty_like_shape(out.shape(), DType::I64)?;
    if out.numel() > 0 {
        let (o3, i3, x3) =
            (planes.view(&out, output), planes.view(&indices, output), planes.view(&planes.x, planes.hw));
        out.kernels().max_pool2d(&o3, &i3, &x3, &pool)?;
    }
    if !Tensor::needs_graph(&[x]) {
        return Ok((out, indices));
    }
    let f = MaxPoolBackward {
        indices: SavedTensor::new(&indices),
        input_shape: x.shape().to_vec(),
        pool,
        dtype: x.dtype(),
    };
    Ok((Tensor::from_op1(out, &[x], f), indices))
}

/// 2-D average pooling of `x` `(N, C, H, W)` or `(C, H, W)` (PyTorch's `F.avg_pool2d`).
pub fn avg_pool2d(x: &Tensor, opts: &AvgPool2dOptions) -> Result<Tensor> {
    const OP: &str = "avg_pool2d";
    opts.validate(OP)?;
    let planes = Planes::of(OP, x)?;
    let stride = opts.stride();
    let output = output_size(OP, planes.hw, opts.kernel_size, stride, opts.padding, [1, 1], opts.ceil_mode)?;
    let kind = PoolKind::Avg {
        kernel: opts.kernel_size,
        stride,
        padding: opts.padding,
        count_include_pad: opts.count_include_pad,
        divisor_override: opts.divisor_override,
    };
    avg_like(x, planes, Pool2d { input: planes_hw(x), output, kind }, "AvgPool2DBackward0")
}

/// 2-D adaptive average pooling of `x` `(N, C, H, W)` or `(C, H, W)` to `output_size`
/// (PyTorch's `F.adaptive_avg_pool2d`; `None` keeps that input dimension). Output `(oh, ow)`
/// averages rows `⌊oh·H/OH⌋ .. ⌈(oh+1)·H/OH⌉` and the matching columns.
pub fn adaptive_avg_pool2d(x: &Tensor, output_size: [Option<usize>; 2]) -> Result<Tensor> {
    const OP: &str = "adaptive_avg_pool2d";
    let planes = Planes::of(OP, x)?;
    let output = [output_size[0].unwrap_or(planes.hw[0]), output_size[1].unwrap_or(planes.hw[1])];
    avg_like(
        x,
        planes,
        Pool2d { input: planes_hw(x), output, kind: PoolKind::AdaptiveAvg },
        "AdaptiveAvgPool2DBackward0",
    )
}

// ---------------------------------------------------------------------- shared

/// Kernel > 0, stride > 0, padding ≤ kernel / 2 (PyTorch's `pool2d_shape_check`).
fn check_window(op: &'static str, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Result<()> {
    if kernel.contains(&0) {
        return Err(TensorError::invalid(op, format!("kernel size should be greater than zero, but got {kernel:?}")));
    }
    if stride.contains(&0) {
        return Err(TensorError::invalid(op, format!("stride should be greater than zero, but got {stride:?}")));
    }
    if padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2 {
        return Err(TensorError::PaddingTooLarge { op, padding: padding.to_vec(), kernel: kernel.to_vec() });
    }
    Ok(())
}

/// The output plane size, or [`TensorError::InputTooSmall`] when a dimension would be empty.
fn output_size(
    op: &'static str,
    hw: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    ceil_mode: bool,
) -> Result<[usize; 2]> {
    let o = |a: usize| pool_output_size(hw[a], kernel[a], stride[a], padding[a], dilation[a], ceil_mode);
    let (oh, ow) = (o(0), o(1));
    if oh < 1 || ow < 1 {
        return Err(TensorError::InputTooSmall {
            op,
            input: (0..2).map(|a| hw[a] + 2 * padding[a]).collect(),
            kernel: (0..2).map(|a| dilation[a] * (kernel[a] - 1) + 1).collect(),
        });
    }
    Ok([oh as usize, ow as usize])
}

fn planes_hw(x: &Tensor) -> [usize; 2] {
    let r = x.rank();
    [x.shape()[r - 2], x.shape()[r - 1]]
}

/// A pooling input seen as contiguous planes `[P, H, W]`.
#[derive(Clone)]
struct Planes {
    /// The input, contiguous.
    x: Tensor,
    /// The dims before H and W (`[N, C]` or `[C]`).
    leading: Vec<usize>,
    planes: usize,
    hw: [usize; 2],
}

impl Planes {
    fn of(op: &'static str, x: &Tensor) -> Result<Planes> {
        let expected = ExpectedShape::AnyOf(vec![
            ExpectedShape::Named(&["C", "H", "W"]),
            ExpectedShape::Named(&["N", "C", "H", "W"]),
        ]);
        if !expected.admits(x.shape()) {
            return Err(TensorError::InvalidShape { op, arg: "input", shape: x.shape().to_vec(), expected });
        }
        let r = x.rank();
        if x.shape()[r - 3..].contains(&0) {
            return Err(TensorError::invalid(
                op,
                format!(
                    "expected a 3-D or 4-D input with non-zero channels, height and width (only the batch may be 0), but got shape {:?}",
                    x.shape()
                ),
            ));
        }
        if !x.dtype().is_floating_point() {
            return Err(TensorError::UnsupportedDType { op, dtype: x.dtype() });
        }
        let leading = x.shape()[..r - 2].to_vec();
        let xc = if x.is_contiguous() { x.detach() } else { materialize(x, x.dtype())? };
        Ok(Planes { x: xc, planes: leading.iter().product(), leading, hw: planes_hw(x) })
    }

    fn out_shape(&self, plane: [usize; 2]) -> Vec<usize> {
        let mut s = self.leading.clone();
        s.extend_from_slice(&plane);
        s
    }

    /// The contiguous `t` seen as `[P, h, w]`.
    fn view(&self, t: &Tensor, plane: [usize; 2]) -> Tensor {
        t.contiguous_view_as(&[self.planes, plane[0], plane[1]])
    }
}

fn avg_like(x: &Tensor, planes: Planes, pool: Pool2d, backward: &'static str) -> Result<Tensor> {
    let out = x.empty_like_shape(&planes.out_shape(pool.output), x.dtype())?;
    if out.numel() > 0 {
        let (o3, x3) = (planes.view(&out, pool.output), planes.view(&planes.x, planes.hw));
        out.kernels().avg_pool2d(&o3, &x3, &pool)?;
    }
    if !Tensor::needs_graph(&[x]) {
        return Ok(out);
    }
    let f = AvgPoolBackward { name: backward, input_shape: x.shape().to_vec(), pool, dtype: x.dtype() };
    Ok(Tensor::from_op1(out, &[x], f))
}

/// The `[P, OH, OW]` gradient of the output, contiguous in `dtype`, and a fresh `[P, H, W]`
/// input gradient on its device.
fn grads(g: &Tensor, dtype: DType, input_shape: &[usize], pool: &Pool2d) -> Result<(Tensor, Tensor, Tensor)> {
    let gc = if g.is_contiguous() && g.dtype() == dtype { g.clone() } else { materialize(g, dtype)? };
    let [h, w] = pool.input;
    let planes = input_shape.iter().product::<usize>().checked_div(h * w).unwrap_or(0);
    let gi = gc.empty_like_shape(input_shape, dtype)?;
    let g3 = gc.contiguous_view_as(&[planes, pool.output[0], pool.output[1]]);
    let gi3 = gi.contiguous_view_as(&[planes, h, w]);
    Ok((gi, gi3, g3))
}

struct MaxPoolBackward {
    indices: SavedTensor,
    input_shape: Vec<usize>,
    pool: Pool2d,
    dtype: DType,
}

impl BackwardFn for MaxPoolBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("MaxPool2DWithIndicesBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let indices = self.indices.get("MaxPool2DWithIndicesBackward0")?;
        let (gi, gi3, g3) = grads(g, self.dtype, &self.input_shape, &self.pool)?;
        if gi.numel() > 0 {
            let i3 = indices.contiguous_view_as(g3.shape());
            gi.kernels().max_pool2d_backward(&gi3, &g3, &i3, &self.pool)?;
        }
        Ok(vec![Some(gi)])
    }
}

struct AvgPoolBackward {
    name: &'static str,
    input_shape: Vec<usize>,
    pool: Pool2d,
    dtype: DType,
}

impl BackwardFn for AvgPoolBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.name)
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let (gi, gi3, g3) = grads(g, self.dtype, &self.input_shape, &self.pool)?;
        if gi.numel() > 0 {
            gi.kernels().avg_pool2d_backward(&gi3, &g3, &self.pool)?;
        }
        Ok(vec![Some(gi)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    /// `0, 1, …, 24` as a `(1, 1, 5, 5)` image: window sums are easy to check by hand.
    fn ramp() -> Tensor {
        let v: Vec<f32> = (0..25).map(|i| i as f32).collect();
        Tensor::from_vec(v, &[1, 1, 5, 5], &Device::Cpu).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.to_vec::<f32>().unwrap()
    }

    #[test]
    fn ceil_mode_keeps_a_partial_last_window() {
        // 2x2 windows, stride 2 on 5x5: the third row/column of windows covers only index 4.
        let opts = AvgPool2dOptions { ceil_mode: true, ..AvgPool2dOptions::new([2, 2]) };
        let y = avg_pool2d(&ramp(), &opts).unwrap();
        assert_eq!(y.shape(), &[1, 1, 3, 3]);
        // Window (0, 2) holds 4 and 9; with count_include_pad its divisor is the part of the
        // window inside input + padding (2x1), not the kernel (2x2).
        let v = values(&y);
        assert_eq!(v[0], (0.0 + 1.0 + 5.0 + 6.0) / 4.0);
        assert_eq!(v[2], (4.0 + 9.0) / 2.0);
        assert_eq!(v[8], 24.0);
        let m = max_pool2d(&ramp(), &MaxPool2dOptions { ceil_mode: true, ..MaxPool2dOptions::new([2, 2]) }).unwrap();
        assert_eq!(values(&m), vec![6.0, 8.0, 9.0, 16.0, 18.0, 19.0, 21.0, 23.0, 24.0]);
    }

    #[test]
    fn count_include_pad_and_divisor_override() {
        let base = AvgPool2dOptions { stride: Some([2, 2]), padding: [1, 1], ..AvgPool2dOptions::new([3, 3]) };
        // Corner window: rows/cols -1..2, inside the input 0, 1, 5, 6 (sum 12).
        let with_pad = values(&avg_pool2d(&ramp(), &base).unwrap());
        assert_eq!(with_pad[0], 12.0 / 9.0);
        let without = values(&avg_pool2d(&ramp(), &AvgPool2dOptions { count_include_pad: false, ..base }).unwrap());
        assert_eq!(without[0], 12.0 / 4.0);
        let over = values(&avg_pool2d(&ramp(), &AvgPool2dOptions { divisor_override: Some(2), ..base }).unwrap());
        assert_eq!(over[0], 6.0);
    }

    #[test]
    fn dilated_max_pool_and_its_gradient_route_to_the_argmax() {
        let x = ramp().requires_grad_(true).unwrap();
        let opts = MaxPool2dOptions { stride: Some([1, 1]), dilation: [2, 2], ..MaxPool2dOptions::new([2, 2]) };
        let (y, idx) = max_pool2d_with_indices(&x, &opts).unwrap();
        // Taps (h, w), (h, w+2), (h+2, w), (h+2, w+2): the maximum is always the last.
        assert_eq!(y.shape(), &[1, 1, 3, 3]);
        assert_eq!(idx.to_vec::<i64>().unwrap(), vec![12, 13, 14, 17, 18, 19, 22, 23, 24]);
        y.sum().unwrap().backward().unwrap();
        let g = values(&x.grad().unwrap());
        assert_eq!(g.iter().sum::<f32>(), 9.0);
        assert_eq!(g[24], 1.0);
        assert_eq!(g[0], 0.0);
    }

    #[test]
    fn nan_wins_the_max_and_ties_take_the_first() {
        let x = Tensor::from_vec(vec![1.0f32, f32::NAN, 3.0, 3.0], &[1, 1, 2, 2], &Device::Cpu).unwrap();
        let (y, i) = max_pool2d_with_indices(&x, &MaxPool2dOptions::new([2, 2])).unwrap();
        assert!(values(&y)[0].is_nan());
        assert_eq!(i.to_vec::<i64>().unwrap(), vec![1]);
        let x = Tensor::from_vec(vec![3.0f32, 1.0, 3.0, 2.0], &[1, 2, 2], &Device::Cpu).unwrap();
        let (_, i) = max_pool2d_with_indices(&x, &MaxPool2dOptions::new([2, 2])).unwrap();
        assert_eq!(i.to_vec::<i64>().unwrap(), vec![0]);
    }

    #[test]
    fn adaptive_windows_overlap_when_sizes_do_not_divide() {
        // 5 -> 3: rows [0, 2), [1, 4), [3, 5).
        let y = adaptive_avg_pool2d(&ramp(), [Some(3), Some(1)]).unwrap();
        let row_mean = |r0: usize, r1: usize| (r0 * 5..r1 * 5).sum::<usize>() as f32 / ((r1 - r0) * 5) as f32;
        assert_eq!(values(&y), vec![row_mean(0, 2), row_mean(1, 4), row_mean(3, 5)]);
    }

    #[test]
    fn refused_arguments_are_typed() {
        let x = ramp();
        let e = max_pool2d(&x, &MaxPool2dOptions { padding: [2, 2], ..MaxPool2dOptions::new([3, 3]) }).unwrap_err();
        assert!(
            matches!(e, TensorError::PaddingTooLarge { ref padding, ref kernel, .. } if padding == &[2, 2] && kernel == &[3, 3])
        );
        let e = max_pool2d(&x, &MaxPool2dOptions::new([6, 6])).unwrap_err();
        assert!(
            matches!(e, TensorError::InputTooSmall { ref input, ref kernel, .. } if input == &[5, 5] && kernel == &[6, 6]),
            "{e}"
        );
        assert!(
            avg_pool2d(&x, &AvgPool2dOptions { divisor_override: Some(0), ..AvgPool2dOptions::new([2, 2]) }).is_err()
        );
        assert!(max_pool2d(&x, &MaxPool2dOptions { stride: Some([0, 1]), ..MaxPool2dOptions::new([2, 2]) }).is_err());
        let e = max_pool2d(&Tensor::zeros(&[5, 5], DType::F32, &Device::Cpu).unwrap(), &MaxPool2dOptions::new([2, 2]))
            .unwrap_err();
        assert!(matches!(e, TensorError::InvalidShape { .. }), "{e}");
        let e = avg_pool2d(
            &Tensor::zeros(&[1, 0, 4, 4], DType::F32, &Device::Cpu).unwrap(),
            &AvgPool2dOptions::new([2, 2]),
        );
        assert!(e.is_err());
        // An empty batch is fine.
        let y = max_pool2d(
            &Tensor::zeros(&[0, 2, 4, 4], DType::F32, &Device::Cpu).unwrap(),
            &MaxPool2dOptions::new([2, 2]),
        );
        assert_eq!(y.unwrap().shape(), &[0, 2, 2, 2]);
    }
}
