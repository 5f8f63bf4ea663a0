//! Our fused GEMM+bias+GeLU against cuBLASLt's GELU_BIAS epilogue on the same
//! GPU, shapes and data in one run (feature `cuda`; prints SKIPPED without a
//! GPU). Megatron MLP shapes, bf16 in and out, fp32 accumulation:
//! `Y[M, N] = gelu(X[M, K] · W[N, K]^T + b[N])`, plus the plain GEMMs.
//! Timing: CUDA events, 5 warm-up runs, median of 20; TFLOP/s = 2MNK / t.
//!
//!     cargo bench --features cuda --bench gemm_vs_cublaslt
//!
//! cuBLASLt is column-major: row-major Y = X·W^T is column-major
//! Y^T[N, M] = op(W^T)·X^T with transa = true, lda = ldb = K, ldc = N, and its
//! bias epilogue adds b along m = N, as ours does.

use std::sync::Arc;

use cudarc::cublaslt::{Activation, CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{sys, CudaContext, CudaStream};
use ferrotron::ops::gemm::{Aux, Epilogue, Gemm, GemmInputs};
use ferrotron::ops::gemm_provider::GemmProvider;
use ferrotron::ops::Gelu;
use ferrotron::Device;
use half::bf16;

const WARMUP: usize = 5;
const RUNS: usize = 20;

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median milliseconds of `f` timed with our stream's events.
fn time_ours(stream: &ferrotron::Stream, mut f: impl FnMut()) -> f32 {
    for _ in 0..WARMUP {
        f();
    }
    let mut t = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let a = stream.record_event().unwrap();
        f();
        let b = stream.record_event().unwrap();
        t.push(a.elapsed_ms(&b).unwrap());
    }
    median(t)
}

/// Median milliseconds of `f` timed with cudarc events on `stream`.
fn time_cublas(stream: &Arc<CudaStream>, mut f: impl FnMut()) -> f32 {
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    for _ in 0..WARMUP {
        f();
    }
    let mut t = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let a = stream.record_event(flags).unwrap();
        f();
        let b = stream.record_event(flags).unwrap();
        b.synchronize().unwrap();
        t.push(a.elapsed_ms(&b).unwrap());
    }
    median(t)
}

fn main() {
    let dev = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("gemm_vs_cublaslt: SKIPPED (no GPU): {e}");
            return;
        }
    };
    let ctx = CudaContext::new(0).expect("CUDA context");
    let cu_stream = ctx.new_stream().expect("stream");
    let blas = CudaBlasLT::new(cu_stream.clone()).expect("cuBLASLt handle");
    let stream = dev.new_stream().unwrap();
    println!("GPU: {}", dev.name());
    println!("| shape MxNxK | epilogue | ours TFLOP/s | cuBLASLt TFLOP/s | ours / cuBLASLt |");
    println!("| --- | --- | --- | --- | --- |");
    for &(m, n, k) in &[
        (4096usize, 16384usize, 4096usize),
        (8192, 16384, 4096),
        (16384, 49152, 12288),
        (8192, 8192, 8192),
    ] {
        let host = |len: usize, v: f32| vec![bf16::from_f32(v); len];
        let (x_h, w_h, b_h) = (host(m * k, 0.5), host(n * k, 0.01), host(n, 0.1));
        let x = dev.upload(&x_h).unwrap();
        let w = dev.upload(&w_h).unwrap();
        let b = dev.upload(&b_h).unwrap();
        let mut y = dev.alloc_zeros::<bf16>(m * n).unwrap();
        let xc = cu_stream.clone_htod(&x_h).unwrap();
        let wc = cu_stream.clone_htod(&w_h).unwrap();
        let bc = cu_stream.clone_htod(&b_h).unwrap();
        let mut yc = cu_stream.alloc_zeros::<bf16>(m * n).unwrap();
        let flops = 2.0 * m as f64 * n as f64 * k as f64;
        for fused in [true, false] {
            let op = Gemm::new(m, n, k)
                .provider(GemmProvider::Ferrotron)
                .trans_b(true)
                .epilogue(if fused {
                    Epilogue::BiasGelu(Gelu::Tanh)
                } else {
                    Epilogue::None
                });
            let ours = time_ours(&stream, || {
                let inputs = GemmInputs {
                    a: &x,
                    b: &w,
                    bias: fused.then_some(&b),
                    c: None,
                };
                op.run(&stream, inputs, Aux::None, &mut y).unwrap();
            });
            let cfg = MatmulConfig {
                transa: true,
                transb: false,
                transc: false,
                m: n as u64,
                n: m as u64,
                k: k as u64,
                alpha: 1.0,
                lda: k as i64,
                ldb: k as i64,
                beta: 0.0,
                ldc: n as i64,
                stride_a: None,
                stride_b: None,
                stride_c: None,
                stride_bias: None,
                batch_size: None,
            };
            let theirs = time_cublas(&cu_stream, || {
                // SAFETY: every buffer holds the elements the config describes.
                unsafe {
                    blas.matmul(
                        cfg,
                        &wc,
                        &xc,
                        &mut yc,
                        fused.then_some(&bc),
                        fused.then_some(&Activation::Gelu),
                    )
                    .expect("cublasLtMatmul");
                }
            });
            let (to, tc) = (flops / ours as f64 / 1e9, flops / theirs as f64 / 1e9);
            println!(
                "| {m}x{n}x{k} | {} | {to:.1} | {tc:.1} | {:.3} |",
                if fused { "bias+GeLU" } else { "none" },
                to / tc
            );
        }
    }
}
