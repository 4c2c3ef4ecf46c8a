//! `ferrite train --data`: the user's own images, tables and texts, written as real files by the
//! tests and trained on by the binary — the per-epoch and final accuracy lines on the held-out
//! split, the class names printed and saved with the weights, the same result for any
//! `--workers` with `--augment`, and a clear error (never a panic) for each kind of bad input.
//! One run trains on a folder of Fashion-MNIST PNGs (Debian's dataset-fashion-mnist; skipped
//! loudly without it unless FERRITE_REQUIRE_SYSTEM_DEPS=1).

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{ferrite, final_accuracy, ok};
use ferrite_data::Dataset;
use image::{GrayImage, Luma, Rgb, RgbImage};

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A greyscale `size × size` image of class `class`: a bright horizontal band (a flip keeps it)
/// at a class-specific row, with per-image noise.
fn band(size: u32, class: u32, variant: u32) -> GrayImage {
    GrayImage::from_fn(size, size, |x, y| {
        let noise = ((x * 31 + y * 17 + variant * 13) % 23) as u8;
        if y / 2 == class { Luma([200 + noise]) } else { Luma([noise]) }
    })
}

/// `per_class` PNGs of each class under `dir/<class>/`.
fn write_folder(dir: &Path, classes: &[&str], per_class: u32, size: u32) {
    for (c, name) in classes.iter().enumerate() {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for i in 0..per_class {
            band(size, c as u32, i).save(d.join(format!("{i:03}.png"))).unwrap();
        }
    }
}

/// The `__metadata__` strings of a safetensors file.
fn safetensors_metadata(path: &Path) -> serde_json::Map<String, serde_json::Value> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"].as_object().unwrap().clone()
}

/// The epoch lines and the accuracy of the final line (without the timings, which differ).
fn results(out: &str) -> (Vec<String>, f64) {
    let epochs =
        out.lines().filter(|l| l.starts_with("epoch ")).map(|l| l.split(" | ").next().unwrap().to_string()).collect();
    (epochs, final_accuracy(out))
}

#[test]
fn an_image_folder_trains_reports_held_out_accuracy_and_saves_its_classes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("bands");
    write_folder(&data, &["left", "middle", "right"], 16, 8);
    let args = |workers: &'static str| {
        vec![
            "train",
            "--data",
            "bands",
            "--epochs",
            "3",
            "--batch-size",
            "8",
            "--augment",
            "--workers",
            workers,
            "--val-split",
            "0.25",
            "--no-progress",
        ]
    };
    let out = ok(&args("0"), dir.path());
    assert!(out.starts_with("ferrite train: bands (36 train / 12 test), MLP 64-128-128-3 on cpu"), "{out}");
    assert!(out.contains("  classes (3): left, middle, right"), "{out}");
    assert!(out.contains("  images 8x8 greyscale; pixels normalised with the training split's mean"), "{out}");
    assert!(out.contains("  test accuracy on 25% of each class held out (--val-split 0.25, seed 0)"), "{out}");
    assert!(out.contains("  augment: random crop with 1 px zero padding, horizontal flip"), "{out}");
    let (epochs, acc) = results(&out);
    assert_eq!(epochs.len(), 3);
    assert!(epochs.iter().all(|l| l.contains("train acc") && l.contains("test acc")), "{out}");
    assert!(out.contains("weights written to ferrite-bands-mlp.safetensors"), "{out}");
    println!("8x8 bands folder, 3 epochs: test accuracy {acc}%");
    // Augmented, and still the same run with two workers.
    let out2 = ok(&args("2"), dir.path());
    assert_eq!(results(&out2), (epochs, acc), "{out}\n{out2}");
    // The classes and the normalisation travel with the weights.
    let meta = safetensors_metadata(&dir.path().join("ferrite-bands-mlp.safetensors"));
    assert_eq!(meta["classes"], r#"["left","middle","right"]"#);
    assert_eq!(meta["image_shape"], "[1,8,8]");
    assert!(meta["normalization"].as_str().unwrap().starts_with(r#"{"mean":"#), "{meta:?}");
}

#[test]
fn a_cnn_trains_on_colour_train_and_val_folders_resized_to_one_size() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("shapes");
    for (split, n) in [("train", 10), ("val", 4)] {
        for (c, class) in ["blue", "red"].iter().enumerate() {
            let d = data.join(split).join(class);
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..n {
                // Sizes differ; --image-size makes them one.
                let size = 10 + i % 3;
                let px = if c == 0 { Rgb([10, 20, 220]) } else { Rgb([220, 20, 10]) };
                RgbImage::from_pixel(size, size, px).save(d.join(format!("{i}.png"))).unwrap();
            }
        }
    }
    let out = ok(
        &[
            "train",
            "--model",
            "cnn",
            "--layers",
            "1",
            "--hidden",
            "4",
            "--data",
            "shapes",
            "--image-size",
            "8",
            "--epochs",
            "2",
            "--batch-size",
            "4",
            "--no-progress",
        ],
        dir.path(),
    );
    assert!(out.starts_with("ferrite train: shapes (20 train / 8 test), CNN 3x8x8"), "{out}");
    assert!(out.contains("images 8x8 RGB (resized to 8x8)"), "{out}");
    assert!(out.contains("test accuracy on") && out.contains("shapes/val"), "{out}");
    println!("colour folder, CNN, 2 epochs: test accuracy {}%", final_accuracy(&out));
}

/// The tensor bytes of a safetensors file (its header's metadata order may differ run to run).
fn tensor_bytes(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8 + n..].to_vec()
}

#[test]
fn a_resume_on_own_data_is_bit_identical_and_a_changed_split_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(&dir.path().join("bands"), &["a", "b"], 12, 8);
    let run = |extra: &[&str]| {
        let mut args = vec!["train", "--data", "bands", "--batch-size", "4", "--augment", "--no-progress"];
        args.extend(extra);
        ok(&args, dir.path())
    };
    run(&["--epochs", "2", "--out", "full.safetensors"]);
    run(&["--epochs", "1", "--save-checkpoint", "ck.ft", "--out", "half.safetensors"]);
    let out = run(&["--epochs", "2", "--resume", "ck.ft", "--out", "resumed.safetensors"]);
    assert!(out.contains("(1 run here"), "{out}");
    let p = |n: &str| dir.path().join(n);
    assert_eq!(tensor_bytes(&p("resumed.safetensors")), tensor_bytes(&p("full.safetensors")));
    let err = fails_with(
        &[
            "train",
            "--data",
            "bands",
            "--batch-size",
            "4",
            "--augment",
            "--epochs",
            "2",
            "--resume",
            "ck.ft",
            "--val-split",
            "0.2",
        ],
        dir.path(),
        &["--val-split"],
    );
    assert!(err.contains("cannot resume"), "{err}");
}

/// 60 rows of two numeric features and a text class that `petal` separates.
fn table() -> String {
    let mut s = String::from("sepal,petal,species\n");
    for i in 0..60 {
        let (species, petal) = [("setosa", 1.0), ("versicolor", 4.0), ("virginica", 6.0)][i % 3];
        s.push_str(&format!("{},{},{species}\n", 5.0 + (i % 7) as f64 * 0.1, petal + (i % 5) as f64 * 0.1));
    }
    s
}

#[test]
fn a_csv_table_trains_the_mlp_with_standardised_features() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("iris.csv"), table()).unwrap();
    let out = ok(
        &[
            "train",
            "--data",
            "iris.csv",
            "--target",
            "species",
            "--epochs",
            "20",
            "--batch-size",
            "8",
            "--val-split",
            "0.2",
            "--no-progress",
        ],
        dir.path(),
    );
    assert!(out.starts_with("ferrite train: iris (48 train / 12 test), MLP 2-128-128-3 on cpu"), "{out}");
    assert!(out.contains("  classes (3) of column `species`: setosa, versicolor, virginica"), "{out}");
    assert!(out.contains("  2 features (sepal, petal), standardised with the training split's mean and std"), "{out}");
    let acc = final_accuracy(&out);
    println!("separable 3-class table, 20 epochs: test accuracy {acc}%");
    assert!(acc >= 90.0, "{out}");
    let meta = safetensors_metadata(&dir.path().join("ferrite-iris-mlp.safetensors"));
    assert_eq!(meta["classes"], r#"["setosa","versicolor","virginica"]"#);
    assert_eq!(meta["target"], "species");
    assert_eq!(meta["features"], r#"["sepal","petal"]"#);
    let means: Vec<f64> = serde_json::from_str(meta["feature_mean"].as_str().unwrap()).unwrap();
    assert_eq!(means.len(), 2);
    assert!(means[1] > 3.0 && means[1] < 4.5, "{means:?}");
    // The CNN needs images.
    let o = ferrite(&["train", "--model", "cnn", "--data", "iris.csv", "--target", "species"], dir.path());
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("mlp for a CSV table"), "{err}");
}

#[test]
fn a_language_model_trains_on_a_folder_of_txt_files() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    std::fs::write(corpus.join("b.txt"), "the quick brown fox jumps over the lazy dog. ".repeat(40)).unwrap();
    std::fs::write(corpus.join("a.txt"), "pack my box with five dozen liquor jugs. ".repeat(40)).unwrap();
    let out = ok(
        &[
            "train",
            "--model",
            "lstm",
            "--data",
            "corpus",
            "--hidden",
            "16",
            "--seq",
            "16",
            "--batch-size",
            "4",
            "--epochs",
            "1",
            "--no-progress",
        ],
        dir.path(),
    );
    assert!(out.starts_with("ferrite train: corpus ("), "{out}");
    assert!(out.contains("validation loss"), "{out}");
    assert!(dir.path().join("ferrite-corpus-lstm.safetensors").is_file(), "{out}");
    // Image-only flags are refused for a language model.
    let o = ferrite(&["train", "--model", "lstm", "--data", "corpus", "--augment"], dir.path());
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("--augment"), "{err}");
}

/// Runs `ferrite ARGS` in `dir`, expects a failure whose stderr contains every one of `needles`
/// and no panic; returns stderr.
fn fails_with(args: &[&str], dir: &Path, needles: &[&str]) -> String {
    let o = ferrite(args, dir);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{args:?} succeeded:\n{out}");
    assert!(!err.contains("panicked") && o.status.code() != Some(101), "{args:?} panicked:\n{err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: `{n}` not in:\n{err}");
    }
    err
}

#[test]
fn bad_input_is_a_typed_error_naming_the_file_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fn train(data: &str) -> Vec<&str> {
        vec!["train", "--data", data, "--epochs", "1", "--no-progress"]
    }

    fails_with(&train("nowhere"), d, &["nowhere"]);
    std::fs::create_dir_all(d.join("empty")).unwrap();
    fails_with(&train("empty"), d, &["empty has no class subfolders"]);
    write_folder(&d.join("one"), &["cats"], 4, 8);
    fails_with(&train("one"), d, &["only one class subfolder (`cats`)"]);

    write_folder(&d.join("mixed"), &["a", "b"], 4, 8);
    band(12, 1, 0).save(d.join("mixed/b/big.png")).unwrap();
    fails_with(&train("mixed"), d, &["a/000.png is 8x8", "b/big.png is 12x12", "--image-size"]);

    write_folder(&d.join("corrupt"), &["a", "b"], 6, 8);
    std::fs::write(d.join("corrupt/b/broken.png"), b"\x89PNG\r\n\x1a\n not really").unwrap();
    fails_with(&train("corrupt"), d, &["corrupt/b/broken.png is not a readable image", "--skip-bad-files"]);
    let mut skip = train("corrupt");
    skip.push("--skip-bad-files");
    let out = ok(&skip, d);
    assert!(out.contains("skipped 1 bad file (--skip-bad-files), e.g. corrupt/b/broken.png"), "{out}");

    std::fs::write(d.join("t.csv"), "a,b,y\n1,2,x\n3,four,y\n").unwrap();
    let mut csv = train("t.csv");
    fails_with(&csv, d, &["--target COLUMN"]);
    csv.extend(["--target", "y"]);
    fails_with(&csv, d, &["t.csv, line 3, column `b` (column 2): `four` is not a finite number"]);
    let last = csv.len() - 1;
    csv[last] = "label";
    fails_with(&csv, d, &["t.csv has no column `label`; its columns are: a, b, y"]);

    let mut folder_target = train("corrupt");
    folder_target.extend(["--target", "y"]);
    fails_with(&folder_target, d, &["--target"]);
    let mut bad_split = train("corrupt");
    bad_split.extend(["--val-split", "1.5"]);
    fails_with(&bad_split, d, &["--val-split", "between 0 and 1"]);
    fails_with(&["train", "--data", "corrupt", "--dataset", "digits"], d, &["--dataset"]);
    fails_with(&["train", "--data", "corrupt", "--batch-size", "auto"], d, &["--batch-size"]);
}

#[test]
fn a_folder_of_fashion_mnist_pngs_trains_end_to_end() {
    let present = ferrite_data::fashion_mnist::is_available();
    if !ferrite_test_support::present_or_skip(
        present,
        "Fashion-MNIST is missing",
        "run bash .ci/run or install the Debian package dataset-fashion-mnist",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = dir.path().join("fashion3");
    let train = ferrite_data::fashion_mnist::load(ferrite_data::Split::Train).unwrap();
    // Three classes, 40 images each, the first of each class in the training file.
    for (label, name) in [(1usize, "trouser"), (7, "sneaker"), (8, "bag")] {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        let indices = (0..train.len()).filter(|&i| train.label(i) == Some(label)).take(40);
        for (k, i) in indices.enumerate() {
            let pixels = train.raw_image(i).unwrap().to_vec();
            GrayImage::from_raw(28, 28, pixels).unwrap().save(d.join(format!("{k:02}.png"))).unwrap();
        }
    }
    let start = std::time::Instant::now();
    let out = ok(
        &[
            "train",
            "--data",
            "fashion3",
            "--epochs",
            "2",
            "--batch-size",
            "16",
            "--val-split",
            "0.25",
            "--workers",
            "2",
            "--no-progress",
        ],
        dir.path(),
    );
    let acc = final_accuracy(&out);
    println!(
        "Fashion-MNIST folder (trouser/sneaker/bag, 3 x 40 PNGs, 25% held out), MLP, 2 epochs: test accuracy {acc}% in {:.1}s",
        start.elapsed().as_secs_f64()
    );
    assert!(out.starts_with("ferrite train: fashion3 (90 train / 30 test), MLP 784-128-128-3 on cpu"), "{out}");
    assert!(out.contains("  classes (3): bag, sneaker, trouser"), "{out}");
    assert!(out.lines().filter(|l| l.starts_with("epoch ") && l.contains("test acc")).count() == 2, "{out}");
    assert!(acc >= 80.0, "{out}");
}
