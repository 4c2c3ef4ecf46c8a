//! The README's `ferrite-nn` example: a model with checkpointed blocks on a simulated T4, one
//! bf16 autocast training step, inference without activations, and loading a checkpoint that
//! carries DataParallel's `module.` prefix. Run: `cargo run --release -p ferrite-nn --example nn_tour`.

use ferrite_nn::{
    Checkpointed, CrossEntropyLoss, Dropout, Linear, LoadOptions, Module, ReLU, Sequential, autocast, inference,
};
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn block(dev: &Device, g: &mut Generator) -> ferrite_nn::Result<Sequential> {
    Ok(Sequential::new()
        .append(Linear::new_with(64, 64, true, dev, g)?)
        .append(ReLU::new())
        .append(Dropout::new_with(0.1, g)?))
}

fn main() -> ferrite_nn::Result<()> {
    let dev = Device::parse("sim:t4-16gb")?;
    let mut g = Generator::new(0);
    let mut model = Sequential::new()
        .append(Checkpointed::new(block(&dev, &mut g)?)) // activations recomputed in backward
        .append(Checkpointed::new(block(&dev, &mut g)?))
        .append(Linear::new_with(64, 10, true, &dev, &mut g)?);
    println!("{:?}", model.state_dict()); // {"0.0.weight": float32 [64, 64], "0.0.bias": ..., "2.bias": ...}

    let x = Tensor::randn_with(&[32, 64], DType::F32, &dev, &mut g)?;
    let y = Tensor::from_vec((0..32).map(|i| i % 10).collect::<Vec<i64>>(), &[32], &dev)?;
    let loss = {
        let _amp = autocast(DType::BF16)?; // linears in bf16; the loss in f32
        CrossEntropyLoss::new().label_smoothing(0.1)?.forward(&model.forward(&x)?, &y)?
    };
    loss.backward()?; // recomputes each checkpointed block with the same dropout masks
    println!("loss {:.4}, grad of 0.0.weight: {:?}", loss.item()?, model.parameters()[0].grad().map(|g| g.dtype()));
    model.zero_grad()?; // frees the gradients

    let logits = inference(&mut model, |m| m.forward(&x))?; // eval + no_grad: no activations kept
    println!("logits {:?}, requires grad: {}", logits.shape(), logits.requires_grad());

    let from_ddp = model.state_dict().with_prefix("module."); // as saved from a DataParallel model
    if let Err(e) = model.load_state_dict(&from_ddp, true) {
        println!("{e}"); // missing/unexpected keys, and the hint below
    }
    let opts = LoadOptions { strip_prefix: Some("module.".into()), ..Default::default() };
    model.load_state_dict_with(&from_ddp, &opts)?;
    Ok(())
}
