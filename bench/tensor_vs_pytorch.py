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
        if parts and parts[0] == "cpu":
            print(f"ferrite: {line}")
        if parts and parts[0] in ("matmul", "chain", "bmm_qk", "bmm_pv", "softmax", "layer_norm", "sum_rows"):
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
    print(f"pytorch {torch.__version__}: cpu capability {torch.backends.cpu.get_cpu_capability()}")
    res = {}
    for n in (32, 64, 256, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        iters = max(3, min(4000, 4_000_000_000 // (2 * n ** 3)))
        t = best_of(5, iters, lambda: a @ b)
        res[("matmul", n)] = 2 * n ** 3 / t / 1e9
    bh, s, dh = 128, 128, 64
    q, k, p = torch.randn(bh, s, dh), torch.randn(bh, s, dh), torch.randn(bh, s, s)
    kt = k.transpose(-2, -1)
    flops = 2 * bh * s * s * dh
    res[("bmm_qk", s)] = flops / best_of(5, 20, lambda: q @ kt) / 1e9
    res[("bmm_pv", s)] = flops / best_of(5, 20, lambda: p @ k) / 1e9
    for n in (1 << 20, 1 << 24):
        x, y = torch.randn(n), torch.randn(n)
        iters = 5 if n > 1 << 22 else 50
        t = best_of(3, iters, lambda: ((x * y + x).relu() * 0.5).exp())
        res[("chain", n)] = t * 1e3
    rows, cols = 4096, 256
    x, w, b = torch.randn(rows, cols), torch.randn(cols), torch.randn(cols)
    res[("softmax", rows)] = best_of(5, 50, lambda: torch.softmax(x, -1)) * 1e3
    res[("layer_norm", rows)] = best_of(5, 50, lambda: torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5)) * 1e3
    res[("sum_rows", rows)] = best_of(5, 50, lambda: x.sum(0)) * 1e3
    a, b = torch.randn(4), torch.randn(4)
    res[("tiny_add", 4)] = best_of(5, 200_000, lambda: a + b) * 1e9
    return res


def cpu():
    """The CPU model and the vector features that matter for the kernels (Linux)."""
    model, flags = "unknown", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq")
    return f"{model} | " + " ".join(f if f in flags else f"-{f}" for f in wanted)


def main():
    print(f"cpu: {cpu()}; load average {os.getloadavg()[0]:.2f}")
    f = ferrite()
    p = pytorch()
    print(f"threads: {THREADS}")
    print(f"{'workload':<24}{'ferrite':>12}{'pytorch':>12}{'ratio':>10}")
    for key, unit, higher_better in [
        (("matmul", 32), "GFLOP/s", True),
        (("matmul", 64), "GFLOP/s", True), (("matmul", 256), "GFLOP/s", True),
        (("matmul", 1024), "GFLOP/s", True), (("matmul", 2048), "GFLOP/s", True),
        (("bmm_qk", 128), "GFLOP/s", True), (("bmm_pv", 128), "GFLOP/s", True),
        (("chain", 1 << 20), "ms", False), (("chain", 1 << 24), "ms", False),
        (("softmax", 4096), "ms", False), (("layer_norm", 4096), "ms", False), (("sum_rows", 4096), "ms", False),
        (("tiny_add", 4), "ns/op", False),
    ]:
        fv = f.get(key)
        pv = p.get(key) if p else None
        ratio = "" if pv is None or fv is None else f"{(fv / pv if higher_better else pv / fv):.2f}x"
        name = f"{key[0]} {key[1]} ({unit})"
        prec = 3 if unit == "ms" else 1
        fs = f"{fv if fv is not None else float('nan'):>12.{prec}f}"
        ps = f"{pv if pv is not None else float('nan'):>12.{prec}f}"
        print(f"{name:<24}{fs}{ps}{ratio:>10}")
    print("ratio > 1 means ferrite is faster (throughput for matmul, time for the others)")


if __name__ == "__main__":
    main()
