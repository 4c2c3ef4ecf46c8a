//! Sequence-to-sequence with a [`T5Model`], as transformers does it: the loss over the labels that
//! are not −100, and generation that runs the encoder once and the decoder token by token from
//! `decoder_start_token_id`. (The decoder's input, the labels shifted right, is made with the
//! batch: `ferrite_data::Seq2SeqExamples`, as transformers' `DataCollatorForSeq2Seq`.)
//!
//! Why its own file: `ferrite train`, `ferrite eval` and `ferrite generate` on a T5 folder, the
//! parity tests and a library user's loop must agree on these three conventions, and none of
//! them is the decoder-only one ([`crate::causal_lm_loss`] shifts inside the loss; here the
//! shift is in the decoder's input and the loss reads logits and labels position for position).
//!
//! Generation keeps a [`crate::T5Cache`] (transformers' `EncoderDecoderCache`): the encoder runs
//! once, its output is projected to every decoder layer's cross-attention keys and values once,
//! and each new token costs the decoder one position. `Generated::cache_bytes` is the cache's
//! size at the end, self- and cross-attention together.
use std::time::{Duration, Instant};

use ferrite_nn::{CrossEntropyLoss, Module};
use ferrite_tensor::{Generator, Tensor, no_grad};

use crate::generate::{argmax, check_options, sample};
use crate::{Decoding, GenerateOptions, Generated, ModelError, T5Model};

/// The label transformers ignores in the loss (padding of the targets; `ferrite_data` pads with it).
pub const IGNORE_LABEL: i64 = -100;

/// The mean cross-entropy of `logits [b, t, vocab]` against `labels [b, t]` over every label that
/// is not −100 (T5ForConditionalGeneration's loss; no shift: the decoder's input is shifted).
pub fn seq2seq_loss(logits: &Tensor, labels: &Tensor) -> ferrite_nn::Result<Tensor> {
    let shape = logits.shape();
    if shape.len() != 3 || labels.shape() != &shape[..2] {
        return Err(ferrite_nn::NnError::InvalidConfig {
            layer: "seq2seq_loss",
            detail: format!(
                "logits {:?} and labels {:?}: expected [batch, seq, vocab] and [batch, seq]",
                shape,
                labels.shape()
            ),
        });
    }
    let v = shape[2] as i64;
    CrossEntropyLoss::new().ignore_index(IGNORE_LABEL).forward(&logits.reshape(&[-1, v])?, &labels.reshape(&[-1])?)
}

/// The labels a batch scores: those that are not −100.
pub fn scored_labels(labels: &Tensor) -> Result<usize, ModelError> {
    Ok(labels.to_vec::<i64>()?.iter().filter(|&&l| l != IGNORE_LABEL).count())
}

/// The output of `model` for `input` (token ids, at least one): the encoder once, then the
/// decoder from the config's `decoder_start_token_id` with a [`crate::T5Cache`], one new token
/// (one position) per pass, greedy or sampled
/// as in [`crate::generate`], stopping at an EOS id (kept, as transformers keeps it). The new
/// ids exclude the start token, as transformers' `generate(...)[0, 1:]`.
pub fn generate_seq2seq(model: &T5Model, input: &[u32], options: &GenerateOptions) -> Result<Generated, ModelError> {
    check_options(input, options)?;
    let device = model.parameters().first().map(|p| p.device().clone()).unwrap_or(ferrite_tensor::Device::Cpu);
    let _g = no_grad();
    let mut rng = match &options.decoding {
        Decoding::Sample { seed, .. } => Some(Generator::new(*seed)),
        Decoding::Greedy => None,
    };
    let start = Instant::now();
    let ids: Vec<i64> = input.iter().map(|&t| i64::from(t)).collect();
    let encoded = model.encode(&Tensor::from_vec(ids, &[1, input.len()], &device)?, None)?;
    let mut cache = model.new_cache();
    let mut next_input = i64::from(model.config().decoder_start_token_id);
    let mut out = Vec::with_capacity(options.max_new_tokens);
    let mut stopped = false;
    let mut prefill = Duration::ZERO;
    while out.len() < options.max_new_tokens {
        let x = Tensor::from_vec(vec![next_input], &[1, 1], &device)?;
        let logits = model.decode_with_cache(&x, &encoded, None, &mut cache, true)?.reshape(&[-1])?.to_vec_f64()?;
        if out.is_empty() {
            prefill = start.elapsed();
        }
        let next = match (&options.decoding, rng.as_mut()) {
            (Decoding::Sample { temperature, top_k, top_p, .. }, Some(g)) => {
                sample(&logits, *temperature, *top_k, *top_p, g)
            }
            _ => argmax(&logits),
        };
        out.push(next);
        if options.eos_token_ids.contains(&next) {
            stopped = true;
            break;
        }
        next_input = i64::from(next);
    }
    let decode = start.elapsed().saturating_sub(prefill);
    Ok(Generated { ids: out, stopped_at_eos: stopped, prefill, decode, cache_bytes: cache.nbytes() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loss_skips_ignored_labels() {
        let cpu = ferrite_tensor::Device::Cpu;
        let logits = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 0.0, 5.0, -5.0], &[1, 2, 3], &cpu).unwrap();
        let labels = Tensor::from_vec(vec![2i64, -100], &[1, 2], &cpu).unwrap();
        let got: f64 = seq2seq_loss(&logits, &labels).unwrap().item().unwrap();
        let want = -(2.0f64.exp() / (1.0 + 1.0f64.exp() + 2.0f64.exp())).ln();
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        assert_eq!(scored_labels(&labels).unwrap(), 1);
        let bad = Tensor::from_vec(vec![2i64], &[1, 1], &cpu).unwrap();
        assert!(seq2seq_loss(&logits, &bad).is_err());
    }
}
