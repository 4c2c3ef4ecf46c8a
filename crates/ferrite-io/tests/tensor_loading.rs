//! The PyTorch reference files loaded as ferrite `Tensor`s: on `cpu`, on a simulated GPU and on
//! `meta`; views sharing one storage still share it on the device; `map_location` for files saved
//! on CUDA devices; dtype conversion on load agreeing bit-for-bit with PyTorch's own `.half()` /
//! `.bfloat16()` files; DataParallel prefixes diagnosed and stripped.

mod common;

use common::pt_builder::{TensorDesc, f32_bytes, make_pt_zip, state_dict_pickle_at};
use common::{close, expected, pytorch_file};
use ferrite_io::{
    Checkpoint, IoError, LoadOptions, MapLocation, TensorLoader, Value, check_keys, load_state_dict, read,
    state_dict_from_value,
};
use ferrite_memory::Device;
use ferrite_tensor::{DType, Tensor};

fn bits(t: &Tensor) -> Vec<u64> {
    let v = t.to_vec_f64().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

fn sum(t: &Tensor) -> f64 {
    t.to_vec_f64().unwrap().iter().sum()
}

#[test]
fn every_loadable_reference_file_loads_as_tensors_with_the_files_values() {
    let files = [
        ("plain_state_dict.pt", None, None, DType::F32),
        ("dataparallel_state_dict.pt", None, Some("module."), DType::F32),
        ("fp16_state_dict.pt", None, None, DType::F16),
        ("bf16_state_dict.pt", None, None, DType::BF16),
        ("legacy_format_state_dict.pt", None, None, DType::F32),
        ("training_checkpoint.pt", Some("model"), None, DType::F32),
    ];
    let exp = match expected() {
        Some(e) => e,
        None => return,
    };
    let plain_keys: Vec<String> = exp["plain_state_dict"].as_object().unwrap().keys().cloned().collect();
    let sim = Device::parse("sim:a100-40gb:1").unwrap();
    for (file, key, prefix, dtype) in files {
        let path = pytorch_file(file).unwrap();
        let raw_tree = read(&path).unwrap();
        let raw_node = key.map(|k| raw_tree.require(k).unwrap()).unwrap_or(&raw_tree);
        let raw = state_dict_from_value(raw_node).unwrap();
        for device in [Device::Cpu, sim.clone()] {
            let mut opts = LoadOptions::new().device(device.clone());
            opts.key = key.map(str::to_string);
            opts.strip_prefix = prefix.map(str::to_string);
            let sd = load_state_dict(&path, &opts).unwrap_or_else(|e| panic!("{file}: {e}"));
            let mut names: Vec<String> = sd.iter().map(|(n, _)| n.clone()).collect();
            names.sort();
            let mut want = plain_keys.clone();
            want.sort();
            assert_eq!(names, want, "{file}");
            for ((name, t), (_, r)) in sd.iter().zip(&raw) {
                assert_eq!((t.device(), t.dtype(), t.shape()), (&device, dtype, r.shape()), "{file}:{name}");
                let want: Vec<u64> = r.to_f64_vec().iter().map(|x| x.to_bits()).collect();
                assert_eq!(bits(t), want, "{file}:{name} values");
                assert!(close(sum(t), r.sum_f64()), "{file}:{name}");
            }
        }
    }
    // PyTorch's float64 sums of every loaded tensor (expected.json's `files` listing).
    for (file, key, prefix, _) in files {
        let mut opts = LoadOptions::new();
        opts.key = key.map(str::to_string);
        opts.strip_prefix = prefix.map(str::to_string);
        let sd = load_state_dict(pytorch_file(file).unwrap(), &opts).unwrap();
        let listing = exp["files"][file]["tensors"].as_object().unwrap_or_else(|| panic!("expected.json lists {file}"));
        for (name, t) in &sd {
            let path = match (key, prefix) {
                (Some(k), _) => format!("{k}/{name}"),
                (None, Some(p)) => format!("{p}{name}"),
                (None, None) => name.clone(),
            };
            let e = &listing[path.as_str()];
            assert!(close(sum(t), e["sum"].as_f64().unwrap()), "{file}:{path}: {} vs {}", sum(t), e["sum"]);
            let shape: Vec<usize> =
                e["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            assert_eq!(t.shape(), shape.as_slice(), "{file}:{path}");
        }
    }
}

#[test]
fn shared_storage_views_come_back_as_views_of_one_device_storage() {
    let Some(path) = pytorch_file("shared_storage_views.pt") else { return };
    let exp = expected().unwrap();
    let exp = &exp["shared_storage_views"];
    let tree = read(&path).unwrap();
    for device in [Device::Cpu, Device::parse("sim:t4-16gb").unwrap()] {
        let mut loader = TensorLoader::new(&LoadOptions::new().device(device.clone()));
        let full = loader.load(tree.get("full").and_then(Value::as_tensor).unwrap()).unwrap();
        assert_eq!(full.to_vec::<f32>().unwrap(), (0..24).map(|i| i as f32).collect::<Vec<_>>());
        let mut views = Vec::new();
        for name in ["row_view", "col_view", "transposed"] {
            let t = loader.load(tree.get(name).and_then(Value::as_tensor).unwrap()).unwrap();
            let want: Vec<f64> = exp[name]["values"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            let shape: Vec<usize> =
                exp[name]["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            assert_eq!((t.shape(), t.to_vec_f64().unwrap()), (shape.as_slice(), want), "{name} on {device}");
            assert!(t.shares_storage(&full), "{name} shares `full`'s storage on {device}");
            views.push(t);
        }
        assert_eq!(loader.allocated_bytes(), 24 * 4, "one storage on the device, not four");
        // PyTorch semantics: writing through the base is visible through every view.
        full.fill_(1.0).unwrap();
        assert!(views.iter().all(|v| v.to_vec_f64().unwrap().iter().all(|&x| x == 1.0)));
    }
}

#[test]
fn meta_loads_shapes_and_allocations_without_data() {
    let Some(path) = pytorch_file("training_checkpoint.pt") else { return };
    let tree = read(&path).unwrap();
    let mut loader = TensorLoader::new(&LoadOptions::new().device(Device::Meta));
    let mut bytes = 0;
    for (name, raw) in tree.tensors() {
        let t = loader.load(raw).unwrap();
        assert!(t.is_meta(), "{name}");
        assert_eq!((t.shape(), t.dtype()), (raw.shape(), raw.dtype()), "{name}");
        assert!(t.to_vec_f64().is_err(), "meta tensors have no values");
        bytes += raw.storage().len();
    }
    assert_eq!(loader.allocated_bytes(), bytes, "meta allocates exactly the file's storages");
}

#[test]
fn dtype_on_load_matches_pytorchs_own_half_and_bfloat16_files() {
    let Some(plain) = pytorch_file("plain_state_dict.pt") else { return };
    for (file, dtype) in [("fp16_state_dict.pt", DType::F16), ("bf16_state_dict.pt", DType::BF16)] {
        let converted = load_state_dict(&plain, &LoadOptions::new().dtype(dtype)).unwrap();
        let torch = load_state_dict(pytorch_file(file).unwrap(), &LoadOptions::new()).unwrap();
        for ((name, a), (_, b)) in converted.iter().zip(&torch) {
            assert_eq!(a.dtype(), dtype);
            assert_eq!(bits(a), bits(b), "{name}: ferrite's conversion differs from PyTorch's {file}");
        }
    }
}

#[test]
fn dataparallel_prefix_is_diagnosed_then_stripped_on_request() {
    let Some(dp) = pytorch_file("dataparallel_state_dict.pt") else { return };
    let model_keys: Vec<String> = load_state_dict(pytorch_file("plain_state_dict.pt").unwrap(), &LoadOptions::new())
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let loaded: Vec<String> = load_state_dict(&dp, &LoadOptions::new()).unwrap().into_iter().map(|(k, _)| k).collect();
    let err = check_keys(&model_keys, &loaded, true).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, IoError::IncompatibleKeys { .. }));
    assert!(msg.contains("Unexpected key(s) in state_dict: \"module.emb.weight\""), "{msg}");
    assert!(msg.contains("start with `module.`") && msg.contains("strip_prefix(\"module.\")"), "{msg}");
    let stripped: Vec<String> = load_state_dict(&dp, &LoadOptions::new().strip_prefix("module."))
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert!(check_keys(&model_keys, &stripped, true).unwrap().missing_keys.is_empty());
}

/// A state_dict whose storages were saved on `cuda:1` (the location tag torch.save writes into
/// the persistent id), built byte-for-byte like torch.save's layout.
fn cuda_file() -> Vec<u8> {
    let desc = [TensorDesc {
        name: "w",
        storage_class: "FloatStorage",
        key: "0",
        numel: 6,
        offset: 0,
        shape: vec![2, 3],
        strides: vec![3, 1],
    }];
    make_pt_zip(&state_dict_pickle_at(&desc, "cuda:1"), &[("0", f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))])
}

#[test]
fn cuda_tensors_need_a_map_location_and_go_where_it_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cuda.pt");
    std::fs::write(&path, cuda_file()).unwrap();
    let err = load_state_dict(&path, &LoadOptions::new()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, IoError::Device { .. }) && msg.contains("cuda:1") && msg.contains("map location"), "{msg}");

    let sim = Device::parse("sim:h100-80gb:1").unwrap();
    for (spec, want) in [
        ("cuda:1=sim:h100-80gb:1", sim.clone()),
        ("cuda=cpu", Device::Cpu),
        ("cuda:0=meta,cuda=cpu", Device::Cpu),
        ("meta", Device::Meta),
    ] {
        let opts = LoadOptions::new().map_location(MapLocation::parse(spec).unwrap());
        let sd = load_state_dict(&path, &opts).unwrap();
        assert_eq!(sd[0].1.device(), &want, "{spec}");
        if want != Device::Meta {
            assert_eq!(sd[0].1.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        }
    }
    // The tag survives a trip through a ferrite checkpoint, so the same choice is needed there.
    let ckpt = Checkpoint::load(&path).unwrap();
    let cpath = dir.path().join("c.ckpt");
    ckpt.save(&cpath).unwrap();
    let back = Checkpoint::load(&cpath).unwrap();
    assert!(back.tensor("w", &LoadOptions::new()).is_err());
    assert_eq!(back.tensor("w", &LoadOptions::new().device(Device::Cpu)).unwrap().sum().unwrap().item().unwrap(), 21.0);
}

#[test]
fn pytorch_training_checkpoint_reads_as_a_checkpoint() {
    let Some(path) = pytorch_file("training_checkpoint.pt") else { return };
    let exp = expected().unwrap();
    let ckpt = Checkpoint::load(&path).unwrap();
    assert_eq!(ckpt.int("epoch").unwrap(), exp["training_checkpoint"]["epoch"].as_i64().unwrap());
    assert_eq!(ckpt.float("loss").unwrap(), exp["training_checkpoint"]["loss"].as_f64().unwrap());
    assert_eq!(ckpt.float("optimizer/param_groups/0/lr").unwrap(), 0.001);
    let m = ckpt.tensor("optimizer/state/0/exp_avg", &LoadOptions::new()).unwrap();
    assert_eq!(m.shape(), &[11, 4]);
    assert_eq!(ckpt.tensor("optimizer/state/0/step", &LoadOptions::new()).unwrap().item().unwrap(), 1.0);
    assert_eq!(ckpt.state_dict("model", &LoadOptions::new().device(Device::Meta)).unwrap().len(), 7);
}
