//! A tensor against PyTorch's expected tensor, within a case's rtol/atol, the way
//! `torch.testing.assert_close` judges it: every element within `atol + rtol·|expected|`.

use ferrite_tensor::Tensor;

/// The largest |got − want| when every element is within `atol + rtol·|want|`; otherwise `Err`
/// naming the worst element (a NaN on either side counts as the worst possible) or the shape
/// mismatch.
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

#[cfg(test)]
mod tests {
    use ferrite_tensor::Device;

    use super::*;

    fn t(v: Vec<f32>) -> Tensor {
        let n = v.len();
        Tensor::from_vec(v, &[n], &Device::Cpu).unwrap()
    }

    #[test]
    fn within_tolerance_gives_the_largest_difference_and_outside_names_the_worst_element() {
        assert_eq!(check_close("x", &t(vec![1.0, 2.5]), &t(vec![1.0, 2.5]), 0.0, 0.0), Ok(0.0));
        let d = check_close("x", &t(vec![1.0, 2.0]), &t(vec![1.0, 2.0001]), 1e-3, 0.0).unwrap();
        assert!(d > 0.0 && d < 2e-4, "{d}");
        let e = check_close("x", &t(vec![1.5, 2.0, 9.0]), &t(vec![1.0, 2.0, 1.0]), 0.0, 0.1).unwrap_err();
        assert!(e.contains("element 2 is 9"), "{e}");
        let nan = check_close("x", &t(vec![f32::NAN]), &t(vec![1.0]), 1.0, 1.0).unwrap_err();
        assert!(nan.contains("element 0 is NaN"), "{nan}");
        let shape = check_close("x", &t(vec![1.0]), &t(vec![1.0, 2.0]), 1.0, 1.0).unwrap_err();
        assert!(shape.contains("shape [1], expected [2]"), "{shape}");
    }
}
