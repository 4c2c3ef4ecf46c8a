#!/usr/bin/env python3
"""LoRA against full fine-tuning on the CPU (issue 34 §3): the training step of a
GPT-2-small-shaped model (124M parameters, random weights; the folder of hf_vs_transformers.py)
at seq 256, batch 4, AdamW, in ferrite with every weight training, with LoRA r=8 on `c_attn`
(PEFT's default for GPT-2), and the same LoRA in PyTorch + PEFT, each in its own process; step
time and peak RSS of each.

ferrite: `ferrite train --hf-model DIR --data TEXT --seq 256 --batch-size 4 --steps 3
[--lora-rank 8]` (the epoch's time over its steps, which also carries the first step's warm-up
and one validation block); PyTorch: `get_peft_model(model, LoraConfig(r=8, target_modules=["c_attn"]))`,
the same steps (the first excluded).

Usage from the repo root after `cargo build --release` (or FERRITE=path/to/ferrite), with a Python
that has torch, transformers and peft:

    python bench/lora_vs_full.py [ROUNDS] [THREADS]
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_vs_transformers as hv  # noqa: E402  (the folder, the corpus, run() and cpu())

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
FERRITE = os.environ.get("FERRITE", hv.FERRITE)
RANK = 8

TORCH_LORA = hv.TORCH_STEP.replace(
    "model.train()\n",
    "from peft import LoraConfig, get_peft_model\n"
    "model = get_peft_model(model, LoraConfig(r=%d, lora_alpha=8, target_modules=['c_attn'], fan_in_fan_out=True))\n"
    "model.train()\n" % RANK,
).replace("torch.optim.AdamW(model.parameters()", "torch.optim.AdamW([p for p in model.parameters() if p.requires_grad]")


def ferrite_step(folder, text, out, extra, env):
    stdout, rss = hv.run(
        [FERRITE, "train", "--hf-model", folder, "--data", text, "--seq", str(hv.SEQ), "--batch-size", str(hv.BATCH),
         "--steps", str(hv.STEPS), "--lr", "1e-4", "--no-progress", "--out", out] + extra,
        env,
    )
    m = re.search(r"epoch\s+1/1 .*\|\s+([\d.]+)\s*(ms|s)\s*$", stdout, re.M)
    if not m:
        sys.exit(f"no epoch line in:\n{stdout}")
    return float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0) / hv.STEPS, rss


def main():
    env = dict(os.environ, RAYON_NUM_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS))
    tmp = tempfile.mkdtemp(prefix="ferrite-lora-bench-")
    folder = os.path.join(tmp, "gpt2-small")
    n = hv.make_folder(folder)
    text = os.path.join(tmp, "text.txt")
    with open(os.path.join(hv.FIXTURES, "text.txt")) as f, open(text, "w") as g:
        g.write(f.read())
    print(f"cpu: {hv.cpu()}; threads: {THREADS}; {ROUNDS} rounds; GPT-2 small shape, {n} parameters; "
          f"seq {hv.SEQ}, batch {hv.BATCH}; LoRA r={RANK} on c_attn")
    full, lora, peft = [], [], []
    for r in range(ROUNDS):
        full.append(ferrite_step(folder, text, os.path.join(tmp, "full"), [], env))
        lora.append(ferrite_step(folder, text, os.path.join(tmp, "lora"), ["--lora-rank", str(RANK)], env))
        out, rss = hv.run([sys.executable, "-c", TORCH_LORA, folder, text, str(hv.STEPS), str(THREADS)], env)
        peft.append((float(out.split()[-1]), rss))
        print(f"round {r + 1}: ferrite full {full[-1][0]:.2f}s ({full[-1][1]:.0f} MiB), ferrite LoRA "
              f"{lora[-1][0]:.2f}s ({lora[-1][1]:.0f} MiB), PyTorch+PEFT LoRA {peft[-1][0]:.2f}s ({peft[-1][1]:.0f} MiB)")
    med = lambda xs: sorted(x[0] for x in xs)[len(xs) // 2]
    print(f"step: ferrite full {med(full):.2f}s, ferrite LoRA {med(lora):.2f}s ({med(lora) / med(full):.2f}x of full), "
          f"PyTorch+PEFT LoRA {med(peft):.2f}s")
    print(f"peak RSS (max over rounds): ferrite full {max(x[1] for x in full):.0f} MiB, ferrite LoRA "
          f"{max(x[1] for x in lora):.0f} MiB, PyTorch+PEFT LoRA {max(x[1] for x in peft):.0f} MiB")


if __name__ == "__main__":
    main()
