//! Causal language modelling with any ferrite model that maps token ids `[b, s]` to logits
//! `[b, s, vocab]` (a Hugging Face [`ferrite_models::Decoder`], a user's own): the training step
//! the [`crate::Trainer`] runs, and the evaluation `ferrite eval` reports.
//!
//! Both use [`ferrite_models::causal_lm_loss`], transformers' `ForCausalLMLoss` with
//! `labels = input_ids`, over batches of whole blocks ([`ferrite_data::TokenBlocks`]), so a loss
//! printed here is the number `model(block, labels=block).loss` gives in transformers. A loss is
//! a mean over *predicted positions* (`b·(s−1)` per batch), and the epoch and evaluation means
//! weight every batch by them, so a smaller last batch counts for what it holds.
use ferrite_nn::Module;
use ferrite_tensor::{Tensor, no_grad};

use crate::{StepOutput, TrainError, TrainStep};

/// The training step of causal-LM fine-tuning: a batch `(input_ids, labels)` (the same blocks
/// twice, as [`ferrite_data::TokenBlocks`] yields them), the shifted cross-entropy.
#[derive(Debug, Clone, Copy, Default)]
pub struct CausalLmStep;

impl<M: Module + ?Sized> TrainStep<M, (Tensor, Tensor)> for CausalLmStep {
    fn step(&mut self, model: &M, (ids, labels): &(Tensor, Tensor)) -> Result<StepOutput, TrainError> {
        let logits = model.forward(ids)?;
        let loss = ferrite_models::causal_lm_loss(&logits, labels)?;
        Ok(StepOutput::new(loss, predicted_positions(labels)))
    }
}

/// Positions a batch of labels `[b, s]` predicts: `b·(s−1)`.
pub fn predicted_positions(labels: &Tensor) -> usize {
    match labels.shape() {
        [b, s] => b * s.saturating_sub(1),
        _ => 0,
    }
}

/// The loss of a model over every batch of a loader.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LmEvaluation {
    /// Mean cross-entropy (nats) over every predicted position.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Positions predicted (`blocks × (seq − 1)`).
    pub predicted: usize,
    /// Batches read.
    pub batches: usize,
}

/// The mean causal-LM loss of `model` over `batches` (`(input_ids, labels)` pairs), without
/// gradients and in eval mode (restored afterwards).
pub fn evaluate_causal_lm<M, I>(model: &mut M, batches: I) -> Result<LmEvaluation, TrainError>
where
    M: Module + ?Sized,
    I: IntoIterator<Item = Result<(Tensor, Tensor), ferrite_data::DataError>>,
{
    let was_training = model.is_training();
    model.eval();
    let result = (|| {
        let _g = no_grad();
        let (mut sum, mut predicted, mut count) = (0.0f64, 0usize, 0usize);
        for batch in batches {
            let (ids, labels) = batch?;
            let n = predicted_positions(&labels);
            let loss = ferrite_models::causal_lm_loss(&model.forward(&ids)?, &labels)?.item()?;
            sum += loss * n as f64;
            predicted += n;
            count += 1;
        }
        let loss = sum / predicted.max(1) as f64;
        Ok(LmEvaluation { loss, perplexity: loss.exp(), predicted, batches: count })
    })();
    model.train(was_training);
    result
}
