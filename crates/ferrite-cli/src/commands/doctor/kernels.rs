//! `ferrite doctor --compile-kernels`: every CUDA kernel source of this binary compiled by NVRTC
//! for the GPUs at hand (each CUDA device's architecture; `sm_80` and `sm_90` without one), one
//! line per source and architecture with its kernels, registers and spills.
//!
//! Why in the binary: a GPU machine often has no Rust toolchain, and the kernels travel inside the
//! `ferrite` executable. This is the same compile the test suite runs (`ferrite-cuda`'s
//! `nvrtc_compile` test), asked of the NVRTC and the architecture of the machine where the binary
//! runs, so `scripts/gpu_check.sh` and a user can check it there.

use ferrite_cuda::{Compiled, KERNEL_SOURCES, KernelSource, Nvrtc};

use super::check::Check;

const SECTION: &str = "cuda kernels";

/// The architectures to compile for: each CUDA device's (deduplicated), else A100's and H100's.
pub fn arches(devices: &[ferrite_memory::cuda::CudaDeviceInfo]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in devices {
        if !out.contains(&d.arch()) {
            out.push(d.arch());
        }
    }
    if out.is_empty() {
        out = vec!["sm_80".into(), "sm_90".into()];
    }
    out
}

/// Compile every kernel source for every architecture in `arches`.
pub fn checks(arches: &[String]) -> Vec<Check> {
    let nvrtc = match Nvrtc::load() {
        Ok(n) => n,
        Err(e) => {
            return vec![Check::error(
                SECTION,
                "nvrtc",
                e.to_string(),
                "install NVRTC (`python3 -m pip install nvidia-cuda-nvrtc`) or set FERRITE_NVRTC to libnvrtc.so",
            )];
        }
    };
    let mut out = Vec::new();
    for arch in arches {
        for source in KERNEL_SOURCES {
            out.push(check_one(source, arch, nvrtc.compile(source, arch)));
        }
    }
    out
}

/// The line for one compile.
fn check_one(source: &KernelSource, arch: &str, compiled: Result<Compiled, ferrite_cuda::CudaError>) -> Check {
    let name = format!("{} {arch}", source.name);
    let c = match compiled {
        Ok(c) => c,
        Err(e) => {
            return Check::error(
                SECTION,
                name,
                e.to_string(),
                "a kernel source that does not compile is a ferrite bug: report it with this output",
            );
        }
    };
    let missing: Vec<&str> = source.kernels.iter().copied().filter(|k| !c.log.contains(&format!("'{k}'"))).collect();
    let registers = c
        .log
        .lines()
        .filter_map(|l| l.split("Used ").nth(1)?.split(' ').next()?.parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    let spills: Vec<&str> = c
        .log
        .lines()
        .filter(|l| {
            l.split(',').any(|f| {
                let f = f.trim();
                f.contains("bytes spill") && !f.starts_with("0 bytes")
            })
        })
        .collect();
    let found = format!(
        "{} kernel(s), {} bytes of cubin, at most {registers} registers per thread, {} spill(s)",
        source.kernels.len(),
        c.cubin.len(),
        spills.len()
    );
    if !missing.is_empty() {
        return Check::error(
            SECTION,
            name,
            format!("{found}; missing from the compiled entries: {}", missing.join(", ")),
            "report it: the source no longer defines a kernel the backend looks up",
        );
    }
    if !spills.is_empty() {
        return Check::warning(
            SECTION,
            name,
            found,
            format!("registers spill to local memory: {}", spills.join(" | ")),
        );
    }
    Check::ok(SECTION, name, found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::doctor::check::Verdict;

    #[test]
    fn without_a_device_the_a100_and_h100_architectures_are_compiled() {
        assert_eq!(arches(&[]), ["sm_80", "sm_90"]);
    }

    #[test]
    fn a_compile_is_judged_by_its_entries_registers_and_spills() {
        let source = KernelSource { name: "t.cu", code: "", kernels: &["a", "b"] };
        let log = "ptxas info    : Compiling entry function 'a' for 'sm_90'\nptxas info    : Used 12 registers, 380 bytes cmem[0]\nptxas info    : Compiling entry function 'b' for 'sm_90'\nptxas info    : Used 40 registers, 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads";
        let ok = check_one(&source, "sm_90", Ok(Compiled { cubin: vec![0; 10], log: log.into() }));
        assert_eq!(ok.verdict, Verdict::Ok, "{ok:?}");
        assert!(ok.found.contains("at most 40 registers") && ok.found.contains("0 spill(s)"), "{ok:?}");
        let spilled = format!("{log}\nptxas info    : 8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads");
        assert_eq!(
            check_one(&source, "sm_90", Ok(Compiled { cubin: vec![1], log: spilled })).verdict,
            Verdict::Warning
        );
        let only_a = "ptxas info    : Compiling entry function 'a' for 'sm_90'";
        let e = check_one(&source, "sm_90", Ok(Compiled { cubin: vec![1], log: only_a.into() }));
        assert!(e.verdict == Verdict::Error && e.found.contains("missing from the compiled entries: b"), "{e:?}");
    }
}
