//! Optimizer and schedule states survive a real training-checkpoint file (`ferrite_io::Checkpoint`,
//! the format `ferrite train --save-checkpoint` writes): RMSprop's and Adagrad's buffers and step
//! counts, and the schedules' settings and counters — strings (`mode`, `_anneal_func_type`),
//! lists, and a plateau's `best = inf` before its first metric — come back exactly, and training
//! resumed from the file continues bit-identically.

use ferrite_io::{Checkpoint, LoadOptions, MapLocation, Value};
use ferrite_optim::{
    Adagrad, AdagradConfig, CosineAnnealingWarmRestarts, GroupState, HyperValue, LrScheduler, OneCycleConfig,
    OneCycleLr, Optimizer, OptimizerState, PlateauConfig, ReduceLrOnPlateau, Rmsprop, RmspropConfig, SchedulerState,
    StateValue,
};
use ferrite_tensor::{DType, Device, Generator, Tensor};
use ferrite_test_support::params::bits_of as bits;

fn hyper_to_value(h: &HyperValue) -> Value {
    match h {
        HyperValue::Float(f) => Value::Float(*f),
        HyperValue::Int(i) => Value::Int(*i),
        HyperValue::Bool(b) => Value::Bool(*b),
        HyperValue::Floats(v) => Value::Tuple(v.iter().map(|f| Value::Float(*f)).collect()),
        HyperValue::Ints(v) => Value::List(v.iter().map(|i| Value::Int(*i)).collect()),
        HyperValue::None => Value::None,
        HyperValue::Str(s) => Value::Str(s.clone()),
    }
}

fn value_to_hyper(v: &Value) -> HyperValue {
    match v {
        Value::Float(f) => HyperValue::Float(*f),
        Value::Int(i) => HyperValue::Int(*i),
        Value::Bool(b) => HyperValue::Bool(*b),
        Value::None => HyperValue::None,
        Value::Str(s) => HyperValue::Str(s.clone()),
        Value::Tuple(items) => HyperValue::Floats(items.iter().map(|x| x.as_float().unwrap()).collect()),
        Value::List(items) => HyperValue::Ints(items.iter().map(|x| x.as_int().unwrap()).collect()),
        other => panic!("unexpected {}", other.kind()),
    }
}

fn dict(pairs: &[(String, HyperValue)]) -> Value {
    let mut d = Value::dict();
    for (k, v) in pairs {
        d.insert(k.as_str(), hyper_to_value(v)).unwrap();
    }
    d
}

fn pairs(v: &Value) -> Vec<(String, HyperValue)> {
    v.as_dict().unwrap().iter().map(|(k, v)| (k.as_str().unwrap().to_string(), value_to_hyper(v))).collect()
}

fn save_optimizer(c: &mut Checkpoint, at: &str, s: &OptimizerState) {
    for (i, entries) in &s.state {
        for (name, v) in entries {
            let path = format!("{at}/state/{i}/{name}");
            match v {
                StateValue::Tensor(t) => c.set_tensor(&path, t).unwrap(),
                StateValue::Float(f) => c.set(&path, *f).unwrap(),
                StateValue::Int(n) => c.set(&path, *n).unwrap(),
            }
        }
    }
    for (g, group) in s.param_groups.iter().enumerate() {
        c.set(&format!("{at}/param_groups/{g}/hyper"), dict(&group.hyper)).unwrap();
        let params = Value::List(group.params.iter().map(|p| Value::Int(*p as i64)).collect());
        c.set(&format!("{at}/param_groups/{g}/params"), params).unwrap();
    }
}

fn load_optimizer(c: &Checkpoint, at: &str, device: &Device) -> OptimizerState {
    let opts = LoadOptions::new().map_location(MapLocation::To(device.clone()));
    let mut state = Vec::new();
    if let Some(Value::Dict(items)) = c.get(&format!("{at}/state")) {
        for (k, entries) in items {
            let k = k.as_str().unwrap();
            let mut values = Vec::new();
            for (name, _) in entries.as_dict().unwrap() {
                let name = name.as_str().unwrap();
                values.push((
                    name.to_string(),
                    StateValue::Tensor(c.tensor(&format!("{at}/state/{k}/{name}"), &opts).unwrap()),
                ));
            }
            state.push((k.parse().unwrap(), values));
        }
    }
    let groups = c.get(&format!("{at}/param_groups")).unwrap().as_dict().unwrap();
    let param_groups = groups
        .iter()
        .map(|(_, g)| GroupState {
            hyper: pairs(g.get("hyper").unwrap()),
            params: g.get("params").unwrap().as_list().unwrap().iter().map(|p| p.as_int().unwrap() as usize).collect(),
            param_names: None,
        })
        .collect();
    OptimizerState { state, param_groups }
}

fn save_schedule(c: &mut Checkpoint, at: &str, s: &SchedulerState) {
    c.set(&format!("{at}/kind"), s.kind.as_str()).unwrap();
    c.set(&format!("{at}/last_epoch"), s.last_epoch).unwrap();
    c.set(&format!("{at}/_step_count"), s.step_count).unwrap();
    c.set(&format!("{at}/base_lrs"), hyper_to_value(&HyperValue::Floats(s.base_lrs.clone()))).unwrap();
    c.set(&format!("{at}/_last_lr"), hyper_to_value(&HyperValue::Floats(s.last_lr.clone()))).unwrap();
    c.set(&format!("{at}/params"), dict(&s.params)).unwrap();
}

fn load_schedule(c: &Checkpoint, at: &str) -> SchedulerState {
    let floats = |k: &str| match value_to_hyper(c.get(&format!("{at}/{k}")).unwrap()) {
        HyperValue::Floats(v) => v,
        other => panic!("{k}: {other:?}"),
    };
    SchedulerState {
        kind: c.str(&format!("{at}/kind")).unwrap().to_string(),
        last_epoch: c.int(&format!("{at}/last_epoch")).unwrap(),
        step_count: c.int(&format!("{at}/_step_count")).unwrap(),
        base_lrs: floats("base_lrs"),
        last_lr: floats("_last_lr"),
        params: pairs(c.get(&format!("{at}/params")).unwrap()),
        children: Vec::new(),
    }
}

struct Run {
    p: Vec<Tensor>,
    rms: Rmsprop,
    ada: Adagrad,
    cycle: OneCycleLr,
    restarts: CosineAnnealingWarmRestarts,
    plateau: ReduceLrOnPlateau,
}

fn new_run(p: Vec<Tensor>) -> Run {
    let mut rms = Rmsprop::new(vec![p[0].clone()], RmspropConfig::new(0.01).momentum(0.5).centered(true)).unwrap();
    let mut ada = Adagrad::new(vec![p[1].clone()], AdagradConfig::new(0.1).lr_decay(0.05)).unwrap();
    let cycle = OneCycleLr::new(&mut rms, OneCycleConfig::new(0.02, 20)).unwrap();
    let restarts = CosineAnnealingWarmRestarts::new(&mut ada, 3, 2, 0.0).unwrap();
    // Watches a second optimizer's rate only to exercise its state (lr of `ada` is set by
    // `restarts`; the plateau acts on its own copy below).
    let plateau = ReduceLrOnPlateau::new(&mut ada, PlateauConfig::default().patience(1)).unwrap();
    Run { p, rms, ada, cycle, restarts, plateau }
}

fn train(r: &mut Run, steps: std::ops::Range<usize>) {
    for s in steps {
        let mut g = Generator::new(s as u64);
        let x = Tensor::randn_with(&[8], DType::F32, &Device::Cpu, &mut g).unwrap();
        let loss = r.p[0].mul(&x).unwrap().sin().unwrap().sum().unwrap();
        let loss = loss.add(&r.p[1].sub(&x).unwrap().square().unwrap().sum().unwrap()).unwrap();
        let metric = loss.item().unwrap();
        loss.backward().unwrap();
        r.rms.step().unwrap();
        r.ada.step().unwrap();
        r.rms.zero_grad().unwrap();
        r.ada.zero_grad().unwrap();
        r.cycle.step(&mut r.rms).unwrap();
        r.restarts.step(&mut r.ada).unwrap();
        r.plateau.step(&mut r.ada, metric.round()).unwrap();
    }
}

fn params() -> Vec<Tensor> {
    let mut g = Generator::new(11);
    (0..2)
        .map(|_| Tensor::randn_with(&[8], DType::F32, &Device::Cpu, &mut g).unwrap().requires_grad_(true).unwrap())
        .collect()
}

#[test]
fn states_round_trip_through_a_checkpoint_file_and_resume_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.ckpt");
    // A fresh plateau: `best` is +inf, which must survive the file.
    let fresh = new_run(params());
    assert_eq!(fresh.plateau.best(), f64::INFINITY);

    let mut a = new_run(params());
    train(&mut a, 0..4);
    let mut c = Checkpoint::new();
    c.set_state_dict("model", [("w0", &a.p[0]), ("w1", &a.p[1])]).unwrap();
    save_optimizer(&mut c, "optimizer/rmsprop", &a.rms.state_dict().unwrap());
    save_optimizer(&mut c, "optimizer/adagrad", &a.ada.state_dict().unwrap());
    save_schedule(&mut c, "schedule/one_cycle", &a.cycle.state_dict());
    save_schedule(&mut c, "schedule/restarts", &a.restarts.state_dict());
    save_schedule(&mut c, "schedule/plateau", &a.plateau.state_dict());
    save_schedule(&mut c, "schedule/fresh_plateau", &fresh.plateau.state_dict());
    c.save(&path).unwrap();
    train(&mut a, 4..12);

    let back = Checkpoint::load(&path).unwrap();
    let model = back.state_dict("model", &LoadOptions::new()).unwrap();
    let p: Vec<Tensor> = model.iter().map(|(_, t)| t.detach().requires_grad_(true).unwrap()).collect();
    let mut b = new_run(p);
    b.rms.load_state_dict(&load_optimizer(&back, "optimizer/rmsprop", &Device::Cpu)).unwrap();
    b.ada.load_state_dict(&load_optimizer(&back, "optimizer/adagrad", &Device::Cpu)).unwrap();
    b.cycle.load_state_dict(&load_schedule(&back, "schedule/one_cycle")).unwrap();
    b.restarts.load_state_dict(&load_schedule(&back, "schedule/restarts")).unwrap();
    b.plateau.load_state_dict(&load_schedule(&back, "schedule/plateau")).unwrap();
    let mut f = new_run(params());
    f.plateau.load_state_dict(&load_schedule(&back, "schedule/fresh_plateau")).unwrap();
    assert_eq!(f.plateau.best(), f64::INFINITY);

    train(&mut b, 4..12);
    assert_eq!(bits(&a.p), bits(&b.p), "parameters after resuming from the file");
    assert_eq!((a.rms.lrs(), a.rms.momentum(0).unwrap()), (b.rms.lrs(), b.rms.momentum(0).unwrap()));
    assert_eq!(a.ada.lrs(), b.ada.lrs());
    assert_eq!(a.cycle.state_dict(), b.cycle.state_dict());
    assert_eq!(a.restarts.state_dict(), b.restarts.state_dict());
    assert_eq!(a.plateau.state_dict(), b.plateau.state_dict());
}
