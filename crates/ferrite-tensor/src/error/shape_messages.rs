//! Sentences for the shape errors whose wording depends on the values they carry (which
//! dimension fails to broadcast, why a reshape spec is invalid, …). They are computed when the
//! error is displayed, from the fields alone, so the fields are the whole truth about the error.

use std::fmt::Write as _;

/// The first dimension (index into the broadcast shape) where `a` and `b` disagree.
fn broadcast_conflict(a: &[usize], b: &[usize]) -> Option<(usize, usize, usize)> {
    let n = a.len().max(b.len());
    (0..n).find_map(|i| {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        (da != db && da != 1 && db != 1).then_some((i, da, db))
    })
}

pub(crate) fn broadcast(lhs: &[usize], rhs: &[usize]) -> String {
    match broadcast_conflict(lhs, rhs) {
        Some((i, da, db)) => format!(
            "shapes {lhs:?} and {rhs:?} cannot be broadcast: the size of dimension {i} ({da}) must match ({db}) or one of them must be 1; reshape or unsqueeze an operand so that its trailing sizes line up"
        ),
        None => format!("shapes {lhs:?} and {rhs:?} cannot be broadcast"),
    }
}

pub(crate) fn expand(shape: &[usize], target: &[usize]) -> String {
    if shape.len() > target.len() {
        return format!(
            "cannot expand shape {shape:?} to {target:?}: the target has fewer dimensions; only size-1 dimensions can be expanded and dimensions are never removed"
        );
    }
    let lead = target.len() - shape.len();
    let bad = shape.iter().enumerate().find(|&(i, &d)| d != 1 && d != target[lead + i]);
    match bad {
        Some((i, &d)) => format!(
            "the expanded size of the tensor ({}) must match the existing size ({d}) at non-singleton dimension {}; target sizes {target:?}, tensor sizes {shape:?}; only size-1 dimensions can be expanded",
            target[lead + i],
            lead + i
        ),
        None => format!("cannot expand shape {shape:?} to {target:?}"),
    }
}

pub(crate) fn matmul(lhs: &[usize], rhs: &[usize]) -> String {
    let last2 = |s: &[usize]| match s.len() {
        0 => (1, 1),
        1 => (1, s[0]),
        r => (s[r - 2], s[r - 1]),
    };
    let ((m, k), (k2, n)) = (last2(lhs), last2(rhs));
    format!(
        "mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {k2}x{n}); full shapes {lhs:?} and {rhs:?}: the first operand's last dimension must equal the second's second-to-last"
    )
}

pub(crate) fn reshape(spec: &[i64], numel: usize) -> String {
    if spec.iter().filter(|&&d| d == -1).count() > 1 {
        return format!("shape {spec:?}: only one dimension can be inferred (-1)");
    }
    if let Some(d) = spec.iter().find(|&&d| d < -1) {
        return format!("shape {spec:?}: invalid shape dimension {d} (sizes are >= 0, or -1 for one inferred size)");
    }
    let known = spec.iter().filter(|&&d| d >= 0).try_fold(1usize, |a, &d| a.checked_mul(d as usize));
    match known {
        None => format!("shape {spec:?} overflows: its element count does not fit in usize"),
        Some(_) => format!(
            "shape {spec:?} is invalid for input of size {numel}; the sizes must multiply to {numel} (use -1 for one size to be inferred)"
        ),
    }
}

pub(crate) fn cat(dim: Option<usize>, first: &[usize], index: usize, shape: &[usize]) -> String {
    match dim {
        Some(_) if first.len() != shape.len() => format!(
            "tensors must have the same number of dimensions: tensor 0 has shape {first:?} ({}-D) and tensor {index} has shape {shape:?} ({}-D)",
            first.len(),
            shape.len()
        ),
        Some(d) => {
            let mut s = format!("sizes of tensors must match except in dimension {d}");
            if let Some(k) = (0..first.len()).find(|&k| k != d && first[k] != shape[k]) {
                let _ = write!(s, ": expected size {} but got size {} in dimension {k}", first[k], shape[k]);
            }
            let _ = write!(s, " for tensor number {index} in the list (shapes {first:?} and {shape:?})");
            s
        }
        None => format!(
            "stack expects each tensor to be equal size, but got {first:?} at entry 0 and {shape:?} at entry {index}"
        ),
    }
}

pub(crate) fn permutation(dims: &[usize], rank: usize) -> String {
    if dims.len() != rank {
        format!(
            "number of dims don't match in permute: got {} ({dims:?}) for a tensor of rank {rank}; name every dimension once",
            dims.len()
        )
    } else {
        format!("{dims:?} is not a permutation of 0..{rank}; name every dimension once")
    }
}

pub(crate) fn strides(shape: &[usize], strides: &[usize], offset: usize, storage_elems: usize) -> String {
    if shape.len() != strides.len() {
        return format!(
            "shape {shape:?} and strides {strides:?} have different lengths ({} and {}); give one stride per dimension",
            shape.len(),
            strides.len()
        );
    }
    let needed = crate::extent::strided_extent(shape, strides, offset);
    format!(
        "shape {shape:?}, strides {strides:?} and offset {offset} reach element {needed} but the storage holds {storage_elems}; the view must stay inside its storage"
    )
}

pub(crate) fn range(dim: usize, start: usize, len: usize, step: usize, size: usize) -> String {
    if step == 1 {
        format!(
            "start ({start}) + length ({len}) exceeds dimension size ({size}) of dim {dim}; keep start + length <= {size}"
        )
    } else {
        format!("slice start {start} len {len} step {step} is out of range for dim {dim} of size {size}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_names_the_conflicting_dimension() {
        let m = broadcast(&[2, 3], &[4]);
        assert!(m.contains("dimension 1 (3) must match (4)"), "{m}");
    }

    #[test]
    fn expand_names_the_dimension_or_the_rank() {
        assert!(expand(&[2, 3], &[3]).contains("fewer dimensions"));
        let m = expand(&[3, 1], &[2, 4, 2]);
        assert!(
            m.contains("expanded size of the tensor (4) must match the existing size (3) at non-singleton dimension 1"),
            "{m}"
        );
    }

    #[test]
    fn matmul_reports_the_inner_dimensions() {
        assert!(matmul(&[5, 2, 3], &[4, 6]).contains("(2x3 and 4x6)"));
    }

    #[test]
    fn reshape_says_why() {
        assert!(reshape(&[-1, -1], 4).contains("only one dimension"));
        assert!(reshape(&[-2, 2], 4).contains("invalid shape dimension -2"));
        assert!(reshape(&[i64::MAX, i64::MAX, 4], 4).contains("overflows"));
        assert!(reshape(&[3, 2], 4).contains("invalid for input of size 4"));
    }

    #[test]
    fn cat_and_stack() {
        assert!(cat(Some(0), &[2, 3], 1, &[2]).contains("same number of dimensions"));
        let m = cat(Some(0), &[2, 3], 1, &[2, 4]);
        assert!(m.contains("expected size 3 but got size 4 in dimension 1"), "{m}");
        assert!(cat(None, &[2], 2, &[3]).contains("at entry 2"));
    }

    #[test]
    fn permutation_and_strides_and_ranges() {
        assert!(permutation(&[0], 2).contains("got 1"));
        assert!(permutation(&[0, 0], 2).contains("not a permutation"));
        assert!(strides(&[2], &[1, 1], 0, 4).contains("different lengths"));
        assert!(strides(&[2, 2], &[2, 1], 1, 4).contains("reach element 5 but the storage holds 4"));
        assert!(range(0, 3, 2, 1, 4).contains("start (3) + length (2)"));
        assert!(range(0, 3, 2, 2, 4).contains("step 2"));
    }
}
