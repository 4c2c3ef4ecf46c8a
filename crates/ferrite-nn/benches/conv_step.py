"""PyTorch side of `cargo bench -p ferrite-nn --bench conv_step`: the same Conv2d(3, 64, 3,
padding=1) training step (forward, y.square().mean(), backward, zero_grad) on a [32, 3, 32, 32]
input, same thread count. `python crates/ferrite-nn/benches/conv_step.py [STEPS] [THREADS]
[input-grad]` with the torch venv (`FERRITE_BENCH_CONV=CIN,COUT,HW` for another shape). Benchmark only; never used by tests."""
import os
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
input_grad = "input-grad" in sys.argv[3:]
torch.set_num_threads(threads)
torch.manual_seed(0)
B, K = 32, 3
CIN, COUT, HW = (int(v) for v in os.environ.get("FERRITE_BENCH_CONV", "3,64,32").split(","))
conv = torch.nn.Conv2d(CIN, COUT, K, padding=1)
x = torch.randn(B, CIN, HW, HW).requires_grad_(input_grad)


def step():
    y = conv(x)
    loss = y.square().mean()
    loss.backward()
    conv.zero_grad(set_to_none=True)
    x.grad = None
    return loss.item()


for _ in range(3):
    step()
times = []
for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append((time.perf_counter() - t) * 1e3)
fwd = []
with torch.no_grad():
    for _ in range(steps):
        t = time.perf_counter()
        conv(x)
        fwd.append((time.perf_counter() - t) * 1e3)
times.sort()
fwd.sort()
print(
    f"pytorch {torch.__version__} conv2d step on cpu (B{B} {CIN}->{COUT} {HW}x{HW} k{K} p1, input grad {input_grad}): "
    f"median {times[len(times) // 2]:.2f} ms (min {times[0]:.2f}) over {steps} steps; forward median {fwd[len(fwd) // 2]:.2f} ms; "
    f"{torch.get_num_threads()} threads"
)
