//! `ferrite doctor --bench DEVICE`: how fast is ferrite on this device, and does the planner know
//! its memory? Measures, on any device (`cpu`, `gpu:N`, `cuda:N`, the emulated `cuda:0`, `sim:…`):
//! f32 and bf16 matrix products (TFLOP/s; f32 on `cuda:N` honours `FERRITE_ALLOW_TF32` as the
//! backend does, off by default), one allocate + free through the caching allocator (a cache hit)
//! for 4 KiB, 1 MiB and 64 MiB, and a GPT-2-small-shaped training step — ferrite-models' GPT-2 from
//! an in-memory config with random weights, trained by the ferrite-train `Trainer` with the
//! causal-LM step `ferrite train --hf-model` runs, AdamW, bf16 autocast — as milliseconds per step
//! after warm-up, its measured peak reserved memory, and the planner's prediction of that peak
//! for the same step (`ferrite plan --device sim:h100-80gb` by default) with the relative error.
//!
//! Why in the binary: the GPU machine of `scripts/gpu_check.sh` has PyTorch but no Rust toolchain,
//! so the numbers ferrite is held to next to PyTorch CUDA (`bench/gpu_vs_pytorch_cuda.py`, compared
//! by `bench/compare_cuda_bench.py`) must come from the release binary; `--json` is the shape the
//! comparison reads. Every size shrinks with flags (`--quick` for tests), so the same code runs on
//! the emulated device and on CPU in the test suite.
//!
//! The step's model is built as `ferrite train --hf-model` builds a loaded one (parameters
//! allocated on the device without drawing, then the weights copied in), so the device's
//! allocator sees the allocations the planner replays; the random weights are drawn on the host,
//! and the cache is emptied and the peaks reset before the step starts.
use std::cell::RefCell;
use std::time::Instant;

use ferrite_data::TokenBlocks;
use ferrite_memory::{allocator, format_size};
use ferrite_models::{Decoder, HfConfig};
use ferrite_nn::{Module, RngHandle};
use ferrite_optim::{Adam, AdamConfig};
use ferrite_plan::{AmpMode, HfDecoder, OptimizerKind, StepConfig, Target};
use ferrite_tensor::{DType, Device, Generator, Tensor};
use ferrite_train::{CausalLmStep, Trainer};
use serde::Serialize;

use crate::commands::CliResult;

/// The planner's device when the benchmarked one is not simulated: the card of issue 31's targets
/// (the prediction of a step that fits does not depend on the capacity).
pub const DEFAULT_PLAN_DEVICE: &str = "sim:h100-80gb";

/// Sizes of the caching-allocator benchmark, as `bench/gpu_vs_pytorch_cuda.py` has them.
pub const ALLOC_SIZES: [usize; 3] = [4 << 10, 1 << 20, 64 << 20];

/// Why the benchmark cannot run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(
        "`--bench {given}`: {reason}; devices are spelled cpu, gpu:N, cuda:N or sim:<gpu> (`ferrite devices` lists them)"
    )]
    BadDevice { given: String, reason: String },
    #[error("cannot put a tensor on {device}: {reason}")]
    DeviceUnusable { device: String, reason: String },
    #[error("`--{flag} {value}`: expected {expected}")]
    BadOption { flag: &'static str, value: String, expected: &'static str },
    #[error("the trainer took {taken} of the benchmark's {asked} optimizer steps; nothing to time")]
    StepsMissing { taken: usize, asked: usize },
}

/// The flags of `--bench` (defaults: issue 31's sizes; `--quick`: a few seconds on a CPU).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BenchArgs {
    /// Instead of the report: benchmark this device (`cpu`, `gpu:0`, `cuda:0`): matmul f32 and
    /// bf16, allocate+free through the caching allocator, a GPT-2-small training step (bf16
    /// autocast, AdamW) with its peak reserved memory next to the planner's prediction.
    #[arg(long, value_name = "DEVICE", conflicts_with = "check_device")]
    pub bench: Option<String>,
    /// Tiny sizes everywhere (matmul 64 and 128, a 2-layer GPT-2 of width 64, seq 32, batch 2):
    /// a check that the benchmark runs, not a measurement. Flags below override it.
    #[arg(long, requires = "bench")]
    pub quick: bool,
    /// f32 matmul sizes n (n×n @ n×n), comma-separated (default 4096).
    #[arg(long, value_name = "N,…", value_delimiter = ',', requires = "bench")]
    pub bench_sizes: Option<Vec<usize>>,
    /// bf16 matmul sizes n, comma-separated (default 8192).
    #[arg(long, value_name = "N,…", value_delimiter = ',', requires = "bench")]
    pub bench_bf16_sizes: Option<Vec<usize>>,
    /// GPT-2 layers of the training step (default 12).
    #[arg(long, requires = "bench")]
    pub gpt2_layers: Option<usize>,
    /// GPT-2 width (`n_embd`, default 768).
    #[arg(long, requires = "bench")]
    pub gpt2_hidden: Option<usize>,
    /// GPT-2 attention heads (default 12).
    #[arg(long, requires = "bench")]
    pub gpt2_heads: Option<usize>,
    /// GPT-2 vocabulary (default 50257).
    #[arg(long, requires = "bench")]
    pub gpt2_vocab: Option<usize>,
    /// Tokens per sample of the step (default 512).
    #[arg(long, requires = "bench")]
    pub gpt2_seq: Option<usize>,
    /// Samples per step (default 8).
    #[arg(long, requires = "bench")]
    pub gpt2_batch: Option<usize>,
    /// Optimizer steps before timing starts (default 3; at least 1: the first creates AdamW's state).
    #[arg(long, requires = "bench")]
    pub gpt2_warmup: Option<usize>,
    /// Optimizer steps timed (default 10).
    #[arg(long, requires = "bench")]
    pub gpt2_steps: Option<usize>,
    /// The step's autocast dtype: bf16 (default), f16, or none (f32).
    #[arg(long, value_name = "bf16|f16|none", requires = "bench")]
    pub gpt2_amp: Option<String>,
    /// The simulated GPU the planner predicts the step's peak for (default: the benchmarked
    /// device when it is `sim:…`, else sim:h100-80gb).
    #[arg(long, value_name = "sim:GPU", requires = "bench")]
    pub bench_plan_device: Option<String>,
}

/// The sizes one run uses, after `--quick` and the flags.
#[derive(Debug, Clone)]
struct Sizes {
    f32: Vec<usize>,
    bf16: Vec<usize>,
    gpt2: Gpt2Shape,
}

/// The training step's model and batch.
#[derive(Debug, Clone, Serialize)]
pub struct Gpt2Shape {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub vocab: usize,
    pub seq: usize,
    pub batch: usize,
    pub warmup_steps: usize,
    pub timed_steps: usize,
    pub amp: &'static str,
}

impl BenchArgs {
    fn sizes(&self) -> Result<Sizes, BenchError> {
        let q = self.quick;
        let pick = |v: Option<usize>, full: usize, quick: usize| v.unwrap_or(if q { quick } else { full });
        let amp = match self.gpt2_amp.as_deref().unwrap_or("bf16") {
            "bf16" => "bf16",
            "f16" => "f16",
            "none" | "f32" => "none",
            other => {
                return Err(BenchError::BadOption {
                    flag: "gpt2-amp",
                    value: other.into(),
                    expected: "bf16, f16 or none",
                });
            }
        };
        let s = Sizes {
            f32: self.bench_sizes.clone().unwrap_or_else(|| if q { vec![64, 128] } else { vec![4096] }),
            bf16: self.bench_bf16_sizes.clone().unwrap_or_else(|| if q { vec![64] } else { vec![8192] }),
            gpt2: Gpt2Shape {
                layers: pick(self.gpt2_layers, 12, 2),
                hidden: pick(self.gpt2_hidden, 768, 64),
                heads: pick(self.gpt2_heads, 12, 4),
                vocab: pick(self.gpt2_vocab, 50257, 256),
                seq: pick(self.gpt2_seq, 512, 32),
                batch: pick(self.gpt2_batch, 8, 2),
                warmup_steps: pick(self.gpt2_warmup, 3, 1),
                timed_steps: pick(self.gpt2_steps, 10, 2),
                amp,
            },
        };
        let positive = |flag: &'static str, v: usize| {
            if v == 0 { Err(BenchError::BadOption { flag, value: "0".into(), expected: "at least 1" }) } else { Ok(()) }
        };
        for n in s.f32.iter().chain(&s.bf16) {
            positive("bench-sizes", *n)?;
        }
        let g = &s.gpt2;
        for (flag, v) in [
            ("gpt2-layers", g.layers),
            ("gpt2-hidden", g.hidden),
            ("gpt2-heads", g.heads),
            ("gpt2-vocab", g.vocab),
            ("gpt2-batch", g.batch),
            ("gpt2-warmup", g.warmup_steps),
            ("gpt2-steps", g.timed_steps),
        ] {
            positive(flag, v)?;
        }
        if g.seq < 2 {
            return Err(BenchError::BadOption {
                flag: "gpt2-seq",
                value: g.seq.to_string(),
                expected: "at least 2 tokens (the causal-LM loss predicts the next one)",
            });
        }
        if !g.hidden.is_multiple_of(g.heads) {
            return Err(BenchError::BadOption {
                flag: "gpt2-hidden",
                value: g.hidden.to_string(),
                expected: "a multiple of --gpt2-heads",
            });
        }
        Ok(s)
    }
}

/// One matrix product size.
#[derive(Debug, Clone, Serialize)]
pub struct MatmulPoint {
    pub n: usize,
    pub tflops: f64,
    pub ms: f64,
}

/// One allocate + free size.
#[derive(Debug, Clone, Serialize)]
pub struct AllocPoint {
    pub bytes: usize,
    pub ns: f64,
}

/// The training step's time and memory, and the planner's prediction.
#[derive(Debug, Clone, Serialize)]
pub struct StepBench {
    #[serde(flatten)]
    pub shape: Gpt2Shape,
    pub parameters: u64,
    pub ms_per_step: f64,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub planned_on: String,
    pub predicted_peak_reserved_bytes: u64,
    pub predicted_peak_allocated_bytes: u64,
    /// (predicted − measured) / measured, of the peak reserved.
    pub relative_error: f64,
}

/// Everything one `--bench` run measured (`--json` prints it).
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub ferrite: &'static str,
    pub device: String,
    pub device_name: String,
    /// Whether f32 products may use TF32 (only `cuda:N` with `FERRITE_ALLOW_TF32=1`).
    pub tf32: bool,
    pub matmul_f32: Vec<MatmulPoint>,
    pub matmul_bf16: Vec<MatmulPoint>,
    pub alloc_free_ns: Vec<AllocPoint>,
    pub gpt2_step: StepBench,
}

/// Runs the benchmark on `device` and prints it.
pub fn run(device: &str, args: &BenchArgs, json: bool) -> CliResult {
    let dev = Device::parse(device)
        .map_err(|e| BenchError::BadDevice { given: device.to_string(), reason: e.to_string() })?;
    let sizes = args.sizes()?;
    // One tensor first: a device that cannot hold one is one clear error.
    Tensor::zeros(&[1], DType::F32, &dev)
        .and_then(|t| t.to_vec_f64())
        .map_err(|e| BenchError::DeviceUnusable { device: dev.to_string(), reason: e.to_string() })?;
    let plan_device = match (&args.bench_plan_device, &dev) {
        (Some(p), _) => p.clone(),
        (None, Device::Sim { .. }) => dev.to_string(),
        (None, _) => DEFAULT_PLAN_DEVICE.to_string(),
    };
    let target = ferrite_train::planned::target(&plan_device, None, None)?;
    let say = |line: String| {
        if !json {
            println!("{line}");
        }
    };
    let tf32 =
        matches!(dev, Device::Cuda { .. }) && std::env::var(ferrite_cuda::ALLOW_TF32_ENV).is_ok_and(|v| v == "1");
    let device_name = device_name(&dev);
    say(format!("ferrite doctor --bench {dev} ({device_name}), ferrite {}", env!("CARGO_PKG_VERSION")));
    let mut g = Generator::new(0);
    let mut matmul_f32 = Vec::new();
    for &n in &sizes.f32 {
        let p = matmul(&dev, DType::F32, n, &mut g)?;
        say(format!(
            "matmul f32{} {n}: {:.2} TFLOP/s ({:.3} ms per product)",
            if tf32 { " (TF32 allowed)" } else { "" },
            p.tflops,
            p.ms
        ));
        matmul_f32.push(p);
    }
    let mut matmul_bf16 = Vec::new();
    for &n in &sizes.bf16 {
        let p = matmul(&dev, DType::BF16, n, &mut g)?;
        say(format!("matmul bf16 {n}: {:.2} TFLOP/s ({:.3} ms per product)", p.tflops, p.ms));
        matmul_bf16.push(p);
    }
    let mut alloc_free_ns = Vec::new();
    for bytes in ALLOC_SIZES {
        let p = alloc_free(&dev, bytes)?;
        say(format!("allocate+free {}: {:.0} ns (a cache hit)", format_size(bytes as u64), p.ns));
        alloc_free_ns.push(p);
    }
    let step = gpt2_step(&dev, &sizes.gpt2, &target)?;
    let s = &step.shape;
    say(format!(
        "GPT-2 step ({} layers x {}, {} heads, vocab {}, seq {}, batch {}, autocast {}, AdamW; {} parameters): {:.1} ms per step over {} steps after {} warm-up",
        s.layers,
        s.hidden,
        s.heads,
        s.vocab,
        s.seq,
        s.batch,
        s.amp,
        step.parameters,
        step.ms_per_step,
        s.timed_steps,
        s.warmup_steps
    ));
    say(format!(
        "  peak reserved {} measured, {} predicted by ferrite plan --device {} ({:+.3} %); peak allocated {} measured, {} predicted",
        format_size(step.peak_reserved_bytes),
        format_size(step.predicted_peak_reserved_bytes),
        step.planned_on,
        step.relative_error * 100.0,
        format_size(step.peak_allocated_bytes),
        format_size(step.predicted_peak_allocated_bytes),
    ));
    let report = BenchReport {
        ferrite: env!("CARGO_PKG_VERSION"),
        device: dev.to_string(),
        device_name,
        tf32,
        matmul_f32,
        matmul_bf16,
        alloc_free_ns,
        gpt2_step: step,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// The card's name for `cuda:N`, else the device itself.
fn device_name(dev: &Device) -> String {
    if let Device::Cuda { index } = dev
        && let Some(info) = ferrite_memory::cuda::cuda_devices(false).ok().and_then(|d| d.into_iter().nth(*index))
    {
        return info.name;
    }
    dev.to_string()
}

/// Reads one element of `t` back: waits for every queued kernel (kernels run asynchronously on a
/// GPU).
fn wait(t: &Tensor) -> ferrite_tensor::Result<()> {
    t.narrow(0, 0, 1)?.narrow(1, 0, 1)?.to_vec_f64().map(|_| ())
}

/// Best of three rounds of products, each round about 0.1 s (at least one product, at most 200),
/// after one product of warm-up and one that sizes the rounds.
fn matmul(
    dev: &Device,
    dtype: DType,
    n: usize,
    g: &mut Generator,
) -> Result<MatmulPoint, Box<dyn std::error::Error + Send + Sync>> {
    let a = Tensor::randn_with(&[n, n], DType::F32, dev, g)?.to_dtype(dtype)?;
    let b = Tensor::randn_with(&[n, n], DType::F32, dev, g)?.to_dtype(dtype)?;
    wait(&a.matmul(&b)?)?; // warm-up: kernel compilation, library initialisation
    let t = Instant::now();
    wait(&a.matmul(&b)?)?;
    let once = t.elapsed().as_secs_f64().max(1e-9);
    let iters = ((0.1 / once).ceil() as usize).clamp(1, 200);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        let mut last = None;
        for _ in 0..iters {
            last = Some(a.matmul(&b)?);
        }
        if let Some(c) = last {
            wait(&c)?;
        }
        best = best.min(t.elapsed().as_secs_f64() / iters as f64);
    }
    let flops = 2.0 * (n as f64).powi(3);
    Ok(MatmulPoint { n, tflops: flops / best / 1e12, ms: best * 1e3 })
}

/// One allocate + free of `bytes` through the device's caching allocator, a cache hit (the first
/// allocation warms the cache), averaged over 100 000.
fn alloc_free(dev: &Device, bytes: usize) -> Result<AllocPoint, Box<dyn std::error::Error + Send + Sync>> {
    let alloc = allocator(dev);
    drop(alloc.allocate(bytes)?);
    let iters = 100_000;
    let t = Instant::now();
    for _ in 0..iters {
        drop(alloc.allocate(bytes)?);
    }
    Ok(AllocPoint { bytes, ns: t.elapsed().as_secs_f64() / iters as f64 * 1e9 })
}

/// The GPT-2 configuration of `shape` (GPT2Config's defaults otherwise: 1024 positions, dropout
/// 0.1, gelu_new, tied embeddings), as a `config.json` would give it.
fn gpt2_config(shape: &Gpt2Shape) -> Result<HfConfig, ferrite_models::ModelError> {
    let json = serde_json::json!({
        "model_type": "gpt2",
        "vocab_size": shape.vocab,
        "n_positions": shape.seq.max(1024),
        "n_embd": shape.hidden,
        "n_layer": shape.layers,
        "n_head": shape.heads,
    });
    HfConfig::from_json(&json.to_string(), "the benchmark's GPT-2 configuration")
}

/// The training step: predicted by the planner, then run by the `Trainer` on `dev`.
fn gpt2_step(
    dev: &Device,
    shape: &Gpt2Shape,
    target: &Target,
) -> Result<StepBench, Box<dyn std::error::Error + Send + Sync>> {
    let config = gpt2_config(shape)?;
    let amp = match shape.amp {
        "bf16" => Some(AmpMode::Bf16),
        "f16" => Some(AmpMode::F16),
        _ => None,
    };
    let workload = HfDecoder::new(config.clone(), shape.seq)?;
    let step_config = StepConfig {
        batch: shape.batch,
        accum_steps: 1,
        amp,
        checkpoint_activations: false,
        optimizer: OptimizerKind::Adamw,
    };
    let plan = ferrite_plan::evaluate(&ferrite_plan::record(&workload, &step_config)?, target)?;

    let alloc = allocator(dev);
    alloc.empty_cache();
    // The parameters as the planner (and `ferrite train --hf-model`) allocates them: without
    // drawing; then random weights drawn on the host are copied in, and whatever that left in the
    // cache is returned before the peaks are reset.
    let mut model = workload.build_model(dev, false)?;
    {
        let source = Decoder::new(&config, &Device::Cpu, false)?;
        model.load_state_dict(&source.state_dict(), true)?;
    }
    alloc.empty_cache();
    if *dev != Device::Cpu {
        allocator(&Device::Cpu).empty_cache();
    }
    alloc.reset_peak_memory_stats();
    model.set_dropout_rng(RngHandle::new(1));
    let parameters = model.parameters().iter().map(|p| p.numel() as u64).sum();

    let steps = shape.warmup_steps + shape.timed_steps;
    let mut g = Generator::new(2);
    let ids: Vec<u32> =
        (0..steps * shape.batch * shape.seq).map(|_| (g.next_u64() % shape.vocab as u64) as u32).collect();
    let blocks = TokenBlocks::new(ids, shape.seq, "the benchmark's random token ids")?;
    let loader = blocks.tensor_loader().batch_size(shape.batch).shuffle(false).num_workers(0);
    let mut loader = if *dev == Device::Cpu { loader.build()? } else { loader.stage_to(dev.clone()).build()? };
    let adamw = Adam::named(model.named_parameters(), AdamConfig::adamw(1e-4).weight_decay(0.01))?;
    let stamps = RefCell::new(Vec::with_capacity(steps));
    {
        let mut trainer = Trainer::builder(model, adamw)
            .device(dev.clone())
            .epochs(1)
            .max_steps(steps as u64)
            .amp(amp)
            .progress(false)
            .on_step(|_| stamps.borrow_mut().push(Instant::now()))
            .build()?;
        if let Err(e) = trainer.fit(&mut loader, CausalLmStep) {
            // Out of memory: the report with the planner's remedies for this step, as `train` gives.
            let ctx = ferrite_train::PlanContext {
                workload: Box::new(workload),
                step: step_config,
                device: dev.to_string(),
                alloc_conf: None,
                memory_fraction: None,
            };
            return Err(ferrite_train::planned::with_planned_remedies(e, Ok(ctx)).into());
        }
    }
    let stamps = stamps.into_inner();
    let (Some(first), Some(last)) = (stamps.get(shape.warmup_steps - 1), stamps.last()) else {
        return Err(BenchError::StepsMissing { taken: stamps.len(), asked: steps }.into());
    };
    let ms_per_step = last.duration_since(*first).as_secs_f64() * 1e3 / shape.timed_steps as f64;
    let peak_reserved = alloc.max_memory_reserved();
    let peak_allocated = alloc.max_memory_allocated();
    let relative_error = (plan.peak_reserved_bytes as f64 - peak_reserved as f64) / peak_reserved.max(1) as f64;
    Ok(StepBench {
        shape: shape.clone(),
        parameters,
        ms_per_step,
        peak_reserved_bytes: peak_reserved,
        peak_allocated_bytes: peak_allocated,
        planned_on: target.device_name(),
        predicted_peak_reserved_bytes: plan.peak_reserved_bytes,
        predicted_peak_allocated_bytes: plan.peak_allocated_bytes,
        relative_error,
    })
}
