//! Every kernel source compiles for the GPUs ferrite targets first (A100: `sm_80`, H100:
//! `sm_90`) with NVRTC, without a GPU or a driver, and without a single warning; each source
//! defines the kernels it lists. Skips loudly without NVRTC, fails under
//! `FERRITE_REQUIRE_SYSTEM_DEPS=1` (CI installs the `nvidia-cuda-nvrtc` wheel).
use ferrite_cuda::{KERNEL_SOURCES, Nvrtc};

const ARCHES: [&str; 2] = ["sm_80", "sm_90"];

#[test]
fn every_kernel_source_compiles_for_sm_80_and_sm_90_without_warnings() {
    let nvrtc = Nvrtc::load();
    if !ferrite_test_support::present_or_skip(
        nvrtc.is_ok(),
        &format!("NVRTC is not installed ({})", nvrtc.as_ref().err().map(|e| e.to_string()).unwrap_or_default()),
        "python3 -m pip install nvidia-cuda-nvrtc",
    ) {
        return;
    }
    let Ok(nvrtc) = nvrtc else { return };
    eprintln!("NVRTC {}.{} from {:?}", nvrtc.version.0, nvrtc.version.1, nvrtc.path);
    let mut failures = Vec::new();
    for source in KERNEL_SOURCES {
        for arch in ARCHES {
            match nvrtc.compile(source, arch) {
                Ok(c) => {
                    assert!(!c.cubin.is_empty(), "{} for {arch}: empty cubin", source.name);
                    for kernel in source.kernels {
                        // ptxas reports every entry function it compiled.
                        assert!(
                            c.log.contains(&format!("'{kernel}'")),
                            "{} for {arch}: kernel {kernel} missing from the compiled entries:\n{}",
                            source.name,
                            c.log
                        );
                    }
                    // "…, 0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads": any
                    // non-zero spill field is a kernel to fix before a GPU pays for it.
                    let spills: Vec<&str> = c
                        .log
                        .lines()
                        .filter(|l| {
                            l.split(',').any(|field| {
                                let field = field.trim();
                                field.contains("bytes spill") && !field.starts_with("0 bytes")
                            })
                        })
                        .collect();
                    assert!(spills.is_empty(), "{} for {arch} spills registers: {spills:?}", source.name);
                    let registers: Vec<&str> = c.log.lines().filter(|l| l.contains("registers")).collect();
                    eprintln!("{} for {arch}: {}", source.name, registers.join(" | "));
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_broken_source_is_a_compile_error_with_nvrtcs_log() {
    let Ok(nvrtc) = Nvrtc::load() else {
        eprintln!("skipped: NVRTC is not installed (the test above says how to install it)");
        return;
    };
    let broken = ferrite_cuda::KernelSource {
        name: "broken.cu",
        code: "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
        kernels: &["k"],
    };
    let e = nvrtc.compile(&broken, "sm_80").unwrap_err().to_string();
    assert!(e.contains("broken.cu") && e.contains("sm_80") && e.contains("undefined_name"), "{e}");
    let warns = ferrite_cuda::KernelSource {
        name: "warns.cu",
        code: "extern \"C\" __global__ void k(float* x) { int unused = 3; x[0] = 1.0f; }",
        kernels: &["k"],
    };
    let e = nvrtc.compile(&warns, "sm_80").unwrap_err().to_string();
    assert!(e.contains("warning"), "a warning fails the compile: {e}");
}
