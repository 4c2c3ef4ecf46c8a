"""Loads folders ferrite wrote with PEFT / transformers and compares their logits with the ones
ferrite computed (called by crates/ferrite-models/tests/lora_parity.rs; exits 1 on a mismatch).

    python check_lora_folders.py adapter BASE_DIR ADAPTER_DIR EXPECTED.safetensors
    python check_lora_folders.py merged  MERGED_DIR EXPECTED.safetensors
    python check_lora_folders.py seq2seq BASE_DIR ADAPTER_DIR MERGED_DIR

EXPECTED holds `input_ids` and `logits` (what ferrite computed with the adapter). `seq2seq`
loads a T5 base with ferrite's adapter through PEFT and ferrite's `--merge-lora` folder through
transformers, and compares their logits on a fixed input (they must agree to 1e-5).

"""

import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def seq2seq(base_dir, adapter_dir, merged_dir):
    from peft import PeftModel
    from transformers import AutoModelForSeq2SeqLM

    base = AutoModelForSeq2SeqLM.from_pretrained(base_dir, dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, adapter_dir).eval()
    merged = AutoModelForSeq2SeqLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 1]])
    dec = torch.tensor([[0, 5, 6, 7]])
    with torch.no_grad():
        a = peft(input_ids=ids, decoder_input_ids=dec).logits
        b = merged(input_ids=ids, decoder_input_ids=dec).logits
    err = ((a - b).abs() / (1e-5 + 1e-5 * b.abs())).max().item()
    print(f"seq2seq: max |peft adapter - merged| / (1e-5 + 1e-5 |merged|) = {err:.3f}")
    sys.exit(0 if err <= 1.0 else 1)


def main():
    mode = sys.argv[1]
    if mode == "seq2seq":
        seq2seq(*sys.argv[2:5])
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
