//! Sequence-to-sequence training and evaluation of a [`ferrite_models::T5Model`] (or any model
//! that reads `[b, 3, s]` ids — encoder tokens, decoder input, attention mask — and returns
//! logits `[b, s, vocab]`): the step the [`crate::Trainer`] runs for `ferrite train --hf-model`
//! on a T5 folder, and the loss `ferrite eval` reports.
//!
//! Both use [`ferrite_models::seq2seq_loss`], T5ForConditionalGeneration's loss over the labels
//! that are not −100, on the batches [`ferrite_data::Seq2SeqExamples`] makes. A batch's loss is a
//! mean over its *scored labels* (target tokens, padding excluded), and the epoch and evaluation
//! means weight each batch by them, so the reported loss is the mean over every target token of
//! the data, whatever the batch size.
use ferrite_nn::Module;
use ferrite_tensor::Tensor;

use crate::lm_evaluation::{LmEvaluation, evaluate_scored};
use crate::{StepOutput, TrainError, TrainStep};

/// The training step of sequence-to-sequence fine-tuning: a batch `(ids [b, 3, s], labels [b, s])`
/// as [`ferrite_data::Seq2SeqExamples`] yields it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seq2SeqStep;

impl<M: Module + ?Sized> TrainStep<M, (Tensor, Tensor)> for Seq2SeqStep {
    fn step(&mut self, model: &M, (ids, labels): &(Tensor, Tensor)) -> Result<StepOutput, TrainError> {
        let logits = model.forward(ids)?;
        let loss = ferrite_models::seq2seq_loss(&logits, labels)?;
        Ok(StepOutput::new(loss, ferrite_models::scored_labels(labels)?))
    }
}

/// The mean sequence-to-sequence loss of `model` over every target token of `batches`, without
/// gradients and in eval mode (restored afterwards). `predicted` counts the target tokens.
pub fn evaluate_seq2seq<M, I>(model: &mut M, batches: I) -> Result<LmEvaluation, TrainError>
where
    M: Module + ?Sized,
    I: IntoIterator<Item = Result<(Tensor, Tensor), ferrite_data::DataError>>,
{
    evaluate_scored(
        model,
        batches,
        |logits, labels| Ok(ferrite_models::seq2seq_loss(logits, labels)?),
        |labels| Ok(ferrite_models::scored_labels(labels)?),
    )
}
