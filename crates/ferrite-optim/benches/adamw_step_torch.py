"""PyTorch side of benches/adamw_step.rs: the same optimizer steps over ~4.2M float32 params.

    /work/torch-venv/bin/python crates/ferrite-optim/benches/adamw_step_torch.py
"""
import time
import torch

torch.set_num_threads(2)
torch.manual_seed(0)
ps = []
for _ in range(8):
    p = torch.nn.Parameter(torch.randn(512, 1024))
    p.grad = torch.randn(512, 1024) * 1e-3
    ps.append(p)
numel = sum(p.numel() for p in ps)


def bench(name, opt):
    for _ in range(5):
        opt.step()
    t = []
    for _ in range(30):
        s = time.perf_counter()
        opt.step()
        t.append((time.perf_counter() - s) * 1e3)
    t.sort()
    print(f"{name:<40} {numel} params: median {t[len(t)//2]:.2f} ms, min {t[0]:.2f} ms")


print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
bench("AdamW default (single-tensor on CPU)", torch.optim.AdamW(ps, lr=1e-3))
bench("AdamW foreach=True", torch.optim.AdamW(ps, lr=1e-3, foreach=True))
bench("AdamW fused=True", torch.optim.AdamW(ps, lr=1e-3, fused=True))
bench("SGD momentum default", torch.optim.SGD(ps, lr=1e-3, momentum=0.9))
bench("SGD momentum foreach=True", torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True))
bench("SGD momentum fused=True", torch.optim.SGD(ps, lr=1e-3, momentum=0.9, fused=True))
