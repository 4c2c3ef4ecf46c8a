//! PyTorch files beyond the shared reference folder (generated once by
//! `tests/data/make_torch_variants.py` with real PyTorch; `tests/data/expected_variants.json` is
//! PyTorch's own description of them): pickle protocols 4 and 5, nn.Parameter, integer/bool/uint8
//! and 0-d tensors, non-contiguous and expanded views, torch.device/Size/dtype values, GradScaler
//! and RNG state, legacy views sharing a storage, and a numpy scalar that must be refused.

mod common;

use std::path::PathBuf;

use common::close;
use ferrite_io::{IoError, Value, read};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(data("expected_variants.json")).unwrap()).unwrap()
}

#[test]
fn every_tensor_matches_pytorch() {
    let exp = expected();
    let files = exp["files"].as_object().unwrap();
    assert_eq!(files.len(), 6);
    for (file, tensors) in files {
        let v = read(data(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let found = v.tensors();
        assert_eq!(found.len(), tensors.as_object().unwrap().len(), "{file}: tensor count");
        for (path, e) in tensors.as_object().unwrap() {
            let t = v.at(path).and_then(Value::as_tensor).unwrap_or_else(|| panic!("{file}: no tensor at {path}"));
            assert_eq!(t.dtype().name(), e["dtype"].as_str().unwrap(), "{file}:{path}");
            let shape: Vec<usize> =
                e["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            assert_eq!(t.shape(), shape.as_slice(), "{file}:{path}");
            assert!(close(t.sum_f64(), e["sum"].as_f64().unwrap()), "{file}:{path}: {} vs {}", t.sum_f64(), e["sum"]);
            if let Some(values) = e.get("values") {
                let want: Vec<f64> = values.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
                assert_eq!(t.to_f64_vec(), want, "{file}:{path}");
            }
            assert_eq!(t.requires_grad(), e["requires_grad"].as_bool().unwrap(), "{file}:{path}");
        }
    }
}

#[test]
fn protocols_two_four_and_five_agree() {
    let p4 = read(data("protocol4_state_dict.pt")).unwrap();
    let p5 = read(data("protocol5_state_dict.pt")).unwrap();
    assert_eq!(p4, p5);
    let tracked = p4.get("1.num_batches_tracked").and_then(Value::as_tensor).unwrap();
    assert_eq!(tracked.shape(), &[] as &[usize]);
    assert_eq!(tracked.to_vec::<i64>().unwrap(), vec![1]);
}

#[test]
fn plain_values_next_to_tensors() {
    let v = read(data("mixed_dtypes.pt")).unwrap();
    assert_eq!(v.get("device"), Some(&Value::Str("cpu".into())));
    assert_eq!(v.get("size"), Some(&Value::Tuple(vec![Value::Int(2), Value::Int(3)])));
    assert_eq!(v.get("dtype"), Some(&Value::Str("torch.float16".into())));
    let view = v.get("f64_view").and_then(Value::as_tensor).unwrap();
    assert_eq!((view.storage_offset(), view.strides()), (5, &[5usize, 2][..]));
    assert_eq!(v.get("expanded").and_then(Value::as_tensor).unwrap().strides(), &[0, 1]);

    let t = read(data("trainer_state.pt")).unwrap();
    assert_eq!(t.at("scaler/scale").and_then(Value::as_float), Some(32768.0));
    assert_eq!(t.at("scaler/_growth_tracker").and_then(Value::as_int), Some(17));
    assert_eq!(t.get("step").and_then(Value::as_int), Some(1234));
    assert_eq!(t.get("name").and_then(Value::as_str), Some("run-7"));
    assert_eq!(t.get("rng").and_then(Value::as_tensor).unwrap().dtype(), ferrite_tensor::DType::U8);
}

#[test]
fn legacy_views_share_their_storage() {
    let v = read(data("legacy_protocol2_views.pt")).unwrap();
    let base = v.get("base").and_then(Value::as_tensor).unwrap();
    for name in ["t", "row"] {
        let t = v.get(name).and_then(Value::as_tensor).unwrap();
        assert_eq!(t.storage().as_ptr(), base.storage().as_ptr(), "{name}");
    }
    assert_eq!(v.get("row").and_then(Value::as_tensor).unwrap().to_vec::<f32>().unwrap(), vec![4.0, 5.0, 6.0, 7.0]);
}

#[test]
fn numpy_scalars_are_refused() {
    let err = read(data("numpy_scalar.pt")).unwrap_err();
    match &err {
        IoError::UnsafeGlobal { module, name, reason } => {
            assert!(module.starts_with("numpy"), "{module}");
            assert_eq!(name, "scalar");
            assert!(reason.contains("numpy objects"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}
