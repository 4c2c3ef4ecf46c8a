//! Sanity check of a built-in dataset end to end: a softmax-regression classifier trained with
//! plain SGD on batches from the loader. If images and labels were misaligned or badly
//! normalised, test accuracy would sit near chance (10 %).
//! `cargo run --release -p ferrite-data --example linear_probe -- fashion-mnist 3 2`
//! (arguments: dataset, epochs, workers).
use ferrite_data::{DataError, DatasetKind, ImageBatch, builtin_dataset};

fn main() -> Result<(), DataError> {
    let mut args = std::env::args().skip(1);
    let kind: DatasetKind = args.next().unwrap_or_else(|| "digits".into()).parse()?;
    let epochs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let workers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let splits = builtin_dataset(kind)?;
    let (f, k) = (splits.train.num_features(), splits.train.num_classes());
    let mut w = vec![0.0f32; f * k];
    let mut b = vec![0.0f32; k];
    let mut train = splits.train.loader(64).shuffle(true).seed(0).num_workers(workers).build()?;
    let start = std::time::Instant::now();
    for epoch in 0..epochs {
        let lr = 0.05 / (1.0 + epoch as f32);
        for batch in &mut train {
            sgd_step(&batch?, &mut w, &mut b, f, k, lr);
        }
    }
    let mut test = splits.test.loader(256).num_workers(workers).build()?;
    let (mut correct, mut total) = (0usize, 0usize);
    for batch in &mut test {
        let batch = batch?;
        for (i, &label) in batch.labels.iter().enumerate() {
            let logits = logits(&batch.pixels[i * f..(i + 1) * f], &w, &b, k);
            let pred = (0..k).max_by(|&x, &y| logits[x].total_cmp(&logits[y])).unwrap_or(0);
            correct += usize::from(pred == label);
            total += 1;
        }
    }
    println!(
        "{kind}: softmax regression, {epochs} epochs, {workers} workers: test accuracy {:.2}% ({correct}/{total}) in {:.1}s",
        100.0 * correct as f64 / total as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn logits(x: &[f32], w: &[f32], b: &[f32], k: usize) -> Vec<f32> {
    let mut z = b.to_vec();
    for (j, &xj) in x.iter().enumerate() {
        let row = &w[j * k..(j + 1) * k];
        z.iter_mut().zip(row).for_each(|(zc, wc)| *zc += xj * wc);
    }
    z
}

fn sgd_step(batch: &ImageBatch, w: &mut [f32], b: &mut [f32], f: usize, k: usize, lr: f32) {
    let n = batch.len() as f32;
    let mut gw = vec![0.0f32; f * k];
    let mut gb = vec![0.0f32; k];
    for (i, &label) in batch.labels.iter().enumerate() {
        let x = &batch.pixels[i * f..(i + 1) * f];
        let mut p = logits(x, w, b, k);
        let max = p.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        p.iter_mut().for_each(|v| *v = (*v - max).exp());
        let sum: f32 = p.iter().sum();
        p.iter_mut().for_each(|v| *v /= sum);
        p[label] -= 1.0;
        for (j, &xj) in x.iter().enumerate() {
            gw[j * k..(j + 1) * k].iter_mut().zip(&p).for_each(|(g, pc)| *g += xj * pc);
        }
        gb.iter_mut().zip(&p).for_each(|(g, pc)| *g += pc);
    }
    w.iter_mut().zip(&gw).for_each(|(wv, g)| *wv -= lr * g / n);
    b.iter_mut().zip(&gb).for_each(|(bv, g)| *bv -= lr * g / n);
}
