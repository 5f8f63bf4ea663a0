//! Oracle for bias + dropout + residual add (docs/semantics.md, "Dropout"):
//! the keep-mask from the host Philox twin ([`crate::core::philox`]), the
//! arithmetic in f64.

use alloc::vec::Vec;

use crate::core::philox;

/// The keep-mask of `n` elements of a call with `(seed, offset)` and drop
/// probability `p` (`None`: evaluation, everything kept).
pub fn mask(p: f64, state: Option<(u64, u64)>, n: usize) -> Vec<bool> {
    match state {
        None => alloc::vec![true; n],
        Some((seed, offset)) => {
            let t = philox::drop_threshold(p as f32);
            (0..n as u64)
                .map(|i| philox::keep(seed, offset, i, t))
                .collect()
        }
    }
}

/// `out[r, c] = residual[r, c] + keep[i] * (x[r, c] + bias[c]) / (1 - p)`.
pub fn forward(
    p: f64,
    keep: &[bool],
    x: &[f64],
    bias: Option<&[f64]>,
    residual: &[f64],
    cols: usize,
) -> Vec<f64> {
    let scale = 1.0 / (1.0 - p);
    x.iter()
        .zip(residual)
        .enumerate()
        .map(|(i, (&v, &r))| {
            let v = v + bias.map_or(0.0, |b| b[i % cols]);
            r + if keep[i] { v * scale } else { 0.0 }
        })
        .collect()
}

/// `(dx, dbias)`: `dx = keep * d_out / (1 - p)`, `dbias` its column sums
/// (`d_residual` is `d_out`).
pub fn backward(p: f64, keep: &[bool], d_out: &[f64], cols: usize) -> (Vec<f64>, Vec<f64>) {
    let scale = 1.0 / (1.0 - p);
    let mut dbias = alloc::vec![0.0; cols];
    let dx = d_out
        .iter()
        .enumerate()
        .map(|(i, &g)| {
            let d = if keep[i] { g * scale } else { 0.0 };
            dbias[i % cols] += d;
            d
        })
        .collect();
    (dx, dbias)
}
