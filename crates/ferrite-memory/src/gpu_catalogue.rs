/// A GPU model whose memory a `sim` device reproduces.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuProfile {
    /// Short name used in device strings, e.g. `a100-40gb`.
    pub key: String,
    /// Marketing name, e.g. `NVIDIA A100-SXM4-40GB`.
    pub name: String,
    /// Total device memory in bytes as reported by `cudaMemGetInfo`'s `total`.
    pub total_bytes: u64,
    /// Bytes taken by the CUDA context and runtime before the first tensor.
    pub context_overhead_bytes: u64,
}

/// (key, name, total bytes, context overhead bytes)
pub static GPU_CATALOGUE: &[(&str, &str, u64, u64)] = &[
    ("t4-16gb", "NVIDIA Tesla T4", 15_843_721_216, 300 * 1024 * 1024),
    ("rtx4090-24gb", "NVIDIA GeForce RTX 4090", 25_393_692_672, 400 * 1024 * 1024),
    ("a100-40gb", "NVIDIA A100-SXM4-40GB", 42_505_273_344, 500 * 1024 * 1024),
    ("a100-80gb", "NVIDIA A100-SXM4-80GB", 85_089_730_560, 500 * 1024 * 1024),
    ("h100-80gb", "NVIDIA H100 80GB HBM3", 85_028_388_864, 500 * 1024 * 1024),
];

impl GpuProfile {
    /// Look a profile up by key (case-insensitive).
    pub fn lookup(key: &str) -> Option<GpuProfile> {
        GPU_CATALOGUE
            .iter()
            .find(|(k, ..)| k.eq_ignore_ascii_case(key))
            .map(|&(k, n, t, o)| GpuProfile {
                key: k.to_string(),
                name: n.to_string(),
                total_bytes: t,
                context_overhead_bytes: o,
            })
    }

    /// Bytes available to the allocator.
    pub fn usable_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.context_overhead_bytes)
    }
}
