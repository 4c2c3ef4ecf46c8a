//! The training step the planner runs — on `meta` to predict, on `sim` to measure — and the
//! marks it leaves in the allocator's history (phases, layers, gradients).
//!
//! Two optimizer steps: the first creates the optimizer's state lazily (as PyTorch does), the
//! second is the steady state. Each is forward and loss under autocast, backward of the loss
//! (scaled by the GradScaler for f16 and by the accumulation), the optimizer step through the
//! GradScaler, and `zero_grad(set_to_none)`: what `ferrite train` does per step.
use std::cell::RefCell;
use std::sync::Arc;

use ferrite_memory::CachingAllocator;
use ferrite_nn::autocast;
use ferrite_optim::{Accumulator, Adam, AdamConfig, GradScaler, GradScalerConfig, Optimizer, Sgd, SgdConfig};
use ferrite_tensor::Device;

use crate::PlanError;
use crate::workload::{AmpMode, OptimizerKind, StepConfig, Workload};

/// Optimizer steps the planner runs: the first creates state, the second is the steady state.
pub const STEPS: usize = 2;

/// Steps the GradScaler may skip on top of [`STEPS`]: an f16 run's first steps often overflow at
/// the initial scale (2¹⁶) and are skipped, creating no optimizer state; each skip halves the
/// scale, so this many reach a scale below 1.
const MAX_SKIPPED: usize = 17;

/// The optimizer steps a planned run goes through: [`STEPS`] taken ones, past the ones the
/// GradScaler skips (at most [`MAX_SKIPPED`]), as training goes on past them. The plan, recorded
/// on `meta` where nothing overflows, describes taken steps; a run measured on a `sim` device
/// must reach them too, or an f16 step would be measured without its optimizer state.
#[derive(Default)]
pub(crate) struct TakenSteps {
    taken: usize,
    skipped: usize,
}

impl TakenSteps {
    /// The index of the step to run next (the count of steps taken so far), `None` when done.
    pub(crate) fn next(&self) -> Option<usize> {
        (self.taken < STEPS && self.skipped <= MAX_SKIPPED).then_some(self.taken)
    }

    /// Whether the optimizer took the step just run.
    pub(crate) fn finish(&mut self, taken: bool) {
        if taken {
            self.taken += 1;
        } else {
            self.skipped += 1;
        }
    }
}

/// Which part of the step an allocation belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Building the model: parameters and buffers.
    Build,
    /// Forward pass and loss (the batch included).
    Forward,
    /// Backward pass (recomputation of checkpointed segments included).
    Backward,
    /// The optimizer step and `zero_grad`.
    OptimizerStep,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Build => "building the model",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::OptimizerStep => "optimizer step",
        }
    }

    /// Where in the run a point of this phase is, as the end of a sentence: "while building the
    /// model", "in the backward pass of step 2".
    pub fn during(self, step: usize) -> String {
        match self {
            Phase::Build => "while building the model (its parameters and buffers)".into(),
            Phase::Forward => format!("in the forward pass of step {step}"),
            Phase::Backward => format!("in the backward pass of step {step}"),
            Phase::OptimizerStep => format!("in the optimizer step of step {step}"),
        }
    }
}

/// A point in the recorded history.
#[derive(Debug, Clone)]
pub(crate) enum MarkKind {
    Phase {
        phase: Phase,
        step: usize,
    },
    /// The forward pass enters a layer (set by `ferrite_nn::mark_layer`).
    Layer(String),
    /// Addresses of the gradients after a backward pass.
    Grads(Vec<u64>),
}

#[derive(Debug, Clone)]
pub(crate) struct Mark {
    /// History length when the mark was set.
    pub at: usize,
    pub kind: MarkKind,
}

/// Collects marks against one allocator's history (none when measuring).
pub(crate) struct Recorder {
    alloc: Option<Arc<CachingAllocator>>,
    pub marks: Vec<Mark>,
}

thread_local! {
    static ACTIVE: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

impl Recorder {
    fn mark(&mut self, kind: MarkKind) {
        if let Some(a) = &self.alloc {
            self.marks.push(Mark { at: a.memory_history_len(), kind });
        }
    }
}

pub(crate) fn mark(kind: MarkKind) {
    ACTIVE.with(|a| {
        if let Some(r) = a.borrow_mut().as_mut() {
            r.mark(kind);
        }
    });
}

/// What a run of the step reports besides the allocator's history.
pub(crate) struct StepRun {
    pub parameters: u64,
    pub marks: Vec<Mark>,
}

/// Another step run in place of this one's with the same marks (one rank's step of a
/// data-parallel run, `crate::sharded_step`): returns the parameter count.
pub(crate) type CustomStep<'a> = dyn Fn(&Device) -> Result<u64, PlanError> + 'a;

/// Run the step on `device` (`custom` instead when given); with `recording`, set marks against
/// that allocator's history.
pub(crate) fn run_step(
    workload: &dyn Workload,
    config: &StepConfig,
    device: &Device,
    recording: Option<Arc<CachingAllocator>>,
    custom: Option<&CustomStep<'_>>,
) -> Result<StepRun, PlanError> {
    config.check()?;
    ACTIVE.with(|a| *a.borrow_mut() = Some(Recorder { alloc: recording, marks: Vec::new() }));
    // Models announce the layer they enter with `ferrite_nn::mark_layer`: the activations it
    // saves are reported under that name.
    let listening = ferrite_nn::listen_for_layer_marks(|layer| mark(MarkKind::Layer(layer.to_string())));
    let result = match custom {
        Some(step) => step(device),
        None => run_step_inner(workload, config, device),
    };
    drop(listening);
    let marks = ACTIVE.with(|a| a.borrow_mut().take()).map(|r| r.marks).unwrap_or_default();
    result.map(|parameters| StepRun { parameters, marks })
}

fn run_step_inner(workload: &dyn Workload, config: &StepConfig, device: &Device) -> Result<u64, PlanError> {
    mark(MarkKind::Phase { phase: Phase::Build, step: 0 });
    let model = workload.build(config, device)?;
    let params = model.parameters();
    let parameters: u64 = params.iter().map(|p| p.numel() as u64).sum();
    let named = model.named_parameters();
    let mut opt: Box<dyn Optimizer> = match config.optimizer {
        OptimizerKind::Adamw => Box::new(Adam::named(named, AdamConfig::adamw(1e-3).weight_decay(0.01))?),
        OptimizerKind::Adam => Box::new(Adam::named(named, AdamConfig::adam(1e-3))?),
        OptimizerKind::Sgd => Box::new(Sgd::named(named, SgdConfig::new(1e-2).momentum(0.9))?),
        OptimizerKind::SgdPlain => Box::new(Sgd::named(named, SgdConfig::new(1e-2))?),
    };
    let mut scaler =
        GradScaler::new(GradScalerConfig { enabled: config.amp == Some(AmpMode::F16), ..GradScalerConfig::default() })?;
    let acc = Accumulator::new(config.accum_steps)?;
    let mut steps = TakenSteps::default();
    while let Some(step) = steps.next() {
        // What the trainer holds until the optimizer step has run: the batch, the loss and
        // what the workload keeps (logits).
        let mut held = Vec::new();
        for _ in 0..config.accum_steps {
            held.clear();
            mark(MarkKind::Phase { phase: Phase::Forward, step });
            let (x, y) = workload.batch(config, device)?;
            let (loss, keep) = {
                let _amp = config.amp.map(|a| autocast(a.dtype())).transpose()?;
                workload.loss(&*model, &x, &y)?
            };
            mark(MarkKind::Phase { phase: Phase::Backward, step });
            scaler.scale(&acc.scale_loss(&loss)?)?.backward()?;
            let grads = params.iter().filter_map(|p| p.grad()).map(|g| g.storage().addr()).collect();
            mark(MarkKind::Grads(grads));
            held.push(x);
            held.push(y);
            held.push(loss);
            held.extend(keep);
        }
        mark(MarkKind::Phase { phase: Phase::OptimizerStep, step });
        steps.finish(scaler.step(&mut *opt)?);
        scaler.update()?;
        opt.zero_grad()?;
        drop(held);
    }
    // The end of the run: everything of this step is freed by the drops below.
    mark(MarkKind::Phase { phase: Phase::Build, step: STEPS });
    drop(opt);
    drop(model);
    Ok(parameters)
}
