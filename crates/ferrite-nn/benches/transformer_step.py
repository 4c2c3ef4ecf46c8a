"""PyTorch side of `cargo bench -p ferrite-nn --bench transformer_step`: the same pre-norm block
(nn.TransformerEncoderLayer(norm_first=True, activation="gelu", batch_first=True)), shapes, loss
and thread count. Run with the torch venv: `python crates/ferrite-nn/benches/transformer_step.py [STEPS] [THREADS] [DEVICE]`
(DEVICE `cuda` for the GPU comparison: eager mode, TF32 off, synchronised by `loss.item()`).
Benchmark only; never used by tests."""
import resource
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
torch.set_num_threads(threads)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
B, L, D, H, FF = 32, 128, 256, 4, 1024
block = torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.1, activation="gelu", batch_first=True, norm_first=True).to(device)
block.train()
x = torch.randn(B, L, D, device=device)


def step():
    y = block(x)
    loss = y.square().mean()
    loss.backward()
    block.zero_grad(set_to_none=True)
    return loss.item()


for _ in range(2):
    step()
times = []
for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append((time.perf_counter() - t) * 1e3)
times.sort()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"pytorch {torch.__version__} transformer step on {device} (B{B} L{L} D{D} H{H} FF{FF}): median {times[len(times)//2]:.1f} ms (min {times[0]:.1f}) over {steps} steps, {torch.get_num_threads()} threads; peak RSS {rss:.1f} MiB")
