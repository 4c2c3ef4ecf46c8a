//! Image classification: the MLP and the CNN on digits, Fashion-MNIST or the user's own data (an
//! image folder, or a CSV table for the MLP; see [`image_data`](super::image_data)), with test
//! accuracy and the allocator's figures after every epoch.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ferrite_data::{DataLoader, DistributedSampler, ImageCollate, Tensors};
use ferrite_memory::{allocator, format_size};
use ferrite_models::{CnnSpec, MlpSpec, build_cnn, build_mlp};
use ferrite_nn::{CrossEntropyLoss, Module, RngHandle, inference};
use ferrite_optim::{Adam, AdamConfig};
use ferrite_tensor::{Device, Generator, Tensor};
use ferrite_train::distributed::{Distributed, EvalShare};
use ferrite_train::{Metrics, StepOutput, seconds, start_observer};

use super::image_data::{self, ImageData, Samples};
use super::settings::{describe_settings, run_settings, trainer_for};
use super::{During, Hint, ModelKind, TrainArgs, TrainError};

type ImageLoader = DataLoader<Samples, Tensors<ImageCollate>>;

/// Trains `args.model` (an image model) on the data the flags name (`--dataset` or `--data`).
pub fn train(args: &TrainArgs, device: &Device, dist: Option<&Distributed>) -> Result<(), TrainError> {
    // ---- data
    let data = image_data::load(args)?;
    if data.tabular && args.model != ModelKind::Mlp {
        return Err(TrainError::InvalidArgument {
            flag: "model",
            value: args.model.name().to_string(),
            expected: "mlp for a CSV table (the CNN needs images)",
        });
    }
    let ImageData { name, train: train_set, test: test_set, sample_shape, classes, notes, metadata, .. } = data;
    let epochs = args.epochs.unwrap_or(data.default_epochs);
    let inputs = sample_shape.iter().product::<usize>();
    let (train_len, test_len) = (train_set.len(), test_set.len());
    let loader = |set: &Samples, batch: usize| {
        DataLoader::builder(Arc::clone(set)).batch_size(batch).collate(Tensors(ImageCollate::new(sample_shape)))
    };
    let mut seeds = Generator::new(args.seed);
    let loader_seed = seeds.next_u64();
    let sampler = match dist {
        Some(d) => Some(DistributedSampler::new(d.world_size(), d.rank())?.seed(loader_seed)),
        None => None,
    };
    let mut train_loader = {
        let b = loader(&train_set, args.batch_size).seed(loader_seed).num_workers(args.workers);
        // Distributed: this rank's share, the same permutation on every rank (seeded alike).
        let b = match (dist, &sampler) {
            (Some(_), Some(s)) => b.sampler(s.clone()),
            _ => b.shuffle(true),
        };
        if *device == Device::Cpu { b.build()? } else { b.stage_to(device.clone()).build()? }
    };
    let mut test_loader = {
        // Evaluation batches are the training micro-batch: without a graph they need less than a
        // training step, so they fit in the blocks training reserved (reserved memory stays flat;
        // batches of 500 used to grow it by their own blocks after the first evaluation).
        let b = loader(&test_set, args.batch_size).num_workers(args.workers);
        // Distributed: each rank evaluates its share; `evaluate` sums the counts over the ranks.
        let b = match dist {
            Some(d) => b.sampler(EvalShare::new(d.world_size(), d.rank())),
            None => b,
        };
        if *device == Device::Cpu { b.build()? } else { b.stage_to(device.clone()).build()? }
    };

    // ---- model, optimizer, scaler
    let (hidden, layers) = (args.hidden(), args.layers());
    let spec = match args.model {
        ModelKind::Mlp => ImageSpec::Mlp(MlpSpec {
            inputs,
            hidden,
            layers,
            classes,
            dropout: args.shape.dropout,
            checkpoint_activations: args.checkpoint_activations,
        }),
        ModelKind::Cnn => {
            let max = CnnSpec::max_layers(sample_shape);
            if layers > max {
                return Err(TrainError::InvalidArgument {
                    flag: "layers",
                    value: layers.to_string(),
                    expected: "at most the number of 2x2 poolings the images allow (3 for 8x8 digits, 4 for 28x28 Fashion-MNIST)",
                });
            }
            ImageSpec::Cnn(CnnSpec {
                input: sample_shape,
                hidden,
                layers,
                classes,
                checkpoint_activations: args.checkpoint_activations,
            })
        }
        other => return Err(not_an_image_model(other)),
    };
    let Some(num_parameters) = spec.num_parameters().filter(|n| n.checked_mul(16).is_some()) else {
        return Err(TrainError::InvalidArgument {
            flag: "hidden",
            value: hidden.to_string(),
            expected: "too large: the model's size does not fit in 64 bits",
        });
    };
    let param_bytes = num_parameters * 4;
    // Weights, their gradients and AdamW's two moments, all f32 (autocast keeps master weights
    // in f32): the floor of training memory before any activation.
    let state_bytes = 4 * param_bytes;
    let (model_name, banner) = match &spec {
        ImageSpec::Mlp(_) => {
            let widths = vec![hidden.to_string(); layers].join("-");
            (format!("mlp {inputs}-{widths}-{classes}"), format!("MLP {inputs}-{widths}-{classes}"))
        }
        ImageSpec::Cnn(c) => (c.describe().to_lowercase(), c.describe()),
    };
    println!("ferrite train: {name} ({train_len} train / {test_len} test), {banner} on {device}");
    for note in &notes {
        println!("  {note}");
    }
    println!(
        "  {} parameters: weights {}, with gradients and AdamW moments {} before activations",
        num_parameters,
        format_size(param_bytes),
        format_size(state_bytes),
    );
    println!("  {}", describe_settings(args));
    // Outputs for watching the run (metrics endpoint, JSON lines) start before the model is
    // built, so a port in use or an unwritable file fails the run before any real work.
    let run = start_observer(&args.observe.settings(), model_name, &name, device)?;
    let dropout_rng = RngHandle::new(seeds.next_u64());
    let mut init = Generator::new(seeds.next_u64());
    let too_big = Hint::OutOfMemory(format!(
        "\nThe model alone does not fit: its weights need {}, and training them needs about {} (weights, gradients, AdamW moments) before any activation. Batch size, accumulation and checkpointing cannot help with that; use a smaller --hidden/--layers or a device with more memory (`ferrite memory gpus`).",
        format_size(param_bytes),
        format_size(state_bytes)
    ));
    let built: ferrite_nn::Result<Box<dyn Module>> =
        ferrite_nn::with_parameter_dtype(super::params_dtype(args), || match &spec {
            ImageSpec::Mlp(m) => build_mlp(m, device, &mut init, &dropout_rng).map(|m| Box::new(m) as Box<dyn Module>),
            ImageSpec::Cnn(c) => build_cnn(c, device, &mut init).map(|m| Box::new(m) as Box<dyn Module>),
        });
    let mut model = built.during_hint("building the model", device, too_big)?;
    super::zero_params_dtype(args, &mut *model)?;
    // Distributed: rank 0's weights are broadcast now, and gradients are averaged in backward.
    // With --zero: AdamW over this rank's shards only, and gradients sharded at stage 2.
    let sync = match args.zero {
        Some(stage) => {
            dist.map(|d| d.zero_for(&*model, stage, args.zero_comm_dtype.unwrap_or_default())).transpose()?
        }
        None => dist.map(|d| d.sync_for(&*model)).transpose()?,
    };
    let opt = Adam::named(model.named_parameters(), AdamConfig::adamw(args.lr).weight_decay(args.weight_decay))?;
    let opt: Box<dyn ferrite_optim::Optimizer> = match &sync {
        Some(s) => s.optimizer(opt)?,
        None => Box::new(opt),
    };
    let mut specific = vec![("hidden".to_string(), hidden.to_string()), ("layers".to_string(), layers.to_string())];
    specific.extend(data.settings);
    let mut trainer = trainer_for(args, model, opt, device, epochs, run_settings(args, &name, specific))
        .dropout_rng(dropout_rng)
        .run_observer(run)
        .rank0(dist.is_none_or(|d| d.rank() == 0))
        .on_epoch_start(|epoch| {
            if let Some(s) = &sampler {
                s.set_epoch(epoch as u64);
            }
        })
        // Evaluation (no graph, training-sized batches) comes after the memory figures of the
        // training pass.
        .evaluate(|m| Ok(Metrics::new().with("accuracy", evaluate(m, &mut test_loader, dist)?)))
        .on_epoch(|e| {
            println!(
                "epoch {:>3}/{}  loss {:.4}  train acc {:5.2}%  test acc {:5.2}%  | {}  | {}",
                e.epoch,
                e.epochs,
                e.mean_loss,
                100.0 * e.train_mean("correct").unwrap_or(0.0),
                100.0 * e.eval.get("accuracy").unwrap_or(f64::NAN),
                e.memory_line,
                seconds(e.elapsed.as_secs_f64()),
            )
        });
    if let Some(sync) = sync {
        trainer = trainer.gradient_sync(sync);
    }
    let mut trainer = trainer.build()?;

    // ---- training
    let start = Instant::now();
    let loss_fn = CrossEntropyLoss::new();
    // The trainer's model is the boxed model chosen above.
    #[allow(clippy::borrowed_box)]
    let report = trainer.fit(&mut train_loader, |m: &Box<dyn Module>, (x, y): &(Tensor, Tensor)| {
        let logits = m.forward(x)?;
        let loss = loss_fn.forward(&logits, y)?;
        let (logits, y) = (logits.clone(), y.clone());
        // The accuracy is read after the step, as the planner models it (logits kept until then).
        Ok(StepOutput::new(loss, y.numel())
            .after_step(move || Ok(vec![("correct".to_string(), count_correct(&logits, &y)? as f64)])))
    })?;
    let sync = trainer.take_gradient_sync();
    // ZeRO-3: the model whole again before it is evaluated or saved.
    if let Some(s) = &sync {
        s.gather_whole_model()?;
    }
    if let Some(note) = &report.checkpoint_not_written {
        println!("{note}");
    }
    let run = trainer.take_run_observer();
    let mut model = trainer.into_model();
    let mut test_accuracy = report.epochs.last().and_then(|e| e.eval.get("accuracy")).unwrap_or(f64::NAN);
    let first_epoch = report.resumed_epochs;
    if first_epoch >= epochs {
        test_accuracy = evaluate(&mut model, &mut test_loader, dist).during("evaluation", device)?;
    }

    // ---- results
    let weights =
        args.out.clone().unwrap_or_else(|| PathBuf::from(format!("ferrite-{name}-{}.safetensors", args.model.name())));
    let sd = model.state_dict();
    if dist.is_none_or(|d| d.rank() == 0) {
        // Own data: the class names and the input normalisation travel with the weights.
        ferrite_io::save_state_dict_with_metadata(&weights, sd.iter(), &metadata)?;
    }
    let run_epochs = epochs.saturating_sub(first_epoch);
    println!(
        "test accuracy {:.2}% after {epochs} epochs ({run_epochs} run here, {:.1}s); weights written to {}",
        100.0 * test_accuracy,
        start.elapsed().as_secs_f64(),
        weights.display()
    );
    println!("{}", allocator(device).memory_summary(true));
    if let Some(d) = dist {
        d.finish_and_report(sync, device)?;
    }
    if let Some(run) = run {
        run.finish();
    }
    Ok(())
}

/// The image models' shapes.
enum ImageSpec {
    Mlp(MlpSpec),
    Cnn(CnnSpec),
}

impl ImageSpec {
    fn num_parameters(&self) -> Option<u64> {
        match self {
            ImageSpec::Mlp(m) => m.num_parameters(),
            ImageSpec::Cnn(c) => c.num_parameters(),
        }
    }
}

/// The dispatcher sends only image models here.
fn not_an_image_model(kind: ModelKind) -> TrainError {
    TrainError::InvalidArgument { flag: "model", value: kind.name().to_string(), expected: "an image model (mlp, cnn)" }
}

fn count_correct(logits: &Tensor, y: &Tensor) -> Result<usize, TrainError> {
    let hits = logits.argmax(1, false)?.eq(y)?.to_vec_bool()?;
    Ok(hits.into_iter().filter(|h| *h).count())
}

/// Test accuracy. Distributed, the loader holds this rank's share and the counts are summed over
/// the ranks, so every rank reports the whole test set's accuracy.
fn evaluate(model: &mut dyn Module, loader: &mut ImageLoader, dist: Option<&Distributed>) -> Result<f64, TrainError> {
    let local = count_test(model, loader);
    let (correct, seen) = match dist {
        Some(d) => d.sum_counts(local)?,
        None => local?,
    };
    Ok(correct as f64 / seen.max(1) as f64)
}

/// `(correct, seen)` over what `loader` yields.
fn count_test(model: &mut dyn Module, loader: &mut ImageLoader) -> Result<(usize, usize), TrainError> {
    let (mut correct, mut seen) = (0usize, 0usize);
    for batch in loader {
        let (x, y) = batch?;
        let logits = inference(model, |m| m.forward(&x))?;
        correct += count_correct(&logits, &y)?;
        seen += y.numel();
        // Testing hook (FERRITE_FAULT_INJECT=at:eval): die mid-evaluation.
        ferrite_io::fault_point(ferrite_io::FaultPoint::Eval);
    }
    Ok((correct, seen))
}
