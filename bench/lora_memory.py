#!/usr/bin/env python3
"""LoRA's memory on a T4, planned and measured (issue 34 §3): a GPT-2-small-shaped model (124M
parameters, random weights; the folder of hf_vs_transformers.py) at seq 256, batch 4, AdamW, on
`sim:t4-16gb`, with every weight training, with LoRA r=8 on `c_attn` (PEFT's default for GPT-2),
and with LoRA r=8 + activation checkpointing + the base in bf16.

planned:  `ferrite plan --hf-model DIR --seq 256 --batch-size 4 --device sim:t4-16gb FLAGS --json`
          (peak allocated and reserved of two optimizer steps on `meta`);
measured: `ferrite train --hf-model DIR --data TEXT --seq 256 --batch-size 4 --steps 2
          --device sim:t4-16gb FLAGS` (the simulated T4's allocator: the peaks of its
          memory_summary table, printed at the end of the run; loading the weights included).

Usage from the repo root after `cargo build --release` (or FERRITE=path/to/ferrite), with a Python
that has torch and transformers (to write the folder):

    python bench/lora_memory.py [THREADS]
"""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_vs_transformers as hv  # noqa: E402  (the folder, the corpus, run() and cpu())

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
FERRITE = os.environ.get("FERRITE", hv.FERRITE)
DEVICE = "sim:t4-16gb"
SEQ, BATCH, STEPS = 256, 4, 2
ROWS = [
    ("full fine-tuning", []),
    ("LoRA r=8 (c_attn)", ["--lora-rank", "8"]),
    ("LoRA r=8 + checkpointing + bf16 base", ["--lora-rank", "8", "--checkpoint-activations", "--base-dtype", "bf16"]),
]
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def peak(stdout, metric):
    """The Peak Usage column of `metric`'s row in the memory_summary table, in bytes."""
    for line in stdout.splitlines():
        if line.startswith(f"| {metric}"):
            value, unit = line.split("|")[3].split()
            return int(value) * UNITS[unit]
    sys.exit(f"no `{metric}` row in:\n{stdout}")


def mib(b):
    return f"{b / 2**20:,.0f} MiB"


def main():
    env = dict(os.environ, RAYON_NUM_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS))
    tmp = tempfile.mkdtemp(prefix="ferrite-lora-memory-")
    folder = os.path.join(tmp, "gpt2-small")
    n = hv.make_folder(folder)
    text = os.path.join(tmp, "text.txt")
    with open(os.path.join(hv.FIXTURES, "text.txt")) as f, open(text, "w") as g:
        g.write(f.read())
    print(f"cpu: {hv.cpu()}; GPT-2 small shape, {n} parameters; seq {SEQ}, batch {BATCH}, AdamW; {DEVICE}")
    print("| | planned allocated | planned reserved | measured allocated | measured reserved | reserved error |")
    print("|---|---|---|---|---|---|")
    shape = ["--seq", str(SEQ), "--batch-size", str(BATCH), "--device", DEVICE]
    for name, flags in ROWS:
        out, _ = hv.run([FERRITE, "plan", "--hf-model", folder, "--json"] + shape + flags, env)
        plan = json.loads(out)
        out, _ = hv.run(
            [FERRITE, "train", "--hf-model", folder, "--data", text, "--steps", str(STEPS), "--lr", "1e-4",
             "--no-progress", "--out", os.path.join(tmp, re.sub(r"\W+", "-", name))] + shape + flags,
            env,
        )
        alloc, reserved = peak(out, "Allocated memory"), peak(out, "GPU reserved memory")
        err = (plan["peak_reserved_bytes"] - reserved) / reserved
        print(f"| {name} | {mib(plan['peak_allocated_bytes'])} | {mib(plan['peak_reserved_bytes'])} | "
              f"{mib(alloc)} | {mib(reserved)} | {100 * err:+.1f} % |", flush=True)


if __name__ == "__main__":
    main()
