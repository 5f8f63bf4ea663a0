//! Oracles for the multi-tensor ops and the grad scaler (docs/semantics.md,
//! "Multi-tensor ops"; Megatron's `clip_grad_norm`), in f64.

/// `inv_scale = 1 / scale` in f64 rounded to f32 (Megatron's
/// `scale.double().reciprocal().float()`).
pub fn inv_scale(scale: f32) -> f32 {
    (1.0 / scale as f64) as f32
}

/// Every tensor multiplied by `factor` (the exact products; the kernels round
/// them once to the storage type), and whether any input or product is not
/// finite.
pub fn scale(tensors: &[Vec<f64>], factor: f64) -> (Vec<Vec<f64>>, bool) {
    let mut found = false;
    let out = tensors
        .iter()
        .map(|t| {
            t.iter()
                .map(|&x| {
                    let y = x * factor;
                    found |= !x.is_finite() || !y.is_finite();
                    y
                })
                .collect()
        })
        .collect();
    (out, found)
}

/// The L2 norm of all elements of all tensors.
pub fn l2_norm(tensors: &[Vec<f64>]) -> f64 {
    tensors
        .iter()
        .flat_map(|t| t.iter())
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
}

/// Megatron's clip coefficient `max_norm / (norm + 1e-6)`, when below 1.
pub fn clip_coeff(norm: f64, max_norm: f64) -> Option<f64> {
    let c = max_norm / (norm + 1e-6);
    (c < 1.0).then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(l2_norm(&[vec![3.0], vec![], vec![4.0]]), 5.0);
        assert_eq!(l2_norm(&[]), 0.0);
        assert_eq!(inv_scale(65536.0), 1.0 / 65536.0);
        let (out, found) = scale(&[vec![2.0, -4.0]], 0.5);
        assert_eq!((out, found), (vec![vec![1.0, -2.0]], false));
        assert!(scale(&[vec![], vec![f64::NAN]], 1.0).1);
        assert!(scale(&[vec![1e300]], 1e10).1);
        assert_eq!(clip_coeff(5.0, 10.0), None);
        assert!((clip_coeff(10.0, 1.0).unwrap() - 0.1).abs() < 1e-8);
    }
}
