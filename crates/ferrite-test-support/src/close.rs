//! Closeness checks: a tensor against PyTorch's expected tensor (within the case's rtol/atol),
//! and f32 slices of two runs that sum in different orders. One definition, so a NaN or a
//! shape mismatch fails every suite the same way.

#[cfg(feature = "tensor")]
use ferrite_tensor::Tensor;

/// The largest |got − want| when every element is within `atol + rtol·|want|`; otherwise `Err`
/// naming the worst element (a NaN on either side counts as the worst possible).
#[cfg(feature = "tensor")]
pub fn check_close(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<f64, String> {
    if got.shape() != want.shape() {
        return Err(format!("{what}: shape {:?}, expected {:?}", got.shape(), want.shape()));
    }
    let g = got.to_vec_f64().map_err(|e| format!("{what}: {e}"))?;
    let w = want.to_vec_f64().map_err(|e| format!("{what}: {e}"))?;
    let mut largest = 0.0f64;
    let mut worst: Option<(usize, f64)> = None;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let d = (a - b).abs();
        let tol = atol + rtol * b.abs();
        if d.is_nan() || d > tol {
            let excess = if d.is_nan() { f64::INFINITY } else { d / tol };
            if worst.is_none_or(|(_, e)| excess > e) {
                worst = Some((i, excess));
            }
        } else {
            largest = largest.max(d);
        }
    }
    match worst {
        None => Ok(largest),
        Some((i, _)) => Err(format!(
            "{what}: element {i} is {} but {} is expected (|diff| {:.3e}, allowed {:.3e})",
            g[i],
            w[i],
            (g[i] - w[i]).abs(),
            atol + rtol * w[i].abs()
        )),
    }
}

/// [`check_close`], panicking with its message; returns the largest |difference|.
#[cfg(feature = "tensor")]
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> f64 {
    check_close(what, got, want, rtol, atol).unwrap_or_else(|e| panic!("{e}"))
}

/// Panics naming the first element where `|got − want| > atol + rtol·|want|` (or a NaN), in f32
/// arithmetic as the values were computed.
pub fn assert_slices_close(what: &str, got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (x, y)) in got.iter().zip(want).enumerate() {
        assert!((x - y).abs() <= atol + rtol * y.abs(), "{what}[{i}]: {x} vs {y}");
    }
}

/// [`assert_slices_close`] over lists of slices (one per parameter), naming the parameter.
pub fn assert_all_close(what: &str, got: &[Vec<f32>], want: &[Vec<f32>], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: parameter count");
    for (i, (x, y)) in got.iter().zip(want).enumerate() {
        assert_slices_close(&format!("{what}: parameter {i}"), x, y, rtol, atol);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_within_tolerance_pass_and_a_nan_fails() {
        assert_slices_close("ok", &[1.0, 2.0], &[1.0, 2.00001], 1e-5, 1e-5);
        let nan = std::panic::catch_unwind(|| assert_slices_close("nan", &[f32::NAN], &[1.0], 1e-5, 1e-5));
        assert!(nan.is_err());
    }
}
