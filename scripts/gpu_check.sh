#!/usr/bin/env bash
# The GPU check of issue 31 (§4): on a machine with an NVIDIA GPU and PyTorch with CUDA — and no
# Rust toolchain, no network — run what ferrite can run there from its prebuilt binary, next to
# PyTorch's CUDA numbers, and write everything to ONE report file.
#
# What travels to the GPU machine (build on a machine with Rust: `cargo build --release -p ferrite-cli`):
#   ferrite                         the binary (target/release/ferrite)
#   scripts/gpu_check.sh            this script
#   bench/gpu_vs_pytorch_cuda.py    PyTorch's CUDA reference numbers (needs torch with CUDA and,
#                                   for the GPT-2 step, transformers)
#   bench/compare_cuda_bench.py     issue 31's targets from ferrite's and PyTorch's benchmark JSON
#   fixtures/                       shared/fixtures/pytorch-reference (580 KiB): the reference cases
#                                   `ferrite doctor --check-device` runs on cpu, gpu:0 and cuda:0
#   tests/                          optional: prebuilt test executables to run on gpu:0 (e.g. from
#                                   `cargo test --release --workspace --no-run`, ferrite-tensor's
#                                   gpu_backend-*), each run with FERRITE_TEST_DEVICES=gpu:0
#
# Usage: scripts/gpu_check.sh [REPORT]            (default report: gpu_check_report.txt)
# Settings (environment): FERRITE (the binary; default ./ferrite, then target/release/ferrite, then
# `ferrite` on PATH), PYTHON (default python3), FIXTURES (default fixtures/ or
# shared/fixtures/pytorch-reference), TEST_BINS (default tests/ if it holds executables),
# STEP_TIMEOUT (seconds per step, default 150), BENCH_TIMEOUT (seconds for each side's benchmark,
# default 240), OUT (folder for the benchmark JSON files, default: beside the report).
#
# The benchmarks (`ferrite doctor --bench cuda:0 --json`, then bench/gpu_vs_pytorch_cuda.py --json)
# end in a comparison table of issue 31's targets — matmul f32 4096 and bf16 8192 >= 0.9x PyTorch's
# TFLOP/s, the GPT-2-small step <= 1.3x PyTorch eager's time, allocate+free <= PyTorch's ns, the
# predicted peak reserved within 2 % of the measured one — each MET or MISSED. A missed target is
# a benchmark result recorded in the report, not a failed step.
#
# Every step runs whatever the previous ones did; its command, exit status, time and output go to
# the report, and a summary table ends it. The script's own exit status is 0 when every step that
# is expected to work did. Steps that cannot fully work yet are marked `expected` in the summary
# (recorded, not judged); today there are none: the CUDA backend runs every op, fused optimizer
# steps, pointwise losses and recurrent cells included, so the conformance check and training on
# cuda:0 must pass.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
REPORT="${1:-gpu_check_report.txt}"
PYTHON="${PYTHON:-python3}"
STEP_TIMEOUT="${STEP_TIMEOUT:-150}"
export NODEVICE_SELECT=1

find_ferrite() {
    for f in "${FERRITE:-}" ./ferrite "$ROOT/ferrite" "${CARGO_TARGET_DIR:-$ROOT/target}/release/ferrite"; do
        [ -n "$f" ] && [ -x "$f" ] && { echo "$f"; return; }
    done
    command -v ferrite || true
}
FERRITE="$(find_ferrite)"
FIXTURES="${FIXTURES:-}"
for d in "$ROOT/fixtures" "$ROOT/../shared/fixtures/pytorch-reference" "$ROOT/shared/fixtures/pytorch-reference"; do
    [ -z "$FIXTURES" ] && [ -d "$d" ] && FIXTURES="$(cd "$d" && pwd)"
done
TEST_BINS="${TEST_BINS:-$ROOT/tests}"
BENCH="$ROOT/bench/gpu_vs_pytorch_cuda.py"
COMPARE="$ROOT/bench/compare_cuda_bench.py"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-240}"
OUT="${OUT:-$(dirname "$REPORT")}"
FERRITE_JSON="$OUT/ferrite_bench_cuda0.json"
PYTORCH_JSON="$OUT/pytorch_bench_cuda0.json"

: >"$REPORT"
SUMMARY=()
FAILED=0
START=$(date +%s)

log() { printf '%s\n' "$*" >>"$REPORT"; }

# step NAME EXPECTATION COMMAND...: EXPECTATION is `ok` (must exit 0) or `expected` (recorded, not
# judged: a step that cannot work yet).
step() {
    local name="$1" expectation="$2"
    shift 2
    log ""
    log "=== $name"
    log "\$ $*"
    local t0 t1 rc
    t0=$(date +%s)
    if [ -n "${STEP_JSON:-}" ]; then
        # stdout is one JSON object: into its file (and the report), stderr into the report.
        timeout "${STEP_LIMIT:-$STEP_TIMEOUT}" "$@" >"$STEP_JSON" 2>>"$REPORT"
        rc=$?
        cat "$STEP_JSON" >>"$REPORT"
    else
        timeout "${STEP_LIMIT:-$STEP_TIMEOUT}" "$@" >>"$REPORT" 2>&1
        rc=$?
    fi
    t1=$(date +%s)
    log "--- exit $rc after $((t1 - t0)) s"
    local verdict
    if [ "$rc" -eq 0 ]; then
        verdict=ok
    elif [ "$expectation" = expected ]; then
        verdict="expected (exit $rc)"
    else
        verdict="FAILED (exit $rc)"
        FAILED=$((FAILED + 1))
    fi
    [ "$rc" -eq 124 ] && verdict="$verdict, timed out after ${STEP_LIMIT:-$STEP_TIMEOUT} s"
    SUMMARY+=("$(printf '%-44s %s' "$name" "$verdict")")
    echo "$name: $verdict"
}

log "ferrite GPU check — $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
log "host: $(uname -srm), $(nproc) CPUs"
log "ferrite: ${FERRITE:-not found}"
log "fixtures: ${FIXTURES:-none}"
log "python: $PYTHON"

if [ -z "$FERRITE" ]; then
    log "no ferrite binary: set FERRITE=/path/to/ferrite (cargo build --release -p ferrite-cli builds it)"
    echo "no ferrite binary; see $REPORT"
    exit 1
fi

# The machine.
if command -v nvidia-smi >/dev/null; then
    step "nvidia-smi" ok nvidia-smi
    step "nvidia-smi query" ok nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,driver_version,compute_cap --format=csv
else
    log "" && log "=== nvidia-smi: not installed (no NVIDIA driver?)"
fi
step "ferrite --version" ok "$FERRITE" --version

# What ferrite sees: CUDA devices (driver, compute capability, memory), wgpu adapters, NVRTC.
step "ferrite devices" ok "$FERRITE" devices
step "ferrite devices --json" ok "$FERRITE" devices --json
step "ferrite doctor" ok "$FERRITE" doctor
# Every CUDA kernel source compiled by NVRTC for this GPU's architecture, through the binary.
step "ferrite doctor --compile-kernels" ok "$FERRITE" doctor --compile-kernels

# The PyTorch reference cases from the binary (`ferrite doctor --check-device`): on cpu as the
# baseline, on gpu:0 (the same card through Vulkan), and on cuda:0 (the CUDA backend: every case).
if [ -n "$FIXTURES" ]; then
    step "check-device cpu" ok "$FERRITE" doctor --check-device cpu --fixtures "$FIXTURES"
    step "check-device gpu:0" ok "$FERRITE" doctor --check-device gpu:0 --fixtures "$FIXTURES"
    step "check-device cuda:0" ok "$FERRITE" doctor --check-device cuda:0 --fixtures "$FIXTURES"
else
    log "" && log "=== check-device: no fixture folder (copy shared/fixtures/pytorch-reference as fixtures/)"
    SUMMARY+=("$(printf '%-44s %s' "check-device" "not run: no fixtures/")")
    FAILED=$((FAILED + 1))
fi

# gpu:0: prebuilt conformance test binaries if any were copied along, then a training run.
if [ -d "$TEST_BINS" ]; then
    for t in "$TEST_BINS"/*; do
        [ -f "$t" ] && [ -x "$t" ] || continue
        step "conformance gpu:0 $(basename "$t")" ok env FERRITE_TEST_DEVICES=gpu:0 \
            FERRITE_PYTORCH_REFERENCE="${FIXTURES:-/nonexistent}" FERRITE_REQUIRE_SYSTEM_DEPS=1 "$t" --test-threads 1
    done
else
    log "" && log "=== conformance: no prebuilt test executables in $TEST_BINS (see the header of this script)"
fi
step "train digits on gpu:0" ok "$FERRITE" train --device gpu:0 --epochs 1 --no-progress
step "train digits on cpu (reference)" ok "$FERRITE" train --device cpu --epochs 1 --no-progress

# cuda:0: forward, backward and the fused AdamW step all run on the CUDA backend.
step "train digits on cuda:0" ok "$FERRITE" train --device cuda:0 --epochs 1 --no-progress

# The benchmarks of issue 31 (§4), ferrite's from the binary and PyTorch's on the same GPU, as
# JSON, then the targets compared. Each side's JSON is also kept in $OUT.
rm -f "$FERRITE_JSON" "$PYTORCH_JSON"
STEP_JSON="$FERRITE_JSON" STEP_LIMIT="$BENCH_TIMEOUT" \
    step "ferrite doctor --bench cuda:0" ok "$FERRITE" doctor --bench cuda:0 --json
if "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    step "pytorch versions" ok "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'capability', torch.cuda.get_device_capability(0))"
    if [ -f "$BENCH" ]; then
        # Without transformers the GPT-2 step is left out (its row then reads NOT MEASURED).
        GPT2=()
        "$PYTHON" -c "import transformers" 2>/dev/null || GPT2=(--no-gpt2)
        STEP_JSON="$PYTORCH_JSON" STEP_LIMIT="$BENCH_TIMEOUT" \
            step "pytorch cuda reference (bench/gpu_vs_pytorch_cuda.py)" ok "$PYTHON" "$BENCH" --json ${GPT2[@]+"${GPT2[@]}"}
    else
        log "" && log "=== pytorch cuda reference: $BENCH is missing"
    fi
else
    log "" && log "=== pytorch: $PYTHON has no torch with CUDA"
    SUMMARY+=("$(printf '%-44s %s' "pytorch" "not run: no torch with CUDA in $PYTHON")")
fi
if [ -s "$FERRITE_JSON" ] && [ -s "$PYTORCH_JSON" ] && [ -f "$COMPARE" ]; then
    step "targets: ferrite vs pytorch (bench/compare_cuda_bench.py)" ok "$PYTHON" "$COMPARE" "$FERRITE_JSON" "$PYTORCH_JSON"
    # The table once more at the end of the report, next to the summary.
    TARGETS="$("$PYTHON" "$COMPARE" "$FERRITE_JSON" "$PYTORCH_JSON" 2>&1)"
else
    log "" && log "=== targets: not compared (a benchmark JSON is missing or empty; see the steps above)"
    TARGETS="not compared: a benchmark did not produce its JSON"
fi

END=$(date +%s)
log ""
log "=== summary ($((END - START)) s)"
for s in "${SUMMARY[@]}"; do log "$s"; done
log ""
log "=== issue 31 targets (benchmarks: a MISSED target is recorded, not a failed step)"
log "$TARGETS"
echo "report: $REPORT ($((END - START)) s, $FAILED failed step(s))"
[ "$FAILED" -eq 0 ]
