//! The public extension point for ops with hand-written backward, used from outside the crate the
//! way `ferrite-nn` uses it: a custom op with a saved tensor (and its version check), a
//! multi-output op where one output receives no gradient, and an activation-checkpointing node
//! that recomputes a closure in backward and gives bit-identical gradients.

use std::borrow::Cow;

use ferrite_tensor::autograd::{self, enable_grad, no_grad};
use ferrite_tensor::{BackwardFn, DType, Device, Generator, Result, SavedTensor, Tensor, TensorError};

fn dev(i: usize) -> Device {
    Device::parse(&format!("sim:1GiB:{}", 40 + i)).unwrap()
}

/// y = x³ with a hand-written backward 3x²·g.
struct CubeBackward {
    x: SavedTensor,
}
impl BackwardFn for CubeBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("CubeBackward")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let x = self.x.get(self.name())?;
        Ok(vec![Some(g.mul(&x.square()?.mul_scalar(3.0)?)?)])
    }
}

fn cube(x: &Tensor) -> Result<Tensor> {
    let out = {
        let _g = no_grad();
        x.mul(x)?.mul(x)?
    };
    if !Tensor::needs_graph(&[x]) {
        return Ok(out);
    }
    Ok(Tensor::from_op1(out, &[x], CubeBackward { x: SavedTensor::new(x) }))
}

#[test]
fn custom_op_backward_and_saved_tensor_version_check() {
    let d = dev(0);
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 0.5], &[3], &d).unwrap().requires_grad_(true).unwrap();
    let y = cube(&x).unwrap();
    assert_eq!(y.grad_fn().unwrap().name(), "CubeBackward");
    y.sum().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![3.0, 12.0, 0.75]);

    // No input requires grad: no node is recorded.
    let c = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], &d).unwrap();
    assert!(cube(&c).unwrap().grad_fn().is_none());

    // The custom op's saved input modified in place before backward.
    let w = Tensor::ones(&[3], DType::F32, &d).unwrap().requires_grad_(true).unwrap();
    let z = cube(&w).unwrap();
    {
        let _g = no_grad();
        w.add_scalar_(1.0).unwrap(); // w saved by CubeBackward at version 0
    }
    let err = z.sum().unwrap().backward().unwrap_err();
    match err {
        TensorError::ModifiedByInplace { op, saved, current, .. } => {
            assert_eq!(op, "CubeBackward");
            assert_eq!((saved, current), (0, 1));
        }
        other => panic!("expected ModifiedByInplace, got {other}"),
    }
}

/// (2x, 3x) as one node with two outputs.
struct TwoOutBackward;
impl BackwardFn for TwoOutBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("TwoOutBackward")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        assert_eq!(g.len(), 2);
        let mut total: Option<Tensor> = None;
        for (gi, k) in g.iter().zip([2.0, 3.0]) {
            if let Some(gi) = gi {
                let t = gi.mul_scalar(k)?;
                total = Some(match total {
                    None => t,
                    Some(a) => a.add(&t)?,
                });
            }
        }
        Ok(vec![total])
    }
}

#[test]
fn multi_output_op_with_an_output_that_gets_no_gradient() {
    let d = dev(1);
    let x = Tensor::from_vec(vec![1.0f64, 2.0], &[2], &d).unwrap().requires_grad_(true).unwrap();
    let (a, b) = {
        let _g = no_grad();
        (x.mul_scalar(2.0).unwrap(), x.mul_scalar(3.0).unwrap())
    };
    let outs = Tensor::from_op(vec![a, b], &[&x], Box::new(TwoOutBackward));
    assert_eq!(outs.len(), 2);
    // Only the second output is used: the first receives None.
    outs[1].sum().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![3.0, 3.0]);
    x.set_grad(None).unwrap();
    // Both used: gradients from both outputs arrive in one call.
    let outs = {
        let (a, b) = {
            let _g = no_grad();
            (x.mul_scalar(2.0).unwrap(), x.mul_scalar(3.0).unwrap())
        };
        Tensor::from_op(vec![a, b], &[&x], Box::new(TwoOutBackward))
    };
    outs[0].add(&outs[1]).unwrap().sum().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![5.0, 5.0]);
}

/// Activation checkpointing: forward runs `f` without a graph; backward recomputes it with a
/// graph on detached inputs and back-propagates through the recomputation. Parameters captured
/// by `f` accumulate their gradients directly (PyTorch's reentrant checkpoint).
struct Checkpoint<F: Fn(&Tensor) -> Result<Tensor> + Send> {
    f: F,
    input: SavedTensor,
}
impl<F: Fn(&Tensor) -> Result<Tensor> + Send> BackwardFn for Checkpoint<F> {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("CheckpointFunctionBackward")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let x = self.input.get("CheckpointFunctionBackward")?.detach().requires_grad_(true)?;
        let y = {
            let _g = enable_grad();
            (self.f)(&x)?
        };
        autograd::backward(&[(y, g.clone())], false)?;
        Ok(vec![x.grad()])
    }
}

fn checkpoint<F: Fn(&Tensor) -> Result<Tensor> + Send + 'static>(x: &Tensor, f: F) -> Result<Tensor> {
    let y = {
        let _g = no_grad();
        f(x)?
    };
    Ok(Tensor::from_op1(y, &[x], Checkpoint { f, input: SavedTensor::new(x) }))
}

#[test]
fn checkpointed_block_gives_bit_identical_gradients_and_keeps_no_activations() {
    let d = dev(2);
    let mut g = Generator::new(7);
    let w1 = Tensor::randn_with(&[32, 64], DType::F32, &d, &mut g).unwrap().requires_grad_(true).unwrap();
    let w2 = Tensor::randn_with(&[64, 32], DType::F32, &d, &mut g).unwrap().requires_grad_(true).unwrap();
    let x = Tensor::randn_with(&[16, 32], DType::F32, &d, &mut g).unwrap().requires_grad_(true).unwrap();
    let block = {
        let (w1, w2) = (w1.clone(), w2.clone());
        move |h: &Tensor| h.matmul(&w1)?.gelu()?.matmul(&w2)?.tanh()
    };
    // Plain run.
    let y = block(&x).unwrap().sum().unwrap();
    y.backward().unwrap();
    let plain: Vec<Vec<f32>> = [&x, &w1, &w2].iter().map(|t| t.grad().unwrap().to_vec::<f32>().unwrap()).collect();
    for t in [&x, &w1, &w2] {
        t.set_grad(None).unwrap();
    }
    // Checkpointed run: the graph between x and the block output holds no activations.
    let alloc = ferrite_memory::allocator(&d);
    let before = alloc.memory_allocated();
    let out = checkpoint(&x, block.clone()).unwrap();
    let held = alloc.memory_allocated() - before;
    assert_eq!(held, (16 * 32 * 4) as u64, "only the block output is alive, no activations");
    out.sum().unwrap().backward().unwrap();
    let ck: Vec<Vec<f32>> = [&x, &w1, &w2].iter().map(|t| t.grad().unwrap().to_vec::<f32>().unwrap()).collect();
    assert_eq!(plain, ck, "recomputed gradients are bit-identical");
}
