//! Issue 33, defect 1: a `config.json` whose numbers are absurd or overflow is a typed error
//! naming the key and the figure, before anything is sized from it — never an abort. And the
//! config parsers, fed random numbers, never panic.
use ferrite_models::limits::{MAX_LAYERS, MAX_PARAMETERS};
use ferrite_models::{Decoder, HfConfig, ModelError, T5Config, T5Model};
use ferrite_tensor::Device;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn gpt2() -> Value {
    json!({"model_type": "gpt2", "n_embd": 16, "n_head": 2, "n_layer": 2, "n_positions": 16, "vocab_size": 50})
}

fn llama() -> Value {
    json!({"model_type": "llama", "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 2, "intermediate_size": 24, "vocab_size": 50})
}

fn t5() -> Value {
    json!({"model_type": "t5", "d_model": 8, "d_kv": 4, "d_ff": 16, "num_heads": 2, "num_layers": 1, "vocab_size": 10})
}

fn with(mut v: Value, key: &str, x: Value) -> String {
    v.as_object_mut().unwrap().insert(key.to_string(), x);
    v.to_string()
}

/// The error of a config that must be refused for a limit, and its message.
fn limit_error(r: Result<impl std::fmt::Debug, ModelError>) -> String {
    match r {
        Err(e @ ModelError::ConfigLimit { .. }) => e.to_string(),
        other => panic!("expected ModelError::ConfigLimit, got {other:?}"),
    }
}

#[test]
fn issue_33_config_is_refused_with_key_and_figure() {
    // The config of the report: 2^30 layers of width 2^40 (it aborted the process).
    let text = with(
        serde_json::from_str(&with(llama(), "num_hidden_layers", json!(1u64 << 30))).unwrap(),
        "hidden_size",
        json!(1u64 << 40),
    );
    let msg = limit_error(HfConfig::from_json(&text, "config.json"));
    assert!(msg.starts_with("config.json: "), "{msg}");
    // The first key out of range is named (the width is read before the depth).
    assert!(msg.contains("hidden_size") && msg.contains("1099511627776"), "{msg}");
    let msg = limit_error(HfConfig::from_json(&with(llama(), "num_hidden_layers", json!(1u64 << 30)), "config.json"));
    assert!(msg.contains("num_hidden_layers") && msg.contains("1073741824") && msg.contains("10000"), "{msg}");
}

#[test]
fn every_size_key_has_a_limit() {
    let big = json!(1u64 << 50);
    for key in ["n_embd", "n_head", "n_layer", "n_positions", "vocab_size", "n_inner"] {
        let msg = limit_error(HfConfig::from_json(&with(gpt2(), key, big.clone()), "c.json"));
        assert!(msg.contains(key) && msg.contains("1125899906842624"), "{key}: {msg}");
    }
    for key in [
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "num_hidden_layers",
        "intermediate_size",
        "vocab_size",
        "head_dim",
        "max_position_embeddings",
        "sliding_window",
    ] {
        let base =
            if key == "sliding_window" { with(llama(), "model_type", json!("mistral")) } else { llama().to_string() };
        let msg =
            limit_error(HfConfig::from_json(&with(serde_json::from_str(&base).unwrap(), key, big.clone()), "c.json"));
        assert!(msg.contains(key) && msg.contains("1125899906842624"), "{key}: {msg}");
    }
    for key in ["d_model", "d_kv", "d_ff", "num_heads", "num_layers", "num_decoder_layers", "vocab_size"] {
        let msg = limit_error(T5Config::from_json(&with(t5(), key, big.clone()), "c.json"));
        assert!(msg.contains(key) && msg.contains("1125899906842624"), "{key}: {msg}");
    }
    // Layers: the limit itself is accepted by the parser, one more is not.
    let at = with(gpt2(), "n_layer", json!(MAX_LAYERS));
    assert!(HfConfig::from_json(&at, "c").is_ok());
    let msg = limit_error(HfConfig::from_json(&with(gpt2(), "n_layer", json!(MAX_LAYERS + 1)), "c"));
    assert!(msg.contains("10001") && msg.contains("10000 layers"), "{msg}");
}

#[test]
fn parameter_counts_beyond_the_ceiling_or_u64_are_refused() {
    // Each size within its own limit, the product beyond 10^13.
    let text = with(
        serde_json::from_str(&with(llama(), "hidden_size", json!(1u64 << 30))).unwrap(),
        "vocab_size",
        json!(1u64 << 30),
    );
    let msg = limit_error(HfConfig::from_json(&text, "c.json"));
    assert!(msg.contains("parameters") && msg.contains(&MAX_PARAMETERS.to_string()), "{msg}");
    // Hand-built configs whose counts overflow u64: `num_parameters` is None, building refuses.
    let mut c = HfConfig::from_json(&llama().to_string(), "c").unwrap();
    c.hidden_size = usize::MAX / 2;
    assert_eq!(c.num_parameters(), None);
    let msg = limit_error(Decoder::new(&c, &Device::Meta, false));
    assert!(msg.contains("hidden_size"), "{msg}");
    let mut t = T5Config::from_json(&t5().to_string(), "c").unwrap();
    t.d_ff = usize::MAX;
    assert_eq!(t.num_parameters(), None);
    limit_error(T5Model::new(&t, &Device::Meta, false));
}

#[test]
fn a_sliding_window_shorter_than_the_sequence_runs_on_meta() {
    let text =
        with(serde_json::from_str(&with(llama(), "model_type", json!("mistral"))).unwrap(), "sliding_window", json!(4));
    let c = HfConfig::from_json(&text, "c").unwrap();
    let m = Decoder::new(&c, &Device::Meta, true).unwrap();
    let ids = ferrite_tensor::Tensor::zeros(&[2, 9], ferrite_tensor::DType::I64, &Device::Meta).unwrap();
    let logits = ferrite_nn::Module::forward(&m, &ids).unwrap();
    assert_eq!(logits.shape(), [2, 9, 50]);
}

#[test]
fn zero_negative_and_non_integer_sizes_name_the_key() {
    for bad in [json!(0), json!(-3), json!(2.5), json!("64"), json!(1e300)] {
        let e = HfConfig::from_json(&with(llama(), "hidden_size", bad.clone()), "c.json").unwrap_err().to_string();
        assert!(e.contains("hidden_size") && e.contains("positive integer"), "{bad}: {e}");
    }
}

/// A JSON value of any of the kinds a hostile config may hold; small sizes weigh most, so that
/// many configs parse and their models are built too.
fn any_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        12 => (1u64..9).prop_map(|k| Value::from(2 * k)),
        2 => (0u64..200).prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => (0u32..64).prop_map(|s| Value::from(1u64 << s)),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null)),
        2 => Just(Value::Null),
        1 => Just(Value::Bool(true)),
        1 => Just(json!("12")),
        1 => Just(json!({"rope_type": "llama3", "factor": 8.0})),
    ]
}

const DECODER_KEYS: &[&str] = &[
    "n_embd",
    "n_layer",
    "n_head",
    "n_positions",
    "n_inner",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "head_dim",
    "max_position_embeddings",
    "vocab_size",
    "sliding_window",
    "rope_theta",
    "rms_norm_eps",
    "layer_norm_epsilon",
    "tie_word_embeddings",
    "rope_scaling",
    "rope_parameters",
];

const T5_KEYS: &[&str] = &[
    "d_model",
    "d_kv",
    "d_ff",
    "num_heads",
    "num_layers",
    "num_decoder_layers",
    "vocab_size",
    "relative_attention_num_buckets",
    "relative_attention_max_distance",
    "layer_norm_epsilon",
];

fn config(model_type: &str, keys: &[&str], values: Vec<Value>) -> String {
    let mut m = Map::new();
    m.insert("model_type".into(), Value::from(model_type));
    for (k, v) in keys.iter().zip(values) {
        if !v.is_null() {
            m.insert(k.to_string(), v);
        }
    }
    Value::Object(m).to_string()
}

/// 512 cases by default; `FERRITE_CONFIG_FUZZ_CASES=1000000` for a long run.
fn cases() -> u32 {
    std::env::var("FERRITE_CONFIG_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Random numbers in every size key: a typed result, never a panic; what parses builds on
    /// `meta` (when small enough to build quickly) with the parameter count it announced.
    #[test]
    fn decoder_configs_never_panic(
        model_type in prop::sample::select(vec!["gpt2", "llama", "mistral", "qwen2", "", "t5x"]),
        values in prop::collection::vec(any_number(), DECODER_KEYS.len()),
    ) {
        let text = config(model_type, DECODER_KEYS, values);
        if let Ok(c) = HfConfig::from_json(&text, "fuzz.json") {
            let count = c.num_parameters().expect("a parsed config has a count");
            prop_assert!(count <= MAX_PARAMETERS);
            if c.num_layers <= 16 {
                let m = Decoder::new(&c, &Device::Meta, false).unwrap();
                let built: u64 = ferrite_nn::Module::parameters(&m).iter().map(|p| p.numel() as u64).sum();
                prop_assert_eq!(built, count);
            }
        }
    }

    #[test]
    fn t5_configs_never_panic(values in prop::collection::vec(any_number(), T5_KEYS.len())) {
        let text = config("t5", T5_KEYS, values);
        if let Ok(c) = T5Config::from_json(&text, "fuzz.json") {
            let count = c.num_parameters().expect("a parsed config has a count");
            prop_assert!(count <= MAX_PARAMETERS);
            if c.num_layers <= 8 && c.num_decoder_layers <= 8 {
                let m = T5Model::new(&c, &Device::Meta, false).unwrap();
                let built: u64 = ferrite_nn::Module::parameters(&m).iter().map(|p| p.numel() as u64).sum();
                prop_assert_eq!(built, count);
            }
        }
    }
}
