//! What the planner runs: a model, its batch and its loss, behind one trait, plus the settings
//! of the training step (batch, precision, checkpointing, optimizer, accumulation).
//!
//! Why a trait: the built-in trainers' models live in the `ferrite` command and a Hugging Face
//! config is built here; the planner must run each of them through the *same* step code on
//! `meta` (to predict) and on `sim` (to measure), so the step is written once, in
//! [`crate::step`], and the model only says how it is built and fed.
use ferrite_nn::Module;
use ferrite_tensor::{DType, Device, Tensor};
use serde::Serialize;

use crate::PlanError;

/// Mixed precision of the step (`--amp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AmpMode {
    Bf16,
    F16,
}

impl AmpMode {
    pub fn dtype(self) -> DType {
        match self {
            AmpMode::Bf16 => DType::BF16,
            AmpMode::F16 => DType::F16,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            AmpMode::Bf16 => "bf16",
            AmpMode::F16 => "f16",
        }
    }
}

/// The optimizer of the step; its lazily created state is part of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    /// AdamW (two f32 moments per parameter): the trainer's optimizer.
    Adamw,
    /// Adam (same state as AdamW).
    Adam,
    /// SGD with momentum (one buffer per parameter).
    Sgd,
    /// SGD without momentum (no state).
    SgdPlain,
}

impl OptimizerKind {
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Adamw => "adamw",
            OptimizerKind::Adam => "adam",
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::SgdPlain => "sgd-plain",
        }
    }
}

/// Settings of one training step that change its memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepConfig {
    /// Micro-batch: samples in memory at once.
    pub batch: usize,
    /// Micro-batches per optimizer step (gradient accumulation).
    pub accum_steps: usize,
    pub amp: Option<AmpMode>,
    pub checkpoint_activations: bool,
    pub optimizer: OptimizerKind,
}

impl StepConfig {
    /// Batch `batch`, no accumulation, f32, no checkpointing, AdamW.
    pub fn new(batch: usize) -> StepConfig {
        StepConfig { batch, accum_steps: 1, amp: None, checkpoint_activations: false, optimizer: OptimizerKind::Adamw }
    }

    pub(crate) fn check(&self) -> Result<(), PlanError> {
        if self.batch == 0 {
            return Err(PlanError::setting("--batch 0", "the micro-batch must hold at least one sample"));
        }
        if self.accum_steps == 0 {
            return Err(PlanError::setting("--accum-steps 0", "at least one micro-batch per optimizer step"));
        }
        Ok(())
    }
}

/// A model the planner can run: how it is built on a device, what a batch is, and its loss.
pub trait Workload: Send + Sync {
    /// One line naming the model and its shape, e.g. `transformer 12x768, 12 heads, seq 1024`.
    fn describe(&self) -> String;
    /// The model on `device` (parameters allocated there), honouring
    /// `config.checkpoint_activations`.
    fn build(&self, config: &StepConfig, device: &Device) -> Result<Box<dyn Module>, PlanError>;
    /// One micro-batch on `device`: (input, target).
    fn batch(&self, config: &StepConfig, device: &Device) -> Result<(Tensor, Tensor), PlanError>;
    /// Forward and loss (autocast is already on when the step uses AMP). Returns the loss and
    /// whatever else the trainer keeps alive until the step ends (e.g. logits for accuracy).
    fn loss(&self, model: &dyn Module, input: &Tensor, target: &Tensor) -> Result<(Tensor, Vec<Tensor>), PlanError>;
}
