"""PyTorch half of bench/dataloader_vs_pytorch.sh: the same synthetic workload as
crates/ferrite-data/benches/dataloader_throughput.rs, through torch.utils.data.DataLoader.

Sample i busy-waits --sample-us microseconds, then returns a 784-float tensor equal to i and the
label i % 10; the default collate stacks a batch into [batch, 784] + [batch]. One warm-up epoch,
then --epochs timed epochs of --batches batches. Workers are persistent (started during the
warm-up), which favours PyTorch: its process start-up is not timed, while ferrite's thread
start-up is.
"""
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

FEATURES = 784


class Synthetic(Dataset):
    def __init__(self, length, cost_ns):
        self.length = length
        self.cost_ns = cost_ns

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        end = time.perf_counter_ns() + self.cost_ns
        while time.perf_counter_ns() < end:
            pass
        return torch.full((FEATURES,), float(i)), i % 10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="0,2")
    p.add_argument("--sample-us", type=float, default=5)
    p.add_argument("--batches", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    for workers in [int(w) for w in a.workers.split(",")]:
        ds = Synthetic(a.batches * a.batch_size, int(a.sample_us * 1000))
        g = torch.Generator()
        g.manual_seed(0)
        loader = DataLoader(ds, batch_size=a.batch_size, shuffle=True, generator=g, num_workers=workers,
                            persistent_workers=workers > 0)
        checksum = 0.0

        def run_epoch():
            nonlocal checksum
            start = time.perf_counter()
            n = 0
            for x, y in loader:
                checksum += float(x[0, 0]) + len(y)
                n += 1
            return n / (time.perf_counter() - start)

        run_epoch()  # warm-up (starts the persistent workers)
        rates = [run_epoch() for _ in range(a.epochs)]
        print(f"pytorch {torch.__version__} workers={workers} batch_size={a.batch_size} sample_us={a.sample_us:g} "
              f"batches/epoch={a.batches} batches/s mean={sum(rates) / len(rates):.0f} best={max(rates):.0f} "
              f"(checksum {checksum:.0f})")


if __name__ == "__main__":
    main()
