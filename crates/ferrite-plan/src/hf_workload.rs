//! Hugging Face models (`ferrite_models::Decoder`, `ferrite_models::T5Model`) as planner
//! workloads: `seq` tokens per sample, a batch of token ids, the causal-LM loss; and
//! [`hf_workload`], which picks the family from a `config.json`.
use std::path::Path;

use ferrite_models::{Decoder, HfConfig, HfStyle, T5Config};
use ferrite_nn::{CrossEntropyLoss, Module};
use ferrite_tensor::{DType, Device, Tensor};
use serde_json::Value;

use crate::PlanError;
use crate::t5_workload::T5Workload;
use crate::workload::{StepConfig, Workload};

/// A Hugging Face decoder as a planner workload: `seq` tokens per sample.
#[derive(Debug, Clone)]
pub struct HfDecoder {
    pub config: HfConfig,
    pub seq: usize,
}

impl HfDecoder {
    pub fn new(config: HfConfig, seq: usize) -> Result<HfDecoder, PlanError> {
        if seq == 0 {
            return Err(PlanError::setting("--seq 0", "at least one token per sample"));
        }
        if config.style == HfStyle::Gpt2 && seq > config.max_positions {
            return Err(PlanError::setting(
                format!("--seq {seq}"),
                format!("the model has learned positions for {} tokens (`n_positions`)", config.max_positions),
            ));
        }
        Ok(HfDecoder { config, seq })
    }

    /// The model on `device` as `ferrite train --hf-model` builds it before loading the
    /// folder's weights: under `ferrite_nn::skip_init`, so no random weights are drawn (drawing
    /// them allocates temporaries the run never makes, and their cached blocks would change the
    /// planned reserved memory).
    pub fn build_model(&self, device: &Device, checkpoint_activations: bool) -> Result<Decoder, PlanError> {
        Ok(ferrite_nn::skip_init(|| Decoder::new(&self.config, device, checkpoint_activations))?)
    }
}

impl Workload for HfDecoder {
    fn describe(&self) -> String {
        let c = &self.config;
        format!(
            "{} ({} style) {}x{}, {} heads ({} kv), intermediate {}, vocab {}, seq {}{}",
            if c.model_type.is_empty() { "hf decoder" } else { &c.model_type },
            c.style.name().trim_end_matches(" style"),
            c.num_layers,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.intermediate_size,
            c.vocab_size,
            self.seq,
            if c.tie_word_embeddings { ", tied embeddings" } else { "" }
        )
    }

    fn build(&self, config: &StepConfig, device: &Device) -> Result<Box<dyn Module>, PlanError> {
        Ok(Box::new(self.build_model(device, config.checkpoint_activations)?))
    }

    fn batch(&self, config: &StepConfig, device: &Device) -> Result<(Tensor, Tensor), PlanError> {
        let shape = [config.batch, self.seq];
        Ok((Tensor::zeros(&shape, DType::I64, device)?, Tensor::zeros(&shape, DType::I64, device)?))
    }

    /// transformers' causal-LM loss, shifted (`ferrite_models::causal_lm_loss`): the step
    /// `ferrite train --hf-model` runs, so the plan is that run's.
    fn loss(&self, model: &dyn Module, x: &Tensor, y: &Tensor) -> Result<(Tensor, Vec<Tensor>), PlanError> {
        let logits = model.forward(x)?;
        if self.seq < 2 {
            let v = self.config.vocab_size as i64;
            return Ok((CrossEntropyLoss::new().forward(&logits.reshape(&[-1, v])?, &y.reshape(&[-1])?)?, Vec::new()));
        }
        Ok((ferrite_models::causal_lm_loss(&logits, y)?, Vec::new()))
    }
}

/// The planner workload of a Hugging Face `config.json`: a T5-style encoder-decoder when its
/// `model_type` is `t5` (see [`crate::T5Workload`]), a decoder-only model otherwise.
pub fn hf_workload(path: &Path, seq: usize) -> Result<Box<dyn Workload>, PlanError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| PlanError::HfConfig {
        path: name.clone(),
        problem: format!("cannot read it ({e}); pass the config.json of a Hugging Face model"),
    })?;
    let is_t5 =
        serde_json::from_str::<Value>(&text).ok().and_then(|v| v.as_object().map(T5Config::describes)).unwrap_or(false);
    if is_t5 {
        let cfg = T5Config::from_json(&text, &name)?;
        return Ok(Box::new(T5Workload::new(cfg, seq)?));
    }
    Ok(Box::new(HfDecoder::new(HfConfig::from_json(&text, &name)?, seq)?))
}
