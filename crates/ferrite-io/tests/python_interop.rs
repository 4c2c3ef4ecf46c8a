//! A safetensors file written by ferrite loads in Python's `safetensors` package (numpy backend)
//! with bit-identical values, dtypes, shapes and metadata. Needs `python3` with `safetensors` and
//! `numpy` (installed by `.ci/run`); skipped loudly when absent unless FERRITE_REQUIRE_SYSTEM_DEPS=1.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use ferrite_io::{Checkpoint, RawTensor, save_state_dict, write_safetensors};
use ferrite_memory::Device;
use ferrite_tensor::{Generator, Tensor};
use half::{bf16, f16};

const SCRIPT: &str = r#"
import json, struct, sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file
path = sys.argv[1]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
# bfloat16 has no numpy dtype: read it from the raw bytes as the format specifies.
bf = {}
for name, info in header.items():
    if name != "__metadata__" and info["dtype"] == "BF16":
        s, e = info["data_offsets"]
        data = raw[8 + n + s: 8 + n + e]
        bf[name] = {"shape": info["shape"], "bits": list(struct.unpack("<%dH" % (len(data) // 2), data))}
out = {}
with safe_open(path, framework="np") as f:
    meta = f.metadata()
    for name in f.keys():
        if name in bf:
            continue
        arr = f.get_tensor(name)
        flat = np.ascontiguousarray(arr).reshape(-1)
        bits = flat.view(np.uint8 if arr.itemsize == 1 else "<u%d" % arr.itemsize)
        out[name] = {"dtype": str(arr.dtype), "shape": list(arr.shape), "bits": [int(b) for b in bits.tolist()]}
# The one-call API agrees when no bfloat16 is involved.
if not bf:
    assert set(load_file(path)) == set(out)
print(json.dumps({"numpy": out, "metadata": meta, "bf16": bf}))
"#;

fn python_ready() -> bool {
    Command::new("python3")
        .args(["-c", "import safetensors.numpy, numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn bits(t: &RawTensor) -> Vec<u64> {
    let es = t.dtype().size_in_bytes();
    t.contiguous_bytes()
        .chunks_exact(es)
        .map(|c| {
            let mut a = [0u8; 8];
            a[..es].copy_from_slice(c);
            u64::from_le_bytes(a)
        })
        .collect()
}

/// Whether the test can run; panics in CI (FERRITE_REQUIRE_SYSTEM_DEPS=1) when python is missing.
fn require_python() -> bool {
    ferrite_test_support::present_or_skip(
        python_ready(),
        "python3 with safetensors+numpy missing",
        "run bash .ci/run or install python3 -m pip install safetensors numpy",
    )
}

/// What Python's safetensors sees in `path` (see SCRIPT).
fn python_view(path: &std::path::Path) -> serde_json::Value {
    let out = Command::new("python3").args(["-c", SCRIPT]).arg(path).output().expect("run python3");
    assert!(out.status.success(), "python failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("python printed JSON")
}

fn json_bits(g: &serde_json::Value) -> Vec<u64> {
    g["bits"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

#[test]
fn ferrite_safetensors_load_in_python_with_identical_values() {
    if !require_python() {
        return;
    }
    let f32s: Vec<f32> = (0..24)
        .map(|i| (i as f32 - 11.5) * 0.37)
        .chain([f32::INFINITY, f32::NAN, -0.0, f32::MIN_POSITIVE / 4.0])
        .collect();
    let full = RawTensor::from_values(vec![4, 7], &f32s).unwrap();
    // A transposed view: written as its row-major copy.
    let transposed = RawTensor::new(full.dtype(), vec![7, 4], vec![1, 7], 0, full.storage().clone()).unwrap();
    let tensors: Vec<(&str, RawTensor)> = vec![
        ("model.fc1.weight", full.clone()),
        ("model.fc1.weight_t", transposed),
        ("f64", RawTensor::from_values(vec![3], &[1.0f64 / 3.0, -1e300, 5e-324]).unwrap()),
        (
            "f16",
            RawTensor::from_values(
                vec![2, 2],
                &[f16::from_f32(0.1), f16::MAX, f16::MIN_POSITIVE_SUBNORMAL, f16::NEG_INFINITY],
            )
            .unwrap(),
        ),
        ("bf16", RawTensor::from_values(vec![3], &[bf16::from_f32(0.1), bf16::MAX, bf16::from_f32(-3.5)]).unwrap()),
        ("steps", RawTensor::from_values(vec![2], &[i64::MAX, i64::MIN]).unwrap()),
        ("i32", RawTensor::from_values(vec![2], &[i32::MIN, 7]).unwrap()),
        ("u8", RawTensor::from_values(vec![3], &[0u8, 128, 255]).unwrap()),
        ("mask", RawTensor::from_values(vec![2, 2], &[true, false, false, true]).unwrap()),
        ("scalar", RawTensor::from_values(vec![], &[2.5f32]).unwrap()),
        ("empty", RawTensor::from_values::<f32>(vec![0, 3], &[]).unwrap()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut meta = BTreeMap::new();
    meta.insert("note".to_string(), "written by ferrite".to_string());
    write_safetensors(&path, tensors.iter().map(|(n, t)| (*n, t)), &meta).unwrap();

    let got = python_view(&path);

    assert_eq!(got["metadata"]["format"], "pt");
    assert_eq!(got["metadata"]["note"], "written by ferrite");
    let np_names =
        ["model.fc1.weight", "model.fc1.weight_t", "f64", "f16", "steps", "i32", "u8", "mask", "scalar", "empty"];
    let np_dtypes =
        ["float32", "float32", "float64", "float16", "int64", "int32", "uint8", "bool", "float32", "float32"];
    assert_eq!(got["numpy"].as_object().unwrap().len(), np_names.len(), "numpy sees every non-bf16 tensor");
    for (name, dtype) in np_names.iter().zip(np_dtypes) {
        let t = &tensors.iter().find(|(n, _)| n == name).unwrap().1;
        let g = &got["numpy"][*name];
        assert_eq!(g["dtype"], dtype, "{name}");
        let shape: Vec<usize> = g["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(shape, t.shape(), "{name}");
        let b: Vec<u64> = g["bits"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(b, bits(t), "{name} values differ");
    }
    let bf = &got["bf16"]["bf16"];
    let b: Vec<u64> = bf["bits"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(b, bits(&tensors[4].1));
}

#[test]
fn tensor_state_dicts_and_training_checkpoints_load_in_python() {
    if !require_python() {
        return;
    }
    let sim = Device::parse("sim:t4-16gb").unwrap();
    let mut g = Generator::new(3);
    let w = Tensor::randn_with(&[5, 3], ferrite_tensor::DType::F32, &Device::Cpu, &mut g).unwrap();
    let w_t = w.t().unwrap(); // a view: saved as its row-major elements
    let h = w.to_dtype(ferrite_tensor::DType::F16).unwrap().to_device(&sim).unwrap();
    let ids = Tensor::from_vec(vec![3i64, -1, i64::MAX], &[3], &sim).unwrap();
    let named = [("enc.weight", &w), ("enc.weight_t", &w_t), ("half", &h), ("ids", &ids)];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tensors.safetensors");
    save_state_dict(&path, named).unwrap();
    let got = python_view(&path);
    assert_eq!(got["metadata"]["format"], "pt");
    for (name, t) in named {
        let raw = RawTensor::from_tensor(t).unwrap();
        let py = &got["numpy"][name];
        assert_eq!(json_bits(py), bits(&raw), "{name}");
        assert_eq!(py["dtype"], t.dtype().name(), "{name}");
    }

    // A ferrite training checkpoint is a safetensors file too: Python sees every tensor under its
    // path, and the tree as metadata.
    let mut ckpt = Checkpoint::new();
    ckpt.set_state_dict("model", [("enc.weight", &w)]).unwrap();
    ckpt.set_tensor("optimizer/state/0/exp_avg", &h).unwrap();
    ckpt.set("epoch", 4i64).unwrap();
    ckpt.set_generator("rng/cpu", &g).unwrap();
    let cpath = dir.path().join("last.ckpt");
    ckpt.save(&cpath).unwrap();
    let got = python_view(&cpath);
    assert_eq!(json_bits(&got["numpy"]["model/enc.weight"]), bits(&RawTensor::from_tensor(&w).unwrap()));
    assert_eq!(json_bits(&got["numpy"]["optimizer/state/0/exp_avg"]), bits(&RawTensor::from_tensor(&h).unwrap()));
    let tree = got["metadata"]["ferrite.checkpoint"].as_str().unwrap();
    assert!(tree.contains("\"epoch\"") && tree.contains("model/enc.weight"), "{tree}");
}
