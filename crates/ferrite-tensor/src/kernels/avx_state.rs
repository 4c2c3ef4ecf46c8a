//! Cleaning up after the GEMM microkernels' AVX/AVX-512 registers.
//!
//! faer's x86 microkernels (`private-gemm-x86`) return without `vzeroupper`, so the threads that
//! ran them keep a "dirty" upper vector state. The rest of ferrite is compiled for baseline
//! x86-64 (legacy SSE encoding, including libm's callers), and on Intel cores every SSE
//! instruction executed in that state pays a transition/false-dependency penalty: measured on
//! the 2-core Xeon, a softmax over 2 M elements took 550–600 ms right after a matmul instead of
//! 15–18 ms, and a transformer block's GELU backward and softmax dominated its training step.
//! `vzeroupper` after the product (on the calling thread and on every rayon worker, which is
//! where faer's parallel kernels run) restores the clean state; it is what compilers emit at the
//! end of AVX functions.

/// Zero the upper halves of the vector registers on this thread, if the CPU has AVX.
#[inline]
pub(crate) fn clear_upper_state_here() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is available (checked above). `vzeroupper` only zeroes bits above 127 of
        // the vector registers; code compiled for baseline x86-64 never keeps values there, and
        // the x86-64 ABI treats them as clobbered across calls, so nothing live is lost.
        unsafe { std::arch::x86_64::_mm256_zeroupper() };
    }
}

/// [`clear_upper_state_here`] on the calling thread and on every thread of the rayon pool
/// (after a product that ran in parallel).
pub(crate) fn clear_upper_state_everywhere() {
    clear_upper_state_here();
    rayon::broadcast(|_| clear_upper_state_here());
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use crate::{DType, Device, Tensor};

    /// XINUSE bit 2: the upper halves of the YMM registers are not in their initial state.
    /// `None` when the CPU cannot report it (XGETBV with ECX = 1).
    fn upper_state_dirty() -> Option<bool> {
        if !std::arch::is_x86_feature_detected!("xsave") || !std::arch::is_x86_feature_detected!("avx") {
            return None;
        }
        // SAFETY: CPUID is available on every x86-64 CPU. (Newer compilers treat the intrinsic
        // as safe; older ones require the block.)
        #[allow(unused_unsafe)]
        let leaf = unsafe { std::arch::x86_64::__cpuid_count(0xD, 1) };
        if leaf.eax & (1 << 2) == 0 {
            return None;
        }
        #[target_feature(enable = "xsave")]
        unsafe fn xinuse() -> u64 {
            // SAFETY: the caller checked that XSAVE is enabled and XGETBV with ECX = 1 is supported.
            unsafe { std::arch::x86_64::_xgetbv(1) }
        }
        // SAFETY: both conditions were checked above.
        Some(unsafe { xinuse() } & (1 << 2) != 0)
    }

    #[test]
    fn a_parallel_matmul_leaves_every_thread_with_a_clean_upper_state() {
        if upper_state_dirty().is_none() {
            eprintln!("SKIPPED: this CPU cannot report the AVX register state (XGETBV ECX=1)");
            return;
        }
        let d = Device::Cpu;
        let a = Tensor::ones(&[256, 256], DType::F32, &d).unwrap();
        let _ = a.matmul(&a).unwrap();
        let dirty: Vec<Option<bool>> = rayon::broadcast(|_| upper_state_dirty());
        assert!(dirty.iter().all(|d| *d == Some(false)), "worker threads left dirty: {dirty:?}");
        assert_eq!(upper_state_dirty(), Some(false), "calling thread left dirty");
        // Sequential (small) products run on the calling thread.
        let s = Tensor::ones(&[8, 8], DType::F32, &d).unwrap();
        let _ = s.matmul(&s).unwrap();
        assert_eq!(upper_state_dirty(), Some(false));
    }
}
