//! What can be wrong with the input of a recurrent layer or of the packing functions, as values:
//! the layer, the argument and the numbers, so a data pipeline that produced a bad batch can say
//! which sequence was at fault instead of a trainer dying on a panic deep inside a scan.

use thiserror::Error;

/// A bad input to `RNN`/`GRU`/`LSTM` or to `pack_padded_sequence`, `pad_packed_sequence`,
/// `pack_sequence` and `PackedSequence::new`. Messages follow PyTorch's where it has one, then
/// say what to do.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RecurrentError {
    /// The input of a layer has the wrong rank or feature size.
    #[error(
        "{layer}: input has shape {shape:?}, expected a 3-D tensor [{layout}, {input_size}] (or 2-D [seq, {input_size}] for one unbatched sequence); the last dimension must be input_size = {input_size}"
    )]
    InputShape { layer: &'static str, shape: Vec<usize>, layout: &'static str, input_size: usize },
    /// A packed input whose data does not hold `input_size` features per row.
    #[error(
        "{layer}: the PackedSequence's data has shape {shape:?}, expected [rows, {input_size}] (input_size = {input_size})"
    )]
    PackedShape { layer: &'static str, shape: Vec<usize>, input_size: usize },
    /// An initial state of the wrong shape.
    #[error(
        "{layer}: {arg} has shape {shape:?}, expected {expected:?} (num_layers * num_directions, batch, hidden_size); pass None to start from zeros"
    )]
    StateShape { layer: &'static str, arg: &'static str, shape: Vec<usize>, expected: Vec<usize> },
    /// A packed input packed from a tensor of the other layout than the layer's.
    #[error(
        "{layer}: the PackedSequence was packed from a {} tensor, but the layer has batch_first = {layer_batch_first}; pack with batch_first = {layer_batch_first} or build the layer with batch_first = {packed_batch_first}",
        if *packed_batch_first { "batch-first ([batch, seq, ..])" } else { "sequence-first ([seq, batch, ..])" }
    )]
    PackedLayout { layer: &'static str, packed_batch_first: bool, layer_batch_first: bool },
    /// A sequence of zero steps (time steps must be > 0 for an RNN).
    #[error(
        "{op}: {what} must have at least one step, but {what} {index} has length 0; drop empty sequences from the batch before packing"
    )]
    EmptySequence { op: &'static str, what: &'static str, index: usize },
    /// Nothing to pack or run.
    #[error("{op}: expected at least one sequence, got none")]
    NoSequences { op: &'static str },
    /// `lengths` has a different count than the batch.
    #[error(
        "{op}: `lengths` has {lengths} entries but the input holds {batch} sequences (input shape {shape:?}); pass one length per sequence"
    )]
    LengthsCount { op: &'static str, lengths: usize, batch: usize, shape: Vec<usize> },
    /// A length longer than the padded input.
    #[error(
        "{op}: sequence {index} has length {length}, but the padded input has only {steps} steps (input shape {shape:?})"
    )]
    LengthTooLong { op: &'static str, index: usize, length: usize, steps: usize, shape: Vec<usize> },
    /// `enforce_sorted` with lengths that are not in decreasing order.
    #[error(
        "{op}: `lengths` array must be sorted in decreasing order when `enforce_sorted` is true, got {lengths:?}; pass enforce_sorted = false to have them sorted (outputs and final states come back in your order)"
    )]
    UnsortedLengths { op: &'static str, lengths: Vec<usize> },
    /// `total_length` shorter than the longest sequence.
    #[error(
        "pad_packed_sequence: expected total_length to be at least the length of the longest sequence in input, but got total_length = {total_length} and max sequence length being {longest}"
    )]
    TotalLengthTooShort { total_length: usize, longest: usize },
    /// A `PackedSequence` built by hand whose batch sizes do not describe its data.
    #[error(
        "PackedSequence: batch_sizes {batch_sizes:?} must be positive, never increase and sum to the data's {rows} rows"
    )]
    InvalidBatchSizes { batch_sizes: Vec<usize>, rows: usize },
    /// A `PackedSequence` built by hand whose `sorted_indices` is not a permutation of its batch.
    #[error("PackedSequence: sorted_indices {indices:?} is not a permutation of 0..{batch}")]
    InvalidIndices { indices: Vec<usize>, batch: usize },
}
