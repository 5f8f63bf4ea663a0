//! cuBLASLt, loaded dynamically (cudarc's `dynamic-loading`), as the second
//! GEMM provider (docs/perf.md, "GEMM providers"). Row-major
//! `D[m, n] = op(A) op(B)` is cuBLASLt's column-major
//! `D^T[n, m] = op(B)^T op(A)^T`: cuBLASLt's first operand is B's storage
//! (`cb x rb` column-major, ld `ldb`, transposed iff `trans_b`), its second
//! A's storage; bias per row of `D^T` is ferrotron's per-column bias; the aux
//! matrix is laid out like `D^T` with `ld_aux`.

use core::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use cudarc::cublaslt::result::{self, CublasError};
use cudarc::cublaslt::sys;

use crate::core::{DType, Error, Result};

/// Workspace offered to cuBLASLt's heuristic (bytes).
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

/// What to install when the library is missing.
const INSTALL: &str = "cuBLASLt (libcublasLt.so.13, CUDA 13) was not found: install it \
                       (`pip install nvidia-cublas`, or the CUDA toolkit) and make \
                       `libcublasLt.so` (a link to libcublasLt.so.13) loadable, e.g. on \
                       LD_LIBRARY_PATH; cudarc looks for the unversioned name";

struct Handle(sys::cublasLtHandle_t);
// SAFETY: a cuBLASLt handle may be used from any thread; we serialise its
// use with the mutex below (cuBLASLt handles are not reentrant-safe for
// concurrent configuration).
unsafe impl Send for Handle {}

fn handle() -> std::result::Result<&'static Mutex<Handle>, String> {
    static HANDLE: OnceLock<std::result::Result<Mutex<Handle>, String>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // SAFETY: only tries to open the library.
            if !unsafe { sys::is_culib_present() } {
                return Err(INSTALL.to_string());
            }
            result::create_handle()
                .map(|h| Mutex::new(Handle(h)))
                .map_err(|e| format!("cublasLtCreate failed: {e:?}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether cuBLASLt can be used (`Err` says why not and what to install).
pub(crate) fn status() -> std::result::Result<(), String> {
    handle().map(|_| ())
}

fn data_type(d: DType) -> Result<sys::cudaDataType> {
    Ok(match d {
        DType::F16 => sys::cudaDataType_t::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType_t::CUDA_R_16BF,
        DType::F32 => sys::cudaDataType_t::CUDA_R_32F,
        other => {
            return Err(Error::invalid(
                "gemm",
                "dtype",
                "f16, bf16 or f32 for cuBLASLt",
                other,
            ))
        }
    })
}

/// cuBLASLt's epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LtEpilogue {
    Default,
    Bias,
    /// Tanh GeLU; bias and aux (pre-activation store) optional.
    Gelu,
    /// `D = (AB) * gelu'(aux)`.
    DGelu,
}

/// One operand in ferrotron's row-major terms.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LtMat {
    pub addr: u64,
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
    pub stride: i64,
}

/// A validated GEMM, ferrotron's row-major description.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LtGemm {
    pub input: DType,
    pub output: DType,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: i32,
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
    pub a: LtMat,
    pub b: LtMat,
    pub c: LtMat,
    pub d: LtMat,
    pub bias: u64,
    pub aux: Option<LtMat>,
    pub epilogue: LtEpilogue,
}

fn lt_err(what: &'static str) -> impl Fn(CublasError) -> Error {
    move |e| Error::Backend {
        backend: "cublaslt",
        message: format!("{what}: {e:?}"),
    }
}

/// Owns cuBLASLt descriptors and destroys them on drop.
#[derive(Default)]
struct Descs {
    desc: Option<sys::cublasLtMatmulDesc_t>,
    layouts: Vec<sys::cublasLtMatrixLayout_t>,
    pref: Option<sys::cublasLtMatmulPreference_t>,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by cuBLASLt and is destroyed once.
        unsafe {
            if let Some(d) = self.desc.take() {
                let _ = result::destroy_matmul_desc(d);
            }
            for l in self.layouts.drain(..) {
                let _ = result::destroy_matrix_layout(l);
            }
            if let Some(p) = self.pref.take() {
                let _ = result::destroy_matmul_pref(p);
            }
        }
    }
}

fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: desc is live; `v` is the attribute's documented type and size.
    unsafe {
        result::set_matmul_desc_attribute(
            desc,
            attr,
            (v as *const T).cast::<c_void>(),
            core::mem::size_of::<T>(),
        )
    }
    .map_err(lt_err("cublasLtMatmulDescSetAttribute"))
}

/// A column-major layout `rows x cols`, ld, batched with `stride`.
fn layout(
    descs: &mut Descs,
    ty: sys::cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
    batch: i32,
    stride: i64,
) -> Result<sys::cublasLtMatrixLayout_t> {
    let l = result::create_matrix_layout(ty, rows, cols, ld)
        .map_err(lt_err("cublasLtMatrixLayoutCreate"))?;
    descs.layouts.push(l);
    if batch > 1 {
        use sys::cublasLtMatrixLayoutAttribute_t as A;
        for (attr, ptr, size) in [
            (
                A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                (&batch as *const i32).cast::<c_void>(),
                4,
            ),
            (
                A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                (&stride as *const i64).cast::<c_void>(),
                8,
            ),
        ] {
            // SAFETY: l is live; the values are the attributes' types (i32, i64).
            unsafe { result::set_matrix_layout_attribute(l, attr, ptr, size) }
                .map_err(lt_err("cublasLtMatrixLayoutSetAttribute"))?;
        }
    }
    Ok(l)
}

/// Enqueues `g` on `stream` with `workspace` (`WORKSPACE_BYTES`, device).
pub(crate) fn matmul(
    g: &LtGemm,
    stream: cudarc::driver::sys::CUstream,
    workspace: u64,
) -> Result<()> {
    let h = handle().map_err(|reason| Error::BackendUnavailable {
        backend: "cublaslt",
        reason,
    })?;
    let h = h.lock().unwrap_or_else(|p| p.into_inner());
    let (it, ot) = (data_type(g.input)?, data_type(g.output)?);
    if let Some(x) = g.aux {
        if x.ld % 8 != 0 {
            return Err(Error::invalid(
                "gemm",
                "ld_aux",
                "a multiple of 8 for cuBLASLt's GELU aux matrix",
                x.ld,
            ));
        }
    }
    let mut descs = Descs::default();
    let desc = result::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        sys::cudaDataType_t::CUDA_R_32F,
    )
    .map_err(lt_err("cublasLtMatmulDescCreate"))?;
    descs.desc = Some(desc);
    use sys::cublasLtMatmulDescAttributes_t as D;
    // cublasOperation_t as its C int: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
    let op = |t: bool| t as i32;
    // First operand: B's storage; second: A's.
    set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &op(g.trans_b))?;
    set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &op(g.trans_a))?;
    use sys::cublasLtEpilogue_t as E;
    let epi = match (g.epilogue, g.bias != 0, g.aux.is_some()) {
        (LtEpilogue::Default, _, _) => E::CUBLASLT_EPILOGUE_DEFAULT,
        (LtEpilogue::Bias, _, _) => E::CUBLASLT_EPILOGUE_BIAS,
        (LtEpilogue::Gelu, false, false) => E::CUBLASLT_EPILOGUE_GELU,
        (LtEpilogue::Gelu, false, true) => E::CUBLASLT_EPILOGUE_GELU_AUX,
        (LtEpilogue::Gelu, true, false) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
        (LtEpilogue::Gelu, true, true) => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        (LtEpilogue::DGelu, _, _) => E::CUBLASLT_EPILOGUE_DGELU,
    };
    set_desc(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
    if g.bias != 0 {
        set_desc(desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias)?;
    }
    if let Some(x) = g.aux {
        set_desc(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &x.addr)?;
        set_desc(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &x.ld)?;
        if g.batch > 1 {
            set_desc(
                desc,
                D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                &x.stride,
            )?;
        }
    }
    // op(B) is [k, n] and op(A) [m, k] in row-major terms.
    debug_assert_eq!(if g.trans_b { g.b.cols } else { g.b.rows }, g.k);
    debug_assert_eq!(if g.trans_a { g.a.rows } else { g.a.cols }, g.k);
    // Column-major views of the row-major storage: rows and cols swap.
    let la = layout(
        &mut descs, it, g.b.cols, g.b.rows, g.b.ld, g.batch, g.b.stride,
    )?;
    let lb = layout(
        &mut descs, it, g.a.cols, g.a.rows, g.a.ld, g.batch, g.a.stride,
    )?;
    let lc = layout(&mut descs, ot, g.n, g.m, g.c.ld, g.batch, g.c.stride)?;
    let ld = layout(&mut descs, ot, g.n, g.m, g.d.ld, g.batch, g.d.stride)?;
    let pref = result::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
    descs.pref = Some(pref);
    // C is unused when beta == 0; cuBLASLt still wants a valid pointer.
    let c = if g.beta == 0.0 { g.d.addr } else { g.c.addr };
    // The heuristic assumes 256-byte aligned operands unless told otherwise.
    let align = |addr: u64| 1u32 << addr.trailing_zeros().min(8);
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    let ws = WORKSPACE_BYTES as u64;
    let prefs: [(P, u64); 5] = [
        (P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws),
        (
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            align(g.b.addr) as u64,
        ),
        (
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            align(g.a.addr) as u64,
        ),
        (
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            align(c) as u64,
        ),
        (
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
            align(g.d.addr) as u64,
        ),
    ];
    for (attr, v) in prefs {
        // The workspace size is a u64; the alignments are u32.
        let small = v as u32;
        let (ptr, size) = if attr == P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES {
            ((&v as *const u64).cast::<c_void>(), 8)
        } else {
            ((&small as *const u32).cast::<c_void>(), 4)
        };
        // SAFETY: pref is live; ptr/size are the attribute's type.
        unsafe { result::set_matmul_pref_attribute(pref, attr, ptr, size) }
            .map_err(lt_err("cublasLtMatmulPreferenceSetAttribute"))?;
    }
    // SAFETY: every descriptor is live and describes the buffers below.
    let heuristic = unsafe { result::get_matmul_algo_heuristic(h.0, desc, la, lb, lc, ld, pref) }
        .map_err(lt_err(
        "cublasLtMatmulAlgoGetHeuristic (no algorithm for this GEMM)",
    ))?;
    // SAFETY: the op validated every buffer against these layouts (lengths,
    // devices); the workspace holds WORKSPACE_BYTES; alpha/beta are f32 host
    // scalars as the desc's scale type says; all on `stream`, whose context
    // is current.
    unsafe {
        result::matmul(
            h.0,
            desc,
            (&g.alpha as *const f32).cast(),
            (&g.beta as *const f32).cast(),
            g.b.addr as *const c_void,
            la,
            g.a.addr as *const c_void,
            lb,
            c as *const c_void,
            lc,
            g.d.addr as *mut c_void,
            ld,
            &heuristic.algo,
            workspace as *mut c_void,
            WORKSPACE_BYTES,
            stream as sys::cudaStream_t,
        )
    }
    .map_err(lt_err("cublasLtMatmul"))
}
