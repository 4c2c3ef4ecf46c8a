//! A CSV file as a classification table (`ferrite train --data FILE.csv --target COLUMN`): a
//! header row, numeric feature columns, and a target column of integer or text classes, read
//! with the `csv` crate and split into training and validation tables.
//!
//! Why a reader of its own rather than "parse floats": user files are where the surprises are. A
//! text cell in a feature column, a missing target column, a ragged row, a target that is really
//! a measurement (3.7) — each is a typed [`DataError`] naming the file, the line and the column,
//! found before training starts. Class names are kept (integers sorted as numbers, text sorted
//! as text, as scikit-learn's `LabelEncoder`) so predictions can be read back as the user's own
//! labels; features are standardised with the training split's statistics
//! ([`Standardization`]).

use std::path::{Path, PathBuf};

use crate::error::DataError;
use crate::stratified_split::stratified_split;
use crate::tabular::{Standardization, TabularClassification};

/// How to read a CSV table.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvOptions {
    /// The column holding the class of each row.
    pub target: String,
    /// Share of each class held out for validation.
    pub val_split: f64,
    /// Seed of the held-out split and of the training rows' order.
    pub seed: u64,
}

/// A CSV file, loaded and split.
#[derive(Debug, Clone)]
pub struct CsvTable {
    /// In a seeded random order.
    pub train: TabularClassification,
    /// File order.
    pub val: TabularClassification,
    pub path: PathBuf,
    /// The target column's name.
    pub target: String,
    /// The feature columns' names, in file order (the target left out).
    pub feature_names: Vec<String>,
}

impl CsvTable {
    /// Class names; a label indexes this list.
    pub fn classes(&self) -> &[String] {
        self.train.class_names()
    }

    /// The training split's per-feature mean and standard deviation, applied to both splits.
    pub fn standardization(&self) -> &Standardization {
        self.train.standardization()
    }
}

/// Reads and splits the CSV file at `path`.
pub fn load_csv(path: &Path, options: &CsvOptions) -> Result<CsvTable, DataError> {
    let file = std::fs::File::open(path).map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
    let mut reader = csv::ReaderBuilder::new().has_headers(true).trim(csv::Trim::All).from_reader(file);
    let malformed = |e: csv::Error| {
        let line = e.position().map_or(1, |p| p.line());
        let reason = describe_csv_error(&e);
        match e.into_kind() {
            csv::ErrorKind::Io(source) => DataError::Io { path: path.to_path_buf(), source },
            _ => DataError::MalformedCsv { path: path.to_path_buf(), line, reason },
        }
    };
    let header: Vec<String> = reader.headers().map_err(malformed)?.iter().map(str::to_string).collect();
    let Some(target_col) = header.iter().position(|h| *h == options.target) else {
        return Err(DataError::MissingColumn {
            path: path.to_path_buf(),
            column: options.target.clone(),
            available: header,
        });
    };
    let feature_cols: Vec<usize> = (0..header.len()).filter(|&c| c != target_col).collect();
    if feature_cols.is_empty() {
        return Err(DataError::InvalidConfig(format!(
            "{}: the target `{}` is the only column; there are no features to learn from",
            path.display(),
            options.target
        )));
    }
    let mut features = Vec::new();
    let mut targets: Vec<(u64, String)> = Vec::new();
    for record in reader.records() {
        let record = record.map_err(malformed)?;
        let line = record.position().map_or(0, |p| p.line());
        for &c in &feature_cols {
            let value = record.get(c).unwrap_or("");
            match value.parse::<f64>() {
                Ok(x) if x.is_finite() => features.push(x as f32),
                _ => {
                    return Err(DataError::NonNumericFeature {
                        path: path.to_path_buf(),
                        line,
                        column: header[c].clone(),
                        column_number: c + 1,
                        value: value.to_string(),
                    });
                }
            }
        }
        targets.push((line, record.get(target_col).unwrap_or("").to_string()));
    }
    if targets.is_empty() {
        return Err(DataError::EmptyCsv { path: path.to_path_buf() });
    }
    let (labels, class_names) = classes(path, &options.target, &targets)?;
    let num_features = feature_cols.len();
    let split = stratified_split(&labels, options.val_split, options.seed)?;
    let rows = |idx: &[usize]| -> (Vec<f32>, Vec<u32>) {
        let mut f = Vec::with_capacity(idx.len() * num_features);
        for &i in idx {
            f.extend_from_slice(&features[i * num_features..(i + 1) * num_features]);
        }
        (f, idx.iter().map(|&i| labels[i]).collect())
    };
    let (train_rows, train_labels) = rows(&split.train);
    let (val_rows, val_labels) = rows(&split.val);
    let standardization = Standardization::fit(&train_rows, num_features);
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let train = TabularClassification::new(
        &name,
        train_rows,
        train_labels,
        num_features,
        class_names.clone(),
        standardization.clone(),
    )?;
    let val = TabularClassification::new(&name, val_rows, val_labels, num_features, class_names, standardization)?;
    Ok(CsvTable {
        train,
        val,
        path: path.to_path_buf(),
        target: options.target.clone(),
        feature_names: feature_cols.iter().map(|&c| header[c].clone()).collect(),
    })
}

/// Labels and sorted class names of the target values `(line, value)`: integer classes if every
/// value is a whole number, text classes otherwise.
fn classes(path: &Path, column: &str, targets: &[(u64, String)]) -> Result<(Vec<u32>, Vec<String>), DataError> {
    let not_a_class = |line: u64, value: &str| DataError::NotAClass {
        path: path.to_path_buf(),
        line,
        column: column.to_string(),
        value: value.to_string(),
    };
    if let Some((line, value)) = targets.iter().find(|(_, v)| v.is_empty()) {
        return Err(not_a_class(*line, value));
    }
    let numbers: Option<Vec<f64>> = targets.iter().map(|(_, v)| v.parse::<f64>().ok()).collect();
    let (labels, names) = match numbers {
        Some(numbers) => {
            // All numeric: each must be a whole number (a fraction means regression).
            let mut ints = Vec::with_capacity(numbers.len());
            for (x, (line, value)) in numbers.iter().zip(targets) {
                if !x.is_finite() || x.fract() != 0.0 || x.abs() > 2f64.powi(53) {
                    return Err(not_a_class(*line, value));
                }
                ints.push(*x as i64);
            }
            let mut distinct = ints.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let labels = ints.iter().map(|i| distinct.binary_search(i).map_or(0, |k| k as u32)).collect();
            (labels, distinct.iter().map(i64::to_string).collect::<Vec<_>>())
        }
        None => {
            let mut distinct: Vec<&str> = targets.iter().map(|(_, v)| v.as_str()).collect();
            distinct.sort_unstable();
            distinct.dedup();
            let labels =
                targets.iter().map(|(_, v)| distinct.binary_search(&v.as_str()).map_or(0, |k| k as u32)).collect();
            (labels, distinct.iter().map(|s| s.to_string()).collect())
        }
    };
    if names.len() < 2 {
        return Err(DataError::OneTargetClass {
            path: path.to_path_buf(),
            column: column.to_string(),
            class: names.first().cloned().unwrap_or_default(),
        });
    }
    Ok((labels, names))
}

fn describe_csv_error(e: &csv::Error) -> String {
    match e.kind() {
        csv::ErrorKind::UnequalLengths { expected_len, len, .. } => {
            format!("this row has {len} fields but the header has {expected_len}")
        }
        csv::ErrorKind::Utf8 { .. } => "the file is not valid UTF-8".to_string(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(values: &[&str]) -> Vec<(u64, String)> {
        values.iter().enumerate().map(|(i, v)| (i as u64 + 2, v.to_string())).collect()
    }

    #[test]
    fn integer_and_text_classes() {
        let p = Path::new("t.csv");
        let (labels, names) = classes(p, "y", &targets(&["10", "2", "10", "-1"])).unwrap();
        assert_eq!(names, ["-1", "2", "10"]);
        assert_eq!(labels, [2, 1, 2, 0]);
        let (labels, names) = classes(p, "y", &targets(&["b", "a", "1"])).unwrap();
        assert_eq!(names, ["1", "a", "b"]);
        assert_eq!(labels, [2, 1, 0]);
        assert!(matches!(classes(p, "y", &targets(&["1", "2.5"])), Err(DataError::NotAClass { line: 3, .. })));
        assert!(matches!(classes(p, "y", &targets(&["1", ""])), Err(DataError::NotAClass { line: 3, .. })));
        assert!(matches!(classes(p, "y", &targets(&["3", "3.0"])), Err(DataError::OneTargetClass { .. })));
    }
}
