//! The lines `ferrite train` prints about its settings, and the settings a resume must not change.
use super::{Amp, TrainArgs};

/// The settings line every trainer prints under its model line.
pub fn describe_settings(args: &TrainArgs) -> String {
    format!(
        "batch {} x {} accumulation = {} per step, {}, {}, AdamW lr {} wd {}, seed {}, {} workers",
        args.batch_size,
        args.accum_steps,
        args.batch_size.saturating_mul(args.accum_steps),
        args.amp.map_or("f32".to_string(), |a| format!("autocast {}", a.name())),
        if args.checkpoint_activations { "activation checkpointing" } else { "activations kept" },
        args.lr,
        args.weight_decay,
        args.seed,
        args.workers,
    )
}

/// The settings a resume must not change: the model, the data, the model's own shape
/// (`specific`, e.g. `hidden`, `layers`) and the training settings.
pub fn run_settings(args: &TrainArgs, dataset: &str, specific: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut settings: Vec<(String, String)> =
        vec![("model".into(), args.model.name().into()), ("dataset".into(), dataset.into())];
    settings.extend(specific);
    settings.extend([
        ("dropout".into(), args.shape.dropout.to_string()),
        ("batch-size".into(), args.batch_size.to_string()),
        ("accum-steps".into(), args.accum_steps.to_string()),
        ("amp".into(), args.amp.map_or("none", Amp::name).into()),
        ("seed".into(), args.seed.to_string()),
        ("lr".into(), args.lr.to_string()),
        ("weight-decay".into(), args.weight_decay.to_string()),
        ("train-subset".into(), args.train_subset.map_or("all".into(), |n| n.to_string())),
    ]);
    settings
}

/// AdamW over `model`'s named parameters with the run's rate and decay, stepped with its
/// accumulation, precision and clipping.
pub fn adamw_stepper(
    model: &dyn ferrite_nn::Module,
    args: &TrainArgs,
) -> Result<ferrite_train::Stepper, ferrite_train::TrainError> {
    let opt = ferrite_optim::Adam::named(
        model.named_parameters(),
        ferrite_optim::AdamConfig::adamw(args.lr).weight_decay(args.weight_decay),
    )?;
    ferrite_train::Stepper::new(Box::new(opt), args.accum_steps, args.amp.map(Amp::mode), args.clip_grad_norm)
}
