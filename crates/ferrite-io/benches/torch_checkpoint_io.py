"""PyTorch's side of the checkpoint I/O benchmark (see checkpoint_io.rs): the same 1 GiB float32
state_dict saved with torch.save and loaded with torch.load. Run with the torch venv:

    /work/torch-venv/bin/python crates/ferrite-io/benches/torch_checkpoint_io.py [DIR]

DIR defaults to /tmp/ferrite-io-bench; torch_1g.pt is left there for the Rust bench to read.
Each figure is the median of 5 runs, warm page cache.
"""
import os, sys, time, statistics
import torch

GIB = float(1 << 30)
d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ferrite-io-bench"
os.makedirs(d, exist_ok=True)
torch.manual_seed(0)
sd = {}
for layer in range(64):
    w = torch.rand(2048, 2048) - 0.5
    sd[f"layers.{layer}.weight"] = w
    sd[f"layers.{layer}.bias"] = w[0].clone()
nbytes = sum(t.numel() * t.element_size() for t in sd.values())
print(f"state_dict: {len(sd)} tensors, {nbytes / GIB:.3f} GiB of float32 (torch {torch.__version__})")
path = os.path.join(d, "torch_1g.pt")


def bench(what, f, runs=5):
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    s = statistics.median(ts)
    print(f"{what:<58} {s:>8.3f} s  {nbytes / GIB / s:>7.2f} GiB/s")


bench("torch.save (zip, no fsync)", lambda: torch.save(sd, path))


def save_fsync():
    with open(path, "wb") as f:
        torch.save(sd, f)
        f.flush()
        os.fsync(f.fileno())


bench("torch.save + fsync", save_fsync)
bench("torch.load (weights_only=True, reads into memory)", lambda: torch.load(path))
bench("torch.load(mmap=True)", lambda: torch.load(path, mmap=True))
