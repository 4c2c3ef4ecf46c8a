//! What `ferrite train`'s flags mean to the trainer library: the `Trainer` they configure, the
//! lines printed about them, and the settings a resume must not change.
use ferrite_nn::Module;
use ferrite_optim::Optimizer;
use ferrite_tensor::Device;
use ferrite_train::{Trainer, TrainerBuilder};

use super::{Amp, TrainArgs};

/// A trainer of `model` with `optimizer` set up as the flags ask (see [`configure`]).
pub fn trainer_for<'a, M: Module>(
    args: &TrainArgs,
    model: M,
    optimizer: Box<dyn Optimizer>,
    device: &Device,
    epochs: usize,
    settings: Vec<(String, String)>,
) -> TrainerBuilder<'a, M> {
    configure(args, Trainer::builder_boxed(model, optimizer), device, epochs, settings)
}

/// `builder` set up as the flags ask: epochs, accumulation, precision, clipping, progress bar,
/// checkpoint and resume (the resumed checkpoint is announced on stdout), and `settings` (what a
/// resume must not change, from [`run_settings`]).
pub fn configure<'a, M: Module>(
    args: &TrainArgs,
    builder: TrainerBuilder<'a, M>,
    device: &Device,
    epochs: usize,
    settings: Vec<(String, String)>,
) -> TrainerBuilder<'a, M> {
    let mut b = builder
        .device(device.clone())
        .epochs(epochs)
        .accum_steps(args.accum_steps)
        .amp(args.amp.map(Amp::mode))
        .progress(!args.no_progress)
        .on_resume(|resumed| println!("{resumed}"));
    if let Some(c) = args.clip_grad_norm {
        b = b.clip_grad_norm(c);
    }
    if let Some(p) = &args.save_checkpoint {
        b = b.save_checkpoint(p);
    }
    if let Some(p) = &args.resume {
        b = b.resume(p);
    }
    for (name, value) in settings {
        b = b.setting(name, value);
    }
    b
}

/// The settings line every trainer prints under its model line.
pub fn describe_settings(args: &TrainArgs) -> String {
    format!(
        "batch {} x {} accumulation = {} per step, {}, {}, AdamW lr {} wd {}{}, seed {}, {} workers",
        args.batch_size,
        args.accum_steps,
        args.batch_size.saturating_mul(args.accum_steps),
        args.amp.map_or("f32".to_string(), |a| format!("autocast {}", a.name())),
        if args.checkpoint_activations { "activation checkpointing" } else { "activations kept" },
        args.lr,
        args.weight_decay,
        args.zero.map_or(String::new(), |z| format!(" (ZeRO-{z}: sharded over the ranks)")),
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
