"""PyTorch side of `cargo bench -p ferrite-nn --bench lstm_step`: one nn.LSTM layer (batch 32,
input 256 -> hidden 512) over SEQ time steps, `y.square().mean()`, backward into the input and
the parameters, zero_grad — same shapes, loss and thread count. Run with the torch venv:
`python crates/ferrite-nn/benches/lstm_step.py [STEPS] [SEQ] [THREADS]`. Prints whether
PyTorch's CPU LSTM ran through oneDNN (mkldnn), its fast path. Benchmark only; never used by tests."""
import os
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
seq = int(sys.argv[2]) if len(sys.argv) > 2 else 16
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
torch.set_num_threads(threads)
torch.manual_seed(0)
B, I = 32, 256
H = int(os.environ.get("FERRITE_BENCH_LSTM_HIDDEN", "512"))
lstm = torch.nn.LSTM(I, H, 1)
x = torch.randn(seq, B, I, requires_grad=True)


def step():
    y, _ = lstm(x)
    loss = y.square().mean()
    loss.backward()
    lstm.zero_grad(set_to_none=True)
    x.grad = None
    return loss.item()


for _ in range(3):
    step()
times = []
for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append((time.perf_counter() - t) * 1e3)
times.sort()
grad_fn = lstm(x)[0].grad_fn.name()
print(f"pytorch {torch.__version__} lstm step (B{B} I{I} H{H} SEQ{seq}, mkldnn enabled {torch.backends.mkldnn.enabled}, output grad_fn {grad_fn}): median {times[len(times)//2]:.3f} ms (min {times[0]:.3f}) over {steps} steps, {torch.get_num_threads()} threads")
