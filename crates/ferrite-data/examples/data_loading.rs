//! The README's data-loading example (keep the two in sync).
//! `cargo run --release -p ferrite-data --example data_loading`
use ferrite_data::{DataLoader, Dataset, DatasetKind, ImageCollate, Tensors, builtin_dataset};
use ferrite_memory::Device;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let splits = builtin_dataset(DatasetKind::Digits)?; // embedded: 1,442 train / 355 test
    let shape = splits.train.sample_shape(); // [1, 8, 8]
    let train = splits.train.map(|mut ex, rng| {
        // Gaussian-noise augmentation drawn from this sample's own generator.
        ex.pixels.iter_mut().for_each(|p| *p += 0.1 * rng.normal_f64() as f32);
        Ok(ex)
    });
    let device = Device::parse("sim:t4-16gb")?; // a simulated 16 GB GPU
    let mut loader = DataLoader::builder(train)
        .batch_size(64)
        .shuffle(true)
        .seed(0)
        .num_workers(2)
        .collate(Tensors(ImageCollate::new(shape))) // (f32 [64, 1, 8, 8], i64 [64])
        .stage_to(device.clone()) // moved to the device by the workers
        .build()?;
    for epoch in 0..2 {
        let mut seen = 0;
        for batch in &mut loader {
            let (images, labels) = batch?;
            assert_eq!(images.device(), &device);
            seen += labels.shape()[0];
        }
        println!("epoch {epoch}: {seen} samples in {} batches", loader.len());
    }
    Ok(())
}
