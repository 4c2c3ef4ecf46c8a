//! What the test suites of several ferrite crates share, so that each rule lives in one place:
//! where the PyTorch reference fixtures are, what a test does when the machine lacks
//! something it needs (the fixtures, a GPU adapter, a Debian data package, a Python module),
//! which devices a suite runs on and the loop that runs it on each ([`devices`]), how fixture
//! files are read ([`fixtures`]) and results compared ([`close`], [`params`]), the small models
//! several suites train ([`models`]), how the parsers of user text are fuzzed ([`text_fuzz`]), and
//! the CPU-time clocks of measurements on a shared machine ([`timing`]), and the `mpirun` that
//! multi-process tests launch ([`mpirun`]).
//!
//! Features keep the lower crates' test builds small: without features this crate needs only
//! ferrite-memory; `tensor` adds the fixture reader and the tensor checks, `nn` the models.
//!
//! The rule: without the dependency a test prints a loud `SKIPPED` line naming what is missing and
//! how to get it, and returns early; with `FERRITE_REQUIRE_SYSTEM_DEPS=1` (CI sets it, after
//! `.ci/run` installed everything) a missing dependency fails the test instead, so CI never passes
//! by skipping. This crate is a dev-dependency only; nothing in it ships with ferrite.

pub mod child;
pub mod close;
pub mod devices;
#[cfg(feature = "tensor")]
pub mod fixtures;
#[cfg(feature = "nn")]
pub mod models;
pub mod mpirun;
#[cfg(feature = "tensor")]
pub mod params;
pub mod text_fuzz;
pub mod timing;

pub use child::run_in_child;
pub use close::{assert_all_close, assert_slices_close};
#[cfg(feature = "tensor")]
pub use close::{assert_close, check_close};
pub use devices::{TEST_DEVICES_ENV, devices_under_test, for_each_device, for_each_device_where};
pub use mpirun::mpirun_command;

use std::path::PathBuf;

use ferrite_memory::Device;

/// Environment variable naming the PyTorch reference fixture folder (its layout is described in
/// that folder's README); tests read every expected value from it.
pub const REFERENCE_ENV: &str = "FERRITE_PYTORCH_REFERENCE";

/// Environment variable that turns a missing system dependency from a skip into a failure.
pub const REQUIRE_SYSTEM_DEPS_ENV: &str = "FERRITE_REQUIRE_SYSTEM_DEPS";

/// The fixture folder: `$FERRITE_PYTORCH_REFERENCE`, else `shared/fixtures/pytorch-reference`
/// beside the repository checkout. (It may not exist; see [`reference_or_skip`].)
pub fn reference_dir() -> PathBuf {
    match std::env::var_os(REFERENCE_ENV) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/pytorch-reference"),
    }
}

/// Whether missing system dependencies fail tests (`FERRITE_REQUIRE_SYSTEM_DEPS=1`).
pub fn system_deps_required() -> bool {
    std::env::var(REQUIRE_SYSTEM_DEPS_ENV).as_deref() == Ok("1")
}

/// `true` when `present`; otherwise prints `SKIPPED: {missing}; {remedy}` and returns `false` (the
/// test returns early), or panics with the same words under `FERRITE_REQUIRE_SYSTEM_DEPS=1`.
pub fn present_or_skip(present: bool, missing: &str, remedy: &str) -> bool {
    if present {
        return true;
    }
    assert!(!system_deps_required(), "{missing} but {REQUIRE_SYSTEM_DEPS_ENV}=1; {remedy}");
    eprintln!("SKIPPED: {missing}; {remedy}");
    false
}

/// The fixture folder if `marker` (a path inside it, e.g. `ops/manifest.json`) exists; otherwise
/// `None` after [`present_or_skip`]'s message.
pub fn reference_or_skip(marker: &str) -> Option<PathBuf> {
    let dir = reference_dir();
    let present = dir.join(marker).exists();
    let missing = format!("PyTorch reference fixtures not found at {} (no {marker})", dir.display());
    present_or_skip(present, &missing, &format!("set {REFERENCE_ENV} to the fixture folder")).then_some(dir)
}

/// A file of the fixtures' `pytorch/` folder (files saved by PyTorch, with `expected.json`), or
/// `None` after [`present_or_skip`]'s message when the folder is missing.
pub fn pytorch_file_or_skip(name: &str) -> Option<PathBuf> {
    reference_or_skip("pytorch").map(|d| d.join("pytorch").join(name))
}

/// The tiny Hugging Face folders made with transformers (`ferrite-models/tests/data/hf`, by its
/// `make_hf_fixtures.py`), or the twin set `FERRITE_HF_FIXTURES` names.
pub fn hf_fixtures() -> PathBuf {
    fixture_set("FERRITE_HF_FIXTURES", "hf")
}

/// The PEFT adapters made with peft (`ferrite-models/tests/data/lora`), or the twin set
/// `FERRITE_LORA_FIXTURES` names.
pub fn lora_fixtures() -> PathBuf {
    fixture_set("FERRITE_LORA_FIXTURES", "lora")
}

fn fixture_set(var: &str, dir: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ferrite-models/tests/data").join(dir),
    }
}

/// The interpreter that checks ferrite's files with the Python libraries themselves
/// (transformers, PEFT): `FERRITE_PYTHON`, when it imports every module of `modules`
/// (`"torch, transformers, peft"`). CI installs no torch (hundreds of MB), so without
/// `FERRITE_PYTHON` the check prints `SKIPPED` and returns `None` even under
/// `FERRITE_REQUIRE_SYSTEM_DEPS=1`; naming an interpreter that lacks a module fails the test.
pub fn python_or_skip(modules: &str) -> Option<String> {
    let Some(python) = std::env::var_os("FERRITE_PYTHON") else {
        eprintln!(
            "SKIPPED: no FERRITE_PYTHON; set it to an interpreter with {modules} to check ferrite's files with those libraries"
        );
        return None;
    };
    let python = python.to_string_lossy().into_owned();
    let ok = std::process::Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "FERRITE_PYTHON={python} cannot import {modules}: pip install them into it, or unset FERRITE_PYTHON");
    Some(python)
}

/// What to install for a GPU adapter on Debian (Mesa's software Vulkan is enough).
const GPU_REMEDY: &str = "install mesa-vulkan-drivers and libvulkan1 (bash .ci/run does)";

/// `true` when this build has GPU support (ferrite-memory's `gpu` feature); otherwise prints a
/// `SKIPPED` line saying how to build with it and returns `false`. A build without the feature is
/// a choice, not a missing system dependency, so this skips also under
/// `FERRITE_REQUIRE_SYSTEM_DEPS=1` (CI's debug run of the lower crates builds without it); CI's
/// workspace run has it through the `ferrite` binary's default features, which
/// `tests::ci_runs_gpu_tests_with_gpu_support` checks.
pub fn gpu_compiled_or_skip() -> bool {
    if !ferrite_memory::gpu::COMPILED {
        eprintln!(
            "SKIPPED: this build has no GPU support (the `gpu` cargo feature is off); test with `--features gpu` or in the workspace (`cargo test --workspace`)"
        );
    }
    ferrite_memory::gpu::COMPILED
}

/// The GPUs among the devices under test (`FERRITE_TEST_DEVICES`, else every adapter of this
/// machine); empty after [`present_or_skip`]'s message when there is none, or after
/// [`gpu_compiled_or_skip`]'s when this build has no GPU support.
pub fn gpus_or_skip() -> Vec<Device> {
    if !gpu_compiled_or_skip() {
        return Vec::new();
    }
    let gpus: Vec<Device> = devices::devices().into_iter().filter(|d| matches!(d, Device::Gpu { .. })).collect();
    present_or_skip(!gpus.is_empty(), "no GPU adapter", GPU_REMEDY);
    gpus
}

/// Whether this machine has a GPU adapter at all (for tests that drive `gpu:0` themselves);
/// `false` after [`present_or_skip`]'s or [`gpu_compiled_or_skip`]'s message.
pub fn gpu_adapter_or_skip() -> bool {
    gpu_compiled_or_skip()
        && present_or_skip(!ferrite_memory::gpu::list_adapters().is_empty(), "no GPU adapter", GPU_REMEDY)
}

/// Whether the devices under test ask for a CUDA device (`FERRITE_TEST_DEVICES=cuda:0`): only
/// then is a missing NVIDIA driver a missing system dependency (CI has no NVIDIA GPU).
pub fn cuda_requested() -> bool {
    std::env::var(devices::TEST_DEVICES_ENV).is_ok_and(|l| l.split(',').any(|d| d.trim().starts_with("cuda")))
}

/// `true` when `cuda:0` is usable here (the NVIDIA driver loads and shows a GPU); otherwise a
/// `SKIPPED` line with the typed error that says why, which fails the test instead under
/// `FERRITE_REQUIRE_SYSTEM_DEPS=1` only when [`cuda_requested`].
pub fn cuda_or_skip() -> bool {
    let Err(e) = ferrite_memory::cuda::cuda_ordinal(0) else { return true };
    let remedy = "install the NVIDIA driver on a machine with an NVIDIA GPU (`nvidia-smi` must work)";
    if cuda_requested() {
        return present_or_skip(false, &format!("no usable CUDA device ({e})"), remedy);
    }
    eprintln!("SKIPPED: no usable CUDA device ({e}); {remedy}");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CI (`FERRITE_REQUIRE_SYSTEM_DEPS=1`) runs this crate's tests only in the workspace run,
    /// where feature unification through ferrite-cli's default features compiles GPU support:
    /// if that ever stops, the GPU tests would skip, and this test fails instead.
    #[test]
    fn ci_runs_gpu_tests_with_gpu_support() {
        // An `if` rather than `assert!`: the condition is a constant of this build.
        if system_deps_required() && !ferrite_memory::gpu::COMPILED {
            panic!(
                "{REQUIRE_SYSTEM_DEPS_ENV}=1 but ferrite-memory was built without the `gpu` feature: the GPU tests of this run would skip"
            );
        }
    }

    #[test]
    fn a_present_dependency_runs_the_test() {
        assert!(present_or_skip(true, "nothing", "nothing to do"));
    }

    #[test]
    fn a_missing_dependency_skips_or_fails_as_the_environment_says() {
        let outcome = std::panic::catch_unwind(|| present_or_skip(false, "a test fixture", "make one"));
        match outcome {
            Ok(ran) => assert!(!ran && !system_deps_required()),
            Err(_) => assert!(system_deps_required()),
        }
    }
}
