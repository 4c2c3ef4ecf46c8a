//! The handwritten digits set vendored from scikit-learn (`data/digits.csv.gz`, BSD-3-Clause, see
//! `data/LICENSE-digits.txt`): 1,797 8×8 images with pixel values 0..16 and labels 0..9.
//!
//! It is compiled into the crate, so examples and tests run from a fresh clone without downloads.
//! The set has no official split; ferrite uses the first 1,438 rows (80 %) for training and the
//! last 359 for testing, which keeps every class represented in both (33–37 test images each).

use crate::error::DataError;
use crate::file_bytes::decompress_if_gz;
use crate::image_classification::{ImageClassification, Normalization, Split};

/// The gzipped CSV exactly as scikit-learn ships it.
pub const DIGITS_CSV_GZ: &[u8] = include_bytes!("../data/digits.csv.gz");

pub const NUM_SAMPLES: usize = 1797;
/// Rows `0..TRAIN_SAMPLES` are the training split, the rest the test split.
pub const TRAIN_SAMPLES: usize = 1438;
pub const CLASS_NAMES: &[&str] = &["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
/// Mean and standard deviation of the training pixels scaled to `[0, 1]` (checked by a test).
pub const NORMALIZATION: Normalization = Normalization { mean: 0.3054, std: 0.3755 };

/// Pixels (`n * 64` bytes) and labels of every row, in file order.
pub fn parse_csv(text: &str) -> Result<(Vec<u8>, Vec<u8>), DataError> {
    let mut pixels = Vec::with_capacity(NUM_SAMPLES * 64);
    let mut labels = Vec::with_capacity(NUM_SAMPLES);
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |reason: String| DataError::BadCsv { line: i + 1, reason };
        let values: Vec<u8> = line
            .split(',')
            .map(|f| {
                let t = f.trim();
                // The file stores integers, possibly written as `3.0`.
                let v: f64 = t.parse().map_err(|_| bad(format!("`{t}` is not a number")))?;
                if v.fract() != 0.0 || !(0.0..=255.0).contains(&v) {
                    return Err(bad(format!("`{t}` is not an integer 0..=255")));
                }
                Ok(v as u8)
            })
            .collect::<Result<_, _>>()?;
        if values.len() != 65 {
            return Err(bad(format!("{} fields, expected 64 pixels and a label", values.len())));
        }
        if let Some(p) = values[..64].iter().find(|&&p| p > 16) {
            return Err(bad(format!("pixel value {p} outside 0..=16")));
        }
        if values[64] > 9 {
            return Err(bad(format!("label {} outside 0..=9", values[64])));
        }
        pixels.extend_from_slice(&values[..64]);
        labels.push(values[64]);
    }
    Ok((pixels, labels))
}

/// The whole set (1,797 samples) as one dataset, tagged as the training split.
pub fn load_all() -> Result<ImageClassification, DataError> {
    let (pixels, labels) = decode()?;
    ImageClassification::new("digits", Split::Train, pixels, labels, 8, 8, 16, CLASS_NAMES, NORMALIZATION)
}

/// One split of the set (see the module docs for the split).
pub fn load(split: Split) -> Result<ImageClassification, DataError> {
    let (pixels, labels) = decode()?;
    let (p, l) = match split {
        Split::Train => (pixels[..TRAIN_SAMPLES * 64].to_vec(), labels[..TRAIN_SAMPLES].to_vec()),
        Split::Test => (pixels[TRAIN_SAMPLES * 64..].to_vec(), labels[TRAIN_SAMPLES..].to_vec()),
    };
    ImageClassification::new("digits", split, p, l, 8, 8, 16, CLASS_NAMES, NORMALIZATION)
}

fn decode() -> Result<(Vec<u8>, Vec<u8>), DataError> {
    let where_ = std::path::Path::new("<embedded digits.csv.gz>");
    let bytes = decompress_if_gz(DIGITS_CSV_GZ.to_vec(), where_)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| DataError::NotUtf8 { path: where_.to_path_buf(), offset: e.valid_up_to() })?;
    let (pixels, labels) = parse_csv(text)?;
    if labels.len() != NUM_SAMPLES {
        return Err(DataError::BadCsv { line: labels.len(), reason: format!("{} rows, expected {NUM_SAMPLES}", labels.len()) });
    }
    Ok((pixels, labels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dataset;

    #[test]
    fn embedded_set_has_the_documented_shape_and_statistics() {
        let all = load_all().unwrap();
        assert_eq!(all.len(), 1797);
        assert_eq!(all.sample_shape(), [1, 8, 8]);
        // The first row of scikit-learn's file is a 0.
        assert_eq!(all.label(0), Some(0));
        assert_eq!(&all.raw_image(0).unwrap()[..8], &[0, 0, 5, 13, 9, 1, 0, 0]);
        let mut counts = [0usize; 10];
        all.labels().iter().for_each(|&l| counts[l as usize] += 1);
        assert!(counts.iter().all(|&c| (174..=183).contains(&c)), "{counts:?}");

        let train = load(Split::Train).unwrap();
        let test = load(Split::Test).unwrap();
        assert_eq!((train.len(), test.len()), (1438, 359));
        let s = train.pixel_statistics();
        assert!((s.mean - NORMALIZATION.mean).abs() < 1e-4 && (s.std - NORMALIZATION.std).abs() < 1e-4, "{s:?}");
    }

    #[test]
    fn malformed_rows_are_typed_errors() {
        let row = |label: &str| format!("{}{label}", "0,".repeat(64));
        assert_eq!(parse_csv(&row("3")).unwrap().1, vec![3]);
        assert!(matches!(parse_csv(&row("10")), Err(DataError::BadCsv { line: 1, .. })));
        assert!(matches!(parse_csv("1,2,3"), Err(DataError::BadCsv { .. })));
        assert!(matches!(parse_csv(&row("x")), Err(DataError::BadCsv { .. })));
        let hot = format!("17,{}", row("1").split_once(',').unwrap().1);
        assert!(parse_csv(&hot).unwrap_err().to_string().contains("17"));
    }
}
