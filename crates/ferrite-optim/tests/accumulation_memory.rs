//! Gradient accumulation measured by the allocator: 4 micro-batches of 8 need less peak device
//! memory than one batch of 32, and give the same gradients (within 1e-6).
//!
//! The model is a per-token MLP (`[batch, tokens, 64] -> 256 -> 256 -> 10`) built from raw
//! tensors, so activations (proportional to the batch) dominate parameters and gradients.

use ferrite_memory::allocator;
use ferrite_optim::Accumulator;
use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
use ferrite_tensor::{Device, Generator, Tensor};

const TOKENS: usize = 64;
const DIMS: [usize; 4] = [64, 256, 256, 10];

fn params(dev: &Device) -> Vec<Tensor> {
    let mut g = Generator::new(7);
    let mut ps = Vec::new();
    for w in DIMS.windows(2) {
        let (i, o) = (w[0], w[1]);
        let bound = 1.0 / (i as f64).sqrt();
        let wv: Vec<f32> = (0..o * i).map(|_| ((g.uniform_f64() * 2.0 - 1.0) * bound) as f32).collect();
        let bv: Vec<f32> = (0..o).map(|_| ((g.uniform_f64() * 2.0 - 1.0) * bound) as f32).collect();
        ps.push(Tensor::from_vec(wv, &[o, i], dev).unwrap().requires_grad_(true).unwrap());
        ps.push(Tensor::from_vec(bv, &[o], dev).unwrap().requires_grad_(true).unwrap());
    }
    ps
}

fn data(dev: &Device) -> (Tensor, Tensor) {
    let mut g = Generator::new(11);
    let x: Vec<f32> = (0..32 * TOKENS * DIMS[0]).map(|_| g.normal_f64() as f32).collect();
    let y: Vec<i64> = (0..32 * TOKENS).map(|_| g.below(DIMS[3] as u64) as i64).collect();
    (Tensor::from_vec(x, &[32, TOKENS, DIMS[0]], dev).unwrap(), Tensor::from_vec(y, &[32, TOKENS], dev).unwrap())
}

/// Mean cross-entropy over every token of the micro-batch.
fn loss(p: &[Tensor], x: &Tensor, y: &Tensor) -> Tensor {
    let mut h = x.clone();
    for (k, wb) in p.chunks(2).enumerate() {
        h = h.linear(&wb[0], Some(&wb[1])).unwrap();
        if k + 1 < p.len() / 2 {
            h = h.tanh().unwrap();
        }
    }
    let logits = h.reshape(&[-1, DIMS[3] as i64]).unwrap();
    cross_entropy(&logits, &y.reshape(&[-1]).unwrap(), &CrossEntropyOptions::default()).unwrap()
}

/// Gradients and peak allocated bytes of one optimizer step's backward work.
fn run(dev: &Device, micro_batches: usize) -> (Vec<Vec<f32>>, u64) {
    let p = params(dev);
    let (x, y) = data(dev);
    let alloc = allocator(dev);
    let before = alloc.memory_allocated();
    alloc.reset_peak_memory_stats();
    let acc = Accumulator::new(micro_batches).unwrap();
    let mut acc_counter = acc.clone();
    let per = 32 / micro_batches;
    let mut stepped = false;
    for m in 0..micro_batches {
        let xb = x.narrow(0, m * per, per).unwrap();
        let yb = y.narrow(0, m * per, per).unwrap();
        acc.scale_loss(&loss(&p, &xb, &yb)).unwrap().backward().unwrap();
        stepped = acc_counter.micro_step();
    }
    assert!(stepped, "the last micro-batch completes the accumulation");
    let peak = alloc.max_memory_allocated() - before;
    let grads = p.iter().map(|t| t.grad().unwrap().to_vec::<f32>().unwrap()).collect();
    (grads, peak)
}

#[test]
fn accumulating_4x8_uses_less_peak_memory_than_32_and_same_gradients() {
    let (g32, peak32) = run(&Device::parse("sim:1GiB:41").unwrap(), 1);
    let (g8, peak8) = run(&Device::parse("sim:1GiB:42").unwrap(), 4);
    let mut worst = 0.0f64;
    for (a, b) in g32.iter().zip(&g8) {
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((*x as f64 - *y as f64).abs());
        }
    }
    println!(
        "peak allocated during backward work: batch 32 = {peak32} B, 4 x 8 accumulated = {peak8} B ({:.1}% of 32); max |grad diff| {worst:.2e}",
        100.0 * peak8 as f64 / peak32 as f64
    );
    assert!(peak8 < peak32, "accumulation peak {peak8} B should be below the full batch's {peak32} B");
    assert!(worst <= 1e-6, "gradients differ by {worst:e}");
}
