//! The `Trainer` from outside, as a library user meets it: a model defined here (not in any
//! ferrite crate) with dropout, a dataset of tensors, and every setting the trainer supplies —
//! accumulation, f16 loss scaling, clipping, a schedule, resume (bit-identical), early stopping,
//! the best checkpoint, callbacks, a step limit, and DataParallel over simulated GPUs.
use std::cell::RefCell;
use std::rc::Rc;

use ferrite_data::{DataLoader, Dataset, InMemory, StackCollate};
use ferrite_memory::select_devices;
use ferrite_nn::{CrossEntropyLoss, Dropout, Linear, Module, ReLU, RngHandle, inference};
use ferrite_optim::{Adam, AdamConfig, Sgd, SgdConfig, StepLr};
use ferrite_tensor::{DType, Device, Generator, Tensor};
use ferrite_train::{AmpMode, Goal, Metrics, OwnerPolicy, StepOutput, TrainError, Trainer};

/// A user's model: two linears with a ReLU and dropout between them.
#[derive(Clone)]
struct TwoLayer {
    fc1: Linear,
    act: ReLU,
    drop: Dropout,
    fc2: Linear,
    training: bool,
}

impl TwoLayer {
    fn new(seed: u64, rng: &RngHandle) -> TwoLayer {
        TwoLayer::with_dropout(seed, rng, 0.2)
    }

    fn with_dropout(seed: u64, rng: &RngHandle, p: f64) -> TwoLayer {
        let mut g = Generator::new(seed);
        TwoLayer {
            fc1: Linear::new_with(8, 32, true, &Device::Cpu, &mut g).unwrap(),
            act: ReLU::new(),
            drop: Dropout::with_rng(p, rng.clone()).unwrap(),
            fc2: Linear::new_with(32, 3, true, &Device::Cpu, &mut g).unwrap(),
            training: true,
        }
    }
}

impl Module for TwoLayer {
    fn type_name(&self) -> &'static str {
        "TwoLayer"
    }
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        self.fc2.forward(&self.drop.forward(&self.act.forward(&self.fc1.forward(x)?)?)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("fc1".into(), &self.fc1), ("drop".into(), &self.drop), ("fc2".into(), &self.fc2)]
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![("fc1".into(), &mut self.fc1), ("drop".into(), &mut self.drop), ("fc2".into(), &mut self.fc2)]
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// 96 samples of 8 features in 3 linearly separable-ish classes.
fn samples() -> Vec<(Tensor, usize)> {
    let mut g = Generator::new(7);
    (0..96)
        .map(|i| {
            let class = i % 3;
            let x: Vec<f32> = (0..8).map(|j| g.uniform_f32() + if j % 3 == class { 1.5 } else { 0.0 }).collect();
            (Tensor::from_vec(x, &[8], &Device::Cpu).unwrap(), class)
        })
        .collect()
}

type Loader = DataLoader<InMemory<(Tensor, usize)>, StackCollate>;

fn loader(seed: u64) -> Loader {
    DataLoader::builder(InMemory::new(samples()))
        .batch_size(16)
        .shuffle(true)
        .seed(seed)
        .collate(StackCollate)
        .build()
        .unwrap()
}

fn step(m: &TwoLayer, (x, y): &(Tensor, Tensor)) -> Result<StepOutput, TrainError> {
    let logits = m.forward(x)?;
    let loss = CrossEntropyLoss::new().forward(&logits, y)?;
    let correct = logits.argmax(1, false)?.eq(y)?.to_vec_bool()?.into_iter().filter(|h| *h).count();
    Ok(StepOutput::new(loss, y.numel()).with_sum("correct", correct as f64))
}

/// Accuracy on the whole set, in eval mode without a graph.
fn accuracy(m: &mut TwoLayer) -> Result<Metrics, TrainError> {
    let all = samples();
    let xs: Vec<&Tensor> = all.iter().map(|(x, _)| x).collect();
    // On the model's device (under DataParallel, the primary replica's).
    let device = m.parameters()[0].device().clone();
    let x = Tensor::stack(&xs, 0)?.to_device(&device)?;
    let y: Vec<i64> = all.iter().map(|(_, c)| *c as i64).collect();
    let logits = inference(m, |m| m.forward(&x))?;
    let pred = logits.argmax(1, false)?.to_vec::<i64>()?;
    let hits = pred.iter().zip(&y).filter(|(p, t)| p == t).count();
    Ok(Metrics::new().with("accuracy", hits as f64 / y.len() as f64))
}

fn weights(m: &dyn Module) -> Vec<Vec<u32>> {
    m.parameters().iter().map(|p| p.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

fn adamw(m: &TwoLayer) -> Adam {
    Adam::named(m.named_parameters(), AdamConfig::adamw(1e-2)).unwrap()
}

#[test]
fn a_user_model_trains_with_accumulation_clipping_a_schedule_and_callbacks() {
    let rng = RngHandle::new(3);
    let model = TwoLayer::new(0, &rng);
    let mut opt = Sgd::named(model.named_parameters(), SgdConfig::new(0.2).momentum(0.9)).unwrap();
    let schedule = StepLr::new(&mut opt, 4, 0.5).unwrap();
    let steps = Rc::new(RefCell::new(Vec::new()));
    let epochs_seen = Rc::new(RefCell::new(Vec::new()));
    let (s, e) = (steps.clone(), epochs_seen.clone());
    let mut trainer = Trainer::builder(model, opt)
        .epochs(6)
        .accum_steps(2)
        .clip_grad_norm(1.0)
        .scheduler(schedule)
        .dropout_rng(rng)
        .evaluate(accuracy)
        .on_step(move |i| s.borrow_mut().push((i.step, i.lr)))
        .on_epoch(move |summary| e.borrow_mut().push((summary.epoch, summary.eval.get("accuracy"))))
        .build()
        .unwrap();
    let report = trainer.fit(&mut loader(1), step).unwrap();
    // 96 samples / 16 = 6 micro-batches per epoch, 2 per step: 3 steps per epoch.
    assert_eq!(report.steps, 18);
    let steps = steps.borrow();
    assert_eq!(steps.len(), 18);
    assert_eq!(steps[3].1, 0.1, "StepLr halves the rate after 4 steps: {steps:?}");
    assert_eq!(steps[17].1, 0.2 * 0.5f64.powi(4));
    assert_eq!(epochs_seen.borrow().len(), 6);
    let first = &report.epochs[0];
    let last = report.epochs.last().unwrap();
    assert_eq!(first.samples, 96);
    assert!(last.mean_loss < first.mean_loss, "{} -> {}", first.mean_loss, last.mean_loss);
    assert!(last.eval.get("accuracy").unwrap() > 0.8, "{:?}", last.eval);
    assert!(last.train_mean("correct").unwrap() > 0.5);
    assert!(last.memory_line.starts_with("memory: allocated "), "{}", last.memory_line);
}

#[test]
fn resume_continues_bit_identically_with_dropout_f16_scaling_and_accumulation() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("run.ckpt");
    let run = |epochs: usize, resume: bool, save: bool| {
        let rng = RngHandle::new(5);
        let model = TwoLayer::new(1, &rng);
        let opt = adamw(&model);
        let mut b = Trainer::builder(model, opt)
            .epochs(epochs)
            .accum_steps(2)
            .amp(Some(AmpMode::F16))
            .dropout_rng(rng)
            .setting("hidden", 32);
        if save {
            b = b.save_checkpoint(&ckpt);
        }
        if resume {
            b = b.resume(&ckpt);
        }
        let mut t = b.build().unwrap();
        let report = t.fit(&mut loader(9), step).unwrap();
        (weights(t.model()), report)
    };
    let (straight, _) = run(4, false, false);
    let (_, first) = run(2, false, true);
    assert_eq!(first.epochs.len(), 2);
    let (resumed, second) = run(4, true, true);
    assert_eq!(second.resumed_epochs, 2);
    assert_eq!(second.epochs.len(), 2);
    assert_eq!(second.epochs[0].epoch, 3);
    assert_eq!(resumed, straight, "a resumed run ends with the uninterrupted run's exact weights");

    // Another setting is refused, naming it.
    let rng = RngHandle::new(5);
    let model = TwoLayer::new(1, &rng);
    let opt = adamw(&model);
    let mut t = Trainer::builder(model, opt)
        .epochs(5)
        .accum_steps(3)
        .amp(Some(AmpMode::F16))
        .setting("hidden", 32)
        .resume(&ckpt)
        .build()
        .unwrap();
    let err = t.fit(&mut loader(9), step).unwrap_err().to_string();
    assert!(err.contains("--accum-steps 2") && err.contains("--accum-steps 3"), "{err}");
}

#[test]
fn early_stopping_keeps_the_best_weights_and_max_steps_stops_mid_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let best = dir.path().join("best.safetensors");
    let rng = RngHandle::new(2);
    let model = TwoLayer::new(2, &rng);
    let opt = adamw(&model);
    // An evaluation whose value never improves after the first epoch.
    let mut calls = 0usize;
    let mut t = Trainer::builder(model, opt)
        .epochs(20)
        .evaluate(move |_m| {
            calls += 1;
            Ok(Metrics::new().with("val_loss", if calls == 1 { 0.5 } else { 0.5 + calls as f64 }))
        })
        .early_stopping("val_loss", Goal::Minimize, 2)
        .keep_best(&best, "val_loss", Goal::Minimize)
        .build()
        .unwrap();
    let report = t.fit(&mut loader(4), step).unwrap();
    assert_eq!(report.epochs.len(), 3, "stops after 2 evaluations without improvement");
    assert_eq!(report.best, Some((0.5, 1)));
    assert!(report.stopped_early.as_deref().unwrap().contains("`val_loss` has not improved for 2"));
    let saved = ferrite_io::load_state_dict(&best, &ferrite_io::LoadOptions::new()).unwrap();
    assert_eq!(saved.len(), 4, "fc1/fc2 weight and bias");

    let rng = RngHandle::new(2);
    let model = TwoLayer::new(2, &rng);
    let opt = adamw(&model);
    let mut t = Trainer::builder(model, opt).epochs(10).max_steps(8).build().unwrap();
    let report = t.fit(&mut loader(4), step).unwrap();
    assert_eq!(report.steps, 8);
    assert_eq!(report.epochs.len(), 2, "6 steps in epoch 1, 2 in epoch 2");
    assert!(report.stopped_early.unwrap().contains("8 optimizer steps"));
}

#[test]
fn impossible_settings_are_typed_errors() {
    let build =
        |f: &dyn Fn(ferrite_train::TrainerBuilder<'_, TwoLayer>) -> ferrite_train::TrainerBuilder<'_, TwoLayer>| {
            let rng = RngHandle::new(0);
            let model = TwoLayer::new(0, &rng);
            let opt = adamw(&model);
            f(Trainer::builder(model, opt)).build().err().map(|e| e.to_string())
        };
    assert!(build(&|b| b.epochs(0)).unwrap().contains("--epochs 0"));
    assert!(build(&|b| b.accum_steps(0)).unwrap().contains("--accum-steps 0"));
    assert!(build(&|b| b.clip_grad_norm(f64::NAN)).unwrap().contains("clip-grad-norm"));
    assert!(build(&|b| b.early_stopping("x", Goal::Minimize, 1)).unwrap().contains("needs an evaluation"));
    assert!(build(&|b| b.device(Device::Meta)).unwrap().contains("meta"));
    // A tracked metric the evaluation does not report names the ones it does.
    let rng = RngHandle::new(0);
    let model = TwoLayer::new(0, &rng);
    let opt = adamw(&model);
    let mut t = Trainer::builder(model, opt)
        .evaluate(accuracy)
        .keep_best(std::env::temp_dir().join("never.safetensors"), "val_loss", Goal::Minimize)
        .build()
        .unwrap();
    let err = t.fit(&mut loader(0), step).unwrap_err().to_string();
    assert!(err.contains("no metric `val_loss`") && err.contains("accuracy"), "{err}");
    let _ = DType::F32;
    let _ = Dataset::len(&InMemory::new(vec![1]));
}

/// Two simulated A100s of one process.
fn two_gpus() -> Vec<Device> {
    select_devices(&Device::parse("sim:a100-40gb").unwrap(), Some("0,1")).unwrap()
}

#[test]
fn data_parallel_by_a_setting_matches_one_device() {
    // Without dropout the step is deterministic: DataParallel over two devices (each replica's
    // loss weighted by its share of the batch) takes the single-device step on the whole batch.
    let run = |parallel: Option<OwnerPolicy>| {
        let rng = RngHandle::new(0);
        let model = TwoLayer::with_dropout(3, &rng, 0.0);
        let mut b = Trainer::builder_with(model, |params| Sgd::new(params, SgdConfig::new(0.1).momentum(0.9)))
            .epochs(3)
            .accum_steps(2)
            .clip_grad_norm(5.0)
            .evaluate(accuracy);
        if let Some(policy) = parallel {
            b = b.data_parallel(&two_gpus(), policy);
        }
        let mut t = b.build().unwrap();
        let report = t.fit(&mut loader(2), step).unwrap();
        let memory = t.replica_memory();
        (t.into_model(), report, memory)
    };
    let (one, one_report, none) = run(None);
    assert!(none.is_none());
    for policy in [OwnerPolicy::Primary, OwnerPolicy::Balanced, OwnerPolicy::Sharded] {
        let (dp, report, memory) = run(Some(policy));
        assert_eq!(report.steps, one_report.steps);
        for (a, b) in one.parameters().iter().zip(dp.parameters()) {
            let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_device(&Device::Cpu).unwrap().to_vec::<f32>().unwrap());
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-4 * (1.0 + x.abs()), "{policy:?}: {x} vs {y}");
            }
        }
        for (e1, e2) in one_report.epochs.iter().zip(&report.epochs) {
            assert!((e1.mean_loss - e2.mean_loss).abs() < 1e-4, "{policy:?}: {} vs {}", e1.mean_loss, e2.mean_loss);
            assert_eq!(e1.samples, e2.samples);
            assert_eq!(e1.train.get("correct"), e2.train.get("correct"));
        }
        let last = report.epochs.last().unwrap();
        assert!(last.memory_line.contains("peak per device"), "{}", last.memory_line);
        assert_eq!(last.replica_memory.as_ref().map(|m| m.devices.len()), Some(2));
        assert_eq!(memory.map(|m| m.devices.len()), Some(2));
    }
}

#[test]
fn data_parallel_resumes_bit_identically_with_f16_scaling_and_accumulation() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("dp.ckpt");
    let run = |epochs: usize, resume: bool, save: bool| {
        let rng = RngHandle::new(4);
        let model = TwoLayer::with_dropout(5, &rng, 0.0);
        let mut b = Trainer::builder_with(model, |params| Adam::new(params, AdamConfig::adamw(1e-2)))
            .data_parallel(&two_gpus(), OwnerPolicy::Sharded)
            .epochs(epochs)
            .accum_steps(2)
            .amp(Some(AmpMode::F16))
            .dropout_rng(rng);
        if save {
            b = b.save_checkpoint(&ckpt);
        }
        if resume {
            b = b.resume(&ckpt);
        }
        let resumed_line = Rc::new(RefCell::new(String::new()));
        let line = resumed_line.clone();
        let mut t = b.on_resume(move |r| *line.borrow_mut() = r.to_string()).build().unwrap();
        let report = t.fit(&mut loader(6), step).unwrap();
        let optimizer = t.optimizer_state_dict().unwrap();
        (weights(t.model()), report, optimizer.state.len(), resumed_line.borrow().clone())
    };
    let (straight, full, entries, _) = run(4, false, false);
    assert_eq!(entries, 4, "the optimizer state in the single-device layout: one entry per parameter");
    assert!(full.epochs.last().unwrap().mean_loss < full.epochs[0].mean_loss);
    run(2, false, true);
    let (resumed, second, _, line) = run(4, true, true);
    assert_eq!(second.resumed_epochs, 2);
    assert_eq!(second.resumed.as_ref().map(|r| r.epoch), Some(2));
    assert!(line.contains("resumed from") && line.contains("after epoch 2"), "{line}");
    assert_eq!(resumed, straight, "a resumed DataParallel run ends with the uninterrupted run's exact weights");

    // The checkpoint is in the single-device layout: a one-device run resumes from it.
    let rng = RngHandle::new(4);
    let model = TwoLayer::with_dropout(5, &rng, 0.0);
    let opt = adamw(&model);
    let mut t = Trainer::builder(model, opt)
        .epochs(5)
        .accum_steps(2)
        .amp(Some(AmpMode::F16))
        .dropout_rng(rng)
        .resume(&ckpt)
        .build()
        .unwrap();
    let report = t.fit(&mut loader(6), step).unwrap();
    assert_eq!((report.resumed_epochs, report.epochs.len()), (4, 1));
}

#[test]
fn data_parallel_refuses_what_it_cannot_run() {
    // An optimizer over the model's own parameters does not update the sharded owners' pieces.
    let rng = RngHandle::new(0);
    let model = TwoLayer::with_dropout(0, &rng, 0.0);
    let opt = adamw(&model);
    let err = Trainer::builder(model, opt).data_parallel(&two_gpus(), OwnerPolicy::Sharded).build().err().unwrap();
    assert!(matches!(err, TrainError::OptimizerNotOnReplicas { devices: 2, .. }), "{err}");
    assert!(err.to_string().contains("Trainer::builder_with"), "{err}");

    // No devices, or one twice.
    let model = TwoLayer::with_dropout(0, &rng, 0.0);
    let d = two_gpus();
    let err = Trainer::builder_with(model, |p| Sgd::new(p, SgdConfig::new(0.1)))
        .data_parallel(&[d[0].clone(), d[0].clone()], OwnerPolicy::Balanced)
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("twice") || err.to_string().contains("duplicate"), "{err}");

    // A batch DataParallel cannot split is a typed error naming its type.
    let model = TwoLayer::with_dropout(0, &rng, 0.0);
    let mut t = Trainer::builder_with(model, |p| Sgd::new(p, SgdConfig::new(0.1)))
        .data_parallel(&two_gpus(), OwnerPolicy::Primary)
        .build()
        .unwrap();
    let mut odd: DataLoader<InMemory<(Tensor, usize)>, ferrite_data::VecCollate> =
        DataLoader::builder(InMemory::new(samples())).batch_size(16).collate(ferrite_data::VecCollate).build().unwrap();
    let err = t
        .fit(&mut odd, |m: &TwoLayer, b: &Vec<(Tensor, usize)>| {
            let x = m.forward(&b[0].0)?;
            Ok(StepOutput::new(x.sum()?, b.len()))
        })
        .unwrap_err();
    assert!(matches!(err, TrainError::During { .. }), "{err}");
    assert!(err.to_string().contains("cannot split a batch of type"), "{err}");
}

#[test]
fn an_out_of_memory_step_ends_with_the_planners_remedies() {
    // An MLP described to the planner, trained on a simulated GPU far too small for its batch.
    let device = Device::parse("sim:2MiB").unwrap();
    let fit = |planner: Option<Result<(), String>>| {
        let mut g = Generator::new(0);
        let model = Linear::new_with(8, 3, true, &device, &mut g).unwrap();
        let opt = Adam::new(model.parameters(), AdamConfig::adamw(1e-3)).unwrap();
        let mut b = Trainer::builder(model, opt).device(device.clone());
        if let Some(p) = planner {
            let device = device.to_string();
            b = b.planner(move || {
                p?;
                Ok(ferrite_train::PlanContext {
                    workload: Box::new(ferrite_plan::Builtin::Mlp {
                        input: [1, 1, 8],
                        hidden: 4096,
                        layers: 2,
                        classes: 3,
                        dropout: 0.0,
                    }),
                    step: ferrite_plan::StepConfig {
                        batch: 4096,
                        accum_steps: 1,
                        amp: None,
                        checkpoint_activations: false,
                        optimizer: ferrite_plan::OptimizerKind::Adamw,
                    },
                    device,
                    alloc_conf: None,
                    memory_fraction: None,
                })
            });
        }
        let mut t = b.build().unwrap();
        let dev = device.clone();
        t.fit(&mut loader(0), move |m: &Linear, (x, y): &(Tensor, Tensor)| {
            // A step whose activations (64 MiB) cannot fit in 2 MiB.
            let wide = Tensor::zeros(&[4096, 4096], DType::F32, &dev)?;
            let logits = m.forward(&x.to_device(&dev)?)?;
            let loss = CrossEntropyLoss::new().forward(&logits, &y.to_device(&dev)?)?;
            Ok(StepOutput::new(loss.add(&wide.sum()?)?, y.numel()))
        })
        .unwrap_err()
    };
    let plain = fit(None);
    assert!(plain.is_out_of_memory(), "{plain}");
    assert!(!plain.to_string().contains("Ranked remedies"), "{plain}");
    let planned = fit(Some(Ok(())));
    let msg = planned.to_string();
    assert!(msg.contains("Ranked remedies (ferrite plan, for this model on sim:2MiB)"), "{msg}");
    let unavailable = fit(Some(Err("a model of its own".into()))).to_string();
    assert!(unavailable.contains("The planner cannot model this run (a model of its own)"), "{unavailable}");
}

#[test]
fn activation_checkpointing_is_a_setting_for_models_that_support_it() {
    // ferrite-models' MLP recomputes its blocks in backward: same weights, bit for bit.
    let run = |ckpt: Option<bool>| {
        let spec = ferrite_models::MlpSpec {
            inputs: 8,
            hidden: 16,
            layers: 4,
            classes: 3,
            dropout: 0.1,
            checkpoint_activations: false,
        };
        let rng = RngHandle::new(1);
        let model = ferrite_models::build_mlp(&spec, &Device::Cpu, &mut Generator::new(2), &rng).unwrap();
        let opt = Adam::named(model.named_parameters(), AdamConfig::adamw(1e-2)).unwrap();
        let mut b = Trainer::builder(model, opt).epochs(2).dropout_rng(rng);
        if let Some(on) = ckpt {
            b = b.checkpoint_activations(on);
        }
        let mut t = b.build().unwrap();
        t.fit(&mut loader(3), |m: &ferrite_models::Mlp, (x, y): &(Tensor, Tensor)| {
            Ok(StepOutput::new(CrossEntropyLoss::new().forward(&m.forward(x)?, y)?, y.numel()))
        })
        .unwrap();
        weights(t.model())
    };
    let plain = run(None);
    assert_eq!(run(Some(true)), plain, "checkpointing changes no gradient");
    assert_eq!(run(Some(false)), plain);

    // A model with nothing that can recompute is refused, naming it.
    let rng = RngHandle::new(0);
    let model = TwoLayer::new(0, &rng);
    let opt = adamw(&model);
    let err = Trainer::builder(model, opt).checkpoint_activations(true).build().err().unwrap();
    assert!(matches!(err, TrainError::CheckpointingUnsupported { model: "TwoLayer" }), "{err}");
    assert!(err.to_string().contains("ferrite_nn::Checkpointed"), "{err}");
}

#[test]
fn reserved_memory_an_evaluation_adds_is_named_on_the_epoch_line() {
    // An evaluation that needs more than training ever reserved (a 64 MiB temporary on a
    // simulated GPU of its own): the caching allocator keeps that segment, and the line says why.
    let device = Device::parse("sim:a100-40gb:7").unwrap();
    let mut g = Generator::new(0);
    let model = Linear::new_with(8, 3, true, &device, &mut g).unwrap();
    let opt = Adam::new(model.parameters(), AdamConfig::adamw(1e-3)).unwrap();
    let dev = device.clone();
    let mut first = true;
    let mut t = Trainer::builder(model, opt)
        .device(device.clone())
        .epochs(2)
        .evaluate(move |_m: &mut Linear| {
            if std::mem::take(&mut first) {
                let big = Tensor::zeros(&[4096, 4096], DType::F32, &dev)?;
                drop(big);
            }
            Ok(Metrics::new())
        })
        .build()
        .unwrap();
    let d = device.clone();
    let report = t
        .fit(&mut loader(0), move |m: &Linear, (x, y): &(Tensor, Tensor)| {
            let loss = CrossEntropyLoss::new().forward(&m.forward(&x.to_device(&d)?)?, &y.to_device(&d)?)?;
            Ok(StepOutput::new(loss, y.numel()))
        })
        .unwrap();
    let (one, two) = (&report.epochs[0].memory_line, &report.epochs[1].memory_line);
    assert!(one.contains("; evaluation reserved +64.00 MiB"), "{one}");
    assert!(!two.contains("evaluation reserved"), "the second evaluation reuses the cached segment: {two}");
}
