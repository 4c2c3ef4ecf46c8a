//! Damaged and hostile files: every one gives a typed error — never a panic, a hang, or an
//! allocation of a size the file merely claims.

mod common;

use std::collections::BTreeMap;

use bytes::Bytes;
use common::pt_builder::{TensorDesc, f32_bytes, make_pt_zip, state_dict_pickle};
use common::pytorch_file;
use ferrite_io::{IoError, RawTensor, Value, read, read_bytes, write_safetensors_to};

const LOADABLE: [&str; 7] = [
    "plain_state_dict.pt",
    "dataparallel_state_dict.pt",
    "fp16_state_dict.pt",
    "bf16_state_dict.pt",
    "legacy_format_state_dict.pt",
    "shared_storage_views.pt",
    "training_checkpoint.pt",
];

fn fixture(name: &str) -> Option<Vec<u8>> {
    pytorch_file(name).map(|p| std::fs::read(p).expect("read fixture"))
}

fn small_safetensors() -> Vec<u8> {
    let a = RawTensor::from_values(vec![3, 2], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let b = RawTensor::from_values(vec![2], &[7i64, -8]).unwrap();
    let mut out = Vec::new();
    write_safetensors_to(&mut out, [("a", &a), ("b", &b)], &BTreeMap::new()).unwrap();
    out
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> =
        LOADABLE.iter().filter_map(|n| fixture(n).map(|b| (n.to_string(), b))).collect();
    v.push(("small.safetensors".into(), small_safetensors()));
    v
}

#[test]
fn every_truncation_is_an_error() {
    for (name, full) in seeds() {
        assert!(read_bytes(&Bytes::from(full.clone())).is_ok(), "{name} loads whole");
        for len in 0..full.len() {
            let r = read_bytes(&Bytes::copy_from_slice(&full[..len]));
            assert!(r.is_err(), "{name} truncated to {len} bytes loaded");
        }
    }
}

#[test]
fn zero_length_and_wrong_magic_are_unknown_format() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pt");
    std::fs::write(&empty, b"").unwrap();
    let err = read(&empty).unwrap_err();
    assert!(matches!(err, IoError::UnknownFormat { .. }) && err.to_string().contains("empty"), "{err}");

    for junk in
        [&b"GIF89a\x01\x00\x01\x00"[..], b"\x89PNG\r\n\x1a\n\0\0", b"hello world, not a checkpoint", b"\x80\x02}q\x00."]
    {
        let err = read_bytes(&Bytes::copy_from_slice(junk)).unwrap_err();
        assert!(matches!(err, IoError::UnknownFormat { .. }), "{err}");
        assert!(err.to_string().contains("unrecognised leading bytes"), "{err}");
    }
}

/// Single-bit flips anywhere in a zip `.pt` file either fail or change nothing: the CRC-32 of every
/// record that is read catches flips in the pickle and in the weights. Legacy and safetensors
/// files carry no checksum, so for them a flip may change values — it must still never panic.
#[test]
fn bit_flips_never_panic_and_never_silently_change_zip_files() {
    let mut flips = 0usize;
    for (name, full) in seeds() {
        let original = read_bytes(&Bytes::from(full.clone())).unwrap();
        let is_zip = full.starts_with(b"PK");
        for pos in 0..full.len() {
            for bit in [0u8, 3, 7] {
                let mut m = full.clone();
                m[pos] ^= 1 << bit;
                flips += 1;
                if let Ok(v) = read_bytes(&Bytes::from(m))
                    && is_zip
                {
                    assert!(v == original, "{name}: flipping bit {bit} of byte {pos} silently changed the contents");
                }
            }
        }
    }
    eprintln!("bit flips tried: {flips}");
}

#[test]
fn shape_larger_than_storage_names_the_tensor() {
    let pickle = state_dict_pickle(&[TensorDesc {
        name: "fc.weight",
        storage_class: "FloatStorage",
        key: "0",
        numel: 4,
        offset: 0,
        shape: vec![100, 100],
        strides: vec![100, 1],
    }]);
    let file = make_pt_zip(&pickle, &[("0", f32_bytes(&[1.0, 2.0, 3.0, 4.0]))]);
    let err = read_bytes(&Bytes::from(file)).unwrap_err();
    match &err {
        IoError::ShapeStorageMismatch { name, needed, available, .. } => {
            assert_eq!(name.as_deref(), Some("fc.weight"));
            assert_eq!((*needed, *available), (10_000, 4));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("`fc.weight` of shape [100, 100]"), "{err}");

    // A view whose offset pushes it past the end, and one with a stride that does.
    for (offset, strides) in [(1, vec![1]), (0, vec![2])] {
        let pickle = state_dict_pickle(&[TensorDesc {
            name: "v",
            storage_class: "FloatStorage",
            key: "0",
            numel: 4,
            offset,
            shape: vec![4],
            strides,
        }]);
        let file = make_pt_zip(&pickle, &[("0", f32_bytes(&[1.0, 2.0, 3.0, 4.0]))]);
        assert!(matches!(read_bytes(&Bytes::from(file)), Err(IoError::ShapeStorageMismatch { .. })));
    }
}

#[test]
fn absurd_sizes_are_refused_without_allocating_them() {
    // A storage claiming a petabyte of floats, backed by 16 bytes.
    let pickle = state_dict_pickle(&[TensorDesc {
        name: "w",
        storage_class: "FloatStorage",
        key: "0",
        numel: 1 << 48,
        offset: 0,
        shape: vec![1 << 24, 1 << 24],
        strides: vec![1 << 24, 1],
    }]);
    let file = make_pt_zip(&pickle, &[("0", f32_bytes(&[1.0; 4]))]);
    let err = read_bytes(&Bytes::from(file)).unwrap_err();
    assert!(matches!(err, IoError::SizeExceedsData { claimed, available: 16, .. } if claimed == 4 << 48), "{err}");

    // Dimensions whose product overflows 64 bits.
    let pickle = state_dict_pickle(&[TensorDesc {
        name: "w",
        storage_class: "FloatStorage",
        key: "0",
        numel: 4,
        offset: 0,
        shape: vec![i64::MAX, i64::MAX, 4],
        strides: vec![1, 1, 1],
    }]);
    let file = make_pt_zip(&pickle, &[("0", f32_bytes(&[1.0; 4]))]);
    assert!(matches!(read_bytes(&Bytes::from(file)), Err(IoError::ShapeStorageMismatch { .. })));

    // An expanded view (stride 0) of one float claiming 2^62 elements: a valid layout inside its
    // storage, refused before anything visits or copies its elements.
    let pickle = state_dict_pickle(&[TensorDesc {
        name: "w",
        storage_class: "FloatStorage",
        key: "0",
        numel: 1,
        offset: 0,
        shape: vec![1 << 31, 1 << 31],
        strides: vec![0, 0],
    }]);
    let file = make_pt_zip(&pickle, &[("0", f32_bytes(&[1.0]))]);
    let err = read_bytes(&Bytes::from(file)).unwrap_err();
    assert!(matches!(err, IoError::LimitExceeded { .. }), "{err}");

    // Legacy file whose storage header claims 2^60 elements.
    if let Some(mut legacy) = fixture("legacy_format_state_dict.pt") {
        // The first storage's 8-byte element count follows the key-list pickle's STOP (`.`). Find
        // it as the first STOP followed by a little-endian count equal to one of the file's
        // storage sizes (read from the file itself, so any twin of the fixture works).
        let counts: Vec<u64> = read_bytes(&Bytes::from(legacy.clone()))
            .unwrap()
            .tensors()
            .iter()
            .map(|(_, t)| (t.storage().len() / t.dtype().size_in_bytes()) as u64)
            .collect();
        let at = legacy
            .windows(9)
            .position(|w| w[0] == b'.' && counts.contains(&u64::from_le_bytes(w[1..9].try_into().unwrap())))
            .expect("first storage header")
            + 1;
        legacy[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let err = read_bytes(&Bytes::from(legacy)).unwrap_err();
        assert!(matches!(err, IoError::SizeExceedsData { .. }), "{err}");
    }

    // safetensors: header length of a petabyte; a tensor claiming 10^12 x 10^12 elements; data
    // offsets past the end of the file.
    let mut f = (1u64 << 50).to_le_bytes().to_vec();
    f.extend_from_slice(b"{}      ");
    assert!(matches!(read_bytes(&Bytes::from(f)), Err(IoError::SizeExceedsData { .. })));
    for header in [
        r#"{"w":{"dtype":"F32","shape":[1000000000000,1000000000000],"data_offsets":[0,16]}}"#,
        r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,1125899906842624]}}"#,
        r#"{"w":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,16]}}"#,
        r#"{"w":{"dtype":"I8","shape":[16],"data_offsets":[0,16]}}"#,
    ] {
        let mut h = header.as_bytes().to_vec();
        h.resize(h.len().next_multiple_of(8), b' ');
        let mut f = (h.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(&h);
        f.extend_from_slice(&[0u8; 16]);
        let err = read_bytes(&Bytes::from(f)).unwrap_err();
        assert!(matches!(err, IoError::Safetensors { .. } | IoError::UnsupportedDType { .. }), "{header}: {err}");
    }
}

#[test]
fn hostile_pickles_inside_valid_zips() {
    let storage = [("0", f32_bytes(&[1.0; 4]))];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // A billion-laughs list: each level references the previous twice through the memo.
        ("exponential sharing", {
            let mut p = vec![0x80, 2, b']', b'q', 0];
            for i in 0..60u8 {
                p.extend_from_slice(&[b'h', i, b'h', i, 0x86, b'q', i + 1]);
            }
            p.push(b'.');
            p
        }),
        // A list containing itself.
        ("cycle", vec![0x80, 2, b']', b'q', 0, b'h', 0, b'a', b'.']),
        // Nesting deeper than any checkpoint.
        ("deep nesting", {
            let mut p = vec![0x80, 2, b'N'];
            p.extend(std::iter::repeat_n(0x85u8, 100_000));
            p.push(b'.');
            p
        }),
        // Calls through STACK_GLOBAL and INST name their targets too.
        ("stack global", b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R.".to_vec()),
        ("inst", b"(S'id'\nios\nsystem\n.".to_vec()),
        ("builtins eval", b"\x80\x02c__builtin__\neval\nX\x01\x00\x00\x001\x85R.".to_vec()),
        ("ext registry", vec![0x80, 2, 0x82, 1, b'.']),
        ("out-of-band buffer", vec![0x80, 5, 0x97, b'.']),
        ("huge string length", {
            let mut p = vec![0x80, 4, 0x8d];
            p.extend_from_slice(&u64::MAX.to_le_bytes());
            p
        }),
        ("unhashable key", b"\x80\x02}]K\x01s.".to_vec()),
        ("reduce on a non-callable", b"\x80\x02K\x01)R.".to_vec()),
        ("persistent id that is not a storage", b"\x80\x02X\x01\x00\x00\x00xQ.".to_vec()),
    ];
    for (what, pickle) in cases {
        let file = make_pt_zip(&pickle, &storage);
        let r = read_bytes(&Bytes::from(file));
        let err = r.expect_err(what);
        let msg = err.to_string();
        match what {
            "stack global" | "inst" => {
                assert!(matches!(err, IoError::UnsafeGlobal { .. }) && msg.contains("`os.system`"), "{what}: {msg}")
            }
            "builtins eval" => assert!(msg.contains("`__builtin__.eval`"), "{what}: {msg}"),
            "exponential sharing" | "cycle" | "deep nesting" => {
                assert!(matches!(err, IoError::LimitExceeded { .. }), "{what}: {msg}");
                // The path is abbreviated (first and last segments, depth), not 200 of `0/0/0/…`.
                assert!(msg.len() < 300, "{what}: {msg}");
            }
            "huge string length" => assert!(matches!(err, IoError::SizeExceedsData { .. }), "{what}: {msg}"),
            _ => assert!(matches!(err, IoError::Pickle { .. }), "{what}: {msg}"),
        }
    }
}

/// A state_dict of one tensor `w` wrapped in `levels` one-element tuples: the tensor sits
/// `levels + 1` levels below the root.
fn state_dict_in_tuples(levels: usize) -> Vec<u8> {
    let mut p = state_dict_pickle(&[TensorDesc {
        name: "w",
        storage_class: "FloatStorage",
        key: "0",
        numel: 4,
        offset: 0,
        shape: vec![4],
        strides: vec![1],
    }]);
    assert_eq!(p.pop(), Some(b'.'));
    p.extend(std::iter::repeat_n(0x85u8, levels)); // TUPLE1
    p.push(b'.');
    make_pt_zip(&p, &[("0", f32_bytes(&[1.0, 2.0, 3.0, 4.0]))])
}

/// `n` nested one-element lists around an int, as a ferrite checkpoint's JSON tree.
fn json_lists(n: usize) -> String {
    format!("{}1{}", "[".repeat(n), "]".repeat(n))
}

/// Threads spawned by a program get 2 MiB stacks, and so does every test of `cargo test`; in a
/// debug build stack frames are several times larger than in release. The deepest trees the
/// readers accept, and hostile ones past the limits, must be read, used and dropped there: the
/// pickle reader, walks and drop are iterative, and what still recurses (derived `Clone`,
/// `PartialEq`, `Debug`; the JSON encoder and decoder of ferrite checkpoints) is bounded by the
/// readers' depth limits (200 levels for pickles, 41 for ferrite checkpoints).
#[test]
fn deepest_trees_are_safe_on_a_2_mib_stack() {
    let worker = std::thread::Builder::new().name("2 MiB".into()).stack_size(2 << 20);
    let run = worker
        .spawn(|| {
            // Past the pickle limit (200 levels): an error with a short message.
            let mut hostile = vec![0x80, 2, b'N'];
            hostile.extend(std::iter::repeat_n(0x85u8, 1_000_000));
            hostile.push(b'.');
            let err = read_bytes(&Bytes::from(make_pt_zip(&hostile, &[]))).unwrap_err();
            assert!(matches!(err, IoError::LimitExceeded { limit: 200, .. }), "{err}");
            assert!(err.to_string().contains("201 levels") && err.to_string().len() < 300, "{err}");
            assert!(read_bytes(&Bytes::from(state_dict_in_tuples(200))).is_err());

            // At the limit: accepted, and every use of the tree works.
            let v = read_bytes(&Bytes::from(state_dict_in_tuples(199))).unwrap();
            let tensors = v.tensors();
            assert_eq!(tensors.len(), 1);
            assert_eq!(tensors[0].0, format!("{}w", "0/".repeat(199)));
            assert_eq!(tensors[0].1.sum_f64(), 10.0);
            let copy = v.clone();
            assert!(copy == v);
            assert!(format!("{v:?}").contains("Tensor"));
            // ferrite checkpoints nest at most 41 levels: saving this one is refused, briefly.
            let err = ferrite_io::write_checkpoint_to(&mut Vec::new(), &v).unwrap_err();
            assert!(matches!(err, IoError::Structure { .. }) && err.to_string().contains("41"), "{err}");
            assert!(err.to_string().len() < 400, "{err}");
            drop(tensors);
            drop((v, copy));

            // The deepest ferrite checkpoint (dicts all the way, the costliest in JSON levels)
            // saves and loads back; one level more is refused on save.
            let mut deep = Value::dict();
            for i in 0..41 {
                let mut d = Value::dict();
                d.insert(format!("level{i}"), deep).unwrap();
                deep = d;
            }
            let mut file = Vec::new();
            ferrite_io::write_checkpoint_to(&mut file, &deep).unwrap();
            let back = read_bytes(&Bytes::from(file)).unwrap();
            assert!(back == deep);
            let mut deeper = Value::dict();
            deeper.insert("one more", deep).unwrap();
            assert!(ferrite_io::write_checkpoint_to(&mut Vec::new(), &deeper).is_err());
            let mut meta = BTreeMap::new();
            for levels in [101, 127, 100_000] {
                meta.insert(ferrite_io::CHECKPOINT_TREE_KEY.to_string(), json_lists(levels));
                let mut file = Vec::new();
                write_safetensors_to(&mut file, std::iter::empty::<(&str, &RawTensor)>(), &meta).unwrap();
                let err = read_bytes(&Bytes::from(file)).unwrap_err();
                assert!(err.to_string().len() < 300, "{levels}: {err}");
            }
        })
        .unwrap();
    run.join().expect("deep trees on a 2 MiB stack");
}

#[test]
fn tensors_keep_plain_values_when_the_pickle_is_just_data() {
    // A checkpoint of plain values only (no tensors), e.g. a config saved with torch.save.
    let p = b"\x80\x02}(X\x01\x00\x00\x00aK\x05X\x01\x00\x00\x00b](G?\xf8\x00\x00\x00\x00\x00\x00\x88Neu.".to_vec();
    let v = read_bytes(&Bytes::from(make_pt_zip(&p, &[]))).unwrap();
    assert_eq!(v.get("a"), Some(&Value::Int(5)));
    assert_eq!(v.get("b"), Some(&Value::List(vec![Value::Float(1.5), Value::Bool(true), Value::None])));
}
