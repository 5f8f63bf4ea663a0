//! Oracle for fused scale + mask + softmax (docs/semantics.md), in f64.
//!
//! Logits `[b, np, sq, sk]` flattened to rows of `sk`. Padding-masked logits
//! are replaced by -10000 after scaling; causal-masked columns are exact 0; a
//! row whose every column is padding-masked is all zeros (Apex/TE fused
//! behaviour; PyTorch's unfused path would give uniform `1/sk`).
//!
//! Attention dropout ([`dropout`], [`backward_dropout`]): element `i`
//! (row-major) is kept iff [`philox::keep`]`(seed, offset, i,
//! drop_threshold(p))` — the host Philox twin — and kept values are scaled
//! by `1/(1-p)`.

use crate::core::philox;

/// The mask of [`forward`].
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    None,
    /// `[b, 1, sq, sk]` or `[1, 1, sq, sk]` (broadcast), nonzero = masked.
    Padding(&'a [u8]),
    /// `sq == sk`; row `i` keeps columns `<= i`.
    Causal,
}

/// Logits shape `[b, np, sq, sk]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub b: usize,
    pub np: usize,
    pub sq: usize,
    pub sk: usize,
}

/// `softmax(mask(scale * x))` per row.
pub fn forward(x: &[f64], shape: Shape, scale: f64, mask: Mask<'_>) -> Vec<f64> {
    let Shape { b, np, sq, sk } = shape;
    assert_eq!(x.len(), b * np * sq * sk);
    let mut y = vec![0.0; x.len()];
    let mut v = vec![0.0f64; sk];
    for (r, (xr, yr)) in x.chunks(sk).zip(y.chunks_mut(sk)).enumerate() {
        let i = r % sq;
        let batch = r / (np * sq);
        let mut keep = sk;
        let mut any = true;
        match mask {
            Mask::None => v.iter_mut().zip(xr).for_each(|(v, &x)| *v = scale * x),
            Mask::Causal => {
                keep = i + 1;
                v.iter_mut().zip(xr).for_each(|(v, &x)| *v = scale * x);
            }
            Mask::Padding(m) => {
                let mb = if m.len() == sq * sk { 0 } else { batch };
                let mr = &m[(mb * sq + i) * sk..][..sk];
                any = mr.contains(&0);
                for ((v, &x), &mk) in v.iter_mut().zip(xr).zip(mr) {
                    *v = if mk != 0 { -10000.0 } else { scale * x };
                }
            }
        }
        if !any {
            continue; // fully masked: zeros
        }
        let mx = v[..keep].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = v[..keep].iter().map(|&t| (t - mx).exp()).sum();
        for c in 0..keep {
            yr[c] = (v[c] - mx).exp() / sum;
        }
    }
    y
}

/// `dx = scale * (dy*y - y * sum(dy*y))` per row of `sk`.
pub fn backward(y: &[f64], dy: &[f64], sk: usize, scale: f64) -> Vec<f64> {
    assert_eq!(y.len(), dy.len());
    let mut dx = vec![0.0; y.len()];
    for ((yr, gr), dr) in y.chunks(sk).zip(dy.chunks(sk)).zip(dx.chunks_mut(sk)) {
        let dot: f64 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
        for ((d, &yv), &g) in dr.iter_mut().zip(yr).zip(gr) {
            *d = scale * (g * yv - yv * dot);
        }
    }
    dx
}

/// Whether attention dropout with probability `p` and stream position
/// `(seed, offset)` keeps element `i`.
pub fn keeps(p: f32, seed: u64, offset: u64, i: usize) -> bool {
    philox::keep(seed, offset, i as u64, philox::drop_threshold(p))
}

/// `dropout(y, p)`: kept elements (see [`keeps`]) scaled by `1/(1-p)`,
/// dropped ones 0.
pub fn dropout(y: &[f64], p: f32, seed: u64, offset: u64) -> Vec<f64> {
    let s = 1.0 / (1.0 - p as f64);
    y.iter()
        .enumerate()
        .map(|(i, &v)| {
            if keeps(p, seed, offset, i) {
                v * s
            } else {
                0.0
            }
        })
        .collect()
}

/// Backward of `dropout(softmax(...))`: `y` the undropped probabilities,
/// `dy` the gradient of the dropped ones; `g = dropout(dy)` with the same
/// mask, then [`backward`] on `g`.
pub fn backward_dropout(
    y: &[f64],
    dy: &[f64],
    sk: usize,
    scale: f64,
    p: f32,
    seed: u64,
    offset: u64,
) -> Vec<f64> {
    backward(y, &dropout(dy, p, seed, offset), sk, scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Shape = Shape {
        b: 2,
        np: 1,
        sq: 2,
        sk: 3,
    };

    #[test]
    fn known_values() {
        // Equal logits: uniform. ln 2 apart: 2/3, 1/3.
        let y = forward(
            &[1.0, 1.0, 1.0],
            Shape {
                b: 1,
                np: 1,
                sq: 1,
                sk: 3,
            },
            2.0,
            Mask::None,
        );
        assert!(y.iter().all(|&v| (v - 1.0 / 3.0).abs() < 1e-15));
        let l2 = std::f64::consts::LN_2;
        let y = forward(
            &[l2, 0.0],
            Shape {
                b: 1,
                np: 1,
                sq: 1,
                sk: 2,
            },
            1.0,
            Mask::None,
        );
        assert!((y[0] - 2.0 / 3.0).abs() < 1e-15 && (y[1] - 1.0 / 3.0).abs() < 1e-15);
    }

    #[test]
    fn masks() {
        let x: Vec<f64> = (0..12).map(|i| i as f64 * 0.1).collect();
        // Broadcast mask: row 0 masks column 2, row 1 masks everything.
        let m = [0u8, 0, 1, 1, 1, 1];
        let y = forward(&x, S, 1.0, Mask::Padding(&m));
        assert!(y[2] < 1e-300 && y[2] >= 0.0);
        assert_eq!(&y[3..6], &[0.0, 0.0, 0.0]);
        assert_eq!(&y[9..12], &[0.0, 0.0, 0.0]);
        assert!((y[0] + y[1] - 1.0).abs() < 1e-15);
        // Per-batch mask: batch 1 unmasked.
        let m2 = [0u8, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0];
        let y2 = forward(&x, S, 1.0, Mask::Padding(&m2));
        assert!((y2[9..12].iter().sum::<f64>() - 1.0).abs() < 1e-15);
        // Causal, sq == sk == 2: row 0 is [1, 0].
        let y = forward(
            &x[..4],
            Shape {
                b: 1,
                np: 1,
                sq: 2,
                sk: 2,
            },
            1.0,
            Mask::Causal,
        );
        assert_eq!(&y[..2], &[1.0, 0.0]);
    }

    #[test]
    fn dropout_backward_matches_finite_differences() {
        let sh = Shape {
            b: 1,
            np: 1,
            sq: 2,
            sk: 4,
        };
        let x = [0.3, -1.2, 0.7, 2.0, -0.4, 0.1, 1.5, -2.0];
        let dy = [0.5, -0.25, 1.0, 0.125, -1.0, 0.75, 0.3, 0.9];
        let (scale, p, seed, offset) = (0.7, 0.5, 99, 12);
        let drops = (0..8).filter(|&i| !keeps(p, seed, offset, i)).count();
        assert!(drops > 0 && drops < 8, "{drops}"); // both kinds occur
        let loss = |x: &[f64]| -> f64 {
            dropout(&forward(x, sh, scale, Mask::None), p, seed, offset)
                .iter()
                .zip(&dy)
                .map(|(a, b)| a * b)
                .sum()
        };
        let y = forward(&x, sh, scale, Mask::None);
        let dx = backward_dropout(&y, &dy, 4, scale, p, seed, offset);
        for j in 0..8 {
            let (mut xp, mut xm) = (x, x);
            xp[j] += 1e-6;
            xm[j] -= 1e-6;
            let fd = (loss(&xp) - loss(&xm)) / 2e-6;
            assert!((fd - dx[j]).abs() < 1e-8, "{j}: {fd} vs {}", dx[j]);
        }
        // p = 0 keeps everything.
        assert_eq!(dropout(&y, 0.0, seed, offset), y);
    }

    #[test]
    fn backward_matches_finite_differences() {
        let sh = Shape {
            b: 1,
            np: 1,
            sq: 1,
            sk: 4,
        };
        let x = [0.3, -1.2, 0.7, 2.0];
        let dy = [0.5, -0.25, 1.0, 0.125];
        let scale = 0.7;
        let y = forward(&x, sh, scale, Mask::None);
        let dx = backward(&y, &dy, 4, scale);
        let loss = |x: &[f64]| -> f64 {
            forward(x, sh, scale, Mask::None)
                .iter()
                .zip(&dy)
                .map(|(a, b)| a * b)
                .sum()
        };
        for j in 0..4 {
            let (mut xp, mut xm) = (x, x);
            xp[j] += 1e-6;
            xm[j] -= 1e-6;
            let fd = (loss(&xp) - loss(&xm)) / 2e-6;
            assert!((fd - dx[j]).abs() < 1e-8, "{j}: {fd} vs {}", dx[j]);
        }
    }
}
