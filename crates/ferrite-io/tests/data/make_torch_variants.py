"""Writes the PyTorch files of tests/data/ and their oracle, expected_variants.json.

Run once with real PyTorch (the files are committed; tests never run Python):
    /work/torch-venv/bin/python crates/ferrite-io/tests/data/make_torch_variants.py

They cover what the shared reference folder does not: pickle protocols 4 and 5, nn.Parameter
objects, integer/bool/uint8 tensors and 0-d buffers (BatchNorm's num_batches_tracked), a tensor
saved as a non-contiguous view, torch.device/torch.Size/dtype values, GradScaler and RNG state,
and a numpy scalar (which a weights-only loader must refuse).
"""
import json, os
import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(1234)
expected = {"generator": f"torch {torch.__version__}", "files": {}}


def describe(obj, prefix=""):
    """Flattens tensors to {path: {dtype, shape, sum, values(if small)}} with '/'-joined paths."""
    out = {}
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        d = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "sum": float(t.double().sum())}
        if t.numel() <= 64:
            d["values"] = [float(x) for x in t.double().reshape(-1).tolist()]
        d["requires_grad"] = bool(obj.requires_grad)
        out[prefix] = d
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(describe(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(describe(v, f"{prefix}/{i}" if prefix else str(i)))
    return out


def save(name, obj, **kw):
    path = os.path.join(here, name)
    torch.save(obj, path, **kw)
    expected["files"][name] = describe(obj)


model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
model(torch.randn(5, 3))  # updates BatchNorm running stats and num_batches_tracked
sd = model.state_dict()
save("protocol4_state_dict.pt", sd, pickle_protocol=4)
save("protocol5_state_dict.pt", sd, pickle_protocol=5)
grid = torch.arange(12.0).reshape(3, 4)
save("legacy_protocol2_views.pt", {"base": grid, "t": grid.t(), "row": grid[1]}, _use_new_zipfile_serialization=False)

params = dict(model.named_parameters())  # nn.Parameter objects, requires_grad=True
save("parameters.pt", params)

base = torch.arange(20, dtype=torch.float64).reshape(4, 5)
save("mixed_dtypes.pt", {
    "f64_view": base[1:, ::2],                # offset 5, strides (5, 2): non-contiguous
    "expanded": torch.tensor([1.0, 2.0]).expand(3, 2),  # stride 0
    "i64": torch.tensor([-(2**62), 7, 2**40]),
    "i32": torch.tensor([-5, 6], dtype=torch.int32),
    "u8": torch.tensor([0, 200, 255], dtype=torch.uint8),
    "mask": torch.tensor([True, False, True]),
    "scalar": torch.tensor(3.5),
    "empty": torch.zeros(0, 3),
    "device": torch.device("cpu"),
    "size": torch.Size([2, 3]),
    "dtype": torch.float16,
})

scaler = {"scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 17}
save("trainer_state.pt", {"scaler": scaler, "rng": torch.get_rng_state(), "step": 1234, "name": "run-7"})

# A numpy scalar, as scripts often store a best metric; PyTorch's weights-only load refuses it too.
torch.save({"best_acc": np.float64(0.91)}, os.path.join(here, "numpy_scalar.pt"))

with open(os.path.join(here, "expected_variants.json"), "w") as f:
    json.dump(expected, f, indent=1, sort_keys=True)
print("wrote", sorted(expected["files"]))
