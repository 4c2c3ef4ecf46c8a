//! Writes Fashion-MNIST (Debian's dataset-fashion-mnist) as an image folder in torchvision's
//! `ImageFolder` layout — `OUT/train/<class>/*.png` and `OUT/val/<class>/*.png` — so that
//! `ferrite train --data OUT` can be tried, and its README figures re-run, on real images.
//!
//! `cargo run --release -p ferrite-data --example fashion_mnist_folder -- OUT [TRAIN_PER_CLASS [VAL_PER_CLASS]]`
//! (defaults 500 and 100): the first images of each class in the training file, in file order.

use std::path::PathBuf;

use ferrite_data::{Dataset, Split, fashion_mnist};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().ok_or("usage: fashion_mnist_folder OUT [TRAIN_PER_CLASS [VAL_PER_CLASS]]")?);
    let train_per_class: usize = args.next().map_or(Ok(500), |a| a.parse())?;
    let val_per_class: usize = args.next().map_or(Ok(100), |a| a.parse())?;
    let data = fashion_mnist::load(Split::Train)?;
    let [_, h, w] = data.sample_shape();
    // Folder names: the class names without `/` and spaces ("T-shirt/top" -> "t-shirt-top").
    let names: Vec<String> =
        fashion_mnist::CLASS_NAMES.iter().map(|n| n.to_lowercase().replace(['/', ' '], "-")).collect();
    let mut written = vec![0usize; names.len()];
    for i in 0..data.len() {
        let (Some(label), Some(pixels)) = (data.label(i), data.raw_image(i)) else { continue };
        let k = written[label];
        if k >= train_per_class + val_per_class {
            continue;
        }
        let split = if k < train_per_class { "train" } else { "val" };
        let dir = out.join(split).join(&names[label]);
        std::fs::create_dir_all(&dir)?;
        let image = image::GrayImage::from_raw(w as u32, h as u32, pixels.to_vec()).ok_or("image size")?;
        image.save(dir.join(format!("{i:05}.png")))?;
        written[label] += 1;
    }
    println!(
        "wrote {} PNGs of {} classes to {} (train/: {train_per_class} per class, val/: {val_per_class} per class)",
        written.iter().sum::<usize>(),
        names.len(),
        out.display()
    );
    Ok(())
}
