//! ferrite's training loop as a library: what makes a run good — the optimizer step with
//! accumulation, f16 loss scaling and clipping, the per-epoch memory line, resumable checkpoints,
//! Prometheus/JSON-lines metrics, the progress bar, out-of-memory reports with the planner's
//! remedies, averaging over MPI ranks — for any model and any data.
//!
//! Why a crate: the `ferrite` command is one user of it; a Rust program that defines its own
//! model is another, and must not have to rewrite any of this. It sits above the planner (it asks
//! it for a batch size and for remedies) and below the command line (nn/io ← models ← plan ←
//! train ← cli).

pub mod causal_lm;
pub mod distributed;
mod epoch_meter;
mod error;
mod lm_evaluation;
mod metrics;
pub mod observe;
pub mod planned;
mod replicas;
pub mod resume;
pub mod seq2seq;
pub mod sharded;
mod start_observer;
mod stepper;
mod trainer;

pub use causal_lm::{CausalLmStep, evaluate_causal_lm};
pub use distributed::{Distributed, EvalShare, StepSync, StreamShare, ValidationShare};
pub use epoch_meter::{EpochMeter, seconds};
pub use error::{During, Hint, TrainError};
pub use ferrite_parallel::OwnerPolicy;
pub use ferrite_plan::AmpMode;
pub use lm_evaluation::LmEvaluation;
pub use metrics::{Goal, Metrics};
pub use planned::PlanContext;
pub use resume::TrainingState;
pub use seq2seq::{Seq2SeqStep, evaluate_seq2seq};
pub use start_observer::start_observer;
pub use stepper::{LossScale, Resumed, Stepper, restore_plain};
pub use trainer::{EpochSummary, FitReport, StepInfo, StepOutput, TrainStep, Trainer, TrainerBuilder};
