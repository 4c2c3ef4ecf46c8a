"""Loads folders ferrite wrote with PEFT / transformers and compares their logits with the ones
ferrite computed (called by crates/ferrite-models/tests/lora_parity.rs; exits 1 on a mismatch).

    python check_lora_folders.py adapter BASE_DIR ADAPTER_DIR EXPECTED.safetensors
    python check_lora_folders.py merged  MERGED_DIR EXPECTED.safetensors

EXPECTED holds `input_ids` and `logits` (what ferrite computed with the adapter).
"""

import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    mode = sys.argv[1]
    if mode == "adapter":
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32)
        model = PeftModel.from_pretrained(base, sys.argv[3])
        expected = load_file(sys.argv[4])
    else:
        model = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32)
        expected = load_file(sys.argv[3])
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=expected["input_ids"]).logits
    want = expected["logits"]
    err = ((logits - want).abs() / (1e-5 + 1e-5 * want.abs())).max().item()
    print(f"{mode}: max |peft - ferrite| / (1e-5 + 1e-5 |ferrite|) = {err:.3f}")
    sys.exit(0 if err <= 1.0 else 1)


if __name__ == "__main__":
    main()
