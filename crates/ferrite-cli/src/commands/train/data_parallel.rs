//! `ferrite train --devices 0,1` (or `--data-parallel`): the image models trained with
//! `DataParallel` over several devices of one process — typically a simulated multi-GPU box,
//! `--device sim:a100-40gb --devices 0,1,2,3` — ending with every device's memory and every
//! device's share of the optimizer state, so the balance of the replicas is visible. The
//! parameters are sharded between the devices (`OwnerPolicy::Sharded`): each device owns an equal
//! run of them, with its gradients and AdamW state, so the devices stay balanced even when one
//! weight is most of the model (the default MLP's hidden layer).
//!
//! The training loop is the library's (`ferrite_train::Trainer` with its `data_parallel`
//! setting): the same model, loss (cross-entropy, mean) and optimizer (AdamW) as on one device,
//! with each batch scattered over the replicas, and accumulation, mixed precision, clipping,
//! checkpoints, resuming and the metrics outputs as on one device. Evaluation runs on the primary
//! device after each epoch's memory figures are taken.

use std::path::PathBuf;
use std::time::Instant;

use ferrite_data::{Dataset, DatasetKind, builtin_dataset};
use ferrite_memory::{Device, select_devices};
use ferrite_models::{CnnSpec, MlpSpec, build_cnn, build_mlp};
use ferrite_nn::{CrossEntropyLoss, Module, RngHandle};
use ferrite_optim::{Adam, AdamConfig, Optimizer, StateValue};
use ferrite_parallel::OwnerPolicy;
use ferrite_tensor::{Generator, Tensor, no_grad};
use ferrite_train::{Metrics, StepOutput, Trainer, start_observer};

use super::settings::{configure, run_settings};
use super::{ModelKind, TrainArgs, TrainError};

/// Whether this run asks for data parallelism.
pub fn requested(args: &TrainArgs) -> bool {
    args.devices.is_some() || args.data_parallel
}

/// Train an image model with DataParallel over the devices `--device` and `--devices` select.
pub fn train(args: &TrainArgs, base: &Device) -> Result<(), TrainError> {
    // `--data-parallel` alone uses the devices FERRITE_VISIBLE_DEVICES makes visible (or one).
    let devices = select_devices(base, args.devices.as_deref())?;
    let kind: DatasetKind = args.dataset.as_deref().unwrap_or("digits").parse()?;
    let epochs = args.epochs.unwrap_or(match kind {
        DatasetKind::Digits => 20,
        DatasetKind::FashionMnist => 5,
    });
    let splits = builtin_dataset(kind)?;
    let train_set = match args.train_subset {
        Some(n) => splits.train.take(n),
        None => splits.train,
    };
    let (inputs, classes, shape) = (train_set.num_features(), train_set.num_classes(), train_set.sample_shape());
    let (train_len, test_len) = (Dataset::len(&train_set), Dataset::len(&splits.test));
    let mut seeds = Generator::new(args.seed);
    let loader_seed = seeds.next_u64();
    // Batches stay on the host: DataParallel copies each replica's shard straight to its device.
    let mut train_loader =
        train_set.tensor_loader(args.batch_size).shuffle(true).seed(loader_seed).num_workers(args.workers).build()?;
    // Evaluation batches are the training micro-batch (see image.rs): reserved memory stays flat.
    let mut test_loader = splits.test.tensor_loader(args.batch_size).num_workers(args.workers).build()?;
    let dropout_rng = RngHandle::new(seeds.next_u64());
    let mut init = Generator::new(seeds.next_u64());
    let names: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    println!(
        "ferrite train: {kind} ({} train / {} test), {} with DataParallel on {} device(s): {}",
        train_len,
        test_len,
        args.model.name(),
        devices.len(),
        names.join(", ")
    );
    let (hidden, layers) = (args.hidden(), args.layers());
    match args.model {
        ModelKind::Mlp => {
            let spec = MlpSpec {
                inputs,
                hidden,
                layers,
                classes,
                dropout: args.shape.dropout,
                checkpoint_activations: args.checkpoint_activations,
            };
            let model = build_mlp(&spec, &Device::Cpu, &mut init, &dropout_rng)?;
            run(args, kind, epochs, model, &devices, &mut train_loader, &mut test_loader, dropout_rng)
        }
        ModelKind::Cnn => {
            let spec =
                CnnSpec { input: shape, hidden, layers, classes, checkpoint_activations: args.checkpoint_activations };
            let model = build_cnn(&spec, &Device::Cpu, &mut init)?;
            run(args, kind, epochs, model, &devices, &mut train_loader, &mut test_loader, dropout_rng)
        }
        other => Err(TrainError::InvalidArgument {
            flag: "model",
            value: other.name().to_string(),
            expected: "an image model (mlp, cnn) with --devices/--data-parallel; the language models train on one device",
        }),
    }
}

type Loader =
    ferrite_data::DataLoader<ferrite_data::ImageClassification, ferrite_data::Tensors<ferrite_data::ImageCollate>>;

#[allow(clippy::too_many_arguments)]
fn run<M: Module + Clone + 'static>(
    args: &TrainArgs,
    kind: DatasetKind,
    epochs: usize,
    model: M,
    devices: &[Device],
    train_loader: &mut Loader,
    test_loader: &mut Loader,
    dropout_rng: RngHandle,
) -> Result<(), TrainError> {
    let primary = devices[0].clone();
    let run = start_observer(&args.observe.settings(), args.model.name().to_string(), &kind.to_string(), &primary)?;
    let specific =
        vec![("hidden".to_string(), args.hidden().to_string()), ("layers".to_string(), args.layers().to_string())];
    let (lr, weight_decay) = (args.lr, args.weight_decay);
    // Sharded owners: every device holds an equal share of the AdamW state, whatever the model.
    let builder =
        Trainer::builder_with(model, move |params| Adam::new(params, AdamConfig::adamw(lr).weight_decay(weight_decay)))
            .data_parallel(devices, OwnerPolicy::Sharded);
    let mut trainer = configure(args, builder, &primary, epochs, run_settings(args, &kind.to_string(), specific))
        .dropout_rng(dropout_rng)
        .run_observer(run)
        .evaluate(|m| Ok(Metrics::new().with("accuracy", evaluate(m, test_loader, &primary)?)))
        .on_epoch(|e| {
            println!(
                "epoch {:>3}/{}  loss {:.4}  test acc {:5.2}%  | {} | {:.1}s",
                e.epoch,
                e.epochs,
                e.mean_loss,
                100.0 * e.eval.get("accuracy").unwrap_or(f64::NAN),
                e.replica_memory.as_ref().map_or_else(String::new, |m| m.peaks_line()),
                e.elapsed.as_secs_f64()
            );
        })
        .build()?;
    let loss_fn = CrossEntropyLoss::new();
    let start = Instant::now();
    let report = trainer.fit(train_loader, |m: &M, (x, y): &(Tensor, Tensor)| {
        Ok(StepOutput::new(loss_fn.forward(&m.forward(x)?, y)?, y.numel()))
    })?;
    if let Some(note) = &report.checkpoint_not_written {
        println!("{note}");
    }
    if let Some(run) = trainer.take_run_observer() {
        run.finish();
    }
    let Some(last) = report.epochs.last() else {
        // A resume from a checkpoint that already has every epoch: nothing was trained.
        return Ok(());
    };
    let accuracy = last.eval.get("accuracy").unwrap_or(f64::NAN);
    let weights =
        args.out.clone().unwrap_or_else(|| PathBuf::from(format!("ferrite-{kind}-{}.safetensors", args.model.name())));
    let sd = trainer.model().state_dict();
    ferrite_io::save_state_dict(&weights, sd.iter())?;
    println!(
        "test accuracy {:.2}% after {epochs} epochs ({:.1}s); weights (plain names, no `module.` prefix) written to {}",
        100.0 * accuracy,
        start.elapsed().as_secs_f64(),
        weights.display()
    );
    if let Some(memory) = &last.replica_memory {
        println!("memory per device (peaks of the last epoch's training pass):\n{memory}");
    }
    println!("{}", optimizer_state_line(devices, trainer.optimizer())?);
    Ok(())
}

/// The optimizer state each device holds (each parameter's, or piece's, state lives on its
/// owner replica), and the parameter bytes each owns.
fn optimizer_state_line(devices: &[Device], opt: &dyn Optimizer) -> Result<String, TrainError> {
    let mut per_device = vec![0usize; devices.len()];
    for (_, entries) in opt.state_dict()?.state {
        for (_, v) in entries {
            if let StateValue::Tensor(t) = v
                && let Some(i) = devices.iter().position(|d| d == t.device())
            {
                per_device[i] += t.nbytes();
            }
        }
    }
    let mut owned = vec![0usize; devices.len()];
    for p in opt.params() {
        if let Some(i) = devices.iter().position(|d| d == p.device()) {
            owned[i] += p.nbytes();
        }
    }
    let sizes = |v: &[usize]| v.iter().map(|&b| ferrite_memory::format_size(b as u64)).collect::<Vec<_>>().join(" / ");
    Ok(format!(
        "optimizer state per device (AdamW, on each parameter piece's owner): {}; parameters owned: {}",
        sizes(&per_device),
        sizes(&owned)
    ))
}

/// Accuracy on the test set, on the primary replica (evaluation mode, no graph).
fn evaluate<M: Module>(m: &mut M, loader: &mut Loader, device: &Device) -> Result<f64, TrainError> {
    m.train(false);
    let result = (|| {
        let _g = no_grad();
        let (mut correct, mut seen) = (0usize, 0usize);
        for batch in loader.epoch() {
            let (x, y) = batch?;
            let logits = m.forward(&x.to_device(device)?)?;
            let hits = logits.argmax(1, false)?.eq(&y.to_device(device)?)?.to_vec_bool()?;
            correct += hits.into_iter().filter(|h| *h).count();
            seen += y.numel();
        }
        Ok(correct as f64 / seen.max(1) as f64)
    })();
    m.train(true);
    result
}
