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
use ferrite_tensor::Tensor;

use crate::lm_evaluation::{LmEvaluation, evaluate_scored};
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

/// The mean causal-LM loss of `model` over `batches` (`(input_ids, labels)` pairs), weighted by
/// predicted positions, without gradients and in eval mode (restored afterwards).
pub fn evaluate_causal_lm<M, I>(model: &mut M, batches: I) -> Result<LmEvaluation, TrainError>
where
    M: Module + ?Sized,
    I: IntoIterator<Item = Result<(Tensor, Tensor), ferrite_data::DataError>>,
{
    evaluate_scored(
        model,
        batches,
        |logits, labels| Ok(ferrite_models::causal_lm_loss(logits, labels)?),
        |labels| Ok(predicted_positions(labels)),
    )
}
