//! The one error type of `ferrite-io`.
//!
//! Checkpoint files come from other people, other tools and crashed processes, so every way a file
//! can be wrong has a variant that says what was found, where, and what to do about it. Nothing in
//! this crate panics or allocates on a size it read from a file before checking it against the
//! bytes that are really there.

use std::path::PathBuf;

/// Everything that can go wrong reading or writing checkpoints.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The operating system refused a read, write, rename or sync.
    #[error("{op} `{}` failed: {source}", path.display())]
    Os {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A path that names a directory, pipe, socket or device where a file is needed. Checked
    /// before opening, so the user reads what the path is rather than the operating system's
    /// complaint about memory-mapping it ("No such device").
    #[error("`{}` is a {found}, not a file; pass the path of a file{}", path.display(), if *found == "directory" { " (for example one inside that directory)" } else { " (save the data to a file first)" })]
    NotAFile { path: PathBuf, found: &'static str },

    /// The file is not one of the formats this crate reads.
    #[error("`{}` is not a checkpoint ferrite can read: {reason}", path.display())]
    UnknownFormat { path: PathBuf, reason: String },

    /// The zip container of a PyTorch (>= 1.6) file is damaged.
    #[error(
        "the zip container of the PyTorch file is damaged: {reason} (the file may be truncated or corrupted; re-save or re-download it)"
    )]
    Zip { reason: String },

    /// A record the PyTorch format requires is absent.
    #[error("the PyTorch file has no record `{name}` (the file is incomplete or was not written by torch.save)")]
    MissingRecord { name: String },

    /// A zip record is compressed; PyTorch always stores records uncompressed.
    #[error(
        "record `{name}` is compressed ({method}); torch.save stores records uncompressed — re-save the file with torch.save instead of re-zipping it"
    )]
    CompressedRecord { name: String, method: String },

    /// A pickle global that a weights-only state_dict never needs: refused, never imported or run.
    #[error(
        "refused to load `{module}.{name}`: {reason}. Nothing was executed. Only weights-only checkpoints (tensors, state_dicts, plain containers and numbers) can be loaded; in PyTorch, save `model.state_dict()` rather than the model or custom objects"
    )]
    UnsafeGlobal { module: String, name: String, reason: String },

    /// The pickle stream is malformed or uses an opcode this reader does not accept.
    #[error("invalid pickle data at byte {offset}: {reason}")]
    Pickle { offset: usize, reason: String },

    /// A tensor refers to a storage the file does not contain.
    #[error("tensor refers to storage `{key}`, which the file does not contain")]
    MissingStorage { key: String },

    /// A tensor's shape, strides and offset reach past the end of its storage.
    #[error(
        "tensor{} of shape {shape:?} (strides {strides:?}, offset {offset}) needs {needed} elements but its storage holds {available}; the file is corrupted",
        fmt_name(name)
    )]
    ShapeStorageMismatch {
        name: Option<String>,
        shape: Vec<usize>,
        strides: Vec<usize>,
        offset: usize,
        needed: u128,
        available: usize,
    },

    /// An element type ferrite has no DType for.
    #[error(
        "unsupported element type `{dtype}`{}; ferrite supports float32, float64, float16, bfloat16, int64, int32, uint8 and bool",
        fmt_name(name)
    )]
    UnsupportedDType { dtype: String, name: Option<String> },

    /// A size read from the file is impossible given the bytes present (e.g. a header claiming petabytes).
    #[error("{what} is {claimed} but only {available} are available; the file is truncated or corrupted")]
    SizeExceedsData { what: String, claimed: u128, available: u128 },

    /// A structural limit (nesting, object count) that protects against malicious files.
    #[error("{what} exceeds the limit of {limit}; refusing to continue (malformed or malicious file)")]
    LimitExceeded { what: String, limit: u64 },

    /// The file stores big-endian data.
    #[error("the file stores {byteorder}-endian data; only little-endian checkpoints are supported")]
    ByteOrder { byteorder: String },

    /// A safetensors file is malformed.
    #[error("invalid safetensors file: {reason}")]
    Safetensors { reason: String },

    /// A checkpoint's structure is not what the caller asked for.
    #[error("checkpoint entry `{path}`: {reason}")]
    Structure { path: String, reason: String },

    /// Strict state_dict loading found missing or unexpected keys.
    #[error("{}", incompatible_keys_message(missing, unexpected, hint))]
    IncompatibleKeys { missing: Vec<String>, unexpected: Vec<String>, hint: Option<String> },

    /// A device string (`cpu`, `sim:…`, `meta`, or a PyTorch tag like `cuda:0`) could not be used.
    #[error("cannot place tensor on `{device}`: {reason}")]
    Device { device: String, reason: String },

    /// A pickle is not a PyTorch memory snapshot this reader knows (an unknown layout or version).
    #[error(
        "unsupported PyTorch memory snapshot ({found}): {reason}. ferrite reads the pickles that \
         `torch.cuda.memory._dump_snapshot()` writes in PyTorch 2.0 and later (a dict with \"segments\" \
         and \"device_traces\"); record one with `torch.cuda.memory._record_memory_history(max_entries=100000)` \
         before the step and `torch.cuda.memory._dump_snapshot(\"snap.pickle\")` after it"
    )]
    UnsupportedSnapshot { found: String, reason: String },

    /// A PyTorch memory snapshot has the known layout but a malformed entry.
    #[error("invalid PyTorch memory snapshot at `{path}`: {reason}")]
    InvalidSnapshot { path: String, reason: String },

    /// A directory given as a sharded checkpoint has no index: not a sharded checkpoint, or its
    /// first save never finished (the index is written last, after every rank's shard).
    #[error(
        "`{}` has no index.safetensors index: it is not a sharded checkpoint, or its save did not finish (the index is written last, after every rank's shard); resume from a complete checkpoint",
        dir.display()
    )]
    ShardIndexMissing { dir: PathBuf },

    /// A shard the index lists is not there.
    #[error("shard file `{}` of rank {rank} (of {world_size}) is missing; the sharded checkpoint is incomplete: restore the file or resume from another checkpoint", path.display())]
    ShardMissing { path: PathBuf, rank: usize, world_size: usize },

    /// A shard whose length is not what the index recorded (truncated, or replaced).
    #[error("shard file `{}` of rank {rank} is {found} bytes but the index recorded {expected}: it is truncated or was replaced; restore the file or resume from another checkpoint", path.display())]
    ShardSize { path: PathBuf, rank: usize, expected: u64, found: u64 },

    /// A shard that belongs to another rank, world size or save than its index says.
    #[error("shard file `{}` has {entry} = {found} where the index expects {expected}: it belongs to another save; restore the file or resume from another checkpoint", path.display())]
    ShardMismatch { path: PathBuf, entry: &'static str, expected: String, found: String },

    /// Creating or reading a ferrite `Tensor` failed (e.g. out of memory on the target device).
    #[error("{0}")]
    Tensor(#[from] ferrite_tensor::TensorError),
}

fn fmt_name(name: &Option<String>) -> String {
    match name {
        Some(n) => format!(" `{n}`"),
        None => String::new(),
    }
}

fn quoted_list(keys: &[String]) -> String {
    keys.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(", ")
}

fn incompatible_keys_message(missing: &[String], unexpected: &[String], hint: &Option<String>) -> String {
    // Same wording and order as PyTorch's load_state_dict (missing first), so users recognise it.
    let mut msg = String::from("Error(s) in loading state_dict:");
    if !missing.is_empty() {
        msg.push_str(&format!("\n\tMissing key(s) in state_dict: {}.", quoted_list(missing)));
    }
    if !unexpected.is_empty() {
        msg.push_str(&format!("\n\tUnexpected key(s) in state_dict: {}.", quoted_list(unexpected)));
    }
    if let Some(h) = hint {
        msg.push_str("\n\t");
        msg.push_str(h);
    }
    msg
}

impl IoError {
    pub(crate) fn os(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> IoError {
        IoError::Os { op, path: path.into(), source }
    }

    pub(crate) fn structure(path: impl Into<String>, reason: impl Into<String>) -> IoError {
        IoError::Structure { path: path.into(), reason: reason.into() }
    }

    /// The nesting limit was passed at `depth` levels below the root, inside `path`. The path is
    /// abbreviated: a hostile file's is hundreds of `0/0/0/…` segments long.
    pub(crate) fn too_deep(path: &[String], depth: usize, limit: usize) -> IoError {
        IoError::LimitExceeded {
            what: format!("nesting depth ({depth} levels, at `{}`)", abbreviate_path(path)),
            limit: limit as u64,
        }
    }
}

/// A `/`-joined path short enough for an error message: the first and last
/// [`PATH_ENDS`] segments around `…` when it is longer, each segment cut to [`SEGMENT_CHARS`]
/// characters.
pub(crate) fn abbreviate_path(path: &[String]) -> String {
    let seg = |s: &String| -> String {
        if s.chars().count() <= SEGMENT_CHARS {
            s.clone()
        } else {
            format!("{}…", s.chars().take(SEGMENT_CHARS).collect::<String>())
        }
    };
    let join = |p: &[String]| p.iter().map(seg).collect::<Vec<_>>().join("/");
    if path.len() <= 2 * PATH_ENDS + 1 {
        join(path)
    } else {
        format!("{}/…/{}", join(&path[..PATH_ENDS]), join(&path[path.len() - PATH_ENDS..]))
    }
}

/// Segments kept at each end of an abbreviated path.
const PATH_ENDS: usize = 3;
/// Characters kept of one path segment in an error message.
const SEGMENT_CHARS: usize = 40;

/// Result alias for this crate.
pub type Result<T, E = IoError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_paths_are_abbreviated() {
        let path: Vec<String> = (0..201).map(|i| (i % 7).to_string()).collect();
        let msg = IoError::too_deep(&path, 201, 200).to_string();
        assert!(msg.contains("`0/1/2/…/2/3/4`") && msg.contains("201 levels") && msg.contains("limit of 200"), "{msg}");
        assert!(msg.len() < 200, "{msg}");
        let short: Vec<String> = ["model", "layers", "0"].iter().map(|s| s.to_string()).collect();
        assert_eq!(abbreviate_path(&short), "model/layers/0");
        assert_eq!(abbreviate_path(&["x".repeat(1000)]), format!("{}…", "x".repeat(40)));
    }
}
