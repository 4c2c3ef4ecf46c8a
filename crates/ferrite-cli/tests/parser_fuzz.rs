//! Mutation fuzzing of what `ferrite train --resume` and `ferrite doctor` read from files a user
//! (or a container runtime) hands them: the metadata of a training checkpoint, and the cgroup
//! files behind the container limits. Every input must give a value or a typed error — never a
//! panic — and an accepted checkpoint must hold what a resume relies on.
//!
//! The checkpoint is mutated as a tree, not as bytes: byte flips are rejected by the file
//! reader's own checks (fuzzed in ferrite-io's `mutation_fuzz`), while a resume must survive a
//! file that *reads* fine but holds the wrong things — an entry missing, a list where a dict
//! belongs, a negative epoch, a tensor where a number belongs. `PROPTEST_CASES` sets the inputs
//! per test (default 3000); the cargo-fuzz targets `resume_checkpoint` and `cgroup_limits` in
//! `fuzz/` run the same checks for long runs.

use std::path::Path;

use ferrite_cli::commands::doctor::cgroup::{CgroupFs, Limit, cpu_limit, memory_limit};
use ferrite_io::{Checkpoint, Value};
use ferrite_optim::{GradScalerState, GroupState, HyperValue, OptimizerState, StateValue};
use ferrite_tensor::{Device, Generator, Tensor};
use ferrite_test_support::text_fuzz::{mutated_text, run_text_fuzz};
use ferrite_train::resume::{self, TrainingState};
use proptest::prelude::*;

/// A complete training state as `ferrite train` saves it: two parameters, AdamW moments and
/// step counts, a GradScaler, both generators and the settings.
fn training_state() -> TrainingState {
    let t = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape, &Device::Cpu).expect("a small CPU tensor");
    let hyper = vec![
        ("lr".to_string(), HyperValue::Float(1e-3)),
        ("betas".to_string(), HyperValue::Floats(vec![0.9, 0.999])),
        ("eps".to_string(), HyperValue::Float(1e-8)),
        ("weight_decay".to_string(), HyperValue::Float(0.01)),
        ("amsgrad".to_string(), HyperValue::Bool(false)),
        ("foreach".to_string(), HyperValue::None),
    ];
    let moments = |n: usize, shape: &[usize]| {
        vec![
            ("step".to_string(), StateValue::Tensor(t(vec![3.0], &[]))),
            ("exp_avg".to_string(), StateValue::Tensor(t(vec![0.1; n], shape))),
            ("exp_avg_sq".to_string(), StateValue::Tensor(t(vec![0.01; n], shape))),
        ]
    };
    TrainingState {
        epoch: 2,
        step: 30,
        model: vec![("fc.weight".into(), t(vec![0.5; 6], &[2, 3])), ("fc.bias".into(), t(vec![0.0; 2], &[2]))],
        optimizer: OptimizerState {
            state: vec![(0, moments(6, &[2, 3])), (1, moments(2, &[2]))],
            param_groups: vec![GroupState {
                hyper,
                params: vec![0, 1],
                param_names: Some(vec!["fc.weight".into(), "fc.bias".into()]),
            }],
        },
        scaler: Some(GradScalerState {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            growth_tracker: 7,
        }),
        loader_rng: Generator::new(1).state(),
        dropout_rng: Generator::new(2).state(),
        settings: vec![("model".into(), "mlp".into()), ("batch_size".into(), "64".into())],
    }
}

/// The tree of a checkpoint written by `resume::save`, read back from disk.
fn saved_tree() -> Value {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("run.ckpt");
    resume::save(&path, &training_state()).expect("the reference state saves");
    Checkpoint::load(&path).expect("and loads").into_tree()
}

/// One structural edit of a checkpoint tree; node numbers count nodes in `walk_mut` order.
#[derive(Debug, Clone)]
enum TreeEdit {
    /// Replace node `n` by a value of another kind.
    Replace(usize, Replacement),
    /// Replace node `n` by a copy of node `m` (a tensor where a number belongs, a group where a
    /// list belongs, …).
    Transplant(usize, usize),
    /// Remove entry `i` of the `n`-th dict.
    RemoveEntry(usize, usize),
    /// Rename the key of entry `i` of the `n`-th dict.
    RenameKey(usize, usize, Replacement),
}

#[derive(Debug, Clone)]
enum Replacement {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    EmptyList,
    EmptyDict,
}

impl Replacement {
    fn value(&self) -> Value {
        match self {
            Replacement::None => Value::None,
            Replacement::Bool(b) => Value::Bool(*b),
            Replacement::Int(i) => Value::Int(*i),
            Replacement::Float(f) => Value::Float(*f),
            Replacement::Str(s) => Value::Str(s.clone()),
            Replacement::EmptyList => Value::List(Vec::new()),
            Replacement::EmptyDict => Value::dict(),
        }
    }
}

fn replacement() -> impl Strategy<Value = Replacement> {
    prop_oneof![
        Just(Replacement::None),
        any::<bool>().prop_map(Replacement::Bool),
        prop::sample::select(vec![0i64, 1, -1, 2, 7, i64::MIN, i64::MAX, 1 << 40]).prop_map(Replacement::Int),
        prop::sample::select(vec![0.0f64, -0.0, 1.5, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e300])
            .prop_map(Replacement::Float),
        prop::sample::select(vec!["", "0", "-1", "ferrite-train/1", "ferrite-train/2", "step", "hyper", "x"])
            .prop_map(|s| Replacement::Str(s.to_string())),
        Just(Replacement::EmptyList),
        Just(Replacement::EmptyDict),
    ]
}

fn tree_edit() -> impl Strategy<Value = TreeEdit> {
    prop_oneof![
        3 => (any::<usize>(), replacement()).prop_map(|(n, r)| TreeEdit::Replace(n, r)),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(n, m)| TreeEdit::Transplant(n, m)),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(n, i)| TreeEdit::RemoveEntry(n, i)),
        1 => (any::<usize>(), any::<usize>(), replacement()).prop_map(|(n, i, r)| TreeEdit::RenameKey(n, i, r)),
    ]
}

fn count_nodes(tree: &mut Value) -> (usize, usize) {
    let (mut nodes, mut dicts) = (0, 0);
    tree.walk_mut(|v| {
        nodes += 1;
        dicts += usize::from(matches!(v, Value::Dict(_)));
    });
    (nodes, dicts)
}

fn node_copy(tree: &mut Value, index: usize) -> Option<Value> {
    let mut n = 0;
    let mut found = None;
    tree.walk_mut(|v| {
        if n == index {
            found = Some(v.clone());
        }
        n += 1;
    });
    found
}

fn apply(tree: &mut Value, edit: &TreeEdit) {
    let (nodes, dicts) = count_nodes(tree);
    match edit {
        TreeEdit::Replace(n, r) => replace_node(tree, n % nodes, r.value()),
        TreeEdit::Transplant(n, m) => {
            if let Some(copy) = node_copy(tree, m % nodes) {
                replace_node(tree, n % nodes, copy);
            }
        }
        TreeEdit::RemoveEntry(n, i) | TreeEdit::RenameKey(n, i, _) if dicts > 0 => {
            let target = n % dicts;
            let mut seen = 0;
            tree.walk_mut(|v| {
                if let Value::Dict(items) = v {
                    if seen == target && !items.is_empty() {
                        let at = i % items.len();
                        match edit {
                            TreeEdit::RenameKey(_, _, r) => items[at].0 = r.value(),
                            _ => {
                                items.remove(at);
                            }
                        }
                    }
                    seen += 1;
                }
            });
        }
        _ => {}
    }
}

fn replace_node(tree: &mut Value, index: usize, with: Value) {
    let mut n = 0;
    let mut with = Some(with);
    tree.walk_mut(|v| {
        if n == index
            && let Some(w) = with.take()
        {
            *v = w;
        }
        n += 1;
    });
}

/// What a resume relies on in an accepted checkpoint: every tensor it hands to the model and the
/// optimizer holds readable values.
fn check_accepted(state: &TrainingState) -> Result<(), String> {
    for (name, t) in &state.model {
        t.to_vec::<f32>().map_err(|e| format!("accepted model tensor `{name}` cannot be read: {e}"))?;
    }
    for (index, entries) in &state.optimizer.state {
        for (name, v) in entries {
            if let StateValue::Tensor(t) = v {
                t.to_vec_f64().map_err(|e| format!("accepted optimizer tensor {index}/{name} cannot be read: {e}"))?;
            }
        }
    }
    Ok(())
}

#[test]
fn resume_reads_damaged_checkpoints_or_names_the_entry() {
    let base = saved_tree();
    let settings = training_state().settings;
    // The untouched file resumes.
    let c = Checkpoint::from_value(base.clone()).expect("the saved tree is a dict");
    resume::read(&c, Path::new("run.ckpt"), &Device::Cpu, &settings).expect("an unchanged checkpoint resumes");

    let strategy = prop::collection::vec(tree_edit(), 1..5);
    run_text_fuzz("resume_checkpoint", strategy, |edits| {
        let mut tree = base.clone();
        for e in edits {
            apply(&mut tree, e);
        }
        let Ok(c) = Checkpoint::from_value(tree) else { return Ok(()) };
        match resume::read(&c, Path::new("run.ckpt"), &Device::Cpu, &settings) {
            Ok(state) => check_accepted(&state),
            Err(e) if e.to_string().trim().is_empty() => Err("a resume error with no message".into()),
            Err(_) => Ok(()),
        }
    });
}

fn cgroup_seeds() -> Vec<String> {
    [
        "0::/user.slice/session-1.scope\n\n36 25 0:31 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n\nmax\n\n100000 100000",
        "0::/\n\n36 25 0:31 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n\n2147483648\n\nmax 100000",
        "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n\n40 30 0:35 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n41 30 0:36 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\n9223372036854771712\n\n-1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

const CGROUP_TOKENS: &[&str] = &[
    "\n",
    "\n\n",
    ":",
    " - ",
    " ",
    "/",
    "0::/",
    "cgroup2",
    "cgroup",
    "memory",
    "cpu",
    "cpu,cpuacct",
    "/sys/fs/cgroup",
    "max",
    "-1",
    "0",
    "100000",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854771712",
    "1.5",
    "..",
];

/// Splits a fuzz input into `/proc/self/cgroup`, `/proc/self/mountinfo` and the contents of the
/// memory and CPU limit files (v2 and v1 names get the same contents).
fn cgroup_parts(input: &str) -> [&str; 4] {
    let mut parts = input.splitn(4, "\n\n");
    [(); 4].map(|_| parts.next().unwrap_or(""))
}

#[test]
fn container_limits_read_or_say_why() {
    let root = tempfile::tempdir().expect("a temporary directory");
    run_text_fuzz("cgroup_limits", mutated_text(cgroup_seeds(), CGROUP_TOKENS.to_vec()), |input| {
        let [proc_cgroup, mountinfo, memory, cpu] = cgroup_parts(input);
        let write = |rel: &str, text: &str| -> Result<(), String> {
            let p = root.path().join(rel);
            std::fs::create_dir_all(p.parent().ok_or("a file has a parent")?).map_err(|e| e.to_string())?;
            std::fs::write(&p, text).map_err(|e| e.to_string())
        };
        for dir in ["sys/fs/cgroup", "sys/fs/cgroup/memory", "sys/fs/cgroup/cpu,cpuacct"] {
            write(&format!("{dir}/memory.max"), memory)?;
            write(&format!("{dir}/memory.limit_in_bytes"), memory)?;
            write(&format!("{dir}/cpu.max"), cpu)?;
            write(&format!("{dir}/cpu.cfs_quota_us"), cpu)?;
            write(&format!("{dir}/cpu.cfs_period_us"), "100000")?;
        }
        let fs = CgroupFs { root: root.path().to_path_buf() };
        if let Limit::Set { value, .. } = memory_limit(&fs, proc_cgroup, mountinfo)
            && memory.trim().parse::<u64>() != Ok(value)
        {
            return Err(format!("a memory limit of {value} bytes read from `{memory}`"));
        }
        if let Limit::Set { value, .. } = cpu_limit(&fs, proc_cgroup, mountinfo)
            && !(value.is_finite() && value > 0.0)
        {
            return Err(format!("a CPU limit of {value} read from `{cpu}`"));
        }
        Ok(())
    });
}
