"""Counts parameters and DeepSpeed's largest layer of the T5 configs here with transformers, on
the meta device (no weights are downloaded or created), and writes <config>.counts.txt:
line 1 the unique parameter count, line 2 the largest module's own parameters (DeepSpeed's
`model_to_params`), then every parameter name of T5ForConditionalGeneration.
Run: /work/torch-venv/bin/python count_t5.py (needs `pip install transformers`; made with 5.24).

Only the tied (T5 v1.0 style) configs: transformers 5 forces `tie_word_embeddings = True` for every
T5 config (configuration_t5.py keeps the flag only to decide the output scaling), so it cannot
count the separate `lm_head` that t5-v1_1 checkpoints carry (76,961,152 parameters for
t5-v1_1-small; transformers 5 reports 60,511,616)."""
import json, sys, pathlib, torch
from transformers import T5Config, T5ForConditionalGeneration

here = pathlib.Path(__file__).parent
for name in sys.argv[1:] or ["t5-small", "t5-3b", "tiny-t5"]:
    cfg = T5Config(**json.loads((here / f"{name}.json").read_text()))
    with torch.device("meta"):
        model = T5ForConditionalGeneration(cfg)
    total = sum(dict((id(p), p.numel()) for p in model.parameters()).values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    names = [n for n, _ in model.named_parameters()]
    (here / f"{name}.counts.txt").write_text("\n".join([str(total), str(largest)] + names) + "\n")
    print(name, total, largest, len(names))
