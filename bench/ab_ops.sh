#!/bin/bash
# A/B of the attention products and row kernels of the `ops_vs_pytorch` bench (issue 32): two
# builds of the bench and PyTorch's twin (the TORCH_OPS script of bench/all_vs_pytorch.py),
# alternating old / new / torch, ROUNDS times per shape; prints one line per round and, last,
# the medians per row.
# usage: bench/ab_ops.sh THREADS OLD_EXE NEW_EXE [ROUNDS]
#   (PY=python with torch, default /work/pyenv/bin/python; WHAT="bmm rows" to pick the groups;
#    SEQS="64 128 512", SHAPES="4096x256 512x4096 65536x64")
# Build the executable with `cargo bench --no-run --workspace --features
# ferrite-parallel/mpi,ferrite-cli/mpi --bench ops_vs_pytorch` before and after a change (copy
# the first one away).
T=$1; OLD=$2; NEW=$3; R=${4:-3}; PY=${PY:-/work/pyenv/bin/python}
HERE=$(cd "$(dirname "$0")/.." && pwd)
TORCH=$(mktemp /tmp/ab_ops_torch.XXXXXX.py)
"$PY" - "$HERE/bench/all_vs_pytorch.py" > "$TORCH" <<'PY'
import re, sys
print(re.search(r'TORCH_OPS = r?"""(.*?)"""', open(sys.argv[1]).read(), re.S).group(1))
PY
LOG=$(mktemp /tmp/ab_ops_log.XXXXXX)
one() { # group env-var value keys...
  local group=$1 var=$2 val=$3; shift 3
  for r in $(seq "$R"); do
    o=$(env "$var=$val" RAYON_NUM_THREADS="$T" "$OLD" "$group")
    n=$(env "$var=$val" RAYON_NUM_THREADS="$T" "$NEW" "$group")
    for key in "$@"; do
      ov=$(awk -v k="$key" '$1 == k {print $3}' <<<"$o")
      nv=$(awk -v k="$key" '$1 == k {print $3}' <<<"$n")
      pv=$(env "$var=$val" "$PY" "$TORCH" "$T" "$key" | tail -1)
      printf '%s %s round %s: before %s new %s torch %.4f load %s\n' "$key" "$val" "$r" "$ov" "$nv" "$pv" \
        "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$LOG"
    done
  done
}
for w in ${WHAT:-bmm rows}; do
  if [ "$w" = bmm ]; then
    for s in ${SEQS:-64 128 512}; do one bmm FERRITE_BENCH_SEQ "$s" bmm_qk bmm_pv; done
  else
    for s in ${SHAPES:-4096x256 512x4096 65536x64}; do
      one rows FERRITE_BENCH_ROWS "$s" softmax layer_norm softmax_bwd layer_norm_bwd
    done
  fi
done
echo "medians (GFLOP/s for bmm rows, ms for the others):"
"$PY" - "$LOG" <<'PY'
import collections, statistics, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    f = line.split()
    rows.setdefault((f[0], f[1]), []).append((float(f[5]), float(f[7]), float(f[9])))
for (key, shape), v in rows.items():
    o, n, p = (statistics.median(x[i] for x in v) for i in range(3))
    up = key.startswith("bmm")
    speed = (lambda a, b: a / b) if up else (lambda a, b: b / a)
    print(f"{key:<16}{shape:>10}  before {o:9.3f}  new {n:9.3f}  torch {p:9.3f}  "
          f"new/before speed {speed(n, o):.2f}x  vs torch: before {speed(o, p):.2f}x new {speed(n, p):.2f}x")
PY
rm -f "$TORCH" "$LOG"
