"""Learning-rate sequences from PyTorch's schedulers, for tests/lr_schedule_parity.rs.

Run with a PyTorch install (not needed by the tests, which embed the output):
    python gen_lr_reference.py > lr_reference.json
Each entry: the lr of each of two parameter groups right after construction and after each
of `steps` scheduler.step() calls (optimizer.step() called before each).
"""
import json
import torch
from torch.optim.lr_scheduler import StepLR, LinearLR, CosineAnnealingLR, SequentialLR


def run(make, steps):
    p1 = torch.nn.Parameter(torch.zeros(2))
    p2 = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": [p1], "lr": 0.1}, {"params": [p2], "lr": 0.03}], lr=0.1, momentum=0.9)
    sched = make(opt)
    out = [[g["lr"] for g in opt.param_groups]]
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append([g["lr"] for g in opt.param_groups])
    return out


cases = {
    "step_lr": run(lambda o: StepLR(o, step_size=3, gamma=0.5), 10),
    "linear_lr": run(lambda o: LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=4), 8),
    "cosine": run(lambda o: CosineAnnealingLR(o, T_max=5, eta_min=0.001), 14),
    "warmup_cosine": run(
        lambda o: SequentialLR(
            o,
            [LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=3), CosineAnnealingLR(o, T_max=7, eta_min=0.0)],
            milestones=[3],
        ),
        12,
    ),
}
print(json.dumps({"torch": torch.__version__, "cases": cases}, indent=1))
