#!/usr/bin/env python3
"""A GPT-2-small-shaped model (124M parameters, random weights) in ferrite and in transformers +
PyTorch on the same CPU threads: the training step (seq 256, batch 4, AdamW) and greedy
generation with the key/value cache (issue 27 §5).

The model folder is made here with transformers (`GPT2Config()` defaults: 12 layers, width 768,
vocabulary 50257, 1024 positions, dropout 0.1 as configured) and saved with `save_pretrained`
into a temporary directory, with the small byte-level BPE tokenizer of the parity fixtures (ids
below 320: the model's compute does not depend on which ids it reads). Both sides then load the
same folder:

  step: `ferrite train --hf-model DIR --data TEXT --seq 256 --batch-size 4 --steps S` (the epoch's
        time over its steps; the epoch also evaluates one validation block, which counts against
        ferrite) next to a PyTorch loop of the same steps (`model(ids, labels=ids).loss`,
        backward, AdamW), each in its own process; peak RSS of each process (ru_maxrss).
  generate: `ferrite generate --json` (prefill + decode seconds) next to `model.generate`
        (do_sample=False, same prompt, same number of new tokens), tokens per second.

Usage from the repo root after `cargo build --release`, with a Python that has torch and
transformers:

    python bench/hf_vs_transformers.py [ROUNDS] [THREADS]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRITE = os.path.join(ROOT, "target", "release", "ferrite")
FIXTURES = os.path.join(ROOT, "crates", "ferrite-models", "tests", "data", "hf")
SEQ, BATCH, STEPS, NEW_TOKENS = 256, 4, 3, 64
PROMPT = "the allocator keeps the memory of a device"

TORCH_STEP = r"""
import sys, time, torch
from transformers import AutoModelForCausalLM
from tokenizers import Tokenizer
torch.set_num_threads(int(sys.argv[4]))
folder, text, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = Tokenizer.from_file(folder + "/tokenizer.json")
ids = tok.encode(open(text).read(), add_special_tokens=False).ids
blocks = torch.tensor(ids[: len(ids) // %(seq)d * %(seq)d]).reshape(-1, %(seq)d)
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
times = []
for i in range(steps + 1):
    x = blocks[(i * %(batch)d) %% (len(blocks) - %(batch)d):][: %(batch)d]
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    times.append(time.perf_counter() - t)
print("step_seconds", sum(times[1:]) / steps)
""" % {"seq": SEQ, "batch": BATCH}

TORCH_GENERATE = r"""
import sys, time, torch
from transformers import AutoModelForCausalLM
from tokenizers import Tokenizer
torch.set_num_threads(int(sys.argv[3]))
folder, new = sys.argv[1], int(sys.argv[2])
tok = Tokenizer.from_file(folder + "/tokenizer.json")
prompt = torch.tensor([tok.encode(%(prompt)r, add_special_tokens=False).ids])
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
kw = dict(attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
with torch.no_grad():
    model.generate(prompt, **dict(kw, max_new_tokens=4, min_new_tokens=4))
    t = time.perf_counter()
    out = model.generate(prompt, **kw)
    dt = time.perf_counter() - t
print("generate", out.shape[1] - prompt.shape[1], dt)
""" % {"prompt": PROMPT}


def cpu():
    info = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        k, _, v = line.partition(":")
        info[k.strip()] = v.strip()
    flags = info.get("Flags", "")
    ext = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    return f"{info.get('Model name', '?')} ({ext})"


def run(cmd, env):
    """Runs cmd; returns (stdout, that process's peak RSS in MiB, from wait4's rusage)."""
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, text=True)
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            sys.exit(f"{cmd[0]} failed:\n{out}\n{err.read().decode(errors='replace')}")
    return out, usage.ru_maxrss / 1024.0


def make_folder(path):
    from transformers import GPT2Config, GPT2LMHeadModel
    import shutil
    import torch

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())
    model.save_pretrained(path)
    shutil.copy(os.path.join(FIXTURES, "gpt2", "tokenizer.json"), path)
    n = sum(p.numel() for p in model.parameters())
    return n


def main():
    env = dict(os.environ, RAYON_NUM_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS))
    tmp = tempfile.mkdtemp(prefix="ferrite-gpt2-small-")
    folder = os.path.join(tmp, "gpt2-small")
    n = make_folder(folder)
    # 15 blocks of 256: 14 for training (STEPS steps of BATCH stop the epoch early), 1 validation.
    text = os.path.join(tmp, "text.txt")
    with open(os.path.join(FIXTURES, "text.txt")) as f:
        corpus = f.read()
    with open(text, "w") as f:
        f.write(corpus)
    print(f"cpu: {cpu()}; threads: {THREADS}; {ROUNDS} rounds; GPT-2 small shape, {n} parameters; seq {SEQ}, batch {BATCH}")
    step_f, step_t, gen_f, gen_t, rss_f, rss_t = [], [], [], [], [], []
    for r in range(ROUNDS):
        out, rss = run(
            [FERRITE, "train", "--hf-model", folder, "--data", text, "--seq", str(SEQ), "--batch-size", str(BATCH),
             "--steps", str(STEPS), "--lr", "1e-4", "--no-progress", "--out", os.path.join(tmp, "out")],
            env,
        )
        m = re.search(r"epoch\s+1/1 .*\|\s+([\d.]+)\s*(ms|s)\s*$", out, re.M)
        if not m:
            sys.exit(f"no epoch line in:\n{out}")
        secs = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
        step_f.append(secs / STEPS)
        rss_f.append(rss)
        out, rss = run([sys.executable, "-c", TORCH_STEP, folder, text, str(STEPS), str(THREADS)], env)
        step_t.append(float(out.split()[-1]))
        rss_t.append(rss)
        out, _ = run([FERRITE, "generate", "--hf-model", folder, "--prompt", PROMPT, "--max-new-tokens",
                         str(NEW_TOKENS), "--json"], env)
        g = json.loads(out)
        gen_f.append(len(g["ids"]) / (g["prefill_seconds"] + g["decode_seconds"]))
        out, _ = run([sys.executable, "-c", TORCH_GENERATE, folder, str(NEW_TOKENS), str(THREADS)], env)
        _, k, dt = out.split()
        gen_t.append(int(k) / float(dt))
        print(f"round {r + 1}: step ferrite {step_f[-1]:.2f}s torch {step_t[-1]:.2f}s | "
              f"generate ferrite {gen_f[-1]:.1f} tok/s torch {gen_t[-1]:.1f} tok/s")
    med = lambda xs: sorted(xs)[len(xs) // 2]
    print(f"training step: ferrite {med(step_f):.2f}s, PyTorch {med(step_t):.2f}s -> time ratio ferrite/PyTorch "
          f"{med(step_f) / med(step_t):.2f}x (below 1: ferrite faster)")
    print(f"peak RSS (max over rounds, process-wide): ferrite {max(rss_f):.0f} MiB, PyTorch {max(rss_t):.0f} MiB")
    print(f"generate {NEW_TOKENS} tokens: ferrite {med(gen_f):.1f} tok/s, transformers {med(gen_t):.1f} tok/s -> "
          f"{med(gen_f) / med(gen_t):.2f}x (above 1: ferrite faster)")


if __name__ == "__main__":
    main()
