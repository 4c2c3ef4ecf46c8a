//! Tensors, views, autograd and the allocator's view of them, in one run.
//!
//! `cargo run --release -p ferrite-tensor --example tensor_tour`

use ferrite_memory::allocator;
use ferrite_tensor::{DType, Device, Generator, Tensor, TensorError, no_grad};

fn main() -> Result<(), TensorError> {
    let cpu = Device::Cpu;
    let mut g = Generator::new(0);

    // Views share storage: transpose, narrow and unsqueeze copy nothing.
    let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &cpu)?.reshape(&[2, 3])?;
    let xt = x.t()?;
    println!("x.t() shape {:?}, contiguous: {}", xt.shape(), xt.is_contiguous());
    println!("row 1 of x: {:?}", x.narrow(0, 1, 1)?.to_vec::<f32>()?);

    // Broadcasting and autograd.
    let w = Tensor::randn_with(&[3, 4], DType::F32, &cpu, &mut g)?.requires_grad_(true)?;
    let b = Tensor::zeros(&[4], DType::F32, &cpu)?.requires_grad_(true)?;
    let y = x.matmul(&w)?.add(&b)?.relu()?; // [2,3] @ [3,4] + [4] -> [2,4]
    let loss = y.sum()?;
    loss.backward()?;
    println!("loss {:.4}; dloss/db {:?}", loss.item()?, b.grad().map(|g| g.to_vec::<f32>()).transpose()?);

    // Errors carry the values they are about (shapes, dtypes, devices); the message is built
    // from them.
    let square = Tensor::zeros(&[4, 4], DType::F32, &cpu)?;
    match x.matmul(&square) {
        Err(e @ TensorError::MatmulShapeMismatch { .. }) => println!("{e}"),
        other => println!("unexpected: {other:?}"),
    }

    // Modifying a tensor that backward still needs is an error naming the op, not a wrong gradient.
    let h = Tensor::randn_with(&[4], DType::F32, &cpu, &mut g)?.requires_grad_(true)?;
    let data = Tensor::randn_with(&[4], DType::F32, &cpu, &mut g)?;
    let prod = h.mul(&data)?; // saves `data` for h's gradient
    data.mul_scalar_(2.0)?;
    match prod.sum()?.backward() {
        Err(err) => println!("in-place on a saved tensor: {err}"),
        Ok(()) => println!("unexpected: backward succeeded"),
    }

    // The allocator is the truth about what tensors hold: the graph is gone once its last
    // tensor drops, and no_grad records nothing.
    let before = allocator(&cpu).memory_allocated();
    {
        let _guard = no_grad();
        let big = Tensor::randn_with(&[1024, 1024], DType::F32, &cpu, &mut g)?;
        let _z = big.matmul(&big)?;
        println!("inside no_grad: {} bytes allocated above baseline", allocator(&cpu).memory_allocated() - before);
    }
    println!("after the scope: {} bytes above baseline", allocator(&cpu).memory_allocated() - before);

    // `meta` computes shapes and makes the same allocations as a real run, without data.
    let meta = Device::parse("meta").map_err(TensorError::from)?;
    let a = Tensor::zeros(&[8192, 8192], DType::F16, &meta)?;
    let p = a.matmul(&a)?;
    println!(
        "meta: {:?} {} -> peak {} MiB, no memory touched",
        p.shape(),
        p.dtype(),
        allocator(&meta).max_memory_allocated() >> 20
    );

    // Out of memory on a simulated T4 is a typed error with the allocator's diagnosis.
    let t4 = Device::parse("sim:t4-16gb").map_err(TensorError::from)?;
    match Tensor::zeros(&[64, 1024, 1024, 1024], DType::F32, &t4) {
        Err(err) => println!("sim:t4-16gb: {}", err.to_string().lines().next().unwrap_or_default()),
        Ok(_) => println!("unexpected: 256 GiB fit on a T4"),
    }
    Ok(())
}
