//! A 784-256-10 MLP trained on a built-in dataset with ferrite-tensor's autograd and plain SGD,
//! batches from the DataLoader (tensor collation, background workers): the data side of what
//! `ferrite train --dataset ... --workers N` does, written out by hand; it shows the data side is
//! complete: `cargo run --release -p ferrite-data --example mlp_autograd -- fashion-mnist 5 2`
//! (arguments: dataset, epochs, workers; optional fourth: train subset size).
use ferrite_data::{Dataset, DatasetKind, Generator, Tensor, builtin_dataset};
use ferrite_memory::Device;
use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
use ferrite_tensor::{DType, no_grad};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let kind: DatasetKind = args.next().unwrap_or_else(|| "digits".into()).parse()?;
    let epochs: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let workers: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2);
    let subset: Option<usize> = args.next().map(|a| a.parse()).transpose()?;
    let splits = builtin_dataset(kind)?;
    let (features, classes, hidden) = (splits.train.num_features(), splits.train.num_classes(), 256);
    let train = splits.train.take(subset.unwrap_or(usize::MAX));
    let train_len = train.len();
    let cpu = Device::Cpu;

    // Kaiming-uniform-like init from a seeded generator.
    let mut g = Generator::new(0);
    let init = |rows: usize, cols: usize, g: &mut Generator| -> Result<Tensor, Box<dyn std::error::Error>> {
        let bound = 1.0 / (rows as f64).sqrt();
        Ok(Tensor::uniform_with(&[rows, cols], -bound, bound, DType::F32, &cpu, g)?.requires_grad_(true)?)
    };
    let w1 = init(features, hidden, &mut g)?;
    let b1 = Tensor::zeros(&[hidden], DType::F32, &cpu)?.requires_grad_(true)?;
    let w2 = init(hidden, classes, &mut g)?;
    let b2 = Tensor::zeros(&[classes], DType::F32, &cpu)?.requires_grad_(true)?;
    let params = [&w1, &b1, &w2, &b2];
    let forward = |x: &Tensor| -> Result<Tensor, Box<dyn std::error::Error>> {
        let x = x.flatten(1, -1)?;
        Ok(x.matmul(&w1)?.add(&b1)?.relu()?.matmul(&w2)?.add(&b2)?)
    };

    let mut loader = train.tensor_loader(64).shuffle(true).seed(1).num_workers(workers).build()?;
    let start = std::time::Instant::now();
    for epoch in 0..epochs {
        let lr = 0.1 * 0.7f64.powi(epoch as i32);
        let mut total = 0.0;
        let mut steps = 0;
        for batch in &mut loader {
            let (x, y) = batch?;
            let loss = cross_entropy(&forward(&x)?, &y, &CrossEntropyOptions::default())?;
            loss.backward()?;
            let _guard = no_grad();
            for p in params {
                if let Some(grad) = p.grad() {
                    p.add_scaled_(&grad, -lr)?;
                }
                p.set_grad(None)?;
            }
            total += loss.item()?;
            steps += 1;
        }
        println!("epoch {epoch}: mean loss {:.4}", total / steps as f64);
    }
    let mut test = splits.test.tensor_loader(500).num_workers(workers).build()?;
    let (mut correct, mut seen) = (0usize, 0usize);
    let _guard = no_grad();
    for batch in &mut test {
        let (x, y) = batch?;
        let pred = forward(&x)?.argmax(1, false)?.to_vec::<i64>()?;
        let y = y.to_vec::<i64>()?;
        correct += pred.iter().zip(&y).filter(|(p, t)| p == t).count();
        seen += y.len();
    }
    println!(
        "{kind}: MLP {features}-{hidden}-{classes}, {epochs} epochs on {train_len} samples, {workers} workers: test accuracy {:.2}% ({correct}/{seen}) in {:.1}s",
        100.0 * correct as f64 / seen as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
