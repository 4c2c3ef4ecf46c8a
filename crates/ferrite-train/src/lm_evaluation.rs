//! The loss of a language model over a whole loader, as `ferrite eval` and the trainers'
//! validation report it: every batch's mean loss weighted by the positions it scores, so the
//! result is the mean over every scored position of the data whatever the batch size (a smaller
//! last batch counts for what it holds).
//!
//! Why one loop: causal-LM and sequence-to-sequence evaluation differ only in their loss and in
//! what a batch scores (`b·(s−1)` shifted positions, or the target tokens that are not −100);
//! eval mode, `no_grad` and the weighting are the same and live here once.
use ferrite_nn::Module;
use ferrite_tensor::{Tensor, no_grad};

use crate::TrainError;

/// The loss of a model over every batch of a loader.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LmEvaluation {
    /// Mean cross-entropy (nats) over every scored position.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Positions scored: `blocks × (seq − 1)` for a causal LM, target tokens for seq2seq.
    pub predicted: usize,
    /// Batches read.
    pub batches: usize,
}

/// The mean of `loss(model(ids), labels)` over the `(ids, labels)` batches, each weighted by
/// `scored(labels)`, without gradients and in eval mode (restored afterwards). A batch that scores
/// nothing adds nothing (its mean loss is undefined).
pub(crate) fn evaluate_scored<M, I>(
    model: &mut M,
    batches: I,
    loss: impl Fn(&Tensor, &Tensor) -> Result<Tensor, TrainError>,
    scored: impl Fn(&Tensor) -> Result<usize, TrainError>,
) -> Result<LmEvaluation, TrainError>
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
            let n = scored(&labels)?;
            let l = loss(&model.forward(&ids)?, &labels)?.item()?;
            if n > 0 {
                sum += l * n as f64;
            }
            predicted += n;
            count += 1;
        }
        let loss = sum / predicted.max(1) as f64;
        Ok(LmEvaluation { loss, perplexity: loss.exp(), predicted, batches: count })
    })();
    model.train(was_training);
    result
}
