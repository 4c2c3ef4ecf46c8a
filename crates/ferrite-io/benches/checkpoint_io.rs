//! Save/load throughput of a 1 GiB float32 state_dict: ferrite `Tensor`s through safetensors
//! (memory-mapped reads, atomic writes), the file-level API, and reading a `torch.save` file of the
//! same size with ferrite's safe `.pt` reader. PyTorch's side is `torch_checkpoint_io.py`.
//!
//! Not part of the test suite. Run (after `torch_checkpoint_io.py`, which writes the `.pt` file):
//!   cargo bench -p ferrite-io --bench checkpoint_io -- [DIR]
//! DIR defaults to /tmp/ferrite-io-bench. Figures: median of 5 runs (first run in brackets), warm
//! page cache. Loads into `Tensor`s allocate from ferrite's caching allocator, so runs after the
//! first reuse cached blocks; the first run shows the cost with fresh memory.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::time::Instant;

use ferrite_io::{LoadOptions, RawTensor, Value, load_state_dict, read, save_state_dict, write_safetensors_to};
use ferrite_memory::Device;
use ferrite_tensor::Tensor;

const GIB: f64 = (1u64 << 30) as f64;

/// 64 weight matrices of 2048x2048 floats (16 MiB each) plus a bias per layer: 1 GiB + 512 KiB.
fn state_dict() -> Vec<(String, Tensor)> {
    let mut sd = Vec::new();
    let mut x = 0x9e3779b97f4a7c15u64;
    for layer in 0..64 {
        let n = 2048 * 2048;
        let vals: Vec<f32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        let bias = vals[..2048].to_vec();
        sd.push((format!("layers.{layer}.weight"), Tensor::from_vec(vals, &[2048, 2048], &Device::Cpu).unwrap()));
        sd.push((format!("layers.{layer}.bias"), Tensor::from_vec(bias, &[2048], &Device::Cpu).unwrap()));
    }
    sd
}

/// (first run, median) in seconds.
fn time(runs: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut v: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    let first = v[0];
    v.sort_by(|a, b| a.total_cmp(b));
    (first, v[v.len() / 2])
}

fn report(what: &str, bytes: usize, (first, median): (f64, f64)) {
    println!("{what:<62} {median:>7.3} s  {:>6.2} GiB/s   [first {first:.3} s]", bytes as f64 / GIB / median);
}

fn main() {
    let dir = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/ferrite-io-bench"));
    std::fs::create_dir_all(&dir).unwrap();
    let sd = state_dict();
    let bytes: usize = sd.iter().map(|(_, t)| t.nbytes()).sum();
    println!("state_dict: {} tensors, {:.3} GiB of float32", sd.len(), bytes as f64 / GIB);
    let path = dir.join("ferrite_1g.safetensors");

    report(
        "save_state_dict: Tensors -> safetensors (atomic: fsync+rename)",
        bytes,
        time(5, || save_state_dict(&path, sd.iter().map(|(k, t)| (k.as_str(), t))).unwrap()),
    );
    let raw: Vec<(String, RawTensor)> =
        sd.iter().map(|(k, t)| (k.clone(), RawTensor::from_tensor(t).unwrap())).collect();
    let meta = BTreeMap::new();
    report(
        "write_safetensors_to: host tensors, buffered, no fsync",
        bytes,
        time(5, || {
            let mut w = BufWriter::with_capacity(1 << 20, File::create(&path).unwrap());
            write_safetensors_to(&mut w, raw.iter().map(|(k, t)| (k.as_str(), t)), &meta).unwrap();
        }),
    );
    drop(raw);
    report(
        "load_state_dict: safetensors -> Tensors on cpu (mmap + copy)",
        bytes,
        time(5, || {
            let loaded = load_state_dict(&path, &LoadOptions::new()).unwrap();
            assert_eq!(loaded.len(), sd.len());
        }),
    );
    report(
        "read: safetensors, mmap only (tensors point into the map)",
        bytes,
        time(5, || {
            let v = read(&path).unwrap();
            assert_eq!(v.tensors().len(), sd.len());
        }),
    );

    let pt = dir.join("torch_1g.pt");
    if pt.exists() {
        let pt_bytes = std::fs::metadata(&pt).unwrap().len() as usize;
        report(
            "load_state_dict: torch.save .pt -> Tensors on cpu (safe reader)",
            pt_bytes,
            time(5, || {
                let loaded = load_state_dict(&pt, &LoadOptions::new()).unwrap();
                assert_eq!(loaded.len(), sd.len());
            }),
        );
        report(
            "read: torch.save .pt, mmap only (CRC-checked)",
            pt_bytes,
            time(5, || {
                let v = read(&pt).unwrap();
                assert!(matches!(v, Value::Dict(_)));
            }),
        );
    } else {
        println!("({} not found: run torch_checkpoint_io.py first to compare reading torch.save files)", pt.display());
    }
}
