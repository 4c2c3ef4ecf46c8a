//! How far a strided layout reaches into its storage: arithmetic on plain numbers that both the
//! layout code (validating a view) and the error messages (explaining why a view does not fit)
//! need. It is a leaf of its own so that `error/` can format that message without depending on
//! `layout.rs`, which depends on `error/` for its results; `layout::strided_extent` re-exports it.

/// How many elements of storage a strided layout reaches (one past its last element; 0 when
/// it has no elements), saturating at `u128::MAX` for layouts no storage could hold.
pub fn strided_extent(shape: &[usize], strides: &[usize], offset: usize) -> u128 {
    if shape.contains(&0) {
        return 0;
    }
    let last = shape.iter().zip(strides).fold(0u128, |a, (&d, &s)| a.saturating_add((d as u128 - 1) * s as u128));
    last.saturating_add(offset as u128 + 1)
}
