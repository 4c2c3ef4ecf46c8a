//! The input is used as `data.pkl` of a well-formed `.pt` zip (valid CRCs, one 64-byte storage
//! record under keys 0 and 1), so the fuzzer drives the restricted unpickler and tensor
//! rebuilding rather than the zip checksum.
#![no_main]

use std::io::{Cursor, Write};

use libfuzzer_sys::fuzz_target;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

fuzz_target!(|data: &[u8]| {
    let mut w = ZipWriter::new(Cursor::new(Vec::new()));
    let opts = SimpleFileOptions::default().compression_method(CompressionMethod::Stored);
    let mut add = |name: &str, bytes: &[u8]| {
        w.start_file(name, opts).unwrap();
        w.write_all(bytes).unwrap();
    };
    add("archive/data.pkl", data);
    add("archive/data/0", &[0x3f; 64]);
    add("archive/data/1", &[0x01; 64]);
    let file = w.finish().unwrap().into_inner();
    if let Ok(v) = ferrite_io::read_bytes(&bytes::Bytes::from(file)) {
        for (_, t) in v.tensors() {
            let _ = t.sum_f64();
        }
    }
});
