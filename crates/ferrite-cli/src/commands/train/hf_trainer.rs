//! What the decoder and the T5 fine-tuning runs of `train --hf-model` share: the split of the
//! data, the flag errors, and the trainer builder (AdamW over the trainable parameters on one
//! device, under DDP/ZeRO, or under DataParallel, with the learning-rate schedule).
//!
//! Why a file of its own: `hf.rs` hands T5 folders to `hf_t5.rs`, so what both use lives below
//! both, not in one of them.
use ferrite_nn::Module;
use ferrite_optim::{Adam, AdamConfig, CosineAnnealingLr, LrScheduler, Optimizer, warmup_cosine};
use ferrite_tensor::Device;
use ferrite_train::{OwnerPolicy, StepSync, Trainer, TrainerBuilder};

use super::{LrSchedule, TrainArgs, TrainError};
use crate::commands::lora_args;

/// Share of the blocks used for training; the rest is the validation set.
pub(super) const TRAIN_FRACTION: f64 = 0.9;

pub(super) fn invalid(flag: &'static str, value: impl ToString, expected: &'static str) -> TrainError {
    TrainError::InvalidArgument { flag, value: value.to_string(), expected }
}

/// The trainer of an HF fine-tuning run (decoder or T5): AdamW (`--lr`, `--weight-decay`) over
/// the model's parameters on one device — through `sync`'s optimizer under DDP or ZeRO — or, with
/// `devices`, made over each parameter's owner replica under DataParallel (sharded owners, as
/// `data_parallel.rs`); and the `--lr-schedule`, made over that optimizer when the trainer is
/// built (`scheduler_with`), so it is the same schedule on one device and on several.
pub(super) fn trainer_builder<'a, M: Module + Clone + 'static>(
    args: &TrainArgs,
    model: M,
    devices: Option<&[Device]>,
    sync: Option<&StepSync>,
    total_steps: u64,
) -> Result<TrainerBuilder<'a, M>, TrainError> {
    let config = AdamConfig::adamw(args.lr).weight_decay(args.weight_decay);
    let builder = match devices {
        Some(devices) => Trainer::builder_with(model, move |params| Adam::new(params, config))
            .data_parallel(devices, OwnerPolicy::Sharded),
        None => {
            // With LoRA only the adapters train: the frozen base gets no optimizer state.
            let adamw = Adam::named(lora_args::optimized_parameters(&model), config)?;
            let opt: Box<dyn Optimizer> = match sync {
                Some(s) => s.optimizer(adamw)?,
                None => Box::new(adamw),
            };
            Trainer::builder_boxed(model, opt)
        }
    };
    let warmup = args.warmup_steps;
    Ok(match args.lr_schedule {
        LrSchedule::Constant => builder,
        LrSchedule::Cosine if warmup == 0 => builder.scheduler_with(move |opt| {
            Ok(Box::new(CosineAnnealingLr::new(opt, total_steps.max(1) as i64, 0.0)?) as Box<dyn LrScheduler>)
        }),
        LrSchedule::Cosine => {
            if warmup as u64 >= total_steps {
                return Err(invalid(
                    "warmup-steps",
                    warmup,
                    "fewer than the run's optimizer steps (see the line above); lower it or train longer",
                ));
            }
            let start = 1.0 / warmup as f64;
            builder.scheduler_with(move |opt| {
                Ok(Box::new(warmup_cosine(opt, warmup as i64, total_steps as i64, start, 0.0)?) as Box<dyn LrScheduler>)
            })
        }
    })
}
