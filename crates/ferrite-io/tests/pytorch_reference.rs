//! Every file of the PyTorch reference folder `pytorch/` read through ferrite's safe reader and
//! checked against `expected.json` (written by PyTorch itself).

mod common;

use common::{close, expected, expected_file, expected_tensor, pytorch_file};
use ferrite_io::{IoError, RawTensor, Value, read, state_dict_from_value, strip_prefix};
use ferrite_tensor::DType;
use half::{bf16, f16};

fn load(name: &str) -> Option<Value> {
    let path = pytorch_file(name)?;
    Some(read(&path).unwrap_or_else(|e| panic!("{name}: {e}")))
}

/// Checks the state_dict `sd` read from `file` against `expected.json`'s `files[file]`: the same
/// keys (after `strip`), and each tensor's dtype, shape and float64 sum.
fn check_against_files(file: &str, sd: &[(String, RawTensor)], strip: &str) {
    let exp = expected().expect("expected.json");
    let (want, _) = expected_file(&exp, file);
    assert_eq!(sd.len(), want.len(), "{file}: number of tensors");
    for w in &want {
        let key = w.path.strip_prefix(strip).unwrap_or(&w.path);
        let t = &sd.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("{file}: key {key} missing")).1;
        assert_eq!(t.shape(), w.shape.as_slice(), "{file}:{key} shape");
        assert_eq!(
            t.dtype(),
            DType::parse(&w.dtype).unwrap_or_else(|| panic!("dtype {}", w.dtype)),
            "{file}:{key} dtype"
        );
        assert!(close(t.sum_f64(), w.sum), "{file}:{key}: sum {} vs PyTorch's {}", t.sum_f64(), w.sum);
    }
}

/// A non-tensor leaf read by ferrite equals the value PyTorch reported for it.
fn value_matches_json(v: &Value, j: &serde_json::Value) -> bool {
    match (v, j) {
        (Value::None, serde_json::Value::Null) => true,
        (Value::Bool(a), serde_json::Value::Bool(b)) => a == b,
        (Value::Int(a), serde_json::Value::Number(n)) => n.as_i64() == Some(*a) || n.as_f64() == Some(*a as f64),
        (Value::Float(a), serde_json::Value::Number(n)) => n.as_f64() == Some(*a),
        (Value::Str(a), serde_json::Value::String(b)) => a == b,
        (Value::List(a) | Value::Tuple(a), serde_json::Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| value_matches_json(x, y))
        }
        _ => false,
    }
}

#[test]
fn plain_state_dict_matches_expected_layout_and_pytorch_sums() {
    let Some(v) = load("plain_state_dict.pt") else { return };
    let sd = state_dict_from_value(&v).unwrap();
    check_against_files("plain_state_dict.pt", &sd, "");
    // The older `plain_state_dict` key (corrected on 2026-11-24) describes the same file.
    let exp = expected().unwrap();
    let plain = exp["plain_state_dict"].as_object().expect("plain_state_dict object");
    assert_eq!(sd.len(), plain.len());
    for (k, t) in &sd {
        let e = &plain[k.as_str()];
        let shape: Vec<usize> = e["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(t.shape(), shape.as_slice(), "{k}");
        assert_eq!(DType::parse(e["dtype"].as_str().unwrap()), Some(t.dtype()), "{k}");
        let want = e["sum"].as_f64().unwrap();
        assert!(close(t.sum_f64(), want), "{k}: {} vs {want}", t.sum_f64());
    }
    assert!(sd.iter().all(|(_, t)| t.location() == "cpu"));
}

#[test]
fn every_reference_file_matches_the_files_listing() {
    // Every tensor of every loadable file by its path, and every non-tensor leaf by its value.
    let Some(exp) = expected() else { return };
    let files = exp["files"].as_object().expect("expected.json has a `files` object");
    assert!(!files.is_empty());
    for file in files.keys() {
        let v = load(file).unwrap();
        let got = v.tensors();
        let (want, values) = expected_file(&exp, file);
        assert_eq!(got.len(), want.len(), "{file}: number of tensors");
        for w in &want {
            let t =
                got.iter().find(|(p, _)| *p == w.path).unwrap_or_else(|| panic!("{file}: no tensor at {}", w.path)).1;
            assert_eq!(t.shape(), w.shape.as_slice(), "{file}:{}", w.path);
            assert_eq!(Some(t.dtype()), DType::parse(&w.dtype), "{file}:{}", w.path);
            assert!(close(t.sum_f64(), w.sum), "{file}:{}: {} vs {}", w.path, t.sum_f64(), w.sum);
        }
        for (path, want) in &values {
            let got = v.at(path).unwrap_or_else(|| panic!("{file}: no value at {path}"));
            assert!(value_matches_json(got, want), "{file}:{path}: {got:?} vs PyTorch's {want}");
        }
    }
}

#[test]
fn legacy_and_dataparallel_files_hold_the_same_tensors() {
    let Some(plain) = load("plain_state_dict.pt") else { return };
    let plain = state_dict_from_value(&plain).unwrap();
    let legacy = state_dict_from_value(&load("legacy_format_state_dict.pt").unwrap()).unwrap();
    check_against_files("legacy_format_state_dict.pt", &legacy, "");

    let dp = state_dict_from_value(&load("dataparallel_state_dict.pt").unwrap()).unwrap();
    assert!(dp.iter().all(|(k, _)| k.starts_with("module.")));
    let dp = strip_prefix(dp, "module.");
    check_against_files("dataparallel_state_dict.pt", &dp, "module.");
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
    check_against_files("fp16_state_dict.pt", &h, "");
    check_against_files("bf16_state_dict.pt", &b, "");
    assert!(h.iter().all(|(_, t)| t.dtype() == DType::F16) && b.iter().all(|(_, t)| t.dtype() == DType::BF16));
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
    let views = &exp["shared_storage_views"];
    let full = v.get("full").and_then(Value::as_tensor).unwrap();
    let full_shape: Vec<usize> =
        views["full"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    assert_eq!(full.shape(), full_shape.as_slice());
    assert!(close(full.sum_f64(), expected_tensor(&exp, "shared_storage_views.pt", "full").sum));
    for name in ["row_view", "col_view", "transposed"] {
        let t = v.get(name).and_then(Value::as_tensor).unwrap();
        let want_shape: Vec<usize> =
            views[name]["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let want: Vec<f64> = views[name]["values"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(t.shape(), want_shape.as_slice(), "{name}");
        assert_eq!(t.to_f64_vec(), want, "{name}");
        // One storage, shared: the views point into the same bytes as `full`, and every view's
        // values are the full tensor's values at the view's offset and strides.
        assert_eq!(t.storage().as_ptr(), full.storage().as_ptr(), "{name} shares the storage");
        let storage: Vec<f32> =
            full.storage().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let mut idx = vec![0usize; t.shape().len()];
        for (i, w) in want.iter().enumerate() {
            let mut rem = i;
            for d in (0..idx.len()).rev() {
                idx[d] = rem % t.shape()[d];
                rem /= t.shape()[d];
            }
            let at = t.storage_offset() + idx.iter().zip(t.strides()).map(|(i, s)| i * s).sum::<usize>();
            assert_eq!(storage[at] as f64, *w, "{name}[{i}] through offset and strides");
        }
    }
}

#[test]
fn training_checkpoint_is_navigable() {
    let Some(v) = load("training_checkpoint.pt") else { return };
    let exp = expected().unwrap();
    let ck = &exp["training_checkpoint"];
    assert_eq!(v.get("epoch").and_then(Value::as_int), ck["epoch"].as_i64());
    assert_eq!(v.get("loss").and_then(Value::as_float), ck["loss"].as_f64());
    let mut keys: Vec<String> =
        state_dict_from_value(v.get("model").unwrap()).unwrap().into_iter().map(|(k, _)| k).collect();
    keys.sort();
    let want: Vec<String> =
        ck["model_keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap().to_string()).collect();
    assert_eq!(keys, want);

    // Optimizer state: int keys, scalar `step` tensors, moments shaped like the parameters; every
    // figure from PyTorch's listing of the file.
    let (tensors, values) = expected_file(&exp, "training_checkpoint.pt");
    let step = v.at("optimizer/state/0/step").and_then(Value::as_tensor).unwrap();
    let want_step = expected_tensor(&exp, "training_checkpoint.pt", "optimizer/state/0/step");
    assert_eq!(step.shape(), &[] as &[usize]);
    assert!(want_step.shape.is_empty());
    assert_eq!(step.to_vec::<f32>().unwrap(), vec![want_step.sum as f32]);
    let m = v.at("optimizer/state/0/exp_avg").and_then(Value::as_tensor).unwrap();
    let want_m = expected_tensor(&exp, "training_checkpoint.pt", "optimizer/state/0/exp_avg");
    assert_eq!(m.shape(), want_m.shape.as_slice());
    assert!(close(m.sum_f64(), want_m.sum), "{} vs {}", m.sum_f64(), want_m.sum);
    let lr = values["optimizer/param_groups/0/lr"].as_f64().expect("lr in the listing");
    assert_eq!(v.at("optimizer/param_groups/0/lr").and_then(Value::as_float), Some(lr));
    // Tuples stay tuples, None stays None.
    let betas: Vec<Value> = values["optimizer/param_groups/0/betas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| Value::Float(b.as_f64().unwrap()))
        .collect();
    assert_eq!(v.at("optimizer/param_groups/0/betas"), Some(&Value::Tuple(betas)));
    assert_eq!(v.at("optimizer/param_groups/0/foreach"), Some(&Value::None));
    let params = v.at("optimizer/param_groups/0/params").and_then(Value::as_list).unwrap();
    let want_params: Vec<i64> =
        values["optimizer/param_groups/0/params"].as_array().unwrap().iter().map(|p| p.as_i64().unwrap()).collect();
    assert_eq!(params.iter().map(|p| p.as_int().unwrap()).collect::<Vec<_>>(), want_params);
    assert_eq!(v.tensors().len(), tensors.len());
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
    assert!(
        msg.contains("`posix.system`") && msg.contains("run commands") && msg.contains("Nothing was executed"),
        "{msg}"
    );
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!marker.exists(), "the payload's side effect happened");
}
