//! Every failure `ferrite-data` can report.
//!
//! A data pipeline fails far from where the user looks: in a worker thread, in the middle of an
//! epoch, inside user code. Each variant therefore carries *where* (which worker, which sample
//! index, which batch) and *what to do*, so the message is actionable without a debugger.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// The error type user code returns from `Dataset::get`, collate functions and transforms.
///
/// Boxed so that any error (`std::io::Error`, a crate's own enum, a `String`) converts with `?`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Which thread ran the user code that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// `num_workers == 0`: samples are fetched on the thread that iterates the loader.
    MainThread,
    /// Background worker with this id (`0..num_workers`).
    Worker(usize),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::MainThread => write!(f, "the main thread (num_workers = 0)"),
            Origin::Worker(id) => write!(f, "worker {id}"),
        }
    }
}

/// Every failure of datasets, samplers and loaders.
#[derive(Debug, Error)]
pub enum DataError {
    /// `Dataset::get` returned an error.
    #[error("{origin} failed to load sample index {index} (batch {batch}): {source}")]
    SampleFailed {
        origin: Origin,
        index: usize,
        batch: usize,
        #[source]
        source: BoxError,
    },
    /// `Dataset::get` panicked; the panic was caught so the loader could report it.
    #[error("{origin} panicked while loading sample index {index} (batch {batch}): {message}")]
    SamplePanicked { origin: Origin, index: usize, batch: usize, message: String },
    /// The collate function (or the device staging step) returned an error.
    #[error("{origin} failed to {step} batch {batch}: {source}")]
    BatchFailed {
        origin: Origin,
        batch: usize,
        step: BatchStep,
        #[source]
        source: BoxError,
    },
    /// The collate function (or the device staging step) panicked.
    #[error("{origin} panicked while trying to {step} batch {batch}: {message}")]
    BatchPanicked { origin: Origin, batch: usize, step: BatchStep, message: String },
    /// An iterable dataset's stream returned an error or panicked.
    #[error("{origin} failed on item {item} of its stream: {message}")]
    StreamFailed { origin: Origin, item: usize, message: String, source: Option<BoxError> },
    /// A worker thread ended without reporting a result. User code panics are caught, so this
    /// means the thread was killed by something outside the loader's control.
    #[error("worker {worker} exited unexpectedly while batch {batch} was pending; the epoch cannot complete")]
    WorkerDied { worker: usize, batch: usize },
    /// No batch arrived within the loader's `timeout`.
    #[error(
        "timed out after {waited:?} waiting for batch {batch} from the workers (timeout set with `.timeout(..)`); a dataset `get` may be blocked"
    )]
    Timeout { batch: usize, waited: Duration },
    /// A loader or sampler configuration that cannot work.
    #[error("invalid data loader configuration: {0}")]
    InvalidConfig(String),
    /// A sampler produced an index outside the dataset.
    #[error("sampler produced index {index} but the dataset has {len} samples")]
    IndexOutOfRange { index: usize, len: usize },
    /// A sample drew more random words than its stream holds (see `seeding`).
    #[error(
        "{stream} drew {drawn} random 32-bit words, more than the {limit} its stream holds; draw less per sample or derive a sub-generator with `Generator::new(rng.next_u64())`"
    )]
    RandomStreamOverrun { stream: String, drawn: u128, limit: u128 },
    /// A data file the dataset needs is not on this machine.
    #[error(
        "{dataset}: {path} not found; install the Debian package `{package}` (`apt-get install {package}`){}",
        env_hint(env_var)
    )]
    DatasetMissing { dataset: &'static str, path: PathBuf, package: &'static str, env_var: Option<&'static str> },
    /// Reading a file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An IDX file (the MNIST/Fashion-MNIST container format) is malformed.
    #[error("{path} is not a valid IDX file: {reason}")]
    InvalidIdx { path: PathBuf, reason: String },
    /// An IDX file is shorter than its header says.
    #[error(
        "{path} is truncated: the header announces {expected} data bytes but only {actual} follow; re-install the file"
    )]
    TruncatedIdx { path: PathBuf, expected: u64, actual: u64 },
    /// Image and label files do not describe the same samples.
    #[error("{dataset}: {images} images but {labels} labels; the files do not belong together")]
    LengthMismatch { dataset: String, images: usize, labels: usize },
    /// A label outside the dataset's classes.
    #[error("{dataset}: sample {index} has label {label}, expected 0..{num_classes}")]
    BadLabel { dataset: String, index: usize, label: u64, num_classes: usize },
    /// A malformed line of the embedded digits CSV.
    #[error("digits data, line {line}: {reason}")]
    BadCsv { line: usize, reason: String },
    /// A text file that is not valid UTF-8.
    #[error(
        "{path} is not valid UTF-8 (first invalid byte at offset {offset}); the character-level dataset needs UTF-8 text"
    )]
    NotUtf8 { path: PathBuf, offset: usize },
    /// A text too short for even one training sequence.
    #[error(
        "{path} has {chars} characters, fewer than one sequence of {needed} (seq_len + 1); use a shorter seq_len or a longer text"
    )]
    TextTooShort { path: PathBuf, chars: usize, needed: usize },
    /// An image folder without class subfolders.
    #[error(
        "{path} has no class subfolders; an image folder holds one subfolder per class (e.g. {path}/cat/1.png, {path}/dog/2.png), or train/ and val/ folders laid out that way"
    )]
    NoClasses { path: PathBuf },
    /// An image folder with a single class: nothing to tell apart.
    #[error(
        "{path} has only one class subfolder (`{class}`); a classifier needs at least two classes, one subfolder each"
    )]
    OneClass { path: PathBuf, class: String },
    /// A class subfolder (or a whole split) without any image file.
    #[error("{path} holds no image files (.png, .jpg, .jpeg, .bmp){}", class.as_ref().map(|c| format!(" for class `{c}`")).unwrap_or_default())]
    NoImages { path: PathBuf, class: Option<String> },
    /// A validation/test split with a class the training split does not have.
    #[error(
        "{path} is class `{class}`, which the training folder {train} does not have; the splits must share their class subfolders"
    )]
    UnknownSplitClass { path: PathBuf, class: String, train: PathBuf },
    /// An image file that cannot be decoded.
    #[error("{path} is not a readable image: {reason} (pass --skip-bad-files to skip such files)")]
    CorruptImage { path: PathBuf, reason: String },
    /// Images of different sizes and no size to resize them to.
    #[error(
        "images differ in size: {first} is {}x{} but {other} is {}x{}; resize them all with --image-size N",
        first_size.0, first_size.1, other_size.0, other_size.1
    )]
    MixedImageSizes { first: PathBuf, first_size: (u32, u32), other: PathBuf, other_size: (u32, u32) },
    /// A CSV file the parser rejects (unequal row lengths, bad quoting, not UTF-8).
    #[error("{path}, line {line}: {reason}")]
    MalformedCsv { path: PathBuf, line: u64, reason: String },
    /// A CSV with a header and no data rows.
    #[error("{path} has a header but no data rows")]
    EmptyCsv { path: PathBuf },
    /// A CSV feature that is not a number.
    #[error(
        "{path}, line {line}, column `{column}` (column {column_number}): `{value}` is not a finite number; every column but the target must be numeric"
    )]
    NonNumericFeature { path: PathBuf, line: u64, column: String, column_number: usize, value: String },
    /// The `--target` column is not in the CSV header.
    #[error("{path} has no column `{column}`; its columns are: {}", available.join(", "))]
    MissingColumn { path: PathBuf, column: String, available: Vec<String> },
    /// A target column whose values are not classes (fractional numbers, or empty).
    #[error(
        "{path}, line {line}, target column `{column}`: `{value}` is not a class; classification needs integer or text labels (regression is not supported)"
    )]
    NotAClass { path: PathBuf, line: u64, column: String, value: String },
    /// A target column with a single class.
    #[error("target column `{column}` of {path} holds only one class (`{class}`); a classifier needs at least two")]
    OneTargetClass { path: PathBuf, column: String, class: String },
    /// A folder given as a text corpus without any `.txt` file.
    #[error("{path} holds no .txt files; give a text file, or a folder of .txt files")]
    NoTextFiles { path: PathBuf },
    /// A `tokenizer.json` the `tokenizers` library cannot read.
    #[error(
        "{path} is not a tokenizer file `tokenizers` can read: {reason}; give the model folder's tokenizer.json as written by `save_pretrained`"
    )]
    BadTokenizer { path: PathBuf, reason: String },
    /// Text the tokenizer failed on (encoding or decoding).
    #[error("the tokenizer failed on {what}: {reason}")]
    Tokenize { what: String, reason: String },
    /// A JSON Lines file with a line that is not a JSON object with the expected text field.
    #[error("{path}, line {line}: {reason}")]
    BadJsonl { path: PathBuf, line: usize, reason: String },
    /// Tokenized text shorter than one block.
    #[error("{what} has {tokens} tokens, fewer than one block of {needed}; use a smaller --seq or more text")]
    TooFewTokens { what: String, tokens: usize, needed: usize },
    /// An unknown built-in dataset name.
    #[error("unknown dataset `{0}`; available: digits, fashion-mnist")]
    UnknownDataset(String),
}

/// The per-batch step that failed, for [`DataError::BatchFailed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchStep {
    Collate,
    StageToDevice,
}

impl fmt::Display for BatchStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BatchStep::Collate => "collate",
            BatchStep::StageToDevice => "move to the device",
        })
    }
}

impl DataError {
    /// The worker a failure came from, if it came from one.
    pub fn origin(&self) -> Option<Origin> {
        match self {
            DataError::SampleFailed { origin, .. }
            | DataError::SamplePanicked { origin, .. }
            | DataError::BatchFailed { origin, .. }
            | DataError::BatchPanicked { origin, .. }
            | DataError::StreamFailed { origin, .. } => Some(*origin),
            DataError::WorkerDied { worker, .. } => Some(Origin::Worker(*worker)),
            _ => None,
        }
    }

    /// The dataset index whose loading failed, if the failure concerns one sample.
    pub fn sample_index(&self) -> Option<usize> {
        match self {
            DataError::SampleFailed { index, .. } | DataError::SamplePanicked { index, .. } => Some(*index),
            _ => None,
        }
    }
}

fn env_hint(env_var: &Option<&'static str>) -> String {
    env_var.map(|v| format!(" or set {v} to a directory holding the files")).unwrap_or_default()
}

/// Turn a caught panic payload into the message the user wrote.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_worker_and_index() {
        let e = DataError::SamplePanicked { origin: Origin::Worker(1), index: 37, batch: 4, message: "boom".into() };
        let s = e.to_string();
        assert!(s.contains("worker 1") && s.contains("index 37") && s.contains("batch 4") && s.contains("boom"), "{s}");
        assert_eq!(e.origin(), Some(Origin::Worker(1)));
        assert_eq!(e.sample_index(), Some(37));
    }

    #[test]
    fn panic_payloads_become_messages() {
        let p = std::panic::catch_unwind(|| panic!("static")).unwrap_err();
        assert_eq!(panic_message(&*p), "static");
        let n = 3;
        let p = std::panic::catch_unwind(|| panic!("formatted {n}")).unwrap_err();
        assert_eq!(panic_message(&*p), "formatted 3");
    }
}
