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
  t5/       T5 v1.0: relu feed-forward, head tied to `shared` and scaled by d_model^-0.5
  t5v11/    T5 v1.1 / Flan: gated-gelu feed-forward, untied head; pytorch_model.bin

The T5 folders' `expected.safetensors` hold encoder ids, labels, the decoder input transformers
makes from them (`_shift_right`), the logits, the loss and every parameter's gradient, and:

  adamw_losses     as for the decoders, on the fixed (enc, labels) batch
  prompt_ids       PROMPT tokenized with the T5 tokenizer (`</s>` appended); greedy_ids:
                   generate(do_sample=False, max_new_tokens=GREEDY_NEW)'s new tokens, the decoder
                   start token dropped
  seq2seq_loss     `ferrite eval` on seq2seq.jsonl with --seq SEQ2SEQ_SEQ: every input and target
                   tokenized with truncation=True, max_length=SEQ2SEQ_SEQ, inputs padded with an
                   attention mask, labels padded with -100; the mean loss over every target token
                   (each example's loss weighted by its target tokens); seq2seq_target_tokens and
                   seq2seq_examples their counts

The T5 folders' `tokenizer.json` is the same BPE with T5's post-processor (`$A </s>`: every
sequence ends with `</s>`, id 2), as a real T5 tokenizer. `seq2seq.jsonl` (next to text.txt) holds
input/target pairs made from the corpus' lines (some longer than SEQ2SEQ_SEQ tokens, so cut).

Every folder also gets `tokenizer.json`: a byte-level BPE (GPT-2's scheme, `<pad>`, `<s>`, `</s>`
as ids 0, 1, 2) trained with the `tokenizers` package on `text.txt`, a small generated corpus kept
next to the folders. `expected.safetensors` holds, besides the fixed batch's logits and loss:

  eval_loss        `ferrite eval` on text.txt with blocks of EVAL_SEQ: the whole file tokenized
                   without special tokens, cut into blocks, mean of model(block, labels=block).loss
  prompt_ids       PROMPT tokenized; greedy_ids: generate(do_sample=False, max_new_tokens=GREEDY_NEW)'s
                   new tokens (stopping at eos 2 if drawn)
  grad.<name>      every parameter's gradient after one backward of the fixed batch's loss
  adamw_losses     the fixed batch's loss before each of ADAMW_STEPS torch.optim.AdamW steps
                   (lr ADAMW_LR, weight decay ADAMW_WD, other settings default), and adamw_lr /
                   adamw_wd themselves

Weights are redrawn larger than the models' 0.02 init so logits are far from uniform and a wrong
operation shows. Rerun with another seed and output folder to make a twin set: the tests read
every expected number from the files and must pass unchanged on it.

    pip install torch transformers safetensors tokenizers
    python make_hf_fixtures.py [--seed 0] [--out DIR]   # DIR defaults to ./hf next to this file

Made with torch 2.15.0, transformers 5.24.0, safetensors 0.8.0 (CPU).
"""

import argparse
import copy
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
    T5Config,
    T5ForConditionalGeneration,
)

VOCAB, BATCH, SEQ = 320, 2, 12
EVAL_SEQ, PROMPT, GREEDY_NEW = 16, "the allocator keeps", 10
ADAMW_STEPS, ADAMW_LR, ADAMW_WD = 5, 1e-2, 0.01
SEQ2SEQ_SEQ = 16
WORDS = (
    "the memory of a device is reserved by the caching allocator which keeps freed blocks for the next "
    "tensor so a training step asks the driver only once and fragmentation shows as reserved bytes that "
    "no tensor holds while the planner predicts the peak of every step before the run"
).split()


def corpus(gen, path):
    """A few hundred pseudo-sentences over WORDS, one per line."""
    lines = []
    for _ in range(160):
        n = int(torch.randint(5, 14, (1,), generator=gen))
        idx = torch.randint(0, len(WORDS), (n,), generator=gen).tolist()
        lines.append(" ".join(WORDS[i] for i in idx) + ".")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def train_tokenizer(text_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train([text_path], trainer)
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    return tok


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


def expected(model, gen, folder, tok, text):
    # Each figure from an untouched copy: a dynamic rope keeps the longest length it has seen
    # (`max_seq_len_cached`), so one forward pass would change the next one's positions.
    pristine = copy.deepcopy(model).eval()

    def untouched():
        return copy.deepcopy(pristine)

    tok.save(os.path.join(folder, "tokenizer.json"))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    out_tensors = {"input_ids": ids.to(torch.int64).contiguous()}
    with torch.no_grad():
        out = untouched()(input_ids=ids, labels=ids)
        out_tensors["logits"] = out.logits.to(torch.float32).contiguous()
        out_tensors["loss"] = out.loss.reshape(1).to(torch.float32).contiguous()
        # eval: the whole text, no special tokens, blocks of EVAL_SEQ, the remainder dropped.
        text_ids = tok.encode(text, add_special_tokens=False).ids
        blocks = torch.tensor(text_ids[: len(text_ids) // EVAL_SEQ * EVAL_SEQ]).reshape(-1, EVAL_SEQ)
        evaluated = untouched()
        losses = [evaluated(input_ids=b[None], labels=b[None]).loss for b in blocks]
        out_tensors["eval_loss"] = torch.stack(losses).mean().reshape(1).to(torch.float32)
        out_tensors["eval_tokens"] = torch.tensor([len(text_ids)], dtype=torch.int64)
        prompt = torch.tensor([tok.encode(PROMPT, add_special_tokens=False).ids])
        greedy = untouched().generate(
            input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
            max_new_tokens=GREEDY_NEW, eos_token_id=2, pad_token_id=0,
        )
        out_tensors["prompt_ids"] = prompt[0].to(torch.int64).contiguous()
        out_tensors["greedy_ids"] = greedy[0, prompt.shape[1]:].to(torch.int64).contiguous()
    # One backward of the fixed batch, in training mode (every dropout is 0).
    trained = untouched().train()
    trained(input_ids=ids, labels=ids).loss.backward()
    for name, p in trained.named_parameters():
        out_tensors["grad." + name] = p.grad.detach().to(torch.float32).contiguous()
    # ADAMW_STEPS AdamW steps on the same batch.
    trained = untouched().train()
    opt = torch.optim.AdamW(trained.parameters(), lr=ADAMW_LR, weight_decay=ADAMW_WD)
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad()
        loss = trained(input_ids=ids, labels=ids).loss
        losses.append(loss.detach())
        loss.backward()
        opt.step()
    out_tensors["adamw_losses"] = torch.stack(losses).to(torch.float32).contiguous()
    out_tensors["adamw_lr"] = torch.tensor([ADAMW_LR], dtype=torch.float64)
    out_tensors["adamw_wd"] = torch.tensor([ADAMW_WD], dtype=torch.float64)
    save_file(out_tensors, os.path.join(folder, "expected.safetensors"))


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
    os.makedirs(args.out, exist_ok=True)
    text_path = os.path.join(args.out, "text.txt")
    corpus(gen, text_path)
    tok = train_tokenizer(text_path)
    with open(text_path) as f:
        text = f.read()

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
    expected(m, gen, d, tok, text)

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
    expected(m, gen, d, tok, text)

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
    expected(m, gen, d, tok, text)

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
    expected(m.to(torch.float32), gen, d, tok, text)

    t5_models(args, gen, t5_tokenizer(tok), seq2seq_pairs(text, os.path.join(args.out, "seq2seq.jsonl")))


def t5_tokenizer(tok):
    """`tok` with T5's post-processor: every sequence ends with `</s>` (id 2)."""
    from tokenizers import Tokenizer, processors

    t = Tokenizer.from_str(tok.to_str())
    t.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return t


def seq2seq_pairs(text, path):
    """Input/target pairs from the corpus' lines: the input the first 2 to 10 words of a line
    (the shorter ones padded to SEQ2SEQ_SEQ tokens, the longer ones cut), the target its first
    three words reversed."""
    import json

    pairs = []
    for i, line in enumerate(text.splitlines()[:48]):
        words = line.rstrip(".").split()
        n = 2 + i % 9
        pairs.append({"input": "reverse: " + " ".join(words[:n]), "target": " ".join(reversed(words[:3]))})
    with open(path, "w") as f:
        for p in pairs:
            f.write(json.dumps(p) + "\n")
    return pairs


def seq2seq_loss(model, tok, pairs):
    """`ferrite eval`'s definition on `pairs` (see the module docs), with transformers."""
    from tokenizers import Tokenizer

    t = Tokenizer.from_str(tok.to_str())
    t.enable_truncation(SEQ2SEQ_SEQ)
    total, tokens = 0.0, 0
    for p in pairs:
        enc = t.encode(p["input"]).ids
        lab = t.encode(p["target"]).ids
        ids = torch.tensor([enc + [0] * (SEQ2SEQ_SEQ - len(enc))])
        mask = torch.tensor([[1] * len(enc) + [0] * (SEQ2SEQ_SEQ - len(enc))])
        labels = torch.tensor([lab + [-100] * (SEQ2SEQ_SEQ - len(lab))])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        total += float(loss) * len(lab)
        tokens += len(lab)
    return total / tokens, tokens


def expected_t5(model, gen, folder, tok, pairs):
    pristine = copy.deepcopy(model).eval()
    tok.save(os.path.join(folder, "tokenizer.json"))
    model.eval()
    enc = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    dec = model._shift_right(labels)
    out = {"input_ids": enc, "labels": labels, "decoder_input_ids": dec}
    with torch.no_grad():
        o = model(input_ids=enc, labels=labels)
        out["logits"] = o.logits.to(torch.float32).contiguous()
        out["loss"] = o.loss.reshape(1).to(torch.float32)
    model.train()
    model.zero_grad()
    model(input_ids=enc, labels=labels).loss.backward()
    for name, p in model.named_parameters():
        out["grad." + name] = p.grad.detach().to(torch.float32).contiguous()
    # Five AdamW steps on the fixed batch, from the untouched weights.
    trained = copy.deepcopy(pristine).train()
    opt = torch.optim.AdamW(trained.parameters(), lr=ADAMW_LR, weight_decay=ADAMW_WD)
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad()
        loss = trained(input_ids=enc, labels=labels).loss
        losses.append(loss.detach())
        loss.backward()
        opt.step()
    out["adamw_losses"] = torch.stack(losses).to(torch.float32)
    out["adamw_lr"] = torch.tensor([ADAMW_LR], dtype=torch.float64)
    out["adamw_wd"] = torch.tensor([ADAMW_WD], dtype=torch.float64)
    with torch.no_grad():
        m = copy.deepcopy(pristine)
        prompt = torch.tensor([tok.encode(PROMPT).ids])
        greedy = m.generate(
            input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
            max_new_tokens=GREEDY_NEW, eos_token_id=2, pad_token_id=0, decoder_start_token_id=0,
        )
        out["prompt_ids"] = prompt[0].to(torch.int64)
        out["greedy_ids"] = greedy[0, 1:].to(torch.int64)
        loss, tokens = seq2seq_loss(copy.deepcopy(pristine), tok, pairs)
        out["seq2seq_loss"] = torch.tensor([loss], dtype=torch.float64)
        out["seq2seq_target_tokens"] = torch.tensor([tokens], dtype=torch.int64)
        out["seq2seq_examples"] = torch.tensor([len(pairs)], dtype=torch.int64)
    out = {k: v.contiguous() for k, v in out.items()}
    save_file(out, os.path.join(folder, "expected.safetensors"))


def t5_models(args, gen, tok, pairs):
    common = dict(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
        pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
    )
    # v1.0: relu, tied and scaled head; one safetensors file.
    m = T5ForConditionalGeneration(T5Config(feed_forward_proj="relu", tie_word_embeddings=True, **common))
    redraw(m, gen)
    m.tie_weights()
    d = fresh(os.path.join(args.out, "t5"))
    m.save_pretrained(d)
    expected_t5(m, gen, d, tok, pairs)
    # v1.1: gated-gelu, untied head; pytorch_model.bin.
    m = T5ForConditionalGeneration(T5Config(feed_forward_proj="gated-gelu", tie_word_embeddings=False, **common))
    redraw(m, gen)
    d = fresh(os.path.join(args.out, "t5v11"))
    m.config.save_pretrained(d)
    torch.save(m.state_dict(), os.path.join(d, "pytorch_model.bin"))
    expected_t5(m, gen, d, tok, pairs)


if __name__ == "__main__":
    main()
