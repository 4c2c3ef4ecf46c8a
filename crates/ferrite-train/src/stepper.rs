//! The optimizer step every training loop shares: gradient accumulation, loss scaling (f16's
//! GradScaler), clipping, averaging over ranks when distributed, and the checkpoint written after
//! an epoch and read on resume.
//!
//! Why one piece: an image classifier and a language model differ in their data and their
//! metrics, not in how a step is taken or a run is resumed — a resume that is bit-identical for
//! one must be for the other, so both go through the same code.

use std::path::Path;

use ferrite_data::{Collate, DataLoader, Dataset};
use ferrite_nn::{Module, RngHandle, StateDict};
use ferrite_optim::{Accumulator, GradScaler, GradScalerConfig, Optimizer, OptimizerState, clip_grad_norm_};
use ferrite_plan::AmpMode;
use ferrite_tensor::{Device, GeneratorState, Tensor};

use crate::distributed::StepSync;
use crate::error::{During, TrainError};
use crate::observe::{RunObserver, StepReport};
use crate::resume::{self, TrainingState};

/// The optimizer, the GradScaler and gradient accumulation: turns micro-batch losses into
/// optimizer steps.
pub struct Stepper {
    pub opt: Box<dyn Optimizer>,
    pub scaler: GradScaler,
    acc: Accumulator,
    clip: Option<f64>,
    /// Optimizer steps taken (a resumed run starts at its checkpoint's).
    pub steps: u64,
    /// Whether the last optimizer step was applied (false: the GradScaler skipped it).
    pub last_applied: bool,
    /// `--distributed`: gradients averaged over the MPI ranks before each step.
    pub sync: Option<StepSync>,
}

impl Stepper {
    /// Steps `opt` once per `accum_steps` micro-batches; with `amp` f16 the losses are scaled
    /// (dynamic loss scaling), and with `clip` the gradients' total norm is clipped before each step.
    pub fn new(
        opt: Box<dyn Optimizer>,
        accum_steps: usize,
        amp: Option<AmpMode>,
        clip: Option<f64>,
    ) -> Result<Stepper, TrainError> {
        let scaler =
            GradScaler::new(GradScalerConfig { enabled: amp == Some(AmpMode::F16), ..GradScalerConfig::default() })?;
        Ok(Stepper { opt, scaler, acc: Accumulator::new(accum_steps)?, clip, steps: 0, last_applied: true, sync: None })
    }

    /// Backward of one micro-batch's loss (scaled for accumulation and f16), and the optimizer
    /// step when the accumulation group is complete.
    pub fn backward(&mut self, loss: &Tensor, device: &Device, run: &RunObserver) -> Result<(), TrainError> {
        let scaled = self.loss_scale().apply(loss)?;
        match &self.sync {
            Some(sync) => sync.backward(&scaled, self.acc.pending() + 1 == self.acc.steps())?,
            None => scaled.backward().during("backward pass", device)?,
        }
        self.micro_batch_done(device, run)
    }

    /// What [`backward`](Self::backward) multiplies a micro-batch's loss by before its backward
    /// pass (1 / accumulation steps, then the GradScaler's scale), also for a caller that runs the
    /// backward pass itself (DataParallel's replicas, each on its
    /// own thread); call [`micro_batch_done`](Self::micro_batch_done) after it.
    pub fn loss_scale(&mut self) -> LossScale {
        LossScale { accum: self.acc.steps(), scale: self.scaler.is_enabled().then(|| self.scaler.scale_factor()) }
    }

    /// Counts a micro-batch whose backward pass has run, and takes the optimizer step when its
    /// accumulation group is complete.
    pub fn micro_batch_done(&mut self, device: &Device, run: &RunObserver) -> Result<(), TrainError> {
        if self.acc.micro_step() {
            self.step(device, run)?;
        }
        Ok(())
    }

    /// At the end of an epoch: steps on a partial accumulation group, so no gradient carries over.
    pub fn finish_epoch(&mut self, device: &Device, run: &RunObserver) -> Result<(), TrainError> {
        if self.acc.pending() > 0 {
            if let Some(sync) = &self.sync {
                sync.synchronize()?;
            }
            self.step(device, run)?;
            self.acc.reset();
        }
        Ok(())
    }

    fn step(&mut self, device: &Device, run: &RunObserver) -> Result<(), TrainError> {
        let applied = self.optimizer_step().during("optimizer step", device)?;
        self.last_applied = applied;
        run.step(StepReport {
            applied,
            learning_rate: self.opt.lrs().first().copied().unwrap_or(f64::NAN),
            grad_scale: self.scaler.is_enabled().then(|| self.scaler.get_scale()),
        });
        self.steps += 1;
        Ok(())
    }

    /// One optimizer step; false when the GradScaler skipped it (inf/NaN gradients).
    fn optimizer_step(&mut self) -> Result<bool, TrainError> {
        if let Some(sync) = &self.sync
            && let Some(applied) = sync.zero_step(&mut *self.opt, self.clip, &mut self.scaler)?
        {
            return Ok(applied);
        }
        if let Some(max_norm) = self.clip {
            self.scaler.unscale_(&mut *self.opt)?;
            clip_grad_norm_(&self.opt.params(), max_norm)?;
        }
        let applied = self.scaler.step(&mut *self.opt)?;
        self.scaler.update()?;
        self.opt.zero_grad()?;
        Ok(applied)
    }

    /// Writes the training checkpoint of a run that has completed `epoch` epochs. `optimizer` is
    /// the optimizer's state in the single-device layout (`None`: this stepper's optimizer's own).
    #[allow(clippy::too_many_arguments)]
    pub fn save_checkpoint(
        &self,
        path: &Path,
        epoch: usize,
        model: &dyn Module,
        optimizer: Option<OptimizerState>,
        loader_rng: GeneratorState,
        dropout_rng: &RngHandle,
        settings: &[(String, String)],
    ) -> Result<(), TrainError> {
        #[cfg(feature = "mpi")]
        if let Some(sync) = &self.sync
            && let (Some(zero), Some(stage)) = (sync.zero(), sync.zero_stage())
        {
            // ZeRO: a sharded checkpoint, written by every rank (see `crate::sharded`).
            let common = crate::sharded::save::Common {
                epoch,
                step: self.steps,
                stage,
                scaler: self.scaler.state_dict(),
                loader_rng,
                dropout_rng: dropout_rng.state(),
                settings,
            };
            return crate::sharded::save::save(path, zero, &*self.opt, model, common);
        }
        let optimizer = match optimizer {
            Some(state) => state,
            None => self.opt.state_dict()?,
        };
        let state = TrainingState {
            epoch,
            step: self.steps,
            // Parameters and buffers (batch norm's running statistics and batch count).
            model: model.state_dict().iter().map(|(k, t)| (k.to_string(), t.clone())).collect(),
            optimizer,
            scaler: self.scaler.state_dict(),
            loader_rng,
            dropout_rng: dropout_rng.state(),
            settings: settings.to_vec(),
        };
        resume::save(path, &state)
    }

    /// With a `resume` checkpoint: restores the weights and the optimizer through `restore` (given
    /// the saved weights, this stepper's optimizer and the saved optimizer state; see
    /// [`restore_plain`] for one model), the scaler, the dropout generator and the data loader's
    /// generator, and says what it resumed (`None` without a checkpoint). Nothing is printed: the
    /// caller says it ([`Resumed`]'s `Display` is the line `ferrite train` prints).
    #[allow(clippy::too_many_arguments)]
    pub fn resume_if_asked<D, C>(
        &mut self,
        resume: Option<&Path>,
        epochs: usize,
        restore: &mut Restore<'_>,
        dropout_rng: &RngHandle,
        loader: &mut DataLoader<D, C>,
        device: &Device,
        settings: &[(String, String)],
    ) -> Result<Option<Resumed>, TrainError>
    where
        D: Dataset,
        C: Collate<D::Sample>,
    {
        let Some(path) = resume else { return Ok(None) };
        let state = self.restore_from(path, restore, device, settings)?;
        if self.scaler.is_enabled() {
            self.scaler.load_state_dict(state.scaler.as_ref())?;
        }
        dropout_rng.set_state(state.dropout_rng);
        loader.set_generator_state(state.loader_rng);
        self.steps = state.step;
        Ok(Some(Resumed { path: path.to_path_buf(), epoch: state.epoch, steps: state.step, epochs }))
    }

    /// Whether every rank writes checkpoints (ZeRO's sharded checkpoints), not only rank 0.
    pub fn every_rank_saves(&self) -> bool {
        self.sync.as_ref().and_then(StepSync::zero_stage).is_some()
    }

    /// Reads the checkpoint at `path` — one file, or a sharded checkpoint's directory (joined
    /// into the single-device layout, whatever world size saved it) — and puts the weights and
    /// the optimizer state in place. Under ZeRO each rank then cuts its own pieces, and the ranks
    /// agree that every one of them succeeded: a rank that cannot read its checkpoint stops all.
    fn restore_from(
        &mut self,
        path: &Path,
        restore: &mut Restore<'_>,
        device: &Device,
        settings: &[(String, String)],
    ) -> Result<TrainingState, TrainError> {
        // ZeRO-3: the whole model gathered (every rank, before anything can fail on one) for the
        // weights to go in, released after the ranks agreed.
        #[cfg(feature = "mpi")]
        if let Some(sync) = self.sync.as_ref() {
            sync.whole_model(true)?;
        }
        let opt = &mut *self.opt;
        let mut local = || -> Result<TrainingState, TrainError> {
            // A sharded checkpoint's directory (one with shards but no index: a save that
            // never finished, named as such).
            let mut state = if crate::sharded::looks_sharded(path) {
                crate::sharded::load(path, settings)?
            } else {
                resume::load(path, device, settings)?
            };
            let sd: StateDict = std::mem::take(&mut state.model).into_iter().collect();
            #[cfg(feature = "mpi")]
            if let Some(sync) = self.sync.as_ref()
                && let Some(zero) = sync.zero()
            {
                // The weights into the model (the optimizer as it is), then this rank's pieces.
                let current = opt.state_dict()?;
                restore(&sd, &mut *opt, &current)?;
                zero.import_full_state(&state.optimizer, &mut *opt)?;
                // The saved f32 masters, not the model's (maybe bf16) rounding of them.
                zero.load_masters(|name| sd.get(name))?;
                return Ok(state);
            }
            restore(&sd, &mut *opt, &state.optimizer)?;
            Ok(state)
        };
        let local = local();
        #[cfg(feature = "mpi")]
        if let Some(zero) = self.sync.as_ref().and_then(StepSync::zero) {
            let message = local.as_ref().err().map(ToString::to_string);
            let agreed = zero.agree_all(message.as_deref(), "resuming from the checkpoint");
            let state = local?;
            agreed?;
            if let Some(sync) = self.sync.as_ref() {
                sync.whole_model(false)?;
            }
            return Ok(state);
        }
        local
    }
}

/// How [`Stepper::resume_if_asked`] puts the saved weights and optimizer state in place.
pub type Restore<'a> = dyn FnMut(&StateDict, &mut dyn Optimizer, &OptimizerState) -> Result<(), TrainError> + 'a;

/// What [`Stepper::resume_if_asked`] restores for a model on one device: its weights (strictly)
/// and the optimizer's state as saved.
pub fn restore_plain(
    model: &mut dyn Module,
    weights: &StateDict,
    opt: &mut dyn Optimizer,
    state: &OptimizerState,
) -> Result<(), TrainError> {
    model.load_state_dict(weights, true)?;
    opt.load_state_dict(state)?;
    Ok(())
}

/// A run resumed from a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resumed {
    pub path: std::path::PathBuf,
    /// Epochs the checkpoint had completed.
    pub epoch: usize,
    /// Optimizer steps the checkpoint had taken.
    pub steps: u64,
    /// Epochs the resumed run asks for in all.
    pub epochs: usize,
}

impl std::fmt::Display for Resumed {
    /// `  resumed from PATH after epoch E (S steps)`, and a second line when the checkpoint
    /// already has every epoch asked for.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "  resumed from {} after epoch {} ({} steps)", self.path.display(), self.epoch, self.steps)?;
        if self.epoch >= self.epochs {
            write!(f, "\n  nothing to do: the checkpoint already has {} of {} epochs", self.epoch, self.epochs)?;
        }
        Ok(())
    }
}

/// A micro-batch loss's multiplier: `1 / accum_steps` for accumulation, then the GradScaler's
/// scale under f16 (see [`Stepper::loss_scale`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScale {
    accum: usize,
    scale: Option<f64>,
}

impl LossScale {
    /// `loss` scaled for its backward pass: divided by the accumulation steps (as
    /// `Accumulator::scale_loss`), then multiplied by the GradScaler's scale (as
    /// `GradScaler::scale`) — what [`Stepper::backward`] uses, so every path scales alike.
    pub fn apply(&self, loss: &Tensor) -> Result<Tensor, TrainError> {
        let averaged = if self.accum == 1 { loss.clone() } else { loss.div_scalar(self.accum as f64)? };
        Ok(match self.scale {
            Some(s) => averaged.mul_scalar(s)?,
            None => averaged,
        })
    }
}
