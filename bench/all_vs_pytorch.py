#!/usr/bin/env python3
"""Every CPU workload of ferrite next to PyTorch, in one table: one command, one line per row.

Rows: the tensor workloads (matmul, attention's two batched products, the elementwise chain,
softmax / layer norm / row sums and the backward passes of softmax and layer norm at three
shapes, a tiny add), the training steps of the
`ferrite-nn` benches (conv at three shapes, the ResNet basic block, the LSTM at three widths and
two sequence lengths, the transformer block), and — with `--all` — the digits CNN epoch and the
Hugging Face GPT-2-shaped training step (`bench/hf_vs_transformers.py`).

For each row ferrite and PyTorch run alternately, ROUNDS times, on THREADS threads, each run in
its own process (the ferrite benches are built once first). A row prints both medians, the
min–max of the per-round ratios and, last, the median ratio written `1.23x`: above 1 ferrite is
faster (throughput ratio for GFLOP/s rows, PyTorch's time over ferrite's for timed rows). The
header names the CPU model and its vector extensions, the thread count and the load average.

    python bench/all_vs_pytorch.py [ROUNDS] [THREADS] [--only SUBSTRING] [--all]

Run it with a Python that has torch (e.g. `/work/pyenv/bin/python`), from the repo root, on a
quiet machine: another build running beside it shows up as noise in every row.
"""
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
ROUNDS = int(ARGS[0]) if len(ARGS) > 0 else 3
THREADS = int(ARGS[1]) if len(ARGS) > 1 else 2
ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
EVERYTHING = "--all" in sys.argv
NN_BENCHES = os.path.join(ROOT, "crates", "ferrite-nn", "benches")


def cpu():
    info = {}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            k, _, v = line.partition(":")
            info[k.strip()] = v.strip()
    except FileNotFoundError:
        pass
    flags = set(info.get("Flags", "").split())
    ext = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16") if f in flags]
    return f"{info.get('Model name', '?')}, {info.get('CPU(s)', '?')} CPUs, {' '.join(ext) or 'no AVX2'}"


def bench_executables():
    """Build the ferrite benches once; their executables by bench name."""
    exes = {}
    for pkg, benches in (("ferrite-tensor", ["ops_vs_pytorch"]),
                         ("ferrite-nn", ["conv_step", "resnet_block", "lstm_step", "transformer_step"])):
        cmd = ["cargo", "bench", "-q", "-p", pkg, "--no-run", "--message-format=json"]
        for b in benches:
            cmd += ["--bench", b]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
        for line in out.splitlines():
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            target = msg.get("target", {})
            if msg.get("reason") == "compiler-artifact" and "bench" in target.get("kind", []) and msg.get("executable"):
                exes[target["name"]] = msg["executable"]
    return exes


def run(cmd, env=None):
    full_env = dict(os.environ, RAYON_NUM_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS), **(env or {}))
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=full_env, cwd=ROOT).stdout


def median_ms(out):
    m = re.search(r"median ([0-9.]+) ms", out)
    if not m:
        raise SystemExit(f"no median in output:\n{out}")
    return float(m.group(1))


def ops_value(out, key, arg):
    """`<key> <arg> <value>` (or `tiny_add <value>`) from the ops bench."""
    for line in out.splitlines():
        parts = line.split()
        if parts[:1] == [key] and (arg is None or parts[1:2] == [str(arg)]):
            return float(parts[-1])
    raise SystemExit(f"no `{key} {arg}` in output:\n{out}")


# PyTorch twins of the ops bench: (key, arg) -> code that prints the value. Shapes from env.
TORCH_OPS = r"""
import os, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
key = sys.argv[2]
def best_of(reps, iters, f):
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            f()
        best = min(best, (time.perf_counter() - t) / iters)
    return best
if key == "matmul":
    n = int(sys.argv[3]); a, b = torch.randn(n, n), torch.randn(n, n)
    iters = max(3, min(4000, 4_000_000_000 // (2 * n ** 3)))
    print(2 * n ** 3 / best_of(5, iters, lambda: a @ b) / 1e9)
elif key in ("bmm_qk", "bmm_pv"):
    s = int(os.environ.get("FERRITE_BENCH_SEQ", "128")); bh, dh = 128, 64
    q, k, p = torch.randn(bh, s, dh), torch.randn(bh, s, dh), torch.randn(bh, s, s)
    kt = k.transpose(-2, -1)
    iters = max(2, min(80, 20 * 128 * 128 // (s * s)))
    f = (lambda: q @ kt) if key == "bmm_qk" else (lambda: p @ k)
    print(2 * bh * s * s * dh / best_of(5, iters, f) / 1e9)
elif key == "chain":
    n = int(sys.argv[3]); x, y = torch.randn(n), torch.randn(n)
    print(best_of(3, 5 if n > 1 << 22 else 50, lambda: ((x * y + x).relu() * 0.5).exp()) * 1e3)
elif key in ("softmax", "layer_norm", "sum_rows"):
    rows, cols = (int(v) for v in os.environ.get("FERRITE_BENCH_ROWS", "4096x256").split("x"))
    x, w, b = torch.randn(rows, cols), torch.randn(cols), torch.randn(cols)
    f = {"softmax": lambda: torch.softmax(x, -1),
         "layer_norm": lambda: torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5),
         "sum_rows": lambda: x.sum(0)}[key]
    print(best_of(5, 50, f) * 1e3)
elif key in ("softmax_bwd", "layer_norm_bwd"):
    rows, cols = (int(v) for v in os.environ.get("FERRITE_BENCH_ROWS", "4096x256").split("x"))
    x, w, b, g = torch.randn(rows, cols), torch.randn(cols), torch.randn(cols), torch.randn(rows, cols)
    params = [x.requires_grad_()] + ([w.requires_grad_(), b.requires_grad_()] if key == "layer_norm_bwd" else [])
    y = torch.softmax(x, -1) if key == "softmax_bwd" else torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5)
    def bwd():
        y.backward(g, retain_graph=True)
        for p in params:
            p.grad = None
    print(best_of(5, 50, bwd) * 1e3)
elif key == "tiny_add":
    a, b = torch.randn(4), torch.randn(4)
    print(best_of(5, 200_000, lambda: a + b) * 1e9)
"""


def ops_row(label, key, arg, unit, env=None):
    """A row of the ops bench: ferrite's value for `key arg`, PyTorch's twin."""
    higher_better = unit == "GFLOP/s"

    def ferrite(exes):
        filt = {"softmax": "rows", "layer_norm": "rows", "sum_rows": "rows", "softmax_bwd": "rows",
                "layer_norm_bwd": "rows", "bmm_qk": "bmm", "bmm_pv": "bmm"}.get(key, key)
        return ops_value(run([exes["ops_vs_pytorch"], filt], env), key, None if key == "tiny_add" else arg)

    def pytorch():
        out = run([sys.executable, "-c", TORCH_OPS, str(THREADS), key] + ([str(arg)] if arg is not None else []), env)
        return float(out.strip().splitlines()[-1])

    return (label, unit, higher_better, ferrite, pytorch)


def nn_row(label, bench, fargs, script, pargs, env=None):
    """A row of a ferrite-nn training-step bench and its PyTorch twin (median ms)."""

    def ferrite(exes):
        return median_ms(run([exes[bench]] + fargs, env))

    def pytorch():
        return median_ms(run([sys.executable, os.path.join(NN_BENCHES, script)] + pargs, env))

    return (label, "ms", False, ferrite, pytorch)


def rows():
    t = str(THREADS)
    out = []
    for n in (32, 64, 256, 1024, 2048):
        out.append(ops_row(f"matmul {n}", "matmul", n, "GFLOP/s"))
    for s in (64, 128, 512):
        env = {"FERRITE_BENCH_SEQ": str(s)}
        out.append(ops_row(f"bmm q.k^T [128,{s},64]", "bmm_qk", s, "GFLOP/s", env))
        out.append(ops_row(f"bmm p.v [128,{s},{s}]", "bmm_pv", s, "GFLOP/s", env))
    out.append(ops_row("elementwise chain 1M", "chain", 1 << 20, "ms"))
    out.append(ops_row("elementwise chain 16M", "chain", 1 << 24, "ms"))
    for rows_, cols in ((4096, 256), (512, 4096), (65536, 64)):
        env = {"FERRITE_BENCH_ROWS": f"{rows_}x{cols}"}
        out.append(ops_row(f"softmax [{rows_},{cols}]", "softmax", rows_, "ms", env))
        out.append(ops_row(f"layer norm [{rows_},{cols}]", "layer_norm", rows_, "ms", env))
        out.append(ops_row(f"row sums [{rows_},{cols}]", "sum_rows", rows_, "ms", env))
        out.append(ops_row(f"softmax backward [{rows_},{cols}]", "softmax_bwd", rows_, "ms", env))
        out.append(ops_row(f"layer norm backward [{rows_},{cols}]", "layer_norm_bwd", rows_, "ms", env))
    out.append(ops_row("tiny add (ns/op)", "tiny_add", None, "ns"))
    for cin, cout, hw in ((3, 64, 32), (1, 32, 28), (64, 64, 56)):
        env = {"FERRITE_BENCH_CONV": f"{cin},{cout},{hw}"}
        steps = "10" if hw >= 56 else "30"
        out.append(nn_row(f"conv step {cin}->{cout} {hw}x{hw} B32", "conv_step", [steps], "conv_step.py", [steps, t], env))
        out.append(nn_row(f"conv step {cin}->{cout} {hw}x{hw} B32, input grad", "conv_step", [steps, "input-grad"],
                          "conv_step.py", [steps, t, "input-grad"], env))
    out.append(nn_row("resnet basic block C64 32x32 B32", "resnet_block", ["20"], "resnet_block.py", ["20", t]))
    for h in (128, 512, 1024):
        env = {"FERRITE_BENCH_LSTM_HIDDEN": str(h)}
        out.append(nn_row(f"lstm 256->{h} B32, 16 steps", "lstm_step", ["20", "16"], "lstm_step.py", ["20", "16", t], env))
    out.append(nn_row("lstm 256->512 B32, 1 step", "lstm_step", ["50", "1"], "lstm_step.py", ["50", "1", t]))
    out.append(nn_row("transformer block step B32 S128 W256", "transformer_step", ["10"], "transformer_step.py", ["10", t]))
    return out


def main():
    print(f"cpu: {cpu()}; threads {THREADS}; {ROUNDS} alternating rounds; load average {os.getloadavg()[0]:.2f}")
    exes = bench_executables()
    selected = [r for r in rows() if ONLY is None or ONLY in r[0]]
    print(f"{'row':<44}{'ferrite':>12}{'pytorch':>12}  {'unit':<8}{'min-max':>13}{'ratio':>9}")
    for label, unit, higher_better, ferrite, pytorch in selected:
        fs, ps, ratios = [], [], []
        for _ in range(ROUNDS):
            f, p = ferrite(exes), pytorch()
            fs.append(f)
            ps.append(p)
            ratios.append(f / p if higher_better else p / f)
        lo, hi = min(ratios), max(ratios)
        prec = 1 if unit in ("GFLOP/s", "ns") else 3
        print(f"{label:<44}{statistics.median(fs):>12.{prec}f}{statistics.median(ps):>12.{prec}f}  {unit:<8}"
              f"{lo:>6.2f}-{hi:<6.2f}{statistics.median(ratios):>8.2f}x", flush=True)
    if EVERYTHING:
        print("-- end to end (their own scripts; see each script's header):", flush=True)
        for cmd in ([sys.executable, "crates/ferrite-cli/bench/digits_epoch.py", str(THREADS), str(ROUNDS)],
                    [sys.executable, "bench/hf_vs_transformers.py", str(ROUNDS), str(THREADS)]):
            print("$ " + " ".join(cmd), flush=True)
            print(run(cmd), flush=True)
    print("ratio: above 1 ferrite is faster (throughput for GFLOP/s rows, PyTorch's time / ferrite's for the others)")


if __name__ == "__main__":
    main()
