//! Variable-length sequences in one batch without computing on padding: PyTorch's
//! `PackedSequence`, `pack_padded_sequence`, `pad_packed_sequence` and `pack_sequence`
//! (`torch.nn.utils.rnn`), with the same layout so a recurrent layer runs each time step on
//! exactly the sequences still going.
//!
//! A packed batch is time-major rows: step `t` holds one row for each of the `batch_sizes[t]`
//! longest sequences, in order of decreasing length. Packing sorts the batch by length (unless
//! `enforce_sorted`, which requires sorted lengths) and remembers the permutation, so
//! `pad_packed_sequence` and the layers' final states come back in the caller's order.
//! Packing and unpacking are one `index_select` each (differentiable, on every device, `meta`
//! included: lengths and indices are host values, as PyTorch keeps them on the CPU).
//!
//! Unlike PyTorch, a `PackedSequence` made by [`pack_padded_sequence`] remembers whether its
//! source was batch-first, and a layer built with the other `batch_first` refuses it: the
//! mismatch is almost always a bug in the data pipeline that PyTorch lets through.

use ferrite_tensor::Tensor;

use crate::error::{NnError, Result};

/// A batch of variable-length sequences packed time-major (see the module documentation).
#[derive(Clone, Debug)]
pub struct PackedSequence {
    data: Tensor,
    batch_sizes: Vec<usize>,
    sorted_indices: Option<Vec<usize>>,
    unsorted_indices: Option<Vec<usize>>,
    batch_first: Option<bool>,
}

impl PackedSequence {
    /// A packed batch from its parts, checked: `data [rows, *]`, `batch_sizes` positive,
    /// never increasing and summing to `rows`, and `sorted_indices` (`sorted_indices[j]` is the
    /// caller's index of the `j`-th longest sequence) a permutation of the batch, or `None` when
    /// the batch is already in that order.
    pub fn new(data: Tensor, batch_sizes: Vec<usize>, sorted_indices: Option<Vec<usize>>) -> Result<PackedSequence> {
        let rows = data.shape().first().copied().unwrap_or(0);
        let sorted_ok = batch_sizes.windows(2).all(|w| w[1] <= w[0]);
        if data.rank() == 0
            || batch_sizes.is_empty()
            || batch_sizes.contains(&0)
            || !sorted_ok
            || batch_sizes.iter().sum::<usize>() != rows
        {
            return Err(NnError::InvalidBatchSizes { batch_sizes, rows });
        }
        let unsorted_indices = match &sorted_indices {
            None => None,
            Some(s) => Some(invert(s, batch_sizes[0])?),
        };
        Ok(PackedSequence { data, batch_sizes, sorted_indices, unsorted_indices, batch_first: None })
    }

    /// The packed rows `[rows, *]`.
    pub fn data(&self) -> &Tensor {
        &self.data
    }

    /// How many sequences take part in each time step.
    pub fn batch_sizes(&self) -> &[usize] {
        &self.batch_sizes
    }

    /// `sorted_indices[j]`: the caller's index of the `j`-th longest sequence (`None` when the
    /// batch was packed in that order already).
    pub fn sorted_indices(&self) -> Option<&[usize]> {
        self.sorted_indices.as_deref()
    }

    /// The inverse permutation: `unsorted_indices[b]` is the packed position of sequence `b`.
    pub fn unsorted_indices(&self) -> Option<&[usize]> {
        self.unsorted_indices.as_deref()
    }

    /// The layout of the padded tensor this was packed from (`None` when packed from a list,
    /// which fits either).
    pub fn batch_first(&self) -> Option<bool> {
        self.batch_first
    }

    /// Number of sequences.
    pub fn batch(&self) -> usize {
        self.batch_sizes[0]
    }

    /// Each sequence's length, in the caller's order.
    pub fn lengths(&self) -> Vec<usize> {
        let sorted: Vec<usize> =
            (0..self.batch()).map(|j| self.batch_sizes.iter().take_while(|&&b| b > j).count()).collect();
        match &self.unsorted_indices {
            Some(u) => u.iter().map(|&j| sorted[j]).collect(),
            None => sorted,
        }
    }

    /// The same batch structure with other data (`[rows, *]` with the same number of rows),
    /// e.g. after an elementwise op or a layer applied to `data()`.
    pub fn with_data(&self, data: Tensor) -> Result<PackedSequence> {
        let rows: usize = self.batch_sizes.iter().sum();
        if data.shape().first() != Some(&rows) {
            return Err(NnError::InvalidBatchSizes { batch_sizes: self.batch_sizes.clone(), rows: data.shape()[0] });
        }
        Ok(PackedSequence { data, ..self.clone() })
    }

    /// `sorted_indices` as an int64 tensor on the data's device.
    pub(crate) fn sorted_tensor(&self) -> Result<Option<Tensor>> {
        self.sorted_indices.as_ref().map(|s| index_tensor(s.iter().copied(), &self.data)).transpose()
    }

    /// `unsorted_indices` as an int64 tensor on the data's device.
    pub(crate) fn unsorted_tensor(&self) -> Result<Option<Tensor>> {
        self.unsorted_indices.as_ref().map(|s| index_tensor(s.iter().copied(), &self.data)).transpose()
    }
}

fn index_tensor(idx: impl Iterator<Item = usize>, like: &Tensor) -> Result<Tensor> {
    let v: Vec<i64> = idx.map(|i| i as i64).collect();
    let n = v.len();
    Ok(Tensor::from_vec(v, &[n], like.device())?)
}

fn invert(sorted: &[usize], batch: usize) -> Result<Vec<usize>> {
    let mut inv = vec![usize::MAX; batch];
    if sorted.len() != batch {
        return Err(NnError::InvalidIndices { indices: sorted.to_vec(), batch });
    }
    for (j, &b) in sorted.iter().enumerate() {
        if b >= batch || inv[b] != usize::MAX {
            return Err(NnError::InvalidIndices { indices: sorted.to_vec(), batch });
        }
        inv[b] = j;
    }
    Ok(inv)
}

/// The order of the sequences by decreasing length (stable), or `None` when `enforce_sorted`
/// (after checking that they are sorted).
fn sort_order(op: &'static str, lengths: &[usize], enforce_sorted: bool) -> Result<Option<Vec<usize>>> {
    if enforce_sorted {
        if lengths.windows(2).any(|w| w[1] > w[0]) {
            return Err(NnError::UnsortedLengths { op, lengths: lengths.to_vec() });
        }
        return Ok(None);
    }
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]));
    Ok(Some(order))
}

/// `batch_sizes[t]`: how many of the (sorted) lengths exceed `t`.
fn batch_sizes(sorted_lengths: &[usize]) -> Vec<usize> {
    let longest = sorted_lengths.first().copied().unwrap_or(0);
    (0..longest).map(|t| sorted_lengths.iter().take_while(|&&l| l > t).count()).collect()
}

/// Pack a padded batch (PyTorch's `pack_padded_sequence`): `input` is `[seq, batch, *]`, or
/// `[batch, seq, *]` when `batch_first`; `lengths[b]` is sequence `b`'s number of valid steps
/// (each in `1..=seq`). With `enforce_sorted` the lengths must already decrease; otherwise the
/// batch is sorted and the permutation kept, so results come back in the caller's order.
///
/// ```
/// use ferrite_nn::{pack_padded_sequence, pad_packed_sequence};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> ferrite_nn::Result<()> {
/// // Two sequences, batch-first, padded to 3 steps: [1, 2, 0] (length 2) and [3, 4, 5].
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 0.0, 3.0, 4.0, 5.0], &[2, 3, 1], &Device::Cpu)?;
/// let packed = pack_padded_sequence(&x, &[2, 3], true, false)?;
/// assert_eq!(packed.batch_sizes(), [2, 2, 1]);
/// assert_eq!(packed.data().to_vec::<f32>()?, vec![3.0, 1.0, 4.0, 2.0, 5.0]); // time-major, longest first
/// let (padded, lengths) = pad_packed_sequence(&packed, true, -1.0, None)?;
/// assert_eq!(lengths, vec![2, 3]);
/// assert_eq!(padded.to_vec::<f32>()?, vec![1.0, 2.0, -1.0, 3.0, 4.0, 5.0]);
/// # Ok(()) }
/// ```
pub fn pack_padded_sequence(
    input: &Tensor,
    lengths: &[usize],
    batch_first: bool,
    enforce_sorted: bool,
) -> Result<PackedSequence> {
    const OP: &str = "pack_padded_sequence";
    if input.rank() < 2 {
        let names: &'static [&'static str] = if batch_first { &["batch", "seq", "*"] } else { &["seq", "batch", "*"] };
        return Err(ferrite_tensor::TensorError::InvalidShape {
            op: OP,
            arg: "input",
            shape: input.shape().to_vec(),
            expected: ferrite_tensor::ExpectedShape::Named(names),
        }
        .into());
    }
    let (bd, td) = if batch_first { (0, 1) } else { (1, 0) };
    let (batch, steps) = (input.shape()[bd], input.shape()[td]);
    if lengths.len() != batch {
        return Err(NnError::LengthsCount { op: OP, lengths: lengths.len(), batch, shape: input.shape().to_vec() });
    }
    if batch == 0 {
        return Err(NnError::NoSequences { op: OP });
    }
    for (index, &length) in lengths.iter().enumerate() {
        if length == 0 {
            return Err(NnError::EmptySequence { op: OP, what: "sequence", index });
        }
        if length > steps {
            return Err(NnError::LengthTooLong { op: OP, index, length, steps, shape: input.shape().to_vec() });
        }
    }
    let order = sort_order(OP, lengths, enforce_sorted)?;
    let original = |j: usize| order.as_ref().map_or(j, |o| o[j]);
    let sorted_lengths: Vec<usize> = (0..batch).map(|j| lengths[original(j)]).collect();
    let sizes = batch_sizes(&sorted_lengths);
    // Row (t, j) of the packed data is row `original(j) * steps + t` (batch-first) or
    // `t * batch + original(j)` of the input flattened to [batch * seq, *].
    let mut rows = Vec::with_capacity(sizes.iter().sum());
    for (t, &bs) in sizes.iter().enumerate() {
        for j in 0..bs {
            rows.push(if batch_first { original(j) * steps + t } else { t * batch + original(j) });
        }
    }
    let mut flat_shape = vec![batch * steps];
    flat_shape.extend_from_slice(&input.shape()[2..]);
    let flat = input.reshape_usize(&flat_shape)?;
    let data = flat.index_select(0, &index_tensor(rows.into_iter(), input)?)?;
    let mut packed = PackedSequence::new(data, sizes, order)?;
    packed.batch_first = Some(batch_first);
    Ok(packed)
}

/// Pack a list of sequences `[len_i, *]` (PyTorch's `pack_sequence`); with `enforce_sorted`
/// they must be given longest first.
pub fn pack_sequence(sequences: &[Tensor], enforce_sorted: bool) -> Result<PackedSequence> {
    const OP: &str = "pack_sequence";
    if sequences.is_empty() {
        return Err(NnError::NoSequences { op: OP });
    }
    let mut lengths = Vec::with_capacity(sequences.len());
    for (index, s) in sequences.iter().enumerate() {
        let len = s.shape().first().copied().unwrap_or(0);
        if s.rank() == 0 || len == 0 {
            return Err(NnError::EmptySequence { op: OP, what: "sequence", index });
        }
        lengths.push(len);
    }
    let order = sort_order(OP, &lengths, enforce_sorted)?;
    let original = |j: usize| order.as_ref().map_or(j, |o| o[j]);
    let mut starts = Vec::with_capacity(lengths.len());
    let mut s = 0;
    for &l in &lengths {
        starts.push(s);
        s += l;
    }
    let sorted_lengths: Vec<usize> = (0..lengths.len()).map(|j| lengths[original(j)]).collect();
    let sizes = batch_sizes(&sorted_lengths);
    let mut rows = Vec::with_capacity(s);
    for (t, &bs) in sizes.iter().enumerate() {
        for j in 0..bs {
            rows.push(starts[original(j)] + t);
        }
    }
    let refs: Vec<&Tensor> = sequences.iter().collect();
    let all = Tensor::cat(&refs, 0)?;
    let data = all.index_select(0, &index_tensor(rows.into_iter(), &all)?)?;
    PackedSequence::new(data, sizes, order)
}

/// Unpack to a padded batch (PyTorch's `pad_packed_sequence`): `[seq, batch, *]`, or
/// `[batch, seq, *]` when `batch_first`, in the caller's sequence order, `seq` being
/// `total_length` (at least the longest length) or the longest length; positions past a
/// sequence's end hold `padding_value`. Returns the padded tensor and the lengths.
pub fn pad_packed_sequence(
    sequence: &PackedSequence,
    batch_first: bool,
    padding_value: f64,
    total_length: Option<usize>,
) -> Result<(Tensor, Vec<usize>)> {
    let sizes = &sequence.batch_sizes;
    let longest = sizes.len();
    let steps = total_length.unwrap_or(longest);
    if steps < longest {
        return Err(NnError::TotalLengthTooShort { total_length: steps, longest });
    }
    let data = &sequence.data;
    let batch = sequence.batch();
    let rows = data.shape()[0];
    let feature_shape = data.shape()[1..].to_vec();
    // One padding row after the data; every padded position picks a data row or that one.
    let mut pad_shape = vec![1];
    pad_shape.extend_from_slice(&feature_shape);
    let pad = Tensor::full(&pad_shape, padding_value, data.dtype(), data.device())?;
    let extended = Tensor::cat(&[data, &pad], 0)?;
    let mut offsets = Vec::with_capacity(longest);
    let mut o = 0;
    for &bs in sizes {
        offsets.push(o);
        o += bs;
    }
    let packed_pos = |b: usize| sequence.unsorted_indices.as_ref().map_or(b, |u| u[b]);
    let row = |t: usize, b: usize| {
        let j = packed_pos(b);
        if t < longest && j < sizes[t] { offsets[t] + j } else { rows }
    };
    let mut idx = Vec::with_capacity(batch * steps);
    if batch_first {
        for b in 0..batch {
            for t in 0..steps {
                idx.push(row(t, b));
            }
        }
    } else {
        for t in 0..steps {
            for b in 0..batch {
                idx.push(row(t, b));
            }
        }
    }
    let picked = extended.index_select(0, &index_tensor(idx.into_iter(), data)?)?;
    let mut shape = if batch_first { vec![batch, steps] } else { vec![steps, batch] };
    shape.extend_from_slice(&feature_shape);
    Ok((picked.reshape_usize(&shape)?, sequence.lengths()))
}
