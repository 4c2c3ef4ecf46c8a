//! The seam between LoRA and the layers it adapts: a layer that can carry a low-rank adapter
//! (`Linear`, GPT-2's `Conv1D`) implements [`LoraHost`], and [`Module::lora_host_mut`] hands it out,
//! so LoRA's wrapping function finds adaptable layers in any module tree by name.
//!
//! Why a file of its own, with plain numbers only: `module.rs` names this trait, and the adapter
//! itself (`lora.rs`) is a module; keeping the trait free of both keeps the files without a circle.
//!
//! [`Module::lora_host_mut`]: crate::Module::lora_host_mut
use ferrite_tensor::{Generator, Tensor};

use crate::error::Result;
use crate::rng::RngHandle;

/// The numbers one adapter is built from (PEFT's `r`, `lora_alpha`, the scaling derived from
/// them, `lora_dropout`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraParams {
    /// The rank `r`: `A` is `[r, in]`, `B` is `[out, r]`.
    pub r: usize,
    /// `lora_alpha`, kept for the adapter's config file.
    pub alpha: f64,
    /// The factor the adapter's output is multiplied by: `alpha / r` (`alpha / √r` with rsLoRA).
    pub scaling: f64,
    /// Dropout probability on the adapter's input (training mode only).
    pub dropout: f64,
}

/// A layer `y = f(x; W)` linear in `x` that can carry a LoRA adapter: `y + scaling · B A x`.
pub trait LoraHost {
    /// `(in_features, out_features)` of the layer.
    fn lora_features(&self) -> (usize, usize);
    /// Builds and attaches a fresh adapter (PEFT's init: `A` Kaiming-uniform with a = √5, `B`
    /// zero, so the layer's output is unchanged until `B` trains), drawing from `g`.
    fn attach_lora(&mut self, params: &LoraParams, g: &mut Generator) -> Result<()>;
    /// The adapter's `A [r, in]` and `B [out, r]` weights, if one is attached.
    fn lora_factors(&self) -> Option<(&Tensor, &Tensor)>;
    /// The adapter's numbers, if one is attached.
    fn lora_params(&self) -> Option<LoraParams>;
    /// The adapter's dropout draws from `rng` from now on (a trainer's dropout generator, which
    /// its checkpoints save); no-op without an adapter.
    fn set_lora_rng(&mut self, rng: &RngHandle);
    /// Adds `scaling · B A` into the base weight (in the weight's layout and dtype) and removes
    /// the adapter; `false` when there was none.
    fn merge_lora(&mut self) -> Result<bool>;
}
