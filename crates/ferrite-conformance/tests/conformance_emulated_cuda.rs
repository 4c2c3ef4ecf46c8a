//! The conformance check on `cuda:0` without a GPU: with `FERRITE_CUDA_EMULATOR=1`, `cuda:0` is
//! the emulated device (the CUDA C kernels compiled by g++ and run on CPU threads through the same
//! backend, launches and GEMM arguments a GPU gets), and every PyTorch reference case must pass
//! there — the fused optimizer steps, pointwise losses and recurrent cells included: a wrong
//! number, a panic or any error fails this test.
//!
//! The variable is read once per process, so the test re-runs its own binary as a child with it
//! set. Without a C++ compiler it prints a loud SKIPPED line (a failure under
//! `FERRITE_REQUIRE_SYSTEM_DEPS=1`).

use ferrite_conformance::{Outcome, check_device};
use ferrite_tensor::Device;

const NAME: &str = "every_case_passes_on_the_emulated_cuda_device";

#[test]
fn every_case_passes_on_the_emulated_cuda_device() {
    let Some(dir) = ferrite_test_support::reference_or_skip("ops/manifest.json") else { return };
    if !ferrite_memory::cuda::emulator_enabled() {
        if !ferrite_test_support::present_or_skip(
            ferrite_cuda::HostModule::compiler_available(),
            "no C++20 compiler (`$CXX`, default g++) to run the CUDA kernels of the emulated cuda:0",
            "apt-get install g++ (or set CXX)",
        ) {
            return;
        }
        let stdout = ferrite_test_support::run_in_child(NAME, &[("FERRITE_CUDA_EMULATOR", "1")]);
        assert!(stdout.contains("EMULATED-CUDA-CHECK done"), "the child did not run the check:\n{stdout}");
        return;
    }
    let report = check_device(&Device::Cuda { index: 0 }, &dir).unwrap();
    print!("{}", report.text());
    let passed = report.cases.iter().filter(|c| matches!(c.outcome, Outcome::Passed { .. })).count();
    let wrong: Vec<String> =
        report.failed().map(|c| format!("{} {}: {:?}", c.suite.name(), c.name, c.outcome)).collect();
    assert!(wrong.is_empty(), "{} cases failed on the emulated cuda:0:\n  {}", wrong.len(), wrong.join("\n  "));
    // Every case ran and passed.
    assert_eq!(passed, report.cases.len(), "only {passed} of {} cases passed", report.cases.len());
    println!("EMULATED-CUDA-CHECK done: {passed} of {} passed", report.cases.len());
}
