//! ferrite's Hugging Face decoders against transformers itself (issue 27 §4): tiny random GPT-2,
//! Llama (GQA, llama3 rope scaling), Mistral (sliding window, linear rope) and Qwen2 (q/k/v
//! biases, dynamic rope, bf16 file) folders made by `tests/data/make_hf_fixtures.py` with
//! `save_pretrained`, loaded here with [`HfFolder`], their logits and causal-LM loss compared
//! with the ones transformers computed (`expected.safetensors` in each folder).
//!
//! Beyond the forward pass (issue 27 §4): the loss `ferrite eval` defines on `text.txt` with the
//! folder's `tokenizer.json`, greedy generation with the key/value cache (exact ids), every
//! parameter's gradient after one backward (1e-4), and the losses of 5 AdamW steps (1e-4).
//!
//! Every expected number is read from the files: `FERRITE_HF_FIXTURES=DIR cargo test --test
//! hf_parity` runs the same tests on a twin set made with `make_hf_fixtures.py --seed N --out DIR`.
//! Tolerance: |ferrite − transformers| ≤ 1e-4·|transformers| + 1e-5 per logit (f32 on both sides;
//! the absolute term covers logits near zero), 1e-4 relative on the loss.
use std::path::PathBuf;

use ferrite_io::LoadOptions;
use ferrite_models::{HfFolder, HfLoadOptions, save_decoder};
use ferrite_nn::Module;
use ferrite_tensor::{Device, Tensor};

fn fixtures() -> PathBuf {
    ferrite_test_support::hf_fixtures()
}

struct Expected {
    ids: Tensor,
    logits: Tensor,
    loss: f64,
    all: Vec<(String, Tensor)>,
}

impl Expected {
    fn get(&self, k: &str) -> Tensor {
        self.all
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| panic!("no `{k}` in the fixture"))
    }
    fn f64s(&self, k: &str) -> Vec<f64> {
        self.get(k).to_vec_f64().unwrap()
    }
    fn ids(&self, k: &str) -> Vec<u32> {
        self.get(k).to_vec::<i64>().unwrap().into_iter().map(|i| i as u32).collect()
    }
}

fn expected(name: &str) -> Expected {
    let path = fixtures().join(name).join("expected.safetensors");
    let all = ferrite_io::load_state_dict(&path, &LoadOptions::new()).unwrap();
    let get = |k: &str| all.iter().find(|(n, _)| n == k).map(|(_, t)| t.clone()).unwrap();
    Expected { ids: get("input_ids"), logits: get("logits"), loss: get("loss").to_vec::<f32>().unwrap()[0] as f64, all }
}

/// The mean cross-entropy of predicting `ids[:, 1:]` from `logits[:, :-1]` (transformers'
/// `ForCausalLMLoss` with `labels = input_ids`).
fn causal_lm_loss(logits: &Tensor, ids: &Tensor) -> f64 {
    ferrite_models::causal_lm_loss(logits, ids).unwrap().item().unwrap()
}

/// The tolerance of the header, by ferrite-test-support's closeness check (which also fails on a NaN).
fn assert_close(name: &str, got: &Tensor, want: &Tensor) {
    ferrite_test_support::assert_close(&format!("{name}: logits"), got, want, 1e-4, 1e-5);
}

/// Load the folder, run the fixed batch, compare logits and loss; returns the model.
fn check(name: &str) -> ferrite_models::Decoder {
    let folder = HfFolder::open(fixtures().join(name)).unwrap();
    let (mut model, keys) = folder.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap();
    assert!(keys.missing_keys.is_empty() && keys.unexpected_keys.is_empty(), "{name}: {keys:?}");
    model.eval();
    let e = expected(name);
    let logits = model.forward(&e.ids).unwrap();
    assert_close(name, &logits, &e.logits);
    let loss = causal_lm_loss(&logits, &e.ids);
    assert!((loss - e.loss).abs() <= 1e-4 * e.loss.abs(), "{name}: loss {loss} in ferrite, {} in transformers", e.loss);
    model
}

#[test]
fn gpt2_matches_transformers() {
    let m = check("gpt2");
    assert_eq!(m.config().model_type, "gpt2");
    assert!(m.config().tie_word_embeddings);
}

#[test]
fn llama_with_gqa_and_llama3_rope_from_shards_matches_transformers() {
    let m = check("llama");
    assert!(m.config().num_kv_heads < m.config().num_heads);
    assert!(matches!(m.config().rope_scaling, Some(ferrite_models::RopeScaling::Llama3 { .. })));
}

#[test]
fn mistral_with_sliding_window_from_pytorch_bin_matches_transformers() {
    let m = check("mistral");
    let e = expected("mistral");
    assert!(m.config().sliding_window.is_some_and(|w| w < e.ids.shape()[1]), "the window must cut the sequence");
}

#[test]
fn qwen2_from_bf16_with_dynamic_rope_matches_transformers() {
    let m = check("qwen2");
    let e = expected("qwen2");
    assert!(e.ids.shape()[1] > m.config().max_positions, "dynamic rope must be past its trained context");
}

/// A sharded folder and a `pytorch_model.bin` folder load to the same tensors as the single
/// `model.safetensors` ferrite writes from them, and that folder reloads to the same logits.
#[test]
fn saved_folders_reload_to_the_same_tensors() {
    for name in ["llama", "mistral", "gpt2"] {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let (model, _) = folder.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        // `FERRITE_HF_SAVE_TO=DIR` keeps the folders, for `tests/data/check_saved_folders.py`
        // (transformers' `from_pretrained` on what ferrite wrote).
        let out = match std::env::var_os("FERRITE_HF_SAVE_TO") {
            Some(d) => PathBuf::from(d).join(name),
            None => dir.path().to_path_buf(),
        };
        save_decoder(&model, &folder.config_text, &out).unwrap();
        let again = HfFolder::open(&out).unwrap();
        assert!(matches!(again.weights, ferrite_models::WeightFiles::Safetensors(_)));
        if name == "gpt2" {
            // Tied: the head is the embedding, stored once.
            let keys: Vec<String> =
                again.read_state_dict(ferrite_tensor::DType::F32).unwrap().keys().map(String::from).collect();
            assert!(!keys.contains(&"lm_head.weight".to_string()), "{keys:?}");
        }
        let (reloaded, keys) = again.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        assert!(keys.missing_keys.is_empty() && keys.unexpected_keys.is_empty());
        let (a, b) = (model.state_dict(), reloaded.state_dict());
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        for (k, t) in a.iter() {
            let (x, y): (Vec<f32>, Vec<f32>) = (t.to_vec().unwrap(), b.get(k).unwrap().to_vec().unwrap());
            assert_eq!(x, y, "{name}: {k}");
        }
    }
}

const MODELS: [&str; 4] = ["gpt2", "llama", "mistral", "qwen2"];

/// `ferrite eval`'s definition: `text.txt` tokenized whole without special tokens, blocks of
/// `--seq`, the remainder dropped, the mean loss over every predicted position.
#[test]
fn eval_loss_on_text_matches_transformers() {
    let text = std::fs::read_to_string(fixtures().join("text.txt")).unwrap();
    for name in MODELS {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let tok = ferrite_data::HfTokenizer::from_file(&folder.tokenizer_file().unwrap()).unwrap();
        let (mut model, _) = folder.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        model.eval();
        let e = expected(name);
        let ids = tok.encode(&text, false).unwrap();
        assert_eq!(ids.len(), e.ids("eval_tokens")[0] as usize, "{name}: token count");
        assert_eq!(tok.encode("the allocator keeps", false).unwrap(), e.ids("prompt_ids"), "{name}: prompt ids");
        let blocks = ferrite_data::TokenBlocks::new(ids, 16, "text.txt").unwrap();
        let mut loader = blocks.tensor_loader().batch_size(5).build().unwrap();
        let (mut sum, mut n) = (0.0, 0usize);
        let _g = ferrite_tensor::no_grad();
        for batch in &mut loader {
            let (x, y) = batch.unwrap();
            let positions = y.shape()[0] * (y.shape()[1] - 1);
            sum += causal_lm_loss(&model.forward(&x).unwrap(), &y) * positions as f64;
            n += positions;
        }
        let (got, want) = (sum / n as f64, e.f64s("eval_loss")[0]);
        assert!((got - want).abs() <= 1e-4 * want.abs(), "{name}: eval loss {got} in ferrite, {want} in transformers");
    }
}

/// Greedy decoding with the key/value cache: the same new ids as `generate(do_sample=False)`.
#[test]
fn greedy_generation_with_the_cache_matches_transformers() {
    for name in MODELS {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let (mut model, _) = folder.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        model.eval();
        let e = expected(name);
        let want = e.ids("greedy_ids");
        let options = ferrite_models::GenerateOptions {
            max_new_tokens: want.len(),
            decoding: ferrite_models::Decoding::Greedy,
            eos_token_ids: folder.eos_token_ids(),
        };
        let got = ferrite_models::generate(&model, &e.ids("prompt_ids"), &options).unwrap();
        assert_eq!(got.ids, want, "{name}: greedy ids");
        assert!(got.cache_bytes > 0);
    }
}

/// The cached forward pass equals the full one, position by position (also past a sliding
/// window). Not for a dynamic rope past its trained context: there the full pass rotates every
/// position with the frequencies of the whole length, while cached keys keep the ones they were
/// made with — as in transformers, whose greedy ids the test above compares.
#[test]
fn the_cache_gives_the_full_forward_logits() {
    for name in MODELS {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let (mut model, _) = folder.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        if matches!(model.config().rope_scaling, Some(ferrite_models::RopeScaling::Dynamic { .. })) {
            continue;
        }
        model.eval();
        let e = expected(name);
        let ids = e.ids.narrow(0, 0, 1).unwrap().contiguous().unwrap();
        let s = ids.shape()[1];
        let full = model.forward(&ids).unwrap();
        let mut cache = model.new_cache();
        // Five positions at once, then one at a time.
        let mut parts = vec![model.forward_with_cache(&ids.narrow(1, 0, 5).unwrap(), &mut cache, false).unwrap()];
        for p in 5..s {
            parts.push(model.forward_with_cache(&ids.narrow(1, p, 1).unwrap(), &mut cache, false).unwrap());
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        let cached = Tensor::cat(&refs, 1).unwrap();
        ferrite_test_support::assert_close(&format!("{name}: cached logits"), &cached, &full, 1e-4, 1e-5);
        assert_eq!(cache.len(), s);
    }
}

/// Every parameter's gradient after one backward of the fixed batch's loss.
#[test]
fn gradients_match_transformers() {
    for name in MODELS {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let (model, _) = folder.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        let e = expected(name);
        ferrite_models::causal_lm_loss(&model.forward(&e.ids).unwrap(), &e.ids).unwrap().backward().unwrap();
        check_gradients(name, &model, &e, |_| 1e-6);
    }
}

/// Five AdamW steps on the fixed batch: the loss before each step.
#[test]
fn five_adamw_steps_match_transformers() {
    use ferrite_optim::{Adam, AdamConfig, Optimizer};
    for name in MODELS {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let (model, _) = folder.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        let e = expected(name);
        let (lr, wd) = (e.f64s("adamw_lr")[0], e.f64s("adamw_wd")[0]);
        let mut opt = Adam::named(model.named_parameters(), AdamConfig::adamw(lr).weight_decay(wd)).unwrap();
        let want = e.f64s("adamw_losses");
        for (step, w) in want.iter().enumerate() {
            opt.zero_grad().unwrap();
            let loss = ferrite_models::causal_lm_loss(&model.forward(&e.ids).unwrap(), &e.ids).unwrap();
            let got = loss.item().unwrap();
            assert!((got - w).abs() <= 1e-4 * w.abs(), "{name}: loss before AdamW step {step}: {got} vs {w}");
            loss.backward().unwrap();
            opt.step().unwrap();
        }
    }
}

/// T5 v1.0 (relu, tied and scaled head) and v1.1 (gated-gelu, untied, `pytorch_model.bin`):
/// logits on encoder ids and transformers' shifted-right decoder input, the loss against the
/// labels, and every parameter's gradient after one backward. `scale_decoder_outputs` (transformers
/// ≥ 5) decides the head's scaling: the v1.1 fixture is tied and unscaled.
#[test]
fn t5_logits_loss_and_gradients_match_transformers() {
    for name in ["t5", "t5v11"] {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        assert!(folder.is_t5());
        let (mut model, keys) = folder.load_t5(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        assert!(keys.missing_keys.is_empty() && keys.unexpected_keys.is_empty(), "{name}: {keys:?}");
        let e = expected(name);
        let (enc, dec, labels) = (e.get("input_ids"), e.get("decoder_input_ids"), e.get("labels"));
        // ferrite's T5 reads [batch, 2, seq]: the encoder's tokens and the decoder's.
        let ids = Tensor::stack(&[&enc, &dec], 1).unwrap();
        model.eval();
        let logits = model.forward(&ids).unwrap();
        assert_close(name, &logits, &e.logits);
        let v = logits.shape()[2] as i64;
        let ce = |logits: &Tensor| {
            ferrite_nn::CrossEntropyLoss::new()
                .forward(&logits.reshape(&[-1, v]).unwrap(), &labels.reshape(&[-1]).unwrap())
                .unwrap()
        };
        let loss = ce(&logits).item().unwrap();
        assert!((loss - e.loss).abs() <= 1e-4 * e.loss.abs(), "{name}: loss {loss} vs {}", e.loss);
        model.train(true);
        ce(&model.forward(&ids).unwrap()).backward().unwrap();
        // T5's attention is unscaled, so its scores (and f32 rounding) run larger than the
        // decoders': the absolute term is 1e-4 of the tensor's largest expected gradient.
        check_gradients(name, &model, &e, |g| {
            1e-4 * g.to_vec_f64().unwrap().iter().fold(0.0f64, |m, v| m.max(v.abs()))
        });
    }
}

/// Every parameter's gradient of `model` against the fixture's `grad.<name>` (one per parameter),
/// within 1e-4 relative plus `atol(expected)`.
fn check_gradients(name: &str, model: &dyn Module, e: &Expected, atol: impl Fn(&Tensor) -> f64) {
    let params = model.named_parameters();
    let want: Vec<&(String, Tensor)> = e.all.iter().filter(|(k, _)| k.starts_with("grad.")).collect();
    assert_eq!(want.len(), params.len(), "{name}: one gradient per parameter");
    for (k, g) in want {
        let pname = &k["grad.".len()..];
        let p = params.iter().find(|(n, _)| n == pname).unwrap_or_else(|| panic!("{name}: no parameter {pname}"));
        let got = p.1.grad().unwrap_or_else(|| panic!("{name}: {pname} has no gradient"));
        ferrite_test_support::assert_close(&format!("{name}: grad {pname}"), &got, g, 1e-4, atol(g));
    }
}

const T5_MODELS: [&str; 2] = ["t5", "t5v11"];

/// T5 greedy generation (the encoder once, the decoder from `decoder_start_token_id`): the same
/// new ids as transformers' `generate(do_sample=False)`, the prompt tokenized with the folder's
/// T5 tokenizer (`</s>` appended) to the same ids.
#[test]
fn t5_greedy_generation_matches_transformers() {
    for name in T5_MODELS {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let tok = ferrite_data::HfTokenizer::from_file(&folder.tokenizer_file().unwrap()).unwrap();
        let (mut model, _) = folder.load_t5(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        model.eval();
        let e = expected(name);
        let prompt = e.ids("prompt_ids");
        assert_eq!(tok.encode("the allocator keeps", true).unwrap(), prompt, "{name}: prompt ids");
        let want = e.ids("greedy_ids");
        let options = ferrite_models::GenerateOptions {
            max_new_tokens: want.len(),
            decoding: ferrite_models::Decoding::Greedy,
            eos_token_ids: folder.eos_token_ids(),
        };
        let got = ferrite_models::generate_seq2seq(&model, &prompt, &options).unwrap();
        assert_eq!(got.ids, want, "{name}: greedy ids");
    }
}

/// Five AdamW steps on the fixed (encoder ids, labels) batch: the loss before each step.
#[test]
fn t5_five_adamw_steps_match_transformers() {
    use ferrite_optim::{Adam, AdamConfig, Optimizer};
    for name in T5_MODELS {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let (model, _) = folder.load_t5(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        let e = expected(name);
        let ids = Tensor::stack(&[&e.get("input_ids"), &e.get("decoder_input_ids")], 1).unwrap();
        let labels = e.get("labels");
        let (lr, wd) = (e.f64s("adamw_lr")[0], e.f64s("adamw_wd")[0]);
        let mut opt = Adam::named(model.named_parameters(), AdamConfig::adamw(lr).weight_decay(wd)).unwrap();
        for (step, w) in e.f64s("adamw_losses").iter().enumerate() {
            opt.zero_grad().unwrap();
            let loss = ferrite_models::seq2seq_loss(&model.forward(&ids).unwrap(), &labels).unwrap();
            let got = loss.item().unwrap();
            assert!((got - w).abs() <= 1e-4 * w.abs(), "{name}: loss before AdamW step {step}: {got} vs {w}");
            loss.backward().unwrap();
            opt.step().unwrap();
        }
    }
}

/// `ferrite eval`'s sequence-to-sequence loss on `seq2seq.jsonl` with `--seq 16`: inputs and
/// targets tokenized with T5's `</s>` and cut to 16 tokens, inputs padded behind an attention
/// mask, labels padded with −100; the mean over every target token equals transformers'.
#[test]
fn t5_seq2seq_loss_on_padded_batches_matches_transformers() {
    let pairs = ferrite_data::read_seq2seq_pairs(&fixtures().join("seq2seq.jsonl"), "input", "target").unwrap();
    for name in T5_MODELS {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let tok = ferrite_data::HfTokenizer::from_file(&folder.tokenizer_file().unwrap()).unwrap();
        let (mut model, _) = folder.load_t5(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        model.eval();
        let e = expected(name);
        assert_eq!(pairs.len(), e.ids("seq2seq_examples")[0] as usize);
        let c = model.config();
        let tokens = ferrite_data::Seq2SeqTokens { pad: c.pad_token_id, decoder_start: c.decoder_start_token_id };
        let examples = ferrite_data::Seq2SeqExamples::tokenize(&tok, &pairs, 16, tokens).unwrap();
        assert!(examples.truncated() > 0, "some inputs must be cut");
        let padded = (0..pairs.len()).filter(|&i| examples.rows(i).unwrap()[2].contains(&0)).count();
        assert!(padded > 0, "some inputs must be padded, so the attention mask counts");
        let mut loader = examples.tensor_loader().batch_size(5).build().unwrap();
        let (mut sum, mut n) = (0.0, 0usize);
        let _g = ferrite_tensor::no_grad();
        for batch in &mut loader {
            let (x, y) = batch.unwrap();
            let scored = ferrite_models::scored_labels(&y).unwrap();
            let loss: f64 = ferrite_models::seq2seq_loss(&model.forward(&x).unwrap(), &y).unwrap().item().unwrap();
            sum += loss * scored as f64;
            n += scored;
        }
        assert_eq!(n, e.ids("seq2seq_target_tokens")[0] as usize, "{name}: target tokens");
        let (got, want) = (sum / n as f64, e.f64s("seq2seq_loss")[0]);
        assert!(
            (got - want).abs() <= 1e-4 * want.abs(),
            "{name}: seq2seq loss {got} in ferrite, {want} in transformers"
        );
    }
}

/// A T5 folder written by ferrite (`save_decoder_with`: `shared.weight` once, no tied copies)
/// reloads to the same tensors; with `FERRITE_HF_SAVE_TO=DIR` it is kept for
/// `tests/data/check_saved_folders.py` (`AutoModelForSeq2SeqLM.from_pretrained`).
#[test]
fn t5_saved_folders_reload_to_the_same_tensors() {
    for name in T5_MODELS {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let (model, _) = folder.load_t5(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = match std::env::var_os("FERRITE_HF_SAVE_TO") {
            Some(d) => PathBuf::from(d).join(name),
            None => dir.path().to_path_buf(),
        };
        let options = ferrite_models::HfSaveOptions { copy_from: Some(folder.dir.clone()), ..Default::default() };
        ferrite_models::save_decoder_with(&model, &folder.config_text, &out, &options).unwrap();
        let again = HfFolder::open(&out).unwrap();
        assert!(again.is_t5() && again.tokenizer_file().is_some());
        let (reloaded, keys) = again.load_t5(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        assert!(keys.missing_keys.is_empty() && keys.unexpected_keys.is_empty(), "{name}: {keys:?}");
        let (a, b) = (model.state_dict(), reloaded.state_dict());
        for (k, t) in a.iter() {
            let (x, y): (Vec<f32>, Vec<f32>) = (t.to_vec().unwrap(), b.get(k).unwrap().to_vec().unwrap());
            assert_eq!(x, y, "{name}: {k}");
        }
    }
}
