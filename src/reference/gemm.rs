//! Oracle for the GEMM family (docs/semantics.md, "GEMM"): float64 throughout.

use crate::core::activation::Epilogue;
use crate::reference::bias_gelu::{gelu, gelu_grad};

/// A stored row-major matrix repeated over a batch: element `(b, r, c)` is
/// `data[b*stride + r*ld + c]`.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a> {
    pub data: &'a [f64],
    pub ld: usize,
    pub stride: usize,
}

impl Mat<'_> {
    pub fn at(&self, b: usize, r: usize, c: usize) -> f64 {
        self.data[b * self.stride + r * self.ld + c]
    }
}

/// The GEMM problem, as the oracle sees it.
#[derive(Clone, Copy, Debug)]
pub struct Problem {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f64,
    pub beta: f64,
    pub epilogue: Epilogue,
}

/// Returns `(d, pre)` packed `[batch, m, n]`: `d` the output, `pre` the
/// pre-activation `alpha*op(A)op(B) + beta*C + bias` (for `BiasGelu`).
/// `c` is read only when `beta != 0`; `aux` is the saved pre-activation
/// (`DGelu`).
pub fn gemm(
    p: &Problem,
    a: Mat<'_>,
    b: Mat<'_>,
    c: Option<Mat<'_>>,
    bias: Option<&[f64]>,
    aux: Option<Mat<'_>>,
) -> (Vec<f64>, Vec<f64>) {
    let (m, n, k) = (p.m, p.n, p.k);
    let mut d = vec![0.0; p.batch * m * n];
    let mut pre = vec![0.0; p.batch * m * n];
    for bz in 0..p.batch {
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for l in 0..k {
                    let av = if p.trans_a {
                        a.at(bz, l, i)
                    } else {
                        a.at(bz, i, l)
                    };
                    let bv = if p.trans_b {
                        b.at(bz, j, l)
                    } else {
                        b.at(bz, l, j)
                    };
                    s += av * bv;
                }
                let mut v = p.alpha * s;
                if p.beta != 0.0 {
                    v += p.beta * c.expect("beta != 0 needs C").at(bz, i, j);
                }
                let out = match p.epilogue {
                    Epilogue::None => v,
                    Epilogue::Bias => v + bias.expect("bias")[j],
                    Epilogue::BiasGelu(g) => {
                        v += bias.map_or(0.0, |bb| bb[j]);
                        pre[(bz * m + i) * n + j] = v;
                        gelu(g, v)
                    }
                    Epilogue::DGelu(g) => v * gelu_grad(g, aux.expect("aux").at(bz, i, j)),
                };
                d[(bz * m + i) * n + j] = out;
            }
        }
    }
    (d, pre)
}

/// Column sums of a `[rows, cols]` matrix with leading dimension `ld`.
pub fn column_sums(x: &[f64], rows: usize, cols: usize, ld: usize) -> Vec<f64> {
    (0..cols)
        .map(|c| (0..rows).map(|r| x[r * ld + c]).sum())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_known_product() {
        // [[1, 2], [3, 4]] x [[5, 6], [7, 8]] = [[19, 22], [43, 50]]
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [5.0, 6.0, 7.0, 8.0];
        let p = Problem {
            m: 2,
            n: 2,
            k: 2,
            batch: 1,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
            epilogue: Epilogue::Bias,
        };
        let mat = |d| Mat {
            data: d,
            ld: 2,
            stride: 4,
        };
        let (d, _) = gemm(&p, mat(&a), mat(&b), None, Some(&[1.0, -1.0]), None);
        assert_eq!(d, vec![20.0, 21.0, 44.0, 49.0]);
        // A^T B^T = (BA)^T: [[23, 31], [34, 46]]
        let p = Problem {
            trans_a: true,
            trans_b: true,
            epilogue: Epilogue::None,
            ..p
        };
        let (d, _) = gemm(&p, mat(&a), mat(&b), None, None, None);
        assert_eq!(d, vec![23.0, 31.0, 34.0, 46.0]);
        assert_eq!(column_sums(&a, 2, 2, 2), vec![4.0, 6.0]);
    }
}
