//! The planner's contracts seen from outside: breakdowns add up, plans do not disturb each
//! other when run in parallel, searches and job sharing, bad input as typed errors.
use std::path::PathBuf;

use ferrite_memory::{AllocatorConfig, GpuProfile};
use ferrite_models::HfConfig;
use ferrite_plan::{
    AmpMode, Category, HfDecoder, PlanError, StepConfig, Target, evaluate, find_batch_size, plan, plan_jobs, record,
    remedies, sweep_batch, target_batch,
};

fn tiny() -> HfDecoder {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-llama-gqa.json");
    HfDecoder::new(HfConfig::from_file(&path).unwrap(), 32).unwrap()
}

fn target(dev: &str) -> Target {
    Target::parse(dev, AllocatorConfig::default()).unwrap()
}

#[test]
fn the_breakdown_adds_up_to_the_peak_and_the_json_has_the_keys() {
    let p = plan(&tiny(), &StepConfig::new(4), &target("sim:a100-40gb")).unwrap();
    let b = &p.breakdown;
    let sum: u64 = b.parts().iter().map(|(_, v)| v).sum();
    assert_eq!(sum, p.peak_reserved_bytes + b.context_overhead);
    assert!(b.parameters > 0 && b.activations > 0);
    assert_eq!(p.capacity_bytes, 42_505_273_344);
    let j = serde_json::to_value(&p).unwrap();
    for k in ["fits", "parameters", "peak_allocated_bytes", "peak_reserved_bytes", "capacity_bytes", "breakdown"] {
        assert!(j.get(k).is_some(), "{k}");
    }
    assert_eq!(j["parameters"], p.parameters);
    assert!(p.peak_at.is_some());
    let layers: Vec<&str> = p.activations_by_layer.iter().map(|l| l.layer.as_str()).collect();
    assert!(layers.contains(&"model.layers.0") && layers.contains(&"model.layers.1"), "{layers:?}");
}

#[test]
fn categories_follow_the_step() {
    let t = record(&tiny(), &StepConfig::new(2)).unwrap();
    let cats: Vec<Category> = t.info.iter().flatten().map(|i| i.category).collect();
    for c in [Category::Parameters, Category::Gradients, Category::OptimizerState, Category::Activations] {
        assert!(cats.contains(&c), "{c:?}");
    }
    // AdamW keeps two moments per parameter (plus a step counter per tensor).
    let bytes = |c| -> u64 {
        t.events
            .iter()
            .zip(&t.info)
            .filter(|(_, i)| i.as_ref().is_some_and(|i| i.category == c))
            .map(|(e, _)| e.size)
            .sum()
    };
    assert!(bytes(Category::OptimizerState) >= 2 * bytes(Category::Parameters));
}

#[test]
fn parallel_plans_do_not_disturb_each_other() {
    let alone = plan(&tiny(), &StepConfig::new(4), &target("sim:a100-40gb")).unwrap();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let b = if i % 2 == 0 { 4 } else { 8 };
                (b, plan(&tiny(), &StepConfig::new(b), &target("sim:a100-40gb")).unwrap().peak_reserved_bytes)
            })
        })
        .collect();
    for h in handles {
        let (b, peak) = h.join().unwrap();
        if b == 4 {
            assert_eq!(peak, alone.peak_reserved_bytes);
        }
    }
}

#[test]
fn checkpointing_and_amp_lower_the_activations() {
    let t = target("sim:a100-40gb");
    let base = plan(&tiny(), &StepConfig::new(16), &t).unwrap();
    let ckpt = plan(&tiny(), &StepConfig { checkpoint_activations: true, ..StepConfig::new(16) }, &t).unwrap();
    let amp = plan(&tiny(), &StepConfig { amp: Some(AmpMode::Bf16), ..StepConfig::new(16) }, &t).unwrap();
    let saved = |p: &ferrite_plan::MemoryPlan| p.activations_by_layer.iter().map(|l| l.bytes).sum::<u64>();
    assert!(saved(&ckpt) < saved(&base), "{} {}", saved(&ckpt), saved(&base));
    assert!(amp.peak_allocated_bytes < base.peak_allocated_bytes || saved(&amp) < saved(&base));
}

#[test]
fn the_largest_batch_is_found_and_checked() {
    // A card of 64 MiB: the tiny model's states are small, activations grow with the batch.
    let t = target("sim:64MiB");
    let s = find_batch_size(&tiny(), &StepConfig::new(1), &t).unwrap();
    assert!(s.max_batch_size >= 1);
    assert!(s.plan.fits);
    let next = plan(&tiny(), &StepConfig::new(s.max_batch_size + 1), &t).unwrap();
    assert!(!next.fits, "batch {} + 1 fits too", s.max_batch_size);
    assert!(s.monotone);
    let sweep = sweep_batch(&tiny(), &StepConfig::new(1), &t, &[1, 2, 4]).unwrap();
    assert!(sweep.windows(2).all(|w| w[0].peak_allocated_bytes <= w[1].peak_allocated_bytes));
}

#[test]
fn nothing_fits_is_a_typed_error() {
    let e = find_batch_size(&tiny(), &StepConfig::new(1), &target("sim:1MiB")).unwrap_err();
    assert!(matches!(e, PlanError::NothingFits { .. }), "{e}");
    assert!(e.to_string().contains("even --batch 1"), "{e}");
}

#[test]
fn unknown_gpus_list_the_known_ones() {
    let e = Target::parse("sim:a100-41gb", AllocatorConfig::default()).unwrap_err().to_string();
    assert!(e.contains("a100-41gb") && e.contains("sim:h100-80gb") && e.contains("mig-3g.20gb"), "{e}");
    let e = plan(&tiny(), &StepConfig::new(0), &target("sim:a100-40gb")).unwrap_err().to_string();
    assert!(e.contains("--batch 0"), "{e}");
}

#[test]
fn jobs_share_the_card_and_mig_slices_are_targets() {
    let t = target("sim:a100-40gb");
    let j = plan_jobs(&tiny(), &StepConfig::new(4), &t, 4).unwrap();
    assert!(j.fit_together);
    let profile = GpuProfile::lookup("a100-40gb").unwrap();
    let share = (profile.total_bytes - 4 * profile.context_overhead_bytes) as f64 / 4.0 / profile.total_bytes as f64;
    assert!(j.memory_fraction <= share && j.memory_fraction > share - 0.011, "{}", j.memory_fraction);
    let mig = plan(&tiny(), &StepConfig::new(4), &target("sim:a100-40gb-mig-1g.5gb")).unwrap();
    assert_eq!(mig.capacity_bytes, 4864 << 20);
    assert!(mig.fits);
}

#[test]
fn target_batch_ranks_plans_and_remedies_save_bytes() {
    let t = target("sim:64MiB");
    let tb = target_batch(&tiny(), &StepConfig::new(1), &t, 64).unwrap();
    assert!(!tb.fitting.is_empty());
    assert!(tb.fitting.windows(2).all(|w| w[0].relative_cost <= w[1].relative_cost));
    for c in &tb.fitting {
        assert_eq!(c.micro_batch * c.accum_steps, 64);
        assert!(c.peak_reserved_bytes <= t.usable_bytes());
    }
    let r = remedies(&tiny(), &StepConfig::new(64), &t).unwrap();
    assert!(r.iter().any(|r| r.saves_bytes > 0), "{r:?}");
    assert!(r.windows(2).all(|w| w[0].fits >= w[1].fits));
}

#[test]
fn when_nothing_fits_the_advice_names_the_smallest_card_that_would() {
    // GPT-2 small: 124 M parameters need about 2 GB with gradients and AdamW moments.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2.json");
    let w = HfDecoder::new(HfConfig::from_file(&path).unwrap(), 64).unwrap();
    let tb = target_batch(&w, &StepConfig::new(1), &target("sim:512MiB"), 1).unwrap();
    assert!(tb.fitting.is_empty());
    let advice = tb.advice.unwrap();
    assert!(advice.contains("nothing ferrite can run fits") && advice.contains("sim:a100-40gb-mig-1g.5gb"), "{advice}");
    assert!(!advice.contains(" bytes"), "sizes are human-readable: {advice}");
    assert!(evaluate(&record(&w, &StepConfig::new(1)).unwrap(), &target("sim:t4-16gb")).unwrap().fits);
}

#[test]
fn way_forward_routes_fit_and_a_variant_ranks_by_what_it_trains() {
    use ferrite_plan::{Variant, way_forward};
    use std::sync::Arc;
    let t = target("sim:64MiB");
    let config = StepConfig::new(256);
    assert!(!plan(&tiny(), &config, &t).unwrap().fits, "the premise: batch 256 does not fit in 64 MiB");
    // A stand-in for adapters: the same family at seq 8, trained "adapters only".
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-llama-gqa.json");
    let short = HfDecoder::new(HfConfig::from_file(&path).unwrap(), 8).unwrap();
    let variant = Variant {
        label: "shorter sequences".into(),
        flags: vec!["--seq".into(), "8".into()],
        workload: Arc::new(short),
        gpus: 1,
        adapters_only: true,
        compute: 0.5,
        sharding: None,
    };
    let w = way_forward(&tiny(), std::slice::from_ref(&variant), &config, &t, None).unwrap();
    assert!(w.nothing_fits().is_none());
    assert!(!w.routes.is_empty());
    let first_variant = w.routes.iter().position(|r| r.variant.is_some()).expect("the variant fits too");
    assert!(w.routes[..first_variant].iter().all(|r| !r.adapters_only && r.variant.is_none()));
    assert!(w.routes[first_variant..].iter().all(|r| r.adapters_only), "{:?}", w.routes);
    for r in &w.routes {
        assert!(r.fits && r.peak_reserved_bytes <= t.usable_bytes());
        assert_eq!(r.micro_batch * r.accum_steps, 256);
        assert!(r.flags.windows(2).any(|f| f[0] == "--batch-size" && f[1] == r.micro_batch.to_string()));
        if r.variant.is_some() {
            assert!(r.flags.ends_with(&variant.flags), "{:?}", r.flags);
        }
    }
    // The cheapest route of the model itself, planned again from its own settings, has its peak.
    let r = &w.routes[0];
    let again = StepConfig {
        batch: r.micro_batch,
        accum_steps: r.accum_steps,
        amp: r.amp.map(|a| if a == "bf16" { AmpMode::Bf16 } else { AmpMode::F16 }),
        checkpoint_activations: r.checkpoint_activations,
        ..config.clone()
    };
    let mut cfg = AllocatorConfig::default();
    if !r.alloc_conf.is_empty() {
        cfg.apply(&r.alloc_conf).unwrap();
    }
    let p = plan(&tiny(), &again, &Target { config: cfg, ..t.clone() }).unwrap();
    assert!(p.fits);
    assert_eq!(p.peak_reserved_bytes, r.peak_reserved_bytes);
}
