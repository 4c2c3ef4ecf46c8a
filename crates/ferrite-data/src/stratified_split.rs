//! A seeded, class-stratified hold-out split (`--val-split FRACTION`), shared by image folders
//! and CSV tables.
//!
//! Why stratified: a user's folder is often small and unbalanced; a plain random split of 60
//! images can leave a class out of validation entirely. Each class gives its own share (rounded,
//! at least one image where the class has two or more, never its last one), as scikit-learn's
//! `train_test_split(stratify=...)` does. The training indices come back in a seeded random
//! order, so that a prefix of them (`--train-subset N`) is a fair sample rather than the first
//! classes of the folder.

use ferrite_tensor::Generator;

use crate::error::DataError;

/// Training and held-out indices into the labels that were split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitIndices {
    /// Shuffled (seeded).
    pub train: Vec<usize>,
    /// Ascending.
    pub val: Vec<usize>,
}

/// Splits `0..labels.len()` holding out `fraction` of each class, drawn with `seed`.
/// `fraction` must be in `(0, 1)`, and at least one sample must end up on each side.
pub fn stratified_split(labels: &[u32], fraction: f64, seed: u64) -> Result<SplitIndices, DataError> {
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(DataError::InvalidConfig(format!(
            "validation split {fraction} must be between 0 and 1 (exclusive), e.g. 0.1"
        )));
    }
    let num_classes = labels.iter().map(|&l| l as usize + 1).max().unwrap_or(0);
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); num_classes];
    for (i, &l) in labels.iter().enumerate() {
        by_class[l as usize].push(i);
    }
    let mut g = Generator::new(seed);
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for members in &mut by_class {
        let n = members.len();
        if n == 0 {
            continue;
        }
        g.shuffle(members);
        let held = if n < 2 { 0 } else { ((n as f64 * fraction).round() as usize).clamp(1, n - 1) };
        val.extend_from_slice(&members[..held]);
        train.extend_from_slice(&members[held..]);
    }
    if val.is_empty() || train.is_empty() {
        return Err(DataError::InvalidConfig(format!(
            "a validation split of {fraction} of {} samples leaves {} for training and {} for validation; both need at least one",
            labels.len(),
            train.len(),
            val.len()
        )));
    }
    val.sort_unstable();
    g.shuffle(&mut train);
    Ok(SplitIndices { train, val })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_gives_its_share_and_the_seed_decides() {
        // 30 of class 0, 10 of class 1, 3 of class 2.
        let labels: Vec<u32> = [vec![0; 30], vec![1; 10], vec![2; 3]].concat();
        let s = stratified_split(&labels, 0.2, 7).unwrap();
        let count = |idx: &[usize], c: u32| idx.iter().filter(|&&i| labels[i] == c).count();
        assert_eq!([count(&s.val, 0), count(&s.val, 1), count(&s.val, 2)], [6, 2, 1]);
        assert_eq!(s.train.len() + s.val.len(), labels.len());
        let mut all: Vec<usize> = s.train.iter().chain(&s.val).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..labels.len()).collect::<Vec<_>>());
        assert_eq!(s, stratified_split(&labels, 0.2, 7).unwrap());
        assert_ne!(s, stratified_split(&labels, 0.2, 8).unwrap());
        // The training order is shuffled, not class by class.
        assert_ne!(s.train.iter().map(|&i| labels[i]).take(10).collect::<Vec<_>>(), vec![0; 10]);
    }

    #[test]
    fn bad_fractions_and_tiny_data_are_errors() {
        for f in [0.0, 1.0, -0.1, f64::NAN] {
            assert!(matches!(stratified_split(&[0, 1, 0, 1], f, 0), Err(DataError::InvalidConfig(_))), "{f}");
        }
        // One sample per class: nothing can be held out.
        assert!(stratified_split(&[0, 1], 0.5, 0).is_err());
        // A class with one sample keeps it for training.
        let s = stratified_split(&[0, 0, 0, 0, 1], 0.5, 0).unwrap();
        assert_eq!(s.val.len(), 2);
        assert!(s.train.contains(&4));
    }
}
