//! The causal language-modelling loss as transformers computes it (`ForCausalLMLoss` with
//! `labels = input_ids`): the logits at positions `0..s−1` against the labels at `1..s`, the mean
//! cross-entropy over every predicted position of every row.
//!
//! Why a function of its own: `ferrite eval`, `ferrite train --hf-model`, the parity tests and a
//! library user's own loop must all compute the one loss transformers reports, with the shift in
//! the same place.
use ferrite_nn::CrossEntropyLoss;
use ferrite_tensor::Tensor;

/// Mean cross-entropy of `logits [b, s, vocab]` at positions `0..s−1` predicting `labels [b, s]`
/// at `1..s`; `b·(s−1)` positions (at least one: `s ≥ 2`).
pub fn causal_lm_loss(logits: &Tensor, labels: &Tensor) -> ferrite_nn::Result<Tensor> {
    let shape = logits.shape();
    if shape.len() != 3 || labels.shape() != &shape[..2] || shape[1] < 2 {
        return Err(ferrite_nn::NnError::InvalidConfig {
            layer: "causal_lm_loss",
            detail: format!(
                "logits {:?} and labels {:?}: expected [batch, seq, vocab] and [batch, seq] with seq ≥ 2",
                shape,
                labels.shape()
            ),
        });
    }
    let (s, v) = (shape[1], shape[2]);
    let pred = logits.narrow(1, 0, s - 1)?.contiguous()?.reshape(&[-1, v as i64])?;
    let target = labels.narrow(1, 1, s - 1)?.contiguous()?.reshape(&[-1])?;
    CrossEntropyLoss::new().forward(&pred, &target)
}
