//! Recurrent layers' maths, composed of differentiable tensor ops so that autograd (and the
//! memory a `meta` run predicts) needs nothing recurrent-specific. New recurrent cells (GRU, plain
//! RNN) go here beside the LSTM.

use crate::Tensor;
use crate::error::{Result, TensorError};

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
