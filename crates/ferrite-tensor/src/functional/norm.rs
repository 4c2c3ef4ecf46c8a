//! Normalisation layers' functional forms: layer norm, batch norm, group norm and RMS norm.
//!
//! Each runs as one kernel of the device's backend (`KernelBackend::layer_norm`, `batch_norm`,
//! `group_norm`, `rms_norm`) that reads the input once for its statistics and once to write the
//! output, and also writes the statistics (mean, inverse standard deviation), which the backward
//! saves instead of recomputing them; its gradient is one kernel too. A composition of
//! elementwise ops would keep `[N, C, …]` temporaries alive and read the input a dozen times.
//!
//! Batch norm's running statistics are updated by the same forward kernel, in place, with the
//! buffers' version counters bumped (a tensor saved for backward that aliases them is caught), as
//! PyTorch does under `no_grad`; they never enter the graph. Every norm computes in f32 under
//! autocast; statistics are f32 (f64 for f64 input).

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::backend::{
    BatchNormArgs, BatchNormBackwardParams, BatchNormStats, GroupNormArgs, GroupNormParams, LayerNormArgs,
    LayerNormBackwardArgs, LayerNormParams, NormBackwardArgs, RmsNormArgs, RmsNormBackwardArgs, RunningStats,
};
use crate::error::{ExpectedShape, Result, TensorError};
use crate::layout::Shape;
use crate::ops::check_same_device;
use crate::ops::copy::{check_inplace, materialize};
use crate::{DType, Tensor};

struct LayerNormBackward {
    x: SavedTensor,
    mean: SavedTensor,
    rstd: SavedTensor,
    weight: Option<SavedTensor>,
    has_bias: bool,
    cols: usize,
    need: [bool; 3],
}

impl BackwardFn for LayerNormBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("NativeLayerNormBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n_in = 1 + self.weight.is_some() as usize + self.has_bias as usize;
        let Some(g) = &g[0] else { return Ok(vec![None; n_in]) };
        let x = self.x.get("NativeLayerNormBackward0")?;
        let mean = self.mean.get("NativeLayerNormBackward0")?;
        let rstd = self.rstd.get("NativeLayerNormBackward0")?;
        let w = match &self.weight {
            Some(w) => Some(w.get("NativeLayerNormBackward0")?.clone()),
            None => None,
        };
        let cols = self.cols;
        let rows = x.numel().checked_div(cols).unwrap_or(0);
        if rows > 0 && cols > 0 {
            // One fused kernel where the backend has it (the CPU's; meta allocates the same).
            let (gc, xc) = (contiguous_as(g, x.dtype())?, contiguous_as(x, x.dtype())?);
            let wf = match &w {
                Some(w) => Some(contiguous_as(w, x.dtype())?.contiguous_view_as(&[cols])),
                None => None,
            };
            let need = [self.need[0], w.is_some() && self.need[1], self.has_bias && self.need[2]];
            let args = LayerNormBackwardArgs {
                grad_output: &gc.contiguous_view_as(&[rows, cols]),
                x: &xc.contiguous_view_as(&[rows, cols]),
                mean,
                rstd,
                weight: wf.as_ref(),
                need,
            };
            if let Some(grads) = x.kernels().layer_norm_backward(&args)? {
                let mut out = vec![grads.input.map(|t| t.contiguous_view_as(x.shape()))];
                if let Some(w) = &w {
                    out.push(grads.weight.map(|t| t.contiguous_view_as(w.shape())));
                }
                if self.has_bias {
                    let shape: Shape = match &w {
                        Some(w) => w.shape_vec(),
                        None => Shape::from_slice(&[cols]),
                    };
                    out.push(grads.bias.map(|t| t.contiguous_view_as(&shape)));
                }
                return Ok(out);
            }
        }
        let g = materialize(g, x.dtype())?;
        let xc = if x.is_contiguous() { x.clone() } else { materialize(x, x.dtype())? };
        // xhat = (x - mean) * rstd, rows x cols
        let x2 = xc.reshape_usize(&[rows, cols])?;
        let xhat = x2.sub(&mean.reshape_usize(&[rows, 1])?)?.mul(&rstd.reshape_usize(&[rows, 1])?)?;
        let g2 = g.reshape_usize(&[rows, cols])?;
        let mut out: Vec<Option<Tensor>> = Vec::with_capacity(n_in);
        if self.need[0] {
            let dyw = match &w {
                Some(w) => g2.mul(&w.reshape_usize(&[cols])?)?,
                None => g2.clone(),
            };
            // dx = rstd * (dyw - mean(dyw) - xhat * mean(dyw * xhat))
            let m1 = dyw.mean_dims(&[1], true)?;
            let m2 = dyw.mul(&xhat)?.mean_dims(&[1], true)?;
            let dx = dyw.sub(&m1)?.sub(&xhat.mul(&m2)?)?.mul(&rstd.reshape_usize(&[rows, 1])?)?;
            out.push(Some(dx.reshape_usize(x.shape())?));
        } else {
            out.push(None);
        }
        if let Some(w) = &w {
            out.push(if self.need[1] {
                Some(g2.mul(&xhat)?.sum_dims(&[0], false)?.reshape_usize(w.shape())?)
            } else {
                None
            });
        }
        if self.has_bias {
            let shape: Shape = match &w {
                Some(w) => w.shape_vec(),
                None => Shape::from_slice(&[cols]),
            };
            out.push(if self.need[2] { Some(g2.sum_dims(&[0], false)?.reshape_usize(&shape)?) } else { None });
        }
        Ok(out)
    }
}

/// Layer normalisation over the trailing `normalized_shape` dims (PyTorch's `F.layer_norm`),
/// computed in f32 under autocast.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    if normalized_shape.is_empty() {
        return Err(TensorError::InvalidShape {
            op: "layer_norm",
            arg: "normalized_shape",
            shape: Vec::new(),
            expected: ExpectedShape::MinRank(1),
        });
    }
    let trailing = ExpectedShape::Trailing(normalized_shape.to_vec());
    if !trailing.admits(x.shape()) {
        return Err(TensorError::InvalidShape {
            op: "layer_norm",
            arg: "input",
            shape: x.shape().to_vec(),
            expected: trailing,
        });
    }
    for (arg, p) in [("weight", weight), ("bias", bias)] {
        if let Some(p) = p
            && p.shape() != normalized_shape
        {
            return Err(TensorError::InvalidShape {
                op: "layer_norm",
                arg,
                shape: p.shape().to_vec(),
                expected: ExpectedShape::Exact(normalized_shape.to_vec()),
            });
        }
    }
    let dtype = crate::autocast::upper(x.dtype());
    let x = x.to_dtype(dtype)?;
    if !dtype.is_floating_point() {
        return Err(TensorError::UnsupportedDType { op: "layer_norm", dtype });
    }
    let cols: usize = normalized_shape.iter().product();
    let rows = x.numel().checked_div(cols).unwrap_or(0);
    let xc = if x.is_contiguous() { x.clone() } else { materialize(&x, dtype)? };
    let y = xc.empty_like_shape(x.shape(), dtype)?;
    let mean = xc.empty_like_shape(&[rows], DType::F32)?;
    let rstd = xc.empty_like_shape(&[rows], DType::F32)?;
    let wt = weight.map(|w| w.to_dtype(dtype)).transpose()?;
    let bt = bias.map(|b| b.to_dtype(dtype)).transpose()?;
    if rows > 0 {
        // The kernels see `[rows, cols]` views of the contiguous input and output.
        let rows_view = |t: &Tensor| t.contiguous_view_as(&[rows, cols]);
        let flat = |t: &Tensor| -> Result<Tensor> {
            let c = if t.is_contiguous() { t.clone() } else { materialize(t, t.dtype())? };
            Ok(c.contiguous_view_as(&[cols]))
        };
        let w2 = wt.as_ref().map(flat).transpose()?;
        let b2 = bt.as_ref().map(flat).transpose()?;
        let (y2, x2) = (rows_view(&y), rows_view(&xc));
        let args = LayerNormArgs {
            y: &y2,
            mean: &mean,
            rstd: &rstd,
            x: &x2,
            weight: w2.as_ref(),
            bias: b2.as_ref(),
            params: LayerNormParams { eps },
        };
        y.kernels().layer_norm(&args)?;
    }
    let mut inputs: Vec<&Tensor> = vec![&x];
    if let Some(w) = &wt {
        inputs.push(w);
    }
    if let Some(b) = &bt {
        inputs.push(b);
    }
    if !Tensor::needs_graph(&inputs) {
        return Ok(y);
    }
    let f = LayerNormBackward {
        x: SavedTensor::new(&xc),
        mean: SavedTensor::new(&mean),
        rstd: SavedTensor::new(&rstd),
        weight: wt.as_ref().map(SavedTensor::new),
        has_bias: bt.is_some(),
        cols,
        need: [
            x.requires_grad(),
            wt.as_ref().is_some_and(|w| w.requires_grad()),
            bt.as_ref().is_some_and(|b| b.requires_grad()),
        ],
    };
    Ok(Tensor::from_op1(y, &inputs, f))
}

// ---------------------------------------------------------------------- shared checks

/// The dtype of saved statistics for an input of `dtype` (PyTorch's accumulation type).
fn stats_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 { DType::F64 } else { DType::F32 }
}

/// `t` as a contiguous tensor of `dtype` (a handle clone when it already is one; no graph).
fn contiguous_as(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype && t.is_contiguous() { Ok(t.clone()) } else { materialize(t, dtype) }
}

/// The compute dtype of a norm's input (f32 under autocast), or an error for non-float input.
fn norm_dtype(op: &'static str, x: &Tensor) -> Result<DType> {
    let dtype = crate::autocast::upper(x.dtype());
    if dtype.is_floating_point() { Ok(dtype) } else { Err(TensorError::UnsupportedDType { op, dtype: x.dtype() }) }
}

/// Error unless the optional per-channel tensor `p` has shape `shape` and lives on `x`'s device.
fn check_param(op: &'static str, arg: &'static str, p: Option<&Tensor>, shape: &[usize], x: &Tensor) -> Result<()> {
    let Some(p) = p else { return Ok(()) };
    if p.shape() != shape {
        return Err(TensorError::InvalidShape {
            op,
            arg,
            shape: p.shape().to_vec(),
            expected: ExpectedShape::Exact(shape.to_vec()),
        });
    }
    if !p.dtype().is_floating_point() {
        return Err(TensorError::InvalidDType {
            op,
            arg,
            dtype: p.dtype(),
            expected: &[DType::F32, DType::F64, DType::F16, DType::BF16],
        });
    }
    check_same_device(op, x, p)
}

/// The input viewed as a contiguous `[N, C, S]` of `dtype` (S = product of the dims after C).
fn as_ncs(x: &Tensor, dtype: DType) -> Result<(Tensor, [usize; 3])> {
    let xc = contiguous_as(x, dtype)?;
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let s: usize = x.shape()[2..].iter().product();
    Ok((xc, [n, c, s]))
}

/// Optional parameter converted to `dtype` (recorded, so gradients reach the original).
fn param_as(p: Option<&Tensor>, dtype: DType) -> Result<Option<Tensor>> {
    p.map(|p| p.to_dtype(dtype)).transpose()
}

/// Optional contiguous handle of a `[len]` parameter for kernels.
fn flat_param(p: &Option<Tensor>, len: usize) -> Result<Option<Tensor>> {
    p.as_ref().map(|p| Ok(contiguous_as(p, p.dtype())?.contiguous_view_as(&[len]))).transpose()
}

// ---------------------------------------------------------------------- batch norm

/// The channel count `C` of a channel norm's `(N, C, *)` input; a typed shape error below rank 2.
fn channel_count(op: &'static str, x: &Tensor) -> Result<usize> {
    if x.rank() < 2 {
        return Err(TensorError::InvalidShape {
            op,
            arg: "input",
            shape: x.shape().to_vec(),
            expected: ExpectedShape::MinRank(2),
        });
    }
    Ok(x.shape()[1])
}

/// Options of [`batch_norm`] (PyTorch's `F.batch_norm` defaults: evaluation, momentum 0.1,
/// eps 1e-5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormOptions {
    /// Normalise with the batch's statistics (and update the running ones, when given); else
    /// with the running statistics.
    pub training: bool,
    /// Weight of the batch's statistics in the running update (PyTorch's
    /// `exponential_average_factor`: the layer's momentum, or `1/num_batches_tracked` for a
    /// cumulative average).
    pub momentum: f64,
    pub eps: f64,
}

impl Default for BatchNormOptions {
    fn default() -> Self {
        BatchNormOptions { training: false, momentum: 0.1, eps: 1e-5 }
    }
}

/// Which channel normalisation a [`ChannelNormBackward`] node differentiates: the only thing
/// batch norm's and group norm's backward nodes do differently is the kernel they call.
enum ChannelNorm {
    Batch(BatchNormBackwardParams),
    Group(GroupNormParams),
}

/// The backward node of [`batch_norm`] and [`group_norm`]: saved `x [N, C, S]`, the statistics
/// (`mean` and `invstd`/`rstd`), the optional weight; gradients for the input, weight and bias
/// that need one.
struct ChannelNormBackward {
    kind: ChannelNorm,
    x: SavedTensor,
    mean: SavedTensor,
    /// `invstd` (batch norm) or `rstd` (group norm): `1/√(var + eps)` either way.
    rstd: SavedTensor,
    weight: Option<SavedTensor>,
    has_bias: bool,
    ncs: [usize; 3],
    need: [bool; 3],
}

impl ChannelNormBackward {
    /// `y`, the output of batch or group norm of `x` (saved as its contiguous `xc`), with this
    /// node attached when `x`, the weight or the bias needs a gradient; `stats` are the
    /// forward's `mean` and `invstd`/`rstd`, `ncs` the `[N, C, S]` the kernels saw.
    fn attach(
        y: Tensor,
        x: &Tensor,
        xc: &Tensor,
        [wt, bt]: [&Option<Tensor>; 2],
        kind: ChannelNorm,
        [mean, rstd]: [&Tensor; 2],
        ncs: [usize; 3],
    ) -> Result<Tensor> {
        let mut inputs: Vec<&Tensor> = vec![x];
        inputs.extend(wt.iter());
        inputs.extend(bt.iter());
        if !Tensor::needs_graph(&inputs) {
            return Ok(y);
        }
        let f = ChannelNormBackward {
            kind,
            x: SavedTensor::new(xc),
            mean: SavedTensor::new(mean),
            rstd: SavedTensor::new(rstd),
            weight: wt.as_ref().map(SavedTensor::new),
            has_bias: bt.is_some(),
            ncs,
            need: [
                x.requires_grad(),
                wt.as_ref().is_some_and(|w| w.requires_grad()),
                bt.as_ref().is_some_and(|b| b.requires_grad()),
            ],
        };
        Ok(Tensor::from_op1(y, &inputs, f))
    }

    fn node_name(&self) -> &'static str {
        match self.kind {
            ChannelNorm::Batch(_) => "NativeBatchNormBackward0",
            ChannelNorm::Group(_) => "NativeGroupNormBackward0",
        }
    }
}

impl BackwardFn for ChannelNormBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.node_name())
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n_in = 1 + self.weight.is_some() as usize + self.has_bias as usize;
        let Some(g) = &g[0] else { return Ok(vec![None; n_in]) };
        let name = self.node_name();
        let x = self.x.get(name)?;
        let mean = self.mean.get(name)?;
        let rstd = self.rstd.get(name)?;
        let w = self.weight.as_ref().map(|w| w.get(name).cloned()).transpose()?;
        let [n, c, s] = self.ncs;
        let dtype = x.dtype();
        let gc = contiguous_as(g, dtype)?.contiguous_view_as(&[n, c, s]);
        let x3 = x.contiguous_view_as(&[n, c, s]);
        let gi = if self.need[0] { Some(x.empty_like_shape(&[n, c, s], dtype)?) } else { None };
        let gw = match &w {
            Some(_) if self.need[1] => Some(x.empty_like_shape(&[c], dtype)?),
            _ => None,
        };
        let gb = if self.has_bias && self.need[2] { Some(x.empty_like_shape(&[c], dtype)?) } else { None };
        let wf = w.as_ref().map(|w| contiguous_as(w, dtype)).transpose()?;
        let args = NormBackwardArgs {
            grad_input: gi.as_ref(),
            grad_weight: gw.as_ref(),
            grad_bias: gb.as_ref(),
            grad_output: &gc,
            x: &x3,
            mean,
            rstd,
            weight: wf.as_ref(),
            params: (),
        };
        match self.kind {
            ChannelNorm::Batch(p) => x.kernels().batch_norm_backward(&args.with_params(p))?,
            ChannelNorm::Group(p) => x.kernels().group_norm_backward(&args.with_params(p))?,
        }
        let mut out = vec![gi.map(|t| t.contiguous_view_as(x.shape()))];
        if let Some(w) = &w {
            out.push(gw.map(|t| t.contiguous_view_as(w.shape())));
        }
        if self.has_bias {
            out.push(gb);
        }
        Ok(out)
    }
}

/// Batch normalisation over the channel dimension 1 of `x` `(N, C, *)` (PyTorch's
/// `F.batch_norm`): in training mode with the batch's per-channel mean and biased variance,
/// updating `running_mean`/`running_var` in place when given (with the unbiased variance, as
/// PyTorch); in evaluation mode with the running statistics. `weight` and `bias` are `[C]`.
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    opts: &BatchNormOptions,
) -> Result<Tensor> {
    const OP: &str = "batch_norm";
    let c = channel_count(OP, x)?;
    for (arg, p) in [("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)] {
        check_param(OP, arg, p, &[c], x)?;
    }
    let running = match (running_mean, running_var) {
        (Some(m), Some(v)) => Some((m, v)),
        (None, None) => None,
        _ => {
            return Err(TensorError::invalid(
                OP,
                "running_mean and running_var must be given together (both, or neither to always use batch statistics)",
            ));
        }
    };
    if !opts.training && running.is_none() {
        return Err(TensorError::invalid(
            OP,
            "running_mean and running_var must be defined in evaluation mode; pass them, or use training mode (batch statistics)",
        ));
    }
    let dtype = norm_dtype(OP, x)?;
    let x = x.to_dtype(dtype)?;
    let (xc, [n, _, s]) = as_ncs(&x, dtype)?;
    if opts.training && n * s == 1 {
        return Err(TensorError::invalid(
            OP,
            format!(
                "expected more than 1 value per channel when training, got input size {:?}; use a larger batch or evaluation mode",
                x.shape()
            ),
        ));
    }
    let sd = stats_dtype(dtype);
    let y = xc.empty_like_shape(x.shape(), dtype)?;
    let wt = param_as(weight, dtype)?;
    let bt = param_as(bias, dtype)?;
    let (w1, b1) = (flat_param(&wt, c)?, flat_param(&bt, c)?);
    let x3 = xc.contiguous_view_as(&[n, c, s]);
    let y3 = y.contiguous_view_as(&[n, c, s]);
    let (mean, invstd) = if opts.training {
        let mean = xc.empty_like_shape(&[c], sd)?;
        let invstd = xc.empty_like_shape(&[c], sd)?;
        let _g = crate::autograd::no_grad();
        // The kernel updates contiguous buffers; a strided one is updated through a copy.
        let bufs = running
            .map(|(m, v)| -> Result<_> {
                check_inplace(OP, m, &[])?;
                check_inplace(OP, v, &[])?;
                Ok((contiguous_as(m, m.dtype())?, contiguous_as(v, v.dtype())?))
            })
            .transpose()?;
        // An empty batch has no statistics: PyTorch leaves the running ones as they are.
        let update = if n * s == 0 { None } else { bufs.as_ref() };
        let stats = BatchNormStats::Batch {
            eps: opts.eps,
            running: update.map(|(m, v)| RunningStats { mean: m, var: v, factor: opts.momentum }),
        };
        let args = BatchNormArgs {
            y: &y3,
            x: &x3,
            mean: &mean,
            rstd: &invstd,
            weight: w1.as_ref(),
            bias: b1.as_ref(),
            params: stats,
        };
        if n * s == 0 {
            // Statistics of nothing: mean 0, variance 0 (gradients of an empty batch are sums
            // over nothing, so they come out 0 whatever the statistics).
            mean.fill_(0.0)?;
            invstd.fill_(1.0 / opts.eps.sqrt())?;
        } else {
            y.kernels().batch_norm(&args)?;
        }
        if let (Some((m, v)), Some((mc, vc))) = (running, &bufs) {
            for (dst, tmp) in [(m, mc), (v, vc)] {
                if dst.shares_storage(tmp) {
                    dst.storage().bump_version();
                } else {
                    dst.copy_(tmp)?;
                }
            }
        }
        (mean, invstd)
    } else {
        let (rm, rv) = running.ok_or_else(|| TensorError::invalid(OP, "running statistics missing"))?;
        let _g = crate::autograd::no_grad();
        let mean = materialize(rm, sd)?;
        let invstd = materialize(rv, sd)?.add_scalar(opts.eps)?.rsqrt()?;
        let args = BatchNormArgs {
            y: &y3,
            x: &x3,
            mean: &mean,
            rstd: &invstd,
            weight: w1.as_ref(),
            bias: b1.as_ref(),
            params: BatchNormStats::Given,
        };
        y.kernels().batch_norm(&args)?;
        (mean, invstd)
    };
    let kind = ChannelNorm::Batch(BatchNormBackwardParams { batch_stats: opts.training });
    ChannelNormBackward::attach(y, &x, &xc, [&wt, &bt], kind, [&mean, &invstd], [n, c, s])
}

// ---------------------------------------------------------------------- group norm

/// Group normalisation of `x` `(N, C, *)` (PyTorch's `F.group_norm`): the `C` channels form
/// `num_groups` consecutive groups, each sample's group normalised over its channels and every
/// position after them, then scaled and shifted per channel by `weight` and `bias` (`[C]`).
pub fn group_norm(
    x: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "group_norm";
    let c = channel_count(OP, x)?;
    if num_groups == 0 {
        return Err(TensorError::invalid(OP, "num_groups must be positive"));
    }
    if !c.is_multiple_of(num_groups) {
        return Err(TensorError::InvalidShape {
            op: OP,
            arg: "input",
            shape: x.shape().to_vec(),
            expected: ExpectedShape::MultipleAt { dim: 1, factor: num_groups },
        });
    }
    check_param(OP, "weight", weight, &[c], x)?;
    check_param(OP, "bias", bias, &[c], x)?;
    let dtype = norm_dtype(OP, x)?;
    let x = x.to_dtype(dtype)?;
    let (xc, [n, _, s]) = as_ncs(&x, dtype)?;
    let sd = stats_dtype(dtype);
    let y = xc.empty_like_shape(x.shape(), dtype)?;
    let mean = xc.empty_like_shape(&[n, num_groups], sd)?;
    let rstd = xc.empty_like_shape(&[n, num_groups], sd)?;
    let wt = param_as(weight, dtype)?;
    let bt = param_as(bias, dtype)?;
    let (w1, b1) = (flat_param(&wt, c)?, flat_param(&bt, c)?);
    let x3 = xc.contiguous_view_as(&[n, c, s]);
    let y3 = y.contiguous_view_as(&[n, c, s]);
    let params = GroupNormParams { groups: num_groups, eps };
    y.kernels().group_norm(&GroupNormArgs {
        y: &y3,
        mean: &mean,
        rstd: &rstd,
        x: &x3,
        weight: w1.as_ref(),
        bias: b1.as_ref(),
        params,
    })?;
    ChannelNormBackward::attach(y, &x, &xc, [&wt, &bt], ChannelNorm::Group(params), [&mean, &rstd], [n, c, s])
}

// ---------------------------------------------------------------------- RMS norm

/// The machine epsilon of a floating dtype (`torch.finfo(dtype).eps`).
pub fn dtype_epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        DType::F16 => half::f16::EPSILON.to_f64(),
        DType::BF16 => half::bf16::EPSILON.to_f64(),
        _ => f32::EPSILON as f64,
    }
}

struct RmsNormBackward {
    x: SavedTensor,
    rstd: SavedTensor,
    weight: Option<SavedTensor>,
    cols: usize,
    need: [bool; 2],
}

impl BackwardFn for RmsNormBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("RmsNormBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n_in = 1 + self.weight.is_some() as usize;
        let Some(g) = &g[0] else { return Ok(vec![None; n_in]) };
        let name = "RmsNormBackward0";
        let x = self.x.get(name)?;
        let rstd = self.rstd.get(name)?;
        let w = self.weight.as_ref().map(|w| w.get(name).cloned()).transpose()?;
        let cols = self.cols;
        let rows = x.numel().checked_div(cols).unwrap_or(0);
        let dtype = x.dtype();
        let gc = contiguous_as(g, dtype)?.contiguous_view_as(&[rows, cols]);
        let x2 = x.contiguous_view_as(&[rows, cols]);
        let gi = if self.need[0] { Some(x.empty_like_shape(&[rows, cols], dtype)?) } else { None };
        let gw = match &w {
            Some(_) if self.need[1] => Some(x.empty_like_shape(&[cols], dtype)?),
            _ => None,
        };
        let wf = w
            .as_ref()
            .map(|w| Ok::<_, TensorError>(contiguous_as(w, dtype)?.contiguous_view_as(&[cols])))
            .transpose()?;
        if rows > 0 && cols > 0 {
            x.kernels().rms_norm_backward(&RmsNormBackwardArgs {
                grad_input: gi.as_ref(),
                grad_weight: gw.as_ref(),
                grad_output: &gc,
                x: &x2,
                rstd,
                weight: wf.as_ref(),
            })?;
        } else if let Some(gw) = &gw {
            // No rows: the weight's gradient is an empty sum.
            gw.kernels().fill(gw, 0.0)?;
        }
        let mut out = vec![gi.map(|t| t.contiguous_view_as(x.shape()))];
        if let Some(w) = &w {
            out.push(gw.map(|t| t.contiguous_view_as(w.shape())));
        }
        Ok(out)
    }
}

/// RMS normalisation over the trailing `normalized_shape` dims (PyTorch's `F.rms_norm`):
/// `x / √(mean(x²) + eps) · weight`, with `eps = None` meaning the machine epsilon of the input's
/// dtype, as PyTorch. Computed in f32 under autocast.
pub fn rms_norm(x: &Tensor, normalized_shape: &[usize], weight: Option<&Tensor>, eps: Option<f64>) -> Result<Tensor> {
    const OP: &str = "rms_norm";
    if normalized_shape.is_empty() {
        return Err(TensorError::InvalidShape {
            op: OP,
            arg: "normalized_shape",
            shape: Vec::new(),
            expected: ExpectedShape::MinRank(1),
        });
    }
    let trailing = ExpectedShape::Trailing(normalized_shape.to_vec());
    if !trailing.admits(x.shape()) {
        return Err(TensorError::InvalidShape { op: OP, arg: "input", shape: x.shape().to_vec(), expected: trailing });
    }
    check_param(OP, "weight", weight, normalized_shape, x)?;
    let dtype = norm_dtype(OP, x)?;
    let eps = eps.unwrap_or_else(|| dtype_epsilon(x.dtype()));
    let x = x.to_dtype(dtype)?;
    let cols: usize = normalized_shape.iter().product();
    let rows = x.numel().checked_div(cols).unwrap_or(0);
    let xc = contiguous_as(&x, dtype)?;
    let y = xc.empty_like_shape(x.shape(), dtype)?;
    let rstd = xc.empty_like_shape(&[rows], stats_dtype(dtype))?;
    let wt = param_as(weight, dtype)?;
    let w1 = flat_param(&wt, cols)?;
    if rows > 0 && cols > 0 {
        let (y2, x2) = (y.contiguous_view_as(&[rows, cols]), xc.contiguous_view_as(&[rows, cols]));
        y.kernels().rms_norm(&RmsNormArgs { y: &y2, rstd: &rstd, x: &x2, weight: w1.as_ref(), eps })?;
    }
    let mut inputs: Vec<&Tensor> = vec![&x];
    inputs.extend(wt.iter());
    if !Tensor::needs_graph(&inputs) {
        return Ok(y);
    }
    let f = RmsNormBackward {
        x: SavedTensor::new(&xc),
        rstd: SavedTensor::new(&rstd),
        weight: wt.as_ref().map(SavedTensor::new),
        cols,
        need: [x.requires_grad(), wt.as_ref().is_some_and(|w| w.requires_grad())],
    };
    Ok(Tensor::from_op1(y, &inputs, f))
}
