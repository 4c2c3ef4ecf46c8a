#!/usr/bin/env bash
# The README's test command: the whole suite, every feature, in the profiles that matter.
# `.ci/run` installs what a fresh machine lacks and then runs exactly this script.
set -euo pipefail
cd "$(dirname "$0")/.."

# Mesa's Vulkan device-select layer prints "XDG_RUNTIME_DIR is invalid" on headless machines; it
# only orders adapters, and the GPU tests enumerate every adapter themselves.
export NODEVICE_SELECT=1

# Off-by-default features that CI builds and tests: MPI data parallelism (needs OpenMPI; see
# .ci/run). The feature list is added to the clippy and test runs below.
FEATURES=(--features ferrite-parallel/mpi,ferrite-cli/mpi)

echo "== no circles between files or crates (scripts/check_circles.py)"
python3 scripts/check_circles.py --self-test && python3 scripts/check_circles.py

echo "== cargo fmt --check"
cargo fmt --all --check

echo "== cargo clippy --workspace --all-targets ${FEATURES[*]} -- -D warnings"
cargo clippy --release --workspace --all-targets "${FEATURES[@]}" -- -D warnings

echo "== cargo test --release --workspace ${FEATURES[*]}"
cargo test --release --workspace "${FEATURES[@]}"

# The examples a Rust user starts from (README: "Training from Rust"), run for a few epochs. The
# test run above built them with the workspace's features; run that binary (a `cargo run -p`
# would resolve features for one package and rebuild its dependencies).
echo "== examples: custom_model --epochs 3; image_folder --epochs 2 (and on two simulated GPUs); hf_finetune --epochs 2"
"${CARGO_TARGET_DIR:-target}/release/examples/custom_model" --epochs 3
"${CARGO_TARGET_DIR:-target}/release/examples/image_folder" --epochs 2
"${CARGO_TARGET_DIR:-target}/release/examples/image_folder" --epochs 1 --data-parallel 2
"${CARGO_TARGET_DIR:-target}/release/examples/hf_finetune" --epochs 2 --out "$(mktemp -d)/gpt2-finetuned"

# Crates that parse user files and strings (checkpoints and pickles, allocator settings and traces,
# dataset files, command lines) also run in the debug profile: its larger stack frames are where
# recursion on hostile input shows first, and it is what `cargo test` gives a user.
# ferrite-cli's parsers are its unit tests (addresses, cgroup files, checkpoint metadata), the
# parser fuzz suite and the bad-input suite; its training runs stay in the release run above.
echo "== cargo test (debug) -p ferrite-io -p ferrite-memory -p ferrite-data; ferrite-cli's parser tests and doctor without mpi"
cargo test -p ferrite-io -p ferrite-memory -p ferrite-data
# doctor_mpi runs here too: this build has no `mpi` feature, so `ferrite doctor`'s MPI line is
# checked in both flavours (the release run above has the feature).
cargo test -p ferrite-cli --lib --test parser_fuzz --test bad_inputs --test doctor_mpi

# GPU support is a cargo feature (`gpu`) of the library crates, off by default: a CPU-only user of
# ferrite-tensor compiles neither wgpu nor naga. The build below reuses part of the debug artifacts
# of the run above (some dependencies differ in features; about two minutes on the 2-core CI
# machine); the tree check fails if a default dependency ever pulls wgpu back in.
echo "== CPU-only library: cargo build -p ferrite-tensor --no-default-features, and no wgpu in its tree"
cargo build -p ferrite-tensor --no-default-features
if cargo tree -p ferrite-tensor --no-default-features -e normal --prefix none | grep -q '^wgpu '; then
    echo "ferrite-tensor without the gpu feature depends on wgpu" >&2
    exit 1
fi
