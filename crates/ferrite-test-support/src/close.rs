//! Closeness checks: a tensor against PyTorch's expected tensor (within the case's rtol/atol),
//! and f32 slices of two runs that sum in different orders. One definition, so a NaN or a
//! shape mismatch fails every suite the same way.

#[cfg(feature = "tensor")]
use ferrite_tensor::Tensor;

/// The largest |got − want| when every element is within `atol + rtol·|want|`, else `Err` naming
/// the worst element: ferrite-conformance's check, the one `ferrite doctor --check-device` uses.
#[cfg(feature = "tensor")]
pub use ferrite_conformance::check_close;

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
