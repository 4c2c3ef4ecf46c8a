//! The recorded step: every allocation and free of the step run on `meta`, each allocation
//! tagged with its category (parameters, gradients, optimizer state, activations, temporaries),
//! phase and layer.
//!
//! Categories come from *when* a block lives, not from guessing by size: what building the
//! model allocates and keeps is parameters (and buffers); what the forward pass allocated and
//! is still alive when backward starts is activations saved for backward (the batch and the
//! loss included); the gradients are the blocks the parameters' `.grad` point to after
//! backward; what the optimizer step allocated and keeps is optimizer state; everything else
//! is a temporary.
use std::collections::HashMap;
use std::sync::Mutex;

use ferrite_memory::{Device, TraceAction, allocator};
use serde::Serialize;

use crate::PlanError;
use crate::fully_sharded_step::run_layout_step;
use crate::sharded_step::RankLayout;
use crate::step::{CustomStep, MarkKind, Phase, run_step};
use crate::workload::{StepConfig, Workload};

/// The process-wide `meta` allocator is shared: plans run one at a time so one plan's
/// allocations never land in another's trace.
static PLAN_LOCK: Mutex<()> = Mutex::new(());

/// Hold the planner's `meta` lock while building a model on `meta` outside [`record`] (to count
/// it, say), so a plan recording at the same time does not see its allocations.
pub fn plan_lock() -> std::sync::MutexGuard<'static, ()> {
    PLAN_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Most events a recording keeps (far above what a 100-layer model's two steps allocate).
const MAX_EVENTS: usize = 1 << 26;

/// What a block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameters,
    Gradients,
    OptimizerState,
    Activations,
    Temporaries,
}

impl Category {
    /// Every category, in the order of [`crate::StepPoint::by_category`].
    pub const ALL: [Category; 5] = [
        Category::Parameters,
        Category::Gradients,
        Category::OptimizerState,
        Category::Activations,
        Category::Temporaries,
    ];

    /// Position in [`Category::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// A label for tables and plots.
    pub fn label(self) -> &'static str {
        match self {
            Category::Parameters => "parameters",
            Category::Gradients => "gradients",
            Category::OptimizerState => "optimizer state",
            Category::Activations => "activations",
            Category::Temporaries => "temporaries",
        }
    }
}

/// One allocation or free of the recorded step.
#[derive(Debug, Clone)]
pub struct Event {
    /// `true` for an allocation, `false` for a free.
    pub alloc: bool,
    /// Address on `meta` (identifies the block while it lives).
    pub addr: u64,
    /// Requested bytes.
    pub size: u64,
}

/// Facts about one allocation event.
#[derive(Debug, Clone)]
pub struct AllocInfo {
    pub category: Category,
    pub phase: Phase,
    pub step: usize,
    /// Index into [`StepTrace::layers`] of the layer the forward pass was in.
    pub layer: Option<usize>,
    /// The Rust source line that asked for the memory (the op), e.g. `ops/matmul.rs:42`.
    pub site: String,
}

/// A recorded step, independent of the GPU it will be replayed on.
#[derive(Debug, Clone)]
pub struct StepTrace {
    pub workload: String,
    pub config: StepConfig,
    /// Parameter count of the model.
    pub parameters: u64,
    pub events: Vec<Event>,
    /// For each event: `Some` for allocations.
    pub info: Vec<Option<AllocInfo>>,
    /// Layer names in the order the forward pass entered them.
    pub layers: Vec<String>,
    /// Bytes (requested) of activations saved for backward per layer, at the start of the last
    /// backward pass, in forward order.
    pub activations_by_layer: Vec<(String, u64)>,
}

/// Run the step of `workload` on `meta` and record it.
pub fn record(workload: &dyn Workload, config: &StepConfig) -> Result<StepTrace, PlanError> {
    record_with(workload, config, None)
}

/// Record one rank's step of a data-parallel run (DDP, ZeRO-1, ZeRO-2; see
/// [`crate::sharded_step`]): what that rank's device holds.
pub fn record_rank(workload: &dyn Workload, config: &StepConfig, layout: RankLayout) -> Result<StepTrace, PlanError> {
    record_with(workload, config, Some(layout))
}

fn record_with(
    workload: &dyn Workload,
    config: &StepConfig,
    layout: Option<RankLayout>,
) -> Result<StepTrace, PlanError> {
    let _guard = PLAN_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let meta = allocator(&Device::Meta);
    meta.record_memory_history(Some(MAX_EVENTS));
    let rank_step = layout.map(|l| move |d: &Device| run_layout_step(workload, config, d, l));
    let run =
        run_step(workload, config, &Device::Meta, Some(meta.clone()), rank_step.as_ref().map(|f| f as &CustomStep<'_>));
    let history = meta.memory_history();
    meta.record_memory_history(None);
    let run = run?;

    // History index -> event index, keeping allocations and frees only.
    let mut events = Vec::new();
    let mut sites = Vec::new();
    let mut event_at = Vec::with_capacity(history.len() + 1);
    for h in &history {
        event_at.push(events.len());
        let alloc = match h.action {
            TraceAction::Alloc => true,
            TraceAction::Free => false,
            _ => continue,
        };
        events.push(Event { alloc, addr: h.addr, size: h.size });
        sites.push(h.frames.first().map(|f| short_site(&f.filename, f.line)).unwrap_or_default());
    }
    event_at.push(events.len());
    let mut marks: Vec<(usize, MarkKind)> =
        run.marks.into_iter().map(|m| (event_at[m.at.min(history.len())], m.kind)).collect();
    marks.sort_by_key(|m| m.0);

    let mut info: Vec<Option<AllocInfo>> = vec![None; events.len()];
    let mut layers: Vec<String> = Vec::new();
    let mut live: HashMap<u64, usize> = HashMap::new();
    let (mut phase, mut step, mut layer) = (Phase::Build, 0usize, None::<usize>);
    let mut phase_start = 0usize;
    let mut by_layer: Vec<(String, u64)> = Vec::new();
    let mut next_mark = 0;
    for i in 0..=events.len() {
        while next_mark < marks.len() && marks[next_mark].0 == i {
            match &marks[next_mark].1 {
                MarkKind::Phase { phase: p, step: s } => {
                    // Close the phase that ends here.
                    match phase {
                        Phase::Build if i > 0 => tag_live(&live, &mut info, phase_start, Category::Parameters),
                        Phase::Forward => {
                            tag_live(&live, &mut info, phase_start, Category::Activations);
                            by_layer = layer_totals(&live, &info, &events, &layers, phase_start);
                        }
                        Phase::OptimizerStep => tag_live(&live, &mut info, phase_start, Category::OptimizerState),
                        _ => {}
                    }
                    (phase, step, layer, phase_start) = (*p, *s, None, i);
                }
                MarkKind::Layer(name) => {
                    let idx = layers.iter().position(|l| l == name).unwrap_or_else(|| {
                        layers.push(name.clone());
                        layers.len() - 1
                    });
                    layer = Some(idx);
                }
                MarkKind::Grads(addrs) => {
                    for a in addrs {
                        if let Some(&e) = live.get(a)
                            && let Some(inf) = info[e].as_mut()
                        {
                            inf.category = Category::Gradients;
                        }
                    }
                }
            }
            next_mark += 1;
        }
        let Some(ev) = events.get(i) else { break };
        if ev.alloc {
            live.insert(ev.addr, i);
            info[i] = Some(AllocInfo {
                category: Category::Temporaries,
                phase,
                step,
                layer: if phase == Phase::Forward { layer } else { None },
                site: std::mem::take(&mut sites[i]),
            });
        } else {
            live.remove(&ev.addr);
        }
    }
    Ok(StepTrace {
        workload: workload.describe(),
        config: config.clone(),
        parameters: run.parameters,
        events,
        info,
        layers,
        activations_by_layer: by_layer,
    })
}

/// Tag every live block allocated since `since` that is still a temporary with `category`.
fn tag_live(live: &HashMap<u64, usize>, info: &mut [Option<AllocInfo>], since: usize, category: Category) {
    for &e in live.values() {
        if e >= since
            && let Some(inf) = info[e].as_mut()
            && inf.category == Category::Temporaries
        {
            inf.category = category;
        }
    }
}

/// Saved activations per layer (requested bytes) among the live blocks of the forward pass
/// that began at `since`; blocks before the first layer mark count as `inputs and embeddings`.
fn layer_totals(
    live: &HashMap<u64, usize>,
    info: &[Option<AllocInfo>],
    events: &[Event],
    layers: &[String],
    since: usize,
) -> Vec<(String, u64)> {
    let mut totals = vec![0u64; layers.len() + 1];
    for &e in live.values() {
        if e >= since
            && let Some(inf) = &info[e]
            && inf.category == Category::Activations
        {
            totals[inf.layer.map_or(0, |l| l + 1)] += events[e].size;
        }
    }
    let mut out = Vec::new();
    if totals[0] > 0 || layers.is_empty() {
        out.push(("inputs and embeddings".to_string(), totals[0]));
    }
    out.extend(layers.iter().cloned().zip(totals[1..].iter().copied()));
    out
}

/// `…/crates/ferrite-tensor/src/ops/matmul.rs:42` → `ferrite-tensor/src/ops/matmul.rs:42`.
fn short_site(file: &str, line: u32) -> String {
    let f = file.rsplit_once("crates/").map_or(file, |(_, rest)| rest);
    format!("{f}:{line}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_are_shortened_to_the_crate_path() {
        assert_eq!(
            short_site("/work/x/crates/ferrite-tensor/src/ops/matmul.rs", 42),
            "ferrite-tensor/src/ops/matmul.rs:42"
        );
        assert_eq!(short_site("src/lib.rs", 1), "src/lib.rs:1");
    }
}
