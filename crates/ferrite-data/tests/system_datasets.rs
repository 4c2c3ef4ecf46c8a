//! Built-in datasets that come from Debian packages (`dataset-fashion-mnist`, `jargon-text`), plus
//! the error paths that need no package. Without a package the test prints a loud SKIPPED line,
//! unless `FERRITE_REQUIRE_SYSTEM_DEPS=1` (CI), where a missing package fails the test.

use std::io::Write;
use std::path::PathBuf;

use ferrite_data::char_text::JARGON_PATH;
use ferrite_data::idx::encode_idx;
use ferrite_data::{CharText, DataError, DataLoader, Dataset, Split, Subset, fashion_mnist};

/// True if the dependency is present; otherwise skip (or fail under FERRITE_REQUIRE_SYSTEM_DEPS=1).
fn have(present: bool, what: &str, package: &str) -> bool {
    ferrite_test_support::present_or_skip(
        present,
        &format!("{what} is missing"),
        &format!("run bash .ci/run or install {package}"),
    )
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrite-data-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn fashion_mnist_real_files_load_with_documented_shape_and_constants() {
    if !have(fashion_mnist::is_available(), "Fashion-MNIST IDX files", "dataset-fashion-mnist") {
        return;
    }
    let train = fashion_mnist::load(Split::Train).unwrap();
    let test = fashion_mnist::load(Split::Test).unwrap();
    assert_eq!((train.len(), test.len()), (60_000, 10_000));
    assert_eq!(train.sample_shape(), [1, 28, 28]);
    let mut counts = [0usize; 10];
    train.labels().iter().for_each(|&l| counts[l as usize] += 1);
    assert_eq!(counts, [6000; 10]);
    let stats = train.pixel_statistics();
    let n = fashion_mnist::NORMALIZATION;
    assert!((stats.mean - n.mean).abs() < 1e-3 && (stats.std - n.std).abs() < 1e-3, "{stats:?}");

    // Through the loader with workers: normalised pixels, labels in range.
    let mut loader = DataLoader::builder(Subset::first(test, 512)).batch_size(64).num_workers(2).build().unwrap();
    let mut seen = 0;
    for batch in &mut loader {
        for ex in batch.unwrap() {
            assert_eq!(ex.pixels.len(), 784);
            assert!(ex.label < 10);
            let lo = -n.mean / n.std;
            assert!(ex.pixels.iter().all(|&p| p >= lo - 1e-5 && p <= (1.0 - n.mean) / n.std + 1e-5));
            seen += 1;
        }
    }
    assert_eq!(seen, 512);
}

#[test]
fn fashion_mnist_missing_and_corrupt_files_are_typed_errors() {
    let empty = temp_dir("fmnist-empty");
    let e = fashion_mnist::load_from(&empty, Split::Test).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, DataError::DatasetMissing { package: "dataset-fashion-mnist", .. }), "{msg}");
    assert!(
        msg.contains("apt-get install dataset-fashion-mnist") && msg.contains("FERRITE_FASHION_MNIST_DIR"),
        "{msg}"
    );

    // Truncated image file (gzipped, as Debian ships it).
    let dir = temp_dir("fmnist-truncated");
    let images = encode_idx(&[3, 28, 28], &[0u8; 3 * 784]);
    std::fs::write(dir.join("t10k-images-idx3-ubyte.gz"), gz(&images[..images.len() - 100])).unwrap();
    std::fs::write(dir.join("t10k-labels-idx1-ubyte.gz"), gz(&encode_idx(&[3], &[1, 2, 3]))).unwrap();
    let e = fashion_mnist::load_from(&dir, Split::Test).unwrap_err();
    assert!(matches!(e, DataError::TruncatedIdx { .. }), "{e}");

    // Bad magic (uncompressed file).
    std::fs::remove_file(dir.join("t10k-images-idx3-ubyte.gz")).unwrap();
    let mut bad = images.clone();
    bad[1] = 7;
    std::fs::write(dir.join("t10k-images-idx3-ubyte"), &bad).unwrap();
    let e = fashion_mnist::load_from(&dir, Split::Test).unwrap_err();
    assert!(matches!(e, DataError::InvalidIdx { .. }) && e.to_string().contains("magic"), "{e}");

    // Files that do not belong together.
    std::fs::write(dir.join("t10k-images-idx3-ubyte"), &images).unwrap();
    std::fs::write(dir.join("t10k-labels-idx1-ubyte.gz"), gz(&encode_idx(&[2], &[1, 2]))).unwrap();
    let e = fashion_mnist::load_from(&dir, Split::Test).unwrap_err();
    assert!(matches!(e, DataError::LengthMismatch { images: 3, labels: 2, .. }), "{e}");

    // A valid tiny set loads.
    std::fs::write(dir.join("t10k-labels-idx1-ubyte.gz"), gz(&encode_idx(&[3], &[9, 0, 4]))).unwrap();
    let ok = fashion_mnist::load_from(&dir, Split::Test).unwrap();
    assert_eq!(ok.labels(), &[9, 0, 4]);
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&empty).ok();
}

#[test]
fn jargon_file_as_character_level_dataset() {
    if !have(std::path::Path::new(JARGON_PATH).is_file(), "the Jargon File", "jargon-text") {
        return;
    }
    let text = CharText::jargon(128).unwrap();
    assert!(text.num_chars() > 1_500_000, "{}", text.num_chars());
    assert!(text.vocab_size() > 90 && text.vocab_size() < 300, "{}", text.vocab_size());
    assert_eq!(text.len(), (text.num_chars() - 129) / 128 + 1);
    let mut rng = ferrite_data::Generator::new(0);
    let first = text.get(0, &mut rng).unwrap();
    assert_eq!(first.input[1..], first.target[..127]);
    let decoded = text.decode(&first.input);
    assert_eq!(text.encode(&decoded).unwrap(), first.input);

    let (train, val) = text.split(0.9).unwrap();
    let mut loader = DataLoader::builder(train).batch_size(32).shuffle(true).num_workers(2).seed(3).build().unwrap();
    let batch = loader.epoch().next().unwrap().unwrap();
    assert_eq!(batch.len(), 32);
    assert!(val.len() > 1000);
}
