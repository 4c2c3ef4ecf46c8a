//! DataParallel seen from outside: over 2 and 3 simulated devices a training step equals the
//! single-device step (SGD with momentum and AdamW, several steps, an uneven last batch) whether
//! the parameters' owners are spread over the devices (the default) or all on device 0 (PyTorch's
//! layout); the optimizer's state lives on the owners' devices and its state_dict continues on one
//! device; the replicas stay in sync, the state_dict has the plain names, and bad device lists are
//! typed errors.
//!
//! Every test uses its own simulated GPU model, so the tests of this binary (run in parallel
//! threads) never share an allocator.

use ferrite_memory::{Device, MemoryError, select_devices};
use ferrite_nn::{Linear, Module, Sequential};
use ferrite_optim::{Adam, AdamConfig, Optimizer, OptimizerState, Sgd, SgdConfig, StateValue};
use ferrite_parallel::{DataParallel, OwnerPolicy, ParallelError};
use ferrite_tensor::functional::mse_loss;
use ferrite_tensor::{DType, Generator, Tensor};
use ferrite_test_support::models::mlp;

/// Batches of 8, 8, 8 and a last one of 5 (uneven over 2 and 3 devices).
fn batches() -> Vec<(Tensor, Tensor)> {
    let mut g = Generator::new(42);
    [8, 8, 8, 5]
        .into_iter()
        .map(|n| {
            let x = Tensor::randn_with(&[n, 6], DType::F32, &Device::Cpu, &mut g).unwrap();
            let y = Tensor::randn_with(&[n, 3], DType::F32, &Device::Cpu, &mut g).unwrap();
            (x, y)
        })
        .collect()
}

fn values(m: &impl Module) -> Vec<Vec<f32>> {
    m.parameters().iter().map(|p| p.to_vec::<f32>().unwrap()).collect()
}

/// Parameters equal within f32 reduction tolerance (the replicas sum their gradients in another
/// order).
fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    ferrite_test_support::assert_all_close(what, a, b, 2e-5, 2e-5);
}

/// Train `steps` passes over the batches on one device and on `k` simulated devices of
/// `profile`; compare parameters after every step.
fn dp_equals_single_device(profile: &str, k: usize, make_opt: &dyn Fn(Vec<Tensor>) -> Box<dyn Optimizer>) {
    dp_equals_single_device_with(profile, k, OwnerPolicy::Balanced, make_opt);
}

fn dp_equals_single_device_with(
    profile: &str,
    k: usize,
    policy: OwnerPolicy,
    make_opt: &dyn Fn(Vec<Tensor>) -> Box<dyn Optimizer>,
) {
    let single_dev = Device::parse(&format!("sim:{profile}:7")).unwrap();
    let mut single = mlp(1);
    single.to_device(&single_dev).unwrap();
    let mut single_opt = make_opt(single.parameters());

    let list: Vec<String> = (0..k).map(|i| i.to_string()).collect();
    let devices = select_devices(&Device::parse(&format!("sim:{profile}")).unwrap(), Some(&list.join(","))).unwrap();
    let dp = DataParallel::with_owners(mlp(1), &devices, policy).unwrap();
    let owners = dp.owners().to_vec();
    match policy {
        // mlp's 4 parameters: every device of 2 or 3 owns one at least.
        OwnerPolicy::Balanced => assert!((0..k).all(|d| owners.contains(&d)), "{owners:?}"),
        OwnerPolicy::Primary => assert!(owners.iter().all(|&o| o == 0), "{owners:?}"),
        // Pieces: more tensors than parameters, every device owning some.
        OwnerPolicy::Sharded => {
            assert!(owners.len() > 4 && (0..k).all(|d| owners.contains(&d)), "{owners:?}");
            assert!(dp.pieces().iter().any(|p| !p.whole));
        }
    }
    let pieces = dp.pieces().to_vec();
    for (p, &o) in dp.parameters().iter().zip(&owners) {
        assert_eq!(p.device(), &devices[o], "the optimizer gets the owner's tensor");
    }
    let mut dp_opt = make_opt(dp.parameters());
    assert_close(&values(dp.module()), &values(&single), "initial");

    for epoch in 0..2 {
        for (step, (x, y)) in batches().iter().enumerate() {
            single_opt.zero_grad().unwrap();
            let out = single.forward(&x.to_device(&single_dev).unwrap()).unwrap();
            let loss = mse_loss(&out, &y.to_device(&single_dev).unwrap()).unwrap();
            loss.backward().unwrap();
            single_opt.step().unwrap();

            dp_opt.zero_grad().unwrap();
            let dp_loss =
                dp.forward_backward(&[x, y], |m, s| Ok(mse_loss(&m.forward(&s.tensors[0])?, &s.tensors[1])?)).unwrap();
            assert_eq!(dp_loss.replicas.len(), k.min(x.shape()[0]));
            assert!(
                (dp_loss.loss - loss.item().unwrap()).abs() < 1e-5,
                "loss {} vs {}",
                dp_loss.loss,
                loss.item().unwrap()
            );
            dp.step(dp_opt.as_mut()).unwrap();

            let what = format!("{k} devices, epoch {epoch} step {step}");
            assert_close(&values(dp.module()), &values(&single), &what);
            for (ri, r) in dp.replicas().iter().enumerate() {
                assert_close(&values(r), &values(dp.module()), &format!("replica in sync, {what}"));
                for (j, p) in r.parameters().iter().enumerate() {
                    // Only the owner of a whole parameter keeps a gradient; the others' copies
                    // are freed (a split parameter's gradient lives on its pieces).
                    let owns = pieces.iter().any(|pc| pc.param == j && pc.whole && pc.owner == ri);
                    assert_eq!(p.grad().is_some(), owns, "replica {ri}, parameter {j}, {what}");
                }
            }
        }
    }
    // Every state tensor (momentum, Adam's moments) lives on its parameter's owner.
    let state = dp_opt.state_dict().unwrap();
    assert_eq!(state.state.len(), owners.len());
    for (j, entries) in &state.state {
        for (name, v) in entries {
            if let StateValue::Tensor(t) = v
                && t.numel() > 1
            {
                assert_eq!(t.device(), &devices[owners[*j]], "state {name} of parameter {j}");
            }
        }
    }
}

fn sgd(p: Vec<Tensor>) -> Box<dyn Optimizer> {
    Box::new(Sgd::new(p, SgdConfig::new(0.05).momentum(0.9)).unwrap())
}

fn adamw(p: Vec<Tensor>) -> Box<dyn Optimizer> {
    Box::new(Adam::new(p, AdamConfig::adamw(0.01).weight_decay(0.01)).unwrap())
}

#[test]
fn two_devices_sgd_equals_one_device() {
    dp_equals_single_device("t4-16gb", 2, &sgd);
}

#[test]
fn three_devices_sgd_equals_one_device() {
    dp_equals_single_device("rtx3090-24gb", 3, &sgd);
}

#[test]
fn two_devices_adamw_equals_one_device() {
    dp_equals_single_device("rtx4090-24gb", 2, &adamw);
}

#[test]
fn three_devices_adamw_equals_one_device() {
    dp_equals_single_device("a100-80gb", 3, &adamw);
}

#[test]
fn sharded_parameters_equal_one_device() {
    dp_equals_single_device_with("15GiB", 2, OwnerPolicy::Sharded, &adamw);
    dp_equals_single_device_with("16GiB", 3, OwnerPolicy::Sharded, &adamw);
    dp_equals_single_device_with("17GiB", 3, OwnerPolicy::Sharded, &sgd);
}

#[test]
fn pytorch_layout_all_owned_by_device_0_equals_one_device() {
    dp_equals_single_device_with("11GiB", 3, OwnerPolicy::Primary, &adamw);
    dp_equals_single_device_with("v100-32gb", 2, OwnerPolicy::Primary, &sgd);
}

/// Every tensor of an optimizer state, by (parameter, name), on the host.
fn state_values(s: &OptimizerState) -> Vec<(usize, String, Vec<usize>, Vec<f32>)> {
    let mut out = Vec::new();
    for (j, entries) in &s.state {
        for (name, v) in entries {
            match v {
                StateValue::Tensor(t) => {
                    let t = t.to_dtype(DType::F32).unwrap();
                    out.push((*j, name.clone(), t.shape().to_vec(), t.to_vec::<f32>().unwrap()))
                }
                StateValue::Float(f) => out.push((*j, name.clone(), vec![], vec![*f as f32])),
                StateValue::Int(i) => out.push((*j, name.clone(), vec![], vec![*i as f32])),
            }
        }
    }
    out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    out
}

fn train_single(m: &Sequential, opt: &mut dyn Optimizer, dev: &Device, data: &[(Tensor, Tensor)]) {
    for (x, y) in data {
        opt.zero_grad().unwrap();
        let loss = mse_loss(&m.forward(&x.to_device(dev).unwrap()).unwrap(), &y.to_device(dev).unwrap()).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
    }
}

#[test]
fn the_optimizer_state_dict_of_a_dp_run_continues_on_one_device() {
    type MakeOpt<'a> = &'a dyn Fn(Vec<Tensor>) -> Box<dyn Optimizer>;
    for (profile, k, make_opt, policy) in [
        ("12GiB", 3, &adamw as MakeOpt<'_>, OwnerPolicy::Balanced),
        ("13GiB", 2, &sgd as MakeOpt<'_>, OwnerPolicy::Balanced),
        ("18GiB", 3, &adamw as MakeOpt<'_>, OwnerPolicy::Sharded),
        ("19GiB", 2, &sgd as MakeOpt<'_>, OwnerPolicy::Sharded),
    ] {
        let single_dev = Device::parse(&format!("sim:{profile}:7")).unwrap();
        let mut single = mlp(8);
        single.to_device(&single_dev).unwrap();
        let mut single_opt = make_opt(single.parameters());
        let list: Vec<String> = (0..k).map(|i| i.to_string()).collect();
        let devices =
            select_devices(&Device::parse(&format!("sim:{profile}")).unwrap(), Some(&list.join(","))).unwrap();
        let dp = DataParallel::with_owners(mlp(8), &devices, policy).unwrap();
        let mut dp_opt = make_opt(dp.parameters());
        let data = batches();
        train_single(&single, single_opt.as_mut(), &single_dev, &data);
        for (x, y) in &data {
            dp_opt.zero_grad().unwrap();
            dp.forward_backward(&[x, y], |m, s| Ok(mse_loss(&m.forward(&s.tensors[0])?, &s.tensors[1])?)).unwrap();
            dp.step(dp_opt.as_mut()).unwrap();
        }
        // Same layout (parameter indices, names, shapes) and values as the single-device run's.
        let (dp_state, single_state) =
            (dp.optimizer_state_dict(dp_opt.as_ref()).unwrap(), single_opt.state_dict().unwrap());
        let (a, b) = (state_values(&dp_state), state_values(&single_state));
        assert_eq!(a.len(), b.len(), "{profile}");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.0, &x.1, &x.2), (y.0, &y.1, &y.2), "{profile}");
            assert_close(std::slice::from_ref(&x.3), std::slice::from_ref(&y.3), &format!("{profile} state {x:?}"));
        }
        assert_eq!(dp_state.param_groups, single_state.param_groups, "{profile}");
        // And back: the single-device state loads into a DataParallel optimizer over these
        // devices (split into its pieces) and reads back the same.
        let mut reloaded = make_opt(dp.parameters());
        dp.load_optimizer_state_dict(reloaded.as_mut(), &single_state).unwrap();
        let again = state_values(&dp.optimizer_state_dict(reloaded.as_ref()).unwrap());
        assert_eq!(again.len(), b.len());
        for (x, y) in again.iter().zip(&b) {
            assert_eq!((x.0, &x.1, &x.2, &x.3), (y.0, &y.1, &y.2, &y.3), "{profile}: reloaded");
        }
        // The DP run's model and optimizer state load on one device and continue as the
        // single-device run does.
        let resume_dev = Device::parse(&format!("sim:{profile}:6")).unwrap();
        let mut resumed = mlp(0);
        resumed.load_state_dict(&dp.state_dict(), true).unwrap();
        resumed.to_device(&resume_dev).unwrap();
        let mut resumed_opt = make_opt(resumed.parameters());
        resumed_opt.load_state_dict(&dp_state).unwrap();
        let more: Vec<(Tensor, Tensor)> = batches().into_iter().rev().collect();
        train_single(&single, single_opt.as_mut(), &single_dev, &more);
        train_single(&resumed, resumed_opt.as_mut(), &resume_dev, &more);
        assert_close(&values(&resumed), &values(&single), &format!("{profile}: resumed on one device"));
    }
}

#[test]
fn a_batch_smaller_than_the_device_count_skips_the_empty_replicas() {
    let devices = select_devices(&Device::parse("sim:3GiB").unwrap(), Some("0,1,2")).unwrap();
    let dp = DataParallel::new(mlp(3), &devices).unwrap();
    let x = Tensor::randn(&[2, 6], DType::F32, &Device::Cpu).unwrap();
    let y = Tensor::zeros(&[2, 3], DType::F32, &Device::Cpu).unwrap();
    let l = dp.forward_backward(&[&x, &y], |m, s| Ok(mse_loss(&m.forward(&s.tensors[0])?, &s.tensors[1])?)).unwrap();
    assert_eq!(l.replicas.iter().map(|r| r.1).collect::<Vec<_>>(), vec![1, 1]);
    assert!(dp.parameters().iter().all(|p| p.grad().is_some()));
    // Evaluation gathers outputs on the primary.
    let out = dp.forward(&[&x], |m, s| Ok(m.forward(&s.tensors[0])?)).unwrap();
    assert_eq!(out.shape(), [2, 3]);
    assert_eq!(out.device(), &devices[0]);
}

#[test]
fn the_state_dict_has_the_plain_names_and_a_module_prefix_is_stripped_on_load() {
    let devices = select_devices(&Device::parse("sim:5GiB").unwrap(), Some("0,1")).unwrap();
    let plain = mlp(4);
    let names: Vec<String> = plain.state_dict().keys().map(String::from).collect();
    let mut dp = DataParallel::new(mlp(5), &devices).unwrap();
    assert_eq!(dp.state_dict().keys().map(String::from).collect::<Vec<_>>(), names);
    assert!(names.iter().all(|k| !k.starts_with("module.")));
    // A state_dict saved from PyTorch's wrapper: every key `module.`-prefixed.
    let prefixed = plain.state_dict().with_prefix("module.");
    dp.load_state_dict(&prefixed, true).unwrap();
    assert_close(&values(dp.module()), &values(&plain), "loaded primary");
    assert_close(&values(&dp.replicas()[1]), &values(&plain), "loaded replica");
    // The plain names load as they are.
    dp.load_state_dict(&mlp(6).state_dict(), true).unwrap();
    assert_close(&values(&dp.replicas()[1]), &values(&mlp(6)), "plain load");
}

#[test]
fn bad_device_lists_are_typed_errors_naming_the_valid_indices() {
    let sim = Device::parse("sim:6GiB").unwrap();
    for list in ["", "0,,1", "1,1", "16", "x", "0;1"] {
        match select_devices(&sim, Some(list)) {
            Err(MemoryError::InvalidDeviceList { valid, .. }) => assert_eq!(valid, "0..=15 (16 devices)", "{list}"),
            other => panic!("{list}: {other:?}"),
        }
    }
    assert!(matches!(select_devices(&Device::Cpu, Some("0,1")), Err(MemoryError::InvalidDeviceList { .. })));
    assert!(matches!(DataParallel::new(mlp(0), &[]), Err(ParallelError::NoDevices)));
    let d = Device::parse("sim:6GiB:1").unwrap();
    let e = DataParallel::new(mlp(0), &[d.clone(), d]).err().unwrap();
    assert!(matches!(e, ParallelError::DuplicateDevice { .. }), "{e}");
    assert!(e.to_string().contains("sim:6GiB:1"), "{e}");
}

#[test]
fn a_non_scalar_loss_and_a_ragged_batch_are_errors() {
    let devices = select_devices(&Device::parse("sim:7GiB").unwrap(), Some("0,1")).unwrap();
    let dp = DataParallel::new(mlp(0), &devices).unwrap();
    let x = Tensor::randn(&[4, 6], DType::F32, &Device::Cpu).unwrap();
    let y = Tensor::zeros(&[3, 3], DType::F32, &Device::Cpu).unwrap();
    let e = dp.forward_backward(&[&x, &y], |m, s| Ok(m.forward(&s.tensors[0])?)).unwrap_err();
    assert!(matches!(e, ParallelError::BatchMismatch { index: 1, batch: 4, .. }), "{e}");
    let e = dp.forward_backward(&[&x], |m, s| Ok(m.forward(&s.tensors[0])?)).unwrap_err();
    assert!(matches!(e, ParallelError::LossNotScalar { .. }), "{e}");
}

/// PyTorch's `Net` of the fixture script: emb, fc1, fc2, norm (registration order).
#[derive(Clone)]
struct Net {
    emb: ferrite_nn::Embedding,
    fc1: Linear,
    fc2: Linear,
    norm: ferrite_nn::LayerNorm,
    training: bool,
}

impl Module for Net {
    fn type_name(&self) -> &'static str {
        "Net"
    }
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        self.fc2.forward(&self.norm.forward(&self.fc1.forward(&self.emb.forward(x)?)?)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![
            ("emb".into(), &self.emb),
            ("fc1".into(), &self.fc1),
            ("fc2".into(), &self.fc2),
            ("norm".into(), &self.norm),
        ]
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![
            ("emb".into(), &mut self.emb),
            ("fc1".into(), &mut self.fc1),
            ("fc2".into(), &mut self.fc2),
            ("norm".into(), &mut self.norm),
        ]
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

#[test]
fn a_pytorch_dataparallel_checkpoint_loads_without_its_prefix() {
    let Some(path) = ferrite_test_support::pytorch_file_or_skip("dataparallel_state_dict.pt") else { return };
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path.with_file_name("expected.json")).unwrap()).unwrap();
    let net = Net {
        emb: ferrite_nn::Embedding::new(11, 4, None).unwrap(),
        fc1: Linear::new(4, 6).unwrap(),
        fc2: Linear::new(6, 11).unwrap(),
        norm: ferrite_nn::LayerNorm::new(&[6]).unwrap(),
        training: true,
    };
    let devices = select_devices(&Device::parse("sim:9GiB").unwrap(), Some("0,1")).unwrap();
    let mut dp = DataParallel::new(net, &devices).unwrap();
    // Every key of the file is `module.`-prefixed; strict loading succeeds.
    let keys = dp.load_file(&path, true).unwrap();
    assert!(keys.missing_keys.is_empty() && keys.unexpected_keys.is_empty());
    assert!(dp.state_dict().keys().all(|k| !k.starts_with("module.")));
    for (name, want) in expected["plain_state_dict"].as_object().unwrap() {
        let want = want["sum"].as_f64().unwrap();
        for r in dp.replicas() {
            let sd = r.state_dict();
            let got: f64 = sd.get(name).unwrap().to_vec::<f32>().unwrap().iter().map(|&v| v as f64).sum();
            assert!((got - want).abs() < 1e-4, "{name} on {}: {got} vs {want}", sd.get(name).unwrap().device());
        }
    }
}

#[test]
fn gradients_accumulate_over_two_batches_on_the_owners_and_pieces() {
    for (profile, policy) in [("20GiB", OwnerPolicy::Balanced), ("21GiB", OwnerPolicy::Sharded)] {
        let single_dev = Device::parse(&format!("sim:{profile}:7")).unwrap();
        let mut single = mlp(9);
        single.to_device(&single_dev).unwrap();
        let mut single_opt = adamw(single.parameters());
        let devices = select_devices(&Device::parse(&format!("sim:{profile}")).unwrap(), Some("0,1,2")).unwrap();
        let dp = DataParallel::with_owners(mlp(9), &devices, policy).unwrap();
        let mut dp_opt = adamw(dp.parameters());
        let data = batches();
        for pair in data.chunks(2) {
            single_opt.zero_grad().unwrap();
            dp_opt.zero_grad().unwrap();
            for (x, y) in pair {
                let out = single.forward(&x.to_device(&single_dev).unwrap()).unwrap();
                mse_loss(&out, &y.to_device(&single_dev).unwrap()).unwrap().backward().unwrap();
                dp.forward_backward(&[x, y], |m, s| Ok(mse_loss(&m.forward(&s.tensors[0])?, &s.tensors[1])?)).unwrap();
            }
            single_opt.step().unwrap();
            dp.step(dp_opt.as_mut()).unwrap();
            assert_close(&values(dp.module()), &values(&single), &format!("{policy:?}: accumulated"));
            assert_close(&values(&dp.replicas()[2]), &values(&single), &format!("{policy:?}: replica 2"));
        }
    }
}

#[test]
fn loading_a_state_dict_reaches_every_owner_and_piece() {
    let devices = select_devices(&Device::parse("sim:22GiB").unwrap(), Some("0,1,2")).unwrap();
    let mut dp = DataParallel::with_owners(mlp(5), &devices, OwnerPolicy::Sharded).unwrap();
    let loaded = mlp(6);
    dp.load_state_dict(&loaded.state_dict(), true).unwrap();
    let want = values(&loaded);
    for (piece, t) in dp.pieces().iter().zip(dp.parameters()) {
        assert_eq!(t.device(), &devices[piece.owner]);
        let expected = &want[piece.param][piece.start..piece.start + piece.len];
        assert_eq!(t.to_vec::<f32>().unwrap(), expected, "{piece:?}");
    }
    for r in dp.replicas() {
        assert_close(&values(r), &want, "replica after load");
    }
}

/// The pattern from before owners existed — an optimizer over the primary's parameters — would
/// leave every parameter another device owns without a gradient, silently untrained: `step`
/// refuses it with a message that says what to build the optimizer from.
#[test]
fn an_optimizer_over_the_primarys_parameters_is_refused_by_step() {
    let devices = select_devices(&Device::parse("sim:7GiB").unwrap(), Some("0,1")).unwrap();
    let dp = DataParallel::new(mlp(5), &devices).unwrap();
    let (x, y) = batches().remove(0);
    let mut wrong = Sgd::new(dp.module().parameters(), SgdConfig::new(0.1)).unwrap();
    dp.forward_backward(&[&x, &y], |m, s| Ok(mse_loss(&m.forward(&s.tensors[0])?, &s.tensors[1])?)).unwrap();
    let before = values(dp.module());
    let e = dp.step(&mut wrong).unwrap_err();
    assert!(matches!(e, ParallelError::OptimizerNotOnOwners { .. }), "{e:?}");
    assert!(e.to_string().contains("dp.parameters()"), "{e}");
    assert_eq!(values(dp.module()), before, "a refused step must not move any parameter");
    // Built from dp.parameters(), the same step goes through.
    let mut right = Sgd::new(dp.parameters(), SgdConfig::new(0.1)).unwrap();
    dp.step(&mut right).unwrap();
    assert_ne!(values(dp.module()), before);
}
