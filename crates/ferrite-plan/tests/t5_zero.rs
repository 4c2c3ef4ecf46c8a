//! T5 encoder-decoders from their `config.json` (exact parameter counts and names, a training
//! step planned on `meta` and measured on `sim`), and DeepSpeed's ZeRO model-state estimate of
//! t5-3b reproduced from the ferrite plan of it.
use std::path::PathBuf;

use ferrite_memory::AllocatorConfig;
use ferrite_models::{HfConfig, T5Config, relative_position_bucket};
use ferrite_nn::Module;
use ferrite_plan::{
    AmpMode, ModelSizes, Offload, StepConfig, T5Workload, Target, ZeroSetup, evaluate, hf_workload, measure, plan_lock,
    record, zero_report,
};
use ferrite_tensor::Device;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn config(name: &str) -> T5Config {
    let path = data(&format!("{name}.json"));
    T5Config::from_json(&std::fs::read_to_string(&path).unwrap(), &path.display().to_string()).unwrap()
}

/// `<name>.counts.txt`, written by `tests/data/count_t5.py` with transformers on `meta`:
/// parameter count, DeepSpeed's largest layer, then the parameter names.
fn transformers_counts(name: &str) -> (u64, u64, Vec<String>) {
    let text = std::fs::read_to_string(data(&format!("{name}.counts.txt"))).unwrap();
    let mut lines = text.lines();
    let total = lines.next().unwrap().parse().unwrap();
    let largest = lines.next().unwrap().parse().unwrap();
    (total, largest, lines.map(str::to_string).collect())
}

#[test]
fn t5_models_match_transformers_counts_and_names() {
    let _meta = plan_lock();
    for name in ["t5-small", "t5-3b", "tiny-t5"] {
        let cfg = config(name);
        let analytic = cfg.num_parameters().unwrap();
        let model = T5Workload::new(cfg, 8).unwrap().build_model(&Device::Meta, false).unwrap();
        let (total, largest, names) = transformers_counts(name);
        let sizes = ModelSizes::of(&model);
        assert_eq!(sizes.total_params, total, "{name}");
        assert_eq!(analytic, total, "{name}");
        assert_eq!(sizes.largest_layer_params, largest, "{name}");
        if name != "tiny-t5" {
            assert_eq!(sizes.largest_layer, "shared", "{name}");
        }
        let ours: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(ours, names, "{name}: parameter names in transformers' order");
    }
    // The model cards' figures the files above hold.
    assert_eq!(transformers_counts("t5-small").0, 60_506_624);
    assert_eq!(transformers_counts("t5-3b").0, 2_851_598_336);
}

#[test]
fn t5_v1_1_is_gated_and_untied() {
    // google/t5-v1_1-small: gated-GELU feed-forward and its own lm_head (76,961,152 parameters;
    // transformers 5 ties the head regardless, see tests/data/count_t5.py).
    let _meta = plan_lock();
    let cfg = config("t5-v1_1-small");
    let analytic = cfg.num_parameters().unwrap();
    let model = T5Workload::new(cfg, 8).unwrap().build_model(&Device::Meta, false).unwrap();
    let built: u64 = model.parameters().iter().map(|p| p.numel() as u64).sum();
    assert_eq!((built, analytic), (76_961_152, 76_961_152));
    let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert!(names.iter().any(|n| n == "lm_head.weight"));
    assert!(names.iter().any(|n| n == "decoder.block.7.layer.2.DenseReluDense.wi_1.weight"));
}

#[test]
fn hf_config_dispatches_t5_to_the_encoder_decoder() {
    let w = hf_workload(&data("t5-small.json"), 16).unwrap();
    assert!(w.describe().contains("encoder-decoder"), "{}", w.describe());
    let w = hf_workload(&data("gpt2.json"), 16).unwrap();
    assert!(!w.describe().contains("encoder-decoder"));
    let msg = HfConfig::from_file(&data("t5-small.json")).unwrap_err().to_string();
    assert!(msg.contains("T5") && msg.contains("t5-small.json"), "{msg}");
    let msg = hf_workload(&data("no-such-config.json"), 16).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("cannot read"), "{msg}");
}

fn within(pred: u64, meas: u64, tol: f64) -> bool {
    (pred as f64 - meas as f64).abs() <= tol * meas as f64
}

#[test]
fn t5_step_predicted_on_meta_matches_sim() {
    let target = Target::parse("sim:a100-40gb", AllocatorConfig::default()).unwrap();
    let w = T5Workload::new(config("tiny-t5"), 12).unwrap();
    for (amp, ckpt) in [(None, false), (Some(AmpMode::Bf16), true)] {
        let cfg = StepConfig { amp, checkpoint_activations: ckpt, ..StepConfig::new(3) };
        let trace = record(&w, &cfg).unwrap();
        assert_eq!(trace.parameters, 55_392);
        assert!(trace.layers.iter().any(|l| l == "decoder.block.2"), "{:?}", trace.layers);
        let plan = evaluate(&trace, &target).unwrap();
        let m = measure(&w, &cfg, &target).unwrap();
        assert!(
            within(plan.peak_reserved_bytes, m.peak_reserved_bytes, 0.02),
            "{amp:?} {ckpt}: predicted {} measured {}",
            plan.peak_reserved_bytes,
            m.peak_reserved_bytes
        );
        assert!(within(plan.peak_allocated_bytes, m.peak_allocated_bytes, 0.02));
    }
}

// DeepSpeed's published oracle for t5-3b on 1 node × 8 GPUs (docs/code-docs/source/memory.rst,
// deepspeed.readthedocs.io/en/latest/memory.html, "API To Estimate Memory Usage"). The docs run
// each estimator twice: `_all_live` on the loaded model, and `_all_cold` with the sizes it
// printed (`total_params=2851e6, largest_layer_params=32e6`); the CPU and ZeRO-3 figures differ
// between the two ("a slight difference due to rounding").
/// ZeRO-2 per GPU: (offload_optimizer=cpu, offload_optimizer=none), both calls.
const DS_ZERO2_GPU: [&str; 2] = ["5.31", "15.93"];
/// ZeRO-2 per CPU (both rows): live, cold.
const DS_ZERO2_CPU_LIVE: &str = "127.48";
const DS_ZERO2_CPU_COLD: &str = "127.45";
/// ZeRO-3 rows, (per CPU, per GPU), in the order DeepSpeed prints them: offload param+optimizer
/// (zero_init 1, 0), optimizer only (1, 0), none (1, 0).
const DS_ZERO3_LIVE: [(&str, &str); 6] = [
    ("71.71", "0.12"),
    ("127.48", "0.12"),
    ("63.74", "0.79"),
    ("127.48", "0.79"),
    ("1.47", "6.10"),
    ("127.48", "6.10"),
];
const DS_ZERO3_COLD: [(&str, &str); 6] = [
    ("71.69", "0.12"),
    ("127.45", "0.12"),
    ("63.72", "0.78"),
    ("127.45", "0.78"),
    ("1.43", "6.09"),
    ("127.45", "6.09"),
];

#[test]
fn deepspeed_zero_estimates_of_t5_3b_come_out_of_the_plan() {
    let w = hf_workload(&data("t5-3b.json"), 8).unwrap();
    let step = StepConfig::new(1);
    let sizes = ModelSizes::of_workload(&*w, &step).unwrap();
    assert_eq!(sizes.largest_layer, "shared");
    // DeepSpeed prints "2851M total params, 32M largest layer params".
    assert_eq!((sizes.total_params / 1_000_000, sizes.largest_layer_params / 1_000_000), (2851, 32));
    let trace = record(&*w, &step).unwrap();
    assert_eq!(trace.parameters, sizes.total_params);

    let z2 = zero_report(&sizes, &trace, &ZeroSetup::new(2, 8, 1, Offload::None).unwrap());
    assert_eq!(z2.deepspeed.per_gpu_printed, "15.93");
    let gpu: Vec<&str> = z2.deepspeed_table.iter().map(|r| r.per_gpu_printed.as_str()).collect();
    assert_eq!(gpu, DS_ZERO2_GPU);
    for r in &z2.deepspeed_table {
        assert_eq!(r.per_cpu_printed, DS_ZERO2_CPU_LIVE);
    }
    let gpu: Vec<&str> = z2.deepspeed_table_as_printed.iter().map(|r| r.per_gpu_printed.as_str()).collect();
    assert_eq!(gpu, DS_ZERO2_GPU);
    for r in &z2.deepspeed_table_as_printed {
        assert_eq!(r.per_cpu_printed, DS_ZERO2_CPU_COLD);
    }

    let z3 = zero_report(&sizes, &trace, &ZeroSetup::new(3, 8, 1, Offload::None).unwrap());
    assert_eq!(z3.deepspeed.per_gpu_printed, "6.10");
    let rows = |t: &[ferrite_plan::ZeroEstimate]| -> Vec<(String, String)> {
        t.iter().map(|r| (r.per_cpu_printed.clone(), r.per_gpu_printed.clone())).collect()
    };
    let expect = |t: &[(&str, &str)]| -> Vec<(String, String)> {
        t.iter().map(|(c, g)| (c.to_string(), g.to_string())).collect()
    };
    assert_eq!(rows(&z3.deepspeed_table), expect(&DS_ZERO3_LIVE));
    assert_eq!(rows(&z3.deepspeed_table_as_printed), expect(&DS_ZERO3_COLD));

    // ferrite's own model states: f32 weights, f32 gradients, AdamW's m and v, unsharded.
    let p = sizes.total_params;
    assert_eq!(z2.ferrite.parameters, 4 * p);
    assert_eq!(z2.ferrite.gradients, 4 * p);
    assert_eq!(z2.ferrite.optimizer_state, 8 * p);
    assert_eq!(z2.ferrite.total, 16 * p);
    // Every DeepSpeed byte is attributed to a stated component.
    let parts: u64 = z2.differences.iter().filter(|d| d.component != "total").map(|d| d.deepspeed_bytes).sum();
    assert_eq!(parts, z2.deepspeed.per_gpu_bytes);
    let parts: u64 = z3.differences.iter().filter(|d| d.component != "total").map(|d| d.deepspeed_bytes).sum();
    assert_eq!(parts, z3.deepspeed.per_gpu_bytes);
    assert!(z2.differences.iter().all(|d| !d.reason.is_empty()));
}

#[test]
fn relative_position_buckets_match_transformers() {
    // tests/data/t5-buckets.txt: transformers' `_relative_position_bucket` (t5_buckets.py).
    let text = std::fs::read_to_string(data("t5-buckets.txt")).unwrap();
    let mut n = 0;
    for line in text.lines() {
        let f: Vec<i64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        let got = relative_position_bucket(f[3], f[2] == 1, f[0] as usize, f[1] as usize);
        assert_eq!(got as i64, f[4], "{line}");
        n += 1;
    }
    assert_eq!(n, 4 * 601);
}

#[test]
fn deepspeed_zero3_rows_of_t5_small_on_one_gpu() {
    // DeepSpeed's `estimate_zero3_model_states_mem_needs_all_live(AutoModel("t5-small"),
    // num_gpus_per_node=1, num_nodes=1)` as printed (blog.csdn.net/u012327567/article/details/132278598):
    // "60M total params, 16M largest layer params", (per CPU, per GPU) in DeepSpeed's row order.
    const ROWS: [(&str, &str); 6] =
        [("1.52", "0.06"), ("1.52", "0.06"), ("1.35", "0.17"), ("1.35", "0.17"), ("0.09", "1.08"), ("0.34", "1.08")];
    let w = hf_workload(&data("t5-small.json"), 8).unwrap();
    let step = StepConfig::new(1);
    let sizes = ModelSizes::of_workload(&*w, &step).unwrap();
    let trace = record(&*w, &step).unwrap();
    let z = zero_report(&sizes, &trace, &ZeroSetup::new(3, 1, 1, Offload::None).unwrap());
    let got: Vec<(&str, &str)> =
        z.deepspeed_table.iter().map(|r| (r.per_cpu_printed.as_str(), r.per_gpu_printed.as_str())).collect();
    assert_eq!(got, ROWS);
}
