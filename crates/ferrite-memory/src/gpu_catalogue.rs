//! Real GPU models whose memory a `sim` device reproduces.
//!
//! A `sim:a100-40gb` device must run out of memory exactly where the real card would, so each
//! entry carries the card's `totalGlobalMem` (what `cudaGetDeviceProperties` / PyTorch's
//! `total_memory` report, not the marketing figure) and the memory a CUDA context takes before the
//! first tensor.
//!
//! Sources for `totalGlobalMem`: CUDA `deviceQuery` output ("Total amount of global memory")
//! for T4 (15843721216), A100-SXM4-40GB (42505273344) and RTX 4090 (25756696576, Linux driver);
//! `torch.cuda.get_device_properties` / NVML listings for A100-SXM4-80GB (85198045184 = 81251 MiB),
//! H100 80GB HBM3 (85520809984 = 81559 MiB), RTX 3090 (25446842368 = 24268 MiB) and
//! V100-SXM2-32GB (34089205760 = 32510 MiB).
//!
//! Context overhead: what `nvidia-smi` shows for a process minus `torch.cuda.memory_reserved()`
//! right after the first tiny CUDA tensor (CUDA 12 with lazy module loading, cuBLAS handle
//! created). Published measurements range from about 250 MiB to 600 MiB depending on driver,
//! CUDA version and architecture; we take 300 MiB for Volta/Turing, 400 MiB for Ampere/Ada and
//! 500 MiB for Hopper (larger kernel images). It is an estimate, documented as such: use a bare
//! capacity (`sim:39GiB`) to model a different figure.
//!
//! MIG slices (`a100-40gb-mig-3g.20gb`): a Multi-Instance GPU instance is a device of its own
//! with a fixed share of the card's memory, which is what a job placed on it can use. The
//! memory of each GPU-instance profile is the `Memory` column of `nvidia-smi mig -lgip`
//! (A100-SXM4-40GB: 4.75 / 9.75 / 19.62 / 19.62 / 39.50 GiB for 1g.5gb / 2g.10gb / 3g.20gb /
//! 4g.20gb / 7g.40gb; H100 80GB HBM3: 9.75 / 19.62 / 19.62 / 39.50 / 39.50 / 79.25 GiB for
//! 1g.10gb / 1g.20gb / 2g.20gb / 3g.40gb / 4g.40gb / 7g.80gb), taken as whole MiB (19.62 GiB =
//! 20096 MiB). Each instance runs its own CUDA context, so it keeps its card's context overhead.

/// A GPU model whose memory a `sim` device reproduces.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct GpuProfile {
    /// Short name used in device strings, e.g. `a100-40gb`.
    pub key: String,
    /// Marketing name, e.g. `NVIDIA A100-SXM4-40GB`.
    pub name: String,
    /// Total device memory in bytes (`totalGlobalMem`).
    pub total_bytes: u64,
    /// Bytes taken by the CUDA context and runtime before the first tensor.
    pub context_overhead_bytes: u64,
}

const MIB: u64 = 1 << 20;

/// The catalogue: (key, name, total bytes = `totalGlobalMem`, context overhead bytes).
pub static GPU_CATALOGUE: &[(&str, &str, u64, u64)] = &[
    ("t4-16gb", "NVIDIA Tesla T4", 15_843_721_216, 300 * MIB),
    ("v100-32gb", "Tesla V100-SXM2-32GB", 34_089_205_760, 300 * MIB),
    ("rtx3090-24gb", "NVIDIA GeForce RTX 3090", 25_446_842_368, 400 * MIB),
    ("rtx4090-24gb", "NVIDIA GeForce RTX 4090", 25_756_696_576, 400 * MIB),
    ("a100-40gb", "NVIDIA A100-SXM4-40GB", 42_505_273_344, 400 * MIB),
    ("a100-80gb", "NVIDIA A100-SXM4-80GB", 85_198_045_184, 400 * MIB),
    ("h100-80gb", "NVIDIA H100 80GB HBM3", 85_520_809_984, 500 * MIB),
    ("a100-40gb-mig-1g.5gb", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864 * MIB, 400 * MIB),
    ("a100-40gb-mig-2g.10gb", "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 9984 * MIB, 400 * MIB),
    ("a100-40gb-mig-3g.20gb", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20096 * MIB, 400 * MIB),
    ("a100-40gb-mig-4g.20gb", "NVIDIA A100-SXM4-40GB MIG 4g.20gb", 20096 * MIB, 400 * MIB),
    ("a100-40gb-mig-7g.40gb", "NVIDIA A100-SXM4-40GB MIG 7g.40gb", 40448 * MIB, 400 * MIB),
    ("h100-80gb-mig-1g.10gb", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984 * MIB, 500 * MIB),
    ("h100-80gb-mig-1g.20gb", "NVIDIA H100 80GB HBM3 MIG 1g.20gb", 20096 * MIB, 500 * MIB),
    ("h100-80gb-mig-2g.20gb", "NVIDIA H100 80GB HBM3 MIG 2g.20gb", 20096 * MIB, 500 * MIB),
    ("h100-80gb-mig-3g.40gb", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40448 * MIB, 500 * MIB),
    ("h100-80gb-mig-4g.40gb", "NVIDIA H100 80GB HBM3 MIG 4g.40gb", 40448 * MIB, 500 * MIB),
    ("h100-80gb-mig-7g.80gb", "NVIDIA H100 80GB HBM3 MIG 7g.80gb", 81152 * MIB, 500 * MIB),
];

impl GpuProfile {
    /// Look a profile up by key (case-insensitive).
    pub fn lookup(key: &str) -> Option<GpuProfile> {
        GPU_CATALOGUE.iter().find(|(k, ..)| k.eq_ignore_ascii_case(key)).map(|&(k, n, t, o)| GpuProfile {
            key: k.to_string(),
            name: n.to_string(),
            total_bytes: t,
            context_overhead_bytes: o,
        })
    }

    /// Every catalogue entry as a profile.
    pub fn catalogue() -> Vec<GpuProfile> {
        GPU_CATALOGUE.iter().filter_map(|(k, ..)| GpuProfile::lookup(k)).collect()
    }

    /// A bare-capacity device (`sim:1GiB`): no context overhead.
    pub fn custom(total_bytes: u64) -> GpuProfile {
        let key = crate::capacity::format_capacity(total_bytes);
        GpuProfile { name: format!("{key} device"), key, total_bytes, context_overhead_bytes: 0 }
    }

    /// Bytes available to the allocator.
    pub fn usable_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.context_overhead_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_has_the_required_cards() {
        for k in ["t4-16gb", "rtx4090-24gb", "a100-40gb", "a100-80gb", "h100-80gb"] {
            let p = GpuProfile::lookup(k).unwrap();
            assert!(p.usable_bytes() < p.total_bytes);
        }
        assert_eq!(GpuProfile::lookup("A100-40GB").unwrap().total_bytes, 42_505_273_344);
        assert!(GpuProfile::lookup("nope").is_none());
    }

    #[test]
    fn mig_slices_are_smaller_than_their_card() {
        let card = GpuProfile::lookup("a100-40gb").unwrap();
        let slice = GpuProfile::lookup("a100-40gb-mig-3g.20gb").unwrap();
        assert_eq!(slice.total_bytes, 20096 * MIB);
        assert!(slice.total_bytes < card.total_bytes);
        for (k, _, total, _) in GPU_CATALOGUE.iter().filter(|e| e.0.contains("-mig-")) {
            let parent = GpuProfile::lookup(k.split("-mig-").next().unwrap()).unwrap();
            assert!(*total <= parent.total_bytes, "{k}");
        }
    }
}
