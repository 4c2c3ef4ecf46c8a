#!/usr/bin/env python3
"""Builds the PyTorch memory-snapshot fixtures of ferrite's tests.

No GPU was available, so these are NOT written by torch.cuda.memory._dump_snapshot(); they are
plain `pickle` dumps of dicts in exactly the structure PyTorch writes (torch/csrc/cuda/
memory_snapshot.cpp, torch/cuda/_memory_viz.py): top keys `segments`, `device_traces`,
`allocator_settings`; trace entries `action`/`addr`/`size`/`stream`/`time_us`/`frames`
(`device_free` instead of `addr` for `oom`). Segment events come from a small model of the CUDA
caching allocator's default rules (below), so the "recorded" numbers are what PyTorch with default
settings would have reserved for these requests (within the model: one stream, no OOM retries).
Run: python3 make_snapshots.py  (writes the *.pickle files beside this script; needs only the
standard library). Real-GPU snapshots (torch.cuda.memory._dump_snapshot on a CUDA machine) are
still to come; put them beside these with the script that made them.
"""
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
BASE = [0x7F0000000000, 0x7E0000000000]
STREAM = 0  # the default stream


def round_size(n):
    return 512 if n < 512 else (n + 511) // 512 * 512


def segment_size(n):
    if n <= MiB:
        return 2 * MiB
    if n < 10 * MiB:
        return 20 * MiB
    return (n + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)


class Allocator:
    """Best-fit over cached free blocks, split when the rest is big enough, merge on free."""

    def __init__(self, device, version):
        self.device = device
        self.version = version
        self.next_addr = BASE[device]
        self.segments = []  # dicts: address, total_size, small, blocks [ [addr, size, req or None] ]
        self.trace = []
        self.time = 1_700_000_000_000_000

    def frames(self, name):
        return [{"filename": "train.py", "line": 42, "name": name}, {"filename": "model.py", "line": 7, "name": "forward"}]

    def entry(self, action, addr, size, name="step"):
        self.time += 13
        e = {"action": action, "addr": addr, "size": size, "stream": STREAM, "frames": self.frames(name)}
        if action == "oom":
            e["device_free"] = e.pop("addr")
        if self.version != "2.0":
            e["time_us"] = self.time
        self.trace.append(e)
        return e

    def malloc(self, req, category=None):
        size = round_size(req)
        small = size <= MiB
        best = None
        for seg in self.segments:
            if seg["small"] != small:
                continue
            for b in seg["blocks"]:
                if b[2] is None and b[1] >= size and (best is None or b[1] < best[1][1]):
                    best = (seg, b)
        if best is None:
            total = segment_size(size)
            seg = {"address": self.next_addr, "total_size": total, "small": small, "blocks": [[self.next_addr, total, None]]}
            self.next_addr += total + 64 * MiB
            self.segments.append(seg)
            self.entry("segment_alloc", seg["address"], total, "malloc")
            best = (seg, seg["blocks"][0])
        seg, b = best
        rest = b[1] - size
        if rest >= (512 if small else MiB + 1):
            i = seg["blocks"].index(b)
            seg["blocks"].insert(i + 1, [b[0] + size, rest, None])
            b[1] = size
        b[2] = req
        e = self.entry("alloc", b[0], req)
        if category is not None:
            e["category"] = category
        return b[0]

    def free(self, addr):
        for seg in self.segments:
            for i, b in enumerate(seg["blocks"]):
                if b[0] == addr and b[2] is not None:
                    self.entry("free_requested", addr, b[2])
                    self.entry("free_completed", addr, b[2])
                    b[2] = None
                    blocks = seg["blocks"]
                    if i + 1 < len(blocks) and blocks[i + 1][2] is None:
                        b[1] += blocks.pop(i + 1)[1]
                    if i > 0 and blocks[i - 1][2] is None:
                        blocks[i - 1][1] += blocks.pop(i)[1]
                    return
        raise KeyError(addr)

    def empty_cache(self):
        for seg in list(self.segments):
            if len(seg["blocks"]) == 1 and seg["blocks"][0][2] is None:
                self.entry("segment_free", seg["address"], seg["total_size"], "empty_cache")
                self.segments.remove(seg)

    def snapshot_segments(self):
        out = []
        for seg in sorted(self.segments, key=lambda s: s["address"]):
            blocks = []
            for addr, size, req in seg["blocks"]:
                state = "inactive" if req is None else "active_allocated"
                if self.version == "2.0":
                    b = {"size": size, "state": state}
                    if req is not None:
                        b["history"] = [{"addr": addr, "real_size": req, "frames": self.frames("step")}]
                else:
                    b = {"address": addr, "size": size, "requested_size": req or 0, "state": state,
                         "frames": self.frames("step") if req else []}
                blocks.append(b)
            allocated = sum(b[1] for b in seg["blocks"] if b[2] is not None)
            s = {"device": self.device, "address": seg["address"], "total_size": seg["total_size"],
                 "allocated_size": allocated, "active_size": allocated,
                 "requested_size": sum(b[2] for b in seg["blocks"] if b[2] is not None),
                 "stream": STREAM, "segment_type": "small" if seg["small"] else "large",
                 "blocks": blocks}
            if self.version != "2.0":
                s["segment_pool_id"] = (0, 0)
                s["is_expandable"] = False
                s["frames"] = self.frames("malloc")
            out.append(s)
        return out


def settings():
    return {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
            "expandable_segments": False, "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}


def variable_length_training(a, steps=6):
    """Weights kept; per step activations whose size follows a varying sequence length, freed in
    reverse, with a long-lived tensor allocated mid-step: the pattern that strands split blocks."""
    weights = [a.malloc(48 * MiB + 123, "parameter") for _ in range(3)]
    kept = []
    for step in range(steps):
        seq = [3, 7, 5, 8, 4, 6][step % 6]
        acts = [a.malloc(seq * 9 * MiB + 4000 * i, "activation") for i in range(4)]
        kept.append(a.malloc(seq * 5 * MiB, "optimizer_state"))
        small = [a.malloc(4096 * (i + 1), "temporary") for i in range(5)]
        for x in reversed(acts):
            a.free(x)
        for x in small:
            a.free(x)
        if len(kept) > 2:
            a.free(kept.pop(0))
    return weights


class RunsCode:
    """Unpickles as a call to os.system (never loaded here; ferrite must refuse it)."""

    def __reduce__(self):
        return (os.system, ("echo this snapshot ran a command",))


def write(name, obj):
    with open(os.path.join(HERE, name), "wb") as f:
        pickle.dump(obj, f)  # the default protocol, as torch.cuda.memory._dump_snapshot does


def main():
    # PyTorch 2.1+ layout, one device, categories absent (what _record_memory_history gives).
    a = Allocator(0, "2.1")
    variable_length_training(a)
    for e in a.trace:
        e.pop("category", None)
    write("fragmentation_v2_1.pickle", {"segments": a.snapshot_segments(), "device_traces": [a.trace],
                                        "allocator_settings": settings()})

    # PyTorch 2.0 layout: block `history`, no time_us, no allocator_settings. Recording starts
    # after two blocks exist: one is freed inside the trace, one is still live at the end.
    a = Allocator(0, "2.0")
    early = a.malloc(30 * MiB)
    still = a.malloc(12 * MiB)
    a.trace.clear()
    x = a.malloc(8 * MiB)
    a.free(early)
    y = a.malloc(25 * MiB)
    a.free(x)
    a.empty_cache()
    del still, y
    write("block_history_v2_0.pickle", {"segments": a.snapshot_segments(), "device_traces": [a.trace]})

    # Two devices with categories (profile_plot-style entries), 2.1+ layout.
    a0, a1 = Allocator(0, "2.1"), Allocator(1, "2.1")
    variable_length_training(a0, steps=3)
    variable_length_training(a1, steps=4)
    write("two_devices_v2_1.pickle", {"segments": a0.snapshot_segments() + a1.snapshot_segments(),
                                      "device_traces": [a0.trace, a1.trace], "allocator_settings": settings()})

    # Bad inputs: PyTorch 1.x memory_snapshot() (a bare list of segments), a dict of an unknown
    # layout, and a truncated pickle.
    write("segments_only_v1.pickle", a0.snapshot_segments())
    write("unknown_layout.pickle", {"version": 9, "blocks": []})
    # A snapshot-shaped pickle that would run a shell command when loaded with Python's pickle.
    write("runs_code.pickle", {"segments": [], "device_traces": [[RunsCode()]]})
    good = pickle.dumps({"segments": a0.snapshot_segments(), "device_traces": [a0.trace]})
    with open(os.path.join(HERE, "truncated.pickle"), "wb") as f:
        f.write(good[: len(good) // 2])


if __name__ == "__main__":
    main()
