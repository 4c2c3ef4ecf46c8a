#!/bin/bash
# A/B of the LSTM training step (`lstm_step` bench, batch 32, input 256, SEQ steps): two builds of
# the ferrite bench and PyTorch's twin, alternating, at hidden 128, 512 and 1024.
# usage: bench/ab_lstm.sh THREADS OLD_EXE NEW_EXE [ROUNDS] [SEQ] [STEPS]
#   (PY=python with torch, default /work/pyenv/bin/python; HIDDEN="128 512 1024" to pick widths)
# Build the executables with `cargo bench --no-run --workspace --features ferrite-parallel/mpi,ferrite-cli/mpi
# --bench lstm_step` before and after a change (copy the first one away).
T=$1; OLD=$2; NEW=$3; R=${4:-3}; SEQ=${5:-16}; STEPS=${6:-10}; PY=${PY:-/work/pyenv/bin/python}
HERE=$(cd "$(dirname "$0")/.." && pwd)
med() { sed -n 's/.*median \([0-9.]*\) ms (min \([0-9.]*\)).*/\1 \2/p'; }
for h in ${HIDDEN:-128 512 1024}; do
  for r in $(seq "$R"); do
    o=$(FERRITE_BENCH_LSTM_HIDDEN=$h RAYON_NUM_THREADS=$T "$OLD" "$STEPS" "$SEQ" | med)
    n=$(FERRITE_BENCH_LSTM_HIDDEN=$h RAYON_NUM_THREADS=$T "$NEW" "$STEPS" "$SEQ" | med)
    p=$(FERRITE_BENCH_LSTM_HIDDEN=$h "$PY" "$HERE/crates/ferrite-nn/benches/lstm_step.py" "$STEPS" "$SEQ" "$T" | med)
    echo "hidden $h seq $SEQ threads $T round $r: before $o new $n torch $p (median min, ms) load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
