//! Optimizers, gradient clipping, learning-rate schedules, dynamic loss scaling and gradient
//! accumulation for ferrite — with PyTorch's exact update rules, so a recipe (and a checkpoint)
//! carries over from PyTorch unchanged.
//!
//! - [`Sgd`], [`Adam`] (and AdamW via [`AdamConfig::adamw`]), [`Rmsprop`] and [`Adagrad`] over
//!   parameter groups, all through the [`Optimizer`] trait; state in PyTorch's `state_dict`
//!   structure ([`OptimizerState`]).
//! - [`clip_grad_norm_`] / [`clip_grad_value_`].
//! - [`lr_scheduler`]: [`StepLr`], [`CosineAnnealingLr`], [`LinearLr`], [`SequentialLr`] and the
//!   usual [`warmup_cosine`] combination, with PyTorch's chainable formulas; [`OneCycleLr`],
//!   [`CosineAnnealingWarmRestarts`] and [`ReduceLrOnPlateau`].
//! - [`GradScaler`]: dynamic loss scaling for f16/bf16 training (PyTorch's state machine).
//! - [`Accumulator`]: gradient accumulation over micro-batches in one line.
//!
//! Optimizer state lives on each parameter's device and is counted by its allocator: Adam's
//! two moments are visible in `memory_allocated()` like any tensor.
//!
//! ```
//! use ferrite_optim::{clip_grad_norm_, Adam, AdamConfig, Optimizer, StepLr, LrScheduler};
//! use ferrite_tensor::{Device, Tensor};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let w = Tensor::from_vec(vec![0.5f32; 4], &[2, 2], &Device::Cpu)?.requires_grad_(true)?;
//! let mut opt = Adam::new(vec![w.clone()], AdamConfig::adamw(1e-2))?;
//! let mut sched = StepLr::new(&mut opt, 10, 0.5)?;
//! for _ in 0..3 {
//!     let loss = w.square()?.sum()?;
//!     loss.backward()?;
//!     clip_grad_norm_(&opt.params(), 1.0)?;
//!     opt.step()?;
//!     opt.zero_grad()?;
//!     sched.step(&mut opt)?;
//! }
//! # Ok(()) }
//! ```

// `!(x >= 0.0)` is how the validators reject NaN along with negative values.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

mod accumulation;
mod adagrad;
mod adam;
mod clip_grad;
mod config_setters;
mod data_parallel_layout;
mod error;
mod grad_scaler;
pub mod lr_scheduler;
mod optimizer;
mod rmsprop;
mod sgd;
pub mod state_dict;
mod update_target;
mod zero3_units;

pub use accumulation::Accumulator;
pub use adagrad::{Adagrad, AdagradConfig, AdagradRule, AdagradState};
pub use adam::{Adam, AdamConfig, AdamRule, AdamState};
pub use clip_grad::{clip_grad_norm_, clip_grad_norm_with, clip_grad_value_, clip_grads_with_norm_, get_total_norm};
pub use data_parallel_layout::{DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES, FlatPartition, ShardPiece, ddp_buckets};
pub use error::{OptimError, Result};
pub use grad_scaler::{GradScaler, GradScalerConfig, GradScalerState, OptState};
pub use lr_scheduler::{
    AnnealStrategy, CosineAnnealingLr, CosineAnnealingWarmRestarts, LinearLr, LrScheduler, OneCycleConfig, OneCycleLr,
    PlateauConfig, PlateauMode, ReduceLrOnPlateau, SchedulerState, SequentialLr, StepLr, ThresholdMode, warmup_cosine,
};
pub use optimizer::{GroupConfig, Optim, Optimizer, OptimizerId, ParamGroup, ParamState, UpdateRule};
pub use rmsprop::{Rmsprop, RmspropConfig, RmspropRule, RmspropState};
pub use sgd::{Sgd, SgdConfig, SgdRule, SgdState};
pub use state_dict::{GroupState, HyperValue, OptimizerState, StateValue};
pub use zero3_units::{zero3_unit_of, zero3_units};
