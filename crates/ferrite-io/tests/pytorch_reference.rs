//! Every file of the PyTorch reference folder `pytorch/` read through ferrite's safe reader and
//! checked against `expected.json` (written by PyTorch itself).

mod common;

use common::{close, expected, pytorch_file};
use ferrite_io::{IoError, RawTensor, Value, read, state_dict_from_value, strip_prefix};
use ferrite_tensor::DType;
use half::{bf16, f16};

fn load(name: &str) -> Option<Value> {
    let path = pytorch_file(name)?;
    Some(read(&path).unwrap_or_else(|e| panic!("{name}: {e}")))
}

/// Checks dtype and shape of every key named in `expected.json`'s `plain_state_dict`, and that the
/// file holds no other keys.
fn check_layout(sd: &[(String, RawTensor)], dtype: DType) {
    let exp = expected().expect("expected.json");
    let exp = exp["plain_state_dict"].as_object().expect("plain_state_dict object");
    assert_eq!(sd.len(), exp.len());
    for (k, t) in sd {
        let e = &exp[k.as_str()];
        let shape: Vec<usize> = e["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(t.shape(), shape.as_slice(), "{k}");
        assert_eq!(t.dtype(), dtype, "{k}");
        assert_eq!(e["dtype"].as_str().unwrap(), "float32");
    }
}

/// Sums of `plain_state_dict.pt` as computed by PyTorch 2.15
/// (`float(t.double().sum())` for each tensor of `torch.load("plain_state_dict.pt")`).
///
/// `expected.json`'s `plain_state_dict` sums do NOT describe `plain_state_dict.pt`: they are the
/// sums of `training_checkpoint.pt["model"]`, i.e. the same weights after one Adam step (see
/// `expected_json_sums_describe_the_checkpoint_model` below, which proves the relation).
const PLAIN_SUMS: [(&str, f64); 7] = [
    ("emb.weight", 3.9265925735235214),
    ("fc1.weight", -0.42098355293273926),
    ("fc1.bias", -0.7571079134941101),
    ("fc2.weight", -0.8968518935143948),
    ("fc2.bias", -0.23587901890277863),
    ("norm.weight", 6.0),
    ("norm.bias", 0.0),
];

fn check_plain_values(sd: &[(String, RawTensor)]) {
    for (k, t) in sd {
        let want = PLAIN_SUMS.iter().find(|(n, _)| n == k).unwrap_or_else(|| panic!("unexpected key {k}")).1;
        assert!(close(t.sum_f64(), want), "{k}: {} vs {want}", t.sum_f64());
    }
}

#[test]
fn plain_state_dict_matches_expected_layout_and_pytorch_sums() {
    let Some(v) = load("plain_state_dict.pt") else { return };
    let sd = state_dict_from_value(&v).unwrap();
    let keys: Vec<&str> = sd.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["emb.weight", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "norm.weight", "norm.bias"]);
    check_layout(&sd, DType::F32);
    check_plain_values(&sd);
    assert!(sd.iter().all(|(_, t)| t.location() == "cpu"));
}

#[test]
fn legacy_and_dataparallel_files_hold_the_same_tensors() {
    let Some(plain) = load("plain_state_dict.pt") else { return };
    let plain = state_dict_from_value(&plain).unwrap();
    let legacy = state_dict_from_value(&load("legacy_format_state_dict.pt").unwrap()).unwrap();
    check_layout(&legacy, DType::F32);
    check_plain_values(&legacy);

    let dp = state_dict_from_value(&load("dataparallel_state_dict.pt").unwrap()).unwrap();
    assert!(dp.iter().all(|(k, _)| k.starts_with("module.")));
    let dp = strip_prefix(dp, "module.");
    check_layout(&dp, DType::F32);
    for other in [&legacy, &dp] {
        for ((k1, a), (k2, b)) in plain.iter().zip(other.iter()) {
            assert_eq!(k1, k2);
            assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), "{k1}");
        }
    }
}

#[test]
fn half_and_bfloat16_files_are_the_rounded_float32_weights() {
    let Some(plain) = load("plain_state_dict.pt") else { return };
    let plain = state_dict_from_value(&plain).unwrap();
    let h = state_dict_from_value(&load("fp16_state_dict.pt").unwrap()).unwrap();
    let b = state_dict_from_value(&load("bf16_state_dict.pt").unwrap()).unwrap();
    check_layout(&h, DType::F16);
    check_layout(&b, DType::BF16);
    for (((k, p), (_, h)), (_, b)) in plain.iter().zip(&h).zip(&b) {
        let p = p.to_vec::<f32>().unwrap();
        // PyTorch's .half()/.bfloat16() round to nearest even, as the `half` crate does.
        let want_h: Vec<f16> = p.iter().map(|&x| f16::from_f32(x)).collect();
        let want_b: Vec<bf16> = p.iter().map(|&x| bf16::from_f32(x)).collect();
        assert_eq!(h.to_vec::<f16>().unwrap(), want_h, "{k}");
        assert_eq!(b.to_vec::<bf16>().unwrap(), want_b, "{k}");
        let want_sum: f64 = want_h.iter().map(|x| x.to_f64()).sum();
        assert!(close(h.sum_f64(), want_sum));
    }
}

#[test]
fn views_sharing_one_storage_have_the_exact_values() {
    let Some(v) = load("shared_storage_views.pt") else { return };
    let exp = expected().unwrap();
    let exp = &exp["shared_storage_views"];
    let full = v.get("full").and_then(Value::as_tensor).unwrap();
    let full_shape: Vec<usize> = exp["full"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    assert_eq!(full.shape(), full_shape.as_slice());
    assert_eq!(full.to_vec::<f32>().unwrap(), (0..24).map(|i| i as f32).collect::<Vec<_>>());
    for name in ["row_view", "col_view", "transposed"] {
        let t = v.get(name).and_then(Value::as_tensor).unwrap();
        let want_shape: Vec<usize> = exp[name]["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let want: Vec<f64> = exp[name]["values"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(t.shape(), want_shape.as_slice(), "{name}");
        assert_eq!(t.to_f64_vec(), want, "{name}");
        // One storage, shared: the views point into the same bytes as `full`.
        assert_eq!(t.storage().as_ptr(), full.storage().as_ptr(), "{name} shares the storage");
    }
    assert_eq!(v.get("col_view").and_then(Value::as_tensor).unwrap().storage_offset(), 2);
}

#[test]
fn training_checkpoint_is_navigable() {
    let Some(v) = load("training_checkpoint.pt") else { return };
    let exp = expected().unwrap();
    let exp = &exp["training_checkpoint"];
    assert_eq!(v.get("epoch").and_then(Value::as_int), exp["epoch"].as_i64());
    assert_eq!(v.get("loss").and_then(Value::as_float), exp["loss"].as_f64());
    let mut keys: Vec<String> = state_dict_from_value(v.get("model").unwrap()).unwrap().into_iter().map(|(k, _)| k).collect();
    keys.sort();
    let want: Vec<String> = exp["model_keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap().to_string()).collect();
    assert_eq!(keys, want);

    // Optimizer state: int keys, scalar `step` tensors, moments shaped like the parameters.
    let step = v.at("optimizer/state/0/step").and_then(Value::as_tensor).unwrap();
    assert_eq!(step.shape(), &[] as &[usize]);
    assert_eq!(step.to_vec::<f32>().unwrap(), vec![1.0]);
    let m = v.at("optimizer/state/0/exp_avg").and_then(Value::as_tensor).unwrap();
    assert_eq!(m.shape(), &[11, 4]);
    assert!(close(m.sum_f64(), -0.03630970907397568), "{}", m.sum_f64()); // PyTorch 2.15's value
    assert_eq!(v.at("optimizer/param_groups/0/lr").and_then(Value::as_float), Some(0.001));
    assert_eq!(v.at("optimizer/param_groups/0/betas"), Some(&Value::Tuple(vec![Value::Float(0.9), Value::Float(0.999)])));
    assert_eq!(v.at("optimizer/param_groups/0/foreach"), Some(&Value::None));
    let params = v.at("optimizer/param_groups/0/params").and_then(Value::as_list).unwrap();
    assert_eq!(params.iter().map(|p| p.as_int().unwrap()).collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
    assert_eq!(v.tensors().len(), 7 + 7 * 3);
}

#[test]
fn expected_json_sums_describe_the_checkpoint_model() {
    // The sums under `plain_state_dict` in expected.json are those of training_checkpoint.pt's
    // model, whose every weight is the plain weight moved by exactly one Adam step (±lr or 0).
    let Some(ck) = load("training_checkpoint.pt") else { return };
    let exp = expected().unwrap();
    let model = state_dict_from_value(ck.get("model").unwrap()).unwrap();
    for (k, t) in &model {
        let want = exp["plain_state_dict"][k.as_str()]["sum"].as_f64().unwrap();
        assert!(close(t.sum_f64(), want), "{k}: {} vs {want}", t.sum_f64());
    }
    let plain = state_dict_from_value(&load("plain_state_dict.pt").unwrap()).unwrap();
    for (k, p) in &plain {
        let after = &model.iter().find(|(n, _)| n == k).unwrap().1;
        for (a, b) in after.to_vec::<f32>().unwrap().iter().zip(p.to_vec::<f32>().unwrap()) {
            let d = (a - b).abs();
            assert!(d < 1e-6 || (d - 0.001).abs() < 1e-6, "{k}: step {d}");
        }
    }
}

#[test]
fn full_model_pickle_is_refused_naming_the_class() {
    let Some(path) = pytorch_file("full_model_pickle.pt") else { return };
    let err = read(&path).unwrap_err();
    match &err {
        IoError::UnsafeGlobal { module, name, .. } => assert_eq!((module.as_str(), name.as_str()), ("__main__", "Net")),
        other => panic!("unexpected error {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("`__main__.Net`") && msg.contains("state_dict()"), "{msg}");
}

#[test]
fn malicious_reduce_is_refused_and_its_command_never_runs() {
    let Some(path) = pytorch_file("malicious_reduce.pt") else { return };
    // The payload (see `python3 -m pickletools` on its data.pkl) is
    // `posix.system("touch /tmp/ferrite_pwned")`. Make sure the marker is absent, load, and check
    // it is still absent.
    let marker = std::path::Path::new("/tmp/ferrite_pwned");
    if marker.exists() {
        std::fs::remove_file(marker).expect("remove a stale /tmp/ferrite_pwned before the test");
    }
    let err = read(&path).unwrap_err();
    match &err {
        IoError::UnsafeGlobal { module, name, .. } => assert_eq!((module.as_str(), name.as_str()), ("posix", "system")),
        other => panic!("unexpected error {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("`posix.system`") && msg.contains("run commands") && msg.contains("Nothing was executed"), "{msg}");
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!marker.exists(), "the payload's side effect happened");
}
