//! Activation checkpointing semantics beyond memory: RNG replay for every kind of generator
//! handle, autocast replay, nesting, retain_graph, multiple outputs, grad mode off, and
//! mutating a checkpointed module while a graph still needs it.
//!
//! Only `dropout_on_the_default_generator_replays_and_leaves_the_stream_in_place` may touch the
//! process default generator in this binary (tests run in parallel threads).

mod common;

use common::assert_bits_equal;
use ferrite_nn::{
    Checkpointed, Dropout, Linear, MSELoss, Module, ReLU, RngHandle, Sequential, Tanh, autocast, checkpoint,
    checkpoint_multi,
};
use ferrite_tensor::random::{default_generator_state, manual_seed};
use ferrite_tensor::{DType, Device, Generator, Tensor, no_grad};

fn block(g: &mut Generator, dropout: Option<RngHandle>) -> Sequential {
    let d = Device::Cpu;
    let mut s = Sequential::new()
        .append(Linear::new_with(16, 32, true, &d, g).unwrap())
        .append(ReLU::new())
        .append(Linear::new_with(32, 16, true, &d, g).unwrap());
    if let Some(r) = dropout {
        s.push(Dropout::with_rng(0.3, r).unwrap());
    }
    s.push(Tanh::new());
    s
}

fn input(seed: u64) -> Tensor {
    Tensor::randn_with(&[8, 16], DType::F32, &Device::Cpu, &mut Generator::new(seed))
        .unwrap()
        .requires_grad_(true)
        .unwrap()
}

fn loss_of(y: &Tensor) -> Tensor {
    MSELoss::new().forward(y, &y.zeros_like().unwrap()).unwrap()
}

fn grads(m: &dyn Module) -> Vec<Tensor> {
    m.parameters().iter().map(|p| p.grad().expect("parameter has a gradient")).collect()
}

fn assert_same_grads(a: &[Tensor], b: &[Tensor]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_bits_equal(&format!("param grad {i}"), x, y);
    }
}

#[test]
fn dropout_on_the_default_generator_replays_and_leaves_the_stream_in_place() {
    let m = block(&mut Generator::new(1), Some(RngHandle::default_generator()));
    let x = input(2);
    manual_seed(123);
    loss_of(&m.forward(&x).unwrap()).backward().unwrap();
    let (gp, gx) = (grads(&m), x.grad().unwrap());
    let after_plain = default_generator_state();
    m.zero_grad().unwrap();
    x.set_grad(None).unwrap();

    manual_seed(123);
    let mc = m.clone();
    let y = checkpoint(move |xs| mc.forward(&xs[0]), &[&x]).unwrap();
    let after_forward = default_generator_state();
    assert_eq!(after_forward, after_plain, "the checkpointed forward draws exactly what the plain one draws");
    loss_of(&y).backward().unwrap();
    assert_eq!(
        default_generator_state(),
        after_forward,
        "recomputation replays the masks without advancing the stream"
    );
    assert_same_grads(&gp, &grads(&m));
    assert_bits_equal("input grad", &gx, &x.grad().unwrap());
}

#[test]
fn autocast_state_is_replayed_in_recomputation() {
    let m = block(&mut Generator::new(3), Some(RngHandle::new(9)));
    let x = input(4);
    let reference = {
        let m = block(&mut Generator::new(3), Some(RngHandle::new(9)));
        let loss = {
            let _ac = autocast(DType::BF16).unwrap();
            loss_of(&m.forward(&x).unwrap())
        };
        loss.backward().unwrap();
        (grads(&m), x.grad().unwrap())
    };
    x.set_grad(None).unwrap();
    let loss = {
        let _ac = autocast(DType::BF16).unwrap();
        let mc = m.clone();
        let y = checkpoint(move |xs| mc.forward(&xs[0]), &[&x]).unwrap();
        assert_eq!(y.dtype(), DType::BF16);
        loss_of(&y)
    };
    // Backward runs outside autocast; the recomputation must still run in bf16.
    loss.backward().unwrap();
    assert_same_grads(&reference.0, &grads(&m));
    assert_bits_equal("input grad", &reference.1, &x.grad().unwrap());
}

#[test]
fn nested_checkpoints_and_retain_graph_give_the_plain_gradients() {
    let mut g = Generator::new(5);
    let (a, b) = (block(&mut g, Some(RngHandle::new(1))), block(&mut g, Some(RngHandle::new(2))));
    let x = input(6);
    let plain = {
        // The same two blocks rebuilt from the same generator sequence, run without checkpoints.
        let mut g = Generator::new(5);
        let (a2, b2) = (block(&mut g, Some(RngHandle::new(1))), block(&mut g, Some(RngHandle::new(2))));
        let loss = loss_of(&b2.forward(&a2.forward(&x).unwrap()).unwrap());
        loss.backward_retain().unwrap();
        loss.backward().unwrap();
        let mut v = grads(&a2);
        v.extend(grads(&b2));
        (v, x.grad().unwrap())
    };
    x.set_grad(None).unwrap();
    // Outer closure checkpoint around an inner Checkpointed module.
    let inner = Checkpointed::new(b.clone());
    let ac = a.clone();
    let y = checkpoint(move |xs| inner.forward(&ac.forward(&xs[0])?), &[&x]).unwrap();
    let loss = loss_of(&y);
    loss.backward_retain().unwrap();
    loss.backward().unwrap();
    let mut got = grads(&a);
    got.extend(grads(&b));
    assert_same_grads(&plain.0, &got);
    assert_bits_equal("input grad", &plain.1, &x.grad().unwrap());
}

#[test]
fn multiple_outputs_partial_use_and_no_grad() {
    let w = Tensor::randn_with(&[16, 16], DType::F32, &Device::Cpu, &mut Generator::new(7))
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let x = input(8);
    let wc = w.clone();
    let outs = checkpoint_multi(move |xs| Ok(vec![xs[0].matmul(&wc)?.tanh()?, xs[0].sum()?]), &[&x]).unwrap();
    assert_eq!(outs.len(), 2);
    // Only the first output feeds the loss.
    outs[0].sum().unwrap().backward().unwrap();
    let (gw, gx) = (w.grad().unwrap(), x.grad().unwrap());
    w.set_grad(None).unwrap();
    x.set_grad(None).unwrap();
    x.matmul(&w).unwrap().tanh().unwrap().sum().unwrap().backward().unwrap();
    assert_bits_equal("w grad", &gw, &w.grad().unwrap());
    assert_bits_equal("x grad", &gx, &x.grad().unwrap());
    // Grad mode off: the region simply runs, nothing is recorded.
    let _g = no_grad();
    let wc = w.clone();
    let y = checkpoint(move |xs| Ok(xs[0].matmul(&wc)?), &[&x]).unwrap();
    assert!(!y.requires_grad());
}

#[test]
fn data_input_still_gives_parameter_gradients() {
    let m = block(&mut Generator::new(10), None);
    let x = input(11).detach(); // the data batch: no grad
    loss_of(&m.forward(&x).unwrap()).backward().unwrap();
    let plain = grads(&m);
    m.zero_grad().unwrap();
    // Closure form: falls back to a plain run (documented) — gradients still correct.
    let mc = m.clone();
    loss_of(&checkpoint(move |xs| mc.forward(&xs[0]), &[&x]).unwrap()).backward().unwrap();
    assert_same_grads(&plain, &grads(&m));
    m.zero_grad().unwrap();
    // Module form: recorded through the parameters, recomputed in backward.
    let c = Checkpointed::new(m.clone());
    let y = c.forward(&x).unwrap();
    assert_eq!(y.grad_fn().unwrap().name(), "CheckpointFunctionBackward");
    loss_of(&y).backward().unwrap();
    assert_same_grads(&plain, &grads(&m));
}

#[test]
fn mutating_a_checkpointed_module_while_its_graph_lives_keeps_the_recorded_version() {
    let mut c = Checkpointed::new(block(&mut Generator::new(12), Some(RngHandle::new(3))));
    let x = input(13);
    let y = c.forward(&x).unwrap(); // recorded in train mode (dropout on)
    c.eval(); // copy-on-write: the graph keeps the train-mode module
    assert!(!c.is_training());
    loss_of(&y).backward().unwrap();
    let with_ckpt = grads(c.inner());
    let plain = {
        let m = block(&mut Generator::new(12), Some(RngHandle::new(3)));
        loss_of(&m.forward(&x.detach()).unwrap()).backward().unwrap();
        grads(&m)
    };
    assert_same_grads(&plain, &with_ckpt);
}
