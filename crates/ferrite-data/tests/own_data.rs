//! A user's own data, read from real files written by the tests: image folders (PNG, JPEG,
//! BMP written with the `image` crate), CSV tables and text folders — the layouts, the splits,
//! the class names, the statistics, augmentation across worker counts, and a typed error naming
//! the file (and line and column) for each kind of bad input.

use std::path::{Path, PathBuf};

use ferrite_data::{
    Augment, CsvOptions, DataError, DataLoader, Dataset, FolderLayout, ImageCollate, ImageFolderOptions, load_csv,
    load_image_folder,
};
use image::{GrayImage, Luma, Rgb, RgbImage};

/// A greyscale image of class `class`: a bright band whose position says the class, with
/// `variant` shifting the brightness so images of one class differ.
fn grey(size: u32, class: u32, variant: u32) -> GrayImage {
    GrayImage::from_fn(size, size, |x, _| {
        if x % 3 == class % 3 { Luma([200 + (variant % 50) as u8]) } else { Luma([(variant * 7 % 40) as u8]) }
    })
}

/// `classes × per_class` greyscale PNGs of `size × size` under `dir/<class>/`.
fn write_folder(dir: &Path, classes: &[&str], per_class: u32, size: u32) {
    for (c, name) in classes.iter().enumerate() {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for i in 0..per_class {
            grey(size, c as u32, i).save(d.join(format!("{i:03}.png"))).unwrap();
        }
    }
}

fn options() -> ImageFolderOptions {
    ImageFolderOptions { val_split: 0.25, seed: 3, ..ImageFolderOptions::default() }
}

#[test]
fn a_folder_of_classes_is_split_stratified_with_sorted_class_names() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &["trouser", "bag", "coat"], 12, 10);
    // Not classes or images: a hidden folder, a stray file, a file with another extension.
    std::fs::create_dir_all(dir.path().join(".ipynb_checkpoints")).unwrap();
    std::fs::write(dir.path().join("README.txt"), "notes").unwrap();
    std::fs::write(dir.path().join("bag/labels.csv"), "x").unwrap();
    let f = load_image_folder(dir.path(), &options()).unwrap();
    assert_eq!(f.classes(), ["bag", "coat", "trouser"]);
    assert!(!f.is_rgb());
    assert_eq!(f.train.sample_shape(), [1, 10, 10]);
    assert_eq!((f.train.len(), f.val.len()), (27, 9));
    assert_eq!(f.layout, FolderLayout::HeldOut { fraction: 0.25 });
    for c in 0..3 {
        assert_eq!(f.val.labels().iter().filter(|&&l| l == c).count(), 3, "class {c}");
    }
    // The training split is normalised with its own statistics, the validation split with the same.
    let stats = f.train.clone().with_normalization(ferrite_data::Normalization::IDENTITY).pixel_statistics();
    assert_eq!(f.train.normalization(), stats);
    assert_eq!(f.val.normalization(), stats);
    // Seeded: the same seed gives the same split, another seed another one.
    let again = load_image_folder(dir.path(), &options()).unwrap();
    assert_eq!(again.train.labels(), f.train.labels());
    let other = load_image_folder(dir.path(), &ImageFolderOptions { seed: 4, ..options() }).unwrap();
    assert_ne!(other.train.labels(), f.train.labels());
    // A loader reads it as it reads the built-in datasets.
    let mut loader = f.val.loader(4).num_workers(2).build().unwrap();
    let shapes: Vec<[usize; 4]> = loader.epoch().map(|b| b.unwrap().shape()).collect();
    assert_eq!(shapes, [[4, 1, 10, 10], [4, 1, 10, 10], [1, 1, 10, 10]]);
}

#[test]
fn train_and_val_folders_are_the_splits_and_one_colour_image_makes_all_rgb() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(&dir.path().join("train"), &["a", "b"], 5, 6);
    write_folder(&dir.path().join("val"), &["b"], 2, 6);
    // One colour image (JPEG) among the greyscale PNGs, and a BMP.
    RgbImage::from_fn(6, 6, |x, _| Rgb([x as u8 * 40, 0, 255])).save(dir.path().join("train/a/colour.jpg")).unwrap();
    grey(6, 1, 9).save(dir.path().join("train/b/z.bmp")).unwrap();
    let f = load_image_folder(dir.path(), &options()).unwrap();
    assert!(f.is_rgb());
    assert_eq!(f.train.sample_shape(), [3, 6, 6]);
    assert_eq!((f.train.len(), f.val.len()), (12, 2));
    assert_eq!(f.val.labels(), [1, 1]);
    assert!(matches!(f.layout, FolderLayout::Splits { .. }));
    // A greyscale image became three equal channels.
    let first_grey = (0..f.val.len()).map(|i| f.val.raw_image(i).unwrap()).next().unwrap();
    let n = 36;
    assert_eq!(first_grey[..n], first_grey[n..2 * n]);
    assert_eq!(first_grey[..n], first_grey[2 * n..]);

    // `test/` serves as well as `val/`; a class the training folder lacks is refused.
    std::fs::rename(dir.path().join("val"), dir.path().join("test")).unwrap();
    assert_eq!(load_image_folder(dir.path(), &options()).unwrap().val.len(), 2);
    write_folder(&dir.path().join("test"), &["zebra"], 1, 6);
    let e = load_image_folder(dir.path(), &options()).unwrap_err();
    assert!(matches!(&e, DataError::UnknownSplitClass { class, .. } if class == "zebra"), "{e}");
}

#[test]
fn mixed_sizes_need_an_image_size_and_are_resized_with_one() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &["a", "b"], 4, 12);
    grey(20, 1, 0).save(dir.path().join("b/big.png")).unwrap();
    let e = load_image_folder(dir.path(), &options()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, DataError::MixedImageSizes { first_size: (12, 12), other_size: (20, 20), .. }), "{msg}");
    assert!(msg.contains("a/000.png") && msg.contains("b/big.png") && msg.contains("--image-size"), "{msg}");
    let f = load_image_folder(dir.path(), &ImageFolderOptions { image_size: Some(8), ..options() }).unwrap();
    assert_eq!(f.train.sample_shape(), [1, 8, 8]);
    assert_eq!(f.train.len() + f.val.len(), 9);
    for bad in [0, 100_000] {
        let e = load_image_folder(dir.path(), &ImageFolderOptions { image_size: Some(bad), ..options() }).unwrap_err();
        assert!(matches!(e, DataError::InvalidConfig(_)), "{e}");
    }
}

#[test]
fn bad_folders_and_bad_files_are_typed_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let err = |p: &Path| load_image_folder(p, &options()).unwrap_err();
    assert!(matches!(err(&root.join("missing")), DataError::Io { .. }));
    assert!(matches!(err(root), DataError::NoClasses { .. }));
    write_folder(root, &["only"], 3, 4);
    let e = err(root);
    assert!(matches!(&e, DataError::OneClass { class, .. } if class == "only"), "{e}");
    std::fs::create_dir_all(root.join("empty")).unwrap();
    let e = err(root);
    assert!(matches!(&e, DataError::NoImages { class: Some(c), .. } if c == "empty"), "{e}");
    write_folder(root, &["empty"], 3, 4);

    // A corrupt PNG (truncated) and a file that is not an image at all.
    let good = std::fs::read(root.join("only/000.png")).unwrap();
    std::fs::write(root.join("only/truncated.png"), &good[..good.len() / 2]).unwrap();
    let e = err(root);
    assert!(matches!(&e, DataError::CorruptImage { path, .. } if path.ends_with("only/truncated.png")), "{e}");
    assert!(e.to_string().contains("--skip-bad-files"), "{e}");
    std::fs::write(root.join("empty/text.jpg"), "not a jpeg").unwrap();
    let skip = ImageFolderOptions { skip_bad_files: true, ..options() };
    let f = load_image_folder(root, &skip).unwrap();
    let skipped: Vec<PathBuf> = f.skipped.iter().map(|s| s.path.clone()).collect();
    assert_eq!(skipped, [root.join("empty/text.jpg"), root.join("only/truncated.png")]);
    assert_eq!(f.train.len() + f.val.len(), 6);
    // A file given where a folder is expected.
    assert!(matches!(err(&root.join("only/000.png")), DataError::Io { .. }));
}

#[cfg(unix)]
#[test]
fn an_unreadable_file_is_an_io_error_naming_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &["a", "b"], 3, 4);
    let locked = dir.path().join("a/001.png");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::read(&locked).is_ok() {
        eprintln!("SKIPPED an_unreadable_file_is_an_io_error_naming_it: running as root, permissions do not bind");
        return;
    }
    let e = load_image_folder(dir.path(), &options()).unwrap_err();
    assert!(matches!(&e, DataError::Io { path, .. } if *path == locked), "{e}");
}

#[test]
fn augmentation_is_random_per_sample_and_identical_for_any_number_of_workers() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &["a", "b", "c"], 8, 16);
    let f = load_image_folder(dir.path(), &options()).unwrap();
    let augmented = f.train.clone().with_augment(Augment::standard(16, 16));
    assert_eq!(augmented.augment(), Some(Augment { pad: 2, flip: true }));
    let epoch = |workers: usize, epochs: usize| -> Vec<Vec<f32>> {
        let shape = augmented.sample_shape();
        let mut loader = DataLoader::builder(augmented.clone())
            .batch_size(5)
            .shuffle(true)
            .seed(11)
            .num_workers(workers)
            .collate(ImageCollate::new(shape))
            .build()
            .unwrap();
        (0..epochs).flat_map(|_| loader.epoch().map(|b| b.unwrap().pixels).collect::<Vec<_>>()).collect()
    };
    let reference = epoch(0, 2);
    assert_eq!(epoch(1, 2), reference);
    assert_eq!(epoch(3, 2), reference);
    // The two epochs draw different crops, and the crops differ from the plain images.
    let half = reference.len() / 2;
    assert_ne!(reference[..half], reference[half..]);
    let plain = f.train.clone();
    let mut g = ferrite_data::Generator::new(0);
    let changed = (0..plain.len())
        .filter(|&i| plain.get(i, &mut g).unwrap().pixels != augmented.get(i, &mut g).unwrap().pixels)
        .count();
    assert!(changed > plain.len() / 2, "{changed} of {} samples changed", plain.len());
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn csv_options(target: &str) -> CsvOptions {
    CsvOptions { target: target.into(), val_split: 0.25, seed: 1 }
}

/// 40 rows: two features and a species; `petal` separates the species.
fn iris_like() -> String {
    let mut s = String::from("sepal, petal ,species\n");
    for i in 0..40 {
        let species = ["setosa", "virginica"][i % 2];
        s.push_str(&format!("{}.5,{},{species}\n", 4 + i % 3, (i % 2) * 10 + i % 4));
    }
    s
}

#[test]
fn a_csv_is_a_standardised_classification_table() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "iris.csv", &iris_like());
    let t = load_csv(&p, &csv_options("species")).unwrap();
    assert_eq!(t.classes(), ["setosa", "virginica"]);
    assert_eq!(t.feature_names, ["sepal", "petal"]);
    assert_eq!((t.train.len(), t.val.len()), (30, 10));
    assert_eq!(t.val.labels().iter().filter(|&&l| l == 0).count(), 5);
    assert_eq!(t.train.sample_shape(), [1, 1, 2]);
    // Standardised with the training split's statistics: mean 0, std 1 there.
    let mut g = ferrite_data::Generator::new(0);
    let rows: Vec<Vec<f32>> = (0..t.train.len()).map(|i| t.train.get(i, &mut g).unwrap().pixels).collect();
    for j in 0..2 {
        let mean = rows.iter().map(|r| r[j]).sum::<f32>() / rows.len() as f32;
        let var = rows.iter().map(|r| (r[j] - mean).powi(2)).sum::<f32>() / rows.len() as f32;
        assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4, "feature {j}: mean {mean} var {var}");
    }
    assert_eq!(t.val.standardization(), t.standardization());
    // An integer target: classes sorted as numbers.
    let p = write(dir.path(), "ints.csv", "x,label\n1,10\n2,9\n3,10\n4,9\n5,10\n6,9\n7,100\n8,100\n");
    let t = load_csv(&p, &csv_options("label")).unwrap();
    assert_eq!(t.classes(), ["9", "10", "100"]);
    let mut loader = t.train.tensor_loader(4).build().unwrap();
    let (x, y) = loader.epoch().next().unwrap().unwrap();
    assert_eq!((x.shape().to_vec(), y.shape().to_vec()), (vec![4, 1, 1, 1], vec![4]));
}

#[test]
fn bad_csv_files_are_typed_errors_naming_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let load =
        |name: &str, text: &str, target: &str| load_csv(&write(d, name, text), &csv_options(target)).unwrap_err();

    let e = load("text.csv", "a,b,y\n1,2,0\n3,oops,1\n", "y");
    assert!(
        matches!(&e, DataError::NonNumericFeature { line: 3, column, column_number: 2, value, .. } if column == "b" && value == "oops"),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("text.csv, line 3, column `b`"), "{msg}");

    let e = load("missing.csv", "a,b,y\n1,2,0\n", "label");
    assert!(matches!(&e, DataError::MissingColumn { available, .. } if available == &["a", "b", "y"]), "{e}");
    assert!(e.to_string().contains("a, b, y"), "{e}");

    let e = load("ragged.csv", "a,y\n1,0\n2,1,7\n", "y");
    assert!(matches!(e, DataError::MalformedCsv { line: 3, .. }), "{e}");
    let e = load("empty.csv", "a,y\n", "y");
    assert!(matches!(e, DataError::EmptyCsv { .. }), "{e}");
    let e = load("regression.csv", "a,y\n1,0.5\n2,1.5\n", "y");
    assert!(matches!(e, DataError::NotAClass { line: 2, .. }), "{e}");
    let e = load("one.csv", "a,y\n1,cat\n2,cat\n", "y");
    assert!(matches!(e, DataError::OneTargetClass { .. }), "{e}");
    let e = load("nan.csv", "a,y\n1,0\nNaN,1\n", "y");
    assert!(matches!(e, DataError::NonNumericFeature { line: 3, .. }), "{e}");
    let e = load_csv(&d.join("nowhere.csv"), &csv_options("y")).unwrap_err();
    assert!(matches!(e, DataError::Io { .. }), "{e}");
}

#[test]
fn a_text_folder_is_its_txt_files_in_order() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "2.txt", "world");
    write(dir.path(), "1.txt", "hello");
    let t = ferrite_data::CharText::from_path(dir.path(), 4).unwrap();
    assert_eq!(t.num_chars(), "hello\nworld".chars().count());
    assert_eq!(t.decode(&t.encode("hello\nworld").unwrap()), "hello\nworld");
}
