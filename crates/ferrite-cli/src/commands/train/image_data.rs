//! What the image models (`--model mlp|cnn`) train and evaluate on: a built-in dataset
//! (`--dataset digits|fashion-mnist`), or the user's own data (`--data`): an image folder in
//! torchvision's `ImageFolder` layout, or a CSV table for the MLP.
//!
//! Why one shape for all three: the training loop (`image.rs`) should not care where the samples
//! come from. Each source becomes a training and a held-out dataset of `ImageExample`s of one
//! shape, plus what the run prints about it, what a resume must not change, and what the weights
//! file carries so the model can be used later (class names; the normalisation or the features'
//! standardisation). The built-in datasets keep their output and weights files exactly as before.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ferrite_data::{
    Augment, CsvOptions, DataError, Dataset, DatasetKind, FolderLayout, ImageClassification, ImageExample,
    ImageFolderOptions, builtin_dataset, load_csv, load_image_folder,
};

use super::{TrainArgs, TrainError};

/// A dataset of image-shaped samples, shared by the loader's workers.
pub type Samples = Arc<dyn Dataset<Sample = ImageExample>>;

/// Training and held-out data for an image model, and what is said and saved about it.
pub struct ImageData {
    /// The data's name in the log, the metrics, the resume settings and the default weights file.
    pub name: String,
    pub train: Samples,
    /// The split the per-epoch "test acc" is measured on (a built-in test set, `val/`, or the
    /// held-out share).
    pub test: Samples,
    /// `[channels, height, width]` of a sample (`[1, 1, features]` for a table row).
    pub sample_shape: [usize; 3],
    pub classes: usize,
    /// Rows, not images: only the MLP can train on them.
    pub tabular: bool,
    /// Epochs when `--epochs` is not given.
    pub default_epochs: usize,
    /// Lines printed under the run's first line.
    pub notes: Vec<String>,
    /// What a resume must not change besides the common settings.
    pub settings: Vec<(String, String)>,
    /// Strings for the weights file's safetensors metadata (none for the built-in datasets).
    pub metadata: BTreeMap<String, String>,
}

/// Epochs for the user's own data when `--epochs` is not given.
const OWN_DATA_EPOCHS: usize = 10;

/// The data the flags name: `--data`, else `--dataset` (digits by default).
pub fn load(args: &TrainArgs) -> Result<ImageData, TrainError> {
    match &args.data {
        Some(path) => match std::fs::metadata(path) {
            Err(source) => Err(DataError::Io { path: path.clone(), source }.into()),
            Ok(m) if m.is_dir() => folder(args, path),
            Ok(_) => table(args, path),
        },
        None => {
            let kind: DatasetKind = args.dataset.as_deref().unwrap_or("digits").parse()?;
            builtin(args, kind)
        }
    }
}

fn builtin(args: &TrainArgs, kind: DatasetKind) -> Result<ImageData, TrainError> {
    let splits = builtin_dataset(kind)?;
    let train = subset(args, splits.train);
    let mut settings = Vec::new();
    let train = if args.augment {
        settings.push(("augment".to_string(), "true".to_string()));
        let [_, h, w] = train.sample_shape();
        train.with_augment(Augment::standard(h, w))
    } else {
        train
    };
    Ok(ImageData {
        name: kind.name().to_string(),
        sample_shape: train.sample_shape(),
        classes: train.num_classes(),
        tabular: false,
        default_epochs: match kind {
            DatasetKind::Digits => 20,
            DatasetKind::FashionMnist => 5,
        },
        notes: augment_note(&train),
        settings,
        metadata: BTreeMap::new(),
        train: Arc::new(train),
        test: Arc::new(splits.test),
    })
}

fn folder(args: &TrainArgs, path: &Path) -> Result<ImageData, TrainError> {
    if args.target.is_some() {
        return Err(TrainError::InvalidArgument {
            flag: "target",
            value: args.target.clone().unwrap_or_default(),
            expected: "only with a CSV file as --data; an image folder's classes are its subfolders",
        });
    }
    let options = ImageFolderOptions {
        image_size: args.image_size,
        val_split: args.val_split,
        seed: args.seed,
        skip_bad_files: args.skip_bad_files,
    };
    let f = load_image_folder(path, &options)?;
    let classes = f.classes().to_vec();
    let name = data_name(path);
    let train = subset(args, f.train);
    let [c, h, w] = train.sample_shape();
    let norm = train.normalization();
    let mut notes = vec![format!("classes ({}): {}", classes.len(), classes.join(", "))];
    notes.push(format!(
        "images {w}x{h} {}{}; pixels normalised with the training split's mean {:.4} and std {:.4}",
        if c == 3 { "RGB" } else { "greyscale" },
        args.image_size.map_or(String::new(), |n| format!(" (resized to {n}x{n})")),
        norm.mean,
        norm.std
    ));
    notes.push(match &f.layout {
        FolderLayout::Splits { train, val } => {
            format!("training on {}, test accuracy on {}", train.display(), val.display())
        }
        FolderLayout::HeldOut { fraction } => format!(
            "test accuracy on {}% of each class held out (--val-split {fraction}, seed {})",
            fmt_percent(*fraction),
            args.seed
        ),
    });
    if !f.skipped.is_empty() {
        notes.push(format!(
            "skipped {} bad file{} (--skip-bad-files), e.g. {}: {}",
            f.skipped.len(),
            if f.skipped.len() == 1 { "" } else { "s" },
            f.skipped[0].path.display(),
            f.skipped[0].reason
        ));
    }
    let train = if args.augment { train.with_augment(Augment::standard(h, w)) } else { train };
    notes.extend(augment_note(&train));
    let classes_json = json(&classes);
    let normalization = format!("{{\"mean\":{},\"std\":{}}}", norm.mean, norm.std);
    // The flags first (a changed flag is what a refused resume should name), then what they and
    // the files on disk made of the data.
    let settings = vec![
        ("val-split".to_string(), split_setting(&f.layout)),
        ("image-size".to_string(), args.image_size.map_or("none".to_string(), |n| n.to_string())),
        ("augment".to_string(), args.augment.to_string()),
        ("classes".to_string(), classes_json.clone()),
        ("image-shape".to_string(), format!("[{c},{h},{w}]")),
        ("normalization".to_string(), normalization.clone()),
    ];
    let metadata = BTreeMap::from([
        ("dataset".to_string(), name.clone()),
        ("classes".to_string(), classes_json),
        ("image_shape".to_string(), format!("[{c},{h},{w}]")),
        ("normalization".to_string(), normalization),
    ]);
    Ok(ImageData {
        name,
        sample_shape: [c, h, w],
        classes: classes.len(),
        tabular: false,
        default_epochs: OWN_DATA_EPOCHS,
        notes,
        settings,
        metadata,
        train: Arc::new(train),
        test: Arc::new(f.val),
    })
}

fn table(args: &TrainArgs, path: &Path) -> Result<ImageData, TrainError> {
    let Some(target) = args.target.clone() else {
        return Err(TrainError::InvalidArgument {
            flag: "data",
            value: path.display().to_string(),
            expected: "a folder of images (one subfolder per class), or a CSV file with --target COLUMN naming the class column",
        });
    };
    for (flag, given) in
        [("image-size", args.image_size.is_some()), ("augment", args.augment), ("skip-bad-files", args.skip_bad_files)]
    {
        if given {
            return Err(TrainError::InvalidArgument {
                flag,
                value: path.display().to_string(),
                expected: "an image folder as --data; a CSV table has no images",
            });
        }
    }
    let t = load_csv(path, &CsvOptions { target: target.clone(), val_split: args.val_split, seed: args.seed })?;
    let classes = t.classes().to_vec();
    let name = data_name(path);
    let train = match args.train_subset {
        Some(n) => t.train.take(n),
        None => t.train.clone(),
    };
    let std = t.standardization();
    let notes = vec![
        format!("classes ({}) of column `{target}`: {}", classes.len(), classes.join(", ")),
        format!(
            "{} features ({}), standardised with the training split's mean and std",
            t.feature_names.len(),
            t.feature_names.join(", ")
        ),
        format!(
            "test accuracy on {}% of each class held out (--val-split {}, seed {})",
            fmt_percent(args.val_split),
            args.val_split,
            args.seed
        ),
    ];
    let (classes_json, features_json) = (json(&classes), json(&t.feature_names));
    let (mean_json, std_json) = (json(&std.mean), json(&std.std));
    let settings = vec![
        ("val-split".to_string(), args.val_split.to_string()),
        ("target".to_string(), target.clone()),
        ("classes".to_string(), classes_json.clone()),
        ("features".to_string(), features_json.clone()),
        ("feature-mean".to_string(), mean_json.clone()),
        ("feature-std".to_string(), std_json.clone()),
    ];
    let metadata = BTreeMap::from([
        ("dataset".to_string(), name.clone()),
        ("classes".to_string(), classes_json),
        ("target".to_string(), target),
        ("features".to_string(), features_json),
        ("feature_mean".to_string(), mean_json),
        ("feature_std".to_string(), std_json),
    ]);
    Ok(ImageData {
        name,
        sample_shape: train.sample_shape(),
        classes: classes.len(),
        tabular: true,
        default_epochs: OWN_DATA_EPOCHS,
        notes,
        settings,
        metadata,
        train: Arc::new(train),
        test: Arc::new(t.val),
    })
}

/// `--train-subset N`: the first N training images (for own data, a seeded random sample, as
/// the training split comes shuffled).
fn subset(args: &TrainArgs, train: ImageClassification) -> ImageClassification {
    match args.train_subset {
        Some(n) => train.take(n),
        None => train,
    }
}

fn augment_note(train: &ImageClassification) -> Vec<String> {
    train
        .augment()
        .map(|a| format!("augment: random crop with {} px zero padding, horizontal flip", a.pad))
        .into_iter()
        .collect()
}

/// A file's stem or a folder's name, for the log and the weights file's name.
fn data_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "data".to_string())
}

fn split_setting(layout: &FolderLayout) -> String {
    match layout {
        FolderLayout::Splits { .. } => "folders".to_string(),
        FolderLayout::HeldOut { fraction } => fraction.to_string(),
    }
}

fn fmt_percent(fraction: f64) -> String {
    let p = fraction * 100.0;
    if (p - p.round()).abs() < 1e-9 { format!("{}", p.round()) } else { format!("{p:.1}") }
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
