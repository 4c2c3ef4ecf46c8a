//! The README's data-loading example: digits with a random-shift augmentation, 2 workers.
//! `cargo run --release -p ferrite-data --example data_loading`
use ferrite_data::{builtin_dataset, DataLoader, Dataset, DatasetKind};

fn main() -> Result<(), ferrite_data::DataError> {
    let splits = builtin_dataset(DatasetKind::Digits)?; // embedded: 1,438 train / 359 test images
    let norm = splits.train.normalization();
    let blank = -norm.mean / norm.std; // a zero pixel after normalisation
    // Augmentation draws from the per-sample generator the loader passes in: a random
    // horizontal shift of -1, 0 or +1 pixels (8x8 images).
    let train = splits.train.map(move |mut ex, rng| {
        let shift = rng.below(3) as isize - 1;
        let src = ex.pixels.clone();
        for (i, p) in ex.pixels.iter_mut().enumerate() {
            let (row, col) = (i / 8, (i % 8) as isize - shift);
            *p = if (0..8).contains(&col) { src[row * 8 + col as usize] } else { blank };
        }
        Ok(ex)
    });
    let mut loader = DataLoader::builder(train).batch_size(64).shuffle(true).seed(0).num_workers(2).build()?;
    for epoch in 0..2 {
        let mut n = 0;
        for batch in &mut loader {
            n += batch?.len(); // Vec<ImageExample>: 64 normalised images and labels
        }
        println!("epoch {epoch}: {n} samples in {} batches", loader.len());
    }
    Ok(())
}
