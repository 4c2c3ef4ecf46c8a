"""Makes the PyTorch DDP fixture that crates/ferrite-parallel/tests/ddp_vs_pytorch.rs checks
ferrite's DistributedDataParallel against.

Real torch.distributed: two processes (torch.multiprocessing.spawn), the gloo backend on CPU,
rendezvous through a file. Each rank wraps the same small MLP in
torch.nn.parallel.DistributedDataParallel, trains it on its own rows for STEPS steps with each
optimizer, and rank 0 writes:

- ddp_gloo.safetensors (float32):
  init.<param>            the parameters every run starts from (PyTorch names: 0.weight, 0.bias,
                          2.weight, 2.bias of Linear(8,16)-Tanh-Linear(16,4))
  rank<r>.x, rank<r>.y    rank r's rows: step s uses rows [s*local_batch, (s+1)*local_batch)
  <case>.final.<param>    the parameters after STEPS DDP steps (identical on both ranks: checked)
  <case>.losses           [STEPS, world_size]: each rank's local loss before each step
- manifest.json: the settings (model, loss, steps, batch, optimizers) and the torch version.

The loss is MSE (mean over the local batch); DDP averages gradients over ranks, so one step equals
one step of a single process on the two ranks' rows concatenated (rank 0's first).

Run from this folder:  /path/to/python make_fixture.py   (needs torch and safetensors; no GPU)
"""

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2
IN, HIDDEN, OUT = 8, 16, 4
LOCAL_BATCH = 8
STEPS = 5
CASES = [
    {"name": "sgd_momentum", "optimizer": {"kind": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}},
    {
        "name": "adamw",
        "optimizer": {"kind": "adamw", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
    },
]
HERE = os.path.dirname(os.path.abspath(__file__))


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(WORLD, STEPS * LOCAL_BATCH, IN, generator=g)
    y = torch.randn(WORLD, STEPS * LOCAL_BATCH, OUT, generator=g)
    return x, y


def optimizer(spec, params):
    o = spec["optimizer"]
    if o["kind"] == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], weight_decay=o["weight_decay"])
    return torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"])


def worker(rank, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    x, y = data()
    tensors = {}
    init = model()
    tensors.update({f"init.{k}": v.detach().clone() for k, v in init.state_dict().items()})
    for r in range(WORLD):
        tensors[f"rank{r}.x"], tensors[f"rank{r}.y"] = x[r].clone(), y[r].clone()
    for case in CASES:
        m = model()
        ddp = DDP(m)
        opt = optimizer(case, ddp.parameters())
        losses = []
        for s in range(STEPS):
            rows = slice(s * LOCAL_BATCH, (s + 1) * LOCAL_BATCH)
            loss = torch.nn.functional.mse_loss(ddp(x[rank, rows]), y[rank, rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            both = [torch.zeros(1) for _ in range(WORLD)]
            dist.all_gather(both, loss.detach().reshape(1))
            losses.append(torch.cat(both))
        final = {k: v.detach().clone() for k, v in m.state_dict().items()}
        # The replicas must agree (DDP keeps them identical); compare with rank 0's.
        for k, v in final.items():
            r0 = v.clone()
            dist.broadcast(r0, 0)
            assert torch.equal(r0, v), f"rank {rank}: {case['name']} {k} differs from rank 0"
        tensors.update({f"{case['name']}.final.{k}": v for k, v in final.items()})
        tensors[f"{case['name']}.losses"] = torch.stack(losses)
    if rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "ddp_gloo.safetensors"))
        manifest = {
            "generator": f"torch {torch.__version__}, torch.distributed gloo, {WORLD} processes on CPU",
            "script": "make_fixture.py",
            "world_size": WORLD,
            "steps": STEPS,
            "local_batch": LOCAL_BATCH,
            "model": f"Linear({IN},{HIDDEN})-Tanh-Linear({HIDDEN},{OUT})",
            "params": list(init.state_dict().keys()),
            "loss": "mse_loss(mean) on each rank's local batch; DDP averages gradients over ranks",
            "cases": CASES,
        }
        with open(os.path.join(out_dir, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else HERE
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(os.path.join(tmp, "rendezvous"), out_dir), nprocs=WORLD, join=True)
    print(f"wrote {out_dir}/ddp_gloo.safetensors and manifest.json")
