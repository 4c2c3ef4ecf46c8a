"""Tiny random Hugging Face models and the outputs transformers computes for them, for
crates/ferrite-models/tests/hf_parity.rs.

Why: ferrite's GPT-2, Llama, Mistral and Qwen2 must be the same functions as transformers', and
the only way to know is to compare with transformers itself. Each folder below is what
`save_pretrained` writes (plus `expected.safetensors`: input ids, logits, loss), each exercising
one weight format and the options ferrite reads from config.json:

  gpt2/     model.safetensors (f32), tied head, gelu_new, n_inner, layer_norm_epsilon
  llama/    sharded model-0000N-of-0000M.safetensors + index, GQA (4 heads, 2 kv), llama3 rope scaling
  mistral/  pytorch_model.bin (torch.save of the state dict), one kv head, sliding_window 4 < seq, linear rope
  qwen2/    model.safetensors in bf16 (ferrite converts to f32), q/k/v biases, tied head, dynamic rope
            past max_position_embeddings

Weights are redrawn larger than the models' 0.02 init so logits are far from uniform and a wrong
operation shows. Rerun with another seed and output folder to make a twin set: the tests read
every expected number from the files and must pass unchanged on it.

    pip install torch transformers safetensors
    python make_hf_fixtures.py [--seed 0] [--out DIR]   # DIR defaults to ./hf next to this file

Made with torch 2.15.0, transformers 5.24.0, safetensors 0.8.0 (CPU).
"""

import argparse
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB, BATCH, SEQ = 64, 2, 12


def redraw(model, gen):
    """Weights N(0, 0.15²), norm scales 1 + N(0, 0.1²), biases N(0, 0.1²)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name or "ln_" in name:
                p.copy_(1.0 + 0.1 * noise if name.endswith("weight") else 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.15 * noise)


def expected(model, gen, folder):
    model.eval()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    save_file(
        {
            "input_ids": ids.to(torch.int64).contiguous(),
            "logits": out.logits.to(torch.float32).contiguous(),
            "loss": out.loss.reshape(1).to(torch.float32).contiguous(),
        },
        os.path.join(folder, "expected.safetensors"),
    )


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf"))
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    common = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)

    # GPT-2: one safetensors file, tied head.
    cfg = GPT2Config(
        n_positions=32, n_embd=32, n_layer=2, n_head=4, n_inner=48, activation_function="gelu_new",
        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common,
    )
    m = GPT2LMHeadModel(cfg)
    redraw(m, gen)
    m.tie_weights()
    d = fresh(os.path.join(args.out, "gpt2"))
    m.save_pretrained(d)
    expected(m, gen, d)

    # Llama: GQA, llama3 rope scaling (one frequency kept, one ramped, two divided), sharded.
    cfg = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 128,
        },
        **common,
    )
    m = LlamaForCausalLM(cfg)
    redraw(m, gen)
    d = fresh(os.path.join(args.out, "llama"))
    m.save_pretrained(d, max_shard_size="40KB")
    expected(m, gen, d)

    # Mistral: one kv head, a sliding window shorter than the sequence, linear rope; pytorch_model.bin.
    cfg = MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        max_position_embeddings=1024, sliding_window=4, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        **common,
    )
    m = MistralForCausalLM(cfg)
    redraw(m, gen)
    d = fresh(os.path.join(args.out, "mistral"))
    m.config.save_pretrained(d)
    torch.save(m.state_dict(), os.path.join(d, "pytorch_model.bin"))
    expected(m, gen, d)

    # Qwen2: q/k/v biases, tied head, dynamic rope past max_position_embeddings (8 < 12); bf16 file.
    cfg = Qwen2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=8, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        **common,
    )
    m = Qwen2ForCausalLM(cfg)
    redraw(m, gen)
    m.tie_weights()
    m = m.to(torch.bfloat16)
    d = fresh(os.path.join(args.out, "qwen2"))
    m.save_pretrained(d)
    # The expected outputs of exactly the bf16 weights, computed in f32 (what ferrite loads).
    expected(m.to(torch.float32), gen, d)


if __name__ == "__main__":
    main()
