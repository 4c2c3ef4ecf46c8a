#!/usr/bin/env python3
"""Convolution, ResNet block and LSTM training steps, ferrite vs PyTorch CPU, side by side.

For each workload of the model-breadth issue — `conv_step` (Conv2d 3->64, 32x32, k3, batch 32,
forward + backward), `resnet_block` (basic block, 64 channels, 32x32, batch 32) and `lstm_step`
(one LSTM layer 256->512, batch 32, one time step and 16 steps) — alternates the ferrite bench
and its PyTorch twin in `crates/ferrite-nn/benches/` for a few rounds on the same thread count,
then prints the CPU model and vector extensions, every round's medians and the ratio
ferrite / PyTorch (below 1.0: ferrite is faster). Usage from the repo root, with a Python that
has torch:

    python bench/models_vs_pytorch.py [ROUNDS] [THREADS]
"""
import os
import re
import subprocess
import sys

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHES = os.path.join(ROOT, "crates", "ferrite-nn", "benches")

# (label, ferrite bench, its arguments, pytorch script, its arguments)
WORKLOADS = [
    ("conv2d 3->64 32x32 k3 B32", "conv_step", ["30"], "conv_step.py", ["30", str(THREADS)]),
    ("conv2d, with input grad", "conv_step", ["30", "input-grad"], "conv_step.py", ["30", str(THREADS), "input-grad"]),
    ("resnet basic block C64 32x32 B32", "resnet_block", ["20"], "resnet_block.py", ["20", str(THREADS)]),
    ("lstm 256->512 B32, 1 step", "lstm_step", ["50", "1"], "lstm_step.py", ["50", "1", str(THREADS)]),
    ("lstm 256->512 B32, 16 steps", "lstm_step", ["20", "16"], "lstm_step.py", ["20", "16", str(THREADS)]),
]


def cpu():
    info = {}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            k, _, v = line.partition(":")
            info[k.strip()] = v.strip()
    except FileNotFoundError:
        pass
    flags = set(info.get("Flags", "").split())
    ext = [f for f in ("avx2", "fma", "avx512f") if f in flags]
    return f"{info.get('Model name', '?')}, {info.get('CPU(s)', '?')} CPUs, {' '.join(ext) or 'no AVX2'}"


def median_ms(out):
    m = re.search(r"median ([0-9.]+) ms", out)
    if not m:
        raise SystemExit(f"no median in output:\n{out}")
    return float(m.group(1))


def ferrite(bench, args):
    env = dict(os.environ, RAYON_NUM_THREADS=str(THREADS))
    cmd = ["cargo", "bench", "-q", "-p", "ferrite-nn", "--bench", bench, "--"] + args
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT).stdout


def pytorch(script, args):
    cmd = [sys.executable, os.path.join(BENCHES, script)] + args
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    print(f"cpu: {cpu()}; threads: {THREADS}; {ROUNDS} rounds")
    for bench in sorted({w[1] for w in WORKLOADS}):
        subprocess.run(["cargo", "bench", "-q", "-p", "ferrite-nn", "--bench", bench, "--no-run"], check=True, cwd=ROOT)
    print(f"{'workload':<34}{'ferrite':>12}{'pytorch':>12}{'ratio':>8}   (medians over rounds)")
    for label, bench, fargs, script, pargs in WORKLOADS:
        fs, ps = [], []
        for _ in range(ROUNDS):
            fs.append(median_ms(ferrite(bench, fargs)))
            ps.append(median_ms(pytorch(script, pargs)))
        f, p = sorted(fs)[len(fs) // 2], sorted(ps)[len(ps) // 2]
        print(f"{label:<34}{f:>9.2f} ms{p:>9.2f} ms{f / p:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
