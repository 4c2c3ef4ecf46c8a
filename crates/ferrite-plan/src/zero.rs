//! DeepSpeed ZeRO's model-state estimate, computed from a ferrite plan, beside ferrite's own.
//!
//! Why: users size ZeRO runs with DeepSpeed's `estimate_zero2_model_states_mem_needs` /
//! `estimate_zero3_model_states_mem_needs` (docs: `memory.rst`), which need the model's
//! parameter count and its largest layer. The planner reads both numbers from the *built* model
//! (not typed in), applies DeepSpeed's formulas exactly (its integer truncations, its `GB` that is
//! 2³⁰ bytes, its 1.5 CPU buffer factor), and sets the result beside the model states ferrite
//! keeps, each difference with its reason: without sharding (f32 weights, f32 gradients, AdamW's
//! two f32 moments: 16 bytes a parameter, no 16-bit copy), or — for ZeRO-1 and ZeRO-2, which
//! ferrite runs (`mpirun -np N ferrite train --distributed --zero 1|2`) — one rank of ferrite's own
//! sharded layout, planned rank by rank ([`crate::rank_plan`]): full f32 weights on every rank,
//! AdamW's moments and an f32 master copy of the rank's partition (12 B/param over N), the full
//! f32 gradients in DDP's buckets (ZeRO-1) or only during backward (ZeRO-2). ZeRO-3 (`--zero 3`)
//! keeps only the shards and the root's weights resident; each block's weights and gradients
//! exist while the block computes ([`crate::fully_sharded_step`]).
//!
//! DeepSpeed's formulas (`P` parameters, `L` largest layer's parameters, `N` GPUs in all, `n`
//! GPUs per node, `k` nodes, buffer factor `f` = 1.5):
//! - ZeRO-2: GPU `4P + ⌊16P/N⌋`, CPU `P·4n·f`; optimizer offload: GPU `2P`, CPU `P·max(4N, 16)·f`.
//! - ZeRO-3: GPU `4L + ⌊18P/N⌋`, CPU `L·4n·f` (`zero.Init`) or `P·4n·f`; optimizer offload: GPU
//!   `4L + ⌊2P/N⌋`, CPU `P·16/k·f` or `P·max(4n, 16/k)·f`; parameters too: GPU `4L`, CPU
//!   `P·18/k·f` or `P·max(4n, 18/k)·f`.
use ferrite_nn::Module;
use serde::Serialize;

use crate::PlanError;
use crate::model_states::{FerriteModelStates, ferrite_model_states};
use crate::rank_plan::ShardedPlan;
use crate::sharded_step::DataParallel;
use crate::trace::StepTrace;
use crate::workload::{StepConfig, Workload};
use ferrite_tensor::Device;

/// DeepSpeed's default `additional_buffer_factor` (CPU side only).
pub const DEEPSPEED_BUFFER_FACTOR: f64 = 1.5;

/// What DeepSpeed's estimate needs from a model, read from the built model as DeepSpeed's
/// `model_to_params` reads a `torch.nn.Module`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelSizes {
    /// Parameters, each shared tensor counted once.
    pub total_params: u64,
    /// The most parameters one module holds itself (`parameters(recurse=False)`): the unit
    /// ZeRO-3 gathers at once.
    pub largest_layer_params: u64,
    /// That module's dotted name (`""` is the root).
    pub largest_layer: String,
}

impl ModelSizes {
    /// Count `model` as DeepSpeed does: unique parameters, and the largest module's own ones.
    pub fn of(model: &dyn Module) -> ModelSizes {
        let total_params = model.parameters().iter().map(|p| p.numel() as u64).sum();
        let own = |m: &dyn Module| m.own_parameters().iter().map(|(_, p)| p.numel() as u64).sum::<u64>();
        let mut best = (own(model), String::new());
        for (name, m) in model.named_modules() {
            let n = own(m);
            if n > best.0 {
                best = (n, name);
            }
        }
        ModelSizes { total_params, largest_layer_params: best.0, largest_layer: best.1 }
    }

    /// Build `workload`'s model on `meta` and count it (the plan's own model, not typed-in sizes).
    pub fn of_workload(workload: &dyn Workload, config: &StepConfig) -> Result<ModelSizes, PlanError> {
        let _guard = crate::trace::plan_lock();
        let model = workload.build(config, &Device::Meta)?;
        Ok(ModelSizes::of(&*model))
    }

    /// The sizes as DeepSpeed prints them (`int(P/1e6)`M) and as its docs then pass them to
    /// the `_all_cold` estimators (`total_params=2851e6, largest_layer_params=32e6` for t5-3b).
    pub fn as_printed(&self) -> ModelSizes {
        let m = |n: u64| n / 1_000_000 * 1_000_000;
        ModelSizes {
            total_params: m(self.total_params),
            largest_layer_params: m(self.largest_layer_params),
            largest_layer: self.largest_layer.clone(),
        }
    }
}

/// The ZeRO stage (1 has the same model-state estimate as 2 in DeepSpeed's API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ZeroStage {
    /// Optimizer states and gradients partitioned.
    Two,
    /// Parameters partitioned too.
    Three,
}

/// What ZeRO moves to CPU memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Offload {
    None,
    /// `offload_optimizer: cpu`.
    Optimizer,
    /// `offload_param: cpu` and `offload_optimizer: cpu` (ZeRO-3 only).
    OptimizerAndParams,
}

impl Offload {
    pub fn name(self) -> &'static str {
        match self {
            Offload::None => "none",
            Offload::Optimizer => "optimizer",
            Offload::OptimizerAndParams => "param",
        }
    }
}

/// A ZeRO setup: stage, machines, offload, `zero.Init` (ZeRO-3).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ZeroSetup {
    pub stage: ZeroStage,
    pub gpus_per_node: usize,
    pub nodes: usize,
    pub offload: Offload,
    /// ZeRO-3 models built under `deepspeed.zero.Init` (partitioned as they are created).
    pub zero_init: bool,
    pub additional_buffer_factor: f64,
}

impl ZeroSetup {
    /// `stage` 1, 2 or 3 on `nodes` × `gpus_per_node` GPUs, DeepSpeed's defaults otherwise.
    pub fn new(stage: u8, gpus_per_node: usize, nodes: usize, offload: Offload) -> Result<ZeroSetup, PlanError> {
        let stage = match stage {
            1 | 2 => ZeroStage::Two,
            3 => ZeroStage::Three,
            s => return Err(PlanError::setting(format!("--zero {s}"), "ZeRO has stages 1, 2 and 3")),
        };
        if gpus_per_node == 0 || nodes == 0 {
            return Err(PlanError::setting(
                format!("--gpus-per-node {gpus_per_node} --nodes {nodes}"),
                "at least one GPU on at least one node",
            ));
        }
        if stage == ZeroStage::Two && offload == Offload::OptimizerAndParams {
            return Err(PlanError::setting(
                "--offload param with --zero 2",
                "ZeRO-2 does not partition parameters, so it cannot offload them; use --zero 3, or --offload optimizer",
            ));
        }
        Ok(ZeroSetup {
            stage,
            gpus_per_node,
            nodes,
            offload,
            zero_init: true,
            additional_buffer_factor: DEEPSPEED_BUFFER_FACTOR,
        })
    }

    pub fn total_gpus(&self) -> u64 {
        (self.gpus_per_node * self.nodes) as u64
    }

    /// DeepSpeed's option string for this setup, e.g. `offload_param=none, offload_optimizer=cpu`.
    pub fn options(&self) -> String {
        let dev = |on: bool| if on { "cpu" } else { "none" };
        let opt = dev(self.offload != Offload::None);
        match self.stage {
            ZeroStage::Two => format!("offload_optimizer={opt}"),
            ZeroStage::Three => format!(
                "offload_param={}, offload_optimizer={opt}, zero_init={}",
                dev(self.offload == Offload::OptimizerAndParams),
                u8::from(self.zero_init)
            ),
        }
    }
}

/// DeepSpeed's estimate for one setup.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ZeroEstimate {
    pub options: String,
    pub per_gpu_bytes: u64,
    pub per_cpu_bytes: u64,
    /// As DeepSpeed prints them: bytes / 2³⁰ to two decimals (it says `GB`).
    pub per_gpu_printed: String,
    pub per_cpu_printed: String,
}

/// DeepSpeed's figure: `bytes / 2**30` with two decimals (labelled `GB`, but GiB).
pub fn deepspeed_gb(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 30) as f64)
}

/// `estimate_zero2_model_states_mem_needs` / `estimate_zero3_model_states_mem_needs`, with
/// Python's float arithmetic and `int()` truncations where DeepSpeed has them.
pub fn deepspeed_estimate(sizes: &ModelSizes, setup: &ZeroSetup) -> ZeroEstimate {
    let p = sizes.total_params as f64;
    let largest = sizes.largest_layer_params;
    let n = setup.gpus_per_node as f64;
    let total = setup.total_gpus() as f64;
    let f = setup.additional_buffer_factor;
    let trunc = |x: f64| x as u64;
    let (cpu, gpu) = match setup.stage {
        ZeroStage::Two => match setup.offload {
            Offload::None => (p * 4.0 * n * f, 4 * sizes.total_params + trunc(16.0 * p / total)),
            _ => (p * (4.0 * total).max(16.0) * f, 2 * sizes.total_params),
        },
        ZeroStage::Three => {
            let gpus_factor = 1.0 / setup.nodes as f64;
            let layer = 4 * largest;
            let cpu_for = |k: f64| {
                if setup.zero_init { p * k * gpus_factor * f } else { p * (4.0 * n).max(k * gpus_factor) * f }
            };
            match setup.offload {
                Offload::OptimizerAndParams => (cpu_for(18.0), layer),
                Offload::Optimizer => (cpu_for(16.0), layer + trunc(2.0 * p / total)),
                Offload::None => {
                    let cpu = if setup.zero_init { largest as f64 * 4.0 * n * f } else { p * 4.0 * n * f };
                    (cpu, layer + trunc(18.0 * p / total))
                }
            }
        }
    };
    let cpu = trunc(cpu);
    ZeroEstimate {
        options: setup.options(),
        per_gpu_bytes: gpu,
        per_cpu_bytes: cpu,
        per_gpu_printed: deepspeed_gb(gpu),
        per_cpu_printed: deepspeed_gb(cpu),
    }
}

/// Every row DeepSpeed's `estimate_zero{2,3}_model_states_mem_needs_all_live` prints for this
/// stage and machine shape, in its order.
pub fn deepspeed_table(sizes: &ModelSizes, setup: &ZeroSetup) -> Vec<ZeroEstimate> {
    let mut rows = Vec::new();
    let mut push = |offload: Offload, zero_init: bool| {
        let s = ZeroSetup { offload, zero_init, ..setup.clone() };
        rows.push(deepspeed_estimate(sizes, &s));
    };
    match setup.stage {
        ZeroStage::Two => {
            push(Offload::Optimizer, true);
            push(Offload::None, true);
        }
        ZeroStage::Three => {
            for offload in [Offload::OptimizerAndParams, Offload::Optimizer, Offload::None] {
                push(offload, true);
                push(offload, false);
            }
        }
    }
    rows
}

/// One component of the per-GPU model states, DeepSpeed's against ferrite's, and why they differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    pub component: String,
    pub deepspeed_bytes: u64,
    pub ferrite_bytes: u64,
    pub reason: String,
}

/// DeepSpeed's estimate of a ferrite plan's model, beside ferrite's own model states.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ZeroReport {
    pub setup: ZeroSetup,
    pub sizes: ModelSizes,
    /// DeepSpeed's estimate for `setup` from the real counts (its `_all_live` call).
    pub deepspeed: ZeroEstimate,
    /// Every row `_all_live` prints for the stage.
    pub deepspeed_table: Vec<ZeroEstimate>,
    /// The same rows from the counts rounded as DeepSpeed prints them (its docs' `_all_cold`
    /// call), which is where the docs' `127.45` and `6.09` come from.
    pub deepspeed_table_as_printed: Vec<ZeroEstimate>,
    /// ferrite's model states per GPU: of the unsharded step, or of the fullest rank of
    /// [`ferrite_sharded`](Self::ferrite_sharded) when given.
    pub ferrite: FerriteModelStates,
    /// ferrite's own ZeRO-1/2 run of this setup, every rank planned (`None`: ZeRO-3, which ferrite
    /// does not run yet, or no sharded plan asked for).
    pub ferrite_sharded: Option<ShardedPlan>,
    pub differences: Vec<Difference>,
}

/// DeepSpeed's estimate for `setup` of the model of `trace` (whose sizes are `sizes`), and the
/// differences from ferrite's own accounting of the same step.
pub fn zero_report(sizes: &ModelSizes, trace: &StepTrace, setup: &ZeroSetup) -> ZeroReport {
    let ferrite = ferrite_model_states(trace);
    let deepspeed = deepspeed_estimate(sizes, setup);
    ZeroReport {
        setup: setup.clone(),
        sizes: sizes.clone(),
        deepspeed_table: deepspeed_table(sizes, setup),
        deepspeed_table_as_printed: deepspeed_table(&sizes.as_printed(), setup),
        differences: differences(sizes, setup, &deepspeed, &ferrite, None),
        deepspeed,
        ferrite,
        ferrite_sharded: None,
    }
}

/// [`zero_report`] against ferrite's own sharded run of the same setup (`sharded`, from
/// [`crate::plan_ranks`] with ZeRO-1 or 2 over the setup's GPUs): the ferrite column is its
/// fullest rank's model states, and each difference says what ferrite's layout keeps.
pub fn zero_report_sharded(
    sizes: &ModelSizes,
    trace: &StepTrace,
    setup: &ZeroSetup,
    sharded: ShardedPlan,
) -> ZeroReport {
    let mut report = zero_report(sizes, trace, setup);
    if let Some(max) = sharded.max() {
        report.ferrite = max.model_states.clone();
        report.differences =
            differences(sizes, setup, &report.deepspeed, &report.ferrite, Some((sharded.mode, sharded.world)));
    }
    report.ferrite_sharded = Some(sharded);
    report
}

fn differences(
    sizes: &ModelSizes,
    setup: &ZeroSetup,
    ds: &ZeroEstimate,
    fe: &FerriteModelStates,
    sharded: Option<(DataParallel, usize)>,
) -> Vec<Difference> {
    let p = sizes.total_params;
    let n = setup.total_gpus();
    let row = |component: &str, deepspeed_bytes: u64, ferrite_bytes: u64, reason: String| Difference {
        component: component.to_string(),
        deepspeed_bytes,
        ferrite_bytes,
        reason,
    };
    let weights_reason = "DeepSpeed keeps a 16-bit copy of the weights on the GPU (2 B/param) and the fp32 master \
                          weights with the optimizer; ferrite keeps the f32 weights themselves (4 B/param) and \
                          autocast casts them per op, so there is no 16-bit copy";
    let grads_reason = "DeepSpeed's backward produces 16-bit gradients (2 B/param); ferrite's gradients are f32 \
                        like its weights (4 B/param)";
    let shard_reason = match sharded {
        None => format!(
            "DeepSpeed shards fp32 master weights, fp32 gradients and Adam's m and v (16 B/param) over the {n} GPUs; \
             ferrite without --zero keeps AdamW's m and v (8 B/param) on every GPU, its f32 weights being the master copy"
        ),
        Some((mode, world)) => format!(
            "DeepSpeed shards fp32 master weights, fp32 gradients and Adam's m and v (16 B/param) over the {n} GPUs; \
             ferrite's {} over {world} ranks shards an f32 master copy of the partition and AdamW's m and v (12 B/param over {world}){}",
            mode.name(),
            if mode == DataParallel::Zero2 {
                " and reduce-scatters the gradients into f32 shard gradients (4 B/param over the ranks)"
            } else {
                ""
            }
        ),
    };
    let grads_reason = match sharded {
        Some((DataParallel::Zero1, _)) => "DeepSpeed's backward produces 16-bit gradients (2 B/param); ferrite's ZeRO-1 keeps f32 \
            gradients of every parameter (4 B/param) and DDP's two f32 bucket buffers (8 B/param with the buckets' flags) that \
            average them"
            .to_string(),
        Some((DataParallel::Zero2, _)) => "DeepSpeed's backward produces 16-bit gradients (2 B/param); ferrite's ZeRO-2 backward \
            produces full f32 gradients (4 B/param) that live until they are reduce-scattered at its end"
            .to_string(),
        _ => grads_reason.to_string(),
    };
    let mut out = Vec::new();
    match (setup.stage, setup.offload) {
        (ZeroStage::Two, Offload::None) => {
            out.push(row("weights", 2 * p, fe.parameters, weights_reason.into()));
            out.push(row("gradients", 2 * p, fe.gradients, grads_reason.clone()));
            out.push(row(
                "optimizer state (with fp32 master weights and gradient partition)",
                ds.per_gpu_bytes - 4 * p,
                fe.optimizer_state,
                shard_reason,
            ));
        }
        (ZeroStage::Two, _) => {
            out.push(row("weights", 2 * p, fe.parameters, weights_reason.into()));
            out.push(row(
                "gradients and optimizer state",
                0,
                fe.gradients + fe.optimizer_state,
                "offloaded: DeepSpeed streams gradients to CPU memory and runs Adam there; ferrite keeps both on the GPU"
                    .into(),
            ));
        }
        (ZeroStage::Three, offload) => {
            let layer = 4 * sizes.largest_layer_params;
            out.push(row(
                &format!("gathered largest layer (`{}`)", sizes.largest_layer),
                layer,
                0,
                match sharded {
                    Some((DataParallel::Zero3, _)) => "ZeRO-3 gathers one layer's 16-bit weights and computes its 16-bit \
                        gradients at a time (4 B/param of the largest module); ferrite's ZeRO-3 gathers one block (unit) \
                        in the weights' dtype and its f32 gradients, freed after the block's backward (in its peak)"
                        .to_string(),
                    _ => "ZeRO-3 gathers one layer's 16-bit weights and computes its 16-bit gradients at a time (4 B/param of \
                          the largest module); ferrite never gathers, every weight is resident"
                        .to_string(),
                },
            ));
            let ds_sharded = ds.per_gpu_bytes - layer;
            let what = match offload {
                Offload::None => "sharded 16-bit weights (2 B/param) and fp32 states (16 B/param) over the GPUs",
                Offload::Optimizer => "sharded 16-bit weights (2 B/param); the fp32 states are in CPU memory",
                Offload::OptimizerAndParams => "nothing: weights and states are in CPU memory",
            };
            out.push(row(
                "weights, gradients and optimizer state",
                ds_sharded,
                fe.total,
                match sharded {
                    Some((DataParallel::Zero3, world)) => format!(
                        "DeepSpeed: {what}; ferrite's ZeRO-3 over {world} ranks keeps f32 master shards, f32 shard \
                         gradients and AdamW's m and v (16 B/param over {world}) and the root's weights (outside every \
                         block: embeddings, final norm, head) whole on every rank"
                    ),
                    _ => format!(
                        "DeepSpeed: {what}; ferrite without --zero 3 keeps f32 weights, f32 gradients and AdamW's m and v, \
                         16 B/param, unsharded on every GPU (or --zero 1|2: the optimizer state sharded)"
                    ),
                },
            ));
        }
    }
    out.push(row(
        "total",
        ds.per_gpu_bytes,
        fe.total,
        "DeepSpeed's `GB` is 2^30 bytes (GiB); ferrite counts requested bytes, before its allocator rounds each \
         block to 512 B, and the planner's peak adds activations, temporaries and the CUDA context that DeepSpeed's \
         model-state estimate leaves out"
            .into(),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t5_3b() -> ModelSizes {
        ModelSizes { total_params: 2_851_598_336, largest_layer_params: 32_899_072, largest_layer: "shared".into() }
    }

    #[test]
    fn zero2_rows_follow_deepspeed_formulas() {
        let s = ZeroSetup::new(2, 8, 1, Offload::None).unwrap();
        let e = deepspeed_estimate(&t5_3b(), &s);
        assert_eq!(e.per_gpu_bytes, 4 * 2_851_598_336 + 16 * 2_851_598_336 / 8);
        assert_eq!(e.per_cpu_bytes, 2_851_598_336 * 4 * 8 * 3 / 2);
        let off = deepspeed_estimate(&t5_3b(), &ZeroSetup::new(2, 8, 1, Offload::Optimizer).unwrap());
        assert_eq!(off.per_gpu_bytes, 2 * 2_851_598_336);
        assert_eq!(off.options, "offload_optimizer=cpu");
    }

    #[test]
    fn zero3_rows_follow_deepspeed_formulas() {
        let s = ZeroSetup::new(3, 8, 1, Offload::None).unwrap();
        let e = deepspeed_estimate(&t5_3b(), &s);
        assert_eq!(e.per_gpu_bytes, 4 * 32_899_072 + 18 * 2_851_598_336 / 8);
        let table = deepspeed_table(&t5_3b(), &s);
        assert_eq!(table.len(), 6);
        assert_eq!(table[0].options, "offload_param=cpu, offload_optimizer=cpu, zero_init=1");
        assert_eq!(table[0].per_gpu_bytes, 4 * 32_899_072);
    }

    #[test]
    fn bad_setups_are_refused() {
        assert!(ZeroSetup::new(4, 8, 1, Offload::None).unwrap_err().to_string().contains("stages 1, 2 and 3"));
        assert!(ZeroSetup::new(2, 0, 1, Offload::None).is_err());
        assert!(ZeroSetup::new(2, 8, 1, Offload::OptimizerAndParams).unwrap_err().to_string().contains("--zero 3"));
    }

    #[test]
    fn printed_sizes_truncate_to_millions() {
        let p = t5_3b().as_printed();
        assert_eq!((p.total_params, p.largest_layer_params), (2_851_000_000, 32_000_000));
        assert_eq!(deepspeed_gb(1 << 30), "1.00");
    }
}
