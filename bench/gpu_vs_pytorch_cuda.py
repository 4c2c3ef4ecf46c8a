"""PyTorch CUDA side of `cargo bench -p ferrite-tensor --bench device_kernels`: f32 matmul GFLOP/s
at n^3 with TF32 disabled (so both sides do f32 arithmetic) and the caching allocator's
allocate+free cost for a cache hit. Benchmark only; run on a machine with a CUDA GPU:
`python bench/gpu_vs_pytorch_cuda.py [SIZES...]`."""
import sys
import time

import torch

assert torch.cuda.is_available(), "needs a CUDA GPU"
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
sizes = [int(s) for s in sys.argv[1:]] or [1024, 4096, 8192]
print(f"device cuda:0 {torch.cuda.get_device_name(0)} torch {torch.__version__}")
g = torch.Generator(device="cuda").manual_seed(0)
for n in sizes:
    a = torch.randn(n, n, device="cuda", generator=g)
    b = torch.randn(n, n, device="cuda", generator=g)
    a @ b
    torch.cuda.synchronize()
    flops = 2.0 * n ** 3
    iters = min(50, max(1, int(2e11 / flops + 0.999)))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(iters):
            c = a @ b
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / iters)
    print(f"matmul {n} {flops / best / 1e9:.1f} GFLOP/s ({best * 1e3:.3f} ms per product)")
for size in [4 << 10, 1 << 20, 64 << 20]:
    torch.empty(size, dtype=torch.uint8, device="cuda")
    iters = 100_000
    t = time.perf_counter()
    for _ in range(iters):
        torch.empty(size, dtype=torch.uint8, device="cuda")
    print(f"alloc+free {size} B {(time.perf_counter() - t) / iters * 1e9:.0f} ns")
