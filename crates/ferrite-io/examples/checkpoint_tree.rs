//! Save a training checkpoint atomically, read it back, and read a PyTorch file safely.
//!
//!   cargo run -p ferrite-io --example checkpoint_tree -- [FILE.pt]

use ferrite_io::{RawTensor, Value, read, save_checkpoint, state_dict_from_value, strip_prefix};
use ferrite_tensor::Generator;

fn main() -> Result<(), ferrite_io::IoError> {
    // A checkpoint is a tree: tensors, numbers, strings, generator states...
    let mut model = Value::dict();
    model.insert("fc.weight", RawTensor::from_values(vec![2, 2], &[0.5f32, -1.0, 2.0, 0.25])?)?;
    let mut ckpt = Value::dict();
    ckpt.insert("model", model)?;
    ckpt.insert("epoch", 3i64)?;
    ckpt.insert("rng", Generator::new(42).state())?;
    let path = std::env::temp_dir().join("ferrite-example.ckpt");
    save_checkpoint(&path, &ckpt)?; // temp file + fsync + rename: a crash never leaves half a file

    let back = read(&path)?;
    assert_eq!(back, ckpt);
    println!(
        "epoch {} restored, weight sum {}",
        back.require("epoch")?.as_int().unwrap_or(0),
        back.require("model/fc.weight")?.as_tensor().map(|t| t.sum_f64()).unwrap_or(0.0)
    );

    // PyTorch files: refused if they would run code; `module.` prefixes stripped on request.
    if let Some(pt) = std::env::args().nth(1) {
        let sd = strip_prefix(state_dict_from_value(&read(&pt)?)?, "module.");
        for (name, t) in &sd {
            println!("{name}: {} {:?} sum={}", t.dtype(), t.shape(), t.sum_f64());
        }
    }
    Ok(())
}
