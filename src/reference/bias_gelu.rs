//! Oracle for bias + GeLU (docs/semantics.md): Megatron's tanh approximation with
//! its constants, and the exact erf form.

use crate::core::activation::Gelu;

const K0: f64 = 0.79788456;
const K1: f64 = 0.044715;
const K2: f64 = 0.1070322243;

// The textbook forms 0.5x(1 + tanh(u)) and 0.5x(1 + erf(z)) cancel
// catastrophically for very negative x, even in f64 (x = -8: 1 + tanh(u)
// rounds to 0 while the true GeLU is -3.1e-21). The same functions are
// evaluated through 0.5(1 + tanh u) = 1/(1 + e^{-2u}),
// 1 - tanh(u)^2 = 4/((1 + e^{-2u})(1 + e^{2u})) and 1 + erf(z) = erfc(-z).

fn tanh_arg(x: f64) -> f64 {
    K0 * x * (1.0 + K1 * x * x)
}

/// GeLU of `x`.
pub fn gelu(kind: Gelu, x: f64) -> f64 {
    match kind {
        Gelu::Tanh => x / (1.0 + (-2.0 * tanh_arg(x)).exp()),
        Gelu::Erf => 0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2),
    }
}

/// d gelu / dx at `x`: Megatron's formula
/// `0.5x(1 - t^2)(K0 + K2 x^2) + 0.5(1 + t)` for tanh; exact for erf.
pub fn gelu_grad(kind: Gelu, x: f64) -> f64 {
    match kind {
        Gelu::Tanh => {
            let u = tanh_arg(x);
            let half_one_plus_t = 1.0 / (1.0 + (-2.0 * u).exp());
            let half_one_minus_t = 1.0 / (1.0 + (2.0 * u).exp());
            2.0 * x * half_one_plus_t * half_one_minus_t * (K0 + K2 * x * x) + half_one_plus_t
        }
        Gelu::Erf => {
            let cdf = 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2);
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            cdf + x * pdf
        }
    }
}

/// `out[r, c] = gelu(x[r, c] + bias[c])`.
pub fn forward(kind: Gelu, x: &[f64], bias: Option<&[f64]>, cols: usize) -> Vec<f64> {
    x.iter()
        .enumerate()
        .map(|(i, &v)| gelu(kind, v + bias.map_or(0.0, |b| b[i % cols])))
        .collect()
}

/// `(dx, dbias)` with `dx = dy * gelu'(x + bias)` and `dbias` its column sums.
pub fn backward(
    kind: Gelu,
    dy: &[f64],
    x: &[f64],
    bias: Option<&[f64]>,
    cols: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut dbias = vec![0.0; cols];
    let dx: Vec<f64> = dy
        .iter()
        .zip(x)
        .enumerate()
        .map(|(i, (&g, &v))| {
            let d = g * gelu_grad(kind, v + bias.map_or(0.0, |b| b[i % cols]));
            dbias[i % cols] += d;
            d
        })
        .collect();
    (dx, dbias)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // gelu(0) = 0, gelu'(0) = 0.5 for both; gelu(x) -> x for large x.
        for k in [Gelu::Tanh, Gelu::Erf] {
            assert_eq!(gelu(k, 0.0), 0.0);
            assert!((gelu_grad(k, 0.0) - 0.5).abs() < 1e-15);
            assert!((gelu(k, 10.0) - 10.0).abs() < 1e-12);
            assert!(gelu(k, -10.0).abs() < 1e-12);
        }
        // Exact GeLU(1) = Phi(1) = 0.8413447460685429 (tables of the normal CDF).
        assert!((gelu(Gelu::Erf, 1.0) - 0.8413447460685429).abs() < 1e-14);
        // The tanh form is within 1e-3 of the exact one on [-5, 5].
        for i in -50..=50 {
            let x = i as f64 / 10.0;
            assert!(
                (gelu(Gelu::Tanh, x) - gelu(Gelu::Erf, x)).abs() < 1e-3,
                "{x}"
            );
        }
    }

    #[test]
    fn stable_forms_equal_the_textbook_ones_where_those_are_accurate() {
        for i in -30..=60 {
            let x = i as f64 / 10.0;
            let t = tanh_arg(x).tanh();
            let textbook = 0.5 * x * (1.0 + t);
            assert!(
                (gelu(Gelu::Tanh, x) - textbook).abs() < 1e-15 * (1.0 + x.abs()),
                "{x}"
            );
            let g = 0.5 * x * ((1.0 - t * t) * (K0 + K2 * x * x)) + 0.5 * (1.0 + t);
            assert!((gelu_grad(Gelu::Tanh, x) - g).abs() < 1e-14, "{x}");
            let e = 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
            assert!(
                (gelu(Gelu::Erf, x) - e).abs() < 1e-15 * (1.0 + x.abs()),
                "{x}"
            );
        }
        // Where the textbook form gives 0, the stable one keeps the value.
        assert!(gelu(Gelu::Tanh, -8.0) < -1e-21 && gelu(Gelu::Tanh, -8.0) > -1e-20);
    }

    #[test]
    fn gradients_match_finite_differences() {
        for k in [Gelu::Tanh, Gelu::Erf] {
            for i in -40..=40 {
                let x = i as f64 / 8.0;
                let h = 1e-6;
                let fd = (gelu(k, x + h) - gelu(k, x - h)) / (2.0 * h);
                // Megatron's 0.79788456 truncates sqrt(2/pi): allow 1e-7.
                assert!((fd - gelu_grad(k, x)).abs() < 1e-7, "{k:?} at {x}: {fd}");
            }
        }
    }
}
