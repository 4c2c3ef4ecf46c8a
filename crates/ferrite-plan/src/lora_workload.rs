//! LoRA and a low-precision base in the planned step (issue 34 §2): any workload, its model
//! built in `--base-dtype` (under `ferrite_nn::with_parameter_dtype`, so no f32 copy exists
//! first) and wrapped by `ferrite_nn::apply_lora` exactly as `ferrite train --lora-rank` wraps
//! it, so the step on `meta` holds no gradient and no optimizer state for the frozen weights and
//! f32 adapters with their AdamW moments — the same bytes the run allocates.
//!
//! Why a wrapper and not a field of each workload: LoRA applies to any module tree by name, so
//! one wrapper serves the Hugging Face decoders, T5 and the built-in models alike.
use ferrite_nn::{LoraConfig, Module, apply_lora};
use ferrite_tensor::{DType, Device, Generator, Tensor};

use crate::PlanError;
use crate::workload::{StepConfig, Workload};

/// `inner` with its weights in `base_dtype` and LoRA adapters per `lora`.
pub struct LoraWorkload {
    inner: Box<dyn Workload>,
    pub lora: Option<LoraConfig>,
    pub base_dtype: Option<DType>,
}

/// `inner` planned with LoRA (`lora`) and/or its weights in `base_dtype` (`--base-dtype bf16`);
/// `inner` itself when both are `None`. The planner's hook for `--lora-rank`, `--lora-alpha`,
/// `--lora-targets` and `--base-dtype`.
pub fn with_lora(inner: Box<dyn Workload>, lora: Option<LoraConfig>, base_dtype: Option<DType>) -> Box<dyn Workload> {
    if lora.is_none() && base_dtype.is_none_or(|d| d == DType::F32) {
        return inner;
    }
    Box::new(LoraWorkload { inner, lora, base_dtype })
}

impl Workload for LoraWorkload {
    fn describe(&self) -> String {
        let mut s = self.inner.describe();
        if let Some(l) = &self.lora {
            s.push_str(&format!(", LoRA r={} alpha={} on {}", l.r, l.alpha, l.targets.names().join(",")));
        }
        if let Some(d) = self.base_dtype {
            s.push_str(&format!(", base weights {d}"));
        }
        s
    }

    fn build(&self, config: &StepConfig, device: &Device) -> Result<Box<dyn Module>, PlanError> {
        let build = || self.inner.build(config, device);
        // The base built in its dtype: a model whose f32 weights alone exceed the card is
        // planned with its bf16 weights only.
        let mut model = match self.base_dtype {
            Some(d) => {
                let mut m = ferrite_nn::with_parameter_dtype(d, build)?;
                // Buffers, and any parameter a layer makes without ferrite-nn's helpers.
                m.to_dtype(d)?;
                m
            }
            None => build()?,
        };
        if let Some(l) = &self.lora {
            apply_lora(&mut *model, l, &mut Generator::new(0))?;
        }
        Ok(model)
    }

    fn batch(&self, config: &StepConfig, device: &Device) -> Result<(Tensor, Tensor), PlanError> {
        self.inner.batch(config, device)
    }

    fn loss(&self, model: &dyn Module, input: &Tensor, target: &Tensor) -> Result<(Tensor, Vec<Tensor>), PlanError> {
        self.inner.loss(model, input, target)
    }
}
