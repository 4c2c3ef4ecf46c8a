//! The README's data-loading example (keep the two in sync).
//! `cargo run --release -p ferrite-data --example data_loading`
use ferrite_data::{builtin_dataset, DataLoader, Dataset, DatasetKind};

fn main() -> Result<(), ferrite_data::DataError> {
    let splits = builtin_dataset(DatasetKind::Digits)?; // embedded: 1,438 train / 359 test
    let train = splits.train.map(|mut ex, rng| {
        // Gaussian-noise augmentation drawn from this sample's own generator.
        ex.pixels.iter_mut().for_each(|p| *p += 0.1 * rng.normal_f64() as f32);
        Ok(ex)
    });
    let mut loader = DataLoader::builder(train).batch_size(64).shuffle(true).seed(0).num_workers(2).build()?;
    for epoch in 0..2 {
        let mut seen = 0;
        for batch in &mut loader {
            seen += batch?.len(); // Vec<ImageExample>: normalised pixels + label
        }
        println!("epoch {epoch}: {seen} samples in {} batches", loader.len());
    }
    Ok(())
}
