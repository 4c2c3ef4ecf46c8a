//! A user's own images in torchvision's `ImageFolder` layout (`ferrite train --data DIR`):
//! one subfolder per class, class names and indices from the subfolder names (sorted), PNG, JPEG
//! and BMP files decoded with the pure-Rust `image` crate.
//!
//! ```text
//! DIR/cat/001.png   DIR/dog/a.jpg ...              one folder: --val-split holds out a share
//! DIR/train/cat/... DIR/val/cat/... (or test/)     the splits as given
//! ```
//!
//! Why load everything up front into an [`ImageClassification`]: the images are decoded once,
//! resized to one square size (`--image-size`) and kept as bytes, so every epoch, every worker
//! and every augmentation reads the same pixels, and a bad file is reported before training
//! starts — never as a failure in epoch 3. Every problem is a typed [`DataError`] naming the file:
//! no class folders, a single class, a class without images, an unreadable or corrupt file (or,
//! with `skip_bad_files`, a count of them), images of different sizes with no size to resize to.
//!
//! Where ferrite differs from torchvision: hidden folders and files (a leading `.`, such as
//! `.ipynb_checkpoints`) are not classes or images; grayscale and colour are detected, not forced
//! to RGB (a colour image, one whose red, green and blue differ somewhere, makes the whole
//! dataset RGB; a greyscale image then has its grey copied to the three channels); the pixels
//! are normalised with the training split's own mean and standard deviation.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use ferrite_tensor::Generator;
use image::imageops::FilterType;
use image::{DynamicImage, GrayImage, RgbImage};

use crate::error::DataError;
use crate::image_classification::{ImageClassification, ImageParts, Normalization, Split};
use crate::stratified_split::stratified_split;

/// The largest `image_size` accepted (a 4096×4096 RGB image is 48 MiB in memory).
pub const MAX_IMAGE_SIZE: u32 = 4096;

/// File extensions read as images (case-insensitive).
pub const IMAGE_EXTENSIONS: &[&str] = &["png", "jpg", "jpeg", "bmp"];

/// How to read an image folder.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageFolderOptions {
    /// Resize every image to `size × size` (stretching, as torchvision's `Resize((size, size))`,
    /// with a triangle filter). `None`: all images must already share one size.
    pub image_size: Option<u32>,
    /// Share of each class held out for validation when the folder has no `train/` + `val/`
    /// (or `test/`) subfolders.
    pub val_split: f64,
    /// Seed of the held-out split and of the training split's order.
    pub seed: u64,
    /// Skip (and list in [`ImageFolder::skipped`]) unreadable or corrupt image files instead of
    /// failing on the first.
    pub skip_bad_files: bool,
}

impl Default for ImageFolderOptions {
    fn default() -> Self {
        ImageFolderOptions { image_size: None, val_split: 0.1, seed: 0, skip_bad_files: false }
    }
}

/// Where the validation images came from.
#[derive(Debug, Clone, PartialEq)]
pub enum FolderLayout {
    /// `train/` and `val/` (or `test/`) subfolders.
    Splits { train: PathBuf, val: PathBuf },
    /// One folder of classes; this share of each class was held out.
    HeldOut { fraction: f64 },
}

/// A file passed over because of `skip_bad_files`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedFile {
    pub path: PathBuf,
    pub reason: String,
}

/// An image folder, loaded: both splits, ready for a loader.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    /// In a seeded random order (so `take(n)` is a fair sample), normalised with its own
    /// statistics.
    pub train: ImageClassification,
    /// Folder order, normalised with the training split's statistics.
    pub val: ImageClassification,
    pub layout: FolderLayout,
    /// Files passed over with `skip_bad_files` (empty otherwise).
    pub skipped: Vec<SkippedFile>,
}

impl ImageFolder {
    /// Class names, sorted as the folders are; a label indexes this list.
    pub fn classes(&self) -> &[String] {
        self.train.class_names()
    }

    /// Whether the images were read as colour (3 channels) rather than greyscale (1).
    pub fn is_rgb(&self) -> bool {
        self.train.sample_shape()[0] == 3
    }
}

/// Reads the image folder at `root`.
pub fn load_image_folder(root: &Path, options: &ImageFolderOptions) -> Result<ImageFolder, DataError> {
    if let Some(n) = options.image_size
        && !(1..=MAX_IMAGE_SIZE).contains(&n)
    {
        return Err(DataError::InvalidConfig(format!("image size {n} must be between 1 and {MAX_IMAGE_SIZE} pixels")));
    }
    let splits = find_splits(root)?;
    let train_dir = splits.as_ref().map_or(root, |(t, _)| t.as_path());
    let classes = class_folders(train_dir)?;
    match classes.len() {
        0 => return Err(DataError::NoClasses { path: train_dir.to_path_buf() }),
        1 => return Err(DataError::OneClass { path: train_dir.to_path_buf(), class: classes[0].0.clone() }),
        _ => {}
    }
    // (path, label) of every image, training split first.
    let mut files = Vec::new();
    for (label, (name, dir)) in classes.iter().enumerate() {
        let found = image_files(dir)?;
        if found.is_empty() {
            return Err(DataError::NoImages { path: dir.clone(), class: Some(name.clone()) });
        }
        files.extend(found.into_iter().map(|p| (p, label as u32)));
    }
    let train_count = files.len();
    if let Some((_, val_dir)) = &splits {
        for (name, dir) in class_folders(val_dir)? {
            let Some(label) = classes.iter().position(|(n, _)| *n == name) else {
                return Err(DataError::UnknownSplitClass { path: dir, class: name, train: train_dir.to_path_buf() });
            };
            files.extend(image_files(&dir)?.into_iter().map(|p| (p, label as u32)));
        }
        if files.len() == train_count {
            return Err(DataError::NoImages { path: val_dir.clone(), class: None });
        }
    }

    let decoded = decode_all(&files, options.image_size);
    let mut images = Vec::with_capacity(files.len());
    let mut skipped = Vec::new();
    let mut train_kept = 0;
    for (i, (result, (path, label))) in decoded.into_iter().zip(files).enumerate() {
        match result {
            Ok(image) => {
                train_kept += usize::from(i < train_count);
                images.push((path, label, image));
            }
            Err(e) if options.skip_bad_files => {
                skipped.push(SkippedFile { path, reason: e.to_string() });
            }
            Err(e) => return Err(e),
        }
    }
    if options.image_size.is_none()
        && let Some((first, _, a)) = images.first()
        && let Some((other, _, b)) = images.iter().find(|(_, _, b)| b.size() != a.size())
    {
        return Err(DataError::MixedImageSizes {
            first: first.clone(),
            first_size: a.size(),
            other: other.clone(),
            other_size: b.size(),
        });
    }
    let rgb = images.iter().any(|(_, _, image)| image.is_colour());
    let (width, height) = images.first().map_or((0, 0), |(_, _, image)| image.size());
    let channels = if rgb { 3 } else { 1 };
    let per_image = channels * width as usize * height as usize;
    let mut pixels = Vec::new();
    // The whole dataset lives in memory as bytes: say so, rather than abort, when it cannot.
    images.len().checked_mul(per_image).and_then(|total| pixels.try_reserve_exact(total).ok()).ok_or_else(|| {
        DataError::InvalidConfig(format!(
            "{} images of {channels}x{height}x{width} bytes do not fit in memory; use a smaller --image-size",
            images.len()
        ))
    })?;
    let mut labels = Vec::with_capacity(images.len());
    for (_, label, image) in &images {
        image.write_chw(rgb, &mut pixels);
        labels.push(*label);
    }
    let name = root.file_name().map_or_else(|| root.display().to_string(), |n| n.to_string_lossy().into_owned());
    let train_labels = &labels[..train_kept];
    let (train_idx, val_idx, layout) = match &splits {
        Some((train, val)) => {
            let mut order: Vec<usize> = (0..train_kept).collect();
            Generator::new(options.seed).shuffle(&mut order);
            let layout = FolderLayout::Splits { train: train.clone(), val: val.clone() };
            (order, (train_kept..labels.len()).collect(), layout)
        }
        None => {
            let s = stratified_split(train_labels, options.val_split, options.seed)?;
            (s.train, s.val, FolderLayout::HeldOut { fraction: options.val_split })
        }
    };
    if train_idx.is_empty() {
        return Err(DataError::NoImages { path: train_dir.to_path_buf(), class: None });
    }
    if val_idx.is_empty() {
        let val_dir = splits.map_or_else(|| root.to_path_buf(), |(_, v)| v);
        return Err(DataError::NoImages { path: val_dir, class: None });
    }
    let all = ImageClassification::from_parts(ImageParts {
        name,
        split: Split::Train,
        images: pixels,
        labels,
        shape: [channels, height as usize, width as usize],
        max_value: 255,
        class_names: classes.into_iter().map(|(n, _)| n).collect(),
        normalization: Normalization::IDENTITY,
    })?;
    let train = all.select(&train_idx, Split::Train)?;
    let stats = train.pixel_statistics();
    // A training split of one flat colour has no spread: centre it, do not divide by zero.
    let normalization = Normalization { mean: stats.mean, std: if stats.std > 1e-6 { stats.std } else { 1.0 } };
    Ok(ImageFolder {
        train: train.with_normalization(normalization),
        val: all.select(&val_idx, Split::Test)?.with_normalization(normalization),
        layout,
        skipped,
    })
}

/// `root/train` with `root/val` (or `root/test`), if both are folders.
fn find_splits(root: &Path) -> Result<Option<(PathBuf, PathBuf)>, DataError> {
    let meta = std::fs::metadata(root).map_err(|source| DataError::Io { path: root.to_path_buf(), source })?;
    if !meta.is_dir() {
        return Err(DataError::Io {
            path: root.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "an image folder must be a directory"),
        });
    }
    let train = root.join("train");
    if !train.is_dir() {
        return Ok(None);
    }
    Ok(["val", "test"].iter().map(|v| root.join(v)).find(|v| v.is_dir()).map(|val| (train, val)))
}

/// The visible subfolders of `dir` as `(name, path)`, sorted by name.
fn class_folders(dir: &Path) -> Result<Vec<(String, PathBuf)>, DataError> {
    let mut out: Vec<(String, PathBuf)> = entries(dir)?.into_iter().filter(|(_, p)| p.is_dir()).collect();
    out.sort();
    Ok(out)
}

/// The image files under `dir` (any depth, as torchvision walks), sorted by path.
fn image_files(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for (name, path) in entries(&d)? {
            if path.is_dir() {
                pending.push(path);
            } else if has_image_extension(&name) {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn has_image_extension(name: &str) -> bool {
    name.rsplit_once('.').is_some_and(|(_, ext)| IMAGE_EXTENSIONS.iter().any(|e| ext.eq_ignore_ascii_case(e)))
}

/// The entries of `dir` not starting with `.`, as `(name, path)`.
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, DataError> {
    let io = |source| DataError::Io { path: dir.to_path_buf(), source };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            out.push((name, entry.path()));
        }
    }
    Ok(out)
}

/// One decoded image at its final size, greyscale or colour.
enum Pixels {
    Grey(GrayImage),
    Rgb(RgbImage),
}

impl Pixels {
    fn size(&self) -> (u32, u32) {
        match self {
            Pixels::Grey(g) => g.dimensions(),
            Pixels::Rgb(c) => c.dimensions(),
        }
    }

    fn is_colour(&self) -> bool {
        matches!(self, Pixels::Rgb(_))
    }

    /// Appends the image as `[channels, height, width]` bytes, 3 channels if `rgb`.
    fn write_chw(&self, rgb: bool, out: &mut Vec<u8>) {
        match (self, rgb) {
            (Pixels::Grey(g), false) => out.extend_from_slice(g.as_raw()),
            (Pixels::Grey(g), true) => {
                for _ in 0..3 {
                    out.extend_from_slice(g.as_raw());
                }
            }
            (Pixels::Rgb(c), _) => {
                for channel in 0..3 {
                    out.extend(c.pixels().map(|p| p.0[channel]));
                }
            }
        }
    }
}

/// Decodes `files` on a few threads; results in the order of `files`.
fn decode_all(files: &[(PathBuf, u32)], size: Option<u32>) -> Vec<Result<Pixels, DataError>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
    let chunk = files.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = files
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().map(|(p, _)| decode(p, size)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .zip(files.chunks(chunk))
            .flat_map(|(h, part)| {
                // `decode` catches the decoders' panics, so a thread cannot end in one; if it
                // did, every file of its share is reported as undecodable rather than panicking.
                h.join().unwrap_or_else(|_| {
                    part.iter().map(|(p, _)| Err(corrupt(p, "the decoder failed unexpectedly".into()))).collect()
                })
            })
            .collect()
    })
}

fn corrupt(path: &Path, reason: String) -> DataError {
    DataError::CorruptImage { path: path.to_path_buf(), reason }
}

/// Reads, decodes and resizes one file. A decoder that panics on a hostile file is reported as a
/// corrupt image, not a crash.
fn decode(path: &Path, size: Option<u32>) -> Result<Pixels, DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
    let decoded = std::panic::catch_unwind(|| {
        image::ImageReader::new(Cursor::new(&bytes)).with_guessed_format().map_err(|e| e.to_string())?.decode().map_err(
            |e| match e {
                image::ImageError::Unsupported(_) => format!("{e} (ferrite reads PNG, JPEG and BMP)"),
                e => e.to_string(),
            },
        )
    })
    .unwrap_or_else(|_| Err("the decoder panicked on this file".to_string()))
    .map_err(|reason| corrupt(path, reason))?;
    let pixels = to_pixels(decoded);
    Ok(match (size, pixels) {
        (Some(n), p) if p.size() == (n, n) => p,
        (Some(n), Pixels::Grey(g)) => Pixels::Grey(image::imageops::resize(&g, n, n, FilterType::Triangle)),
        (Some(n), Pixels::Rgb(c)) => Pixels::Rgb(image::imageops::resize(&c, n, n, FilterType::Triangle)),
        (None, p) => p,
    })
}

/// 8-bit greyscale or RGB (alpha dropped); an RGB image whose channels agree everywhere is grey.
fn to_pixels(image: DynamicImage) -> Pixels {
    if !image.color().has_color() {
        return Pixels::Grey(image.into_luma8());
    }
    let rgb = image.into_rgb8();
    if rgb.pixels().all(|p| p.0[0] == p.0[1] && p.0[1] == p.0[2]) {
        let (w, h) = rgb.dimensions();
        let grey = rgb.pixels().map(|p| p.0[0]).collect();
        // The buffer has exactly w * h bytes, so this cannot fail.
        if let Some(g) = GrayImage::from_raw(w, h, grey) {
            return Pixels::Grey(g);
        }
    }
    Pixels::Rgb(rgb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_and_hidden_entries() {
        assert!(has_image_extension("a.PNG") && has_image_extension("b.jpeg") && has_image_extension("c.Bmp"));
        assert!(!has_image_extension("notes.txt") && !has_image_extension("png"));
    }

    #[test]
    fn grey_rgb_is_grey_and_colour_is_colour() {
        let grey_rgb = RgbImage::from_pixel(2, 2, image::Rgb([7, 7, 7]));
        assert!(!to_pixels(DynamicImage::ImageRgb8(grey_rgb)).is_colour());
        let mut colour = RgbImage::from_pixel(2, 2, image::Rgb([7, 7, 7]));
        colour.put_pixel(1, 1, image::Rgb([7, 8, 7]));
        let p = to_pixels(DynamicImage::ImageRgb8(colour));
        assert!(p.is_colour());
        let mut chw = Vec::new();
        p.write_chw(true, &mut chw);
        assert_eq!(chw, [7, 7, 7, 7, 7, 7, 7, 8, 7, 7, 7, 7]);
        let mut chw = Vec::new();
        Pixels::Grey(GrayImage::from_pixel(1, 2, image::Luma([3]))).write_chw(true, &mut chw);
        assert_eq!(chw, [3; 6]);
    }
}
