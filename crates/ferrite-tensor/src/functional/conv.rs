//! Convolutions — `F.conv1d`, `F.conv2d`, `F.conv_transpose2d` with PyTorch's arguments, weight
//! layouts and output sizes — as three products over the unfolded image, which the backend runs.
//!
//! Why this shape: every convolution pass, plain or transposed, forward or backward, is one of
//! three products over the *unfolded image* `U(img)[n, g]` (`[C/g·kh·kw, windows]` per sample and
//! group, [`KernelBackend::im2col`]):
//!
//! | product | conv2d | conv_transpose2d |
//! |---|---|---|
//! | `y[n,g] = A[g] · U(img[n])[g]` | forward | grad input |
//! | `img[n] = fold(A[g]ᵀ · y[n,g])` | grad input | forward |
//! | `Σₙ y[n,g] · U(img[n])[g]ᵀ` | grad weight | grad weight |
//!
//! (`A` is the weight viewed `[g, rows, cols]`, `fold` is [`KernelBackend::col2im`].) The three
//! products are the backend seam ([`KernelBackend::conv_unfold_product`],
//! [`KernelBackend::conv_product_fold`], [`KernelBackend::conv_weight_product`]); this file picks
//! which product a pass runs, with which operands, and does everything else (shapes, dtypes, bias,
//! autograd). The products' default (`backend/conv_products.rs`, used by `cpu`, `sim`, `meta`,
//! `gpu`) runs them as batched matmuls over `[sample, group]` of the unfolded image whose outputs
//! land directly in NCHW order (no transposes), so a backend only needs two data-movement kernels
//! next to its GEMM; `cuda:N` overrides them with implicit-GEMM kernels that never store the
//! unfolded matrix. Conv1d is conv2d on a height-1 image.
//!
//! Memory, which the planner must be able to predict: the default unfolds batches in chunks of
//! at most [`UNFOLD_BUDGET`] bytes (the unfolded matrix of one sample has `C·kh·kw·oh·ow`
//! elements, kh·kw times the input for a stride-1 conv); the chunk size depends on shapes only, so
//! `meta` makes the same allocations. Backward keeps the input and the weight, not the unfolded
//! matrix, and unfolds again (as PyTorch's native CPU convolution does): a layer's activation
//! memory is its input, as with PyTorch's oneDNN path.
//!
//! dtypes: f32 and f64 natively (f64 not on `gpu`); f16/bf16 operands are widened to f32 scratch,
//! computed in f32 and rounded once, as `matmul` does. Under autocast a convolution runs in the
//! autocast dtype (PyTorch's lower-precision list). Mixed float dtypes promote, as in `matmul`.
//! Backward does not build a graph itself (no double backward through a convolution).
//!
//! [`KernelBackend::im2col`]: crate::backend::KernelBackend::im2col
//! [`KernelBackend::col2im`]: crate::backend::KernelBackend::col2im
//! [`KernelBackend::conv_unfold_product`]: crate::backend::KernelBackend::conv_unfold_product
//! [`KernelBackend::conv_product_fold`]: crate::backend::KernelBackend::conv_product_fold
//! [`KernelBackend::conv_weight_product`]: crate::backend::KernelBackend::conv_weight_product

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::backend::{BinaryOp, ConvGeometry};
use crate::error::{ExpectedShape, Result, TensorError};
use crate::layout::Layout;
use crate::ops::copy::materialize;
use crate::ops::reduce::sum_raw;
use crate::ops::{check_same_device, promote_types};
use crate::{DType, Tensor};

// ---------------------------------------------------------------------------------- public API

/// The padding of a convolution (PyTorch's `padding` argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding<const N: usize> {
    /// `padding="valid"`: none.
    Valid,
    /// `padding="same"`: the output has the input's size (stride 1 only). Each dimension gets
    /// `dilation·(kernel − 1)` zeros in total, half (rounded down) before and the rest after, so
    /// an odd total puts the extra zero at the end — PyTorch's rule.
    Same,
    /// This many zeros before and after each spatial dimension.
    Explicit([usize; N]),
}

impl<const N: usize> Default for Padding<N> {
    fn default() -> Self {
        Padding::Explicit([0; N])
    }
}

impl<const N: usize> From<usize> for Padding<N> {
    fn from(p: usize) -> Self {
        Padding::Explicit([p; N])
    }
}

impl<const N: usize> From<[usize; N]> for Padding<N> {
    fn from(p: [usize; N]) -> Self {
        Padding::Explicit(p)
    }
}

/// One size for every spatial dimension or one per dimension (PyTorch's `int or tuple`).
pub trait SpatialSize<const N: usize> {
    fn per_dim(self) -> [usize; N];
}

impl<const N: usize> SpatialSize<N> for usize {
    fn per_dim(self) -> [usize; N] {
        [self; N]
    }
}

impl<const N: usize> SpatialSize<N> for [usize; N] {
    fn per_dim(self) -> [usize; N] {
        self
    }
}

/// Arguments of [`conv1d`] / [`conv2d`] after the tensors, with PyTorch's defaults (stride 1,
/// padding 0, dilation 1, groups 1): `Conv2dOptions::new().stride(2).padding(1)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvOptions<const N: usize> {
    pub stride: [usize; N],
    pub padding: Padding<N>,
    pub dilation: [usize; N],
    pub groups: usize,
}

/// Options of [`conv1d`].
pub type Conv1dOptions = ConvOptions<1>;
/// Options of [`conv2d`].
pub type Conv2dOptions = ConvOptions<2>;

impl<const N: usize> Default for ConvOptions<N> {
    fn default() -> Self {
        ConvOptions { stride: [1; N], padding: Padding::default(), dilation: [1; N], groups: 1 }
    }
}

impl<const N: usize> ConvOptions<N> {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn stride(mut self, s: impl SpatialSize<N>) -> Self {
        self.stride = s.per_dim();
        self
    }
    /// A size, a size per dimension, or [`Padding::Same`] / [`Padding::Valid`].
    pub fn padding(mut self, p: impl Into<Padding<N>>) -> Self {
        self.padding = p.into();
        self
    }
    pub fn dilation(mut self, d: impl SpatialSize<N>) -> Self {
        self.dilation = d.per_dim();
        self
    }
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
}

/// Arguments of [`conv_transpose2d`] after the tensors, with PyTorch's defaults (stride 1,
/// padding 0, output_padding 0, dilation 1, groups 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTransposeOptions<const N: usize> {
    pub stride: [usize; N],
    /// Zeros PyTorch's `padding` removes from each side of the full output
    /// (`dilation·(kernel − 1) − padding` of implicit padding in the equivalent convolution).
    pub padding: [usize; N],
    /// Extra rows/columns added at the end of the output (to pick one of the input sizes a
    /// strided convolution maps to the same output size); each must be smaller than the stride
    /// or the dilation of its dimension.
    pub output_padding: [usize; N],
    pub dilation: [usize; N],
    pub groups: usize,
}

/// Options of [`conv_transpose2d`].
pub type ConvTranspose2dOptions = ConvTransposeOptions<2>;

impl<const N: usize> Default for ConvTransposeOptions<N> {
    fn default() -> Self {
        ConvTransposeOptions { stride: [1; N], padding: [0; N], output_padding: [0; N], dilation: [1; N], groups: 1 }
    }
}

impl<const N: usize> ConvTransposeOptions<N> {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn stride(mut self, s: impl SpatialSize<N>) -> Self {
        self.stride = s.per_dim();
        self
    }
    pub fn padding(mut self, p: impl SpatialSize<N>) -> Self {
        self.padding = p.per_dim();
        self
    }
    pub fn output_padding(mut self, p: impl SpatialSize<N>) -> Self {
        self.output_padding = p.per_dim();
        self
    }
    pub fn dilation(mut self, d: impl SpatialSize<N>) -> Self {
        self.dilation = d.per_dim();
        self
    }
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
}

/// `F.conv1d`: `input [N, C_in, L]` (or unbatched `[C_in, L]`), `weight [C_out, C_in/groups, k]`,
/// optional `bias [C_out]` → `[N, C_out, L_out]`.
pub fn conv1d(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>, options: &Conv1dOptions) -> Result<Tensor> {
    let r = resolve_conv("conv1d", input, weight, bias, options)?;
    let (x, w) = (input.unsqueeze(-2)?, weight.unsqueeze(-2)?);
    run(Kind::Conv, &x, &w, bias, &r)?.squeeze(-2)
}

/// `F.conv2d`: `input [N, C_in, H, W]` (or unbatched `[C_in, H, W]`),
/// `weight [C_out, C_in/groups, kh, kw]`, optional `bias [C_out]` → `[N, C_out, H_out, W_out]`
/// with `H_out = ⌊(H + 2·padding − dilation·(kh − 1) − 1) / stride⌋ + 1`.
pub fn conv2d(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>, options: &Conv2dOptions) -> Result<Tensor> {
    let r = resolve_conv("conv2d", input, weight, bias, options)?;
    run(Kind::Conv, input, weight, bias, &r)
}

/// `F.conv_transpose2d`, the gradient of `conv2d` with respect to its input: `input
/// [N, C_in, H, W]` (or unbatched), `weight [C_in, C_out/groups, kh, kw]`, optional `bias [C_out]`
/// → `[N, C_out, H_out, W_out]` with
/// `H_out = (H − 1)·stride − 2·padding + dilation·(kh − 1) + output_padding + 1`.
pub fn conv_transpose2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: &ConvTranspose2dOptions,
) -> Result<Tensor> {
    let r = resolve_transposed("conv_transpose2d", input, weight, bias, options)?;
    run(Kind::Transposed, input, weight, bias, &r)
}

// ---------------------------------------------------------------------------------- validation

/// A convolution call in 2-D terms, after every check.
#[derive(Clone, Copy, Debug)]
struct Resolved {
    batched: bool,
    groups: usize,
    /// How the windows sweep the unfolded image: the input of a convolution, the output of a
    /// transposed one.
    geom: ConvGeometry,
    out_channels: usize,
    /// Spatial size of the output.
    out: [usize; 2],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Conv,
    Transposed,
}

/// Spatial sizes in 2-D terms: a 1-D size becomes `[fill, size]`.
fn lift<const N: usize>(a: [usize; N], fill: usize) -> [usize; 2] {
    if N == 2 { [a[0], a[N - 1]] } else { [fill, a[0]] }
}

const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

fn dim_names(n: usize) -> &'static [&'static str] {
    if n == 1 { &["batch", "channels", "length"] } else { &["batch", "channels", "height", "width"] }
}

fn weight_names(n: usize, transposed: bool) -> &'static [&'static str] {
    match (n, transposed) {
        (1, false) => &["out_channels", "in_channels/groups", "kernel_size"],
        (1, true) => &["in_channels", "out_channels/groups", "kernel_size"],
        (_, false) => &["out_channels", "in_channels/groups", "kernel_height", "kernel_width"],
        (_, true) => &["in_channels", "out_channels/groups", "kernel_height", "kernel_width"],
    }
}

/// Checks shared by both kinds; returns (batched, channels of the input, spatial sizes, kernel).
fn check_common<const N: usize>(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    transposed: bool,
    stride: [usize; N],
    dilation: [usize; N],
    groups: usize,
) -> Result<(bool, usize, [usize; N], [usize; N])> {
    check_same_device(op, x, w)?;
    if let Some(b) = bias {
        check_same_device(op, x, b)?;
    }
    for (arg, t) in [("input", Some(x)), ("weight", Some(w)), ("bias", bias)] {
        if let Some(t) = t
            && !t.dtype().is_floating_point()
        {
            return Err(TensorError::InvalidDType { op, arg, dtype: t.dtype(), expected: FLOATS });
        }
    }
    let batched = match x.rank() {
        r if r == N + 2 => true,
        r if r == N + 1 => false,
        _ => {
            return Err(TensorError::InvalidShape {
                op,
                arg: "input",
                shape: x.shape().to_vec(),
                expected: ExpectedShape::Named(dim_names(N)),
            });
        }
    };
    if w.rank() != N + 2 {
        return Err(TensorError::InvalidShape {
            op,
            arg: "weight",
            shape: w.shape().to_vec(),
            expected: ExpectedShape::Named(weight_names(N, transposed)),
        });
    }
    if groups == 0 {
        return Err(TensorError::invalid(op, "groups must be a positive integer, got 0"));
    }
    if stride.contains(&0) {
        return Err(TensorError::invalid(op, format!("stride must be positive in every dimension, got {stride:?}")));
    }
    if dilation.contains(&0) {
        return Err(TensorError::invalid(
            op,
            format!("dilation must be positive in every dimension, got {dilation:?}"),
        ));
    }
    let kernel: [usize; N] = std::array::from_fn(|d| w.shape()[2 + d]);
    if kernel.contains(&0) {
        return Err(TensorError::invalid(
            op,
            format!("the kernel must have at least one tap in every dimension, got weight of shape {:?}", w.shape()),
        ));
    }
    if !w.shape()[0].is_multiple_of(groups) {
        return Err(TensorError::InvalidShape {
            op,
            arg: "weight",
            shape: w.shape().to_vec(),
            expected: ExpectedShape::MultipleAt { dim: 0, factor: groups },
        });
    }
    let cdim = batched as usize;
    let channels = x.shape()[cdim];
    let want = if transposed { w.shape()[0] } else { w.shape()[1] * groups };
    if channels != want {
        return Err(TensorError::InvalidShape {
            op,
            arg: "input",
            shape: x.shape().to_vec(),
            expected: ExpectedShape::SizeAt { dim: cdim, size: want },
        });
    }
    let spatial: [usize; N] = std::array::from_fn(|d| x.shape()[cdim + 1 + d]);
    Ok((batched, channels, spatial, kernel))
}

fn check_bias(op: &'static str, bias: Option<&Tensor>, out_channels: usize) -> Result<()> {
    match bias {
        Some(b) if b.shape() != [out_channels] => Err(TensorError::InvalidShape {
            op,
            arg: "bias",
            shape: b.shape().to_vec(),
            expected: ExpectedShape::Exact(vec![out_channels]),
        }),
        _ => Ok(()),
    }
}

fn resolve_conv<const N: usize>(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    o: &ConvOptions<N>,
) -> Result<Resolved> {
    let (batched, channels, spatial, kernel) = check_common(op, x, w, bias, false, o.stride, o.dilation, o.groups)?;
    let out_channels = w.shape()[0];
    check_bias(op, bias, out_channels)?;
    // Zeros before and after each dimension.
    let (before, after): ([usize; N], [usize; N]) = match o.padding {
        Padding::Valid => ([0; N], [0; N]),
        Padding::Explicit(p) => (p, p),
        Padding::Same => {
            if o.stride.iter().any(|&s| s != 1) {
                return Err(TensorError::invalid(
                    op,
                    format!(
                        "padding=\"same\" is not supported for strided convolutions (stride {:?}); give the padding explicitly",
                        o.stride
                    ),
                ));
            }
            let total: [usize; N] = std::array::from_fn(|d| o.dilation[d] * (kernel[d] - 1));
            (std::array::from_fn(|d| total[d] / 2), std::array::from_fn(|d| total[d] - total[d] / 2))
        }
    };
    let padded: [usize; N] = std::array::from_fn(|d| spatial[d] + before[d] + after[d]);
    let reach: [usize; N] = std::array::from_fn(|d| o.dilation[d] * (kernel[d] - 1) + 1);
    if (0..N).any(|d| padded[d] < reach[d]) {
        return Err(TensorError::InputTooSmall { op, input: padded.to_vec(), kernel: reach.to_vec() });
    }
    let out: [usize; N] = std::array::from_fn(|d| (padded[d] - reach[d]) / o.stride[d] + 1);
    let geom = ConvGeometry {
        channels,
        input: lift(spatial, 1),
        kernel: lift(kernel, 1),
        stride: lift(o.stride, 1),
        padding: lift(before, 0),
        dilation: lift(o.dilation, 1),
        output: lift(out, 1),
    };
    Ok(Resolved { batched, groups: o.groups, geom, out_channels, out: geom.output })
}

fn resolve_transposed<const N: usize>(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    o: &ConvTransposeOptions<N>,
) -> Result<Resolved> {
    let (batched, _, spatial, kernel) = check_common(op, x, w, bias, true, o.stride, o.dilation, o.groups)?;
    let out_channels = w.shape()[1] * o.groups;
    check_bias(op, bias, out_channels)?;
    if (0..N).any(|d| o.output_padding[d] >= o.stride[d] && o.output_padding[d] >= o.dilation[d]) {
        return Err(TensorError::invalid(
            op,
            format!(
                "output_padding {:?} must be smaller than either the stride {:?} or the dilation {:?} in every dimension",
                o.output_padding, o.stride, o.dilation
            ),
        ));
    }
    let out_i: [i128; N] = std::array::from_fn(|d| {
        (spatial[d] as i128 - 1) * o.stride[d] as i128 - 2 * o.padding[d] as i128
            + (o.dilation[d] * (kernel[d] - 1)) as i128
            + o.output_padding[d] as i128
            + 1
    });
    if out_i.iter().any(|&s| s <= 0) {
        return Err(TensorError::invalid(
            op,
            format!(
                "input of spatial size {spatial:?} gives an output of size {out_i:?}, which is too small; use less padding or a larger input"
            ),
        ));
    }
    let out: [usize; N] = std::array::from_fn(|d| out_i[d] as usize);
    // The unfolded image is the output: the convolution this op is the transpose of maps the
    // output back onto the input's spatial grid.
    let geom = ConvGeometry {
        channels: out_channels,
        input: lift(out, 1),
        kernel: lift(kernel, 1),
        stride: lift(o.stride, 1),
        padding: lift(o.padding, 0),
        dilation: lift(o.dilation, 1),
        output: lift(spatial, 1),
    };
    Ok(Resolved { batched, groups: o.groups, geom, out_channels, out: geom.input })
}

// ---------------------------------------------------------------------------------- the op

/// Cast, compute, and record the graph. `x` and `w` are in 2-D terms (a 1-D convolution has
/// been given a unit height), `x` possibly unbatched.
fn run(kind: Kind, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, r: &Resolved) -> Result<Tensor> {
    let mut promoted = promote_types(x.dtype(), w.dtype());
    if let Some(b) = bias {
        promoted = promote_types(promoted, b.dtype());
    }
    let low = crate::autocast::lower(promoted);
    let x = x.to_dtype(low)?;
    let w = w.to_dtype(low)?;
    let b = bias.map(|b| b.to_dtype(low)).transpose()?;
    let x4 = if r.batched { x.clone() } else { x.unsqueeze(0)? };
    let compute = if matches!(low, DType::F16 | DType::BF16) { DType::F32 } else { low };
    let n = x4.shape()[0];
    // What backward keeps: the operands in their own dtype, contiguous.
    let xs = contiguous(&x4, low)?;
    let ws = contiguous(&w, low)?;
    let (xc, wc) = (contiguous(&xs, compute)?, contiguous(&ws, compute)?);
    let a3 = weight3(&wc, r.groups);
    let out_shape = [n, r.out_channels, r.out[0], r.out[1]];
    let y = match kind {
        Kind::Conv => unfold_product(&xc, &a3, &r.geom, r.groups)?,
        Kind::Transposed => product_fold(&a3, &xc, &r.geom, r.groups, &out_shape)?,
    };
    drop((xc, wc, a3));
    if let Some(b) = &b {
        let bc = contiguous(b, compute)?;
        let mut l = Layout::contiguous(&[1, r.out_channels, 1, 1]);
        l.offset = bc.storage_offset();
        if y.numel() > 0 {
            y.kernels().binary_inplace(BinaryOp::Add, &y, &bc.view_with_layout(l))?;
        }
    }
    let y = if compute != low { materialize(&y, low)? } else { y };
    let mut inputs: Vec<&Tensor> = vec![&x4, &w];
    if let Some(b) = &b {
        inputs.push(b);
    }
    let y = if Tensor::needs_graph(&inputs) {
        let f = ConvBackward {
            kind,
            x: SavedTensor::new(&xs),
            w: SavedTensor::new(&ws),
            resolved: *r,
            compute,
            has_bias: b.is_some(),
            need: [x4.requires_grad(), w.requires_grad(), b.as_ref().is_some_and(|b| b.requires_grad())],
        };
        Tensor::from_op1(y, &inputs, f)
    } else {
        y
    };
    if r.batched { Ok(y) } else { y.squeeze(0) }
}

struct ConvBackward {
    kind: Kind,
    x: SavedTensor,
    w: SavedTensor,
    resolved: Resolved,
    compute: DType,
    has_bias: bool,
    need: [bool; 3],
}

impl BackwardFn for ConvBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("ConvolutionBackward0")
    }

    fn backward(&mut self, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n_in = 2 + self.has_bias as usize;
        let Some(g) = &grads[0] else { return Ok(vec![None; n_in]) };
        let name = "ConvolutionBackward0";
        let (x, w) = (self.x.get(name)?, self.w.get(name)?);
        let r = &self.resolved;
        let g = contiguous(g, self.compute)?;
        let mut out: Vec<Option<Tensor>> = Vec::with_capacity(n_in);
        let xc = if self.need[1] { Some(contiguous(x, self.compute)?) } else { None };
        let wc = if self.need[0] { Some(contiguous(w, self.compute)?) } else { None };
        // Gradient of the input.
        out.push(match &wc {
            Some(wc) => {
                let a3 = weight3(wc, r.groups);
                let gx = match (self.kind, input_grad_geometry(&r.geom)) {
                    (Kind::Conv, Some(gd)) => {
                        let wf = flipped_weight(wc, r.groups)?;
                        let gd = ConvGeometry { channels: g.shape()[1], ..gd };
                        unfold_product(&g, &wf, &gd, r.groups)?
                    }
                    (Kind::Conv, None) => product_fold(&a3, &g, &r.geom, r.groups, x.shape())?,
                    (Kind::Transposed, _) => unfold_product(&g, &a3, &r.geom, r.groups)?,
                };
                Some(to_dtype(gx, x.dtype())?)
            }
            None => None,
        });
        // Gradient of the weight: `y` is the operand that is not unfolded.
        out.push(match &xc {
            Some(xc) => {
                let gw = match self.kind {
                    Kind::Conv => weight_product(&g, xc, &r.geom, r.groups)?,
                    Kind::Transposed => weight_product(xc, &g, &r.geom, r.groups)?,
                };
                Some(to_dtype(gw.contiguous_view_as(w.shape()), w.dtype())?)
            }
            None => None,
        });
        if self.has_bias {
            out.push(if self.need[2] {
                let (gb, _) = sum_raw(&g, &[0, 2, 3], false, 1.0, "conv_bias_backward")?;
                Some(to_dtype(gb, w.dtype())?)
            } else {
                None
            });
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------- the products

pub use crate::backend::UNFOLD_BUDGET;

/// `t` contiguous in `dtype` (itself when it already is).
fn contiguous(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype && t.is_contiguous() { Ok(t.clone()) } else { materialize(t, dtype) }
}

fn to_dtype(t: Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype { Ok(t) } else { materialize(&t, dtype) }
}

/// The contiguous weight viewed `[groups, w0/groups, rest]`: the `A` of every product.
fn weight3(w: &Tensor, groups: usize) -> Tensor {
    let w0 = w.shape()[0];
    let rest = w.numel().checked_div(w0).unwrap_or(0);
    w.contiguous_view_as(&[groups, w0 / groups, rest])
}

/// The geometry that computes the input gradient of a stride-1 convolution as another
/// stride-1 convolution, of `dY` with the flipped, transposed weight ([`flipped_weight`]):
/// `dX[c, y, x] = Σ W[o, c, i, j] · dY[o, y + p − i·d, x + p − j·d]`, which is a convolution
/// with padding `d·(k − 1) − p` and the taps reversed. `None` when a stride is not 1 or a
/// padding exceeds `d·(k − 1)` (then backward folds instead). Why: the fold path is a depth-`C_out`
/// product that writes the whole unfolded matrix, then a scatter-add over it; this path is the
/// forward's deep product over an unfolded `dY`, the same work without the write-heavy product
/// or the fold.
fn input_grad_geometry(g: &ConvGeometry) -> Option<ConvGeometry> {
    if g.stride != [1, 1] {
        return None;
    }
    let pad: [Option<usize>; 2] =
        std::array::from_fn(|d| (g.dilation[d] * (g.kernel[d] - 1)).checked_sub(g.padding[d]));
    let [Some(ph), Some(pw)] = pad else { return None };
    Some(ConvGeometry {
        channels: 0, // set by the caller's dY: the output channels
        input: g.output,
        kernel: g.kernel,
        stride: [1, 1],
        padding: [ph, pw],
        dilation: g.dilation,
        output: g.input,
    })
}

/// The weight `[C_out, C_in/groups, kh, kw]` as the `a3` of [`input_grad_geometry`]'s
/// convolution: `[groups, C_in/groups, (C_out/groups)·kh·kw]` with
/// `a3[g, c, (o, i, j)] = W[g·C_out/groups + o, c, kh − 1 − i, kw − 1 − j]`.
fn flipped_weight(w: &Tensor, groups: usize) -> Result<Tensor> {
    let [o, c, kh, kw] = [w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]];
    let taps = kh * kw;
    let reversed = Tensor::arange(taps as f64 - 1.0, -1.0, -1.0, DType::I64, w.device())?;
    let wt = w
        .contiguous_view_as(&[groups, o / groups, c, taps])
        .permute(&[0, 2, 1, 3])?
        .index_select(3, &reversed)?
        .contiguous()?;
    Ok(wt.contiguous_view_as(&[groups, c, (o / groups) * taps]))
}

/// The forward product through the backend of `img`'s device ([`KernelBackend::conv_unfold_product`]).
///
/// [`KernelBackend::conv_unfold_product`]: crate::backend::KernelBackend::conv_unfold_product
fn unfold_product(img: &Tensor, a3: &Tensor, geom: &ConvGeometry, groups: usize) -> Result<Tensor> {
    img.kernels().conv_unfold_product(img, a3, geom, groups)
}

/// The fold product ([`KernelBackend::conv_product_fold`]).
///
/// [`KernelBackend::conv_product_fold`]: crate::backend::KernelBackend::conv_product_fold
fn product_fold(a3: &Tensor, y: &Tensor, geom: &ConvGeometry, groups: usize, img_shape: &[usize]) -> Result<Tensor> {
    y.kernels().conv_product_fold(a3, y, geom, groups, img_shape)
}

/// The weight product ([`KernelBackend::conv_weight_product`]).
///
/// [`KernelBackend::conv_weight_product`]: crate::backend::KernelBackend::conv_weight_product
fn weight_product(y: &Tensor, img: &Tensor, geom: &ConvGeometry, groups: usize) -> Result<Tensor> {
    img.kernels().conv_weight_product(y, img, geom, groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Generator};

    /// The input gradient as a convolution of `dY` with the flipped weight equals the fold of
    /// `Wᵀ·dY` (the path it replaces) on every stride-1 geometry it accepts: odd and even
    /// kernels, dilation, groups, the largest padding it takes and PyTorch's `"same"` padding
    /// with its odd zero after.
    #[test]
    fn input_gradient_as_a_flipped_convolution_equals_the_fold() {
        let mut rng = Generator::new(3);
        // (channels in, out, groups, input, kernel, padding before, dilation, output)
        for (cin, cout, groups, input, kernel, padding, dilation, output) in [
            (4, 6, 1, [7, 9], [3, 3], [1, 1], [1, 1], [7, 9]),
            (4, 6, 2, [6, 5], [2, 3], [0, 2], [1, 2], [5, 5]),
            (3, 3, 3, [8, 6], [3, 2], [4, 1], [2, 1], [8, 6]),
            (2, 5, 1, [5, 5], [2, 2], [0, 0], [1, 1], [5, 5]), // "same": the odd zero after
            (2, 2, 1, [4, 4], [1, 1], [0, 0], [1, 1], [4, 4]),
        ] {
            let geom = ConvGeometry { channels: cin, input, kernel, stride: [1, 1], padding, dilation, output };
            let gd = input_grad_geometry(&geom).expect("a stride-1 geometry");
            let gd = ConvGeometry { channels: cout, ..gd };
            let d = Device::Cpu;
            let w = Tensor::randn_with(&[cout, cin / groups, kernel[0], kernel[1]], DType::F32, &d, &mut rng).unwrap();
            let dy = Tensor::randn_with(&[2, cout, output[0], output[1]], DType::F32, &d, &mut rng).unwrap();
            let folded = product_fold(&weight3(&w, groups), &dy, &geom, groups, &[2, cin, input[0], input[1]]).unwrap();
            let conv = unfold_product(&dy, &flipped_weight(&w, groups).unwrap(), &gd, groups).unwrap();
            assert_eq!(conv.shape(), folded.shape(), "{geom:?}");
            for (a, b) in conv.to_vec_f64().unwrap().iter().zip(folded.to_vec_f64().unwrap()) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{geom:?}: {a} vs {b}");
            }
        }
        let strided = ConvGeometry {
            channels: 1,
            input: [5, 5],
            kernel: [3, 3],
            stride: [2, 1],
            padding: [1, 1],
            dilation: [1, 1],
            output: [3, 5],
        };
        assert!(input_grad_geometry(&strided).is_none());
        let wide = ConvGeometry { stride: [1, 1], padding: [3, 0], output: [7, 3], ..strided };
        assert!(input_grad_geometry(&wide).is_none(), "padding beyond d·(k − 1) folds");
    }
}
