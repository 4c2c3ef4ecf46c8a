//! Text and JSON output of `ferrite plan`.
use ferrite_memory::OomDiagnosis;
use ferrite_memory::format_size;
use ferrite_plan::{
    BatchSearch, JobsPlan, LayerBytes, MemoryPlan, Route, ShardedPlan, Target, TargetBatchPlan, WayForward, ZeroReport,
    ZeroStage,
};

fn json(v: &impl serde::Serialize) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("error: cannot write JSON: {e}"),
    }
}

fn settings(p: &MemoryPlan) -> String {
    let mut s = format!("batch {}", p.batch_size);
    if p.accum_steps > 1 {
        s += &format!(" x {} accumulation steps", p.accum_steps);
    }
    s += &format!(", {}", p.optimizer);
    s += &format!(", amp {}", p.amp.unwrap_or("off"));
    s += if p.checkpoint_activations { ", activation checkpointing" } else { "" };
    if !p.alloc_conf.is_empty() {
        s += &format!(", alloc-conf {}", p.alloc_conf);
    }
    if let Some(f) = p.memory_fraction {
        s += &format!(", memory fraction {f}");
    }
    s
}

fn signed(bytes: i64) -> String {
    if bytes < 0 { format!("-{}", format_size(bytes.unsigned_abs())) } else { format_size(bytes as u64) }
}

fn pct(pred: u64, meas: u64) -> String {
    if meas == 0 {
        return "n/a".into();
    }
    format!("{:+.2}%", (pred as f64 - meas as f64) / meas as f64 * 100.0)
}

/// The plan's JSON object, with the way forward under `way_forward` when it does not fit.
fn plan_value(p: &MemoryPlan, forward: Option<&WayForward>) -> Option<serde_json::Value> {
    let mut v = match serde_json::to_value(p) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: cannot write JSON: {e}");
            return None;
        }
    };
    if let (Some(obj), Some(f)) = (v.as_object_mut(), forward)
        && let Ok(fv) = serde_json::to_value(f)
    {
        obj.insert("way_forward".into(), fv);
    }
    Some(v)
}

/// One plan, as text or JSON; `forward` (when it does not fit) with `command`, the `ferrite
/// train` command its routes' flags complete.
pub fn plan(p: &MemoryPlan, forward: Option<&WayForward>, command: &str, as_json: bool) {
    if as_json {
        if let Some(v) = plan_value(p, forward) {
            json(&v);
        }
        return;
    }
    plan_text(p);
    if let Some(f) = forward {
        way_forward(f, command);
    }
}

fn plan_text(p: &MemoryPlan) {
    println!("ferrite plan: {} — {} parameters", p.model, p.parameters);
    println!(
        "  on {} ({}, {} total, {} CUDA context): {}",
        p.device,
        p.gpu,
        format_size(p.capacity_bytes),
        format_size(p.breakdown.context_overhead),
        settings(p)
    );
    if p.fits {
        println!(
            "  FITS: peak reserved {} of {} the allocator may use (headroom {}); peak allocated {}",
            format_size(p.peak_reserved_bytes),
            format_size(p.usable_bytes),
            signed(p.headroom_bytes),
            format_size(p.peak_allocated_bytes)
        );
    } else {
        println!(
            "  DOES NOT FIT: the step needs {} reserved ({} allocated); the allocator may use {} ({} missing)",
            format_size(p.peak_reserved_bytes),
            format_size(p.peak_allocated_bytes),
            format_size(p.usable_bytes),
            signed(-p.headroom_bytes)
        );
        if let Some(o) = &p.oom {
            let why = match o.diagnosis {
                OomDiagnosis::Exhausted => "the live tensors and this request need more than the card has",
                OomDiagnosis::Fragmented => "enough memory is free in total, but not in one piece",
            };
            println!(
                "  it runs out of memory {}, asking for {}: {why}",
                o.phase.during(o.step),
                format_size(o.requested_bytes),
            );
        }
    }
    println!("  breakdown at the peak:");
    for (name, bytes) in p.breakdown.parts() {
        println!("    {name:<32} {:>12}", format_size(bytes));
    }
    println!("    {:<32} {:>12}", "device total", format_size(p.peak_reserved_bytes + p.breakdown.context_overhead));
    if let Some(s) = &p.peak_at {
        let layer = s.layer.as_deref().map(|l| format!(", in {l}")).unwrap_or_default();
        println!(
            "  the peak is {}{layer}, op {} allocating {}",
            s.phase.during(s.step),
            if s.op.is_empty() { "?" } else { &s.op },
            format_size(s.bytes)
        );
    }
    if p.activations_by_layer.len() > 1 {
        println!("  activations saved for backward, by layer:");
        for (name, bytes, count) in collapse_layers(&p.activations_by_layer) {
            let each = if count > 1 { " each" } else { "" };
            println!("    {name:<32} {:>12}{each}", format_size(bytes));
        }
    }
    if let (Some(a), Some(r)) = (p.measured_peak_allocated_bytes, p.measured_peak_reserved_bytes) {
        println!("  measured by running the step on {}:", p.device);
        println!(
            "    peak allocated  predicted {:>12}  measured {:>12}  ({})",
            format_size(p.peak_allocated_bytes),
            format_size(a),
            pct(p.peak_allocated_bytes, a)
        );
        println!(
            "    peak reserved   predicted {:>12}  measured {:>12}  ({})",
            format_size(p.peak_reserved_bytes),
            format_size(r),
            pct(p.peak_reserved_bytes, r)
        );
    }
}

/// `--sweep-batch`: a table and a text chart against the capacity line.
pub fn sweep(plans: &[MemoryPlan], target: &Target, as_json: bool) {
    let usable = target.usable_bytes();
    if as_json {
        let rows: Vec<_> = plans
            .iter()
            .map(|p| {
                serde_json::json!({
                    "batch": p.batch_size,
                    "fits": p.fits,
                    "peak_allocated_bytes": p.peak_allocated_bytes,
                    "peak_reserved_bytes": p.peak_reserved_bytes,
                })
            })
            .collect();
        return json(&serde_json::json!({
            "device": target.device_name(),
            "capacity_bytes": target.profile.total_bytes,
            "usable_bytes": usable,
            "sweep": rows,
        }));
    }
    let Some(first) = plans.first() else { return };
    println!(
        "ferrite plan --sweep-batch: {} on {} ({} usable)",
        first.model,
        target.device_name(),
        format_size(usable)
    );
    let top = plans.iter().map(|p| p.peak_reserved_bytes).max().unwrap_or(0).max(usable).max(1);
    const WIDTH: usize = 50;
    let col = |b: u64| ((b as f64 / top as f64) * WIDTH as f64).round() as usize;
    let cap = col(usable).min(WIDTH);
    println!("  {:>6}  {:>12}  {:>12}  {:<5} 0{}| capacity", "batch", "allocated", "reserved", "fits", " ".repeat(cap));
    for p in plans {
        let (a, r) = (col(p.peak_allocated_bytes).min(WIDTH), col(p.peak_reserved_bytes).min(WIDTH));
        let mut bar: Vec<char> = (0..=WIDTH)
            .map(|i| {
                if i < a {
                    '#'
                } else if i < r {
                    '+'
                } else {
                    ' '
                }
            })
            .collect();
        if cap <= WIDTH {
            bar[cap] = '|';
        }
        println!(
            "  {:>6}  {:>12}  {:>12}  {:<5}  {}",
            p.batch_size,
            format_size(p.peak_allocated_bytes),
            format_size(p.peak_reserved_bytes),
            if p.fits { "yes" } else { "no" },
            bar.into_iter().collect::<String>()
        );
    }
    println!("  # allocated, + reserved, | what the allocator may use");
}

pub fn batch_search(s: &BatchSearch, as_json: bool) {
    if as_json {
        return json(&serde_json::json!({
            "max_batch_size": s.max_batch_size,
            "monotone": s.monotone,
            "tried": s.tried,
            "plan": s.plan,
        }));
    }
    println!(
        "ferrite plan --find-batch-size: the largest micro-batch that fits on {} is {}",
        s.plan.device, s.max_batch_size
    );
    println!(
        "  at {}: peak reserved {} of {} usable (headroom {})",
        s.max_batch_size,
        format_size(s.plan.peak_reserved_bytes),
        format_size(s.plan.usable_bytes),
        signed(s.plan.headroom_bytes)
    );
    let tried: Vec<String> =
        s.tried.iter().map(|p| format!("{}{}", p.batch, if p.fits { "" } else { " (no)" })).collect();
    println!("  batches tried: {}", tried.join(", "));
    if s.monotone {
        println!("  fitting is monotone in the batch over the batches tried");
    } else {
        println!(
            "  warning: fitting is NOT monotone in the batch over the batches tried; check the neighbours of the answer"
        );
    }
}

pub fn target_batch(t: &TargetBatchPlan, command: &str, as_json: bool) {
    if as_json {
        return json(t);
    }
    println!("ferrite plan --target-batch {} on {}:", t.target_batch, t.way_forward.device);
    way_forward(&t.way_forward, command);
}

/// Routes shown in text (the JSON carries all of them).
const ROUTES_SHOWN: usize = 8;

/// The ranked ways to make a step fit, each with its peak and the command that runs it; or, when
/// nothing ferrite can run fits, the closest plan and by how much it misses.
pub fn way_forward(w: &WayForward, command: &str) {
    if let Some(nothing) = w.nothing_fits() {
        println!("  {nothing}");
        if let Some(c) = &w.closest {
            println!("    closest: {}", route_command(c, command));
        }
        return;
    }
    println!(
        "  ways to make it fit, effective batch {}, each planned on {} ({} usable), best first:",
        w.effective_batch,
        w.device,
        format_size(w.usable_bytes)
    );
    for (i, r) in w.routes.iter().take(ROUTES_SHOWN).enumerate() {
        println!("  {:>3}. {}", i + 1, route_summary(r));
        println!(
            "       peak reserved {}{} (headroom {}), compute {:.2}x{}",
            format_size(r.peak_reserved_bytes),
            r.planned_rank.map_or(String::new(), |k| format!(" per GPU (rank {k}, the fullest)")),
            signed(r.headroom_bytes),
            r.relative_cost,
            if r.gpus > 1 { format!(" over {} GPUs", r.gpus) } else { String::new() }
        );
        println!("       {}", route_command(r, command));
    }
    if w.routes.len() > ROUTES_SHOWN {
        println!("  ... and {} more (--json lists every route)", w.routes.len() - ROUTES_SHOWN);
    }
    println!(
        "  ranked: the same training on one GPU first, then on more GPUs, then adapters only; then by compute per effective batch (recompute +1/3, +2% per extra micro-step)"
    );
}

/// The command that runs route `r`: `mpirun -np N` first for a route over several GPUs.
pub fn route_command(r: &Route, command: &str) -> String {
    let launcher = if r.launcher.is_empty() { String::new() } else { format!("{} ", r.launcher) };
    format!("{launcher}{command} {}", r.flags.join(" "))
}

fn route_summary(r: &Route) -> String {
    if r.changes.is_empty() { "as asked".into() } else { r.changes.join(", ") }
}

/// Activation lines with runs of numbered layers of equal size collapsed:
/// `model.layers.0–31  821.27 MiB each`.
pub fn collapse_layers(layers: &[LayerBytes]) -> Vec<(String, u64, usize)> {
    fn numbered(name: &str) -> Option<(&str, usize)> {
        let (prefix, index) = name.rsplit_once('.')?;
        Some((prefix, index.parse().ok()?))
    }
    let mut out: Vec<(String, u64, usize)> = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let l = &layers[i];
        let mut j = i + 1;
        if let Some((prefix, first)) = numbered(&l.layer) {
            while j < layers.len()
                && layers[j].bytes == l.bytes
                && numbered(&layers[j].layer) == Some((prefix, first + (j - i)))
            {
                j += 1;
            }
            if j - i > 1 {
                out.push((format!("{prefix}.{first}\u{2013}{}", first + (j - i) - 1), l.bytes, j - i));
                i = j;
                continue;
            }
        }
        out.push((l.layer.clone(), l.bytes, 1));
        i += 1;
    }
    out
}

pub fn jobs(j: &JobsPlan, target: &Target, as_json: bool) {
    if as_json {
        return json(j);
    }
    println!(
        "ferrite plan --jobs {}: {} on {}",
        j.jobs,
        if j.fit_together { "they fit together" } else { "they do NOT fit together" },
        target.device_name()
    );
    println!(
        "  each job: set_per_process_memory_fraction({:.2}) (--memory-fraction {:.2}); its peak reserved {} + CUDA context {}",
        j.memory_fraction,
        j.memory_fraction,
        format_size(j.per_job.peak_reserved_bytes),
        format_size(target.profile.context_overhead_bytes)
    );
    println!(
        "  all {} jobs at their peaks: {} of {}",
        j.jobs,
        format_size(j.total_bytes),
        format_size(target.profile.total_bytes)
    );
}

/// A plan with `--zero`: the plan, then DeepSpeed's ZeRO model-state estimate of its model beside
/// ferrite's own model states (JSON: the plan's object with a `zero` key).
/// With ferrite's own ZeRO-1/2 run (`z.ferrite_sharded`) every rank's planned peak follows, with
/// `ddp`, the same ranks under DDP, for comparison (JSON: `zero.ferrite_sharded`, `zero.ferrite_ddp`).
pub fn plan_with_zero(
    p: &MemoryPlan,
    z: &ZeroReport,
    ddp: Option<&ShardedPlan>,
    forward: Option<&WayForward>,
    command: &str,
    step_flags: &str,
    as_json: bool,
) {
    if as_json {
        let Some(mut v) = plan_value(p, forward) else { return };
        if let (Some(obj), Ok(mut zv)) = (v.as_object_mut(), serde_json::to_value(z)) {
            if let (Some(zo), Some(d)) = (zv.as_object_mut(), ddp.and_then(|d| serde_json::to_value(d).ok())) {
                zo.insert("ferrite_ddp".into(), d);
            }
            obj.insert("zero".into(), zv);
        }
        return json(&v);
    }
    plan_text(p);
    zero(z);
    if let Some(s) = &z.ferrite_sharded {
        sharded(s, ddp, &format!("{command} {step_flags}"));
    }
    if let Some(f) = forward {
        way_forward(f, command);
    }
}

/// Every rank's planned peak of ferrite's own sharded run, and the command that runs it.
fn sharded(s: &ShardedPlan, ddp: Option<&ShardedPlan>, command: &str) {
    println!(
        "  ferrite's own {} over {} ranks on {} ({} usable each), planned rank by rank:",
        s.mode.name(),
        s.world,
        s.device,
        format_size(s.usable_bytes)
    );
    for r in &s.ranks {
        println!(
            "    rank {:>2}: peak reserved {:>10}, allocated {:>10}, shard {} values in {} pieces{}{}",
            r.rank,
            format_size(r.peak_reserved_bytes),
            format_size(r.peak_allocated_bytes),
            r.shard_values,
            r.shard_pieces,
            if r.fits { "" } else { "  DOES NOT FIT" },
            if r.rank == s.max_rank && s.ranks.len() > 1 { "  <- highest" } else { "" }
        );
    }
    if s.ranks.len() < s.world {
        println!("    (of {} ranks, rank 0, the fullest and the last are planned; the others lie between)", s.world);
    }
    if let Some(d) = ddp {
        println!(
            "    DDP over the same {} ranks: peak reserved {} per rank ({} is {:.1}% of it)",
            d.world,
            format_size(d.peak_reserved_bytes),
            s.mode.name(),
            100.0 * s.peak_reserved_bytes as f64 / d.peak_reserved_bytes.max(1) as f64
        );
    }
    println!(
        "    {}: mpirun -np {} {command} --distributed {}",
        if s.fits { "fits, run it with" } else { "does NOT fit on every rank; the command would be" },
        s.world,
        s.mode.train_flags().join(" ")
    );
}

fn zero(z: &ZeroReport) {
    let s = &z.setup;
    let stage = match s.stage {
        ZeroStage::Two => "ZeRO-2 (and ZeRO-1)",
        ZeroStage::Three => "ZeRO-3",
    };
    let plural = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    println!(
        "  {stage} model states, DeepSpeed's estimate from this model ({} parameters, largest layer `{}` {}) on {} x {}:",
        z.sizes.total_params,
        z.sizes.largest_layer,
        z.sizes.largest_layer_params,
        plural(s.nodes, "node", "nodes"),
        plural(s.gpus_per_node, "GPU", "GPUs")
    );
    println!("      per CPU |  per GPU | options");
    for r in &z.deepspeed_table {
        let mark = if r.options == z.deepspeed.options { "  <- this run" } else { "" };
        println!("    {:>7}GB | {:>6}GB | {}{mark}", r.per_cpu_printed, r.per_gpu_printed, r.options);
    }
    let cold: Vec<String> =
        z.deepspeed_table_as_printed.iter().map(|r| format!("{}/{}", r.per_cpu_printed, r.per_gpu_printed)).collect();
    println!(
        "    (DeepSpeed's GB is GiB. From the sizes as DeepSpeed prints them, {}M / {}M, its docs' `_all_cold` call gives CPU/GPU {})",
        z.sizes.total_params / 1_000_000,
        z.sizes.largest_layer_params / 1_000_000,
        cold.join(", ")
    );
    let f = &z.ferrite;
    println!(
        "  ferrite{} keeps {} of model states on {}: weights {}, gradients {}, optimizer state {}",
        z.ferrite_sharded.as_ref().map_or(" (no ZeRO)".to_string(), |s| format!(
            "'s {} over {} ranks",
            s.mode.name(),
            s.world
        )),
        format_size(f.total),
        if z.ferrite_sharded.is_some() { "its fullest rank" } else { "every GPU" },
        format_size(f.parameters),
        format_size(f.gradients),
        format_size(f.optimizer_state)
    );
    println!("  per GPU, DeepSpeed against ferrite:");
    for d in &z.differences {
        println!(
            "    {}: {} against {} ({})",
            d.component,
            format_size(d.deepspeed_bytes),
            format_size(d.ferrite_bytes),
            d.reason
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &str, bytes: u64) -> LayerBytes {
        LayerBytes { layer: name.into(), bytes }
    }

    #[test]
    fn equal_numbered_layers_collapse_into_one_line() {
        let layers = [
            layer("embed", 10),
            layer("layers.0", 5),
            layer("layers.1", 5),
            layer("layers.2", 5),
            layer("layers.3", 6),
            layer("head", 10),
        ];
        let lines = collapse_layers(&layers);
        assert_eq!(
            lines,
            vec![
                ("embed".to_string(), 10, 1),
                ("layers.0\u{2013}2".to_string(), 5, 3),
                ("layers.3".to_string(), 6, 1),
                ("head".to_string(), 10, 1),
            ]
        );
    }
}
