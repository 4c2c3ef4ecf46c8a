//! Replaying a recorded step through the real allocator of the target GPU: the prediction.
//!
//! The replay uses [`CachingAllocator::unbacked`] for the target device, with the run's
//! allocator settings and memory fraction: PyTorch's rounding, pools, segment sizes, splitting,
//! the free-cache-and-retry ladder and the card's capacity minus its context all apply, and no
//! byte is touched.
use std::collections::HashMap;

use ferrite_memory::{AllocatorConfig, Block, CachingAllocator, Device, GpuProfile, MemoryError, OomDiagnosis};
use serde::Serialize;

use crate::PlanError;
use crate::step::Phase;
use crate::trace::{Category, StepTrace};

/// Where a plan is evaluated: a simulated GPU, allocator settings and an optional fraction.
#[derive(Debug, Clone)]
pub struct Target {
    pub profile: GpuProfile,
    pub config: AllocatorConfig,
    /// `set_per_process_memory_fraction` of the run, if any.
    pub memory_fraction: Option<f64>,
}

impl Target {
    /// Parse `sim:<gpu>` (or a bare `<gpu>`); an unknown name lists the known ones.
    pub fn parse(device: &str, config: AllocatorConfig) -> Result<Target, PlanError> {
        let spec = if device.starts_with("sim:") { device.to_string() } else { format!("sim:{device}") };
        match Device::parse(&spec) {
            Ok(Device::Sim { profile, .. }) => Ok(Target { profile, config, memory_fraction: None }),
            _ => Err(PlanError::UnknownGpu {
                name: device.to_string(),
                known: ferrite_memory::GPU_CATALOGUE
                    .iter()
                    .map(|g| format!("sim:{}", g.0))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The device string, e.g. `sim:a100-40gb`.
    pub fn device_name(&self) -> String {
        format!("sim:{}", self.profile.key)
    }

    /// Bytes the allocator may reserve: capacity minus context, capped by the fraction.
    pub fn usable_bytes(&self) -> u64 {
        let usable = self.profile.usable_bytes();
        match self.memory_fraction {
            Some(f) => usable.min((f * self.profile.total_bytes as f64) as u64),
            None => usable,
        }
    }
}

/// Memory by category at the peak; the parts add up to the peak reserved plus the context.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Breakdown {
    pub parameters: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    /// Activations saved for backward (the batch and loss included) live at the peak.
    pub activations: u64,
    /// Temporaries live at the peak.
    pub temporaries: u64,
    /// Rounding of requests to the allocator's block sizes (allocated − requested).
    pub allocator_rounding: u64,
    /// Reserved but not allocated at the peak: cached blocks and fragmentation.
    pub cached_and_fragmentation: u64,
    /// The CUDA context and runtime, outside the allocator.
    pub context_overhead: u64,
}

impl Breakdown {
    /// The parts in order, with their names.
    pub fn parts(&self) -> [(&'static str, u64); 8] {
        [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer_state),
            ("activations saved for backward", self.activations),
            ("temporaries at the peak", self.temporaries),
            ("allocator rounding", self.allocator_rounding),
            ("cached and fragmentation", self.cached_and_fragmentation),
            ("context overhead", self.context_overhead),
        ]
    }
}

/// The op at which allocated memory peaks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeakSite {
    pub phase: Phase,
    /// Optimizer step (1 = the first, which creates the optimizer state).
    pub step: usize,
    pub layer: Option<String>,
    /// Source line of the op that asked for the block, e.g. `ferrite-tensor/src/ops/matmul.rs:42`.
    pub op: String,
    /// Requested bytes of that allocation.
    pub bytes: u64,
}

/// The first allocation that did not fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanOom {
    pub phase: Phase,
    pub step: usize,
    pub requested_bytes: u64,
    pub diagnosis: OomDiagnosis,
}

/// The prediction for one step on one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    pub model: String,
    pub device: String,
    pub gpu: String,
    pub batch_size: usize,
    pub accum_steps: usize,
    pub amp: Option<&'static str>,
    pub checkpoint_activations: bool,
    pub optimizer: &'static str,
    pub alloc_conf: String,
    pub memory_fraction: Option<f64>,
    pub fits: bool,
    /// Parameter count.
    pub parameters: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// The card's memory (`totalGlobalMem`).
    pub capacity_bytes: u64,
    /// What the allocator may reserve (capacity − context, capped by the fraction).
    pub usable_bytes: u64,
    /// `usable − peak reserved` (negative: that much is missing).
    pub headroom_bytes: i64,
    pub breakdown: Breakdown,
    pub activations_by_layer: Vec<LayerBytes>,
    pub peak_at: Option<PeakSite>,
    /// Where the step runs out of memory on this GPU (None when it fits).
    pub oom: Option<PlanOom>,
    /// Allocations of the recorded step.
    pub events: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_peak_allocated_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_peak_reserved_bytes: Option<u64>,
}

/// Activations saved by one layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerBytes {
    pub layer: String,
    pub bytes: u64,
}

/// Outcome of one replay.
struct Replay {
    peak_allocated: u64,
    peak_reserved: u64,
    /// Event index at which allocated memory peaked.
    peak_event: Option<usize>,
    oom: Option<(usize, OomDiagnosis)>,
}

fn replay(
    trace: &StepTrace,
    device: Device,
    config: &AllocatorConfig,
    fraction: Option<f64>,
) -> Result<Replay, PlanError> {
    let alloc = CachingAllocator::unbacked(device, config.clone());
    if let Some(f) = fraction {
        alloc.set_per_process_memory_fraction(f)?;
    }
    let mut live: HashMap<u64, Block> = HashMap::with_capacity(1024);
    let mut out = Replay { peak_allocated: 0, peak_reserved: 0, peak_event: None, oom: None };
    for (i, ev) in trace.events.iter().enumerate() {
        if !ev.alloc {
            live.remove(&ev.addr);
            continue;
        }
        let size = usize::try_from(ev.size).map_err(|_| {
            PlanError::setting("model", format!("a tensor of {} bytes does not fit this platform", ev.size))
        })?;
        match alloc.allocate(size) {
            Ok(b) => {
                live.insert(ev.addr, b);
                let a = alloc.memory_allocated();
                if a > out.peak_allocated {
                    out.peak_allocated = a;
                    out.peak_event = Some(i);
                }
            }
            Err(MemoryError::OutOfMemory { report } | MemoryError::DriverRefused { report }) => {
                if out.oom.is_none() {
                    out.oom = Some((i, report.diagnosis));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    out.peak_reserved = alloc.max_memory_reserved();
    Ok(out)
}

/// A device with the target's rules and no capacity limit: the memory the step needs.
fn unbounded() -> Device {
    Device::Sim { profile: GpuProfile::custom(1 << 50), index: 0 }
}

/// Predict the step of `trace` on `target`.
pub fn evaluate(trace: &StepTrace, target: &Target) -> Result<MemoryPlan, PlanError> {
    let device = Device::Sim { profile: target.profile.clone(), index: 0 };
    let on_target = replay(trace, device, &target.config, target.memory_fraction)?;
    // When the step does not fit, the numbers to show are what it would need.
    let oom = on_target.oom.and_then(|(i, diagnosis)| {
        trace.info[i].as_ref().map(|inf| PlanOom {
            phase: inf.phase,
            step: inf.step + 1,
            requested_bytes: trace.events[i].size,
            diagnosis,
        })
    });
    let need = if on_target.oom.is_some() { replay(trace, unbounded(), &target.config, None)? } else { on_target };
    let usable = target.usable_bytes();
    let mut breakdown = Breakdown { context_overhead: target.profile.context_overhead_bytes, ..Breakdown::default() };
    let mut peak_at = None;
    if let Some(p) = need.peak_event {
        let mut live: HashMap<u64, usize> = HashMap::new();
        for (i, ev) in trace.events[..=p].iter().enumerate() {
            if ev.alloc {
                live.insert(ev.addr, i);
            } else {
                live.remove(&ev.addr);
            }
        }
        let mut requested = 0u64;
        for &e in live.values() {
            let size = trace.events[e].size;
            requested += size;
            let slot = match trace.info[e].as_ref().map(|i| i.category) {
                Some(Category::Parameters) => &mut breakdown.parameters,
                Some(Category::Gradients) => &mut breakdown.gradients,
                Some(Category::OptimizerState) => &mut breakdown.optimizer_state,
                Some(Category::Activations) => &mut breakdown.activations,
                _ => &mut breakdown.temporaries,
            };
            *slot += size;
        }
        breakdown.allocator_rounding = need.peak_allocated.saturating_sub(requested);
        if let Some(inf) = &trace.info[p] {
            peak_at = Some(PeakSite {
                phase: inf.phase,
                step: inf.step + 1,
                layer: inf.layer.and_then(|l| trace.layers.get(l).cloned()),
                op: inf.site.clone(),
                bytes: trace.events[p].size,
            });
        }
    }
    breakdown.cached_and_fragmentation = need.peak_reserved.saturating_sub(need.peak_allocated);
    let c = &trace.config;
    Ok(MemoryPlan {
        model: trace.workload.clone(),
        device: target.device_name(),
        gpu: target.profile.name.clone(),
        batch_size: c.batch,
        accum_steps: c.accum_steps,
        amp: c.amp.map(|a| a.name()),
        checkpoint_activations: c.checkpoint_activations,
        optimizer: c.optimizer.name(),
        alloc_conf: alloc_conf_string(&target.config),
        memory_fraction: target.memory_fraction,
        fits: oom.is_none(),
        parameters: trace.parameters,
        peak_allocated_bytes: need.peak_allocated,
        peak_reserved_bytes: need.peak_reserved,
        capacity_bytes: target.profile.total_bytes,
        usable_bytes: usable,
        headroom_bytes: usable as i64 - need.peak_reserved as i64,
        breakdown,
        activations_by_layer: trace
            .activations_by_layer
            .iter()
            .map(|(l, b)| LayerBytes { layer: l.clone(), bytes: *b })
            .collect(),
        peak_at,
        oom,
        events: trace.events.iter().filter(|e| e.alloc).count(),
        measured_peak_allocated_bytes: None,
        measured_peak_reserved_bytes: None,
    })
}

/// Memory after one event of a replayed step (`ferrite plan --plot` draws these).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPoint {
    /// Index of the allocation or free in the recorded step.
    pub event: usize,
    /// Bytes allocated (rounded blocks, as `memory_allocated`).
    pub allocated: u64,
    /// Bytes reserved (segments, as `memory_reserved`).
    pub reserved: u64,
    /// Requested bytes of the live blocks per category, in [`Category::ALL`] order.
    pub by_category: [u64; 5],
}

/// Replay `trace` on `target` and return memory after every event, so the step can be drawn as
/// a timeline. A step that does not fit is replayed without the capacity limit (same allocator
/// rules), so the picture shows what it would need against the card's capacity line.
pub fn step_timeline(trace: &StepTrace, target: &Target) -> Result<Vec<StepPoint>, PlanError> {
    let run = |device: Device, fraction: Option<f64>| -> Result<Option<Vec<StepPoint>>, PlanError> {
        let alloc = CachingAllocator::unbacked(device, target.config.clone());
        if let Some(f) = fraction {
            alloc.set_per_process_memory_fraction(f)?;
        }
        let mut live: HashMap<u64, (Block, usize)> = HashMap::with_capacity(1024);
        let mut by_category = [0u64; 5];
        let mut points = Vec::with_capacity(trace.events.len());
        for (i, ev) in trace.events.iter().enumerate() {
            if ev.alloc {
                let size = usize::try_from(ev.size).map_err(|_| {
                    PlanError::setting("model", format!("a tensor of {} bytes does not fit this platform", ev.size))
                })?;
                let slot = trace.info[i].as_ref().map_or(Category::Temporaries, |inf| inf.category).index();
                match alloc.allocate(size) {
                    Ok(b) => {
                        by_category[slot] += ev.size;
                        live.insert(ev.addr, (b, slot));
                    }
                    Err(MemoryError::OutOfMemory { .. } | MemoryError::DriverRefused { .. }) => return Ok(None),
                    Err(e) => return Err(e.into()),
                }
            } else if let Some((b, slot)) = live.remove(&ev.addr) {
                by_category[slot] = by_category[slot].saturating_sub(b.requested_size() as u64);
            }
            points.push(StepPoint {
                event: i,
                allocated: alloc.memory_allocated(),
                reserved: alloc.memory_reserved(),
                by_category,
            });
        }
        Ok(Some(points))
    };
    let device = Device::Sim { profile: target.profile.clone(), index: 0 };
    match run(device, target.memory_fraction)? {
        Some(points) => Ok(points),
        None => Ok(run(unbounded(), None)?.unwrap_or_default()),
    }
}

/// The non-default allocator settings, in `PYTORCH_CUDA_ALLOC_CONF` syntax.
pub fn alloc_conf_string(config: &AllocatorConfig) -> String {
    config.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fraction_caps_what_the_allocator_may_use() {
        let mut t = Target::parse("a100-40gb", AllocatorConfig::default()).unwrap();
        assert_eq!(t.device_name(), "sim:a100-40gb");
        assert_eq!(t.usable_bytes(), t.profile.total_bytes - t.profile.context_overhead_bytes);
        t.memory_fraction = Some(0.25);
        assert_eq!(t.usable_bytes(), (0.25 * t.profile.total_bytes as f64) as u64);
        assert!(matches!(Target::parse("sim:nope", AllocatorConfig::default()), Err(PlanError::UnknownGpu { .. })));
    }
}
