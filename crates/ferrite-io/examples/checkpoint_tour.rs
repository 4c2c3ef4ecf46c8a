//! ferrite `Tensor`s in and out of checkpoints: a safetensors state_dict loaded back onto a
//! simulated GPU in bfloat16, a training checkpoint resumed exactly, and a PyTorch file loaded
//! safely with its CUDA tensors remapped and its `module.` prefix stripped.
//!
//!   cargo run --release -p ferrite-io --example checkpoint_tour -- [FILE.pt [KEY]]

use ferrite_io::{Checkpoint, LoadOptions, MapLocation, load_state_dict, save_state_dict};
use ferrite_memory::Device;
use ferrite_tensor::{DType, Generator, Tensor};

fn main() -> Result<(), ferrite_io::IoError> {
    let dir = std::env::temp_dir();
    let mut rng = Generator::new(0);
    let w = Tensor::randn_with(&[4, 3], DType::F32, &Device::Cpu, &mut rng)?;
    let b = Tensor::zeros(&[4], DType::F32, &Device::Cpu)?;

    // A state_dict as safetensors (atomic write; loads unchanged in safetensors.torch) ...
    let weights = dir.join("ferrite-tour.safetensors");
    save_state_dict(&weights, [("fc.weight", &w), ("fc.bias", &b)])?;
    // ... and back onto a simulated A100, converted to bfloat16 on the way.
    let opts = LoadOptions::new().map_location(MapLocation::parse("sim:a100-40gb")?).dtype(DType::BF16);
    for (name, t) in load_state_dict(&weights, &opts)? {
        println!("{name}: {} {:?} on {}", t.dtype(), t.shape(), t.device());
    }

    // A training checkpoint: tensors, counters and exact RNG states in one atomically written file.
    let mut ckpt = Checkpoint::new();
    ckpt.set_state_dict("model", [("fc.weight", &w), ("fc.bias", &b)])?;
    ckpt.set("epoch", 3i64)?;
    ckpt.set_generator("rng/cpu", &rng)?;
    let path = dir.join("ferrite-tour.ckpt");
    ckpt.save(&path)?;
    let expected_next = rng.next_u64();

    let back = Checkpoint::load(&path)?;
    let mut resumed = Generator::new(42);
    back.restore_generator("rng/cpu", &mut resumed)?;
    assert_eq!(resumed.next_u64(), expected_next, "the RNG continues exactly");
    let model = back.state_dict("model", &LoadOptions::new())?;
    println!("resumed at epoch {} with {} tensors", back.int("epoch")?, model.len());

    // A PyTorch file: refused if it would run code; CUDA tensors onto the CPU; `module.` stripped.
    let mut args = std::env::args().skip(1);
    if let Some(pt) = args.next() {
        let mut opts = LoadOptions::new().map_location(MapLocation::parse("cuda=cpu")?).strip_prefix("module.");
        opts.key = args.next();
        for (name, t) in load_state_dict(&pt, &opts)? {
            println!("{name}: {} {:?} sum={}", t.dtype(), t.shape(), t.sum()?.item()?);
        }
    }
    Ok(())
}
