#!/bin/bash
# LoRA against full fine-tuning, step time on the CPU (issue 34 §3), without PyTorch: ROUNDS
# alternating `ferrite train` runs of the GPT-2-small-shaped folder of hf_vs_transformers.py
# (seq 256, batch 4, 3 steps), each printing its epoch line (time of 3 steps + one validation block).
#
#   bench/lora_step.sh FERRITE FOLDER TEXT [ROUNDS]
# e.g. FOLDER from `python -c "import sys; sys.path.insert(0,'bench'); import hf_vs_transformers as h; h.make_folder('/tmp/gpt2-small')"`
# and TEXT = crates/ferrite-models/tests/data/hf/text.txt.
set -euo pipefail
BIN=$1 FOLDER=$2 TEXT=$3 ROUNDS=${4:-2}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
date -u; uptime
for r in $(seq "$ROUNDS"); do
  for extra in "" "--lora-rank 8"; do
    # shellcheck disable=SC2086
    line=$(RAYON_NUM_THREADS=2 "$BIN" train --hf-model "$FOLDER" --data "$TEXT" --seq 256 --batch-size 4 --steps 3 \
      --lr 1e-4 --no-progress --out "$OUT/run" $extra | grep -E "^epoch")
    echo "round $r ${extra:-full}: ${line##*| }"
  done
done
date -u
