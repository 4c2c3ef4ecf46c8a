//! T5 decoding with a key/value cache ([`ferrite_models::T5Cache`], transformers'
//! `EncoderDecoderCache`) on the committed T5 fixtures (`tests/data/hf/t5`, v1.0: relu, tied and
//! scaled head; `t5v11`: gated-gelu, untied head), made by `tests/data/make_hf_fixtures.py`.
//!
//! What is checked, each against numbers read from the fixture files (`FERRITE_HF_FIXTURES=DIR`
//! runs the same tests on a twin set made with another seed):
//! - fed one decoder token at a time, the cached logits of every position equal transformers'
//!   logits of the full decoder on the fixture's batch (`logits`, 1e-4 relative as in hf_parity),
//!   and ferrite's own full decoder's to 1e-5 — also past `relative_attention_max_distance`, where
//!   the position bias's buckets saturate, with an encoder padding mask, and after a prefill of
//!   several positions at once;
//! - greedy generation through the cache gives transformers' ids, with a cache of exactly the
//!   self-attention positions plus the encoder's positions;
//! - the cross-attention keys and values are projected once per layer, whatever the number of
//!   steps, while the self-attention's grow by one position per step.
use std::path::PathBuf;

use ferrite_io::LoadOptions;
use ferrite_models::{Decoding, GenerateOptions, HfFolder, HfLoadOptions, T5Model, generate_seq2seq};
use ferrite_nn::Module;
use ferrite_tensor::{Device, Tensor, no_grad};

const T5_MODELS: [&str; 2] = ["t5", "t5v11"];

fn fixtures() -> PathBuf {
    ferrite_test_support::hf_fixtures()
}

struct Fixture {
    model: T5Model,
    folder: HfFolder,
    all: Vec<(String, Tensor)>,
}

impl Fixture {
    fn load(name: &str) -> Fixture {
        let folder = HfFolder::open(fixtures().join(name)).unwrap();
        let (mut model, _) = folder.load_t5(&Device::Cpu, &HfLoadOptions::default()).unwrap();
        model.eval();
        let path = fixtures().join(name).join("expected.safetensors");
        let all = ferrite_io::load_state_dict(&path, &LoadOptions::new()).unwrap();
        Fixture { model, folder, all }
    }
    fn get(&self, k: &str) -> Tensor {
        self.all
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| panic!("no `{k}` in the fixture"))
    }
    fn ids(&self, k: &str) -> Vec<u32> {
        self.get(k).to_vec::<i64>().unwrap().into_iter().map(|i| i as u32).collect()
    }
    /// Bytes of one position's keys and values in every decoder layer (f32).
    fn position_bytes(&self) -> usize {
        let c = self.model.config();
        c.num_decoder_layers * 2 * c.num_heads * c.d_kv * 4
    }
}

/// Feeds `dec` `[b, t]` to the cache in chunks of `chunks` positions (the rest one at a time) and
/// returns the logits of every position, `[b, t, vocab]`, checking the cache's bookkeeping at
/// each step.
fn cached_logits(f: &Fixture, dec: &Tensor, encoded: &Tensor, mask: Option<&Tensor>, first_chunk: usize) -> Tensor {
    let (t, enc_len) = (dec.shape()[1], encoded.shape()[1]);
    let b = dec.shape()[0];
    let layers = f.model.config().num_decoder_layers;
    let mut cache = f.model.new_cache();
    assert!(cache.is_empty() && cache.nbytes() == 0);
    let mut steps = Vec::new();
    let mut pos = 0;
    while pos < t {
        let n = if pos == 0 { first_chunk.clamp(1, t) } else { 1 };
        let logits =
            f.model.decode_with_cache(&dec.narrow(1, pos, n).unwrap(), encoded, mask, &mut cache, false).unwrap();
        assert_eq!(logits.shape()[..2], [b, n]);
        pos += n;
        assert_eq!(cache.len(), pos);
        // Self-attention: one more position per token; cross-attention: the encoder's positions,
        // projected once per layer at the first call.
        assert_eq!(cache.self_attention_bytes(), b * pos * f.position_bytes(), "self-attention bytes at {pos}");
        assert_eq!(cache.cross_attention_bytes(), b * enc_len * f.position_bytes(), "cross-attention bytes at {pos}");
        assert_eq!(cache.cross_projections(), layers, "cross-attention projections after {pos} positions");
        steps.push(logits);
    }
    Tensor::cat(&steps.iter().collect::<Vec<_>>(), 1).unwrap()
}

/// One token at a time, the cached logits equal transformers' full-decoder logits on the
/// fixture's batch (both rows, every position) and ferrite's full decoder's to 1e-5.
#[test]
fn cached_steps_match_transformers_and_the_full_decoder() {
    let _g = no_grad();
    for name in T5_MODELS {
        let f = Fixture::load(name);
        let (enc, dec, want) = (f.get("input_ids"), f.get("decoder_input_ids"), f.get("logits"));
        let encoded = f.model.encode(&enc, None).unwrap();
        let got = cached_logits(&f, &dec, &encoded, None, 1);
        ferrite_test_support::assert_close(&format!("{name}: cached logits vs transformers"), &got, &want, 1e-4, 1e-5);
        let full = f.model.decode(&dec, &encoded, None).unwrap();
        ferrite_test_support::assert_close(&format!("{name}: cached vs full decoder"), &got, &full, 1e-5, 1e-5);
    }
}

/// Past `relative_attention_max_distance` (the fixtures': 16) the decoder's buckets saturate; a
/// 24-token decoder input (the fixture's decoder input then its labels), an encoder padding mask
/// on the second row, and a prefill of 5 positions before single steps: the cached logits equal
/// the full decoder's at every position.
#[test]
fn cached_steps_match_the_full_decoder_past_the_bucket_range_with_padding_and_prefill() {
    let _g = no_grad();
    for name in T5_MODELS {
        let f = Fixture::load(name);
        let max_distance = f.model.config().relative_attention_max_distance;
        let dec = Tensor::cat(&[&f.get("decoder_input_ids"), &f.get("labels")], 1).unwrap();
        let t = dec.shape()[1];
        assert!(t > max_distance + 4, "{name}: the test needs a decoder input past max_distance ({max_distance})");
        let enc = f.get("input_ids");
        let s = enc.shape()[1];
        let mask: Vec<i64> = (0..2 * s).map(|i| i64::from(!(i >= s && i % s >= s - 3))).collect();
        let mask = Tensor::from_vec(mask, &[2, s], &Device::Cpu).unwrap();
        for (m, first_chunk) in [(None, 1), (Some(&mask), 1), (Some(&mask), 5)] {
            let encoded = f.model.encode(&enc, m).unwrap();
            let got = cached_logits(&f, &dec, &encoded, m, first_chunk);
            let full = f.model.decode(&dec, &encoded, m).unwrap();
            let what = format!("{name}: {t} positions, mask {}, prefill {first_chunk}", m.is_some());
            ferrite_test_support::assert_close(&what, &got, &full, 1e-5, 1e-5);
        }
        // The padding changes the logits: the mask reached the cross-attention.
        let encoded = f.model.encode(&enc, Some(&mask)).unwrap();
        let masked = f.model.decode(&dec, &encoded, Some(&mask)).unwrap().select(0, 1).unwrap();
        let plain = f.model.decode(&dec, &f.model.encode(&enc, None).unwrap(), None).unwrap().select(0, 1).unwrap();
        assert!(ferrite_test_support::check_close("mask", &masked, &plain, 1e-5, 1e-5).is_err(), "{name}");
    }
}

/// Greedy generation (now through the cache) gives transformers' ids; the cache ends with one
/// self-attention position per decoder input token (the start token and every new token but the
/// last) and the encoder's positions in the cross-attention, and its size is what
/// `Generated::cache_bytes` reports.
#[test]
fn greedy_generation_through_the_cache_matches_transformers() {
    for name in T5_MODELS {
        let f = Fixture::load(name);
        let (prompt, want) = (f.ids("prompt_ids"), f.ids("greedy_ids"));
        let options = GenerateOptions {
            max_new_tokens: want.len(),
            decoding: Decoding::Greedy,
            eos_token_ids: f.folder.eos_token_ids(),
        };
        let got = generate_seq2seq(&f.model, &prompt, &options).unwrap();
        assert_eq!(got.ids, want, "{name}: greedy ids");
        assert_eq!(got.cache_bytes, (got.ids.len() + prompt.len()) * f.position_bytes(), "{name}: cache bytes");
    }
}

/// Sampling takes the same cached path: a seed gives the same ids twice, and the cache covers
/// exactly the positions decoded (no EOS given, so every requested token is drawn, past
/// `relative_attention_max_distance`).
#[test]
fn sampled_generation_uses_the_cache() {
    let f = Fixture::load("t5");
    let prompt = f.ids("prompt_ids");
    let n = f.model.config().relative_attention_max_distance + 4;
    let options = GenerateOptions {
        max_new_tokens: n,
        decoding: Decoding::Sample { temperature: 1.5, top_k: Some(50), top_p: Some(0.95), seed: 7 },
        eos_token_ids: vec![],
    };
    let a = generate_seq2seq(&f.model, &prompt, &options).unwrap();
    let b = generate_seq2seq(&f.model, &prompt, &options).unwrap();
    assert_eq!(a.ids.len(), n);
    assert_eq!(a.ids, b.ids);
    assert_eq!(a.cache_bytes, (n + prompt.len()) * f.position_bytes());
}

/// A cache used with another encoder output shape, or made for another model, is a typed error.
#[test]
fn a_mismatched_cache_is_refused() {
    let _g = no_grad();
    let f = Fixture::load("t5");
    let enc = f.get("input_ids");
    let encoded = f.model.encode(&enc, None).unwrap();
    let start = Tensor::from_vec(vec![0i64, 0], &[2, 1], &Device::Cpu).unwrap();
    let mut cache = f.model.new_cache();
    f.model.decode_with_cache(&start, &encoded, None, &mut cache, true).unwrap();
    let shorter = encoded.narrow(1, 0, 4).unwrap();
    let err = f.model.decode_with_cache(&start, &shorter, None, &mut cache, true).unwrap_err().to_string();
    assert!(err.contains("same encoder output"), "{err}");
    let one = Tensor::from_vec(vec![0i64], &[1, 1], &Device::Cpu).unwrap();
    let err = f.model.decode_with_cache(&one, &encoded.narrow(0, 0, 1).unwrap(), None, &mut cache, true).unwrap_err();
    assert!(err.to_string().contains("batch"), "{err}");
    let other = Fixture::load("t5v11");
    let mut c = other.model.config().clone();
    c.num_decoder_layers += 1;
    let bigger = T5Model::new(&c, &Device::Cpu, false).unwrap();
    let err = f.model.decode_with_cache(&start, &encoded, None, &mut bigger.new_cache(), true).unwrap_err();
    assert!(err.to_string().contains("new_cache"), "{err}");
}
