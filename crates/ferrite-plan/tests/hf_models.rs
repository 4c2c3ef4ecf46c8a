//! Hugging Face configs: exact parameter counts of the real models, errors that name the key,
//! and the planner's prediction against the same step measured on a `sim` device.
use std::path::PathBuf;

use ferrite_memory::AllocatorConfig;
use ferrite_models::HfConfig;
use ferrite_nn::Module;
use ferrite_plan::{AmpMode, HfDecoder, PlanError, StepConfig, Target, evaluate, measure, record};
use ferrite_tensor::Device;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn built_count(file: &str) -> (u64, u64) {
    let cfg = HfConfig::from_file(&data(file)).unwrap();
    let analytic = cfg.num_parameters().unwrap();
    let model = HfDecoder::new(cfg, 16).unwrap().build_model(&Device::Meta, false).unwrap();
    let built: u64 = model.parameters().iter().map(|p| p.numel() as u64).sum();
    (built, analytic)
}

#[test]
fn parameter_counts_equal_the_real_models() {
    // GPT-2 small (tied embeddings), Llama-2-7B, Mistral-7B (grouped-query attention): the
    // counts their model cards and `sum(p.numel())` in transformers give.
    for (file, real) in
        [("gpt2.json", 124_439_808u64), ("llama-2-7b.json", 6_738_415_616), ("mistral-7b.json", 7_241_732_096)]
    {
        let (built, analytic) = built_count(file);
        assert_eq!(built, real, "{file}");
        assert_eq!(analytic, real, "{file}");
    }
}

#[test]
fn bad_configs_name_the_key() {
    let e = |json: &str| HfConfig::from_json(json, "config.json").unwrap_err().to_string();
    let msg = e(r#"{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10}"#);
    assert!(msg.contains("num_attention_heads"), "{msg}");
    let msg =
        e(r#"{"model_type": "gpt2", "n_embd": 64, "n_head": 5, "n_layer": 2, "n_positions": 8, "vocab_size": 10}"#);
    assert!(msg.contains("does not divide") && msg.contains("64"), "{msg}");
    let msg = e(
        r#"{"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10, "intermediate_size": 8}"#,
    );
    assert!(msg.contains("hidden_size") && msg.contains("positive integer"), "{msg}");
    let msg = e(
        r#"{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 3, "vocab_size": 10, "intermediate_size": 8}"#,
    );
    assert!(msg.contains("num_key_value_heads"), "{msg}");
    assert!(e("[1, 2]").contains("JSON object"));
    assert!(e("{").contains("not valid JSON"));
    let missing = HfConfig::from_file(&data("no-such-config.json")).unwrap_err().to_string();
    assert!(missing.contains("no-such-config.json") && missing.contains("cannot read"), "{missing}");
}

#[test]
fn an_absurd_config_is_a_typed_error_not_an_abort() {
    // Issue 33: 2^30 layers of width 2^40 aborted the process sizing the list of blocks.
    let path = std::env::temp_dir().join(format!("ferrite-absurd-config-{}.json", std::process::id()));
    std::fs::write(
        &path,
        r#"{"model_type": "llama", "hidden_size": 1099511627776, "num_hidden_layers": 1073741824, "num_attention_heads": 8, "intermediate_size": 64, "vocab_size": 100}"#,
    )
    .unwrap();
    let e = ferrite_plan::hf_workload(&path, 16).err().expect("refused").to_string();
    let _ = std::fs::remove_file(&path);
    assert!(e.contains("hidden_size") && e.contains("1099511627776"), "{e}");
    let mut cfg = HfConfig::from_file(&data("tiny-gpt2.json")).unwrap();
    cfg.num_layers = 1 << 30;
    let e = HfDecoder::new(cfg, 16).unwrap().build_model(&Device::Meta, false).unwrap_err().to_string();
    assert!(e.contains("num_hidden_layers") && e.contains("1073741824"), "{e}");
}

fn within(pred: u64, meas: u64, tol: f64) -> bool {
    (pred as f64 - meas as f64).abs() <= tol * meas as f64
}

#[test]
fn predictions_match_the_step_measured_on_sim() {
    let target = Target::parse("sim:a100-40gb", AllocatorConfig::default()).unwrap();
    for file in ["tiny-gpt2.json", "tiny-llama-gqa.json"] {
        let w = HfDecoder::new(HfConfig::from_file(&data(file)).unwrap(), 16).unwrap();
        for (amp, ckpt) in [(None, false), (Some(AmpMode::Bf16), true)] {
            let cfg = StepConfig { amp, checkpoint_activations: ckpt, ..StepConfig::new(3) };
            let plan = evaluate(&record(&w, &cfg).unwrap(), &target).unwrap();
            let m = measure(&w, &cfg, &target).unwrap();
            assert!(plan.fits);
            assert!(
                within(plan.peak_reserved_bytes, m.peak_reserved_bytes, 0.02),
                "{file} {amp:?} {ckpt}: predicted {} measured {}",
                plan.peak_reserved_bytes,
                m.peak_reserved_bytes
            );
            assert!(within(plan.peak_allocated_bytes, m.peak_allocated_bytes, 0.02), "{file}");
        }
    }
}

#[test]
fn a_seven_billion_model_does_not_fit_a_t4_and_says_where() {
    let w = HfDecoder::new(HfConfig::from_file(&data("llama-2-7b.json")).unwrap(), 128).unwrap();
    let plan = evaluate(
        &record(&w, &StepConfig::new(1)).unwrap(),
        &Target::parse("sim:t4-16gb", AllocatorConfig::default()).unwrap(),
    )
    .unwrap();
    assert!(!plan.fits);
    assert!(plan.headroom_bytes < 0);
    // Parameters alone are 4 bytes × 6.7 B.
    assert_eq!(plan.breakdown.parameters, 4 * 6_738_415_616);
    let oom = plan.oom.expect("where it runs out");
    assert_eq!(oom.step, 1);
    let err = PlanError::InvalidSetting { what: "x".into(), reason: "y".into() };
    assert_eq!(err.to_string(), "invalid x: y");
}
