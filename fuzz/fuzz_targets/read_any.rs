//! Any bytes through format detection and every reader (PyTorch zip, legacy, safetensors,
//! ferrite checkpoints); a successful read must have tensors whose elements can all be visited.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = ferrite_io::read_bytes(&bytes::Bytes::copy_from_slice(data)) {
        for (_, t) in v.tensors() {
            let _ = t.sum_f64();
        }
    }
});
