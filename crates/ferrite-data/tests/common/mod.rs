//! What several of ferrite-data's integration tests load: one shuffled epoch of the digits
//! dataset, collated into tensors and staged onto a device by the loader's workers.

use ferrite_data::{DataLoader, DatasetKind, builtin_dataset};
use ferrite_memory::Device;

/// The first `samples` training digits in batches of `batch_size` (shuffled with `seed`), staged
/// to `device` by `workers` workers, as host vectors `(pixels, labels)` per batch. Checks that
/// every batch arrived on `device` with the image shape `[n, 1, 8, 8]`.
pub fn staged_digits_epoch(
    samples: usize,
    batch_size: usize,
    seed: u64,
    workers: usize,
    device: &Device,
) -> Vec<(Vec<f32>, Vec<i64>)> {
    let splits = builtin_dataset(DatasetKind::Digits).unwrap();
    let train = ferrite_data::Subset::first(splits.train, samples);
    let mut loader = DataLoader::builder(train)
        .batch_size(batch_size)
        .shuffle(true)
        .seed(seed)
        .num_workers(workers)
        .collate(ferrite_data::Tensors(ferrite_data::ImageCollate::new([1, 8, 8])))
        .stage_to(device.clone())
        .build()
        .unwrap();
    loader
        .epoch()
        .map(|b| {
            let (x, y) = b.unwrap();
            assert_eq!(x.device(), device);
            assert_eq!(y.device(), device);
            assert_eq!(&x.shape()[1..], &[1, 8, 8]);
            assert_eq!(x.shape()[0], y.shape()[0]);
            (x.to_vec::<f32>().unwrap(), y.to_vec::<i64>().unwrap())
        })
        .collect()
}
