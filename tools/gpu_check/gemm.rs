//! Step `gemm`: ferrotron's GEMM and fused GEMM+bias+GeLU against cuBLASLt
//! (its GELU_BIAS / BIAS epilogues) in the same run, on random bf16 data:
//! TFLOP/s (2·M·N·K / time, CUDA events over back-to-back calls after
//! warm-up), the ratio, and the largest difference from cuBLASLt relative to
//! cuBLASLt's largest output.
//!
//! cuBLASLt is column-major; a row-major `C[M, N] = op(A) op(B)` is the
//! column-major `C^T = op(B)^T op(A)^T`, so each case states its own mapping.

use std::sync::Arc;

use cudarc::cublaslt::{Activation, CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream};
use ferrotron::ops::gemm::{Aux, Epilogue, Gemm, GemmInputs};
use ferrotron::ops::gemm_provider::GemmProvider;
use ferrotron::ops::Gelu;
use ferrotron::{Device, Error, Result};
use half::bf16;

use crate::report::Report;
use crate::timing::{per_call_ms, Rng};

fn cu<T>(what: &str, r: std::result::Result<T, impl std::fmt::Debug>) -> Result<T> {
    r.map_err(|e| Error::Backend {
        backend: "cublaslt",
        message: format!("{what}: {e:?}"),
    })
}

/// One GEMM of the comparison.
struct Case {
    name: &'static str,
    /// Row-major output `[m, n]`, inner dimension `k`.
    m: usize,
    n: usize,
    k: usize,
    /// Ours computes `A^T B` with A stored `[k, m]` (the weight gradient).
    trans_a: bool,
    epilogue: Epilogue,
}

const CASES: [Case; 5] = [
    Case {
        name: "square",
        m: 8192,
        n: 8192,
        k: 8192,
        trans_a: false,
        epilogue: Epilogue::None,
    },
    Case {
        name: "fc1 + bias + GeLU (h 4096, ffn 16384, 8192 tokens)",
        m: 8192,
        n: 16384,
        k: 4096,
        trans_a: false,
        epilogue: Epilogue::BiasGelu(Gelu::Tanh),
    },
    Case {
        name: "fc1 plain",
        m: 8192,
        n: 16384,
        k: 4096,
        trans_a: false,
        epilogue: Epilogue::None,
    },
    Case {
        name: "fc2 + bias",
        m: 8192,
        n: 4096,
        k: 16384,
        trans_a: false,
        epilogue: Epilogue::Bias,
    },
    Case {
        name: "fc1 wgrad dW = dY^T X",
        m: 16384,
        n: 4096,
        k: 8192,
        trans_a: true,
        epilogue: Epilogue::None,
    },
];

fn random(rng: &mut Rng, len: usize, scale: f64) -> Vec<bf16> {
    (0..len)
        .map(|_| bf16::from_f64(scale * rng.sym()))
        .collect()
}

pub fn run(dev: &Device, r: &mut Report) -> Result<()> {
    let ctx = cu("CUDA context", CudaContext::new(0))?;
    let cu_stream: Arc<CudaStream> = cu("stream", ctx.new_stream())?;
    let blas = cu(
        "cuBLASLt handle (libcublasLt)",
        CudaBlasLT::new(cu_stream.clone()),
    )?;
    let stream = dev.new_stream()?;
    r.header(&[
        "case",
        "M×N×K",
        "ferrotron TFLOP/s",
        "cuBLASLt TFLOP/s",
        "ratio",
        "max |diff| / max |cuBLASLt|",
    ]);
    let mut rng = Rng::new(0x5EED);
    for c in &CASES {
        // A is [m, k] (or [k, m] when transposed), B is [n, k] for the
        // forward cases (weights, `Y = X W^T`) and [k, n] for the wgrad.
        let a_h = random(&mut rng, c.m * c.k, 1.0);
        let b_h = random(&mut rng, c.n * c.k, 0.05);
        let bias_h = random(&mut rng, c.n, 0.5);
        let a = dev.upload(&a_h)?;
        let b = dev.upload(&b_h)?;
        let bias = dev.upload(&bias_h)?;
        let mut y = dev.alloc_zeros::<bf16>(c.m * c.n)?;
        let with_bias = !matches!(c.epilogue, Epilogue::None);
        let op = if c.trans_a {
            Gemm::new(c.m, c.n, c.k)
                .provider(GemmProvider::Ferrotron)
                .trans_a(true)
        } else {
            Gemm::new(c.m, c.n, c.k)
                .provider(GemmProvider::Ferrotron)
                .trans_b(true)
                .epilogue(c.epilogue)
        };
        let ours_ms = per_call_ms(&stream, 3, 10, || {
            let inputs = GemmInputs {
                a: &a,
                b: &b,
                bias: with_bias.then_some(&bias),
                c: None,
            };
            op.run(&stream, inputs, Aux::None, &mut y)
        })?;
        let ours = y.to_host()?;

        let ac: CudaSlice<bf16> = cu("upload", cu_stream.clone_htod(&a_h))?;
        let bc: CudaSlice<bf16> = cu("upload", cu_stream.clone_htod(&b_h))?;
        let biasc: CudaSlice<bf16> = cu("upload", cu_stream.clone_htod(&bias_h))?;
        let mut yc: CudaSlice<bf16> = cu("alloc", cu_stream.alloc_zeros(c.m * c.n))?;
        // Column-major view: C^T[n, m].
        let cfg = if c.trans_a {
            // C^T = B^T A: B stored [k, n] is column-major B^T (ld n); A
            // stored [k, m] is column-major A^T (ld m), so op = transpose.
            MatmulConfig {
                transa: false,
                transb: true,
                transc: false,
                m: c.n as u64,
                n: c.m as u64,
                k: c.k as u64,
                alpha: 1.0,
                lda: c.n as i64,
                ldb: c.m as i64,
                beta: 0.0,
                ldc: c.n as i64,
                stride_a: None,
                stride_b: None,
                stride_c: None,
                stride_bias: None,
                batch_size: None,
            }
        } else {
            // C^T = W X^T: W stored [n, k] is column-major W^T (ld k), so
            // op = transpose; X stored [m, k] is column-major X^T (ld k).
            MatmulConfig {
                transa: true,
                transb: false,
                transc: false,
                m: c.n as u64,
                n: c.m as u64,
                k: c.k as u64,
                alpha: 1.0,
                lda: c.k as i64,
                ldb: c.k as i64,
                beta: 0.0,
                ldc: c.n as i64,
                stride_a: None,
                stride_b: None,
                stride_c: None,
                stride_bias: None,
                batch_size: None,
            }
        };
        // cuBLASLt's first operand is B's storage in both mappings.
        let (first, second) = (&bc, &ac);
        let act = matches!(c.epilogue, Epilogue::BiasGelu(_)).then_some(Activation::Gelu);
        let mut call = || -> Result<()> {
            // SAFETY: every buffer holds the elements the config describes.
            cu("cublasLtMatmul", unsafe {
                blas.matmul(
                    cfg,
                    first,
                    second,
                    &mut yc,
                    with_bias.then_some(&biasc),
                    act.as_ref(),
                )
            })
        };
        for _ in 0..3 {
            call()?;
        }
        // cudarc's default event flags disable timing (elapsed_ms would
        // fail with CUDA_ERROR_INVALID_HANDLE): ask for timing events.
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let t0 = cu("event", cu_stream.record_event(timing))?;
        for _ in 0..10 {
            call()?;
        }
        let t1 = cu("event", cu_stream.record_event(timing))?;
        cu("event sync", t1.synchronize())?;
        let theirs_ms = cu("elapsed", t0.elapsed_ms(&t1))? as f64 / 10.0;
        let theirs = cu("download", cu_stream.clone_dtoh(&yc))?;

        let (mut diff, mut peak) = (0f64, 0f64);
        for (o, t) in ours.iter().zip(&theirs) {
            diff = diff.max((o.to_f64() - t.to_f64()).abs());
            peak = peak.max(t.to_f64().abs());
        }
        let flops = 2.0 * c.m as f64 * c.n as f64 * c.k as f64;
        let (to, tt) = (flops / ours_ms / 1e9, flops / theirs_ms / 1e9);
        r.row(&[
            c.name.to_string(),
            format!("{}×{}×{}", c.m, c.n, c.k),
            format!("{to:.1}"),
            format!("{tt:.1}"),
            format!("{:.3}", to / tt),
            format!("{:.2e}", diff / peak.max(f64::MIN_POSITIVE)),
        ]);
    }
    Ok(())
}
