#!/usr/bin/env python3
"""Conv2d training step, ferrite vs PyTorch CPU, side by side in one run.

Alternates `cargo bench -p ferrite-nn --bench conv_step` and its PyTorch twin
(`crates/ferrite-nn/benches/conv_step.py`) for a few rounds, with and without the input
gradient, on the same thread count, and prints the CPU model and vector extensions, every
round's medians and the ratio ferrite / PyTorch (below 1 means ferrite is faster). Usage from
the repo root:

    /work/torch-venv/bin/python bench/conv_vs_pytorch.py [ROUNDS] [THREADS] [STEPS]
"""
import os
import re
import subprocess
import sys

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 30
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


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
    f = re.search(r"forward median ([0-9.]+) ms", out)
    return float(m.group(1)), float(f.group(1))


def ferrite(mode):
    env = dict(os.environ, RAYON_NUM_THREADS=str(THREADS))
    args = ["cargo", "bench", "-q", "-p", "ferrite-nn", "--bench", "conv_step", "--", str(STEPS)] + mode
    return subprocess.run(args, check=True, capture_output=True, text=True, env=env, cwd=ROOT).stdout


def pytorch(mode):
    script = os.path.join(ROOT, "crates", "ferrite-nn", "benches", "conv_step.py")
    args = [sys.executable, script, str(STEPS), str(THREADS)] + mode
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def main():
    print(f"cpu: {cpu()}; threads: {THREADS}; {STEPS} steps per run, {ROUNDS} rounds")
    subprocess.run(["cargo", "bench", "-q", "-p", "ferrite-nn", "--bench", "conv_step", "--no-run"], check=True, cwd=ROOT)
    print(f"{'input grad':<11}{'round':>6}{'ferrite step':>14}{'pytorch step':>14}{'ratio':>8}{'ferrite fwd':>13}{'pytorch fwd':>13}")
    for mode in ([], ["input-grad"]):
        for r in range(ROUNDS):
            f, ff = median_ms(ferrite(mode))
            p, pf = median_ms(pytorch(mode))
            print(f"{str(bool(mode)):<11}{r + 1:>6}{f:>11.2f} ms{p:>11.2f} ms{f / p:>8.2f}{ff:>10.2f} ms{pf:>10.2f} ms")


if __name__ == "__main__":
    main()
