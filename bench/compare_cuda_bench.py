"""Issue 31's speed and memory targets, from the two JSON objects of one GPU check:
`ferrite doctor --bench cuda:0 --json` (FERRITE) and `bench/gpu_vs_pytorch_cuda.py --json`
(PYTORCH). One line per target: ferrite, pytorch, ratio, target, MET or MISSED (NOT MEASURED when
a side lacks the figure).

    python bench/compare_cuda_bench.py FERRITE.json PYTORCH.json [--f32-n 4096] [--bf16-n 8192]

(`--f32-n`/`--bf16-n`: the matmul sizes compared; the targets are at the defaults.)

Targets (H100): matmul f32 (TF32 off) at 4096 and bf16 at 8192 >= 0.9x PyTorch's TFLOP/s; the
GPT-2-small training step (seq 512, batch 8, bf16 autocast) <= 1.3x PyTorch eager's ms; allocate +
free through the caching allocator <= PyTorch's ns (each size); ferrite's predicted peak reserved
(the planner, on the sim device the bench names) within 2 % of the peak measured on cuda:0.

A missed target is a benchmark result, not a failure: the exit status is 0 whenever both files
were read (2 when one cannot be), so the GPU check records the misses in its report."""
import argparse
import json
import sys

F32_N, BF16_N = 4096, 8192
MATMUL_MIN, STEP_MAX, ALLOC_MAX, PLAN_ERR_MAX = 0.9, 1.3, 1.0, 0.02


def by_key(points, key):
    return {p[key]: p for p in points or []}


def rows(fe, pt, f32_n=F32_N, bf16_n=BF16_N):
    """(what, ferrite, pytorch, ratio, target, verdict) per target."""
    out = []

    def add(what, f, p, ratio_of, bound, higher_is_better, unit, target_text):
        if f is None or p is None or p == 0:
            out.append((what, fmt(f, unit), fmt(p, unit), "-", target_text, "NOT MEASURED"))
            return
        ratio = ratio_of(f, p)
        ok = ratio >= bound if higher_is_better else ratio <= bound
        out.append((what, fmt(f, unit), fmt(p, unit), f"{ratio:.3f}", target_text, "MET" if ok else "MISSED"))

    for key, n, label in [("matmul_f32", f32_n, "matmul f32 (TF32 off)"), ("matmul_bf16", bf16_n, "matmul bf16")]:
        f, p = by_key(fe.get(key), "n").get(n), by_key(pt.get(key), "n").get(n)
        add(
            f"{label} {n}",
            f and f["tflops"],
            p and p["tflops"],
            lambda a, b: a / b,
            MATMUL_MIN,
            True,
            "TFLOP/s",
            f">= {MATMUL_MIN}x",
        )
    if fe.get("tf32"):
        out.append(("  note", "ferrite ran with FERRITE_ALLOW_TF32=1", "", "", "", "the f32 row is not f32 arithmetic"))
    fs, ps = fe.get("gpt2_step") or {}, pt.get("gpt2_step") or {}
    shape = ["layers", "hidden", "seq", "batch"]
    if fs and ps and [fs.get(k) for k in shape] != [ps.get(k) for k in shape]:
        out.append(("  note", "GPT-2 steps of different shapes", "", "", "", "the step row compares unlike runs"))
    add(
        "GPT-2 step (seq {}, batch {}, bf16) ms".format(fs.get("seq", "?"), fs.get("batch", "?")),
        fs.get("ms_per_step"),
        ps.get("ms_per_step"),
        lambda a, b: a / b,
        STEP_MAX,
        False,
        "ms",
        f"<= {STEP_MAX}x",
    )
    fa, pa = by_key(fe.get("alloc_free_ns"), "bytes"), by_key(pt.get("alloc_free_ns"), "bytes")
    for size in sorted(set(fa) | set(pa)):
        add(
            f"allocate+free {size} B",
            fa.get(size, {}).get("ns"),
            pa.get(size, {}).get("ns"),
            lambda a, b: a / b,
            ALLOC_MAX,
            False,
            "ns",
            f"<= {ALLOC_MAX}x",
        )
    predicted, measured = fs.get("predicted_peak_reserved_bytes"), fs.get("peak_reserved_bytes")
    add(
        "ferrite peak reserved: predicted on {} | measured on {}".format(fs.get("planned_on", "?"), fe.get("device", "?")),
        predicted,
        measured,
        lambda a, b: (a - b) / b,
        PLAN_ERR_MAX,
        False,
        "B",
        f"|error| <= {PLAN_ERR_MAX:.0%}",
    )
    # The error is signed; the target is on its size.
    last = out[-1]
    if last[5] in ("MET", "MISSED"):
        err = abs(float(last[3]))
        out[-1] = last[:5] + ("MET" if err <= PLAN_ERR_MAX else "MISSED",)
    if ps.get("peak_reserved_bytes") and measured is not None:
        out.append(
            (
                "  peak reserved, ferrite vs PyTorch",
                fmt(measured, "B"),
                fmt(ps["peak_reserved_bytes"], "B"),
                f"{measured / ps['peak_reserved_bytes']:.3f}",
                "(for information)",
                "",
            )
        )
    return out


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "B":
        return f"{v / 2**20:.1f} MiB"
    return f"{v:.3g} {unit}"


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ferrite", help="ferrite doctor --bench cuda:0 --json")
    p.add_argument("pytorch", help="bench/gpu_vs_pytorch_cuda.py --json")
    p.add_argument("--f32-n", type=int, default=F32_N)
    p.add_argument("--bf16-n", type=int, default=BF16_N)
    args = p.parse_args(argv[1:])
    try:
        fe, pt = (json.load(open(path)) for path in (args.ferrite, args.pytorch))
    except (OSError, ValueError) as e:
        print(f"cannot read the benchmark JSON: {e}", file=sys.stderr)
        return 2
    table = rows(fe, pt, args.f32_n, args.bf16_n)
    header = ("target", "ferrite", "pytorch", "ratio", "target", "verdict")
    widths = [max(len(str(r[i])) for r in table + [header]) for i in range(6)]
    print(f"ferrite {fe.get('ferrite', '?')} on {fe.get('device_name', '?')}; PyTorch {pt.get('pytorch', '?')} (CUDA {pt.get('cuda', '?')}) on {pt.get('device_name', '?')}")
    for r in [header] + table:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    verdicts = [r[5] for r in table if r[5] in ("MET", "MISSED", "NOT MEASURED")]
    print(
        f"{verdicts.count('MET')} met, {verdicts.count('MISSED')} missed, {verdicts.count('NOT MEASURED')} not measured "
        "(benchmark results: a miss does not fail the check)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
