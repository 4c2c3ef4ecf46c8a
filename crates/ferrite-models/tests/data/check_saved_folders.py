"""transformers loads the folders ferrite writes (issue 27 §2): no missing, unexpected or
mismatched keys, and the same logits as the original fixture.

    FERRITE_HF_SAVE_TO=/tmp/saved cargo test --release -p ferrite-models --test hf_parity
    (T5 folders, `model_type` t5, are loaded with AutoModelForSeq2SeqLM.)
    python check_saved_folders.py /tmp/saved [FIXTURES_DIR]
"""

import os
import sys

import torch
from safetensors.torch import load_file
import json

from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM


def main():
    saved = sys.argv[1]
    fixtures = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf")
    for name in sorted(os.listdir(saved)):
        with open(os.path.join(saved, name, "config.json")) as f:
            t5 = json.load(f).get("model_type") in ("t5", "mt5")
        auto = AutoModelForSeq2SeqLM if t5 else AutoModelForCausalLM
        model, info = auto.from_pretrained(os.path.join(saved, name), output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}
        assert not bad, f"{name}: {bad}"
        e = load_file(os.path.join(fixtures, name, "expected.safetensors"))
        with torch.no_grad():
            if t5:
                logits = model.eval()(input_ids=e["input_ids"], decoder_input_ids=e["decoder_input_ids"]).logits
            else:
                logits = model.eval()(input_ids=e["input_ids"]).logits
        assert torch.allclose(logits, e["logits"], rtol=1e-4, atol=1e-5), f"{name}: logits differ"
        print(f"{name}: loaded by transformers with no key problems, logits equal")


if __name__ == "__main__":
    main()
