//! Out-of-memory as a value: the full picture, a diagnosis and what to do about it.
//!
//! PyTorch's "CUDA out of memory" message lists numbers but leaves the user to work out whether
//! the tensors simply do not fit (*exhausted*) or whether memory exists but is scattered
//! (*fragmented*), which call for opposite remedies. [`OutOfMemoryReport`] keeps PyTorch's
//! wording at the start, so the message is recognisable, then states the diagnosis and ranked
//! suggestions.
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::DeviceKind;

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomDiagnosis {
    /// The live tensors plus this request exceed what the device (or the memory fraction)
    /// allows: no allocator setting can help, the workload must shrink.
    Exhausted,
    /// Enough bytes are free or cached in total, but no contiguous block or segment fits.
    Fragmented,
}

impl fmt::Display for OomDiagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OomDiagnosis::Exhausted => "exhausted",
            OomDiagnosis::Fragmented => "fragmented",
        })
    }
}

/// A remedy, most effective first in [`OutOfMemoryReport::suggestions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuggestionKind {
    RaiseMemoryFraction,
    ReduceBatchSize,
    GradientAccumulation,
    MixedPrecision,
    ActivationCheckpointing,
    ExpandableSegments,
    MaxSplitSize,
    EmptyCache,
}

/// One ranked suggestion with a sentence that carries the relevant numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suggestion {
    pub kind: SuggestionKind,
    pub text: String,
}

/// One remedy a planner measured for the model that ran out of memory: the change, the bytes it
/// saves at the peak and the peak it leads to. Why it lives here: the memory layer cannot run a
/// model, but its report is what the user reads, so a layer above (the planner) attaches these
/// with [`OutOfMemoryReport::set_planned_remedies`] and they replace the fixed-rule suggestions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedRemedy {
    /// The change, as the user would type it, e.g. `--amp bf16`.
    pub change: String,
    /// Peak reserved bytes the change removes (planned peak of the run as it was minus the
    /// planned peak with the change).
    pub saves_bytes: u64,
    /// Peak reserved bytes the change adds (0 unless it makes the peak higher); shown as such
    /// rather than as "saves 0 bytes".
    #[serde(default)]
    pub raises_bytes: u64,
    /// Planned peak reserved bytes with the change.
    pub peak_reserved_bytes: u64,
    /// Whether the run fits the device with the change.
    pub fits: bool,
}

/// The planner's ranked remedies for this model on this device (see [`PlannedRemedy`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedRemedies {
    /// What the planner modelled, e.g. `sim:t4-16gb` or `gpu:0 (64.00 MiB)`.
    pub target: String,
    /// Most effective first: those that fit before those that do not, then most bytes saved.
    pub remedies: Vec<PlannedRemedy>,
}

/// Everything known about a failed allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutOfMemoryReport {
    /// Device string, e.g. `sim:a100-40gb:0`.
    pub device: String,
    pub device_kind: DeviceKind,
    /// Device index (the `N` of `GPU N` in the message).
    pub device_index: usize,
    /// Human name of the device model, e.g. `NVIDIA A100-SXM4-40GB`.
    pub device_name: String,
    /// Bytes the caller asked for.
    pub requested_bytes: u64,
    /// The request after rounding (what a block of this allocation would hold).
    pub rounded_bytes: u64,
    /// Size of the segment the allocator tried to reserve (PyTorch's "Tried to allocate").
    pub segment_bytes: u64,
    /// Total device memory (`totalGlobalMem`), if the device has a fixed capacity.
    pub total_capacity: Option<u64>,
    /// Device memory not reserved by anyone (what `cudaMemGetInfo` would call free).
    pub device_free: Option<u64>,
    /// Limit from the per-process memory fraction, if one is set.
    pub allowed_bytes: Option<u64>,
    /// Bytes held by live blocks (`allocated_bytes.all.current`).
    pub allocated_bytes: u64,
    /// Bytes reserved in segments (`reserved_bytes.all.current`).
    pub reserved_bytes: u64,
    /// `reserved - allocated`: cached but unusable for this request.
    pub reserved_unallocated_bytes: u64,
    /// Largest free block held in the cache.
    pub largest_free_block: u64,
    /// The most this allocator could ever reserve (capacity minus context, capped by the fraction).
    pub limit_bytes: Option<u64>,
    /// The host machine, not the device, ran out: host-backed devices of this process already
    /// reserve close to the physical RAM.
    pub host_refused: bool,
    /// A GPU driver refused a new buffer: the card's memory is used up (possibly by other
    /// processes), whatever ferrite believed the capacity to be.
    #[serde(default)]
    pub driver_refused: bool,
    pub diagnosis: OomDiagnosis,
    /// Ranked remedies from fixed rules, most effective first: what the allocator alone can say.
    /// Shown only when no [`planned`](Self::planned) remedies replace them.
    pub suggestions: Vec<Suggestion>,
    /// The planner's ranked remedies for this model, with bytes; when set, the message shows
    /// these instead of [`suggestions`](Self::suggestions).
    #[serde(default)]
    pub planned: Option<PlannedRemedies>,
    /// Why no planner could model the run, when one was asked (the message then says so above
    /// the fixed-rule suggestions).
    #[serde(default)]
    pub planner_unavailable: Option<String>,
}

/// PyTorch's `format_size`: `N bytes`, then KiB / MiB / GiB with two decimals.
pub fn format_size(size: u64) -> String {
    const KIB: f64 = 1024.0;
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1 << 20 {
        format!("{:.2} KiB", size as f64 / KIB)
    } else if size <= 1 << 30 {
        format!("{:.2} MiB", size as f64 / (KIB * KIB))
    } else {
        format!("{:.2} GiB", size as f64 / (KIB * KIB * KIB))
    }
}

/// Inputs of [`OutOfMemoryReport::diagnose`], gathered by the allocator under its lock.
pub(crate) struct OomFacts {
    pub device: String,
    pub device_kind: DeviceKind,
    pub device_index: usize,
    pub device_name: String,
    pub requested_bytes: u64,
    pub rounded_bytes: u64,
    pub segment_bytes: u64,
    pub total_capacity: Option<u64>,
    pub usable_capacity: Option<u64>,
    pub device_free: Option<u64>,
    pub allowed_bytes: Option<u64>,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub largest_free_block: u64,
    pub max_split_size: Option<u64>,
    pub host_refused: bool,
    pub driver_refused: bool,
    pub expandable_segments: bool,
}

impl OutOfMemoryReport {
    pub(crate) fn diagnose(f: OomFacts) -> OutOfMemoryReport {
        let limit = match (f.usable_capacity, f.allowed_bytes) {
            (Some(u), Some(a)) => Some(u.min(a)),
            (u, a) => u.or(a),
        };
        let needed = f.allocated_bytes.saturating_add(f.rounded_bytes);
        // With no fixed capacity the host itself refused: nothing is merely scattered.
        let diagnosis = match limit {
            Some(l) if needed <= l => OomDiagnosis::Fragmented,
            _ => OomDiagnosis::Exhausted,
        };
        let mut s: Vec<Suggestion> = Vec::new();
        let mut push = |kind, text: String| s.push(Suggestion { kind, text });
        match diagnosis {
            OomDiagnosis::Exhausted => {
                if let (Some(a), Some(u)) = (f.allowed_bytes, f.usable_capacity)
                    && a < u
                    && needed <= u
                {
                    push(
                        SuggestionKind::RaiseMemoryFraction,
                        format!(
                            "raise the per-process memory fraction: it allows {}, the device could hold the {} needed",
                            format_size(a),
                            format_size(needed)
                        ),
                    );
                }
                let short = limit.map(|l| needed.saturating_sub(l)).unwrap_or(0);
                push(
                    SuggestionKind::ReduceBatchSize,
                    if short > 0 {
                        format!(
                            "reduce the batch size: live tensors ({}) plus this request ({}) exceed the {} available by {}",
                            format_size(f.allocated_bytes),
                            format_size(f.rounded_bytes),
                            format_size(limit.unwrap_or(0)),
                            format_size(short)
                        )
                    } else {
                        "reduce the batch size (the host refused the memory)".to_string()
                    },
                );
                push(
                    SuggestionKind::GradientAccumulation,
                    "accumulate gradients over smaller micro-batches: same effective batch, a fraction of the activation memory".to_string(),
                );
                push(
                    SuggestionKind::MixedPrecision,
                    "train in mixed precision (autocast to bf16/f16): activations and their gradients take half the bytes".to_string(),
                );
                push(
                    SuggestionKind::ActivationCheckpointing,
                    "checkpoint activations: recompute them in backward instead of keeping them alive".to_string(),
                );
            }
            OomDiagnosis::Fragmented => {
                if !f.expandable_segments && f.device_kind != DeviceKind::Gpu {
                    push(
                        SuggestionKind::ExpandableSegments,
                        "set FERRITE_ALLOC_CONF=expandable_segments:True so segments grow in pages instead of leaving unusable slivers".to_string(),
                    );
                }
                let stranded = f.reserved_bytes.saturating_sub(f.allocated_bytes);
                if stranded == 0 {
                    // Nothing cached: only the segment granularity is in the way.
                    push(
                        SuggestionKind::ReduceBatchSize,
                        format!(
                            "free a tensor or shrink the batch slightly: this request needs a new {} segment and only {} is unreserved",
                            format_size(f.segment_bytes),
                            format_size(f.device_free.unwrap_or(0))
                        ),
                    );
                }
                if f.max_split_size.is_none() && stranded > 0 {
                    let mb = (f.rounded_bytes >> 20).max(20);
                    push(
                        SuggestionKind::MaxSplitSize,
                        format!(
                            "set FERRITE_ALLOC_CONF=max_split_size_mb:{mb} so large cached blocks are kept whole for large requests instead of being split"
                        ),
                    );
                }
                if stranded > 0 {
                    push(
                        SuggestionKind::EmptyCache,
                        format!(
                            "call empty_cache() between phases (e.g. after evaluation) so the {} reserved but unallocated can be reserved again in the shapes the next phase needs",
                            format_size(stranded)
                        ),
                    );
                }
            }
        }
        OutOfMemoryReport {
            device: f.device,
            device_kind: f.device_kind,
            device_index: f.device_index,
            device_name: f.device_name,
            requested_bytes: f.requested_bytes,
            rounded_bytes: f.rounded_bytes,
            segment_bytes: f.segment_bytes,
            total_capacity: f.total_capacity,
            device_free: f.device_free,
            allowed_bytes: f.allowed_bytes,
            allocated_bytes: f.allocated_bytes,
            reserved_bytes: f.reserved_bytes,
            reserved_unallocated_bytes: f.reserved_bytes.saturating_sub(f.allocated_bytes),
            largest_free_block: f.largest_free_block,
            limit_bytes: limit,
            host_refused: f.host_refused,
            driver_refused: f.driver_refused,
            diagnosis,
            suggestions: s,
            planned: None,
            planner_unavailable: None,
        }
    }

    /// Replace the fixed-rule suggestions with a planner's remedies for this model on `target`.
    /// They are ranked here (those that fit first, then by bytes saved, larger first; the order
    /// given breaks ties), so the message is ranked whatever the caller passed.
    pub fn set_planned_remedies(&mut self, target: impl Into<String>, mut remedies: Vec<PlannedRemedy>) {
        remedies.sort_by(|a, b| {
            b.fits.cmp(&a.fits).then(b.saves_bytes.cmp(&a.saves_bytes)).then(a.raises_bytes.cmp(&b.raises_bytes))
        });
        self.planned = Some(PlannedRemedies { target: target.into(), remedies });
        self.planner_unavailable = None;
    }

    /// As [`set_planned_remedies`](Self::set_planned_remedies), by value.
    pub fn with_planned_remedies(mut self, target: impl Into<String>, remedies: Vec<PlannedRemedy>) -> Self {
        self.set_planned_remedies(target, remedies);
        self
    }

    /// Keep the fixed-rule suggestions and say in the message why no planner could rank
    /// remedies for this run (e.g. `cpu has no fixed capacity`).
    pub fn set_planner_unavailable(&mut self, reason: impl Into<String>) {
        self.planned = None;
        self.planner_unavailable = Some(reason.into());
    }

    /// The planner's remedies, most effective first, if a planner replaced the suggestions.
    pub fn planned_remedies(&self) -> Option<&[PlannedRemedy]> {
        self.planned.as_ref().map(|p| p.remedies.as_slice())
    }

    /// One-sentence explanation of the diagnosis with the numbers behind it.
    pub fn explanation(&self) -> String {
        let needed = self.allocated_bytes.saturating_add(self.rounded_bytes);
        if self.driver_refused {
            return format!(
                "the GPU driver refused a new {} buffer with {} reserved by this process: the card's memory is used up (other processes count too; `nvidia-smi` or the vendor's tool shows them){}",
                format_size(self.segment_bytes),
                format_size(self.reserved_bytes),
                if self.total_capacity.is_none() {
                    ", and ferrite does not know this GPU's capacity (set FERRITE_GPU_MEMORY=<size> to plan against it)"
                } else {
                    ""
                }
            );
        }
        if self.host_refused {
            return format!(
                "the host machine cannot back more memory: host-backed devices of this process reserve {} and a new {} segment would exceed the physical RAM (use `meta` or an unbacked allocator to plan beyond it)",
                format_size(crate::raw_memory::host_reserved()),
                format_size(self.segment_bytes)
            );
        }
        match (self.diagnosis, self.limit_bytes) {
            (OomDiagnosis::Exhausted, Some(l)) => format!(
                "the live tensors ({}) plus this request ({}) need {}, more than the {} this allocator may reserve",
                format_size(self.allocated_bytes),
                format_size(self.rounded_bytes),
                format_size(needed),
                format_size(l)
            ),
            (OomDiagnosis::Exhausted, None) => {
                "the host refused the memory (no fixed device capacity applies)".to_string()
            }
            (OomDiagnosis::Fragmented, l) => format!(
                "{} would fit in the {} this allocator may reserve, but the largest free cached block is {} and a new {} segment does not fit in the {} still unreserved",
                format_size(needed),
                format_size(l.unwrap_or(0)),
                format_size(self.largest_free_block),
                format_size(self.segment_bytes),
                format_size(l.unwrap_or(0).saturating_sub(self.reserved_bytes))
            ),
        }
    }
}

impl fmt::Display for OutOfMemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (prefix, who) = match self.device_kind {
            DeviceKind::Sim => (
                "CUDA out of memory",
                format!("GPU {} ({}, {}, simulated)", self.device_index, self.device, self.device_name),
            ),
            DeviceKind::Cpu => ("CPU out of memory", format!("CPU ({})", self.device_name)),
            DeviceKind::Meta => ("Meta device out of memory", "The meta device".to_string()),
            DeviceKind::Gpu => {
                ("GPU out of memory", format!("GPU {} ({}, {})", self.device_index, self.device, self.device_name))
            }
            DeviceKind::Cuda => {
                ("CUDA out of memory", format!("GPU {} ({}, {})", self.device_index, self.device, self.device_name))
            }
        };
        write!(f, "{prefix}. Tried to allocate {}. ", format_size(self.segment_bytes))?;
        match (self.total_capacity, self.device_free) {
            (Some(t), Some(free)) => {
                write!(f, "{who} has a total capacity of {} of which {} is free. ", format_size(t), format_size(free))?
            }
            _ if self.device_kind == DeviceKind::Gpu => {
                write!(f, "{who} has a capacity unknown to ferrite and the driver refused the memory. ")?
            }
            _ => write!(f, "{who} has no fixed capacity and the host refused the memory. ")?,
        }
        if let Some(a) = self.allowed_bytes {
            write!(f, "{} allowed; ", format_size(a))?;
        }
        write!(
            f,
            "Of the allocated memory {} is allocated by ferrite, and {} is reserved by ferrite but unallocated.",
            format_size(self.allocated_bytes),
            format_size(self.reserved_unallocated_bytes)
        )?;
        write!(
            f,
            "\nDiagnosis: {} — {} (requested {}, rounded to {}).",
            self.diagnosis,
            self.explanation(),
            format_size(self.requested_bytes),
            format_size(self.rounded_bytes)
        )?;
        if let Some(p) = &self.planned
            && !p.remedies.is_empty()
        {
            write!(f, "\nRanked remedies (ferrite plan, for this model on {}):", p.target)?;
            for (i, r) in p.remedies.iter().enumerate() {
                let effect = if r.raises_bytes > 0 {
                    format!("raises the peak by {}", format_size(r.raises_bytes))
                } else {
                    format!("saves {}", format_size(r.saves_bytes))
                };
                write!(
                    f,
                    "\n  {}. {}: {effect} (peak reserved {}){}",
                    i + 1,
                    r.change,
                    format_size(r.peak_reserved_bytes),
                    if r.fits { ", fits" } else { ", still does not fit" }
                )?;
            }
            return Ok(());
        }
        if let Some(p) = &self.planned {
            write!(
                f,
                "\nferrite plan found no change to try for this model on {} (it already uses its settings); fixed rules follow.",
                p.target
            )?;
        }
        if let Some(reason) = &self.planner_unavailable {
            write!(
                f,
                "\nThe planner cannot model this run ({reason}): the suggestions below are fixed rules, not measured for this model."
            )?;
        }
        if !self.suggestions.is_empty() {
            write!(f, "\nSuggestions, most effective first:")?;
            for (i, s) in self.suggestions.iter().enumerate() {
                write!(f, "\n  {}. {}", i + 1, s.text)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_size_matches_pytorch() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(1 << 20), "1024.00 KiB");
        assert_eq!(format_size(2 << 20), "2.00 MiB");
        assert_eq!(format_size(20 << 20), "20.00 MiB");
        assert_eq!(format_size(1 << 30), "1024.00 MiB");
        assert_eq!(format_size(42_505_273_344), "39.59 GiB");
    }

    fn exhausted() -> OutOfMemoryReport {
        OutOfMemoryReport::diagnose(OomFacts {
            device: "sim:t4-16gb:0".into(),
            device_kind: DeviceKind::Sim,
            device_index: 0,
            device_name: "NVIDIA Tesla T4".into(),
            requested_bytes: 3 << 30,
            rounded_bytes: 3 << 30,
            segment_bytes: 3 << 30,
            total_capacity: Some(16 << 30),
            usable_capacity: Some(15 << 30),
            device_free: Some(1 << 30),
            allowed_bytes: None,
            allocated_bytes: 14 << 30,
            reserved_bytes: 14 << 30,
            largest_free_block: 0,
            max_split_size: None,
            host_refused: false,
            driver_refused: false,
            expandable_segments: false,
        })
    }

    fn remedy(change: &str, saves: u64, fits: bool) -> PlannedRemedy {
        PlannedRemedy {
            change: change.into(),
            saves_bytes: saves,
            raises_bytes: 0,
            peak_reserved_bytes: (17 << 30) - saves,
            fits,
        }
    }

    #[test]
    fn planned_remedies_replace_the_fixed_rules_ranked_by_bytes_saved() {
        let mut r = exhausted();
        assert!(r.to_string().contains("Suggestions, most effective first:"));
        assert!(r.planned_remedies().is_none());
        r.set_planned_remedies(
            "sim:t4-16gb",
            vec![
                remedy("--alloc-conf expandable_segments:True", 2 << 20, false),
                remedy("--amp bf16", 3 << 30, true),
                remedy("--checkpoint-activations", 5 << 30, true),
            ],
        );
        let changes: Vec<&str> = r.planned_remedies().unwrap().iter().map(|p| p.change.as_str()).collect();
        assert_eq!(changes, ["--checkpoint-activations", "--amp bf16", "--alloc-conf expandable_segments:True"]);
        let msg = r.to_string();
        assert!(msg.starts_with("CUDA out of memory. Tried to allocate 3.00 GiB."), "{msg}");
        assert!(msg.contains("Diagnosis: exhausted"), "{msg}");
        assert!(!msg.contains("Suggestions"), "the fixed rules are replaced: {msg}");
        let tail = msg.split("Ranked remedies (ferrite plan, for this model on sim:t4-16gb):").nth(1).unwrap();
        let lines: Vec<&str> = tail.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 3, "{msg}");
        assert_eq!(lines[0], "  1. --checkpoint-activations: saves 5.00 GiB (peak reserved 12.00 GiB), fits");
        assert_eq!(lines[1], "  2. --amp bf16: saves 3.00 GiB (peak reserved 14.00 GiB), fits");
        assert!(
            lines[2].starts_with("  3. --alloc-conf expandable_segments:True: saves 2.00 MiB")
                && lines[2].ends_with("still does not fit")
        );
        // The report keeps its numbers and round-trips with the remedies.
        let back: OutOfMemoryReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn a_remedy_that_raises_the_peak_says_so_and_ranks_last() {
        let mut r = exhausted();
        let worse = PlannedRemedy {
            change: "--amp bf16".into(),
            saves_bytes: 0,
            raises_bytes: 3 << 30,
            peak_reserved_bytes: 20 << 30,
            fits: false,
        };
        let nothing = PlannedRemedy {
            raises_bytes: 0,
            peak_reserved_bytes: 17 << 30,
            change: "--alloc-conf x".into(),
            ..worse.clone()
        };
        r.set_planned_remedies("sim:t4-16gb", vec![worse, nothing, remedy("--checkpoint-activations", 1 << 30, false)]);
        let msg = r.to_string();
        let tail = msg.split("):\n").last().unwrap();
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(
            lines[0], "  1. --checkpoint-activations: saves 1024.00 MiB (peak reserved 16.00 GiB), still does not fit",
            "{msg}"
        );
        assert_eq!(
            lines[1], "  2. --alloc-conf x: saves 0 bytes (peak reserved 17.00 GiB), still does not fit",
            "{msg}"
        );
        assert_eq!(
            lines[2], "  3. --amp bf16: raises the peak by 3.00 GiB (peak reserved 20.00 GiB), still does not fit",
            "{msg}"
        );
    }

    #[test]
    fn without_a_planner_the_fixed_rules_stay_and_the_message_says_why() {
        let mut r = exhausted().with_planned_remedies("sim:t4-16gb", vec![remedy("--amp bf16", 1, true)]);
        r.set_planner_unavailable("cpu has no fixed capacity");
        assert!(r.planned_remedies().is_none());
        let msg = r.to_string();
        assert!(msg.contains("The planner cannot model this run (cpu has no fixed capacity)"), "{msg}");
        assert!(msg.contains("Suggestions, most effective first:\n  1. reduce the batch size"), "{msg}");
        assert_eq!(msg.matches("The planner cannot").count(), 1);
        // An empty plan (nothing left to try) keeps the rules too, and says so.
        let msg = exhausted().with_planned_remedies("sim:t4-16gb", Vec::new()).to_string();
        assert!(msg.contains("found no change to try") && msg.contains("Suggestions"), "{msg}");
    }
}
