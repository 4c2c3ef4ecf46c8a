#!/bin/bash
# A/B of x.sum(0) ("row sums"): two builds of the ops_vs_pytorch bench and PyTorch, alternating.
# usage: bench/ab_row_sums.sh THREADS OLD_EXE NEW_EXE [ROUNDS]   (PY=python with torch, default /work/pyenv/bin/python)
T=$1; OLD=$2; NEW=$3; R=${4:-3}; PY=${PY:-/work/pyenv/bin/python}
cat > /tmp/torch_sum.py <<'PY'
import os, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
rows, cols = (int(v) for v in os.environ["FERRITE_BENCH_ROWS"].split("x"))
x = torch.randn(rows, cols)
best = float("inf")
for _ in range(5):
    t = time.perf_counter()
    for _ in range(50): x.sum(0)
    best = min(best, (time.perf_counter() - t) / 50)
print("%.3f" % (best * 1e3))
PY
for s in 4096x256 512x4096 65536x64; do
  for r in $(seq $R); do
    o=$(FERRITE_BENCH_ROWS=$s RAYON_NUM_THREADS=$T $OLD rows | awk '/sum_rows/{print $3}')
    n=$(FERRITE_BENCH_ROWS=$s RAYON_NUM_THREADS=$T $NEW rows | awk '/sum_rows/{print $3}')
    p=$(FERRITE_BENCH_ROWS=$s $PY /tmp/torch_sum.py $T)
    echo "$s threads $T round $r: before $o new $n torch $p ms load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
