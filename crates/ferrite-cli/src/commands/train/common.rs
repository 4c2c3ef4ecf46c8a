//! What every trainer shares: the optimizer step with accumulation, loss scaling and clipping,
//! the checkpoint written after an epoch and read on resume, the run's metrics outputs, and the
//! per-epoch memory line.
//!
//! Why one piece: an image classifier and a language model differ in their data and their
//! metrics, not in how a step is taken or a run is resumed — a resume that is bit-identical for
//! one must be for the other, so both go through the same code.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;

use ferrite_data::{Collate, DataLoader, Dataset};
use ferrite_memory::{MemoryScope, ScopeReport, format_size};
use ferrite_nn::{Module, RngHandle, StateDict};
use ferrite_optim::{Accumulator, Adam, AdamConfig, GradScaler, GradScalerConfig, Optimizer, clip_grad_norm_};
use ferrite_tensor::{Device, GeneratorState, Tensor};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::resume::{self, TrainingState};
use super::{Amp, During, TrainArgs, TrainError};
use crate::observe::{RunInfo, RunObserver, StepReport};

/// AdamW, the GradScaler and gradient accumulation: turns micro-batch losses into optimizer steps.
pub struct Stepper {
    pub opt: Adam,
    pub scaler: GradScaler,
    acc: Accumulator,
    clip: Option<f64>,
    /// Optimizer steps taken (a resumed run starts at its checkpoint's).
    pub steps: u64,
    /// `--distributed`: gradients averaged over the MPI ranks before each step.
    pub sync: Option<super::distributed::StepSync>,
}

impl Stepper {
    /// AdamW over `model`'s named parameters, with `args`' rate, decay, precision, accumulation
    /// and clipping.
    pub fn new(model: &dyn Module, args: &TrainArgs) -> Result<Stepper, TrainError> {
        let opt = Adam::named(model.named_parameters(), AdamConfig::adamw(args.lr).weight_decay(args.weight_decay))?;
        let scaler =
            GradScaler::new(GradScalerConfig { enabled: args.amp == Some(Amp::F16), ..GradScalerConfig::default() })?;
        Ok(Stepper {
            opt,
            scaler,
            acc: Accumulator::new(args.accum_steps)?,
            clip: args.clip_grad_norm,
            steps: 0,
            sync: None,
        })
    }

    /// Backward of one micro-batch's loss (scaled for accumulation and f16), and the optimizer
    /// step when the accumulation group is complete.
    pub fn backward(&mut self, loss: &Tensor, device: &Device, run: &RunObserver) -> Result<(), TrainError> {
        let scaled = self.scaler.scale(&self.acc.scale_loss(loss)?)?;
        match &self.sync {
            Some(sync) => sync.backward(&scaled, self.acc.pending() + 1 == self.acc.steps())?,
            None => scaled.backward().during("backward pass", device)?,
        }
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
        if let Some(max_norm) = self.clip {
            self.scaler.unscale_(&mut self.opt)?;
            clip_grad_norm_(&self.opt.params(), max_norm)?;
        }
        let applied = self.scaler.step(&mut self.opt)?;
        self.scaler.update()?;
        self.opt.zero_grad()?;
        Ok(applied)
    }

    /// Writes the training checkpoint of a run that has completed `epoch` epochs.
    pub fn save_checkpoint(
        &self,
        path: &Path,
        epoch: usize,
        model: &dyn Module,
        loader_rng: GeneratorState,
        dropout_rng: &RngHandle,
        settings: &[(String, String)],
    ) -> Result<(), TrainError> {
        let state = TrainingState {
            epoch,
            step: self.steps,
            // Parameters and buffers (batch norm's running statistics and batch count).
            model: model.state_dict().iter().map(|(k, t)| (k.to_string(), t.clone())).collect(),
            optimizer: self.opt.state_dict()?,
            scaler: self.scaler.state_dict(),
            loader_rng,
            dropout_rng: dropout_rng.state(),
            settings: settings.to_vec(),
        };
        resume::save(path, &state)
    }

    /// With `--resume`: restores weights, optimizer, scaler, the dropout generator and the data
    /// loader's generator from the checkpoint, and returns the epochs it had completed (0
    /// without `--resume`).
    #[allow(clippy::too_many_arguments)]
    pub fn resume_if_asked<D, C>(
        &mut self,
        args: &TrainArgs,
        epochs: usize,
        model: &mut dyn Module,
        dropout_rng: &RngHandle,
        loader: &mut DataLoader<D, C>,
        device: &Device,
        settings: &[(String, String)],
    ) -> Result<usize, TrainError>
    where
        D: Dataset,
        C: Collate<D::Sample>,
    {
        let Some(path) = &args.resume else { return Ok(0) };
        let state = resume::load(path, device, settings)?;
        let sd: StateDict = state.model.into_iter().collect();
        model.load_state_dict(&sd, true)?;
        self.opt.load_state_dict(&state.optimizer)?;
        if self.scaler.is_enabled() {
            self.scaler.load_state_dict(state.scaler.as_ref())?;
        }
        dropout_rng.set_state(state.dropout_rng);
        loader.set_generator_state(state.loader_rng);
        self.steps = state.step;
        println!("  resumed from {} after epoch {} ({} steps)", path.display(), state.epoch, state.step);
        if state.epoch >= epochs {
            println!("  nothing to do: the checkpoint already has {} of {epochs} epochs", state.epoch);
        }
        Ok(state.epoch)
    }
}

/// One epoch's progress bar, loss average, memory scope and clock.
pub struct EpochMeter {
    start: Instant,
    scope: MemoryScope,
    bar: ProgressBar,
    loss_sum: f64,
    batches: usize,
    pass_peak: u64,
}

impl EpochMeter {
    /// Starts measuring epoch `epoch` (0-based) of `epochs`, `len` batches long.
    pub fn start(args: &TrainArgs, device: &Device, len: usize, epoch: usize, epochs: usize) -> EpochMeter {
        let show = !args.no_progress && std::io::stderr().is_terminal();
        EpochMeter {
            start: Instant::now(),
            scope: MemoryScope::new(format!("epoch {}", epoch + 1), device).quiet(),
            bar: progress_bar(show, len as u64, epoch + 1, epochs),
            loss_sum: 0.0,
            batches: 0,
            pass_peak: 0,
        }
    }

    /// Records a batch: the peak of its forward+backward `pass` and its loss.
    pub fn batch(&mut self, pass: MemoryScope, loss: f64) {
        self.pass_peak = self.pass_peak.max(pass.finish().peak_allocated);
        self.loss_sum += loss;
        self.batches += 1;
        self.bar.inc(1);
        self.bar.set_message(format!("loss {loss:.4}"));
    }

    /// Ends the epoch's training pass: (mean loss, the memory line, when the epoch started). The memory
    /// figures are the training pass's; call before evaluation.
    pub fn finish(self) -> (f64, String, Instant) {
        self.bar.finish_and_clear();
        let mem = self.scope.finish();
        (self.loss_sum / self.batches.max(1) as f64, memory_line(&mem, self.pass_peak), self.start)
    }
}

/// The run's metrics outputs (`--metrics-addr`, `--metrics-file`), announced on stdout.
pub fn start_observer(
    args: &TrainArgs,
    model: String,
    dataset: &str,
    device: &Device,
) -> Result<RunObserver, TrainError> {
    let info = RunInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        model,
        dataset: dataset.to_string(),
        device: device.to_string(),
    };
    // Batches are collated on the host before they are staged to the device: report both.
    let mut devices = vec![device.clone()];
    if *device != Device::Cpu {
        devices.push(Device::Cpu);
    }
    let run = RunObserver::start(&args.observe, info, devices)?;
    if let Some(url) = run.metrics_url() {
        println!("  metrics: serving {url}");
    }
    if let Some(path) = &args.observe.metrics_file {
        println!("  metrics: appending JSON lines to {}", path.display());
    }
    Ok(run)
}

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
        ("dropout".into(), args.dropout.to_string()),
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

/// `memory: allocated …, reserved …, peak … (forward+backward …)` for an epoch's scope.
fn memory_line(mem: &ScopeReport, pass_peak: u64) -> String {
    format!(
        "memory: allocated {}, reserved {}, peak {} (forward+backward {})",
        format_size(mem.allocated_after),
        format_size(mem.reserved_after),
        format_size(mem.peak_allocated),
        format_size(pass_peak),
    )
}

/// `12.3 ms` below a second, `1.23 s` above.
pub fn seconds(s: f64) -> String {
    if s < 1.0 { format!("{:.1} ms", s * 1e3) } else { format!("{s:.2} s") }
}

fn progress_bar(show: bool, len: u64, epoch: usize, epochs: usize) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(format!("epoch {epoch}/{epochs}"));
    bar
}
