//! Functional forms of the layers and losses of `torch.nn.functional` that need more than a
//! composition of tensor ops: fused layer norm, cross-entropy with ignore_index and label
//! smoothing, and scaled-dot-product attention with a memory-efficient chunked path.
//!
//! They live beside the tensor ops (as in PyTorch's `torch.nn.functional`) so the op-parity suite
//! can check them against PyTorch directly; `ferrite-nn` layers call them.

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor, no_grad};
use crate::error::{Result, TensorError};
use crate::layout::Shape;
use crate::ops::copy::materialize;
use crate::random::Generator;
use crate::{DType, Tensor};

// ------------------------------------------------------------------------------------ layer norm

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
    let r = x.rank();
    let k = normalized_shape.len();
    if k == 0 || k > r || &x.shape()[r - k..] != normalized_shape {
        return Err(TensorError::shape(
            "layer_norm",
            format!(
                "given normalized_shape={normalized_shape:?}, expected input with shape [*, {}], but got input of size {:?}",
                normalized_shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
                x.shape()
            ),
        ));
    }
    for (name, p) in [("weight", weight), ("bias", bias)] {
        if let Some(p) = p
            && p.shape() != normalized_shape
        {
            return Err(TensorError::shape(
                "layer_norm",
                format!("{name} has shape {:?}, expected {normalized_shape:?}", p.shape()),
            ));
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
        y.kernels().layer_norm(&rows_view(&y), &mean, &rstd, &rows_view(&xc), w2.as_ref(), b2.as_ref(), eps)?;
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

// ------------------------------------------------------------------------------------ losses

/// How a loss reduces over the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reduction {
    None,
    #[default]
    Mean,
    Sum,
}

/// Options of [`cross_entropy`] (PyTorch's defaults).
#[derive(Clone, Debug)]
pub struct CrossEntropyOptions {
    /// Targets equal to this contribute nothing (and do not count in the mean).
    pub ignore_index: i64,
    /// Mix the one-hot target with a uniform distribution (0 = off).
    pub label_smoothing: f64,
    pub reduction: Reduction,
    /// Per-class weights `[C]`.
    pub weight: Option<Tensor>,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions { ignore_index: -100, label_smoothing: 0.0, reduction: Reduction::Mean, weight: None }
    }
}

/// Cross-entropy between logits `[N, C]` (or `[N, C, d1, …]`) and class indices `[N]`
/// (or `[N, d1, …]`), computed in f32 under autocast.
pub fn cross_entropy(logits: &Tensor, target: &Tensor, opts: &CrossEntropyOptions) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&opts.label_smoothing) {
        return Err(TensorError::invalid(
            "cross_entropy",
            format!("label_smoothing must be between 0.0 and 1.0, got {}", opts.label_smoothing),
        ));
    }
    let logp = logits_to_logp(logits)?;
    nll_core(&logp, target, opts, "cross_entropy")
}

/// Negative log-likelihood of log-probabilities `[N, C]` (or `[N, C, d…]`).
pub fn nll_loss(logp: &Tensor, target: &Tensor, opts: &CrossEntropyOptions) -> Result<Tensor> {
    let lp = move_class_last(logp)?;
    nll_core(&lp, target, opts, "nll_loss")
}

fn move_class_last(x: &Tensor) -> Result<Tensor> {
    if x.rank() < 2 {
        return Err(TensorError::shape(
            "cross_entropy",
            format!("expected input of shape [N, C] or [N, C, d1, ...], got {:?}", x.shape()),
        ));
    }
    let c = x.shape()[1];
    if x.rank() == 2 {
        return Ok(x.clone());
    }
    let mut perm: Vec<i64> = vec![0];
    perm.extend(2..x.rank() as i64);
    perm.push(1);
    x.permute(&perm)?.reshape(&[-1, c as i64])
}

fn logits_to_logp(logits: &Tensor) -> Result<Tensor> {
    let x = move_class_last(logits)?;
    let x = x.to_dtype(crate::autocast::upper(x.dtype()))?;
    x.log_softmax(1)
}

fn nll_core(logp: &Tensor, target: &Tensor, opts: &CrossEntropyOptions, op: &'static str) -> Result<Tensor> {
    let n = logp.shape()[0];
    let c = logp.shape()[1];
    if target.numel() != n {
        return Err(TensorError::shape(
            op,
            format!(
                "expected target with {n} elements (one class index per row of input), got shape {:?}",
                target.shape()
            ),
        ));
    }
    if !matches!(target.dtype(), DType::I64 | DType::I32 | DType::U8) {
        return Err(TensorError::DTypeMismatch {
            op,
            detail: format!(
                "target must hold class indices (int64), got {}; for probabilities use a soft-target loss",
                target.dtype()
            ),
        });
    }
    let t = target.reshape_usize(&[n])?.to_dtype(DType::I64)?;
    let valid = t.ne_scalar(opts.ignore_index as f64)?;
    t.kernels().check_indices(&t, c, Some(opts.ignore_index), 1, op)?;
    let zero_i = Tensor::zeros(&[], DType::I64, t.device())?;
    let safe_t = Tensor::where_(&valid, &t, &zero_i)?;
    let picked = logp.gather(1, &safe_t.unsqueeze(1)?)?.squeeze(1)?;
    let validf = valid.to_dtype(logp.dtype())?;
    let w_rows = match &opts.weight {
        Some(w) => {
            if w.shape() != [c] {
                return Err(TensorError::shape(
                    op,
                    format!("weight should be a 1D tensor with one entry per class ({c}), got {:?}", w.shape()),
                ));
            }
            w.to_dtype(logp.dtype())?.index_select(0, &safe_t)?.mul(&validf)?
        }
        None => validf.clone(),
    };
    let mut loss = picked.mul(&w_rows)?.neg()?;
    if opts.label_smoothing > 0.0 {
        let eps = opts.label_smoothing;
        let smooth = match &opts.weight {
            Some(w) => logp.mul(&w.to_dtype(logp.dtype())?)?.sum_dims(&[1], false)?,
            None => logp.sum_dims(&[1], false)?,
        };
        let smooth = smooth.mul(&validf)?.neg()?;
        loss = loss.mul_scalar(1.0 - eps)?.add(&smooth.mul_scalar(eps / c as f64)?)?;
    }
    match opts.reduction {
        Reduction::None => Ok(loss),
        Reduction::Sum => loss.sum(),
        Reduction::Mean => loss.sum()?.div(&w_rows.sum()?),
    }
}

/// Mean squared error (PyTorch's `F.mse_loss`, reduction mean), f32 under autocast.
pub fn mse_loss(input: &Tensor, target: &Tensor) -> Result<Tensor> {
    mse_loss_with(input, target, Reduction::Mean)
}

/// Mean squared error with an explicit reduction.
pub fn mse_loss_with(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    if input.shape() != target.shape() {
        return Err(TensorError::shape(
            "mse_loss",
            format!("input {:?} and target {:?} must have the same shape", input.shape(), target.shape()),
        ));
    }
    let up = crate::autocast::upper(input.dtype());
    let d = input.to_dtype(up)?.sub(&target.to_dtype(up)?)?;
    let sq = d.square()?;
    match reduction {
        Reduction::None => Ok(sq),
        Reduction::Sum => sq.sum(),
        Reduction::Mean => sq.mean(),
    }
}

// ------------------------------------------------------------------------------------ embedding

/// Rows of `weight` `[num_embeddings, dim]` picked by integer `indices` (any shape); output
/// `[*indices.shape, dim]`. Gradients accumulate into the picked rows.
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    if weight.rank() != 2 {
        return Err(TensorError::shape(
            "embedding",
            format!("weight must be 2-D [num_embeddings, embedding_dim], got {:?}", weight.shape()),
        ));
    }
    let flat = indices.reshape_usize(&[indices.numel()])?;
    let rows = weight.index_select(0, &flat)?;
    let mut shape: Vec<usize> = indices.shape().to_vec();
    shape.push(weight.shape()[1]);
    rows.reshape_usize(&shape)
}

// ------------------------------------------------------------------------------------ dropout

/// Zero elements with probability `p` and scale the rest by `1/(1-p)` (identity when not
/// training or `p == 0`). Draws from `generator`.
pub fn dropout(x: &Tensor, p: f64, training: bool, generator: &mut Generator) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(TensorError::invalid(
            "dropout",
            format!("dropout probability has to be between 0 and 1, but got {p}"),
        ));
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    if p == 1.0 {
        return x.mul_scalar(0.0);
    }
    let mask = Tensor::bernoulli_with(x.shape(), 1.0 - p, x.dtype(), x.device(), generator)?;
    let mask = {
        let _g = no_grad();
        mask.mul_scalar(1.0 / (1.0 - p))?
    };
    x.mul(&mask)
}

// ------------------------------------------------------------------------------------ attention

/// Scaled dot-product attention `softmax(q kᵀ · scale + mask) v` (PyTorch's
/// `F.scaled_dot_product_attention`): `q [.., L, E]`, `k [.., S, E]`, `v [.., S, Ev]`.
/// `attn_mask` is boolean (true = attend) or additive float, broadcastable to `[.., L, S]`.
///
/// Sequences longer than 256 queries take the memory-efficient path
/// ([`scaled_dot_product_attention_chunked`]), which never materialises the `L×S` score matrix.
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    let l = q.shape().get(q.rank().wrapping_sub(2)).copied().unwrap_or(0);
    if l > 256 {
        return scaled_dot_product_attention_chunked(q, k, v, attn_mask, is_causal, scale, 128);
    }
    let (scale, mask) = attn_prep(q, k, v, attn_mask, is_causal, scale)?;
    let kt = k.transpose(-2, -1)?;
    let mut s = q.matmul(&kt)?.mul_scalar(scale)?;
    if let Some(m) = &mask {
        s = apply_mask(&s, m)?;
    }
    let p = s.softmax(-1)?;
    p.to_dtype(v.dtype().max_float(p.dtype()))?.matmul(v)
}

trait MaxFloat {
    fn max_float(self, other: DType) -> DType;
}
impl MaxFloat for DType {
    fn max_float(self, other: DType) -> DType {
        crate::ops::promote_types(self, other)
    }
}

enum Mask {
    Bool(Tensor),
    Additive(Tensor),
}

fn apply_mask(s: &Tensor, m: &Mask) -> Result<Tensor> {
    match m {
        Mask::Bool(b) => s.masked_fill(&b.logical_not()?, f64::NEG_INFINITY),
        Mask::Additive(a) => s.add(a),
    }
}

fn attn_prep(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<(f64, Option<Mask>)> {
    if q.rank() < 2 || k.rank() < 2 || v.rank() < 2 {
        return Err(TensorError::shape(
            "scaled_dot_product_attention",
            "q, k and v must have at least 2 dimensions [.., seq, dim]",
        ));
    }
    let e = q.shape()[q.rank() - 1];
    if k.shape()[k.rank() - 1] != e {
        return Err(TensorError::shape(
            "scaled_dot_product_attention",
            format!(
                "query dim {e} and key dim {} differ (q {:?}, k {:?})",
                k.shape()[k.rank() - 1],
                q.shape(),
                k.shape()
            ),
        ));
    }
    if k.shape()[k.rank() - 2] != v.shape()[v.rank() - 2] {
        return Err(TensorError::shape(
            "scaled_dot_product_attention",
            format!("key and value sequence lengths differ (k {:?}, v {:?})", k.shape(), v.shape()),
        ));
    }
    if is_causal && attn_mask.is_some() {
        return Err(TensorError::invalid(
            "scaled_dot_product_attention",
            "pass either attn_mask or is_causal, not both",
        ));
    }
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    let (l, s) = (q.shape()[q.rank() - 2], k.shape()[k.rank() - 2]);
    let mask = if is_causal {
        // PyTorch: tril(ones(L, S)) — query i attends to keys 0..=i.
        let rows = Tensor::arange(0.0, l as f64, 1.0, DType::I64, q.device())?.unsqueeze(1)?;
        let cols = Tensor::arange(0.0, s as f64, 1.0, DType::I64, q.device())?.unsqueeze(0)?;
        Some(Mask::Bool(cols.le(&rows)?))
    } else {
        match attn_mask {
            None => None,
            Some(m) if m.dtype() == DType::Bool => Some(Mask::Bool(m.clone())),
            Some(m) => Some(Mask::Additive(m.clone())),
        }
    };
    Ok((scale, mask))
}

/// Memory-efficient attention: queries are processed in chunks of `chunk` rows, keeping only
/// `chunk × S` scores alive at a time. Backward recomputes each chunk's probabilities from the
/// saved per-row log-sum-exp instead of storing them, so the saved state is `O(L)` beyond q, k, v
/// and the output.
pub fn scaled_dot_product_attention_chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    is_causal: bool,
    scale: Option<f64>,
    chunk: usize,
) -> Result<Tensor> {
    if chunk == 0 {
        return Err(TensorError::invalid("scaled_dot_product_attention", "chunk size must be positive"));
    }
    let (scale, mask) = attn_prep(q, k, v, attn_mask, is_causal, scale)?;
    let dtype = crate::ops::promote_types(crate::ops::promote_types(q.dtype(), k.dtype()), v.dtype());
    let (q, k, v) = (q.to_dtype(dtype)?, k.to_dtype(dtype)?, v.to_dtype(dtype)?);
    let l = q.shape()[q.rank() - 2];
    let (out, lse) = {
        let _g = no_grad();
        let kt = k.transpose(-2, -1)?;
        let mut outs = Vec::new();
        let mut lses = Vec::new();
        let mut start = 0;
        while start < l {
            let n = chunk.min(l - start);
            let (o, lse) = attn_chunk_forward(&q, &kt, &v, mask.as_ref(), scale, start, n)?;
            outs.push(o);
            lses.push(lse);
            start += n;
        }
        let outs_r: Vec<&Tensor> = outs.iter().collect();
        let lses_r: Vec<&Tensor> = lses.iter().collect();
        (Tensor::cat(&outs_r, -2)?, Tensor::cat(&lses_r, -2)?)
    };
    if !Tensor::needs_graph(&[&q, &k, &v]) {
        return Ok(out);
    }
    let f = ChunkedAttentionBackward {
        q: SavedTensor::new(&q),
        k: SavedTensor::new(&k),
        v: SavedTensor::new(&v),
        out: SavedTensor::new(&out),
        lse: SavedTensor::new(&lse),
        mask,
        scale,
        chunk,
    };
    Ok(Tensor::from_op1(out, &[&q, &k, &v], f))
}

fn mask_rows(m: &Mask, start: usize, n: usize) -> Result<Mask> {
    let t = match m {
        Mask::Bool(t) | Mask::Additive(t) => t,
    };
    // Broadcast masks may have a size-1 query dim; only narrow a real one.
    let r = if t.rank() >= 2 && t.shape()[t.rank() - 2] > 1 { t.narrow(-2, start, n)? } else { t.clone() };
    Ok(match m {
        Mask::Bool(_) => Mask::Bool(r),
        Mask::Additive(_) => Mask::Additive(r),
    })
}

/// Scores of query rows `start..start+n`: returns (output rows, log-sum-exp rows `[.., n, 1]`).
fn attn_chunk_forward(
    q: &Tensor,
    kt: &Tensor,
    v: &Tensor,
    mask: Option<&Mask>,
    scale: f64,
    start: usize,
    n: usize,
) -> Result<(Tensor, Tensor)> {
    let qc = q.narrow(-2, start, n)?;
    let mut s = qc.matmul(kt)?.mul_scalar(scale)?;
    if let Some(m) = mask {
        s = apply_mask(&s, &mask_rows(m, start, n)?)?;
    }
    let s32 = s.to_dtype(crate::autocast::upper(s.dtype()).max_float(DType::F32))?;
    let (mx, _) = s32.max_dim(-1, true)?;
    let mx = mx.clamp(Some(-f64::MAX), None)?; // fully masked rows: avoid -inf - -inf
    let lse = s32.sub(&mx)?.exp()?.sum_dims(&[-1], true)?.log()?.add(&mx)?;
    let p = s32.sub(&lse)?.exp()?;
    let o = p.to_dtype(v.dtype())?.matmul(v)?;
    Ok((o, lse))
}

struct ChunkedAttentionBackward {
    q: SavedTensor,
    k: SavedTensor,
    v: SavedTensor,
    out: SavedTensor,
    lse: SavedTensor,
    mask: Option<Mask>,
    scale: f64,
    chunk: usize,
}

impl BackwardFn for ChunkedAttentionBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("ScaledDotProductEfficientAttentionBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(go) = &g[0] else { return Ok(vec![None, None, None]) };
        let name = "ScaledDotProductEfficientAttentionBackward0";
        let (q, k, v, out, lse) =
            (self.q.get(name)?, self.k.get(name)?, self.v.get(name)?, self.out.get(name)?, self.lse.get(name)?);
        let go = go.to_dtype(q.dtype())?;
        let l = q.shape()[q.rank() - 2];
        let kt = k.transpose(-2, -1)?;
        // D_i = rowsum(dO_i * O_i)
        let dsum = go.mul(out)?.sum_dims(&[-1], true)?;
        let mut dq_chunks = Vec::new();
        let mut dk: Option<Tensor> = None;
        let mut dv: Option<Tensor> = None;
        let mut start = 0;
        while start < l {
            let n = self.chunk.min(l - start);
            let qc = q.narrow(-2, start, n)?;
            let mut s = qc.matmul(&kt)?.mul_scalar(self.scale)?;
            if let Some(m) = &self.mask {
                s = apply_mask(&s, &mask_rows(m, start, n)?)?;
            }
            let s32 = s.to_dtype(DType::F32.max_float(s.dtype()))?;
            let p = s32.sub(&lse.narrow(-2, start, n)?)?.exp()?.to_dtype(q.dtype())?;
            let goc = go.narrow(-2, start, n)?;
            // dV += Pᵀ dO
            let dvc = p.transpose(-2, -1)?.matmul(&goc)?;
            dv = Some(match dv {
                None => dvc,
                Some(a) => a.add(&dvc)?,
            });
            // dP = dO Vᵀ ; dS = P ∘ (dP − D)
            let dp = goc.matmul(&v.transpose(-2, -1)?)?;
            let ds = p.mul(&dp.sub(&dsum.narrow(-2, start, n)?)?)?.mul_scalar(self.scale)?;
            dq_chunks.push(ds.matmul(k)?);
            let dkc = ds.transpose(-2, -1)?.matmul(&qc)?;
            dk = Some(match dk {
                None => dkc,
                Some(a) => a.add(&dkc)?,
            });
            start += n;
        }
        let r: Vec<&Tensor> = dq_chunks.iter().collect();
        let dq = if r.is_empty() { q.zeros_like()? } else { Tensor::cat(&r, -2)? };
        let dk = match dk {
            Some(t) => t.sum_to_shape(k.shape())?,
            None => k.zeros_like()?,
        };
        let dv = match dv {
            Some(t) => t.sum_to_shape(v.shape())?,
            None => v.zeros_like()?,
        };
        Ok(vec![Some(dq), Some(dk), Some(dv)])
    }
}

// ------------------------------------------------------------------------------------ lstm

/// A single-layer unidirectional LSTM over a whole sequence, composed of differentiable tensor
/// ops (PyTorch's `nn.LSTM` maths, gate order i, f, g, o):
/// `x [batch, seq, in]` when `batch_first`, else `[seq, batch, in]`; `w_ih [4H, in]`,
/// `w_hh [4H, H]`, optional biases `[4H]`, optional initial `(h0, c0)` each `[batch, H]`
/// (zeros when absent). Returns the output sequence (same batch/seq order as `x`) and the final
/// `(h, c)`. The input projection of all time steps runs as one matrix product.
pub fn lstm(
    x: &Tensor,
    w_ih: &Tensor,
    w_hh: &Tensor,
    b_ih: Option<&Tensor>,
    b_hh: Option<&Tensor>,
    state: Option<(&Tensor, &Tensor)>,
    batch_first: bool,
) -> Result<(Tensor, (Tensor, Tensor))> {
    if x.rank() != 3 {
        return Err(TensorError::shape(
            "lstm",
            format!(
                "expected a 3-D input [batch, seq, features] (batch_first) or [seq, batch, features], got {:?}",
                x.shape()
            ),
        ));
    }
    if w_ih.rank() != 2 || w_hh.rank() != 2 || !w_ih.shape()[0].is_multiple_of(4) {
        return Err(TensorError::shape(
            "lstm",
            format!(
                "expected w_ih [4*hidden, in] and w_hh [4*hidden, hidden], got {:?} and {:?}",
                w_ih.shape(),
                w_hh.shape()
            ),
        ));
    }
    let h = w_ih.shape()[0] / 4;
    let xb = if batch_first { x.clone() } else { x.transpose(0, 1)? };
    let (batch, seq, features) = (xb.shape()[0], xb.shape()[1], xb.shape()[2]);
    if w_ih.shape()[1] != features || w_hh.shape() != [4 * h, h] {
        return Err(TensorError::shape(
            "lstm",
            format!(
                "input has {features} features and hidden size is {h}: expected w_ih [{}, {features}] and w_hh [{}, {h}], got {:?} and {:?}",
                4 * h,
                4 * h,
                w_ih.shape(),
                w_hh.shape()
            ),
        ));
    }
    for b in [b_ih, b_hh].into_iter().flatten() {
        if b.shape() != [4 * h] {
            return Err(TensorError::shape(
                "lstm",
                format!("expected biases of shape [{}], got {:?}", 4 * h, b.shape()),
            ));
        }
    }
    let (mut hs, mut cs) = match state {
        Some((h0, c0)) => {
            if h0.shape() != [batch, h] || c0.shape() != [batch, h] {
                return Err(TensorError::shape(
                    "lstm",
                    format!("expected h0 and c0 of shape [{batch}, {h}], got {:?} and {:?}", h0.shape(), c0.shape()),
                ));
            }
            (h0.clone(), c0.clone())
        }
        None => {
            (Tensor::zeros(&[batch, h], x.dtype(), x.device())?, Tensor::zeros(&[batch, h], x.dtype(), x.device())?)
        }
    };
    // All time steps' input projections at once: [batch, seq, 4H].
    let xp = xb.linear(w_ih, b_ih)?;
    let w_hh_t = w_hh.t()?;
    let mut outs = Vec::with_capacity(seq);
    for t in 0..seq {
        let mut gates = xp.select(1, t as i64)?.add(&hs.matmul(&w_hh_t)?)?;
        if let Some(b) = b_hh {
            gates = gates.add(b)?;
        }
        let g4 = gates.chunk(4, 1)?;
        let (i, f, g, o) = (g4[0].sigmoid()?, g4[1].sigmoid()?, g4[2].tanh()?, g4[3].sigmoid()?);
        cs = f.mul(&cs)?.add(&i.mul(&g)?)?;
        hs = o.mul(&cs.tanh()?)?;
        outs.push(hs.clone());
    }
    let refs: Vec<&Tensor> = outs.iter().collect();
    let out =
        if refs.is_empty() { Tensor::zeros(&[batch, 0, h], x.dtype(), x.device())? } else { Tensor::stack(&refs, 1)? };
    let out = if batch_first { out } else { out.transpose(0, 1)? };
    Ok((out, (hs, cs)))
}
