//! Deterministic initial values of the unsharded parameters, a pure
//! function of (seed, parameter name): every factorisation of the ranks
//! starts from the same model, each rank cutting its own shard.

use crate::core::dtype::FloatElement;

/// SplitMix64: a small, well-mixed generator, enough for initial weights.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1]`.
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// FNV-1a of the name, mixed with the seed.
fn stream(seed: u64, name: &str) -> SplitMix {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01B3);
    }
    SplitMix(h ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// `n` values from `N(0, std²)` (Box–Muller), rounded to `T`.
pub fn normal<T: FloatElement>(seed: u64, name: &str, n: usize, std: f32) -> Vec<T> {
    let mut r = stream(seed, name);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let (u1, u2) = (r.uniform(), r.uniform());
        let rad = (-2.0 * u1.ln()).sqrt() * std as f64;
        let th = 2.0 * core::f64::consts::PI * u2;
        out.push(T::from_f64((rad * th.cos()) as f32 as f64));
        if out.len() < n {
            out.push(T::from_f64((rad * th.sin()) as f32 as f64));
        }
    }
    out
}

/// `n` copies of `v`.
pub fn constant<T: FloatElement>(n: usize, v: f32) -> Vec<T> {
    vec![T::from_f64(v as f64); n]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_name_same_values_other_name_other_values() {
        let a: Vec<f32> = normal(7, "layers.0.qkv.weight", 1000, 0.02);
        let b: Vec<f32> = normal(7, "layers.0.qkv.weight", 1000, 0.02);
        let c: Vec<f32> = normal(7, "layers.1.qkv.weight", 1000, 0.02);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mean = a.iter().map(|&x| x as f64).sum::<f64>() / 1000.0;
        let var = a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / 1000.0;
        // 1000 samples: the mean within 4 standard errors, the std within 10%.
        assert!(mean.abs() < 4.0 * 0.02 / 1000f64.sqrt(), "mean {mean}");
        assert!((var.sqrt() - 0.02).abs() < 0.002, "std {}", var.sqrt());
    }
}
