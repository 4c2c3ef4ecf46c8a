//! The `Trainer`: epochs of any model over any `DataLoader`, with what a good run needs and the
//! user's own code only where it differs — what a step computes from a batch, and how the model is
//! evaluated.
//!
//! Why a builder over closures (Lightning's `Trainer`, burn's `LearnerBuilder`): a model and its
//! data are the user's, and so is the loss; everything else — accumulation, f16 loss scaling,
//! clipping, the LR schedule, the memory line, checkpoints that resume bit-identically, early
//! stopping, the best checkpoint, metrics outputs, averaging over MPI ranks — is the same for
//! every model and is written once here. `ferrite train` is one user of it.
//!
//! ```no_run
//! # use ferrite_train::{StepOutput, TrainError, Trainer};
//! # use ferrite_nn::{CrossEntropyLoss, Linear, Module};
//! # use ferrite_optim::{Adam, AdamConfig};
//! # use ferrite_data::{DataLoader, InMemory, StackCollate};
//! # use ferrite_tensor::Tensor;
//! # fn demo(samples: Vec<(Tensor, usize)>) -> Result<(), TrainError> {
//! let mut loader =
//!     DataLoader::builder(InMemory::new(samples)).batch_size(32).shuffle(true).collate(StackCollate).build()?;
//! let model = Linear::new(64, 10)?;
//! let opt = Adam::named(model.named_parameters(), AdamConfig::adamw(1e-3))?;
//! let mut trainer = Trainer::builder(model, opt).epochs(3).accum_steps(2).build()?;
//! let report = trainer.fit(&mut loader, |m: &Linear, (x, y): &(Tensor, Tensor)| {
//!     let loss = CrossEntropyLoss::new().forward(&m.forward(&x)?, &y)?;
//!     Ok(StepOutput::new(loss, y.numel()))
//! })?;
//! println!("last loss {:.4}", report.epochs.last().map_or(f64::NAN, |e| e.mean_loss));
//! # Ok(()) }
//! ```
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferrite_data::{Collate, DataLoader, Dataset};
use ferrite_memory::MemoryScope;
use ferrite_nn::{Module, RngHandle, autocast};
use ferrite_optim::{LrScheduler, Optimizer, OptimizerState};
use ferrite_parallel::{MemoryReport, OwnerPolicy, ParallelError, Shard};
use ferrite_plan::AmpMode;
use ferrite_tensor::{Device, Tensor};

use crate::distributed::StepSync;
use crate::epoch_meter::EpochMeter;
use crate::error::{During, TrainError};
use crate::metrics::{Goal, Metrics};
use crate::observe::{BatchReport, ObserveSettings, RunInfo, RunObserver};
use crate::planned::PlanContext;
use crate::replicas::{self, Replicated};
use crate::stepper::{LossScale, Resumed};

/// What one micro-batch's step returns: the loss to backpropagate, the samples it covered, and
/// metrics summed over those samples (e.g. `("correct", 57.0)`), which the trainer adds up over
/// the epoch.
pub struct StepOutput {
    pub loss: Tensor,
    pub samples: usize,
    pub sums: Vec<(String, f64)>,
    /// Metrics computed after the backward pass and the optimizer step (see
    /// [`StepOutput::after_step`]).
    after: Option<AfterStep>,
}

type AfterStep = Box<dyn FnOnce() -> Result<Vec<(String, f64)>, TrainError>>;

impl StepOutput {
    /// A loss over `samples` samples, with no other metric.
    pub fn new(loss: Tensor, samples: usize) -> StepOutput {
        StepOutput { loss, samples, sums: Vec::new(), after: None }
    }

    /// Adds a metric summed over this batch's samples (the epoch reports its sum and its mean).
    pub fn with_sum(mut self, name: impl Into<String>, value: f64) -> StepOutput {
        self.sums.push((name.into(), value));
        self
    }

    /// Metrics to compute once the backward pass (and the optimizer step, when this micro-batch
    /// completes one) has run — e.g. an accuracy from the logits, which the closure keeps alive
    /// until then, as a PyTorch loop that reads them after `step()` does. Computing them here
    /// rather than in the step keeps their temporaries out of the forward+backward peak.
    pub fn after_step(mut self, f: impl FnOnce() -> Result<Vec<(String, f64)>, TrainError> + 'static) -> StepOutput {
        self.after = Some(Box::new(f));
        self
    }
}

/// A training step: the forward pass and loss of one micro-batch (autocast is already on when the
/// run uses AMP). Any `FnMut(&M, &Batch) -> Result<StepOutput, TrainError>` is one. The batch
/// stays alive until the optimizer step has run (as in a PyTorch loop, and as the planner models
/// the step).
pub trait TrainStep<M: ?Sized, B> {
    fn step(&mut self, model: &M, batch: &B) -> Result<StepOutput, TrainError>;

    /// Called before an epoch's first batch (0-based `epoch`), inside the epoch's memory scope:
    /// reset state carried across batches, such as a recurrent model's hidden state.
    fn start_epoch(&mut self, _model: &M, _epoch: usize) -> Result<(), TrainError> {
        Ok(())
    }
}

impl<M: ?Sized, B, F> TrainStep<M, B> for F
where
    F: FnMut(&M, &B) -> Result<StepOutput, TrainError>,
{
    fn step(&mut self, model: &M, batch: &B) -> Result<StepOutput, TrainError> {
        self(model, batch)
    }
}

/// One optimizer step, as callbacks see it.
#[derive(Debug, Clone, Copy)]
pub struct StepInfo {
    /// Optimizer steps taken so far (this one included).
    pub step: u64,
    /// False when the GradScaler skipped the step (inf/NaN gradients under f16).
    pub applied: bool,
    /// The learning rate of the first parameter group after the step (and the schedule's step).
    pub lr: f64,
    /// The loss of the micro-batch that completed the step.
    pub loss: f64,
}

/// One finished epoch: the training pass's figures and, when an evaluation ran, its metrics.
#[derive(Debug, Clone)]
pub struct EpochSummary {
    /// 1-based.
    pub epoch: usize,
    pub epochs: usize,
    /// Mean of the micro-batches' losses.
    pub mean_loss: f64,
    /// Samples of the training pass.
    pub samples: usize,
    /// Sums of the steps' metrics over the training pass (`mean` divides by `samples`).
    pub train: Metrics,
    /// The evaluation's metrics after this epoch (empty without an evaluation).
    pub eval: Metrics,
    /// `memory: allocated …, reserved …, peak … (forward+backward …)` of the training pass.
    pub memory_line: String,
    /// Wall time of the epoch, evaluation included.
    pub elapsed: Duration,
    /// Optimizer steps taken so far.
    pub steps: u64,
    /// Under [`data_parallel`](TrainerBuilder::data_parallel): every device's memory over the
    /// epoch's training pass (peaks since the epoch started).
    pub replica_memory: Option<MemoryReport>,
}

impl EpochSummary {
    /// A training metric's mean per sample (e.g. accuracy from a `correct` sum).
    pub fn train_mean(&self, name: &str) -> Option<f64> {
        self.train.get(name).map(|s| s / self.samples.max(1) as f64)
    }
}

/// What [`Trainer::fit`] did.
#[derive(Debug, Clone)]
pub struct FitReport {
    /// The epochs run in this call (a resumed run starts after its checkpoint's).
    pub epochs: Vec<EpochSummary>,
    /// Epochs completed before this call (from `resume`), 0 for a fresh run.
    pub resumed_epochs: usize,
    /// The checkpoint this call resumed from (`Display` is the line `ferrite train` prints).
    pub resumed: Option<Resumed>,
    /// Why the run ended before its last epoch, if it did.
    pub stopped_early: Option<String>,
    /// Why no checkpoint holds the end of the run although `save_checkpoint` was set: checkpoints
    /// are written at the end of an epoch (a resume continues at an epoch's start), and
    /// `max_steps` stopped the run inside one. The line `ferrite train` prints.
    pub checkpoint_not_written: Option<String>,
    /// Optimizer steps taken in all.
    pub steps: u64,
    /// The best evaluation value of the tracked metric and its 1-based epoch (`keep_best` or
    /// `early_stopping`).
    pub best: Option<(f64, usize)>,
    pub elapsed: Duration,
}

type StepCallback<'a> = Box<dyn FnMut(&StepInfo) + 'a>;
type EpochCallback<'a> = Box<dyn FnMut(&EpochSummary) + 'a>;
type StartCallback<'a> = Box<dyn FnMut(usize) + 'a>;
type ResumeCallback<'a> = Box<dyn FnMut(&Resumed) + 'a>;
type EvalFn<'a, M> = Box<dyn FnMut(&mut M) -> Result<Metrics, TrainError> + 'a>;
type MakeOptimizer<'a> = Box<dyn FnOnce(Vec<Tensor>) -> Result<Box<dyn Optimizer>, TrainError> + 'a>;
type PlanFn<'a> = Box<dyn FnOnce() -> Result<PlanContext, String> + 'a>;
type MakeScheduler<'a> = Box<dyn FnOnce(&mut dyn Optimizer) -> Result<Box<dyn LrScheduler>, TrainError> + 'a>;
type ReplicateFn<M> = Box<dyn FnOnce(M) -> Result<Box<dyn Replicated<M>>, TrainError>>;

/// The model of a run: on one device, or replicated by DataParallel.
enum Held<M> {
    One(M),
    Replicas(Box<dyn Replicated<M>>),
}

impl<M> Held<M> {
    fn get(&self) -> &M {
        match self {
            Held::One(m) => m,
            Held::Replicas(r) => r.module(),
        }
    }

    fn get_mut(&mut self) -> &mut M {
        match self {
            Held::One(m) => m,
            Held::Replicas(r) => r.module_mut(),
        }
    }

    fn into_inner(self) -> M {
        match self {
            Held::One(m) => m,
            Held::Replicas(r) => r.into_module(),
        }
    }

    fn replicas(&self) -> Option<&dyn Replicated<M>> {
        match self {
            Held::One(_) => None,
            Held::Replicas(r) => Some(&**r),
        }
    }
}

/// The optimizer given to the builder, or how to build it over the run's trainable tensors.
enum OptimizerSource<'a> {
    Given(Box<dyn Optimizer>),
    Make(MakeOptimizer<'a>),
}

/// Stop when the metric has not improved for `patience` evaluations in a row.
#[derive(Debug, Clone)]
struct EarlyStopping {
    metric: String,
    goal: Goal,
    patience: usize,
}

/// Keep the weights of the best evaluation (safetensors, written atomically).
#[derive(Debug, Clone)]
struct KeepBest {
    path: PathBuf,
    metric: String,
    goal: Goal,
}

/// Builds a [`Trainer`]; every setting has the default of a plain f32 run.
pub struct TrainerBuilder<'a, M: Module> {
    model: M,
    optimizer: OptimizerSource<'a>,
    /// `data_parallel`: replicates the model when the trainer is built.
    replicate: Option<ReplicateFn<M>>,
    checkpoint_activations: Option<bool>,
    plan: Option<PlanFn<'a>>,
    on_resume: Vec<ResumeCallback<'a>>,
    scheduler: Option<Box<dyn LrScheduler>>,
    /// `scheduler_with`: builds the schedule over the optimizer `build` makes.
    make_scheduler: Option<MakeScheduler<'a>>,
    device: Device,
    epochs: usize,
    max_steps: Option<u64>,
    accum_steps: usize,
    amp: Option<AmpMode>,
    clip_grad_norm: Option<f64>,
    progress: bool,
    save_checkpoint: Option<PathBuf>,
    resume: Option<PathBuf>,
    observe: ObserveSettings,
    run: Option<RunObserver>,
    run_name: (String, String),
    settings: Vec<(String, String)>,
    dropout_rng: Option<RngHandle>,
    sync: Option<StepSync>,
    eval: Option<EvalFn<'a, M>>,
    early_stopping: Option<EarlyStopping>,
    keep_best: Option<KeepBest>,
    on_step: Vec<StepCallback<'a>>,
    on_epoch: Vec<EpochCallback<'a>>,
    on_epoch_start: Vec<StartCallback<'a>>,
    on_evaluation: Vec<EpochCallback<'a>>,
    rank0: bool,
}

impl<'a, M: Module> TrainerBuilder<'a, M> {
    /// The device the model lives on (its memory line and the metrics report it). Default: `cpu`.
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }
    /// Epochs to train, including those a resumed checkpoint already has. Default 1.
    pub fn epochs(mut self, epochs: usize) -> Self {
        self.epochs = epochs;
        self
    }
    /// Stop after this many optimizer steps (in the middle of an epoch if need be).
    pub fn max_steps(mut self, steps: u64) -> Self {
        self.max_steps = Some(steps);
        self
    }
    /// One optimizer step per `k` micro-batches (each loss scaled by 1/k). Default 1.
    pub fn accum_steps(mut self, k: usize) -> Self {
        self.accum_steps = k;
        self
    }
    /// Autocast to bf16 or f16 in the step; f16 adds dynamic loss scaling (GradScaler).
    pub fn amp(mut self, amp: Option<AmpMode>) -> Self {
        self.amp = amp;
        self
    }
    /// Clip the gradients' total norm before each step (after unscaling).
    pub fn clip_grad_norm(mut self, max_norm: f64) -> Self {
        self.clip_grad_norm = Some(max_norm);
        self
    }
    /// An LR schedule, stepped after every optimizer step (PyTorch's per-iteration use).
    pub fn scheduler(mut self, scheduler: impl LrScheduler + 'static) -> Self {
        self.scheduler = Some(Box::new(scheduler));
        self
    }
    /// [`TrainerBuilder::scheduler`] for a schedule already boxed (chosen at run time).
    pub fn scheduler_boxed(mut self, scheduler: Box<dyn LrScheduler>) -> Self {
        self.scheduler = Some(scheduler);
        self
    }
    /// A schedule made over the optimizer when the trainer is built — for an optimizer that
    /// [`Trainer::builder_with`] makes then (under [`data_parallel`](Self::data_parallel), over
    /// the owners' tensors), which a schedule cannot be given beforehand. Replaces a
    /// [`scheduler`](Self::scheduler) given before.
    pub fn scheduler_with(
        mut self,
        make: impl FnOnce(&mut dyn Optimizer) -> Result<Box<dyn LrScheduler>, TrainError> + 'a,
    ) -> Self {
        self.make_scheduler = Some(Box::new(make));
        self
    }
    /// Show a progress bar (only when stderr is a terminal). Default off.
    pub fn progress(mut self, show: bool) -> Self {
        self.progress = show;
        self
    }
    /// Write a training checkpoint here after every epoch (atomically).
    pub fn save_checkpoint(mut self, path: impl Into<PathBuf>) -> Self {
        self.save_checkpoint = Some(path.into());
        self
    }
    /// Continue from a checkpoint written by `save_checkpoint` (bit-identically).
    pub fn resume(mut self, path: impl Into<PathBuf>) -> Self {
        self.resume = Some(path.into());
        self
    }
    /// Prometheus endpoint and JSON-lines file for the run.
    pub fn observe(mut self, observe: ObserveSettings) -> Self {
        self.observe = observe;
        self
    }
    /// An observer already started (e.g. with [`crate::start_observer`], which announces its
    /// address): the run reports to it instead of starting one from `observe`.
    pub fn run_observer(mut self, run: RunObserver) -> Self {
        self.run = Some(run);
        self
    }
    /// The model's and the data's names in the metrics (`ferrite_run_info`).
    pub fn run_name(mut self, model: impl Into<String>, dataset: impl Into<String>) -> Self {
        self.run_name = (model.into(), dataset.into());
        self
    }
    /// A setting a resume must not change (e.g. `("hidden", "128")`); the checkpoint stores it
    /// and a resume with another value is refused naming it. The trainer adds its own
    /// (accumulation, precision).
    pub fn setting(mut self, name: impl Into<String>, value: impl ToString) -> Self {
        self.settings.push((name.into(), value.to_string()));
        self
    }
    /// The generator the model's dropout layers draw from: saved with each checkpoint and
    /// restored on resume, so a resumed run draws the same masks.
    pub fn dropout_rng(mut self, rng: RngHandle) -> Self {
        self.dropout_rng = Some(rng);
        self
    }
    /// Average gradients over MPI ranks (DistributedDataParallel): the `StepSync` of
    /// `Distributed::sync_for(&model)`. Only rank 0 should write checkpoints: see `rank0`.
    pub fn gradient_sync(mut self, sync: StepSync) -> Self {
        self.sync = Some(sync);
        self
    }
    /// Whether this process writes checkpoints and best weights (false on ranks other than 0).
    pub fn rank0(mut self, writes: bool) -> Self {
        self.rank0 = writes;
        self
    }
    /// How to evaluate the model after each epoch (wrap its forward passes in
    /// `ferrite_nn::inference` for eval mode without a graph).
    pub fn evaluate(mut self, eval: impl FnMut(&mut M) -> Result<Metrics, TrainError> + 'a) -> Self {
        self.eval = Some(Box::new(eval));
        self
    }
    /// Stop when evaluation metric `metric` has not improved for `patience` evaluations.
    pub fn early_stopping(mut self, metric: impl Into<String>, goal: Goal, patience: usize) -> Self {
        self.early_stopping = Some(EarlyStopping { metric: metric.into(), goal, patience });
        self
    }
    /// Write the weights to `path` whenever evaluation metric `metric` reaches a new best.
    pub fn keep_best(mut self, path: impl Into<PathBuf>, metric: impl Into<String>, goal: Goal) -> Self {
        self.keep_best = Some(KeepBest { path: path.into(), metric: metric.into(), goal });
        self
    }
    /// Called after every optimizer step.
    pub fn on_step(mut self, f: impl FnMut(&StepInfo) + 'a) -> Self {
        self.on_step.push(Box::new(f));
        self
    }
    /// Called before every epoch with its 0-based index (e.g. a sampler's `set_epoch`).
    pub fn on_epoch_start(mut self, f: impl FnMut(usize) + 'a) -> Self {
        self.on_epoch_start.push(Box::new(f));
        self
    }
    /// Called after every epoch (its evaluation included).
    pub fn on_epoch(mut self, f: impl FnMut(&EpochSummary) + 'a) -> Self {
        self.on_epoch.push(Box::new(f));
        self
    }
    /// Called after every evaluation, before `on_epoch`.
    pub fn on_evaluation(mut self, f: impl FnMut(&EpochSummary) + 'a) -> Self {
        self.on_evaluation.push(Box::new(f));
        self
    }

    /// DataParallel (PyTorch's `nn.DataParallel`, with balanced memory — see
    /// `ferrite_parallel::DataParallel`): the model is replicated on `devices` (the first is the
    /// primary, where evaluation runs and the model's values are read), each micro-batch is
    /// scattered along dim 0 between the replicas, every replica runs the step (forward and loss)
    /// on its shard and its backward pass on its own thread, and each parameter's gradients are
    /// summed onto its owner (`policy`). The result equals the single-device step on the whole
    /// batch with a mean loss; accumulation, f16 loss scaling, clipping, checkpoints (in the
    /// single-device layout) and resuming work as on one device.
    ///
    /// The batches must be tensors DataParallel can split (a `Tensor`, a pair or triple of
    /// tensors, or a `Vec<Tensor>`); the steps of the replicas take turns through the one
    /// [`TrainStep`] (its backward passes run in parallel). Build the optimizer with
    /// [`Trainer::builder_with`] (it receives the owners' tensors), or with
    /// [`OwnerPolicy::Primary`] over the model's own parameters.
    pub fn data_parallel(mut self, devices: &[Device], policy: OwnerPolicy) -> Self
    where
        M: Clone + 'static,
    {
        if let Some(primary) = devices.first() {
            self.device = primary.clone();
        }
        let devices = devices.to_vec();
        self.replicate = Some(Box::new(move |model| replicas::replicate(model, &devices, policy)));
        self
    }

    /// Activation checkpointing on (or off) for a model that supports it
    /// ([`Module::set_activation_checkpointing`]: ferrite-models' MLP, CNN, LSTM, transformer,
    /// Hugging Face decoders and T5 do, and so does any model with one of them inside): each block's
    /// activations are recomputed in backward instead of kept, trading compute for memory. A model
    /// that cannot is refused by `build` (`TrainError::CheckpointingUnsupported`).
    pub fn checkpoint_activations(mut self, on: bool) -> Self {
        self.checkpoint_activations = Some(on);
        self
    }

    /// What to tell a user whose run runs out of memory: `plan` describes the run to the planner
    /// (called only then), whose ranked remedies — what each change saves for this model, and
    /// whether it then fits — replace the report's fixed rules; `Err(reason)` keeps them and
    /// says why the planner cannot model the run.
    pub fn planner(mut self, plan: impl FnOnce() -> Result<PlanContext, String> + 'a) -> Self {
        self.plan = Some(Box::new(plan));
        self
    }

    /// Called once when `fit` resumes from the `resume` checkpoint (`ferrite train` prints it).
    pub fn on_resume(mut self, f: impl FnMut(&Resumed) + 'a) -> Self {
        self.on_resume.push(Box::new(f));
        self
    }

    /// Checks the settings and builds the trainer.
    pub fn build(mut self) -> Result<Trainer<'a, M>, TrainError> {
        let invalid = |setting: &'static str, value: String, expected: &'static str| {
            Err(TrainError::InvalidArgument { flag: setting, value, expected })
        };
        if self.epochs == 0 {
            return invalid("epochs", "0".into(), "must be at least 1");
        }
        if self.accum_steps == 0 {
            return invalid("accum-steps", "0".into(), "must be at least 1");
        }
        if let Some(c) = self.clip_grad_norm
            && !(c.is_finite() && c > 0.0)
        {
            return invalid("clip-grad-norm", c.to_string(), "must be a positive number");
        }
        if self.max_steps == Some(0) {
            return invalid("steps", "0".into(), "must be at least 1");
        }
        if (self.early_stopping.is_some() || self.keep_best.is_some()) && self.eval.is_none() {
            return invalid(
                "early-stopping/keep-best",
                "set".into(),
                "needs an evaluation: give the builder `.evaluate(...)`",
            );
        }
        if matches!(self.device, Device::Meta) {
            return Err(TrainError::MetaDevice);
        }
        if let Some(on) = self.checkpoint_activations
            && !self.model.set_activation_checkpointing(on)
            && on
        {
            return Err(TrainError::CheckpointingUnsupported { model: self.model.type_name() });
        }
        let model = match self.replicate.take() {
            Some(replicate) => Held::Replicas(replicate(self.model)?),
            None => Held::One(self.model),
        };
        let trainable = match &model {
            Held::One(m) => m.parameters(),
            Held::Replicas(r) => r.parameters(),
        };
        let mut optimizer = match self.optimizer {
            OptimizerSource::Given(opt) => opt,
            OptimizerSource::Make(make) => make(trainable)?,
        };
        let scheduler = match self.make_scheduler {
            Some(make) => Some(make(&mut *optimizer)?),
            None => self.scheduler,
        };
        if let Held::Replicas(r) = &model {
            if self.sync.is_some() {
                return invalid(
                    "data-parallel",
                    "with gradient_sync".into(),
                    "DataParallel (devices of one process) and DDP (MPI ranks) are separate settings: choose one",
                );
            }
            // The trainer's own wording (it names `builder_with`) for DataParallel's check.
            if let Err(ferrite_parallel::ParallelError::OptimizerNotOnOwners { shape, device }) =
                r.check_optimizer(&*optimizer)
            {
                return Err(TrainError::OptimizerNotOnReplicas { shape, device, devices: r.devices().len() });
            }
        }
        let mut stepper = crate::stepper::Stepper::new(optimizer, self.accum_steps, self.amp, self.clip_grad_norm)?;
        stepper.sync = self.sync;
        let mut settings = self.settings;
        for (name, value) in
            [("accum-steps", self.accum_steps.to_string()), ("amp", self.amp.map_or("none", AmpMode::name).to_string())]
        {
            if !settings.iter().any(|(n, _)| n == name) {
                settings.push((name.to_string(), value));
            }
        }
        Ok(Trainer {
            model,
            plan: self.plan,
            on_resume: self.on_resume,
            stepper,
            scheduler,
            device: self.device,
            epochs: self.epochs,
            max_steps: self.max_steps,
            amp: self.amp,
            progress: self.progress,
            save_checkpoint: self.save_checkpoint,
            resume: self.resume,
            observe: self.observe,
            run: self.run,
            run_name: self.run_name,
            settings,
            dropout_rng: self.dropout_rng.unwrap_or_else(|| RngHandle::new(0)),
            eval: self.eval,
            early_stopping: self.early_stopping,
            keep_best: self.keep_best,
            on_step: self.on_step,
            on_epoch: self.on_epoch,
            on_epoch_start: self.on_epoch_start,
            on_evaluation: self.on_evaluation,
            rank0: self.rank0,
        })
    }
}

/// Trains a model; see the module docs and [`Trainer::builder`].
pub struct Trainer<'a, M: Module> {
    model: Held<M>,
    plan: Option<PlanFn<'a>>,
    on_resume: Vec<ResumeCallback<'a>>,
    stepper: crate::stepper::Stepper,
    scheduler: Option<Box<dyn LrScheduler>>,
    device: Device,
    epochs: usize,
    max_steps: Option<u64>,
    amp: Option<AmpMode>,
    progress: bool,
    save_checkpoint: Option<PathBuf>,
    resume: Option<PathBuf>,
    observe: ObserveSettings,
    run: Option<RunObserver>,
    run_name: (String, String),
    settings: Vec<(String, String)>,
    dropout_rng: RngHandle,
    eval: Option<EvalFn<'a, M>>,
    early_stopping: Option<EarlyStopping>,
    keep_best: Option<KeepBest>,
    on_step: Vec<StepCallback<'a>>,
    on_epoch: Vec<EpochCallback<'a>>,
    on_epoch_start: Vec<StartCallback<'a>>,
    on_evaluation: Vec<EpochCallback<'a>>,
    rank0: bool,
}

impl<'a, M: Module> Trainer<'a, M> {
    /// A trainer of `model` with `optimizer` (any of ferrite-optim's, built over the model's
    /// parameters).
    pub fn builder(model: M, optimizer: impl Optimizer + 'static) -> TrainerBuilder<'a, M> {
        Self::builder_boxed(model, Box::new(optimizer))
    }

    /// As [`Trainer::builder`] with an optimizer chosen at run time.
    pub fn builder_boxed(model: M, optimizer: Box<dyn Optimizer>) -> TrainerBuilder<'a, M> {
        Self::builder_from(model, OptimizerSource::Given(optimizer))
    }

    /// A trainer of `model` whose optimizer `make_optimizer` builds over the tensors it is to
    /// update, when the trainer is built: the model's parameters, or under
    /// [`data_parallel`](TrainerBuilder::data_parallel) each parameter (or piece of one) on its
    /// owner replica — Lightning's `configure_optimizers`.
    ///
    /// ```no_run
    /// # use ferrite_train::{TrainError, Trainer};
    /// # use ferrite_nn::Linear;
    /// # use ferrite_optim::{Adam, AdamConfig};
    /// # use ferrite_parallel::OwnerPolicy;
    /// # use ferrite_memory::{Device, select_devices};
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let devices = select_devices(&Device::parse("sim:a100-40gb")?, Some("0,1"))?;
    /// let trainer = Trainer::builder_with(Linear::new(64, 10)?, |params| Adam::new(params, AdamConfig::adamw(1e-3)))
    ///     .data_parallel(&devices, OwnerPolicy::Sharded)
    ///     .epochs(3)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder_with<O, E>(
        model: M,
        make_optimizer: impl FnOnce(Vec<Tensor>) -> Result<O, E> + 'a,
    ) -> TrainerBuilder<'a, M>
    where
        O: Optimizer + 'static,
        E: Into<TrainError>,
    {
        let make: MakeOptimizer<'a> = Box::new(move |params| {
            make_optimizer(params).map(|o| Box::new(o) as Box<dyn Optimizer>).map_err(Into::into)
        });
        Self::builder_from(model, OptimizerSource::Make(make))
    }

    fn builder_from(model: M, optimizer: OptimizerSource<'a>) -> TrainerBuilder<'a, M> {
        TrainerBuilder {
            model,
            optimizer,
            replicate: None,
            checkpoint_activations: None,
            plan: None,
            on_resume: Vec::new(),
            scheduler: None,
            make_scheduler: None,
            device: Device::Cpu,
            epochs: 1,
            max_steps: None,
            accum_steps: 1,
            amp: None,
            clip_grad_norm: None,
            progress: false,
            save_checkpoint: None,
            resume: None,
            observe: ObserveSettings::default(),
            run: None,
            run_name: (String::from("model"), String::from("data")),
            settings: Vec::new(),
            dropout_rng: None,
            sync: None,
            eval: None,
            early_stopping: None,
            keep_best: None,
            on_step: Vec::new(),
            on_epoch: Vec::new(),
            on_epoch_start: Vec::new(),
            on_evaluation: Vec::new(),
            rank0: true,
        }
    }

    /// The model (under DataParallel, the primary replica: up to date after every step).
    pub fn model(&self) -> &M {
        self.model.get()
    }

    /// The model, to change it (under DataParallel, the primary replica: the other replicas take
    /// its values at the next resume or load; change weights before `fit`, not between steps).
    pub fn model_mut(&mut self) -> &mut M {
        self.model.get_mut()
    }

    /// The trained model (under DataParallel, the primary replica, on the first device).
    pub fn into_model(self) -> M {
        self.model.into_inner()
    }

    /// Under DataParallel: every device's memory now (allocated, reserved and their peaks).
    pub fn replica_memory(&self) -> Option<MemoryReport> {
        self.model.replicas().map(|r| r.memory_report())
    }

    /// The optimizer's state in the single-device layout (under DataParallel with sharded
    /// owners, the pieces' state joined): what a checkpoint stores.
    pub fn optimizer_state_dict(&self) -> Result<OptimizerState, TrainError> {
        Ok(match self.model.replicas() {
            Some(r) => r.optimizer_state_dict(&*self.stepper.opt)?,
            None => self.stepper.opt.state_dict()?,
        })
    }

    pub fn optimizer(&self) -> &dyn Optimizer {
        &*self.stepper.opt
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.stepper.steps
    }

    /// The observer given to the builder with `run_observer`, after `fit` (to finish it when the
    /// caller's own epilogue is done).
    pub fn take_run_observer(&mut self) -> Option<RunObserver> {
        self.run.take()
    }

    /// The gradient averaging given to the builder, for its closing exchange
    /// (`Distributed::finish_and_report`).
    pub fn take_gradient_sync(&mut self) -> Option<StepSync> {
        self.stepper.sync.take()
    }

    /// Trains for the configured epochs over `loader`, each micro-batch through `step`. A device
    /// that runs out of memory ends the run with [`TrainError::OutOfMemory`], whose report ranks
    /// the planner's remedies when the builder was given a [`planner`](TrainerBuilder::planner).
    pub fn fit<D, C, S>(&mut self, loader: &mut DataLoader<D, C>, step: S) -> Result<FitReport, TrainError>
    where
        D: Dataset,
        C: Collate<D::Sample>,
        S: TrainStep<M, C::Batch> + Send,
    {
        self.fit_epochs(loader, step).map_err(|e| match self.plan.take() {
            Some(plan) if e.is_out_of_memory() => crate::planned::with_planned_remedies(e, plan()),
            _ => e,
        })
    }

    fn fit_epochs<D, C, S>(&mut self, loader: &mut DataLoader<D, C>, mut step: S) -> Result<FitReport, TrainError>
    where
        D: Dataset,
        C: Collate<D::Sample>,
        S: TrainStep<M, C::Batch> + Send,
    {
        let start = Instant::now();
        let device = self.device.clone();
        let info = RunInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            model: self.run_name.0.clone(),
            dataset: self.run_name.1.clone(),
            device: device.to_string(),
        };
        let mut devices = vec![device.clone()];
        if device != Device::Cpu {
            devices.push(Device::Cpu);
        }
        // An observer given to the builder stays the caller's (take it back with
        // `take_run_observer`); one started here ends with the run.
        let (run, given) = match self.run.take() {
            Some(run) => (run, true),
            None if self.observe.any() => (RunObserver::start(&self.observe, info, devices)?, false),
            None => (RunObserver::disabled(), false),
        };
        let resumed = {
            let model = &mut self.model;
            let mut restore = |weights: &ferrite_nn::StateDict,
                               opt: &mut dyn Optimizer,
                               state: &OptimizerState|
             -> Result<(), TrainError> {
                match model {
                    Held::One(m) => crate::stepper::restore_plain(m, weights, opt, state),
                    Held::Replicas(r) => {
                        // The primary takes the weights, the other replicas the primary's values;
                        // the optimizer's single-device state is split over the owners.
                        r.module_mut().load_state_dict(weights, true)?;
                        r.sync_replicas()?;
                        Ok(r.load_optimizer_state_dict(opt, state)?)
                    }
                }
            };
            self.stepper.resume_if_asked(
                self.resume.as_deref(),
                self.epochs,
                &mut restore,
                &self.dropout_rng,
                loader,
                &device,
                &self.settings,
            )?
        };
        let first_epoch = resumed.as_ref().map_or(0, |r| r.epoch);
        if resumed.is_some()
            && let Some(s) = &mut self.scheduler
        {
            // The schedule is not in the checkpoint, but it is a function of the steps taken:
            // step it as often as the checkpointed run did. The optimizer's rates came back with
            // its state and are already the ones that run had; they are put back afterwards, so
            // a chainable schedule's next step starts from them, as it would have.
            let opt = &mut *self.stepper.opt;
            let rates = opt.lrs();
            for _ in 0..self.stepper.steps {
                s.step(opt)?;
            }
            for (g, lr) in rates.into_iter().enumerate() {
                opt.set_lr(g, lr)?;
            }
        }
        if let Some(r) = &resumed {
            for f in &mut self.on_resume {
                f(r);
            }
        }
        run.set_steps(self.stepper.steps);
        let mut report = FitReport {
            epochs: Vec::new(),
            resumed_epochs: first_epoch,
            resumed,
            stopped_early: None,
            checkpoint_not_written: None,
            steps: self.stepper.steps,
            best: None,
            elapsed: Duration::ZERO,
        };
        let tracked = self
            .early_stopping
            .as_ref()
            .map(|e| (e.metric.clone(), e.goal))
            .or_else(|| self.keep_best.as_ref().map(|k| (k.metric.clone(), k.goal)));
        let mut since_best = 0usize;
        for epoch in first_epoch..self.epochs {
            for f in &mut self.on_epoch_start {
                f(epoch);
            }
            let epoch_start = Instant::now();
            if let Held::Replicas(r) = &mut self.model {
                // Every replica in the primary's mode (an evaluation may have switched it), and
                // the devices' peaks measured from here.
                let training = r.module().is_training();
                r.train(training);
                r.reset_peak_memory_stats();
            }
            let mut meter = EpochMeter::start(self.progress, &device, loader.len(), epoch, self.epochs);
            step.start_epoch(self.model.get(), epoch)?;
            let mut train = Metrics::new();
            let mut samples = 0usize;
            let mut reached_max = false;
            run.epoch_started(epoch + 1, self.epochs);
            for batch in run.time_loader(loader.epoch()) {
                let batch = batch?;
                let pass = MemoryScope::new("forward+backward", &device).quiet();
                let before = self.stepper.steps;
                let loss = match &self.model {
                    Held::One(model) => {
                        let mut out = {
                            let _amp = self.amp.map(|a| autocast(a.dtype())).transpose()?;
                            step.step(model, &batch).during("forward pass", &device)?
                        };
                        self.stepper.backward(&out.loss, &device, &run)?;
                        let loss = out.loss.item()?;
                        samples += out.samples;
                        for (name, v) in &out.sums {
                            train.add(name, *v);
                        }
                        if let Some(after) = out.after.take() {
                            for (name, v) in after()? {
                                train.add(&name, v);
                            }
                        }
                        run.batch(BatchReport { samples: out.samples, loss });
                        loss
                    }
                    Held::Replicas(r) => {
                        let scale = self.stepper.loss_scale();
                        let _amp = self.amp.map(|a| autocast(a.dtype())).transpose()?;
                        let out = replicated_step(&**r, &mut step, &batch, scale).during("forward pass", &device)?;
                        drop(_amp);
                        self.stepper.micro_batch_done(&device, &run)?;
                        if self.stepper.steps > before {
                            r.sync_from_owners()?;
                        }
                        samples += out.samples;
                        for (name, v) in &out.sums {
                            train.add(name, *v);
                        }
                        run.batch(BatchReport { samples: out.samples, loss: out.loss });
                        out.loss
                    }
                };
                meter.batch(pass, loss);
                drop(batch);
                if self.stepper.steps > before {
                    self.after_step(loss)?;
                }
                if self.max_steps.is_some_and(|m| self.stepper.steps >= m) {
                    reached_max = true;
                    break;
                }
            }
            if !reached_max {
                let before = self.stepper.steps;
                self.stepper.finish_epoch(&device, &run)?;
                if self.stepper.steps > before {
                    if let Some(r) = self.model.replicas() {
                        r.sync_from_owners()?;
                    }
                    self.after_step(f64::NAN)?;
                }
            }
            run.epoch_finished();
            let (mean_loss, mut memory_line, _) = meter.finish();
            let replica_memory = self.model.replicas().map(|r| r.memory_report());
            if let Some(m) = &replica_memory {
                memory_line.push_str(&format!("; {}", m.peaks_line()));
            }
            // Reserved memory the evaluation added (blocks the caching allocator keeps for the next
            // epoch) is named on the epoch's line, so it is not mistaken for the training pass's.
            let reserved_before = ferrite_memory::allocator(&device).memory_reserved();
            // ZeRO-3: the evaluation runs on the whole model (every rank may see a different
            // number of test batches, and a block's gather needs every rank), sharded again after.
            let whole = self.eval.is_some() && self.stepper.sync.as_ref().and_then(StepSync::zero_stage) == Some(3);
            if let Some(sync) = self.stepper.sync.as_ref().filter(|_| whole) {
                sync.gather_whole_model()?;
            }
            let eval = match &mut self.eval {
                Some(f) => f(self.model.get_mut()).during("evaluation", &device)?,
                None => Metrics::new(),
            };
            let eval_reserved = ferrite_memory::allocator(&device).memory_reserved().saturating_sub(reserved_before);
            if eval_reserved > 0 {
                memory_line.push_str(&format!("; evaluation reserved +{}", ferrite_memory::format_size(eval_reserved)));
            }
            let summary = EpochSummary {
                epoch: epoch + 1,
                epochs: self.epochs,
                mean_loss,
                samples,
                train,
                eval,
                memory_line,
                elapsed: epoch_start.elapsed(),
                steps: self.stepper.steps,
                replica_memory,
            };
            if self.eval.is_some() {
                for f in &mut self.on_evaluation {
                    f(&summary);
                }
            }
            // The best evaluation so far: keep its weights, and count evaluations without one.
            if let Some((metric, goal)) = &tracked {
                let value = summary.eval.get(metric).ok_or_else(|| TrainError::MissingMetric {
                    metric: metric.clone(),
                    found: summary.eval.names().join(", "),
                })?;
                if report.best.is_none_or(|(b, _)| goal.improves(value, b)) {
                    report.best = Some((value, epoch + 1));
                    since_best = 0;
                    if let Some(k) = self.keep_best.as_ref().filter(|_| self.rank0) {
                        save_weights(&k.path, self.model.get())?;
                    }
                } else {
                    since_best += 1;
                }
            }
            if let Some(sync) = self.stepper.sync.as_ref().filter(|_| whole) {
                sync.release_whole_model()?;
            }
            // Rank 0 writes the checkpoint; under ZeRO every rank writes its shard.
            let writes = self.rank0 || self.stepper.every_rank_saves();
            if let Some(path) = self.save_checkpoint.as_ref().filter(|_| writes && !reached_max) {
                let optimizer = match self.model.replicas() {
                    Some(r) => Some(r.optimizer_state_dict(&*self.stepper.opt)?),
                    None => None,
                };
                self.stepper.save_checkpoint(
                    path,
                    epoch + 1,
                    self.model.get(),
                    optimizer,
                    loader.generator_state(),
                    &self.dropout_rng,
                    &self.settings,
                )?;
            }
            for f in &mut self.on_epoch {
                f(&summary);
            }
            report.epochs.push(summary);
            if reached_max {
                report.stopped_early = Some(format!("reached {} optimizer steps", self.stepper.steps));
                if let Some(path) = self.save_checkpoint.as_ref().filter(|_| self.rank0) {
                    report.checkpoint_not_written = Some(format!(
                        "note: the run stopped after {} optimizer steps, inside epoch {}; checkpoints are written at the end of an epoch, so {} holds {} (the trained weights are in the run's output). For a checkpoint of the last step, make --steps a multiple of the steps per epoch, or use --epochs",
                        self.stepper.steps,
                        epoch + 1,
                        path.display(),
                        if epoch > 0 {
                            format!("the end of epoch {epoch}")
                        } else {
                            "nothing from this run".to_string()
                        }
                    ));
                }
                break;
            }
            if let Some(e) = &self.early_stopping
                && since_best >= e.patience
            {
                report.stopped_early = Some(format!(
                    "`{}` has not improved for {} evaluations (best {:.6} after epoch {})",
                    e.metric,
                    since_best,
                    report.best.map_or(f64::NAN, |b| b.0),
                    report.best.map_or(0, |b| b.1)
                ));
                break;
            }
        }
        if given {
            self.run = Some(run);
        } else {
            run.finish();
        }
        report.steps = self.stepper.steps;
        report.elapsed = start.elapsed();
        Ok(report)
    }

    fn after_step(&mut self, loss: f64) -> Result<(), TrainError> {
        if let Some(s) = &mut self.scheduler {
            s.step(&mut *self.stepper.opt)?;
        }
        let info = StepInfo {
            step: self.stepper.steps,
            applied: self.stepper.last_applied,
            lr: self.stepper.opt.lrs().first().copied().unwrap_or(f64::NAN),
            loss,
        };
        for f in &mut self.on_step {
            f(&info);
        }
        Ok(())
    }
}

/// What the replicas' steps of one micro-batch gave together.
struct ReplicatedOutput {
    /// The batch's loss: the replicas' losses weighted by their samples.
    loss: f64,
    samples: usize,
    sums: Vec<(String, f64)>,
}

/// One micro-batch under DataParallel: scattered over the replicas, each running `step` on its
/// shard (in turns: there is one step) and its scaled loss's backward pass (in parallel). Each
/// replica's `after_step` metrics are read right after its loss (the logits they read do not
/// change in the backward pass).
fn replicated_step<M, B, S>(
    replicas: &dyn Replicated<M>,
    step: &mut S,
    batch: &B,
    scale: LossScale,
) -> Result<ReplicatedOutput, TrainError>
where
    B: 'static,
    S: TrainStep<M, B> + Send,
{
    let batch_type = std::any::type_name::<B>();
    let tensors = replicas::batch_tensors(batch)
        .ok_or_else(|| TrainError::NotScatterable { batch_type, supported: replicas::SCATTERABLE })?;
    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
    let step = Mutex::new(step);
    // (shard samples, loss) of every replica, the step's samples and its metric sums.
    type Gathered = (Vec<(usize, f64)>, usize, Vec<(String, f64)>);
    let gathered: Mutex<Gathered> = Mutex::new((Vec::new(), 0, Vec::new()));
    let failure: Mutex<Option<TrainError>> = Mutex::new(None);
    let replica_step = |m: &M, shard: &Shard| -> Result<Tensor, ParallelError> {
        let run = || -> Result<Tensor, TrainError> {
            let b: B = replicas::rebuild_batch(&shard.tensors)
                .ok_or(TrainError::NotScatterable { batch_type, supported: replicas::SCATTERABLE })?;
            let mut out = lock(&step).step(m, &b)?;
            let value = out.loss.item()?;
            let mut sums = std::mem::take(&mut out.sums);
            if let Some(after) = out.after.take() {
                sums.extend(after()?);
            }
            let scaled = scale.apply(&out.loss)?;
            let mut g = lock(&gathered);
            g.0.push((shard.samples, value));
            g.1 += out.samples;
            g.2.extend(sums);
            Ok(scaled)
        };
        run().map_err(|e| {
            let message = e.to_string();
            lock(&failure).get_or_insert(e);
            ParallelError::ReplicaPanicked { device: shard.device.to_string(), message }
        })
    };
    let result = replicas.forward_backward(&tensors, &replica_step);
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    result?;
    let (losses, samples, sums) = gathered.into_inner().unwrap_or_else(|p| p.into_inner());
    let total: usize = losses.iter().map(|(n, _)| n).sum();
    let loss = losses.iter().map(|&(n, l)| n as f64 * l).sum::<f64>() / total.max(1) as f64;
    Ok(ReplicatedOutput { loss, samples, sums })
}

/// The model's state dict as safetensors at `path`, written atomically.
fn save_weights(path: &Path, model: &dyn Module) -> Result<(), TrainError> {
    let sd = model.state_dict();
    ferrite_io::save_state_dict(path, sd.iter())?;
    Ok(())
}
