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

use ferrite_parallel::distributed::CommDtype;
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
    /// What ferrite's ZeRO collectives carry, as `train --zero-comm-dtype` (with --amp bf16):
    /// `bf16` plans the model's parameters and gradients in bf16 with f32 master shards.
    #[arg(long, value_name = "DTYPE", value_parser = crate::commands::train::parse_comm_dtype)]
    pub zero_comm_dtype: Option<ferrite_parallel::distributed::CommDtype>,
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
                self.zero_comm_dtype.map(|d| format!("--zero-comm-dtype {}", d.name())),
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

/// `word` as one shell word (quoted when it holds anything but plain path characters).
fn shell_word(word: &str) -> String {
    if !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@".contains(c)) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
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

    /// The changes the planner cannot build by itself that the way forward also tries, for an
    /// effective batch of `effective`: LoRA adapters (rank 8 and 16 on PEFT's default targets,
    /// base weights in bf16) on a Hugging Face decoder that is not already planned with adapters,
    /// and ZeRO-1/2 over the smallest number of these GPUs that fits.
    pub fn variants(&self, effective: usize) -> Result<Vec<ferrite_plan::Variant>, PlanError> {
        let mut out = self.lora_variants()?;
        // Sharding over several of these GPUs: ZeRO-1/2 at the smallest count that fits.
        let workload: std::sync::Arc<dyn Workload> = std::sync::Arc::from(self.workload()?);
        out.extend(ferrite_plan::zero_variants(workload, &self.step_config(), &self.target()?, effective)?);
        Ok(out)
    }

    fn lora_variants(&self) -> Result<Vec<ferrite_plan::Variant>, PlanError> {
        use super::lora_args::{LoraArgs, default_targets, model_type_of};
        let Some(config) = self.hf_config.clone().or_else(|| self.hf_model.as_ref().map(|d| d.join("config.json")))
        else {
            return Ok(Vec::new());
        };
        // Already adapters.
        let model_type = model_type_of(&config);
        if self.lora.lora_rank.is_some() {
            return Ok(Vec::new());
        }
        let Some(targets) = default_targets(&model_type) else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for rank in [8usize, 16] {
            let lora = LoraArgs {
                lora_rank: Some(rank),
                lora_targets: Some(targets.to_string()),
                base_dtype: Some(ferrite_tensor::DType::BF16),
                ..LoraArgs::default()
            };
            let w = lora.plan_workload(ferrite_plan::hf_workload(&config, self.shape.seq)?, &model_type)?;
            out.push(ferrite_plan::Variant {
                label: format!("LoRA r{rank} on {targets}, base weights in bf16"),
                flags: vec![
                    "--lora-rank".into(),
                    rank.to_string(),
                    "--lora-targets".into(),
                    targets.to_string(),
                    "--base-dtype".into(),
                    "bf16".into(),
                ],
                workload: std::sync::Arc::from(w),
                gpus: 1,
                adapters_only: true,
                // Measured: a LoRA step of GPT-2 small takes 0.75x a full one on CPU (BENCHMARKS.md,
                // `bench/lora_step.sh`); backward still computes every activation gradient.
                compute: 0.75,
                sharding: None,
            });
        }
        Ok(out)
    }

    /// `ferrite train` with this plan's model and device, to which a route's step flags are added.
    pub fn train_command(&self) -> String {
        let mut c = vec!["ferrite train".to_string()];
        let hf = self.hf_model.is_some() || self.hf_config.is_some();
        if let Some(dir) = &self.hf_model {
            c.push(format!("--hf-model {}", shell_word(&dir.display().to_string())));
        } else if self.hf_config.is_some() {
            // The planner read a config.json; training needs the folder with it and the weights.
            c.push("--hf-model <folder of this config.json and its weights>".into());
        } else {
            c.push(format!("--model {}", self.model.name()));
            let d = ModelArgs::default();
            if let Some(h) = self.shape.hidden {
                c.push(format!("--hidden {h}"));
            }
            if let Some(l) = self.shape.layers {
                c.push(format!("--layers {l}"));
            }
            if self.model == ModelKind::Transformer {
                if self.shape.d_model != d.d_model {
                    c.push(format!("--d-model {}", self.shape.d_model));
                }
                if self.shape.heads != d.heads {
                    c.push(format!("--heads {}", self.shape.heads));
                }
            }
            if self.shape.dropout != d.dropout {
                c.push(format!("--dropout {}", self.shape.dropout));
            }
            if !self.model.is_language_model() && self.dataset != "digits" {
                c.push(format!("--dataset {}", self.dataset));
            }
        }
        if (hf || self.model.is_language_model()) && self.shape.seq != ModelArgs::default().seq {
            c.push(format!("--seq {}", self.shape.seq));
        }
        c.push(format!("--device {}", shell_word(&self.device)));
        c.join(" ")
    }

    /// The `ferrite train` flags of this plan's step (`--batch-size`, `--accum-steps`, `--amp`,
    /// `--checkpoint-activations`): what [`train_command`](Self::train_command) needs to run
    /// exactly the planned step.
    pub fn step_flags(&self) -> String {
        let mut f = vec![format!("--batch-size {}", self.batch)];
        if self.accum_steps > 1 {
            f.push(format!("--accum-steps {}", self.accum_steps));
        }
        if let Some(a) = self.amp {
            f.push(format!("--amp {}", a.mode().name()));
        }
        if self.checkpoint_activations {
            f.push("--checkpoint-activations".into());
        }
        f.join(" ")
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
    if args.zero.zero_comm_dtype == Some(CommDtype::Bf16) && args.amp != Some(Amp::Bf16) {
        return Err(PlanError::InvalidSetting {
            what: "--zero-comm-dtype bf16".into(),
            reason:
                "train runs it only with --amp bf16 (bf16 parameters need the step autocast to bf16): add --amp bf16"
                    .into(),
        }
        .into());
    }
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
        let t = ferrite_plan::target_batch_with(w, &args.variants(n)?, &config, &target, n)?;
        render::target_batch(&t, &args.train_command(), args.json);
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
    // A step that does not fit gets every way ferrite can run it that does.
    let forward = if plan.fits {
        None
    } else {
        let effective = config.batch * config.accum_steps;
        Some(ferrite_plan::way_forward(w, &args.variants(effective)?, &config, &target, None)?)
    };
    let mut command = args.train_command();
    if let Some(d) = args.zero.zero_comm_dtype {
        command.push_str(&format!(" --zero-comm-dtype {}", d.name()));
    }
    match &zero {
        Some(setup) => {
            let sizes = ferrite_plan::ModelSizes::of_workload(w, &config)?;
            let world = setup.gpus_per_node * setup.nodes;
            // ZeRO-1/2 run in ferrite: every rank of its own layout is planned, and DDP beside it.
            let (report, ddp) = match args.zero.zero.and_then(ferrite_plan::DataParallel::zero_stage) {
                Some(mode) => {
                    // `--zero-comm-dtype bf16`: the ranks hold bf16 parameters (and gradients),
                    // the shards f32 masters, as `train` builds them; DDP beside it stays f32.
                    let bf16;
                    let ws: &dyn Workload = if args.zero.zero_comm_dtype == Some(CommDtype::Bf16) {
                        bf16 = ferrite_plan::with_lora(args.workload()?, None, Some(ferrite_tensor::DType::BF16));
                        &*bf16
                    } else {
                        w
                    };
                    let sharded = ferrite_plan::plan_ranks(ws, &config, &target, mode, world, None)?;
                    let ddp =
                        ferrite_plan::plan_ranks(w, &config, &target, ferrite_plan::DataParallel::Ddp, world, None)?;
                    (ferrite_plan::zero_report_sharded(&sizes, &trace, setup, sharded), Some(ddp))
                }
                None => (ferrite_plan::zero_report(&sizes, &trace, setup), None),
            };
            render::plan_with_zero(
                &plan,
                &report,
                ddp.as_ref(),
                forward.as_ref(),
                &command,
                &args.step_flags(),
                args.json,
            );
        }
        None => render::plan(&plan, forward.as_ref(), &command, args.json),
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
