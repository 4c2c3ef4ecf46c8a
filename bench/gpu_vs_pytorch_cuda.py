"""PyTorch CUDA side of `ferrite doctor --bench cuda:0` (and of `cargo bench -p ferrite-tensor
--bench device_kernels`): f32 matmul TFLOP/s at n^3 with TF32 disabled (so both sides do f32
arithmetic), bf16 matmul TFLOP/s, the caching allocator's allocate+free cost for a cache hit, and
a GPT-2-small training step in eager mode (transformers' GPT2LMHeadModel from GPT2Config(), random
init, seq 512, batch 8, torch.autocast bf16, AdamW): ms per step after warm-up and
torch.cuda.max_memory_reserved. Benchmark only; run on a machine with a CUDA GPU:

    python bench/gpu_vs_pytorch_cuda.py [--sizes 4096] [--bf16-sizes 8192] [--json]

`--json` prints one JSON object with the keys of `ferrite doctor --bench DEVICE --json`
(bench/compare_cuda_bench.py compares the two)."""
import argparse
import json
import time

import torch


def matmul(n, dtype, g):
    a = torch.randn(n, n, device="cuda", generator=g).to(dtype)
    b = torch.randn(n, n, device="cuda", generator=g).to(dtype)
    a @ b  # warm-up: library initialisation and kernel selection
    torch.cuda.synchronize()
    t = time.perf_counter()
    a @ b
    torch.cuda.synchronize()
    once = max(time.perf_counter() - t, 1e-9)
    # About 0.1 s per round, best of three rounds (as ferrite does).
    iters = min(200, max(1, int(0.1 / once + 0.999)))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(iters):
            a @ b
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / iters)
    return {"n": n, "tflops": 2.0 * n ** 3 / best / 1e12, "ms": best * 1e3}


def alloc_free(size, iters=100_000):
    torch.empty(size, dtype=torch.uint8, device="cuda")
    t = time.perf_counter()
    for _ in range(iters):
        torch.empty(size, dtype=torch.uint8, device="cuda")
    return {"bytes": size, "ns": (time.perf_counter() - t) / iters * 1e9}


def gpt2_step(args):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=args.gpt2_layers, n_embd=args.gpt2_hidden, n_head=args.gpt2_heads, vocab_size=args.gpt2_vocab
    )
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    g = torch.Generator(device="cuda").manual_seed(2)
    steps = args.gpt2_warmup + args.gpt2_steps
    batches = [
        torch.randint(0, args.gpt2_vocab, (args.gpt2_batch, args.gpt2_seq), device="cuda", generator=g)
        for _ in range(steps)
    ]
    stamps = []
    for ids in batches:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # ferrite's trainer reads every step's loss too
        stamps.append(time.perf_counter())
    ms = (stamps[-1] - stamps[args.gpt2_warmup - 1]) * 1e3 / args.gpt2_steps
    return {
        "layers": args.gpt2_layers,
        "hidden": args.gpt2_hidden,
        "heads": args.gpt2_heads,
        "vocab": args.gpt2_vocab,
        "seq": args.gpt2_seq,
        "batch": args.gpt2_batch,
        "warmup_steps": args.gpt2_warmup,
        "timed_steps": args.gpt2_steps,
        "amp": "bf16",
        "parameters": sum(p.numel() for p in model.parameters()),
        "ms_per_step": ms,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[4096], help="f32 matmul sizes")
    p.add_argument("--bf16-sizes", type=int, nargs="*", default=[8192], help="bf16 matmul sizes")
    p.add_argument("--gpt2-layers", type=int, default=12)
    p.add_argument("--gpt2-hidden", type=int, default=768)
    p.add_argument("--gpt2-heads", type=int, default=12)
    p.add_argument("--gpt2-vocab", type=int, default=50257)
    p.add_argument("--gpt2-seq", type=int, default=512)
    p.add_argument("--gpt2-batch", type=int, default=8)
    p.add_argument("--gpt2-warmup", type=int, default=3)
    p.add_argument("--gpt2-steps", type=int, default=10)
    p.add_argument("--no-gpt2", action="store_true", help="skip the training step (no transformers)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (torch.cuda.is_available() is False)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    say = (lambda *_: None) if args.json else print
    report = {
        "pytorch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": "cuda:0",
        "device_name": torch.cuda.get_device_name(0),
        "tf32": torch.backends.cuda.matmul.allow_tf32,
        "matmul_f32": [],
        "matmul_bf16": [],
        "alloc_free_ns": [],
        "gpt2_step": None,
    }
    say(f"device cuda:0 {report['device_name']} torch {torch.__version__} cuda {torch.version.cuda}")
    g = torch.Generator(device="cuda").manual_seed(0)
    for key, dtype, sizes in [("matmul_f32", torch.float32, args.sizes), ("matmul_bf16", torch.bfloat16, args.bf16_sizes)]:
        for n in sizes:
            r = matmul(n, dtype, g)
            report[key].append(r)
            say(f"{key} {n}: {r['tflops']:.2f} TFLOP/s ({r['ms']:.3f} ms per product)")
    for size in [4 << 10, 1 << 20, 64 << 20]:
        r = alloc_free(size)
        report["alloc_free_ns"].append(r)
        say(f"alloc+free {size} B {r['ns']:.0f} ns")
    if not args.no_gpt2:
        r = gpt2_step(args)
        report["gpt2_step"] = r
        say(
            f"GPT-2 step ({r['layers']} layers x {r['hidden']}, seq {r['seq']}, batch {r['batch']}, autocast bf16, AdamW): "
            f"{r['ms_per_step']:.1f} ms per step; peak reserved {r['peak_reserved_bytes'] / 2**20:.1f} MiB"
        )
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
