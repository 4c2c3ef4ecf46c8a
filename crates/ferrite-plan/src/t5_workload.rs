//! T5 encoder-decoders (`ferrite_models::T5Model`) as planner workloads: `seq` tokens into the
//! encoder and `seq` into the decoder, the batch a Hugging Face training step holds, and its loss.
use ferrite_models::{T5Config, T5Model};
use ferrite_nn::Module;
use ferrite_tensor::{DType, Device, Tensor};

use crate::PlanError;
use crate::workload::{StepConfig, Workload};

/// A T5 model as a planner workload: `seq` tokens into the encoder and `seq` into the decoder.
#[derive(Debug, Clone)]
pub struct T5Workload {
    pub config: T5Config,
    pub seq: usize,
}

impl T5Workload {
    pub fn new(config: T5Config, seq: usize) -> Result<T5Workload, PlanError> {
        if seq == 0 {
            return Err(PlanError::setting("--seq 0", "at least one token per sample"));
        }
        Ok(T5Workload { config, seq })
    }

    /// The model on `device` as `ferrite train --hf-model` builds it before loading (no weights drawn).
    pub fn build_model(&self, device: &Device, checkpoint_activations: bool) -> Result<T5Model, PlanError> {
        // As `ferrite train --hf-model` builds it before loading (see `HfDecoder::build_model`).
        Ok(ferrite_nn::skip_init(|| T5Model::new(&self.config, device, checkpoint_activations))?)
    }
}

impl Workload for T5Workload {
    fn describe(&self) -> String {
        let c = &self.config;
        format!(
            "{} encoder-decoder {}+{} layers x {}, {} heads of {}, d_ff {} {}, vocab {}, seq {} (encoder) + {} (decoder){}",
            c.model_type,
            c.num_layers,
            c.num_decoder_layers,
            c.d_model,
            c.num_heads,
            c.d_kv,
            c.d_ff,
            c.feed_forward.name(),
            c.vocab_size,
            self.seq,
            self.seq,
            if c.tie_word_embeddings { ", tied embeddings" } else { "" }
        )
    }

    fn build(&self, config: &StepConfig, device: &Device) -> Result<Box<dyn Module>, PlanError> {
        Ok(Box::new(self.build_model(device, config.checkpoint_activations)?))
    }

    /// Input `[batch, 3, seq]`: the encoder's tokens, the decoder's (the labels shifted right
    /// with the start token, as HF's `_shift_right`) and the encoder's attention mask; target: the
    /// labels `[batch, seq]` — the batch `ferrite train --hf-model` feeds a T5
    /// (`ferrite_data::Seq2SeqExamples`), as a HF training step holds it.
    fn batch(&self, config: &StepConfig, device: &Device) -> Result<(Tensor, Tensor), PlanError> {
        Ok((
            Tensor::zeros(&[config.batch, 3, self.seq], DType::I64, device)?,
            Tensor::zeros(&[config.batch, self.seq], DType::I64, device)?,
        ))
    }

    fn loss(&self, model: &dyn Module, x: &Tensor, y: &Tensor) -> Result<(Tensor, Vec<Tensor>), PlanError> {
        // T5's loss over the labels that are not −100 (`ferrite_train::Seq2SeqStep`'s).
        Ok((ferrite_models::seq2seq_loss(&model.forward(x)?, y)?, Vec::new()))
    }
}
