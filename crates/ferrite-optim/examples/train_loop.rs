//! The training loop of the README's "Optimizers and mixed precision" section:
//! AdamW with decay-free biases, warm-up + cosine, loss scaling, clipping and accumulation.
//!
//!     cargo run --release -p ferrite-optim --example train_loop

use ferrite_optim::{
    Accumulator, Adam, AdamConfig, GradScaler, GradScalerConfig, LrScheduler, Optimizer, ParamGroup, clip_grad_norm_,
    warmup_cosine,
};
use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
use ferrite_tensor::{DType, Device, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::Cpu;
    let leaf = |shape: &[usize]| -> Result<Tensor, Box<dyn std::error::Error>> {
        Ok(Tensor::randn(shape, DType::F32, &dev)?.mul_scalar(0.3)?.requires_grad_(true)?)
    };
    let (w1, b1, w2, b2) = (leaf(&[32, 8])?, leaf(&[32])?, leaf(&[3, 32])?, leaf(&[3])?);
    let x = Tensor::randn(&[64, 8], DType::F32, &dev)?;
    let y = x.narrow(1, 0, 3)?.argmax(1, false)?; // a learnable rule: the largest of the first 3 features

    let mut opt = Adam::with_groups(vec![
        ParamGroup::new(vec![w1.clone(), w2.clone()], AdamConfig::adamw(3e-2)),
        ParamGroup::new(vec![b1.clone(), b2.clone()], AdamConfig::adamw(3e-2).weight_decay(0.0)),
    ])?;
    let mut sched = warmup_cosine(&mut opt, 5, 60, 0.1, 1e-4)?;
    let mut scaler = GradScaler::new(GradScalerConfig::default())?; // pays off with f16/bf16 autocast
    let mut acc = Accumulator::new(4)?; // 4 micro-batches of 16 = one batch of 64

    for step in 0..60 {
        for m in 0..4 {
            let (xb, yb) = (x.narrow(0, m * 16, 16)?, y.narrow(0, m * 16, 16)?);
            let logits = xb.linear(&w1, Some(&b1))?.tanh()?.linear(&w2, Some(&b2))?;
            let loss = cross_entropy(&logits, &yb, &CrossEntropyOptions::default())?;
            scaler.scale(&acc.scale_loss(&loss)?)?.backward()?;
            if acc.micro_step() {
                scaler.unscale_(&mut opt)?;
                let norm = clip_grad_norm_(&opt.params(), 1.0)?;
                scaler.step(&mut opt)?;
                scaler.update()?;
                opt.zero_grad()?;
                sched.step(&mut opt)?;
                if step % 20 == 0 {
                    println!("step {step:>2}: loss {:.4}, grad norm {norm:.3}, lr {:.5}", loss.item()?, opt.lr(0)?);
                }
            }
        }
    }
    let train_acc = accuracy(&x, &y, &[&w1, &b1, &w2, &b2])?;
    println!("train accuracy {train_acc:.1}%");
    Ok(())
}

fn accuracy(x: &Tensor, y: &Tensor, p: &[&Tensor; 4]) -> Result<f64, Box<dyn std::error::Error>> {
    let _g = ferrite_tensor::no_grad();
    let pred = x.linear(p[0], Some(p[1]))?.tanh()?.linear(p[2], Some(p[3]))?.argmax(1, false)?;
    let hits = pred.eq(y)?.to_vec_bool()?.iter().filter(|b| **b).count();
    Ok(100.0 * hits as f64 / y.numel() as f64)
}
