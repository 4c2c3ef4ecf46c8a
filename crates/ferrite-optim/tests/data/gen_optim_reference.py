"""Optimizer variants not covered by the shared fixtures (nesterov, dampening, maximize,
AMSGrad, L2 vs decoupled decay), for tests/optimizer_variants.rs.

Run with a PyTorch install (the tests embed the output, they never import torch):
    python gen_optim_reference.py > optim_reference.json
Each case: a 37-element float32 parameter, 6 steps with given gradients (set directly), the
parameter after every step and the final state tensors.
"""
import json
import torch

torch.manual_seed(0)
N, STEPS = 37, 6
init = torch.randn(N)
grads = [torch.randn(N) * (0.1 + i) for i in range(STEPS)]


def run(make):
    p = torch.nn.Parameter(init.clone())
    opt = make([p])
    traj = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        traj.append(p.detach().tolist())
    st = opt.state[p]
    state = {k: (v.tolist() if torch.is_tensor(v) else v) for k, v in st.items()}
    return {"trajectory": traj, "state": state}


SGD, Adam, AdamW = torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW
cases = {
    "sgd_plain": run(lambda ps: SGD(ps, lr=0.05)),
    "sgd_plain_wd_maximize": run(lambda ps: SGD(ps, lr=0.05, weight_decay=0.1, maximize=True)),
    "sgd_dampening": run(lambda ps: SGD(ps, lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    "sgd_nesterov": run(lambda ps: SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02)),
    "adam_l2": run(lambda ps: Adam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    "adam_amsgrad_maximize": run(lambda ps: Adam(ps, lr=0.02, amsgrad=True, maximize=True)),
    "adamw_amsgrad": run(lambda ps: AdamW(ps, lr=0.03, weight_decay=0.1, amsgrad=True)),
    "adamw_beta1_large": run(lambda ps: AdamW(ps, lr=0.01, betas=(0.3, 0.9))),
}
print(json.dumps({"torch": torch.__version__, "init": init.tolist(), "grads": [g.tolist() for g in grads], "cases": cases}))
