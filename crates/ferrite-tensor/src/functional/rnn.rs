//! Recurrent layers' maths, composed of differentiable tensor ops so that autograd (and the
//! memory a `meta` run predicts) needs nothing recurrent-specific. New recurrent cells (GRU, plain
//! RNN) go here beside the LSTM.

use crate::Tensor;
use crate::error::{ExpectedShape, Result, TensorError};

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
    let check = |arg, t: &Tensor, expected: ExpectedShape| {
        if expected.admits(t.shape()) {
            Ok(())
        } else {
            Err(TensorError::InvalidShape { op: "lstm", arg, shape: t.shape().to_vec(), expected })
        }
    };
    let x_dims: &'static [&'static str] =
        if batch_first { &["batch", "seq", "features"] } else { &["seq", "batch", "features"] };
    check("input", x, ExpectedShape::Named(x_dims))?;
    check("w_ih", w_ih, ExpectedShape::Named(&["4*hidden_size", "input_size"]))?;
    // Four gates (i, f, g, o) of `hidden_size` rows each.
    check("w_ih", w_ih, ExpectedShape::MultipleAt { dim: 0, factor: 4 })?;
    let h = w_ih.shape()[0] / 4;
    let xb = if batch_first { x.clone() } else { x.transpose(0, 1)? };
    let (batch, seq, features) = (xb.shape()[0], xb.shape()[1], xb.shape()[2]);
    check("w_ih", w_ih, ExpectedShape::Exact(vec![4 * h, features]))?;
    check("w_hh", w_hh, ExpectedShape::Exact(vec![4 * h, h]))?;
    for (arg, b) in [("b_ih", b_ih), ("b_hh", b_hh)] {
        if let Some(b) = b {
            check(arg, b, ExpectedShape::Exact(vec![4 * h]))?;
        }
    }
    let (mut hs, mut cs) = match state {
        Some((h0, c0)) => {
            check("h0", h0, ExpectedShape::Exact(vec![batch, h]))?;
            check("c0", c0, ExpectedShape::Exact(vec![batch, h]))?;
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
