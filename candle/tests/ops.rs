//! ferrotron's custom ops against candle's own unfused ops on the CPU, per
//! dtype, forward and backward (gradients through candle's autograd on both
//! sides). Tolerances as docs/testing.md: relative L2 error 1e-5 (fp32),
//! 1e-3 (fp16), 1e-2 (bf16) for one op; gradients, which pass through
//! several rounded ops, get 4x that. The unfused reference runs in fp32 on
//! the same (rounded) inputs.

use candle_core::{DType, Device, Tensor, Var, D};
use ferrotron_candle::{
    bias_gelu, layer_norm, linear_bias_gelu, rms_norm, scale_mask_softmax, Gelu,
};

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn tol(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        DType::BF16 => 1e-2,
        _ => unreachable!(),
    }
}

/// ‖a − b‖ / ‖b‖ in f64 (absolute when `b` is all zeros).
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let a: Vec<f64> = a
        .flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap();
    let b: Vec<f64> = b
        .flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt();
    let den: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

fn check(what: &str, d: DType, scale: f64, got: &Tensor, want: &Tensor) {
    let e = rel_err(got, want);
    assert!(
        e <= scale * tol(d),
        "{what} ({d:?}): relative error {e:.3e} > {:.1e}",
        scale * tol(d)
    );
}

/// A seeded tensor of values roughly uniform in [-2, 2) in `d` (splitmix64;
/// candle's CPU RNG cannot be seeded).
fn randn(shape: &[usize], d: DType, seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let v: Vec<f32> = (0..n)
        .map(|_| {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^= x >> 31;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(d)
        .unwrap()
}

fn f32(t: &Tensor) -> Tensor {
    t.to_dtype(DType::F32).unwrap()
}

/// Gradients of `sum(out * r)` for fused and unfused outputs over `vars`.
fn grads(out: &Tensor, r: &Tensor, vars: &[&Var]) -> Vec<Tensor> {
    let loss = (out.to_dtype(DType::F32).unwrap() * r)
        .unwrap()
        .sum_all()
        .unwrap();
    let g = loss.backward().unwrap();
    vars.iter()
        .map(|v| g.get(v.as_tensor()).expect("a gradient").clone())
        .collect()
}

#[test]
fn bias_gelu_matches_candle() {
    for d in FLOATS {
        for (gelu, name) in [(Gelu::Tanh, "tanh"), (Gelu::Erf, "erf")] {
            let (x, b) = (randn(&[7, 40], d, 1), randn(&[40], d, 2));
            let unfused = |x: &Tensor, b: &Tensor| {
                let s = f32(x).broadcast_add(&f32(b)).unwrap();
                match gelu {
                    Gelu::Tanh => s.gelu().unwrap(),
                    _ => s.gelu_erf().unwrap(),
                }
            };
            let got = bias_gelu(&x, &b, gelu).unwrap();
            assert_eq!((got.dtype(), got.dims()), (d, x.dims()));
            check(&format!("bias_gelu {name}"), d, 1.0, &got, &unfused(&x, &b));

            let (xv, bv) = (Var::from_tensor(&x).unwrap(), Var::from_tensor(&b).unwrap());
            let r = randn(&[7, 40], DType::F32, 3);
            let gf = grads(&bias_gelu(&xv, &bv, gelu).unwrap(), &r, &[&xv, &bv]);
            let (xu, bu) = (
                Var::from_tensor(&f32(&x)).unwrap(),
                Var::from_tensor(&f32(&b)).unwrap(),
            );
            let gu = grads(&unfused(&xu, &bu), &r, &[&xu, &bu]);
            check(&format!("bias_gelu {name} dx"), d, 4.0, &gf[0], &gu[0]);
            check(&format!("bias_gelu {name} dbias"), d, 4.0, &gf[1], &gu[1]);
        }
    }
}

/// candle's unfused softmax(scale * x) over the last dim, causal optional.
fn softmax_ref(x: &Tensor, scale: f64, causal: bool) -> Tensor {
    let s = (f32(x) * scale).unwrap();
    let s = if causal {
        let n = *x.dims().last().unwrap();
        let m: Vec<f32> = (0..n * n)
            .map(|i| {
                if i % n > i / n {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let m = Tensor::from_vec(m, (n, n), &Device::Cpu).unwrap();
        s.broadcast_add(&m).unwrap()
    } else {
        s
    };
    let mx = s.max_keepdim(D::Minus1).unwrap();
    let e = s.broadcast_sub(&mx).unwrap().exp().unwrap();
    e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap()
}

#[test]
fn scale_mask_softmax_matches_candle() {
    for d in FLOATS {
        for causal in [false, true] {
            let x = randn(&[2, 3, 17, 17], d, 4);
            let got = scale_mask_softmax(&x, 0.6, causal).unwrap();
            let want = softmax_ref(&x, 0.6, causal);
            check(&format!("softmax causal={causal}"), d, 1.0, &got, &want);
            if causal {
                // Masked entries are exact zeros.
                let v: Vec<f32> = f32(&got).flatten_all().unwrap().to_vec1().unwrap();
                assert!(v
                    .iter()
                    .enumerate()
                    .all(|(i, &p)| (i % 17 <= (i / 17) % 17) || p == 0.0));
            }
            let xv = Var::from_tensor(&x).unwrap();
            let r = randn(&[2, 3, 17, 17], DType::F32, 5);
            let gf = grads(&scale_mask_softmax(&xv, 0.6, causal).unwrap(), &r, &[&xv]);
            let xu = Var::from_tensor(&f32(&x)).unwrap();
            let gu = grads(&softmax_ref(&xu, 0.6, causal), &r, &[&xu]);
            check(
                &format!("softmax causal={causal} dx"),
                d,
                4.0,
                &gf[0],
                &gu[0],
            );
        }
    }
}

fn layer_norm_ref(x: &Tensor, g: &Tensor, b: Option<&Tensor>, eps: f64) -> Tensor {
    let x = f32(x);
    let (xc, denom) = match b {
        Some(_) => {
            let mean = x.mean_keepdim(D::Minus1).unwrap();
            let xc = x.broadcast_sub(&mean).unwrap();
            let var = xc.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
            (xc, var)
        }
        None => {
            let ms = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
            (x, ms)
        }
    };
    let y = xc
        .broadcast_div(&(denom + eps).unwrap().sqrt().unwrap())
        .unwrap();
    let y = y.broadcast_mul(&f32(g)).unwrap();
    match b {
        Some(b) => y.broadcast_add(&f32(b)).unwrap(),
        None => y,
    }
}

#[test]
fn layer_norm_and_rms_norm_match_candle() {
    let eps = 1e-5;
    for d in FLOATS {
        let (x, g, b) = (
            randn(&[6, 96], d, 6),
            randn(&[96], d, 7),
            randn(&[96], d, 8),
        );
        check(
            "layer_norm",
            d,
            1.0,
            &layer_norm(&x, &g, &b, eps as f32).unwrap(),
            &layer_norm_ref(&x, &g, Some(&b), eps),
        );
        check(
            "rms_norm",
            d,
            1.0,
            &rms_norm(&x, &g, eps as f32).unwrap(),
            &layer_norm_ref(&x, &g, None, eps),
        );

        let r = randn(&[6, 96], DType::F32, 9);
        let (xv, gv, bv) = (
            Var::from_tensor(&x).unwrap(),
            Var::from_tensor(&g).unwrap(),
            Var::from_tensor(&b).unwrap(),
        );
        let gf = grads(
            &layer_norm(&xv, &gv, &bv, eps as f32).unwrap(),
            &r,
            &[&xv, &gv, &bv],
        );
        let (xu, gu_, bu) = (
            Var::from_tensor(&f32(&x)).unwrap(),
            Var::from_tensor(&f32(&g)).unwrap(),
            Var::from_tensor(&f32(&b)).unwrap(),
        );
        let gu = grads(
            &layer_norm_ref(&xu, &gu_, Some(&bu), eps),
            &r,
            &[&xu, &gu_, &bu],
        );
        for (i, what) in ["dx", "dgamma", "dbeta"].iter().enumerate() {
            check(&format!("layer_norm {what}"), d, 4.0, &gf[i], &gu[i]);
        }

        let gf = grads(&rms_norm(&xv, &gv, eps as f32).unwrap(), &r, &[&xv, &gv]);
        let gu = grads(&layer_norm_ref(&xu, &gu_, None, eps), &r, &[&xu, &gu_]);
        check("rms_norm dx", d, 4.0, &gf[0], &gu[0]);
        check("rms_norm dgamma", d, 4.0, &gf[1], &gu[1]);
    }
}

#[test]
fn linear_bias_gelu_matches_candle() {
    for d in [DType::F16, DType::BF16] {
        // Sizes that are not multiples of the GEMM tiles.
        let (m, k, n) = (19, 40, 24);
        let (x, w, b) = (
            randn(&[m, k], d, 10),
            randn(&[n, k], d, 11),
            randn(&[n], d, 12),
        );
        let unfused = |x: &Tensor, w: &Tensor, b: &Tensor| {
            f32(x)
                .matmul(&f32(w).t().unwrap())
                .unwrap()
                .broadcast_add(&f32(b))
                .unwrap()
                .gelu()
                .unwrap()
        };
        let got = linear_bias_gelu(&x, &w, &b, Gelu::Tanh).unwrap();
        assert_eq!((got.dtype(), got.dims()), (d, &[m, n][..]));
        check("linear_bias_gelu", d, 1.0, &got, &unfused(&x, &w, &b));

        let r = randn(&[m, n], DType::F32, 13);
        let (xv, wv, bv) = (
            Var::from_tensor(&x).unwrap(),
            Var::from_tensor(&w).unwrap(),
            Var::from_tensor(&b).unwrap(),
        );
        let gf = grads(
            &linear_bias_gelu(&xv, &wv, &bv, Gelu::Tanh).unwrap(),
            &r,
            &[&xv, &wv, &bv],
        );
        let (xu, wu, bu) = (
            Var::from_tensor(&f32(&x)).unwrap(),
            Var::from_tensor(&f32(&w)).unwrap(),
            Var::from_tensor(&f32(&b)).unwrap(),
        );
        let gu = grads(&unfused(&xu, &wu, &bu), &r, &[&xu, &wu, &bu]);
        for (i, what) in ["dx", "dw", "db"].iter().enumerate() {
            check(&format!("linear_bias_gelu {what}"), d, 4.0, &gf[i], &gu[i]);
        }
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let x = randn(&[4, 8], DType::F32, 14);
    let e = bias_gelu(&x, &randn(&[7], DType::F32, 15), Gelu::Tanh)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bias") && e.contains('8'), "{e}");
    let e = linear_bias_gelu(
        &x,
        &randn(&[3, 8], DType::F32, 16),
        &randn(&[3], DType::F32, 17),
        Gelu::Tanh,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("f16 or bf16"), "{e}");
    let e = bias_gelu(
        &x.to_dtype(DType::F64).unwrap(),
        &randn(&[8], DType::F64, 18),
        Gelu::Tanh,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("F64"), "{e}");
    let e = scale_mask_softmax(&randn(&[2, 3, 5], DType::F32, 19), 1.0, true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sq") || e.contains("causal") || e.contains("sk"),
        "{e}"
    );
    // A strided input is made contiguous by the wrapper (candle's copy), not refused.
    let xt = randn(&[8, 4], DType::F32, 20).t().unwrap();
    let b = randn(&[8], DType::F32, 21);
    let got = bias_gelu(&xt, &b, Gelu::Tanh).unwrap();
    check(
        "strided input",
        DType::F32,
        1.0,
        &got,
        &xt.broadcast_add(&b).unwrap().gelu().unwrap(),
    );
}
