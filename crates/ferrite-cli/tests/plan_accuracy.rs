//! `ferrite plan`'s promise: the predicted peak reserved memory of a training step is within 2 %
//! of the same step run on the `sim` device and measured by its allocator — for every built-in
//! trainer's model, with AMP and activation checkpointing on and off.
use ferrite_memory::AllocatorConfig;
use ferrite_plan::Builtin;
use ferrite_plan::{AmpMode, StepConfig, Target, Workload, evaluate, measure, record};

fn models() -> Vec<(&'static str, Builtin)> {
    vec![
        ("mlp", Builtin::Mlp { input: [1, 8, 8], hidden: 256, layers: 4, classes: 10, dropout: 0.1 }),
        ("cnn", Builtin::Cnn { input: [1, 28, 28], hidden: 16, layers: 2, classes: 10 }),
        ("lstm", Builtin::Lstm { vocab: 96, hidden: 64, layers: 2, seq: 16, dropout: 0.0 }),
        ("transformer", Builtin::Transformer { vocab: 96, d_model: 64, heads: 4, layers: 2, seq: 32, dropout: 0.1 }),
    ]
}

fn check(name: &str, w: &dyn Workload, cfg: &StepConfig, target: &Target) -> String {
    let plan = evaluate(&record(w, cfg).unwrap(), target).unwrap();
    let m = measure(w, cfg, target).unwrap();
    let err = |p: u64, q: u64| (p as f64 - q as f64) / q as f64;
    let (er, ea) =
        (err(plan.peak_reserved_bytes, m.peak_reserved_bytes), err(plan.peak_allocated_bytes, m.peak_allocated_bytes));
    let line = format!(
        "{name:<12} amp {:<5} ckpt {:<5}: reserved predicted {} measured {} ({:+.3}%), allocated predicted {} measured {} ({:+.3}%)",
        cfg.amp.map_or("off", |a| a.name()),
        cfg.checkpoint_activations,
        plan.peak_reserved_bytes,
        m.peak_reserved_bytes,
        er * 100.0,
        plan.peak_allocated_bytes,
        m.peak_allocated_bytes,
        ea * 100.0
    );
    assert!(er.abs() <= 0.02, "{line}");
    assert!(plan.fits);
    line
}

#[test]
fn predicted_peaks_are_within_two_percent_of_the_measured_step() {
    let target = Target::parse("sim:t4-16gb", AllocatorConfig::default()).unwrap();
    for (name, w) in models() {
        for amp in [None, Some(AmpMode::Bf16), Some(AmpMode::F16)] {
            for ckpt in [false, true] {
                let cfg = StepConfig { amp, checkpoint_activations: ckpt, ..StepConfig::new(16) };
                println!("{}", check(name, &w, &cfg, &target));
            }
        }
    }
}

#[test]
fn accumulation_sgd_and_allocator_settings_are_predicted_too() {
    let mut config = AllocatorConfig::default();
    config.apply("expandable_segments:True").unwrap();
    let expandable = Target::parse("sim:a100-40gb", config).unwrap();
    let (name, w) = models().remove(3);
    let cfg = StepConfig { accum_steps: 2, optimizer: ferrite_plan::OptimizerKind::Sgd, ..StepConfig::new(8) };
    println!("{}", check(name, &w, &cfg, &expandable));
    let mut fraction = Target::parse("sim:a100-40gb", AllocatorConfig::default()).unwrap();
    fraction.memory_fraction = Some(0.5);
    println!("{}", check(name, &w, &StepConfig::new(8), &fraction));
}
