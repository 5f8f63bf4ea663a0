//! Oracle for LayerNorm and RMSNorm (docs/semantics.md), in f64 over a row-major
//! `[rows, hidden]` matrix: biased variance, two-pass statistics,
//! `rstd = 1 / sqrt(var + eps)`; `g` = gamma, gamma + 1 (zero-centred) or 1.

/// What the forward gives: the output and the saved per-row statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    pub y: Vec<f64>,
    /// Per-row mean (all zeros for RMSNorm).
    pub mean: Vec<f64>,
    pub rstd: Vec<f64>,
}

/// What the backward gives.
#[derive(Clone, Debug, PartialEq)]
pub struct Backward {
    pub dx: Vec<f64>,
    pub dgamma: Vec<f64>,
    /// Column sums of dy (LayerNorm's beta gradient; unused for RMSNorm).
    pub dbeta: Vec<f64>,
}

fn effective_gamma(gamma: Option<&[f64]>, zero_centered: bool, hidden: usize) -> Vec<f64> {
    match gamma {
        Some(g) => g
            .iter()
            .map(|&v| if zero_centered { v + 1.0 } else { v })
            .collect(),
        None => vec![1.0; hidden],
    }
}

/// Mean and rstd of one row (`rms`: mean 0, rstd from the mean square).
pub fn row_stats(row: &[f64], eps: f64, rms: bool) -> (f64, f64) {
    let n = row.len() as f64;
    let mean = if rms {
        0.0
    } else {
        row.iter().sum::<f64>() / n
    };
    let var = row.iter().map(|&v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// LayerNorm (`rms = false`, beta used) or RMSNorm (`rms = true`).
pub fn forward(
    x: &[f64],
    hidden: usize,
    gamma: Option<&[f64]>,
    beta: Option<&[f64]>,
    eps: f64,
    zero_centered: bool,
    rms: bool,
) -> Forward {
    let g = effective_gamma(gamma, zero_centered, hidden);
    let mut out = Forward {
        y: Vec::with_capacity(x.len()),
        mean: Vec::new(),
        rstd: Vec::new(),
    };
    for row in x.chunks(hidden) {
        let (mean, rstd) = row_stats(row, eps, rms);
        out.mean.push(mean);
        out.rstd.push(rstd);
        for (c, &v) in row.iter().enumerate() {
            let b = if rms { 0.0 } else { beta.map_or(0.0, |b| b[c]) };
            out.y.push((v - mean) * rstd * g[c] + b);
        }
    }
    out
}

/// Gradients of [`forward`] given `dy`, with statistics recomputed in f64.
pub fn backward(
    dy: &[f64],
    x: &[f64],
    hidden: usize,
    gamma: Option<&[f64]>,
    eps: f64,
    zero_centered: bool,
    rms: bool,
) -> Backward {
    let (mean, rstd): (Vec<f64>, Vec<f64>) =
        x.chunks(hidden).map(|r| row_stats(r, eps, rms)).unzip();
    backward_with_stats(dy, x, hidden, gamma, &mean, &rstd, zero_centered, rms)
}

/// Gradients given the per-row statistics the forward saved (what the
/// kernels' backward takes): `xhat = (x - mean) * rstd` (RMSNorm: mean 0).
#[allow(clippy::too_many_arguments)]
pub fn backward_with_stats(
    dy: &[f64],
    x: &[f64],
    hidden: usize,
    gamma: Option<&[f64]>,
    mean: &[f64],
    rstd: &[f64],
    zero_centered: bool,
    rms: bool,
) -> Backward {
    let g = effective_gamma(gamma, zero_centered, hidden);
    let n = hidden as f64;
    let mut out = Backward {
        dx: Vec::with_capacity(x.len()),
        dgamma: vec![0.0; hidden],
        dbeta: vec![0.0; hidden],
    };
    for (r, (row, drow)) in x.chunks(hidden).zip(dy.chunks(hidden)).enumerate() {
        let mean = if rms { 0.0 } else { mean[r] };
        let rstd = rstd[r];
        let xhat: Vec<f64> = row.iter().map(|&v| (v - mean) * rstd).collect();
        let dxhat: Vec<f64> = drow.iter().zip(&g).map(|(&d, &gc)| d * gc).collect();
        let m1 = if rms {
            0.0
        } else {
            dxhat.iter().sum::<f64>() / n
        };
        let m2 = dxhat.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n;
        for c in 0..hidden {
            out.dx.push(rstd * (dxhat[c] - m1 - xhat[c] * m2));
            out.dgamma[c] += drow[c] * xhat[c];
            out.dbeta[c] += drow[c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // Row [1, 2, 3]: mean 2, var 2/3.
        let f = forward(&[1.0, 2.0, 3.0], 3, None, None, 0.0, false, false);
        let s = (2.0f64 / 3.0).sqrt();
        assert!((f.mean[0] - 2.0).abs() < 1e-15);
        assert!((f.rstd[0] - 1.0 / s).abs() < 1e-12);
        assert!((f.y[0] + 1.0 / s).abs() < 1e-12 && f.y[1].abs() < 1e-15);
        // RMS of [3, 4] is sqrt(12.5).
        let r = forward(&[3.0, 4.0], 2, Some(&[2.0, 1.0]), None, 0.0, false, true);
        assert!((r.y[0] - 6.0 / 12.5f64.sqrt()).abs() < 1e-12);
        // Zero-centred gamma 0 is the identity scale.
        let z = forward(&[3.0, 4.0], 2, Some(&[0.0, 0.0]), None, 0.0, true, true);
        assert!((z.y[1] - 4.0 / 12.5f64.sqrt()).abs() < 1e-12);
    }

    /// The analytic gradients match central differences of the loss
    /// sum(dy * y) for both kinds.
    #[test]
    fn gradients_match_finite_differences() {
        let x = [0.3, -1.2, 2.5, 0.7, 1.1, -0.4, 0.9, 3.0];
        let dy = [0.5, -0.25, 1.0, 0.75, -1.5, 0.2, 0.1, -0.3];
        let gamma = [1.5, 0.5, -0.7, 2.0];
        let beta = [0.1, 0.2, 0.3, 0.4];
        for rms in [false, true] {
            for zc in [false, true] {
                let loss = |x: &[f64], g: &[f64], b: &[f64]| {
                    let y = forward(x, 4, Some(g), Some(b), 1e-5, zc, rms).y;
                    y.iter().zip(&dy).map(|(a, b)| a * b).sum::<f64>()
                };
                let bw = backward(&dy, &x, 4, Some(&gamma), 1e-5, zc, rms);
                let h = 1e-6;
                for i in 0..x.len() {
                    let (mut p, mut m) = (x, x);
                    p[i] += h;
                    m[i] -= h;
                    let fd = (loss(&p, &gamma, &beta) - loss(&m, &gamma, &beta)) / (2.0 * h);
                    assert!(
                        (fd - bw.dx[i]).abs() < 1e-6,
                        "dx[{i}] rms={rms}: {fd} vs {}",
                        bw.dx[i]
                    );
                }
                for c in 0..4 {
                    let (mut p, mut m) = (gamma, gamma);
                    p[c] += h;
                    m[c] -= h;
                    let fd = (loss(&x, &p, &beta) - loss(&x, &m, &beta)) / (2.0 * h);
                    assert!((fd - bw.dgamma[c]).abs() < 1e-6, "dgamma[{c}] rms={rms}");
                    if !rms {
                        let (mut p, mut m) = (beta, beta);
                        p[c] += h;
                        m[c] -= h;
                        let fd = (loss(&x, &gamma, &p) - loss(&x, &gamma, &m)) / (2.0 * h);
                        assert!((fd - bw.dbeta[c]).abs() < 1e-6, "dbeta[{c}]");
                    }
                }
            }
        }
    }
}
