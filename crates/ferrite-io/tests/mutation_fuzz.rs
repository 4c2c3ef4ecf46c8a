//! Mutation fuzzing of the readers with proptest: real files (PyTorch's pickles inside re-zipped
//! archives with valid CRCs, the legacy format, safetensors and ferrite checkpoints) and random
//! opcode soup are mutated and read. Any panic fails the test; every successful read must yield
//! tensors whose every element can be visited and that load as ferrite `Tensor`s with the same
//! values.
//!
//! `PROPTEST_CASES` sets the inputs per strategy (default 1500; five strategies). Each test prints
//! how many inputs it ran, e.g. `PROPTEST_CASES=20000 cargo test -p ferrite-io --release --test
//! mutation_fuzz -- --nocapture`.

mod common;

use std::collections::BTreeMap;

use bytes::Bytes;
use common::pt_builder::{rezip, zip_records};
use common::pytorch_file;
use ferrite_io::{LoadOptions, RawTensor, TensorLoader, Value, read_bytes, save_checkpoint, write_safetensors_to};
use ferrite_memory::Device;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[derive(Debug, Clone)]
enum Mutation {
    FlipBit(usize, u8),
    SetByte(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Duplicate(usize, usize),
    Truncate(usize),
    /// Overwrite with an "interesting" integer (0, -1, 2^31, 2^63...) as 1/2/4/8 bytes.
    Interesting(usize, u64, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop::sample::select(vec![
        0u64,
        1,
        0x7f,
        0x80,
        0xff,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        u64::MAX,
        1 << 40,
        1 << 62,
    ]);
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::SetByte(i, b)),
        2 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(i, v)| Mutation::Insert(i, v)),
        2 => (any::<usize>(), 1usize..32).prop_map(|(i, n)| Mutation::Delete(i, n)),
        1 => (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        2 => (any::<usize>(), interesting, prop::sample::select(vec![1u8, 2, 4, 8])).prop_map(|(i, v, w)| Mutation::Interesting(i, v, w)),
    ]
}

fn apply(data: &mut Vec<u8>, muts: &[Mutation]) {
    for m in muts {
        let len = data.len();
        if len == 0 {
            return;
        }
        match m {
            Mutation::FlipBit(i, b) => data[i % len] ^= 1 << b,
            Mutation::SetByte(i, v) => data[i % len] = *v,
            Mutation::Insert(i, v) => {
                let at = i % (len + 1);
                data.splice(at..at, v.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let at = i % len;
                data.drain(at..(at + n).min(len));
            }
            Mutation::Duplicate(i, n) => {
                let at = i % len;
                let chunk: Vec<u8> = data[at..(at + n).min(len)].to_vec();
                data.splice(at..at, chunk);
            }
            Mutation::Truncate(i) => data.truncate(i % len),
            Mutation::Interesting(i, v, w) => {
                let w = *w as usize;
                let at = i % len;
                let bytes = v.to_le_bytes();
                let n = w.min(len - at);
                data[at..at + n].copy_from_slice(&bytes[..n]);
            }
        }
    }
}

/// Reads `data`; on success visits every element of every tensor and places every tensor on the
/// CPU as a ferrite `Tensor` (views sharing storages included), which must hold the same values.
fn exercise(data: Vec<u8>) {
    if let Ok(v) = read_bytes(&Bytes::from(data)) {
        let mut loader = TensorLoader::new(&LoadOptions::new().device(Device::Cpu));
        for (name, t) in v.tensors() {
            let _ = t.sum_f64();
            let _ = t.contiguous_bytes();
            let placed =
                loader.load(t).unwrap_or_else(|e| panic!("{name}: a tensor the reader accepted failed to load: {e}"));
            let want: Vec<u64> = t.to_f64_vec().iter().map(|x| x.to_bits()).collect();
            let got: Vec<u64> = placed.to_vec_f64().unwrap().iter().map(|x| x.to_bits()).collect();
            assert!(got == want, "{name}: device tensor differs from the file's");
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(1500)
}

fn config() -> Config {
    Config { cases: cases(), failure_persistence: None, ..Config::default() }
}

/// Records of the zip fixtures: (file, records, index of data.pkl).
/// A zip fixture: its name, its records and the index of `data.pkl`.
type ZipSeed = (String, Vec<(String, Vec<u8>)>, usize);

fn zip_seeds() -> Vec<ZipSeed> {
    [
        "plain_state_dict.pt",
        "shared_storage_views.pt",
        "training_checkpoint.pt",
        "bf16_state_dict.pt",
        "malicious_reduce.pt",
        "full_model_pickle.pt",
    ]
    .iter()
    .filter_map(|n| {
        let bytes = std::fs::read(pytorch_file(n)?).ok()?;
        let recs = zip_records(&bytes);
        let pkl = recs.iter().position(|(name, _)| name.ends_with("data.pkl"))?;
        Some((n.to_string(), recs, pkl))
    })
    .collect()
}

fn safetensors_seeds() -> Vec<Vec<u8>> {
    let a = RawTensor::from_values(vec![3, 2], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let b = RawTensor::from_values(vec![2], &[half::bf16::ONE, half::bf16::MAX]).unwrap();
    let mut plain = Vec::new();
    write_safetensors_to(&mut plain, [("a", &a), ("b", &b)], &BTreeMap::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.ckpt");
    let mut tree = Value::dict();
    tree.insert("w", a).unwrap();
    tree.insert("step", 5i64).unwrap();
    tree.insert("pair", Value::Tuple(vec![Value::Float(0.5), Value::Bytes(vec![1, 2])])).unwrap();
    save_checkpoint(&p, &tree).unwrap();
    vec![plain, std::fs::read(p).unwrap()]
}

/// Opcodes the machine knows, plus a few it must refuse, to make random programs likely to run
/// deep into the interpreter.
const OPCODES: &[u8] = b"()tlde]}uasNKJMGX.qhQR0123bcgipjr\x80\x81\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f\x90\x91\x93\x94\x95\x82\x97";

/// Runs `test` on `cases()` inputs from `strategy` and reports how many ran.
fn fuzz<S: Strategy>(what: &str, strategy: S, test: impl Fn(S::Value)) {
    let mut runner = TestRunner::new(config());
    let n = std::cell::Cell::new(0usize);
    runner
        .run(&strategy, |v| {
            test(v);
            n.set(n.get() + 1);
            Ok(())
        })
        .unwrap();
    let n = n.get();
    eprintln!("mutation fuzz `{what}`: {n} inputs ran without a panic");
}

/// PyTorch's own pickles, mutated, inside archives with correct CRCs: this drives the unpickler
/// and tensor rebuilding, not just the checksum.
#[test]
fn mutated_pickles_in_valid_archives() {
    let seeds = zip_seeds();
    if seeds.is_empty() {
        return;
    }
    fuzz(
        "pickle in valid zip",
        (any::<prop::sample::Index>(), prop::collection::vec(mutation(), 1..6)),
        |(seed, muts)| {
            let (_, recs, pkl) = &seeds[seed.index(seeds.len())];
            let mut recs = recs.clone();
            apply(&mut recs[*pkl].1, &muts);
            exercise(rezip(&recs));
        },
    );
}

/// Whole zip files mutated (container damage, CRC mismatches).
#[test]
fn mutated_zip_files() {
    let seeds: Vec<Vec<u8>> = zip_seeds().iter().map(|(_, r, _)| rezip(r)).collect();
    if seeds.is_empty() {
        return;
    }
    fuzz("zip file", (any::<prop::sample::Index>(), prop::collection::vec(mutation(), 1..4)), |(seed, muts)| {
        let mut data = seeds[seed.index(seeds.len())].clone();
        apply(&mut data, &muts);
        exercise(data);
    });
}

#[test]
fn mutated_legacy_files() {
    let Some(p) = pytorch_file("legacy_format_state_dict.pt") else { return };
    let seed = std::fs::read(p).unwrap();
    fuzz("legacy file", prop::collection::vec(mutation(), 1..6), |muts| {
        let mut data = seed.clone();
        apply(&mut data, &muts);
        exercise(data);
    });
}

#[test]
fn mutated_safetensors_and_checkpoints() {
    let seeds = safetensors_seeds();
    fuzz(
        "safetensors / checkpoint",
        (any::<prop::sample::Index>(), prop::collection::vec(mutation(), 1..6)),
        |(seed, muts)| {
            let mut data = seeds[seed.index(seeds.len())].clone();
            apply(&mut data, &muts);
            exercise(data);
        },
    );
}

/// Random programs over the opcode alphabet, with random argument bytes.
#[test]
fn random_opcode_programs() {
    let op = prop_oneof![3 => prop::sample::select(OPCODES.to_vec()), 1 => any::<u8>()];
    fuzz("random opcode programs", prop::collection::vec(op, 1..200), |ops| {
        let mut p = vec![0x80, 2];
        p.extend(ops);
        p.push(b'.');
        exercise(rezip(&[("archive/data.pkl".to_string(), p), ("archive/data/0".to_string(), vec![0u8; 64])]));
    });
}
