//! What the decoder and the T5 fine-tuning runs of `train --hf-model` share: the split of the
//! data, the run's length, the devices and loaders, the trainer builder (AdamW over the trainable
//! parameters on one device, under DDP/ZeRO, or under DataParallel, with the learning-rate
//! schedule), the lines printed before, during and after training, and the loop itself.
//!
//! Why a file of its own: `hf.rs` hands T5 folders to `hf_t5.rs`, and the two differ only in
//! their data, their model and their loss; everything around those lives here once, so a fix
//! to one run (a schedule, a printed line, the DataParallel set-up) is a fix to both.
use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrite_data::{Collate, DataLoader, DataLoaderBuilder, Dataset, DistributedSampler, ToDevice};
use ferrite_memory::{allocator, format_size, select_devices};
use ferrite_nn::Module;
use ferrite_optim::{Adam, AdamConfig, CosineAnnealingLr, LrScheduler, Optimizer, warmup_cosine};
use ferrite_tensor::{Device, Generator};
use ferrite_train::distributed::{Distributed, EvalShare};
use ferrite_train::{
    FitReport, LmEvaluation, Metrics, OwnerPolicy, StepSync, TrainStep, Trainer, TrainerBuilder, seconds,
    start_observer,
};

use super::settings::{configure, describe_settings};
use super::{LrSchedule, TrainArgs, TrainError, data_parallel};
use crate::commands::lora_args;

/// Share of the blocks used for training; the rest is the validation set.
pub(super) const TRAIN_FRACTION: f64 = 0.9;

pub(super) fn invalid(flag: &'static str, value: impl ToString, expected: &'static str) -> TrainError {
    TrainError::InvalidArgument { flag, value: value.to_string(), expected }
}

/// The decisions an HF run makes before it builds its model: how long it is, on which devices,
/// and the seeds of its loader and dropout (drawn in that order from `--seed`).
pub(super) struct HfRun<'d> {
    pub dist: Option<&'d Distributed>,
    /// `--devices`/`--data-parallel`: DataParallel over these, the first the primary device.
    pub devices: Option<Vec<Device>>,
    pub steps_per_epoch: u64,
    pub epochs: usize,
    /// The schedule's length: `--steps` when given (also when `--epochs` stops the run earlier,
    /// so an interrupted run and its resumption share one schedule), else every step of the
    /// epochs.
    pub total_steps: u64,
    /// The rest of `--seed`'s stream after the loader's seed; the model's dropout draws next.
    pub seeds: Generator,
    loader_seed: u64,
}

impl<'d> HfRun<'d> {
    /// The run over `n_train` training examples, each rank reading its share of them.
    pub fn new(
        args: &TrainArgs,
        device: &Device,
        dist: Option<&'d Distributed>,
        n_train: usize,
    ) -> Result<Self, TrainError> {
        let ranks = dist.map_or(1, Distributed::world_size);
        let micro_batches = n_train.div_ceil(ranks).div_ceil(args.batch_size);
        let steps_per_epoch = micro_batches.div_ceil(args.accum_steps) as u64;
        let epochs = match (args.epochs, args.steps) {
            (Some(e), _) => e,
            (None, Some(s)) => s.div_ceil(steps_per_epoch.max(1)) as usize,
            (None, None) => 1,
        };
        let total_steps = args.steps.unwrap_or(steps_per_epoch * epochs as u64);
        let devices =
            data_parallel::requested(args).then(|| select_devices(device, args.devices.as_deref())).transpose()?;
        let mut seeds = Generator::new(args.seed);
        let loader_seed = seeds.next_u64();
        Ok(HfRun { dist, devices, steps_per_epoch, epochs, total_steps, seeds, loader_seed })
    }

    /// Where the loss and the evaluation batches live: the first DataParallel device, else
    /// `--device`.
    pub fn primary<'a>(&'a self, device: &'a Device) -> &'a Device {
        self.devices.as_ref().and_then(|d| d.first()).unwrap_or(device)
    }

    /// Where the model is loaded: on the host under DataParallel (the replicas are copied from
    /// it), else on `--device`.
    pub fn model_device<'a>(&self, device: &'a Device) -> &'a Device {
        if self.devices.is_some() { &Device::Cpu } else { device }
    }

    /// "`device`" or "DataParallel over a, b", and ", N ranks" under MPI: the end of the first line.
    pub fn placement(&self, device: &Device) -> String {
        let on = match &self.devices {
            Some(d) => format!("DataParallel over {}", d.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
            None => device.to_string(),
        };
        format!("{on}{}", self.dist.map_or(String::new(), |d| format!(", {} ranks", d.world_size())))
    }

    /// The training loader (shuffled with the run's seed, or this rank's share of a
    /// [`DistributedSampler`] permutation) and the validation loader (this rank's share of the
    /// blocks), staged to their devices by the workers. Under DataParallel the training batches
    /// stay on the host: each replica's shard is copied to its device.
    #[allow(clippy::type_complexity)]
    pub fn loaders<D, C>(
        &self,
        args: &TrainArgs,
        device: &Device,
        train: DataLoaderBuilder<D, C>,
        val: Option<DataLoaderBuilder<D, C>>,
    ) -> Result<(DataLoader<D, C>, Option<DataLoader<D, C>>), TrainError>
    where
        D: Dataset,
        C: Collate<D::Sample>,
        C::Batch: ToDevice,
    {
        let b = train.batch_size(args.batch_size).seed(self.loader_seed);
        let b = match self.dist {
            Some(d) => b.sampler(DistributedSampler::new(d.world_size(), d.rank())?.seed(self.loader_seed)),
            None => b.shuffle(true),
        };
        let b = b.num_workers(args.workers);
        let train = if *device == Device::Cpu || self.devices.is_some() {
            b.build()?
        } else {
            b.stage_to(device.clone()).build()?
        };
        let primary = self.primary(device);
        let val = match val {
            Some(v) => {
                let b = v.batch_size(args.batch_size).num_workers(args.workers);
                let b = match self.dist {
                    Some(d) => b.sampler(EvalShare::new(d.world_size(), d.rank())),
                    None => b,
                };
                Some(if *primary == Device::Cpu { b.build()? } else { b.stage_to(primary.clone()).build()? })
            }
            None => None,
        };
        Ok((train, val))
    }

    /// Under MPI, what keeps the ranks in step: rank 0's weights are broadcast now, and gradients
    /// are averaged in backward; with `--zero`, AdamW over this rank's shards only (and gradients
    /// sharded at stage 2). `None` in a single process.
    pub fn gradient_sync(&self, args: &TrainArgs, model: &dyn Module) -> Result<Option<StepSync>, TrainError> {
        Ok(match (self.dist, args.zero) {
            (Some(d), Some(stage)) => Some(d.zero_for(model, stage, args.zero_comm_dtype.unwrap_or_default())?),
            (Some(d), None) => Some(d.sync_for(model)?),
            (None, _) => None,
        })
    }

    /// The model-state line and the schedule line printed before training. Frozen weights (the
    /// base of a LoRA run) hold no gradient and no AdamW moments, so they count once, in their
    /// own dtype.
    pub fn print_sizes_and_schedule(&self, args: &TrainArgs, model: &dyn Module) {
        let (mut total, mut trainable, mut weight_bytes) = (0u64, 0u64, 0u64);
        for p in model.parameters() {
            let n = p.numel() as u64;
            total += n;
            weight_bytes += n * p.dtype().size_in_bytes() as u64;
            if p.requires_grad() {
                trainable += n;
            }
        }
        // Gradients and AdamW's two moments: f32, for the trainable parameters only.
        let states = weight_bytes + trainable * 12;
        if trainable == total {
            println!(
                "  {total} parameters: weights {}, with gradients and AdamW moments {} before activations",
                format_size(weight_bytes),
                format_size(states)
            );
        } else {
            println!(
                "  {total} parameters, {trainable} of them trained: weights {}, with the trained ones' gradients and AdamW moments {} before activations",
                format_size(weight_bytes),
                format_size(states)
            );
        }
        println!(
            "  {} optimizer steps per epoch, {} in all, {}; {}",
            self.steps_per_epoch,
            self.total_steps,
            match args.lr_schedule {
                LrSchedule::Constant => "constant lr".to_string(),
                LrSchedule::Cosine => format!("cosine lr after {} warm-up steps", args.warmup_steps),
            },
            describe_settings(args)
        );
    }

    /// Builds the trainer around `model` and runs it over `train` with `step`, evaluating on
    /// `val` with `evaluate` after each epoch (the loss summed over the ranks), printing one line
    /// per epoch. Returns the trained model and what the end of the run needs.
    #[allow(clippy::too_many_arguments)]
    pub fn fit<M, D, C, S>(
        &self,
        args: &TrainArgs,
        device: &Device,
        model: M,
        sync: Option<StepSync>,
        name: &str,
        data: &Path,
        train: &mut DataLoader<D, C>,
        val: Option<&mut DataLoader<D, C>>,
        step: S,
        evaluate: fn(&mut M, &mut DataLoader<D, C>) -> Result<LmEvaluation, TrainError>,
    ) -> Result<(M, RunEnd), TrainError>
    where
        M: Module + Clone + 'static,
        D: Dataset,
        C: Collate<D::Sample>,
        S: TrainStep<M, C::Batch> + Send,
    {
        let Some(model_dir) = &args.hf_model else {
            return Err(invalid("hf-model", "", "a Hugging Face model folder"));
        };
        let settings: Vec<(String, String)> = vec![
            ("hf-model".into(), model_dir.display().to_string()),
            ("data".into(), data.display().to_string()),
            ("seq".into(), args.shape.seq.to_string()),
            ("batch-size".into(), args.batch_size.to_string()),
            ("accum-steps".into(), args.accum_steps.to_string()),
            ("amp".into(), args.amp.map_or("none", super::Amp::name).into()),
            ("seed".into(), args.seed.to_string()),
            ("lr".into(), args.lr.to_string()),
            ("weight-decay".into(), args.weight_decay.to_string()),
            ("lr-schedule".into(), format!("{:?} warmup {}", args.lr_schedule, args.warmup_steps)),
            ("train-subset".into(), args.train_subset.map_or("all".into(), |n| n.to_string())),
        ];
        let primary = self.primary(device);
        let run = start_observer(&args.observe.settings(), name.to_string(), &data.display().to_string(), device)?;
        let builder = trainer_builder(args, model, self.devices.as_deref(), sync.as_ref(), self.total_steps)?;
        let mut builder = configure(args, builder, primary, self.epochs, settings)
            .checkpoint_activations(args.checkpoint_activations)
            .run_observer(run)
            .on_epoch(|e| {
                let val = e.eval.get("loss");
                println!(
                    "epoch {:>3}/{}  loss {:.4}  {}  | {}  | {}",
                    e.epoch,
                    e.epochs,
                    e.mean_loss,
                    val.map_or("no validation blocks".to_string(), |v| format!(
                        "validation loss {v:.4} (perplexity {:.2})",
                        v.exp()
                    )),
                    e.memory_line,
                    seconds(e.elapsed.as_secs_f64()),
                )
            });
        if let Some(s) = args.steps {
            builder = builder.max_steps(s);
        }
        if let Some(v) = val {
            let dist = self.dist;
            builder = builder.evaluate(move |m| {
                // (loss summed over the scored positions, positions) of this rank's examples,
                // summed over the ranks.
                let local = evaluate(m, &mut *v).map(|e| (e.loss * e.predicted as f64, e.predicted as f64));
                let (sum, n) = match dist {
                    Some(d) => d.sum_pairs(local)?,
                    None => local?,
                };
                Ok(Metrics::new().with("loss", sum / n.max(1.0)))
            });
        }
        if let Some(sync) = sync {
            builder = builder.gradient_sync(sync);
        }
        let mut trainer = builder.build()?;
        let start = Instant::now();
        let report = trainer.fit(train, step)?;
        if let Some(note) = &report.checkpoint_not_written {
            println!("{note}");
        }
        let sync = trainer.take_gradient_sync();
        // ZeRO-3: the model whole again before it is saved or evaluated.
        if let Some(s) = &sync {
            s.gather_whole_model()?;
        }
        let run = trainer.take_run_observer();
        Ok((trainer.into_model(), RunEnd { report, sync, run, start }))
    }

    /// Whether this process writes the result: the only one, or rank 0.
    pub fn writes(&self) -> bool {
        self.dist.is_none_or(|d| d.rank() == 0)
    }
}

/// What the end of a run needs once its model is trained.
pub(super) struct RunEnd {
    report: FitReport,
    sync: Option<StepSync>,
    run: Option<ferrite_train::observe::RunObserver>,
    start: Instant,
}

impl RunEnd {
    /// The last lines of a run — steps, time, validation loss, where the result went (`how`:
    /// how to load it) and the allocator's summary — then the ranks' final report under MPI and
    /// the observer's end; the caller has saved the model.
    pub fn finish(self, run: &HfRun<'_>, device: &Device, out: &Path, how: &str) -> Result<(), TrainError> {
        let last = self.report.epochs.last();
        println!(
            "trained {} optimizer steps in {:.1}s{}; wrote {} ({how})",
            last.map_or(0, |e| e.steps),
            self.start.elapsed().as_secs_f64(),
            last.and_then(|e| e.eval.get("loss")).map_or(String::new(), |v| format!(", validation loss {v:.4}")),
            out.display(),
        );
        println!("{}", allocator(run.primary(device)).memory_summary(true));
        if let Some(d) = run.dist {
            d.finish_and_report(self.sync, device)?;
        }
        if let Some(observer) = self.run {
            observer.finish();
        }
        Ok(())
    }
}

/// `--out`, or `ferrite-<model folder>-finetuned` beside the current directory.
pub(super) fn out_dir(args: &TrainArgs, model_dir: &Path) -> PathBuf {
    args.out.clone().unwrap_or_else(|| {
        let stem = model_dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
        PathBuf::from(format!("ferrite-{stem}-finetuned"))
    })
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
