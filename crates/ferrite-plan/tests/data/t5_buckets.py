"""Writes t5-buckets.txt: transformers' T5Attention._relative_position_bucket for relative
positions -300..300, both directions, (32 buckets, distance 128) and (8, 16), one line each:
`num_buckets max_distance bidirectional relative bucket`.
Run: /work/torch-venv/bin/python t5_buckets.py (needs `pip install transformers`; made with 5.24)."""
import pathlib, torch
from transformers.models.t5.modeling_t5 import T5Attention

rp = torch.arange(-300, 301)
lines = []
for nb, md in [(32, 128), (8, 16)]:
    for bi in (True, False):
        b = T5Attention._relative_position_bucket(rp, bidirectional=bi, num_buckets=nb, max_distance=md)
        lines += [f"{nb} {md} {int(bi)} {int(r)} {int(x)}" for r, x in zip(rp, b)]
(pathlib.Path(__file__).parent / "t5-buckets.txt").write_text("\n".join(lines) + "\n")
