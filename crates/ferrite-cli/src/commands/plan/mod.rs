//! `ferrite plan`: will a training step fit on a named GPU, and if not, what to change —
//! predicted on `meta`, without the GPU (see the `ferrite-plan` crate for how).
//!
//! One command for the questions asked before a run: the plan of one step (text or `--json`),
//! `--measure` (the same step run on the `sim` device, side by side), `--find-batch-size`,
//! `--sweep-batch`, `--target-batch`, `--jobs`; the model is a built-in trainer's (`--model`,
//! with `ferrite train`'s flags) or a Hugging Face decoder (`--hf-config config.json`, or
//! `--hf-model DIR`: the model `ferrite train --hf-model DIR` trains).

mod render;

use std::path::PathBuf;

use ferrite_plan::{OptimizerKind, PlanError, StepConfig, Target, Workload};

pub use ferrite_plan::Builtin;

use super::CliResult;
use super::model_args::{Amp, ModelArgs, ModelKind};

/// Optimizer of the planned step (`--optimizer`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerArg {
    Adamw,
    Adam,
    /// SGD with momentum 0.9.
    Sgd,
    /// SGD without momentum (no optimizer state).
    SgdPlain,
}

#[derive(clap::Args, Debug, Clone)]
pub struct PlanArgs {
    /// A built-in trainer's model (the flags below shape it as for `ferrite train`).
    #[arg(long, value_enum, default_value = "transformer")]
    pub model: ModelKind,
    /// A Hugging Face `config.json` of a decoder-only model (GPT-2, Llama, Mistral styles) or a
    /// T5-style encoder-decoder (`model_type: t5`; --seq tokens into each side) instead of --model.
    #[arg(long, conflicts_with = "hf_model")]
    pub hf_config: Option<PathBuf>,
    /// A Hugging Face model folder: the plan of exactly the model `ferrite train --hf-model DIR`
    /// builds (its config.json), with the same flags (--seq, --batch-size, --amp, …).
    #[arg(long)]
    pub hf_model: Option<PathBuf>,
    /// DeepSpeed ZeRO's model-state estimate of this model (`--zero 2|3`).
    /// LoRA and the base weights' dtype, as `ferrite train` takes them (see
    /// `commands/lora_args.rs`).
    #[command(flatten)]
    pub lora: super::lora_args::LoraArgs,
    #[command(flatten)]
    pub zero: ZeroArgs,
    /// The GPU to plan for: `sim:<gpu>` from `ferrite memory gpus` (MIG slices included, e.g.
    /// `sim:a100-40gb-mig-3g.20gb`) or a capacity (`sim:24GiB`).
    #[arg(long, default_value = "sim:a100-40gb")]
    pub device: String,
    /// Micro-batch size (samples in memory at once).
    #[arg(long, visible_alias = "batch-size", default_value_t = 8)]
    pub batch: usize,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub accum_steps: usize,
    /// Mixed precision under autocast (f16 adds the GradScaler).
    #[arg(long, value_enum)]
    pub amp: Option<Amp>,
    /// Recompute activations in backward (as `ferrite train --checkpoint-activations`).
    #[arg(long)]
    pub checkpoint_activations: bool,
    /// Optimizer (its state is created lazily in the first step, as in PyTorch).
    #[arg(long, value_enum, default_value = "adamw")]
    pub optimizer: OptimizerArg,
    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax (default: FERRITE_ALLOC_CONF).
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// The run's `set_per_process_memory_fraction`.
    #[arg(long)]
    pub memory_fraction: Option<f64>,
    #[command(flatten)]
    pub shape: ModelArgs,
    /// Vocabulary of the character-level language models (the Jargon File has about 100).
    #[arg(long, default_value_t = 128)]
    pub vocab: usize,
    /// Images of the image models: `digits` (1×8×8) or `fashion-mnist` (1×28×28).
    #[arg(long, default_value = "digits")]
    pub dataset: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Also run the step on the `sim` device (small models only) and show measured next to predicted.
    #[arg(long)]
    pub measure: bool,
    /// The largest micro-batch that fits.
    #[arg(long)]
    pub find_batch_size: bool,
    /// Draw the planned step as a timeline of allocated (stacked by category) and reserved memory
    /// with the card's capacity and the peak marked, in the format of the file's extension: `.svg`,
    /// `.html` (the SVG in a page) or `.png`; any other extension is refused.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Peak memory for each of these batch sizes (comma-separated), against the card's capacity.
    #[arg(long, value_delimiter = ',')]
    pub sweep_batch: Option<Vec<usize>>,
    /// Ranked plans that reach this effective batch (micro-batch × accumulation, AMP,
    /// checkpointing, allocator settings).
    #[arg(long)]
    pub target_batch: Option<usize>,
    /// Whether this many copies of the run fit together on the card, and the memory fraction each
    /// should set.
    #[arg(long)]
    pub jobs: Option<usize>,
}

/// What to offload to CPU memory under ZeRO (`--offload`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffloadArg {
    #[default]
    None,
    /// `offload_optimizer: cpu`: gradients and optimizer state in CPU memory.
    Optimizer,
    /// `offload_param: cpu` as well (ZeRO-3): parameters in CPU memory too.
    Param,
}

/// `--zero`: DeepSpeed's ZeRO model-state estimate of the planned model (its parameter count and
/// largest layer read from the built model), beside ferrite's own unsharded model states.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq, Default)]
pub struct ZeroArgs {
    /// ZeRO stage (1, 2 or 3; DeepSpeed estimates stage 1 as stage 2).
    #[arg(long, value_name = "STAGE")]
    pub zero: Option<u8>,
    /// GPUs per node for --zero (at least 1; default 1).
    #[arg(long, value_name = "N")]
    pub gpus_per_node: Option<usize>,
    /// Nodes for --zero (at least 1; default 1).
    #[arg(long, value_name = "K")]
    pub nodes: Option<usize>,
    /// What ZeRO offloads to CPU memory (default none).
    #[arg(long, value_enum)]
    pub offload: Option<OffloadArg>,
}

impl ZeroArgs {
    /// The ZeRO setup of the flags, if `--zero` is given. A zero count is refused naming its
    /// flag, and so is `--gpus-per-node`, `--nodes` or `--offload` without `--zero` (they shape
    /// only the ZeRO estimate, so without it they would be silently ignored).
    pub fn setup(&self) -> Result<Option<ferrite_plan::ZeroSetup>, PlanError> {
        for (flag, value) in [("--gpus-per-node", self.gpus_per_node), ("--nodes", self.nodes)] {
            if value == Some(0) {
                return Err(PlanError::InvalidSetting {
                    what: format!("{flag} 0"),
                    reason: "ZeRO shards over at least one GPU on at least one node: give 1 or more".into(),
                });
            }
        }
        let Some(stage) = self.zero else {
            let given = [
                self.gpus_per_node.map(|n| format!("--gpus-per-node {n}")),
                self.nodes.map(|n| format!("--nodes {n}")),
                self.offload.map(|o| format!("--offload {}", offload_name(o))),
            ];
            let given: Vec<String> = given.into_iter().flatten().collect();
            if given.is_empty() {
                return Ok(None);
            }
            return Err(PlanError::InvalidSetting {
                what: given.join(" "),
                reason: "has no effect without --zero (it shapes only DeepSpeed's ZeRO estimate): add --zero 1|2|3, or drop it".into(),
            });
        };
        let offload = match self.offload.unwrap_or_default() {
            OffloadArg::None => ferrite_plan::Offload::None,
            OffloadArg::Optimizer => ferrite_plan::Offload::Optimizer,
            OffloadArg::Param => ferrite_plan::Offload::OptimizerAndParams,
        };
        ferrite_plan::ZeroSetup::new(stage, self.gpus_per_node.unwrap_or(1), self.nodes.unwrap_or(1), offload).map(Some)
    }
}

/// `--offload`'s value as typed.
fn offload_name(o: OffloadArg) -> &'static str {
    match o {
        OffloadArg::None => "none",
        OffloadArg::Optimizer => "optimizer",
        OffloadArg::Param => "param",
    }
}

/// Largest model `--measure` runs for real: its predicted peak reserved, against host memory.
const MEASURE_LIMIT: u64 = 6 << 30;

impl PlanArgs {
    /// The step settings of the flags.
    pub fn step_config(&self) -> StepConfig {
        StepConfig {
            batch: self.batch,
            accum_steps: self.accum_steps,
            amp: self.amp.map(Amp::mode),
            checkpoint_activations: self.checkpoint_activations,
            optimizer: match self.optimizer {
                OptimizerArg::Adamw => OptimizerKind::Adamw,
                OptimizerArg::Adam => OptimizerKind::Adam,
                OptimizerArg::Sgd => OptimizerKind::Sgd,
                OptimizerArg::SgdPlain => OptimizerKind::SgdPlain,
            },
        }
    }

    /// The target GPU with the allocator settings and fraction of the flags.
    pub fn target(&self) -> Result<Target, PlanError> {
        ferrite_train::planned::target(&self.device, self.alloc_conf.as_deref(), self.memory_fraction)
    }

    /// The model to plan.
    pub fn workload(&self) -> Result<Box<dyn Workload>, PlanError> {
        let config = self.hf_config.clone().or_else(|| self.hf_model.as_ref().map(|d| d.join("config.json")));
        if let Some(path) = &config {
            let w = ferrite_plan::hf_workload(path, self.shape.seq)?;
            return self.lora.plan_workload(w, &super::lora_args::model_type_of(path));
        }
        let w: Box<dyn Workload> = Box::new(self.shape.builtin(self.model, &self.dataset, self.vocab)?);
        self.lora.plan_workload(w, "")
    }
}

pub fn run(args: PlanArgs) -> CliResult {
    let zero = args.zero.setup()?;
    // An unsupported --plot extension is refused before the step is planned.
    let plot_format = args.plot.as_deref().map(crate::plot::PlotFormat::from_path).transpose()?;
    // --plot draws, and --zero estimates, the plan of one step: the other questions do not print
    // that plan, so either flag would be silently ignored beside them.
    let question = [
        ("--sweep-batch", args.sweep_batch.is_some()),
        ("--find-batch-size", args.find_batch_size),
        ("--target-batch", args.target_batch.is_some()),
        ("--jobs", args.jobs.is_some()),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag));
    if let Some(question) = question {
        for (flag, given) in [("--plot", args.plot.is_some()), ("--zero", args.zero.zero.is_some())] {
            if given {
                return Err(PlanError::InvalidSetting {
                    what: format!("{flag} with {question}"),
                    reason: format!(
                        "{flag} applies to the plan of one step, which {question} does not print: run them as two commands"
                    ),
                }
                .into());
            }
        }
    }
    let workload = args.workload()?;
    let config = args.step_config();
    let target = args.target()?;
    let w = &*workload;
    if let Some(batches) = &args.sweep_batch {
        if batches.is_empty() || batches.contains(&0) {
            return Err(PlanError::InvalidSetting {
                what: "--sweep-batch".into(),
                reason: "a comma-separated list of batch sizes of at least 1, e.g. 1,2,4,8".into(),
            }
            .into());
        }
        let plans = ferrite_plan::sweep_batch(w, &config, &target, batches)?;
        render::sweep(&plans, &target, args.json);
        return Ok(());
    }
    if args.find_batch_size {
        let s = ferrite_plan::find_batch_size(w, &config, &target)?;
        render::batch_search(&s, args.json);
        return Ok(());
    }
    if let Some(n) = args.target_batch {
        let t = ferrite_plan::target_batch(w, &config, &target, n)?;
        render::target_batch(&t, &target, args.json);
        return Ok(());
    }
    if let Some(n) = args.jobs {
        let j = ferrite_plan::plan_jobs(w, &config, &target, n)?;
        render::jobs(&j, &target, args.json);
        return Ok(());
    }
    let trace = ferrite_plan::record(w, &config)?;
    let mut plan = ferrite_plan::evaluate(&trace, &target)?;
    if args.measure {
        if plan.peak_reserved_bytes > MEASURE_LIMIT {
            return Err(
                PlanError::TooLargeToMeasure { needed: plan.peak_reserved_bytes, allowed: MEASURE_LIMIT }.into()
            );
        }
        match ferrite_plan::measure(w, &config, &target) {
            Ok(m) => {
                plan.measured_peak_allocated_bytes = Some(m.peak_allocated_bytes);
                plan.measured_peak_reserved_bytes = Some(m.peak_reserved_bytes);
            }
            // The measured run ran out of memory: that is the measurement.
            Err(e) if e.oom_report().is_some() && !plan.fits => {
                eprintln!("measured: the step ran out of memory on {}, as predicted", target.device_name());
            }
            Err(e) => return Err(e.into()),
        }
    }
    match &zero {
        Some(setup) => {
            let sizes = ferrite_plan::ModelSizes::of_workload(w, &config)?;
            let report = ferrite_plan::zero_report(&sizes, &trace, setup);
            render::plan_with_zero(&plan, &report, args.json);
        }
        None => render::plan(&plan, args.json),
    }
    if let (Some(path), Some(format)) = (&args.plot, plot_format) {
        write_plot(path, format, &trace, &plan, &target)?;
        if !args.json {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// `--plot FILE`: the replayed step as a picture (`crate::plot`), SVG, HTML or PNG by the extension.
fn write_plot(
    path: &std::path::Path,
    format: crate::plot::PlotFormat,
    trace: &ferrite_plan::StepTrace,
    plan: &ferrite_plan::MemoryPlan,
    target: &Target,
) -> CliResult {
    let points = ferrite_plan::step_timeline(trace, target)?;
    let timeline = crate::plot::DeviceTimeline {
        label: format!("{} on {} (batch {})", plan.model, target.device_name(), plan.batch_size),
        capacity: Some(target.usable_bytes()),
        x_label: "allocation event of the planned step".into(),
        categories: ferrite_plan::Category::ALL.iter().map(|c| c.label().to_string()).collect(),
        points: points
            .iter()
            .map(|p| crate::plot::TimelinePoint {
                t: p.event as f64,
                allocated: p.allocated,
                reserved: p.reserved,
                by_category: p.by_category.to_vec(),
            })
            .collect(),
    };
    let bytes = crate::plot::render(std::slice::from_ref(&timeline), format, "ferrite plan")?;
    ferrite_io::write_atomically(path, |f| std::io::Write::write_all(f, &bytes))?;
    Ok(())
}
