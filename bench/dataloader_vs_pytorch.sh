#!/usr/bin/env bash
# ferrite's DataLoader vs PyTorch's on the same synthetic dataset (per-sample cost of a few
# microseconds, batch 64, 0 and 2 workers). Prints batches per second for both.
#   bash bench/dataloader_vs_pytorch.sh                 # defaults: 5 µs/sample, 500 batches/epoch
#   SAMPLE_US=3 BATCHES=1000 bash bench/dataloader_vs_pytorch.sh
# PYTHON must point at an interpreter with torch (default: /work/torch-venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-/work/torch-venv/bin/python}"
ARGS=(--workers "${WORKERS:-0,2}" --sample-us "${SAMPLE_US:-5}" --batches "${BATCHES:-500}" --batch-size "${BATCH_SIZE:-64}" --epochs "${EPOCHS:-3}")
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
cargo bench -q -p ferrite-data --bench dataloader_throughput -- "${ARGS[@]}"
if "$PYTHON" -c "import torch" 2>/dev/null; then
  "$PYTHON" bench/dataloader_pytorch.py "${ARGS[@]}"
else
  echo "PyTorch half skipped: $PYTHON cannot import torch (set PYTHON=...)" >&2
fi
