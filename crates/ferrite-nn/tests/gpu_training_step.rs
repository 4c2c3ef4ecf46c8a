//! A transformer block's training step (forward, loss, backward) on every GPU adapter matches the
//! same step on the CPU: same initial weights from the same seed (random numbers are drawn by
//! ferrite's generator on every device), outputs and every parameter gradient within f32
//! tolerance (GPU sums accumulate in f32, the CPU's in f64). Skips loudly without an adapter.

use ferrite_nn::module::Module;
use ferrite_nn::{TransformerBlock, TransformerConfig};
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn step(device: &Device) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let config = TransformerConfig::new(32, 4).dim_feedforward(64).causal(true);
    let block = TransformerBlock::new_with(config, device, &mut Generator::new(3)).unwrap();
    let x = Tensor::randn_with(&[2, 7, 32], DType::F32, device, &mut Generator::new(4)).unwrap();
    let y = block.forward(&x).unwrap();
    let loss = y.mul(&y).unwrap().mean().unwrap();
    loss.backward().unwrap();
    let grads = block
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.grad().expect("every parameter gets a gradient").to_vec::<f32>().unwrap()))
        .collect();
    (y.to_vec::<f32>().unwrap(), grads)
}

#[test]
fn transformer_step_on_gpu_matches_cpu() {
    let gpus = ferrite_test_support::gpus_or_skip();
    if gpus.is_empty() {
        return;
    }
    let (want_y, want_g) = step(&Device::Cpu);
    for d in &gpus {
        let alloc = ferrite_memory::allocator(d);
        let before = alloc.memory_allocated();
        let (y, g) = step(d);
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 + 1e-4 * b.abs();
        for (i, (a, b)) in y.iter().zip(&want_y).enumerate() {
            assert!(close(*a, *b), "{d}: output {i}: {a} vs cpu {b}");
        }
        for ((n, ga), (_, gb)) in g.iter().zip(&want_g) {
            for (i, (a, b)) in ga.iter().zip(gb).enumerate() {
                assert!(close(*a, *b), "{d}: grad of {n}[{i}]: {a} vs cpu {b}");
            }
        }
        assert_eq!(alloc.memory_allocated(), before, "{d}: the step returns all of its memory");
        println!("transformer step on {d}: output and {} gradients match the cpu", g.len());
    }
}
