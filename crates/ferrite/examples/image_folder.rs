//! An image classifier from a folder of your own images, trained by ferrite's `Trainer`:
//! `cargo run --release --example image_folder [-- FOLDER] [--epochs N] [--data-parallel N]`.
//!
//! FOLDER is laid out as torchvision's `ImageFolder`: one subfolder per class holding PNG, JPEG
//! or BMP files (or `train/` and `val/` folders of those). Without one, the example writes the
//! built-in digits (8×8 greyscale) as such a folder under the temporary directory first, so it
//! runs anywhere. Images are resized to 16×16 and a fifth of each class is held out
//! (stratified, seeded); the class names come from the folder names. With `--data-parallel N`
//! the same run trains on N simulated A100s (DataParallel by a setting: one line).
use std::path::PathBuf;

use ferrite::data::{ImageFolderOptions, Split, digits, load_image_folder};
use ferrite::memory::select_devices;
use ferrite::models::{CnnSpec, build_cnn};
use ferrite::parallel::OwnerPolicy;
use ferrite::prelude::*;

fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

fn number(name: &'static str, default: usize) -> Result<usize, TrainError> {
    flag(name).map_or(Ok(default), |n| {
        n.parse::<usize>().ok().filter(|&v| v >= 1).ok_or(TrainError::InvalidArgument {
            flag: name.trim_start_matches("--"),
            value: n,
            expected: "a whole number of at least 1",
        })
    })
}

/// The built-in digits as an image folder: `ROOT/<digit>/<index>.png`.
fn write_digits_folder(root: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let data = digits::load(Split::Train)?;
    let [_, h, w] = data.sample_shape();
    for i in 0..data.len() {
        let (Some(label), Some(pixels)) = (data.label(i), data.raw_image(i)) else { continue };
        let dir = root.join(format!("digit-{label}"));
        std::fs::create_dir_all(&dir)?;
        let image = image::GrayImage::from_raw(w as u32, h as u32, pixels.to_vec()).ok_or("an image of the digits")?;
        image.save(dir.join(format!("{i:04}.png")))?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let epochs = number("--epochs", 10)?;
    let replicas = flag("--data-parallel").map(|_| number("--data-parallel", 2)).transpose()?;
    let folder = match std::env::args().nth(1).filter(|a| !a.starts_with("--")) {
        Some(path) => PathBuf::from(path),
        None => {
            let root = std::env::temp_dir().join("ferrite-digits-folder");
            if !root.exists() {
                write_digits_folder(&root)?;
            }
            root
        }
    };

    // Decoding, resizing, the held-out split and normalisation (training statistics) happen here;
    // a corrupt file is an error naming it (or skipped, with `skip_bad_files`).
    let options = ImageFolderOptions { image_size: Some(16), val_split: 0.2, seed: 0, skip_bad_files: false };
    let images = load_image_folder(&folder, &options)?;
    let classes = images.classes().to_vec();
    let shape = images.train.sample_shape();
    println!(
        "{}: {} classes ({}), {} training / {} held-out images of {}x{}x{}",
        folder.display(),
        classes.len(),
        classes.join(", "),
        images.train.len(),
        images.val.len(),
        shape[0],
        shape[1],
        shape[2]
    );
    let mut train = images.train.tensor_loader(64).shuffle(true).seed(0).build()?;
    let mut val = images.val.tensor_loader(256).build()?;

    let spec = CnnSpec { input: shape, hidden: 16, layers: 2, classes: classes.len(), checkpoint_activations: false };
    let model = build_cnn(&spec, &Device::Cpu, &mut Generator::new(0))?;
    let mut builder = Trainer::builder_with(model, |params| Adam::new(params, AdamConfig::adamw(3e-3)));
    if let Some(n) = replicas {
        let gpus = select_devices(
            &Device::parse("sim:a100-40gb")?,
            Some(&(0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",")),
        )?;
        builder = builder.data_parallel(&gpus, OwnerPolicy::Sharded);
    }
    let mut trainer = builder
        .epochs(epochs)
        .evaluate(|m| {
            // On the model's device (under DataParallel, the first replica's), no graph.
            let device = m.parameters().first().map(|p| p.device().clone()).unwrap_or(Device::Cpu);
            let (mut hits, mut seen) = (0usize, 0usize);
            m.train(false);
            for batch in val.epoch() {
                let (x, y) = batch?;
                let pred = {
                    let _g = no_grad();
                    m.forward(&x.to_device(&device)?)?.argmax(1, false)?.to_vec::<i64>()?
                };
                hits += pred.iter().zip(y.to_vec::<i64>()?).filter(|(p, t)| **p == *t).count();
                seen += pred.len();
            }
            m.train(true);
            Ok(Metrics::new().with("accuracy", hits as f64 / seen.max(1) as f64))
        })
        .on_epoch(|e| {
            println!(
                "epoch {:>3}/{}  loss {:.4}  held-out acc {:5.2}%  | {}",
                e.epoch,
                e.epochs,
                e.mean_loss,
                100.0 * e.eval.get("accuracy").unwrap_or(f64::NAN),
                e.memory_line
            )
        })
        .build()?;
    let loss_fn = CrossEntropyLoss::new();
    let report = trainer.fit(&mut train, |m: &ferrite::models::Cnn, (x, y): &(Tensor, Tensor)| {
        Ok(StepOutput::new(loss_fn.forward(&m.forward(x)?, y)?, y.numel()))
    })?;
    let last = report.epochs.last().and_then(|e| e.eval.get("accuracy")).unwrap_or(f64::NAN);
    println!(
        "held-out accuracy {:.2}% after {} epochs ({} steps, {:.1}s)",
        100.0 * last,
        report.epochs.len(),
        report.steps,
        report.elapsed.as_secs_f64()
    );
    Ok(())
}
