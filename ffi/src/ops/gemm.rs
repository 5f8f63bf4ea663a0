//! GEMM with fused epilogues, and the bias gradient (`ferrotron::ops::gemm`).

use crate::abi::args::dim;
use crate::abi::enums::{c_enum, parse_enum};
use crate::runtime::ftnStream;
use ferrotron::ops::gemm::{Aux, BiasGrad, Epilogue, Gemm, GemmInputs};
use ferrotron::{with_dtype, DType, Device};
use std::ffi::c_void;

use ferrotron::Result;

use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{read_desc, Desc};
use crate::abi::dtype::{dispatch_dtype, dtype_in, dtype_names, parse_dtype, HALVES};
use crate::abi::views::{opt_view, view};
use crate::ops::{gelu_of, stream_of};
use crate::runtime::ftnStream_t;

/// What the GEMM does to `v = alpha * op(A) op(B) [+ beta * C]`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnGemmEpilogue_t {
    /// `D = v`.
    ftnGemmEpilogueNone = 0,
    /// `D = v + bias[n]` (bias required).
    ftnGemmEpilogueBias = 1,
    /// `D = gelu(v + bias[n])` (bias optional); a non-NULL `aux` receives
    /// the pre-activation `v + bias`.
    ftnGemmEpilogueBiasGelu = 2,
    /// `D = v * gelu'(aux)`, `aux` (required) the saved pre-activation: the
    /// backward of BiasGelu.
    ftnGemmEpilogueDGelu = 3,
}
c_enum!(
    ftnGemmEpilogue_t: ftnGemmEpilogueNone,
    ftnGemmEpilogueBias,
    ftnGemmEpilogueBiasGelu,
    ftnGemmEpilogueDGelu,
);

/// One (batched) GEMM `D[b] = epilogue(alpha * op(A[b]) op(B[b]) + beta * C[b])`
/// over row-major matrices, `op(A)` `[m, k]`, `op(B)` `[k, n]`; fp16 or bf16
/// inputs, fp32 accumulation, output in the input type or fp32.
///
/// Layouts: leading dimensions (`ld*`, 0 = packed: the stored row length)
/// and batch strides (`stride_*`, 0 = packed: rows * ld), in elements. An
/// operand spans `(batch - 1) * stride + (rows - 1) * ld + cols` elements
/// (`rows x cols` its stored shape: A is `[k, m]` with `trans_a`, B `[n, k]`
/// with `trans_b`); each pointer must hold that many. Batch entries of the
/// inputs (A, B, C) may overlap (a stride below `rows * ld`: shared rows);
/// those of the outputs (D, aux) may not: ftnInvalidArgument.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnGemmDesc_t {
    /// `sizeof(ftnGemmDesc_t)` as the caller compiled it.
    pub size: usize,
    /// Input type (A, B, bias): ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// Output type (C, D, aux): the input type or ftnFloat32.
    pub out_dtype: i32,
    /// Non-zero: A is stored `[k, m]`.
    pub trans_a: i32,
    /// Non-zero: B is stored `[n, k]` (a linear layer's `X W^T`).
    pub trans_b: i32,
    /// `ftnGemmEpilogue_t`.
    pub epilogue: i32,
    /// `ftnGelu_t` of the GeLU epilogues.
    pub gelu: i32,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    /// Batch entries (1 for a plain GEMM; 0 does nothing).
    pub batch: i64,
    pub alpha: f32,
    /// With `beta != 0`, C is read; a NULL `c` means C is D (accumulate).
    pub beta: f32,
    pub lda: i64,
    pub ldb: i64,
    pub ldc: i64,
    pub ldd: i64,
    pub ld_aux: i64,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
    pub stride_d: i64,
    pub stride_aux: i64,
    /// Non-zero: one A for every batch entry (stride 0).
    pub broadcast_a: i32,
    /// Non-zero: one B for every batch entry (stride 0).
    pub broadcast_b: i32,
}
// SAFETY: repr(C), size_t first, integer/float fields, no implicit padding.
unsafe impl Desc for ftnGemmDesc_t {
    const NAME: &'static str = "ftnGemmDesc_t";
    const V1_SIZE: usize = 160;
}

fn opt_dim(op: &'static str, arg: &'static str, v: i64) -> Result<Option<usize>> {
    Ok(match dim(op, arg, v)? {
        0 => None,
        x => Some(x),
    })
}

/// Elements an operand spans (the header's formula), overflow reported.
fn span(
    op: &'static str,
    arg: &'static str,
    rows: usize,
    cols: usize,
    batch: usize,
    ld: Option<usize>,
    stride: Option<usize>,
) -> Result<usize> {
    let ld = ld.unwrap_or(cols.max(1));
    // The operand is too large for its layout, and the layout comes from
    // `desc`: say so, with the numbers that overflowed.
    let over = || {
        invalid(
            op,
            arg,
            "a span ((batch - 1) * stride + (rows - 1) * ld + cols elements, from the \
             dimensions, leading dimension and batch stride in `desc`) that fits in int64_t",
            format!(
                "batch {batch}, rows {rows}, cols {cols}, ld {ld}, stride {}: an overflow",
                stride.map_or_else(|| "packed".to_string(), |s| s.to_string())
            ),
        )
    };
    if rows == 0 || cols == 0 || batch == 0 {
        return Ok(0);
    }
    let extent = (rows - 1)
        .checked_mul(ld)
        .and_then(|v| v.checked_add(cols))
        .ok_or_else(over)?;
    let stride = match stride {
        Some(s) => s,
        None => rows.checked_mul(ld).ok_or_else(over)?,
    };
    (batch - 1)
        .checked_mul(stride)
        .and_then(|v| v.checked_add(extent))
        .filter(|&v| v <= i64::MAX as usize)
        .ok_or_else(over)
}

struct GemmArgs {
    a: *const c_void,
    b: *const c_void,
    bias: *const c_void,
    c: *const c_void,
    aux: *mut c_void,
    d: *mut c_void,
}

/// # Safety
/// Pointer contracts of [`ftn_gemm`].
unsafe fn gemm_t<
    T: ferrotron::core::dtype::FloatElement,
    O: ferrotron::core::dtype::FloatElement,
>(
    op: &'static str,
    s: &ftnStream,
    dev: &Device,
    d: &ftnGemmDesc_t,
    p: GemmArgs,
) -> Result<()> {
    let m = dim(op, "desc.m", d.m)?;
    let n = dim(op, "desc.n", d.n)?;
    let k = dim(op, "desc.k", d.k)?;
    let batch = dim(op, "desc.batch", d.batch)?;
    let lds = [
        opt_dim(op, "desc.lda", d.lda)?,
        opt_dim(op, "desc.ldb", d.ldb)?,
        opt_dim(op, "desc.ldc", d.ldc)?,
        opt_dim(op, "desc.ldd", d.ldd)?,
        opt_dim(op, "desc.ld_aux", d.ld_aux)?,
    ];
    let mut strides = [
        opt_dim(op, "desc.stride_a", d.stride_a)?,
        opt_dim(op, "desc.stride_b", d.stride_b)?,
        opt_dim(op, "desc.stride_c", d.stride_c)?,
        opt_dim(op, "desc.stride_d", d.stride_d)?,
        opt_dim(op, "desc.stride_aux", d.stride_aux)?,
    ];
    if d.broadcast_a != 0 {
        strides[0] = Some(0);
    }
    if d.broadcast_b != 0 {
        strides[1] = Some(0);
    }
    let g = gelu_of(op, d.gelu)?;
    let epilogue = match parse_enum(op, "desc.epilogue", d.epilogue)? {
        ftnGemmEpilogue_t::ftnGemmEpilogueNone => Epilogue::None,
        ftnGemmEpilogue_t::ftnGemmEpilogueBias => Epilogue::Bias,
        ftnGemmEpilogue_t::ftnGemmEpilogueBiasGelu => Epilogue::BiasGelu(g),
        ftnGemmEpilogue_t::ftnGemmEpilogueDGelu => Epilogue::DGelu(g),
    };
    let (ra, ca) = if d.trans_a != 0 { (k, m) } else { (m, k) };
    let (rb, cb) = if d.trans_b != 0 { (n, k) } else { (k, n) };
    let na = span(op, "a", ra, ca, batch, lds[0], strides[0])?;
    let nb = span(op, "b", rb, cb, batch, lds[1], strides[1])?;
    let nc = span(op, "c", m, n, batch, lds[2], strides[2])?;
    let nd = span(op, "d", m, n, batch, lds[3], strides[3])?;
    let nx = span(op, "aux", m, n, batch, lds[4], strides[4])?;
    // SAFETY: pointer contracts: each operand spans what its layout says.
    let (av, bv, biasv, cv, mut dv) = unsafe {
        (
            view::<T>(dev, op, "a", p.a, na)?,
            view::<T>(dev, op, "b", p.b, nb)?,
            opt_view::<T>(dev, op, "bias", p.bias, n)?,
            opt_view::<O>(dev, op, "c", p.c, nc)?,
            view::<O>(dev, op, "d", p.d, nd)?,
        )
    };
    // SAFETY: as above.
    let mut auxv = unsafe { opt_view::<O>(dev, op, "aux", p.aux, nx)? };
    let aux = match (epilogue, auxv.as_mut()) {
        (_, None) => Aux::None,
        (Epilogue::DGelu(_), Some(x)) => Aux::PreActivation(x),
        (_, Some(x)) => Aux::Store(x),
    };
    let gemm = Gemm::new(m, n, k)
        .trans_a(d.trans_a != 0)
        .trans_b(d.trans_b != 0)
        .alpha(d.alpha)
        .beta(d.beta)
        .batch(batch)
        .epilogue(epilogue)
        .lds(lds[0], lds[1], lds[2], lds[3], lds[4])
        .strides(strides[0], strides[1], strides[2], strides[3], strides[4]);
    let inputs = GemmInputs {
        a: &av,
        b: &bv,
        bias: biasv.as_ref().map(|b| b as _),
        c: cv.as_ref().map(|b| b as _),
    };
    gemm.run(&s.stream, inputs, aux, &mut dv)
}

/// Enqueues one (batched) GEMM described by `desc` (see `ftnGemmDesc_t` for
/// the layouts and how many elements each pointer must hold). `bias` (`n`
/// elements of the input type) and `c` may be NULL as the epilogue and
/// `beta` allow; `aux` is written by BiasGelu when not NULL and read by DGelu.
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): `stream`
/// NULL, stale or of another kind; `desc` NULL, misaligned, a bad
/// `desc->size` or non-zero bytes past the known fields; `dtype` not fp16 /
/// bf16, `out_dtype` not the input type or fp32, a bad `epilogue` or
/// `gelu`; negative dims, leading dimensions or strides, a leading
/// dimension below the stored row length, spans that overflow; for `batch >
/// 1` a `d` (and BiasGelu `aux`) batch stride below one entry's extent; a
/// non-finite `alpha` / `beta`. NULL rules: `bias` is required by Bias,
/// optional for BiasGelu, must be NULL otherwise; `c` must be NULL when
/// `beta == 0`, and with `beta != 0` a NULL `c` means C is D (then `ldc`
/// and `stride_c` must be 0); `aux` is required by DGelu, optional for
/// BiasGelu, must be NULL otherwise; `a`, `b`, `d` may be NULL only when
/// they span 0 elements. Every pointer must be aligned to its element size
/// (checked). `m`, `n` or `batch` 0 is a no-op after the checks.
/// cuBLASLt forced by `FTN_GEMM_PROVIDER` where it cannot run (the
/// emulator, no cuBLASLt): ftnBackendUnavailable. Faults on the device
/// come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_gemm(
    stream: ftnStream_t,
    desc: *const ftnGemmDesc_t,
    a: *const c_void,
    b: *const c_void,
    bias: *const c_void,
    c: *const c_void,
    aux: *mut c_void,
    d: *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor contract.
        let g = unsafe { read_desc(op, "desc", desc)? };
        let p = GemmArgs {
            a,
            b,
            bias,
            c,
            aux,
            d,
        };
        let input = parse_dtype(op, "desc.dtype", g.dtype, &HALVES)?;
        let output = dtype_in(g.out_dtype, &[input, DType::F32]).ok_or_else(|| {
            invalid(
                op,
                "desc.out_dtype",
                format!("the input type or {}", dtype_names(&[DType::F32])),
                g.out_dtype,
            )
        })?;
        // SAFETY: pointer contracts.
        unsafe {
            with_dtype!(input, [F16, BF16], T => if output == DType::F32 {
                gemm_t::<T, f32>(op, s, &dev, &g, p)
            } else {
                gemm_t::<T, T>(op, s, &dev, &g, p)
            }, else other => unreachable!("parse_dtype admitted {other}"))
        }
    })
}

/// Bias gradient `dbias[c] = sum_r dy[r, c]` of a row-major `[rows, cols]`
/// matrix with leading dimension `ld` (0 = `cols`); fp32 accumulation in a
/// fixed order (bitwise reproducible).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnBiasGradDesc_t {
    /// `sizeof(ftnBiasGradDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t`: ftnFloat32, ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// Must be 0.
    pub reserved: i32,
    pub rows: i64,
    pub cols: i64,
    pub ld: i64,
}
// SAFETY: repr(C), size_t first, integer fields, explicit padding.
unsafe impl Desc for ftnBiasGradDesc_t {
    const NAME: &'static str = "ftnBiasGradDesc_t";
    const V1_SIZE: usize = 40;
}

/// `dbias` (`cols` elements) = column sums of `dy`, which spans
/// `(rows - 1) * ld + cols` elements.
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): `stream`
/// NULL, stale or of another kind; `desc` NULL, misaligned, a bad
/// `desc->size`, non-zero bytes past the known fields or a non-zero
/// `reserved`; `dtype` not a float type; negative `rows`, `cols` or `ld`,
/// `ld` (when not 0) below `cols`, a span that overflows; `dy` / `dbias`
/// NULL when they describe elements, or not aligned to the element size.
/// `cols` 0 is a no-op; `rows` 0 zero-fills `dbias`. Faults on the device
/// come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_gemm_bias_grad(
    stream: ftnStream_t,
    desc: *const ftnBiasGradDesc_t,
    dy: *const c_void,
    dbias: *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        if d.reserved != 0 {
            return Err(invalid(op, "desc.reserved", 0, d.reserved));
        }
        let rows = dim(op, "desc.rows", d.rows)?;
        let cols = dim(op, "desc.cols", d.cols)?;
        let ld = opt_dim(op, "desc.ld", d.ld)?;
        let need = span(op, "dy", rows, cols, 1, ld, None)?;
        let mut bg = BiasGrad::new(rows, cols);
        bg.ld = ld;
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => {
            // SAFETY: pointer contracts.
            let (dyv, mut dbv) = unsafe { (view::<T>(&dev, op, "dy", dy, need)?, view::<T>(&dev, op, "dbias", dbias, cols)?) };
            bg.run(&s.stream, &dyv, &mut dbv)
        })
    })
}
