//! Scaled dot-product attention, in two paths: the plain one that materialises the `L×S` score
//! matrix (fast for short sequences), and a memory-efficient chunked one whose backward
//! recomputes probabilities from a saved log-sum-exp, so long sequences fit in memory.

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor, no_grad};
use crate::error::{ExpectedShape, Result, TensorError};
use crate::{DType, Tensor};

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
    const OP: &str = "scaled_dot_product_attention";
    let invalid =
        |arg, t: &Tensor, expected| TensorError::InvalidShape { op: OP, arg, shape: t.shape().to_vec(), expected };
    for (arg, t) in [("query", q), ("key", k), ("value", v)] {
        if t.rank() < 2 {
            return Err(invalid(arg, t, ExpectedShape::MinRank(2)));
        }
    }
    // The key's embedding size is the query's; the value's sequence length is the key's.
    let e = q.shape()[q.rank() - 1];
    if k.shape()[k.rank() - 1] != e {
        return Err(invalid("key", k, ExpectedShape::SizeAt { dim: k.rank() - 1, size: e }));
    }
    let s = k.shape()[k.rank() - 2];
    if v.shape()[v.rank() - 2] != s {
        return Err(invalid("value", v, ExpectedShape::SizeAt { dim: v.rank() - 2, size: s }));
    }
    if is_causal && attn_mask.is_some() {
        return Err(TensorError::invalid(
            "scaled_dot_product_attention",
            "pass either attn_mask or is_causal, not both",
        ));
    }
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    let l = q.shape()[q.rank() - 2];
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
