//! A checkpointed region runs twice; a batch norm inside it must update its running statistics
//! once, as an uncheckpointed run does, and produce the same gradients.

use ferrite_nn::{BatchNorm2d, Conv2d, Conv2dConfig, Module, ReLU, Sequential, checkpoint_with_params, is_recomputing};
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn block(g: &mut Generator) -> Sequential {
    Sequential::new()
        .append(Conv2d::new_with(Conv2dConfig::new(2, 4, 3).padding(1), &Device::Cpu, g).unwrap())
        .append(BatchNorm2d::new(4).unwrap())
        .append(ReLU::new())
}

fn run(checkpointed: bool) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let b = block(&mut Generator::new(7));
    let x = Tensor::randn_with(&[3, 2, 5, 5], DType::F32, &Device::Cpu, &mut Generator::new(8)).unwrap();
    for _ in 0..2 {
        let y = if checkpointed {
            let region = b.clone();
            let params = b.parameters();
            checkpoint_with_params(move |xs| region.forward(&xs[0]), &[&x], &params).unwrap()
        } else {
            b.forward(&x).unwrap()
        };
        y.square().unwrap().sum().unwrap().backward().unwrap();
    }
    let buffers =
        b.named_buffers().iter().map(|(_, t)| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()).collect();
    let grads = b.parameters().iter().map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()).collect();
    (buffers, grads)
}

#[test]
fn running_statistics_update_once_per_forward() {
    assert!(!is_recomputing());
    let (plain_buffers, plain_grads) = run(false);
    let (ckpt_buffers, ckpt_grads) = run(true);
    assert_eq!(plain_buffers, ckpt_buffers, "running_mean, running_var, num_batches_tracked");
    assert_eq!(plain_buffers[2], vec![2.0], "two training forwards counted once each");
    assert_eq!(plain_grads, ckpt_grads);
    assert!(!is_recomputing(), "the flag is reset after backward");
}
