#!/usr/bin/env python3
"""Tensor workloads in ferrite and PyTorch CPU with the same thread count.

Runs `cargo bench -p ferrite-tensor --bench ops_vs_pytorch` and, if `torch` imports, the same
workloads in PyTorch; prints a table with the ratio. Usage (from the repo root):

    python3 bench/tensor_vs_pytorch.py            # uses torch if importable
    /work/torch-venv/bin/python bench/tensor_vs_pytorch.py
"""
import os
import subprocess
import sys
import time

THREADS = int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1))


def ferrite():
    env = dict(os.environ, RAYON_NUM_THREADS=str(THREADS))
    out = subprocess.run(
        ["cargo", "bench", "-q", "-p", "ferrite-tensor", "--bench", "ops_vs_pytorch"],
        check=True, capture_output=True, text=True, env=env,
    ).stdout
    res = {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] in ("matmul", "chain"):
            res[(parts[0], int(parts[1]))] = float(parts[2])
        elif parts and parts[0] == "tiny_add":
            res[("tiny_add", 4)] = float(parts[1])
    return res


def best_of(reps, iters, f):
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            f()
        best = min(best, (time.perf_counter() - t) / iters)
    return best


def pytorch():
    try:
        import torch
    except Exception as e:  # torch missing or its CUDA libraries absent
        print(f"torch not importable ({e}); ferrite figures only", file=sys.stderr)
        return None
    torch.set_num_threads(THREADS)
    res = {}
    for n in (64, 256, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        iters = max(3, min(4000, 4_000_000_000 // (2 * n ** 3)))
        t = best_of(5, iters, lambda: a @ b)
        res[("matmul", n)] = 2 * n ** 3 / t / 1e9
    for n in (1 << 20, 1 << 24):
        x, y = torch.randn(n), torch.randn(n)
        iters = 5 if n > 1 << 22 else 50
        t = best_of(3, iters, lambda: ((x * y + x).relu() * 0.5).exp())
        res[("chain", n)] = t * 1e3
    a, b = torch.randn(4), torch.randn(4)
    res[("tiny_add", 4)] = best_of(5, 200_000, lambda: a + b) * 1e9
    return res


def main():
    f = ferrite()
    p = pytorch()
    print(f"threads: {THREADS}")
    print(f"{'workload':<22}{'ferrite':>12}{'pytorch':>12}{'ratio':>10}")
    for key, unit, higher_better in [
        (("matmul", 64), "GFLOP/s", True), (("matmul", 256), "GFLOP/s", True),
        (("matmul", 1024), "GFLOP/s", True), (("matmul", 2048), "GFLOP/s", True),
        (("chain", 1 << 20), "ms", False), (("chain", 1 << 24), "ms", False),
        (("tiny_add", 4), "ns/op", False),
    ]:
        fv = f.get(key)
        pv = p.get(key) if p else None
        ratio = "" if pv is None or fv is None else f"{(fv / pv if higher_better else pv / fv):.2f}x"
        name = f"{key[0]} {key[1]} ({unit})"
        print(f"{name:<22}{fv if fv is not None else float('nan'):>12.1f}{pv if pv is not None else float('nan'):>12.1f}{ratio:>10}")
    print("ratio > 1 means ferrite is faster (throughput for matmul, time for the others)")


if __name__ == "__main__":
    main()
