#!/usr/bin/env python3
"""One epoch of the digits MLP: `ferrite train` against the same training in PyTorch.

Both sides train the default demo (MLP 64-128-128-10, AdamW lr 1e-3 wd 0.01, batch 64, shuffled,
20 epochs, test-set evaluation after every epoch, same stratified split) in a fresh process; the
script reports the median epoch time (training + evaluation, as printed per epoch) and the
process's peak RSS. PyTorch runs only if `torch` imports; ferrite runs alone otherwise.

    cargo build --release -p ferrite-cli
    /work/torch-venv/bin/python crates/ferrite-cli/bench/digits_epoch.py [THREADS] [ROUNDS]
"""
import gzip
import os
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
FERRITE = os.path.join(ROOT, "target", "release", "ferrite")
DIGITS = os.path.join(ROOT, "crates", "ferrite-data", "data", "digits.csv.gz")


def torch_worker(threads):
    import numpy as np
    import torch
    torch.set_num_threads(threads)
    rows = np.loadtxt(gzip.open(DIGITS, "rt"), delimiter=",")
    x = ((rows[:, :64] / 16.0 - 0.3051) / 0.3762).astype(np.float32)
    y = rows[:, 64].astype(np.int64)
    # ferrite's split: every fifth image of each class is a test image.
    seen = np.zeros(10, dtype=np.int64)
    test = np.zeros(len(y), dtype=bool)
    for i, label in enumerate(y):
        seen[label] += 1
        test[i] = seen[label] % 5 == 0
    xtr, ytr = torch.from_numpy(x[~test]), torch.from_numpy(y[~test])
    xte, yte = torch.from_numpy(x[test]), torch.from_numpy(y[test])
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU()),
        torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU()),
        torch.nn.Linear(128, 10),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr), batch_size=64, shuffle=True)
    test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xte, yte), batch_size=500)
    for epoch in range(20):
        start = time.perf_counter()
        model.train()
        for xb, yb in train:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        correct = 0
        with torch.no_grad():
            for xb, yb in test_loader:
                correct += (model(xb).argmax(1) == yb).sum().item()
        print(f"epoch {epoch + 1} acc {100.0 * correct / len(yte):.2f} time {time.perf_counter() - start:.6f}")


def child_rss_mib():
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def run(cmd, env):
    # Each side runs in its own grandchild so RUSAGE_CHILDREN's maximum is that side's alone.
    probe = [sys.executable, "-c",
             "import resource,subprocess,sys; r=subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(r.stdout); print(r.stderr, file=sys.stderr); "
             "print('MAXRSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)"] + cmd
    r = subprocess.run(probe, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed:\n{r.stdout}\n{r.stderr}")
    rss = int(re.search(r"MAXRSS_KIB (\d+)", r.stdout).group(1)) / 1024.0
    return r.stdout, rss


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        torch_worker(int(sys.argv[2]))
        return
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        print("torch is not importable: measuring ferrite alone")
    print(f"digits MLP 64-128-128-10, batch 64, 20 epochs, {threads} threads, {rounds} rounds; load {os.getloadavg()[0]:.2f}")
    for rnd in range(rounds):
        out, rss = run([FERRITE, "train", "--no-progress", "--out", "/tmp/ferrite-bench-digits.safetensors"], env)
        times = []
        for line in out.splitlines():
            m = re.search(r"\| ([\d.]+) (ms|s)$", line)
            if line.startswith("epoch") and m:
                times.append(float(m.group(1)) * (1e-3 if m.group(2) == "ms" else 1.0))
        acc = re.search(r"test accuracy ([\d.]+)%", out).group(1)
        print(f"round {rnd + 1} ferrite: median epoch {1e3 * statistics.median(times):.2f} ms, test acc {acc}%, peak RSS {rss:.1f} MiB")
        if have_torch:
            out, rss = run([sys.executable, os.path.abspath(__file__), "--torch-worker", str(threads)], env)
            times = [float(t) for t in re.findall(r"time ([\d.]+)", out)]
            acc = re.findall(r"acc ([\d.]+)", out)[-1]
            print(f"round {rnd + 1} PyTorch: median epoch {1e3 * statistics.median(times):.2f} ms, test acc {acc}%, peak RSS {rss:.1f} MiB")


if __name__ == "__main__":
    main()
