//! Step `bandwidth`: every memory-bound kernel family at Megatron shapes,
//! set against a device-to-device copy measured in the same run.
//!
//! First a 1 GiB `cuMemcpyDtoD` (read + write: 2 GiB moved) gives the
//! practical HBM bandwidth of this GPU; then each case is timed with CUDA
//! events around 10 back-to-back calls after 3 warm-up calls on one stream
//! (`timing::per_call_ms`), and reported as its **byte floor** (the bytes
//! the kernel must read + write, as stated in the header of its `cuda/*.cu`
//! file and used by its `benches/*.rs` bench), time per call, floor / time
//! in GB/s (10^9 B) and that figure over the copy's: 1.0 means the kernel
//! runs at copy speed. MB in the tables are 10^6 B.
//!
//! Families, one table each, buffers freed before the next:
//! - fused scale + mask + softmax, bf16 logits `[b·np·sq, sk]` of 2^28
//!   elements (512 MiB) for sk = sq ∈ {1024, 2048, 4096, 16384}: forward
//!   without a mask (floor 2n·2 B), forward with a `[b, 1, sq, sk]`
//!   padding mask (floor 2n·2 B + the mask once), forward causal (floor: x read only in the kept lower triangle, the
//!   kernel skips the masked columns, + y written), backward (no mask
//!   argument: 3n·2 B); plus one long-path row (sk 65536).
//! - LayerNorm / RMSNorm, bf16 `[2^28 / hidden, hidden]` for hidden ∈ {1024,
//!   4096, 8192, 12288, 16384}: forward (2n·2 B + 8 or 4 B of statistics per
//!   row), backward with parameter gradients (where the plan fuses them
//!   into the dx kernel, on this device's shared memory: the 3n·2 B floor
//!   the static model uses; otherwise the dx pass 3n·2 B + the parameter
//!   pass re-reading dy and x, 2n·2 B: 5n·2 B; as `benches/layernorm.rs`)
//!   and backward dx only (3n·2 B).
//! - bias + GeLU (tanh), bf16 16384 × 32768, 128-bit and scalar accesses:
//!   forward 2n·2 B, backward with dbias 3n·2 B.
//! - multi-tensor unscale / L2 norm / clip over the fp32 main gradients of a
//!   24-layer, hidden-2048 GPT (~1.3 G parameters, 292 tensors): unscale and
//!   clip 2·bytes, norm 1·bytes. The clip's `max_norm` sits just below the
//!   norm, so every call writes every element.
//!
//! Inputs are filled on the device (`fill_bytes(0x3F)`: 0.746 in bf16, 0.747
//! in fp32); these kernels' speed does not depend on the values. Nothing is
//! checked for correctness here (that is the `correctness` step).

use ferrotron::core::plan::layernorm as ln_plan;
use ferrotron::ops::multi_tensor::{GradRef, MultiTensor, TensorRef};
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask};
use ferrotron::ops::{BiasGelu, Gelu, LayerNorm, RmsNorm};
use ferrotron::{Device, DeviceBuffer, DeviceRead, DeviceWrite, Element, Result, Stream};
use half::bf16;

use crate::report::Report;
use crate::timing::{gbps, per_call_ms, CopyBaseline};

const WARMUP: usize = 3;
const RUNS: usize = 10;
/// Bytes of each buffer of the copy baseline.
const COPY_BYTES: usize = 1 << 30;
/// Elements of each logits / activations tensor: 512 MiB of bf16.
const ELEMENTS: usize = 1 << 28;
/// bf16 bytes per element.
const BF: usize = 2;
/// The fill byte of every input.
const FILL: u8 = 0x3F;

const COLUMNS: [&str; 7] = [
    "case",
    "shape",
    "path",
    "floor MB",
    "µs",
    "GB/s",
    "ratio to copy",
];

/// A buffer of `n` elements, every byte `FILL`.
fn filled<T: Element>(dev: &Device, s: &Stream, n: usize) -> Result<DeviceBuffer<T>> {
    let mut b = dev.alloc_zeros::<T>(n)?;
    s.fill_bytes(&mut b, FILL)?;
    Ok(b)
}

/// One table row: the case timed against the copy's GB/s.
struct Row<'a> {
    case: &'a str,
    shape: &'a str,
    path: &'a str,
    floor: usize,
    ms: f64,
}

fn row(r: &mut Report, copy_gbps: f64, c: Row<'_>) {
    let g = gbps(c.floor as f64, c.ms);
    r.row(&[
        c.case.to_string(),
        c.shape.to_string(),
        c.path.to_string(),
        format!("{:.1}", c.floor as f64 / 1e6),
        format!("{:.1}", c.ms * 1e3),
        format!("{g:.0}"),
        format!("{:.3}", g / copy_gbps),
    ]);
}

pub fn run(dev: &Device, r: &mut Report) -> Result<()> {
    let s = dev.new_stream()?;
    r.line(&format!(
        "CUDA events over {RUNS} back-to-back calls after {WARMUP} warm-up calls; \
         GB/s = byte floor / time (10^9 B/s); ratio = GB/s / the copy's GB/s."
    ));
    r.line("");
    let copy = CopyBaseline::measure(dev, &s, COPY_BYTES)?;
    let copy_gbps = copy.gbps();
    r.header(&COLUMNS);
    row(
        r,
        copy_gbps,
        Row {
            case: "device-to-device copy (baseline)",
            shape: &format!("{} MiB fp32", copy.bytes >> 20),
            path: "cuMemcpyDtoD",
            floor: 2 * copy.bytes,
            ms: copy.ms,
        },
    );
    softmax(dev, &s, r, copy_gbps)?;
    norms(dev, &s, r, copy_gbps)?;
    bias_gelu(dev, &s, r, copy_gbps)?;
    multi_tensor(dev, &s, r, copy_gbps)?;
    Ok(())
}

/// A `[batch, 1, sq, sk]` padding mask: batch b keeps its first
/// `sk - (b + 1) * sk / 8` key columns (at least one), masks the rest.
fn padding_mask(batch: usize, sq: usize, sk: usize) -> Vec<u8> {
    let mut m = vec![0u8; batch * sq * sk];
    for (b, mat) in m.chunks_mut((sq * sk).max(1)).enumerate() {
        let keep = sk.saturating_sub((b + 1) * sk / 8).max(1);
        for rowm in mat.chunks_mut(sk.max(1)) {
            if let Some(tail) = rowm.get_mut(keep..) {
                tail.fill(1);
            }
        }
    }
    m
}

fn softmax(dev: &Device, s: &Stream, r: &mut Report, copy_gbps: f64) -> Result<()> {
    r.line("");
    r.line(
        "### Fused scale + mask + softmax (bf16, scale 0.125; backward takes no mask: \
         one row per sk)",
    );
    r.line("");
    r.header(&COLUMNS);
    // (batch, heads, sq, sk, causal too): batch·heads·sq·sk = 2^28.
    let cases: [(usize, usize, usize, usize, bool); 5] = [
        (2, 128, 1024, 1024, true),
        (2, 32, 2048, 2048, true),
        (2, 8, 4096, 4096, true),
        (1, 1, 16384, 16384, true),
        // The long path (sk > 16384), padding only.
        (1, 1, 4096, 65536, false),
    ];
    let x = filled::<bf16>(dev, s, ELEMENTS)?;
    let mut y = dev.alloc_zeros::<bf16>(ELEMENTS)?;
    let mut dx = dev.alloc_zeros::<bf16>(ELEMENTS)?;
    for (batch, heads, sq, sk, causal) in cases {
        let n = batch * heads * sq * sk;
        if n != ELEMENTS {
            // Cannot happen with the table above; never index out of bounds.
            continue;
        }
        let op = ScaleMaskSoftmax::new(batch, heads, sq, sk, 0.125);
        let path = format!("{:?}", op.chosen_path());
        let shape = format!("b {batch} × np {heads} × sq {sq} × sk {sk}");
        // Without a mask: the model's case, and what separates the mask's
        // cost from the forward's own (2026-12-04: the masked forwards
        // measured 0.54-0.84 of copy, the model predicted 0.97-1.00).
        let ms = per_call_ms(s, WARMUP, RUNS, || {
            op.forward(s, &x, SoftmaxMask::None, &mut y)
        })?;
        row(
            r,
            copy_gbps,
            Row {
                case: "forward, no mask",
                shape: &shape,
                path: &path,
                floor: 2 * n * BF,
                ms,
            },
        );
        let mask = dev.upload(&padding_mask(batch, sq, sk))?;
        let ms = per_call_ms(s, WARMUP, RUNS, || {
            op.forward(s, &x, SoftmaxMask::Padding(&mask), &mut y)
        })?;
        row(
            r,
            copy_gbps,
            Row {
                case: "forward, padding mask [b,1,sq,sk]",
                shape: &shape,
                path: &path,
                floor: 2 * n * BF + mask.len(),
                ms,
            },
        );
        drop(mask);
        if causal {
            let ms = per_call_ms(s, WARMUP, RUNS, || {
                op.forward(s, &x, SoftmaxMask::Causal, &mut y)
            })?;
            // Row i of each matrix reads its i + 1 kept columns.
            let kept = batch * heads * (sq * (sq + 1) / 2);
            row(
                r,
                copy_gbps,
                Row {
                    case: "forward, causal (reads the lower triangle)",
                    shape: &shape,
                    path: &path,
                    floor: (kept + n) * BF,
                    ms,
                },
            );
        }
        // y holds the last forward's output; x stands in for dy.
        let ms = per_call_ms(s, WARMUP, RUNS, || op.backward(s, &y, &x, &mut dx))?;
        row(
            r,
            copy_gbps,
            Row {
                case: "backward",
                shape: &shape,
                path: &path,
                floor: 3 * n * BF,
                ms,
            },
        );
    }
    Ok(())
}

fn norms(dev: &Device, s: &Stream, r: &mut Report, copy_gbps: f64) -> Result<()> {
    r.line("");
    r.line("### LayerNorm / RMSNorm (bf16, gamma and beta; 2^28 elements)");
    r.line("");
    r.header(&COLUMNS);
    let x = filled::<bf16>(dev, s, ELEMENTS)?;
    let dy = filled::<bf16>(dev, s, ELEMENTS)?;
    let mut y = dev.alloc_zeros::<bf16>(ELEMENTS)?;
    let mut dx = dev.alloc_zeros::<bf16>(ELEMENTS)?;
    for hidden in [1024usize, 4096, 8192, 12288, 16384] {
        let rows = ELEMENTS / hidden;
        let n = rows * hidden;
        // Whole rows only: 2^28 is not a multiple of 12288.
        let (x, dy) = (x.slice(..n)?, dy.slice(..n)?);
        let (mut y, mut dx) = (y.slice_mut(..n)?, dx.slice_mut(..n)?);
        let gamma = filled::<bf16>(dev, s, hidden)?;
        let beta = filled::<bf16>(dev, s, hidden)?;
        let mut dg = dev.alloc_zeros::<bf16>(hidden)?;
        let mut db = dev.alloc_zeros::<bf16>(hidden)?;
        let mut mean = dev.alloc_zeros::<f32>(rows)?;
        let mut rstd = dev.alloc_zeros::<f32>(rows)?;
        let shape = format!("{rows} × {hidden}");
        let path = format!("{:?}", ln_plan::path(hidden as u64));
        // The backward with parameter gradients: 3n when fused, else 5n.
        let fused = ln_plan::fused_backward_within(
            rows as u64,
            hidden as u64,
            BF,
            true,
            true,
            dev.limits(),
        )
        .is_some();
        let grads_passes = if fused { 3 } else { 5 };
        let ln = LayerNorm::new(rows, hidden);
        let rms = RmsNorm::new(rows, hidden);
        let emit = |r: &mut Report, case: &str, floor: usize, ms: f64| {
            row(
                r,
                copy_gbps,
                Row {
                    case,
                    shape: &shape,
                    path: &path,
                    floor,
                    ms,
                },
            )
        };

        let ms = per_call_ms(s, WARMUP, RUNS, || {
            ln.forward(
                s,
                &x,
                Some(&gamma),
                Some(&beta),
                &mut y,
                &mut mean,
                &mut rstd,
            )
        })?;
        emit(r, "LayerNorm forward", 2 * n * BF + 8 * rows, ms);
        let ms = per_call_ms(s, WARMUP, RUNS, || {
            ln.backward(
                s,
                &dy,
                &x,
                &mean,
                &rstd,
                Some(&gamma),
                &mut dx,
                Some(&mut dg),
                Some(&mut db),
            )
        })?;
        emit(
            r,
            if fused {
                "LayerNorm backward + dgamma, dbeta (fused: 3n)"
            } else {
                "LayerNorm backward + dgamma, dbeta (5n)"
            },
            grads_passes * n * BF + 8 * rows,
            ms,
        );
        let ms = per_call_ms(s, WARMUP, RUNS, || {
            ln.backward(s, &dy, &x, &mean, &rstd, Some(&gamma), &mut dx, None, None)
        })?;
        emit(r, "LayerNorm backward, dx only", 3 * n * BF + 8 * rows, ms);

        let ms = per_call_ms(s, WARMUP, RUNS, || {
            rms.forward(s, &x, Some(&gamma), &mut y, &mut rstd)
        })?;
        emit(r, "RMSNorm forward", 2 * n * BF + 4 * rows, ms);
        let ms = per_call_ms(s, WARMUP, RUNS, || {
            rms.backward(s, &dy, &x, &rstd, Some(&gamma), &mut dx, Some(&mut dg))
        })?;
        emit(
            r,
            if fused {
                "RMSNorm backward + dgamma (fused: 3n)"
            } else {
                "RMSNorm backward + dgamma (5n)"
            },
            grads_passes * n * BF + 4 * rows,
            ms,
        );
        let ms = per_call_ms(s, WARMUP, RUNS, || {
            rms.backward(s, &dy, &x, &rstd, Some(&gamma), &mut dx, None)
        })?;
        emit(r, "RMSNorm backward, dx only", 3 * n * BF + 4 * rows, ms);
    }
    Ok(())
}

fn bias_gelu(dev: &Device, s: &Stream, r: &mut Report, copy_gbps: f64) -> Result<()> {
    r.line("");
    r.line("### Bias + GeLU (tanh, bf16; backward with dbias)");
    r.line("");
    r.header(&COLUMNS);
    let (rows, cols) = (16384usize, 32768usize);
    let n = rows * cols;
    let x = filled::<bf16>(dev, s, n)?;
    let dy = filled::<bf16>(dev, s, n)?;
    let bias = filled::<bf16>(dev, s, cols)?;
    let mut y = dev.alloc_zeros::<bf16>(n)?;
    let mut dx = dev.alloc_zeros::<bf16>(n)?;
    let mut db = dev.alloc_zeros::<bf16>(cols)?;
    let shape = format!("{rows} × {cols}");
    for (path, vectorize) in [("128-bit", true), ("scalar", false)] {
        let op = BiasGelu::new(rows, cols)
            .with_gelu(Gelu::Tanh)
            .with_vectorize(vectorize);
        let ms = per_call_ms(s, WARMUP, RUNS, || op.forward(s, &x, Some(&bias), &mut y))?;
        row(
            r,
            copy_gbps,
            Row {
                case: "forward",
                shape: &shape,
                path,
                floor: 2 * n * BF,
                ms,
            },
        );
        let ms = per_call_ms(s, WARMUP, RUNS, || {
            op.backward(s, &dy, &x, Some(&bias), &mut dx, Some(&mut db))
        })?;
        row(
            r,
            copy_gbps,
            Row {
                case: "backward + dbias",
                shape: &shape,
                path,
                floor: 3 * n * BF,
                ms,
            },
        );
    }
    Ok(())
}

/// Element counts of the parameters of a GPT (Megatron order): word and
/// position embeddings, per layer input LayerNorm, QKV, projection,
/// post-attention LayerNorm, fc1, fc2 (weights and biases), final LayerNorm.
fn gpt_params(layers: usize, h: usize, vocab: usize, seq: usize) -> Vec<usize> {
    let mut p = vec![vocab * h, seq * h];
    for _ in 0..layers {
        p.extend([
            h,
            h,
            3 * h * h,
            3 * h,
            h * h,
            h,
            h,
            h,
            4 * h * h,
            4 * h,
            h * 4 * h,
            h,
        ]);
    }
    p.extend([h, h]);
    p
}

fn multi_tensor(dev: &Device, s: &Stream, r: &mut Report, copy_gbps: f64) -> Result<()> {
    r.line("");
    r.line(
        "### Multi-tensor unscale / L2 norm / clip (fp32 main gradients of a GPT: \
         24 layers, hidden 2048, vocab 50304, seq 2048; one launch per op, the norm two)",
    );
    r.line("");
    r.header(&COLUMNS);
    let sizes = gpt_params(24, 2048, 50304, 2048);
    let mut bufs = Vec::with_capacity(sizes.len());
    for &n in &sizes {
        bufs.push(filled::<f32>(dev, s, n)?);
    }
    let bytes: usize = sizes.iter().sum::<usize>() * 4;
    let shape = format!(
        "{} tensors, {:.2} G params",
        sizes.len(),
        bytes as f64 / 4e9
    );
    let path = "fp32, 128-bit";
    let mut found = dev.alloc_zeros::<f32>(1)?;
    let mut norm = dev.alloc_zeros::<f32>(1)?;
    let mut mt = MultiTensor::new();

    // Scale 1: the values stay put across calls.
    let ms = per_call_ms(s, WARMUP, RUNS, || {
        let mut grads: Vec<GradRef<'_>> = bufs.iter_mut().map(GradRef::from).collect();
        mt.unscale(s, &mut grads, 1.0, &mut found)
    })?;
    row(
        r,
        copy_gbps,
        Row {
            case: "unscale (found_inf)",
            shape: &shape,
            path,
            floor: 2 * bytes,
            ms,
        },
    );

    let ms = per_call_ms(s, WARMUP, RUNS, || {
        let views: Vec<TensorRef<'_>> = bufs.iter().map(TensorRef::from).collect();
        mt.l2_norm(s, &views, &mut norm)
    })?;
    row(
        r,
        copy_gbps,
        Row {
            case: "L2 norm",
            shape: &shape,
            path,
            floor: bytes,
            ms,
        },
    );

    // max_norm just below the stored norm: every call clips (by ~1 - 1e-6)
    // and so writes every element.
    let total = norm.to_host()?.first().copied().unwrap_or(0.0) as f64;
    if !(total.is_finite() && total > 0.0) {
        r.line(&format!("clip skipped: the L2 norm came out {total}"));
        return Ok(());
    }
    let max_norm = total * (1.0 - 1e-6);
    let ms = per_call_ms(s, WARMUP, RUNS, || {
        let mut grads: Vec<GradRef<'_>> = bufs.iter_mut().map(GradRef::from).collect();
        mt.clip_by_norm(s, &mut grads, &norm, max_norm)
    })?;
    row(
        r,
        copy_gbps,
        Row {
            case: "clip by norm (clipping)",
            shape: &shape,
            path,
            floor: 2 * bytes,
            ms,
        },
    );
    r.line(&format!("(L2 norm {total:.6e})"));
    Ok(())
}
