//! `ferrite train --devices 0,1` (or `--data-parallel`): the image models trained with
//! `DataParallel` over several devices of one process — typically a simulated multi-GPU box,
//! `--device sim:a100-40gb --devices 0,1,2,3` — ending with every device's memory and every
//! device's share of the optimizer state, so the balance of the replicas is visible. The
//! parameters are sharded between the devices (`OwnerPolicy::Sharded`): each device owns an equal
//! run of them, with its gradients and AdamW state, so the devices stay balanced even when one
//! weight is most of the model (the default MLP's hidden layer).
//!
//! A separate loop from the single-device one (`image.rs`) on purpose: it runs the same model,
//! loss (cross-entropy, mean) and optimizer (AdamW) with the batch scattered over the replicas;
//! options it does not support yet (mixed precision, accumulation, checkpoints, resuming, the
//! metrics endpoint) are refused by name rather than ignored.

use std::path::PathBuf;
use std::time::Instant;

use ferrite_data::{Dataset, DatasetKind, builtin_dataset};
use ferrite_memory::{Device, select_devices};
use ferrite_models::{CnnSpec, MlpSpec, build_cnn, build_mlp};
use ferrite_nn::{CrossEntropyLoss, Module, RngHandle};
use ferrite_optim::{Adam, AdamConfig, Optimizer, StateValue, clip_grad_norm_};
use ferrite_parallel::{DataParallel, OwnerPolicy};
use ferrite_tensor::{Generator, no_grad};

use super::{ModelKind, TrainArgs, TrainError};

/// Whether this run asks for data parallelism.
pub fn requested(args: &TrainArgs) -> bool {
    args.devices.is_some() || args.data_parallel
}

/// Train an image model with DataParallel over the devices `--device` and `--devices` select.
pub fn train(args: &TrainArgs, base: &Device) -> Result<(), TrainError> {
    refuse_unsupported(args)?;
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
    let mut test_loader = splits.test.tensor_loader(500).num_workers(args.workers).build()?;
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
            run(args, kind, epochs, model, &devices, &mut train_loader, &mut test_loader)
        }
        ModelKind::Cnn => {
            let spec =
                CnnSpec { input: shape, hidden, layers, classes, checkpoint_activations: args.checkpoint_activations };
            let model = build_cnn(&spec, &Device::Cpu, &mut init)?;
            run(args, kind, epochs, model, &devices, &mut train_loader, &mut test_loader)
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

fn run<M: Module + Clone + 'static>(
    args: &TrainArgs,
    kind: DatasetKind,
    epochs: usize,
    model: M,
    devices: &[Device],
    train_loader: &mut Loader,
    test_loader: &mut Loader,
) -> Result<(), TrainError> {
    // Sharded owners: every device holds an equal share of the AdamW state, whatever the model.
    let mut dp = DataParallel::with_owners(model, devices, OwnerPolicy::Sharded)?;
    let mut opt = Adam::new(dp.parameters(), AdamConfig::adamw(args.lr).weight_decay(args.weight_decay))?;
    let loss_fn = CrossEntropyLoss::new();
    let start = Instant::now();
    let mut accuracy = f64::NAN;
    for epoch in 0..epochs {
        let t = Instant::now();
        dp.train(true);
        dp.reset_peak_memory_stats();
        let (mut loss_sum, mut samples) = (0.0, 0usize);
        for batch in train_loader.epoch() {
            let (x, y) = batch?;
            opt.zero_grad()?;
            let step =
                dp.forward_backward(&[&x, &y], |m, s| Ok(loss_fn.forward(&m.forward(&s.tensors[0])?, &s.tensors[1])?))?;
            if let Some(max) = args.clip_grad_norm {
                clip_grad_norm_(&dp.parameters(), max)?;
            }
            dp.step(&mut opt)?;
            loss_sum += step.loss * y.numel() as f64;
            samples += y.numel();
        }
        dp.train(false);
        accuracy = evaluate(&dp, test_loader)?;
        let report = dp.memory_report();
        let peaks: Vec<String> = report.devices.iter().map(|d| ferrite_memory::format_size(d.peak_allocated)).collect();
        println!(
            "epoch {:>3}/{epochs}  loss {:.4}  test acc {:5.2}%  | peak per device {} (spread {:.1} %) | {:.1}s",
            epoch + 1,
            loss_sum / samples.max(1) as f64,
            100.0 * accuracy,
            peaks.join(" / "),
            100.0 * report.peak_imbalance(),
            t.elapsed().as_secs_f64()
        );
    }
    let weights =
        args.out.clone().unwrap_or_else(|| PathBuf::from(format!("ferrite-{kind}-{}.safetensors", args.model.name())));
    let sd = dp.state_dict();
    ferrite_io::save_state_dict(&weights, sd.iter())?;
    println!(
        "test accuracy {:.2}% after {epochs} epochs ({:.1}s); weights (plain names, no `module.` prefix) written to {}",
        100.0 * accuracy,
        start.elapsed().as_secs_f64(),
        weights.display()
    );
    let report = dp.memory_report();
    println!("memory per device (peaks of the last epoch):\n{report}");
    println!("{}", optimizer_state_line(&dp, &opt)?);
    Ok(())
}

/// The optimizer state each device holds (each parameter's, or piece's, state lives on its
/// owner replica).
fn optimizer_state_line<M: Module + Clone + 'static>(
    dp: &DataParallel<M>,
    opt: &dyn Optimizer,
) -> Result<String, TrainError> {
    let mut per_device = vec![0usize; dp.devices().len()];
    for (_, entries) in opt.state_dict()?.state {
        for (_, v) in entries {
            if let StateValue::Tensor(t) = v
                && let Some(i) = dp.devices().iter().position(|d| d == t.device())
            {
                per_device[i] += t.nbytes();
            }
        }
    }
    let sizes: Vec<String> = per_device.iter().map(|&b| ferrite_memory::format_size(b as u64)).collect();
    let owned: Vec<String> = dp.owned_bytes().iter().map(|&b| ferrite_memory::format_size(b as u64)).collect();
    Ok(format!(
        "optimizer state per device (AdamW, on each parameter piece's owner): {}; parameters owned: {}",
        sizes.join(" / "),
        owned.join(" / ")
    ))
}

fn evaluate<M: Module + Clone + 'static>(dp: &DataParallel<M>, loader: &mut Loader) -> Result<f64, TrainError> {
    let _g = no_grad();
    let (mut correct, mut seen) = (0usize, 0usize);
    for batch in loader {
        let (x, y) = batch?;
        let logits = dp.forward(&[&x], |m, s| Ok(m.forward(&s.tensors[0])?))?;
        let hits = logits.argmax(1, false)?.eq(&y.to_device(logits.device())?)?.to_vec_bool()?;
        correct += hits.into_iter().filter(|h| *h).count();
        seen += y.numel();
    }
    Ok(correct as f64 / seen.max(1) as f64)
}

fn refuse_unsupported(args: &TrainArgs) -> Result<(), TrainError> {
    let unsupported: [(&'static str, bool); 5] = [
        ("amp", args.amp.is_some()),
        ("accum-steps", args.accum_steps > 1),
        ("save-checkpoint", args.save_checkpoint.is_some()),
        ("resume", args.resume.is_some()),
        ("metrics-addr/metrics-file", args.observe != Default::default()),
    ];
    for (flag, set) in unsupported {
        if set {
            return Err(TrainError::InvalidArgument {
                flag,
                value: "(given)".into(),
                expected: "not supported with --devices/--data-parallel yet; train on one device to use it",
            });
        }
    }
    Ok(())
}
