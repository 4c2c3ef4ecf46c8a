//! Builds small `.pt` zip files the way torch.save lays them out, so tests can craft
//! inconsistent ones (shapes larger than storages, absurd sizes) without Python.
#![allow(dead_code)]

use std::io::{Cursor, Write};

use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// One tensor of a state_dict pickle.
pub struct TensorDesc {
    pub name: &'static str,
    pub storage_class: &'static str,
    pub key: &'static str,
    pub numel: i64,
    pub offset: i64,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
}

fn int(p: &mut Vec<u8>, v: i64) {
    p.extend_from_slice(&[0x8a, 8]);
    p.extend_from_slice(&v.to_le_bytes());
}

fn text(p: &mut Vec<u8>, s: &str) {
    p.push(b'X');
    p.extend_from_slice(&(s.len() as u32).to_le_bytes());
    p.extend_from_slice(s.as_bytes());
}

fn global(p: &mut Vec<u8>, module: &str, name: &str) {
    p.push(b'c');
    p.extend_from_slice(format!("{module}\n{name}\n").as_bytes());
}

/// `OrderedDict` of `_rebuild_tensor_v2` calls, protocol 2, like torch.save writes.
pub fn state_dict_pickle(tensors: &[TensorDesc]) -> Vec<u8> {
    state_dict_pickle_at(tensors, "cpu")
}

/// [`state_dict_pickle`] with every storage tagged as saved on `location` (`cuda:1`, …).
pub fn state_dict_pickle_at(tensors: &[TensorDesc], location: &str) -> Vec<u8> {
    let mut p = vec![0x80, 2];
    global(&mut p, "collections", "OrderedDict");
    p.extend_from_slice(b")R(");
    for t in tensors {
        text(&mut p, t.name);
        global(&mut p, "torch._utils", "_rebuild_tensor_v2");
        p.extend_from_slice(b"((");
        text(&mut p, "storage");
        global(&mut p, "torch", t.storage_class);
        text(&mut p, t.key);
        text(&mut p, location);
        int(&mut p, t.numel);
        p.extend_from_slice(b"tQ");
        int(&mut p, t.offset);
        p.push(b'(');
        t.shape.iter().for_each(|&d| int(&mut p, d));
        p.push(b't');
        p.push(b'(');
        t.strides.iter().for_each(|&d| int(&mut p, d));
        p.push(b't');
        p.push(0x89);
        global(&mut p, "collections", "OrderedDict");
        p.extend_from_slice(b")Rt");
        p.push(b'R');
    }
    p.extend_from_slice(b"u.");
    p
}

/// A zip archive `archive/{data.pkl, byteorder, data/<key>...}` with stored, 64-byte aligned records.
pub fn make_pt_zip(pickle: &[u8], storages: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut w = ZipWriter::new(Cursor::new(Vec::new()));
    let opts = SimpleFileOptions::default().compression_method(CompressionMethod::Stored).with_alignment(64);
    w.start_file("archive/data.pkl", opts).unwrap();
    w.write_all(pickle).unwrap();
    w.start_file("archive/byteorder", opts).unwrap();
    w.write_all(b"little").unwrap();
    for (key, bytes) in storages {
        w.start_file(format!("archive/data/{key}"), opts).unwrap();
        w.write_all(bytes).unwrap();
    }
    w.start_file("archive/version", opts).unwrap();
    w.write_all(b"3\n").unwrap();
    w.finish().unwrap().into_inner()
}

/// Extracts the records of a `.pt` zip (name, bytes) in archive order.
pub fn zip_records(file: &[u8]) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let mut z = zip::ZipArchive::new(Cursor::new(file)).unwrap();
    (0..z.len())
        .map(|i| {
            let mut f = z.by_index(i).unwrap();
            let mut v = Vec::new();
            f.read_to_end(&mut v).unwrap();
            (f.name().to_string(), v)
        })
        .collect()
}

/// Re-zips records (recomputing CRCs), e.g. after mutating `data.pkl`.
pub fn rezip(records: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut w = ZipWriter::new(Cursor::new(Vec::new()));
    let opts = SimpleFileOptions::default().compression_method(CompressionMethod::Stored).with_alignment(64);
    for (name, bytes) in records {
        w.start_file(name.as_str(), opts).unwrap();
        w.write_all(bytes).unwrap();
    }
    w.finish().unwrap().into_inner()
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}
