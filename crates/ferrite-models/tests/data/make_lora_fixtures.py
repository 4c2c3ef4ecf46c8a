"""LoRA adapters made with Hugging Face PEFT on the tiny models of make_hf_fixtures.py, and what
PEFT computes with them, for crates/ferrite-models/tests/lora_parity.rs.

Why: ferrite's LoRA must be PEFT's function (names, scaling, the Conv1D layout) and its adapter
folders must be PEFT's, so the reference is PEFT itself. For each base model below, `OUT/<name>/`
holds `adapter/` (what `PeftModel.save_pretrained` writes: adapter_config.json,
adapter_model.safetensors) and `expected.safetensors`:

  input_ids        the fixed batch [2, 12]
  base_logits      the base model's logits (the adapter must change them)
  logits, loss     PeftModel.from_pretrained(base, adapter) in eval mode
  grad.<key>       each adapter tensor's gradient after one backward of the loss (<key> is the
                   adapter file's name, `base_model.model.….lora_A.weight`)
  adamw_losses     the loss before each of ADAMW_STEPS torch.optim.AdamW steps over the adapters
                   only (lr adamw_lr, weight decay adamw_wd), and adamw.<key>: each adapter
                   tensor after them
  merged_logits    merge_and_unload()'s logits

  gpt2/   Conv1D layers (fan_in_fan_out), target_modules ["c_attn", "c_proj"] (c_proj chooses both
          attn.c_proj and mlp.c_proj: PEFT's suffix rule), r 4, lora_alpha 8 (scaling 2)
  llama/  target_modules ["q_proj", "v_proj"], r 4, lora_alpha 16, use_rslora (scaling 16/√4 = 8)

The adapters are redrawn N(0, 0.1²) (A and B; PEFT's B starts at zero, which would make the
adapter invisible). Twin sets: `--seed N --hf DIR --out DIR2` with DIR made by
`make_hf_fixtures.py --seed N --out DIR`; the tests read every number from the files
(`FERRITE_HF_FIXTURES=DIR FERRITE_LORA_FIXTURES=DIR2 cargo test --test lora_parity`).

    pip install torch transformers safetensors peft
    python make_lora_fixtures.py [--seed 0] [--hf ./hf] [--out ./lora]

Made with torch 2.15.0, transformers 5.24.0, peft 0.21.2 (CPU).
"""

import argparse
import copy
import os
import shutil

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

VOCAB, BATCH, SEQ = 320, 2, 12
ADAMW_STEPS, ADAMW_LR, ADAMW_WD = 5, 1e-2, 0.01

MODELS = {
    "gpt2": dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True),
    "llama": dict(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], use_rslora=True),
}


def adapter_items(model):
    """(file key, parameter) of every adapter tensor, named as the saved file names them."""
    return [(n.replace(".default", ""), p) for n, p in model.named_parameters() if "lora_" in n]


def make(name, base_dir, out, gen):
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    t = {"input_ids": ids.to(torch.int64).contiguous()}
    with torch.no_grad():
        t["base_logits"] = base(input_ids=ids).logits.contiguous()
    cfg = LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **MODELS[name])
    peft_model = get_peft_model(copy.deepcopy(base), cfg)
    with torch.no_grad():
        for _, p in adapter_items(peft_model):
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    peft_model.peft_config["default"].base_model_name_or_path = f"ferrite-tests/{name}"
    adapter_dir = os.path.join(out, "adapter")
    peft_model.save_pretrained(adapter_dir)
    os.remove(os.path.join(adapter_dir, "README.md"))  # PEFT's model-card template, not read

    # Everything below from the saved folder, as a user would load it.
    def loaded():
        return PeftModel.from_pretrained(copy.deepcopy(base), adapter_dir, is_trainable=True)

    m = loaded().eval()
    with torch.no_grad():
        o = m(input_ids=ids, labels=ids)
        t["logits"] = o.logits.contiguous()
        t["loss"] = o.loss.reshape(1).contiguous()
    m = loaded().train()
    m(input_ids=ids, labels=ids).loss.backward()
    for k, p in adapter_items(m):
        t["grad." + k] = p.grad.detach().contiguous()
    assert all(p.grad is None for n, p in m.named_parameters() if "lora_" not in n), "base weights are frozen"
    m = loaded().train()
    opt = torch.optim.AdamW([p for _, p in adapter_items(m)], lr=ADAMW_LR, weight_decay=ADAMW_WD)
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad()
        loss = m(input_ids=ids, labels=ids).loss
        losses.append(loss.detach())
        loss.backward()
        opt.step()
    t["adamw_losses"] = torch.stack(losses).contiguous()
    t["adamw_lr"] = torch.tensor([ADAMW_LR], dtype=torch.float64)
    t["adamw_wd"] = torch.tensor([ADAMW_WD], dtype=torch.float64)
    for k, p in adapter_items(m):
        t["adamw." + k] = p.detach().contiguous()
    merged = loaded().merge_and_unload().eval()
    with torch.no_grad():
        t["merged_logits"] = merged(input_ids=ids).logits.contiguous()
    save_file(t, os.path.join(out, "expected.safetensors"))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hf", default=os.path.join(here, "hf"), help="the base models (make_hf_fixtures.py --out)")
    ap.add_argument("--out", default=os.path.join(here, "lora"))
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(1000 + args.seed)
    for name in MODELS:
        d = os.path.join(args.out, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        make(name, os.path.join(args.hf, name), d, gen)


if __name__ == "__main__":
    main()
