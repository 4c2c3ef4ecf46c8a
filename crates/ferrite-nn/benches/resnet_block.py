"""PyTorch side of `cargo bench -p ferrite-nn --bench resnet_block`: a ResNet basic block
(conv3x3-bn-relu-conv3x3-bn + identity, relu), 64 channels, 32x32, batch 32; `y.square().mean()`,
backward into the input and the parameters, zero_grad — same shapes, loss and thread count.
`python crates/ferrite-nn/benches/resnet_block.py [STEPS] [THREADS]`. Benchmark only."""
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
torch.set_num_threads(threads)
torch.manual_seed(0)
B, C, HW = 32, 64, 32
nn = torch.nn
body = nn.Sequential(nn.Conv2d(C, C, 3, padding=1, bias=False), nn.BatchNorm2d(C), nn.ReLU(),
                     nn.Conv2d(C, C, 3, padding=1, bias=False), nn.BatchNorm2d(C))
x = torch.randn(B, C, HW, HW, requires_grad=True)


def step():
    y = torch.relu(body(x) + x)
    loss = y.square().mean()
    loss.backward()
    body.zero_grad(set_to_none=True)
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
print(f"pytorch {torch.__version__} resnet basic block step (B{B} C{C} {HW}x{HW}, mkldnn enabled {torch.backends.mkldnn.enabled}): median {times[len(times)//2]:.3f} ms (min {times[0]:.3f}) over {steps} steps, {torch.get_num_threads()} threads")
