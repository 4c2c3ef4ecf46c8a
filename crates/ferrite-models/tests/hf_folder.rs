//! Hugging Face folders that are incomplete, damaged or do not match their config: each a typed
//! error naming the file, key or shapes (issue 27 §2 and "Bad input"), never a panic and never a
//! silently different model.
use std::path::{Path, PathBuf};

use ferrite_models::{HfFolder, HfLoadOptions, ModelError, WeightFiles};
use ferrite_nn::Module;
use ferrite_tensor::{DType, Device};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/hf").join(name)
}

/// A writable copy of a fixture folder.
fn copy(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

fn load(dir: &Path) -> Result<ferrite_models::Decoder, ModelError> {
    Ok(HfFolder::open(dir)?.load_decoder(&Device::Cpu, &HfLoadOptions::default())?.0)
}

fn set_config(dir: &Path, key: &str, value: serde_json::Value) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v[key] = value;
    std::fs::write(&p, v.to_string()).unwrap();
}

#[test]
fn the_weights_are_found_in_every_layout() {
    assert!(matches!(HfFolder::open(fixture("gpt2")).unwrap().weights, WeightFiles::Safetensors(_)));
    assert!(matches!(HfFolder::open(fixture("mistral")).unwrap().weights, WeightFiles::PytorchBin(_)));
    match HfFolder::open(fixture("llama")).unwrap().weights {
        WeightFiles::Sharded { index, shards } => {
            assert!(index.ends_with("model.safetensors.index.json"));
            assert!(shards.len() > 1, "{shards:?}");
            let mut sorted = shards.clone();
            sorted.sort();
            assert_eq!(sorted, llama_shards().iter().map(|n| fixture("llama").join(n)).collect::<Vec<_>>());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_folder_without_config_or_weights_says_so() {
    let dir = copy("gpt2");
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let e = HfFolder::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("no weights") && e.contains("model.safetensors"), "{e}");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let e = HfFolder::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("config.json") && e.contains("cannot read"), "{e}");
    let e = HfFolder::open(dir.path().join("nowhere")).unwrap_err().to_string();
    assert!(e.contains("not a folder"), "{e}");
}

/// The llama fixture's shard file names, in index order (`model-0000N-of-0000M.safetensors`).
fn llama_shards() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixture("llama"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("model-") && n.ends_with(".safetensors"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_truncated_shard_is_named() {
    let dir = copy("llama");
    let second = &llama_shards()[1];
    let shard = dir.path().join(second);
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let e = load(dir.path()).unwrap_err();
    assert!(matches!(e, ModelError::WeightFile { .. }), "{e}");
    assert!(e.to_string().contains(second.as_str()), "{e}");
    // A pytorch_model.bin cut short, too.
    let dir = copy("mistral");
    let bin = dir.path().join("pytorch_model.bin");
    let bytes = std::fs::read(&bin).unwrap();
    std::fs::write(&bin, &bytes[..bytes.len() - 100]).unwrap();
    let e = load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("pytorch_model.bin"), "{e}");
}

#[test]
fn an_index_naming_a_missing_or_outside_shard_is_refused() {
    let last = llama_shards().pop().unwrap();
    let dir = copy("llama");
    std::fs::remove_file(dir.path().join(&last)).unwrap();
    let e = HfFolder::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("model.safetensors.index.json") && e.contains(last.as_str()), "{e}");
    let dir = copy("llama");
    let idx = dir.path().join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&idx).unwrap().replace(&last, &format!("../{last}"));
    std::fs::write(&idx, text).unwrap();
    let e = HfFolder::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("without a path"), "{e}");
    std::fs::write(&idx, "{\"weight_map\": 3}").unwrap();
    let e = HfFolder::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("weight_map"), "{e}");
}

#[test]
fn missing_and_unexpected_keys_are_reported_as_pytorch_does() {
    // The config asks for a third layer the weights do not have.
    let dir = copy("llama");
    set_config(dir.path(), "num_hidden_layers", 3.into());
    let e = load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("Error(s) in loading state_dict for LlamaForCausalLM"), "{e}");
    assert!(e.contains("Missing key(s) in state_dict: \"model.layers.2.self_attn.q_proj.weight\""), "{e}");
    // Not strict: the model loads and the keys come back.
    let folder = HfFolder::open(dir.path()).unwrap();
    let opts = HfLoadOptions { strict: false, ..HfLoadOptions::default() };
    let (_, keys) = folder.load_decoder(&Device::Cpu, &opts).unwrap();
    assert_eq!(keys.missing_keys.len(), 9);
    assert!(keys.unexpected_keys.is_empty());
    // One layer fewer: the second layer's weights are unexpected.
    set_config(dir.path(), "num_hidden_layers", 1.into());
    let e = load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("Unexpected key(s) in state_dict: \"model.layers.1."), "{e}");
}

#[test]
fn a_shape_mismatch_names_the_key_and_both_shapes() {
    let dir = copy("gpt2");
    set_config(dir.path(), "n_inner", 40.into());
    let e = load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("size mismatch for transformer.h.0.mlp.c_fc.weight"), "{e}");
    assert!(e.contains("[32, 48]") && e.contains("[32, 40]"), "{e}");
}

#[test]
fn an_unknown_model_type_is_refused() {
    let dir = copy("gpt2");
    set_config(dir.path(), "model_type", "gpt_neox".into());
    let e = load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("config.json") && e.contains("gpt_neox"), "{e}");
}

#[test]
fn a_bare_gpt2_checkpoint_with_old_buffers_loads() {
    // The original `gpt2` files: keys without `transformer.`, the causal-mask buffers
    // `attn.bias` / `attn.masked_bias`, and a tied `lm_head.weight` stored anyway.
    let folder = HfFolder::open(fixture("gpt2")).unwrap();
    let sd = folder.read_state_dict(DType::F32).unwrap();
    let dir = copy("gpt2");
    let mut named: Vec<(String, ferrite_tensor::Tensor)> =
        sd.iter().map(|(k, t)| (k.trim_start_matches("transformer.").to_string(), t.clone())).collect();
    let mask = ferrite_tensor::Tensor::ones(&[1, 1, 32, 32], DType::F32, &Device::Cpu).unwrap();
    named.push(("h.0.attn.bias".into(), mask.clone()));
    named.push(("h.1.attn.masked_bias".into(), mask));
    named.push(("lm_head.weight".into(), sd.get("transformer.wte.weight").unwrap().clone()));
    ferrite_io::save_state_dict(dir.path().join("model.safetensors"), named.iter().map(|(k, t)| (k.as_str(), t)))
        .unwrap();
    let (model, keys) =
        HfFolder::open(dir.path()).unwrap().load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap();
    assert!(keys.missing_keys.is_empty() && keys.unexpected_keys.is_empty());
    let w: Vec<f32> = model.state_dict().get("transformer.h.1.mlp.c_proj.weight").unwrap().to_vec().unwrap();
    let want: Vec<f32> = sd.get("transformer.h.1.mlp.c_proj.weight").unwrap().to_vec().unwrap();
    assert_eq!(w, want);
}

#[test]
fn bf16_weights_become_f32_or_stay_bf16_when_asked() {
    let folder = HfFolder::open(fixture("qwen2")).unwrap();
    let (m, _) = folder.load_decoder(&Device::Cpu, &HfLoadOptions::default()).unwrap();
    assert!(m.parameters().iter().all(|p| p.dtype() == DType::F32));
    let opts = HfLoadOptions { dtype: DType::BF16, ..HfLoadOptions::default() };
    let (m, _) = folder.load_decoder(&Device::Cpu, &opts).unwrap();
    assert!(m.parameters().iter().all(|p| p.dtype() == DType::BF16));
}
