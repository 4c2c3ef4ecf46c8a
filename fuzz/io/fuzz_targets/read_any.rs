//! Any bytes through format detection and every reader (PyTorch zip, legacy, safetensors,
//! ferrite checkpoints); a successful read must have tensors whose elements can all be visited and
//! that load onto the CPU as ferrite `Tensor`s with the same values.
#![no_main]

use ferrite_io::{LoadOptions, TensorLoader};
use ferrite_memory::Device;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = ferrite_io::read_bytes(&bytes::Bytes::copy_from_slice(data)) {
        let mut loader = TensorLoader::new(&LoadOptions::new().device(Device::Cpu));
        for (_, t) in v.tensors() {
            let _ = t.sum_f64();
            let placed = loader.load(t).expect("an accepted tensor loads");
            let want: Vec<u64> = t.to_f64_vec().iter().map(|x| x.to_bits()).collect();
            let got: Vec<u64> =
                placed.to_vec_f64().expect("cpu tensors have values").iter().map(|x| x.to_bits()).collect();
            assert!(got == want);
        }
    }
});
