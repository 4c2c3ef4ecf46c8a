//! Save/load throughput of a 1 GiB float32 state_dict through safetensors (memory-mapped), and of
//! reading a `torch.save` file of the same size with ferrite's safe `.pt` reader.
//!
//! Not part of the test suite. Run (after `torch_checkpoint_io.py`, which writes the `.pt` file):
//!   cargo bench -p ferrite-io --bench checkpoint_io -- [DIR]
//! DIR defaults to /tmp/ferrite-io-bench. Each figure is the median of 5 runs, warm page cache.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::time::Instant;

use ferrite_io::{RawTensor, Value, read, write_safetensors, write_safetensors_to};

const GIB: f64 = (1u64 << 30) as f64;

/// 64 weight matrices of 2048x2048 floats (16 MiB each) plus a bias per layer: 1 GiB + 512 KiB.
fn state_dict() -> Vec<(String, RawTensor)> {
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
        sd.push((format!("layers.{layer}.weight"), RawTensor::from_values(vec![2048, 2048], &vals).unwrap()));
        sd.push((format!("layers.{layer}.bias"), RawTensor::from_values(vec![2048], &vals[..2048]).unwrap()));
    }
    sd
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn time(runs: usize, mut f: impl FnMut()) -> f64 {
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn report(what: &str, bytes: usize, secs: f64) {
    println!("{what:<58} {secs:>8.3} s  {:>7.2} GiB/s", bytes as f64 / GIB / secs);
}

fn main() {
    let dir = std::env::args().skip(1).find(|a| !a.starts_with('-')).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp/ferrite-io-bench"));
    std::fs::create_dir_all(&dir).unwrap();
    let sd = state_dict();
    let bytes: usize = sd.iter().map(|(_, t)| t.nbytes()).sum();
    println!("state_dict: {} tensors, {:.3} GiB of float32", sd.len(), bytes as f64 / GIB);
    let path = dir.join("ferrite_1g.safetensors");
    let meta = BTreeMap::new();

    let t = time(5, || {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&path).unwrap());
        write_safetensors_to(&mut w, sd.iter().map(|(k, t)| (k.as_str(), t)), &meta).unwrap();
    });
    report("save safetensors (buffered write, no fsync)", bytes, t);
    let t = time(5, || write_safetensors(&path, sd.iter().map(|(k, t)| (k.as_str(), t)), &meta).unwrap());
    report("save safetensors atomically (temp + fsync + rename)", bytes, t);

    let t = time(5, || {
        let v = read(&path).unwrap();
        assert_eq!(v.tensors().len(), sd.len());
    });
    report("load safetensors (mmap, tensors point into the map)", bytes, t);
    let t = time(5, || {
        let v = read(&path).unwrap();
        let owned: Vec<Vec<u8>> = v.tensors().iter().map(|(_, t)| t.contiguous_bytes().to_vec()).collect();
        assert_eq!(owned.len(), sd.len());
    });
    report("load safetensors + copy every tensor into owned memory", bytes, t);

    let pt = dir.join("torch_1g.pt");
    if pt.exists() {
        let pt_bytes = std::fs::metadata(&pt).unwrap().len() as usize;
        let t = time(5, || {
            let v = read(&pt).unwrap();
            assert!(matches!(v, Value::Dict(_)));
        });
        report("load torch.save .pt (safe reader, mmap, CRC-checked)", pt_bytes, t);
        let t = time(5, || {
            let v = read(&pt).unwrap();
            let owned: Vec<Vec<u8>> = v.tensors().iter().map(|(_, t)| t.contiguous_bytes().to_vec()).collect();
            assert!(!owned.is_empty());
        });
        report("load torch.save .pt + copy every tensor into owned memory", pt_bytes, t);
    } else {
        println!("({} not found: run torch_checkpoint_io.py first to compare reading torch.save files)", pt.display());
    }
}
