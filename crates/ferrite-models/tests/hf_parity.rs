//! ferrite's Hugging Face decoders against transformers itself (issue 27 §4): tiny random GPT-2,
//! Llama (GQA, llama3 rope scaling), Mistral (sliding window, linear rope) and Qwen2 (q/k/v
//! biases, dynamic rope, bf16 file) folders made by `tests/data/make_hf_fixtures.py` with
//! `save_pretrained`, loaded here with [`HfFolder`], their logits and causal-LM loss compared
//! with the ones transformers computed (`expected.safetensors` in each folder).
//!
//! Every expected number is read from the files: `FERRITE_HF_FIXTURES=DIR cargo test --test
//! hf_parity` runs the same tests on a twin set made with `make_hf_fixtures.py --seed N --out DIR`.
//! Tolerance: |ferrite − transformers| ≤ 1e-4·|transformers| + 1e-5 per logit (f32 on both sides;
//! the absolute term covers logits near zero), 1e-4 relative on the loss.
use std::path::PathBuf;

use ferrite_io::LoadOptions;
use ferrite_models::{HfFolder, HfLoadOptions, save_decoder};
use ferrite_nn::{CrossEntropyLoss, Module};
use ferrite_tensor::{Device, Tensor};

fn fixtures() -> PathBuf {
    match std::env::var_os("FERRITE_HF_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/hf"),
    }
}

struct Expected {
    ids: Tensor,
    logits: Tensor,
    loss: f64,
}

fn expected(name: &str) -> Expected {
    let path = fixtures().join(name).join("expected.safetensors");
    let sd = ferrite_io::load_state_dict(&path, &LoadOptions::new()).unwrap();
    let get = |k: &str| sd.iter().find(|(n, _)| n == k).map(|(_, t)| t.clone()).unwrap();
    Expected { ids: get("input_ids"), logits: get("logits"), loss: get("loss").to_vec::<f32>().unwrap()[0] as f64 }
}

/// The mean cross-entropy of predicting `ids[:, 1:]` from `logits[:, :-1]` (transformers'
/// `ForCausalLMLoss` with `labels = input_ids`).
fn causal_lm_loss(logits: &Tensor, ids: &Tensor) -> f64 {
    let (s, v) = (logits.shape()[1], logits.shape()[2]);
    let pred = logits.narrow(1, 0, s - 1).unwrap().contiguous().unwrap().reshape(&[-1, v as i64]).unwrap();
    let target = ids.narrow(1, 1, s - 1).unwrap().contiguous().unwrap().reshape(&[-1]).unwrap();
    CrossEntropyLoss::new().forward(&pred, &target).unwrap().item().unwrap()
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
