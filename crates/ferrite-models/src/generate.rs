//! Text generation with a [`Decoder`]: the prompt is read once into a key/value cache, then each
//! new token costs one position (transformers' `generate` with its `DynamicCache`).
//!
//! Decoding follows transformers' order of logits processors and warpers: greedy takes the
//! arg-max (the first on ties, as `torch.argmax`); sampling divides the logits by the
//! temperature, keeps the `top_k` largest, then the smallest set whose probability reaches
//! `top_p` (always at least one token), and draws from the softmax of what is left with a
//! seeded generator (ferrite's, so a seed gives the same text on every machine, though not the
//! text PyTorch's generator would draw). Generation stops after `max_new_tokens` or at an EOS id,
//! which is kept in the output as transformers keeps it.
use std::time::{Duration, Instant};

use ferrite_nn::Module;
use ferrite_tensor::{Generator, Tensor, no_grad};

use crate::{Decoder, ModelError};

/// How the next token is chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoding {
    /// The most likely token (transformers' `do_sample=False`).
    Greedy,
    /// A draw from the (warped) distribution.
    Sample { temperature: f64, top_k: Option<usize>, top_p: Option<f64>, seed: u64 },
}

/// What [`generate`] does.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub decoding: Decoding,
    /// Ids that end the text (`eos_token_id` of `generation_config.json` or `config.json`).
    pub eos_token_ids: Vec<u32>,
}

/// The new tokens and what they cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// The new token ids (the EOS id included when one ended the text).
    pub ids: Vec<u32>,
    pub stopped_at_eos: bool,
    /// Reading the prompt (the first new token's logits included).
    pub prefill: Duration,
    /// Every later token.
    pub decode: Duration,
    /// Bytes of the key/value cache at the end.
    pub cache_bytes: usize,
}

/// A prompt with at least one token and decoding settings that can work, or the typed error
/// naming the setting.
pub(crate) fn check_options(prompt: &[u32], options: &GenerateOptions) -> Result<(), ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::InvalidSetting {
            what: "prompt".into(),
            reason: "it has no tokens; generation needs at least one token to continue".into(),
        });
    }
    if let Decoding::Sample { temperature, top_k, top_p, .. } = &options.decoding {
        let bad = |what: &str, reason: String| Err(ModelError::InvalidSetting { what: what.into(), reason });
        if !(temperature.is_finite() && *temperature > 0.0) {
            return bad("temperature", format!("{temperature} is not a positive number (use greedy decoding for 0)"));
        }
        if *top_k == Some(0) {
            return bad("top-k", "0 keeps no token; give at least 1, or leave it unset".into());
        }
        if let Some(p) = top_p
            && !(*p > 0.0 && *p <= 1.0)
        {
            return bad("top-p", format!("{p} is not in (0, 1]"));
        }
    }
    Ok(())
}

/// Continues `prompt` (token ids, at least one) with `model` on the model's device (see the
/// module docs). The model is used as it is: put it in eval mode first if it has dropout.
pub fn generate(model: &Decoder, prompt: &[u32], options: &GenerateOptions) -> Result<Generated, ModelError> {
    check_options(prompt, options)?;
    let c = model.config();
    if c.style == crate::HfStyle::Gpt2 && prompt.len() + options.max_new_tokens > c.max_positions {
        return Err(ModelError::InvalidSetting {
            what: "max-new-tokens".into(),
            reason: format!(
                "a prompt of {} tokens plus {} new ones is longer than the model's {} learned positions (`n_positions`); ask for at most {} new tokens",
                prompt.len(),
                options.max_new_tokens,
                c.max_positions,
                c.max_positions.saturating_sub(prompt.len())
            ),
        });
    }
    let device = model.parameters().first().map(|p| p.device().clone()).unwrap_or(ferrite_tensor::Device::Cpu);
    let _g = no_grad();
    let mut cache = model.new_cache();
    let mut rng = match &options.decoding {
        Decoding::Sample { seed, .. } => Some(Generator::new(*seed)),
        Decoding::Greedy => None,
    };
    let mut out = Vec::with_capacity(options.max_new_tokens);
    let mut stopped = false;
    let start = Instant::now();
    let mut prefill = Duration::ZERO;
    let mut input: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
    while out.len() < options.max_new_tokens {
        let x = Tensor::from_vec(input.clone(), &[1, input.len()], &device)?;
        let logits = model.forward_with_cache(&x, &mut cache, true)?.reshape(&[-1])?.to_vec_f64()?;
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
        input = vec![i64::from(next)];
    }
    let decode = start.elapsed().saturating_sub(prefill);
    Ok(Generated { ids: out, stopped_at_eos: stopped, prefill, decode, cache_bytes: cache.nbytes() })
}

/// The index of the largest logit, the first on ties.
pub(crate) fn argmax(logits: &[f64]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// A draw after temperature, top-k and top-p (see the module docs).
pub(crate) fn sample(
    logits: &[f64],
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
    g: &mut Generator,
) -> u32 {
    let scaled: Vec<f64> = logits.iter().map(|l| l / temperature).collect();
    // Candidates by falling logit (stable: ties keep the lower id first).
    let mut order: Vec<usize> = (0..scaled.len()).collect();
    order.sort_by(|&a, &b| scaled[b].total_cmp(&scaled[a]));
    if let Some(k) = top_k {
        // As transformers' TopKLogitsWarper: every token tied with the k-th survives.
        let kth = scaled[order[k.min(order.len()) - 1]];
        order.retain(|&i| scaled[i] >= kth);
    }
    let max = scaled[order[0]];
    let mut probs: Vec<f64> = order.iter().map(|&i| (scaled[i] - max).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(p) = top_p {
        // TopPLogitsWarper: drop the least likely tokens whose cumulative probability (from the
        // least likely up) is at most 1 − p; the most likely token always stays.
        let mut keep = probs.len();
        let mut tail = 0.0;
        for j in (1..probs.len()).rev() {
            tail += probs[j];
            if tail <= 1.0 - p {
                keep = j;
            } else {
                break;
            }
        }
        order.truncate(keep);
        probs.truncate(keep);
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
    }
    let mut r = g.uniform_f64();
    for (j, q) in probs.iter().enumerate() {
        r -= q;
        if r <= 0.0 {
            return order[j] as u32;
        }
    }
    order[order.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.0, 2.0, 2.0, 1.0]), 1);
    }

    #[test]
    fn top_k_and_top_p_limit_the_draw() {
        let mut g = Generator::new(1);
        let logits = [5.0, 4.0, 0.0, -1.0];
        for _ in 0..200 {
            assert!(sample(&logits, 1.0, Some(2), None, &mut g) < 2);
            // p(0) ≈ 0.72: top-p 0.5 keeps only the most likely token.
            assert_eq!(sample(&logits, 1.0, None, Some(0.5), &mut g), 0);
        }
        // A tiny temperature is (almost) greedy; a draw is always a valid id.
        assert!((0..50).all(|_| sample(&logits, 1e-3, None, None, &mut g) == 0));
    }
}
