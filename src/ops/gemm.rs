//! Tensor-core GEMM with fused epilogues (kernels: `cuda/gemm.cu`, oracle:
//! [`crate::reference::gemm`]).
//!
//! `D[b] = epilogue(alpha * op(A[b]) op(B[b]) + beta * C[b])` for row-major
//! matrices, `op(A)` `[m, k]`, `op(B)` `[k, n]`; fp16 or bf16 inputs, fp32
//! accumulation, output in the input type or fp32. The three products of a
//! linear layer `Y = X W^T` (`[tokens, in] x [out, in]`) are:
//! forward `Gemm::new(tokens, out, in).trans_b(true)`; dgrad
//! `dX = dY W` `Gemm::new(tokens, in, out)`; wgrad `dW = dY^T X`
//! `Gemm::new(out, in, tokens).trans_a(true)`, with `beta = 1` and an fp32
//! `D` for Megatron's gradient-accumulation fusion into `main_grad`.
//!
//! ```no_run
//! use ferrotron::{Device, ops::gemm::{Gemm, GemmInputs, Epilogue, Aux}, ops::Gelu};
//! use half::bf16;
//! let dev = Device::emu();
//! let stream = dev.new_stream()?;
//! let (t, i, o) = (4, 8, 16);
//! let x = dev.upload(&vec![bf16::from_f32(0.5); t * i])?;
//! let w = dev.upload(&vec![bf16::from_f32(0.25); o * i])?;
//! let bias = dev.upload(&vec![bf16::from_f32(0.1); o])?;
//! let mut y = dev.alloc_zeros::<bf16>(t * o)?;
//! let mut pre = dev.alloc_zeros::<bf16>(t * o)?;
//! Gemm::new(t, o, i).trans_b(true).epilogue(Epilogue::BiasGelu(Gelu::Tanh)).run(
//!     &stream,
//!     GemmInputs { a: &x, b: &w, bias: Some(&bias), c: None },
//!     Aux::Store(&mut pre),
//!     &mut y,
//! )?;
//! # Ok::<(), ferrotron::Error>(())
//! ```

use crate::backend::{DeviceRead, DeviceWrite, Stream};
use crate::core::dtype::FloatElement;
use crate::core::plan::gemm::{self as plan, GemmTile};
use crate::core::{DType, Element, Result};
use crate::kernel_params::{FtnColumnPartialsParams, FtnColumnSumParams, FtnGemmParams};
use crate::kernels::{self, Kernel};
use crate::ops::gemm_provider::{self as provider, GemmKey, GemmProvider, Provider, Selection};
use crate::ops::gemm_sm90::{self as sm90, KernelChoice, Operand};
pub use crate::ops::gemm_sm90::{GemmKernel, KernelReason};
use crate::ops::Gelu;
use crate::{Device, Error};

const OP: &str = "gemm";
const BIAS_GRAD: &str = "gemm_bias_grad";

pub use crate::core::activation::Epilogue;

/// The auxiliary `[m, n]` (per batch) matrix of the GeLU epilogues, in the
/// output type, laid out with `ld_aux` / `stride_aux`.
pub enum Aux<'a, O: Element> {
    None,
    /// `BiasGelu`: write the pre-activation here.
    Store(&'a mut dyn DeviceWrite<O>),
    /// `DGelu`: read the pre-activation from here.
    PreActivation(&'a dyn DeviceRead<O>),
}

/// The read-only operands. `c = None` with `beta != 0` accumulates into `D`
/// itself (`C = D`, using `D`'s layout).
pub struct GemmInputs<'a, T: Element, O: Element> {
    pub a: &'a dyn DeviceRead<T>,
    pub b: &'a dyn DeviceRead<T>,
    /// `[n]`, the input type.
    pub bias: Option<&'a dyn DeviceRead<T>>,
    pub c: Option<&'a dyn DeviceRead<O>>,
}

/// One (batched) GEMM. Leading dimensions default to the stored row length,
/// batch strides to a packed `rows * ld`; both are in elements. A stride of 0
/// for `A` or `B` broadcasts one matrix to every batch entry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
    pub lda: Option<usize>,
    pub ldb: Option<usize>,
    pub ldc: Option<usize>,
    pub ldd: Option<usize>,
    pub ld_aux: Option<usize>,
    pub stride_a: Option<usize>,
    pub stride_b: Option<usize>,
    pub stride_c: Option<usize>,
    pub stride_d: Option<usize>,
    pub stride_aux: Option<usize>,
    pub epilogue: Epilogue,
    /// Force a block tile (default: the plan chooses from the shape).
    pub tile: Option<GemmTile>,
    /// Use 16-byte `cp.async` copies where the operands allow (default);
    /// `false` forces the element-load path.
    pub fast_path: bool,
    /// Which implementation runs it (default Auto; `FTN_GEMM_PROVIDER`
    /// applies when this is Auto; Auto with `tile` or `fast_path = false`
    /// set is ferrotron). See [`Gemm::selection`].
    pub provider: GemmProvider,
    /// Which of ferrotron's kernels (default Auto: `FTN_GEMM_KERNEL`, else
    /// wgmma on an sm_90 GPU and mma elsewhere). See [`Gemm::kernel_choice`].
    pub kernel: GemmKernel,
}

/// One operand's stored layout, validated.
#[derive(Clone, Copy)]
struct Layout {
    ld: usize,
    stride: usize,
}

fn to_i64(arg: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(OP, arg, "at most i64::MAX", v))
}

/// Validates the layout of a stored `[rows, cols]` matrix repeated `batch`
/// times and returns it with the number of elements the buffer must hold.
#[allow(clippy::too_many_arguments)]
fn layout(
    arg: &'static str,
    ld_arg: &'static str,
    stride_arg: &'static str,
    rows: usize,
    cols: usize,
    batch: usize,
    ld: Option<usize>,
    stride: Option<usize>,
    distinct: bool,
) -> Result<(Layout, usize)> {
    let ld = ld.unwrap_or(cols.max(1));
    if ld < cols.max(1) {
        return Err(Error::invalid(
            OP,
            ld_arg,
            format!(">= {} (the stored row length of {arg})", cols.max(1)),
            ld,
        ));
    }
    let overflow = || Error::invalid(OP, arg, "a size that fits in i64", "overflow");
    let extent = match (rows, cols) {
        (0, _) | (_, 0) => 0,
        _ => (rows - 1)
            .checked_mul(ld)
            .and_then(|v| v.checked_add(cols))
            .ok_or_else(overflow)?,
    };
    let stride = match stride {
        Some(s) => s,
        None => rows.checked_mul(ld).ok_or_else(overflow)?,
    };
    if distinct && batch > 1 && stride < extent {
        return Err(Error::invalid(
            OP,
            stride_arg,
            format!(">= {extent} (batch entries of {arg} must not overlap)"),
            stride,
        ));
    }
    let needed = if extent == 0 || batch == 0 {
        0
    } else {
        (batch - 1)
            .checked_mul(stride)
            .and_then(|v| v.checked_add(extent))
            .ok_or_else(overflow)?
    };
    to_i64(arg, needed)?;
    to_i64(ld_arg, ld)?;
    to_i64(stride_arg, stride)?;
    Ok((Layout { ld, stride }, needed))
}

fn check_buf<T: Element>(
    stream: &Stream,
    arg: &'static str,
    buf: &dyn DeviceRead<T>,
    needed: usize,
) -> Result<()> {
    stream.device().check_same(OP, arg, buf.device())?;
    crate::core::validate::len_at_least(OP, arg, buf.len(), needed)
}

/// The kernel of a tile for (input dtype, output dtype).
fn gemm_kernel(
    tile: GemmTile,
    input: DType,
    output: DType,
) -> Result<&'static Kernel<FtnGemmParams>> {
    let family = match tile {
        GemmTile::T128x128 => &kernels::GEMM_128X128,
        GemmTile::T64x64 => &kernels::GEMM_64X64,
    };
    family.for_dtypes(&[input, output])
}

impl Gemm {
    /// `D = op(A) op(B)`, `[m, k] x [k, n]`, no transposes, batch 1.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Gemm {
            m,
            n,
            k,
            batch: 1,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
            lda: None,
            ldb: None,
            ldc: None,
            ldd: None,
            ld_aux: None,
            stride_a: None,
            stride_b: None,
            stride_c: None,
            stride_d: None,
            stride_aux: None,
            epilogue: Epilogue::None,
            tile: None,
            fast_path: true,
            provider: GemmProvider::Auto,
            kernel: GemmKernel::Auto,
        }
    }
    pub fn kernel(self, kernel: GemmKernel) -> Self {
        Gemm { kernel, ..self }
    }

    /// The stored layouts of A and B (validated) and the elements each
    /// buffer must hold.
    fn operand_layouts(&self) -> Result<((Layout, usize), (Layout, usize))> {
        let (m, n, k, batch) = (self.m, self.n, self.k, self.batch);
        let (ra, ca) = if self.trans_a { (k, m) } else { (m, k) };
        let (rb, cb) = if self.trans_b { (n, k) } else { (k, n) };
        let a = layout(
            "a",
            "lda",
            "stride_a",
            ra,
            ca,
            batch,
            self.lda,
            self.stride_a,
            false,
        )?;
        let b = layout(
            "b",
            "ldb",
            "stride_b",
            rb,
            cb,
            batch,
            self.ldb,
            self.stride_b,
            false,
        )?;
        Ok((a, b))
    }

    /// Which of ferrotron's kernels runs this GEMM with operands `a` and `b`
    /// when ferrotron is the provider ([`Gemm::selection`]), and why: see
    /// [`crate::ops::gemm_sm90`]. `FTN_LOG=1` also prints it on first use.
    pub fn kernel_choice<T: FloatElement>(
        &self,
        device: &Device,
        a: &dyn DeviceRead<T>,
        b: &dyn DeviceRead<T>,
    ) -> Result<KernelChoice> {
        let ((la, _), (lb, _)) = self.operand_layouts()?;
        self.kernel_choice_at(device, T::DTYPE.size(), a.addr(), &la, b.addr(), &lb)
            .map(|(c, _, _)| c)
    }

    fn kernel_choice_at(
        &self,
        device: &Device,
        es: usize,
        a_addr: u64,
        la: &Layout,
        b_addr: u64,
        lb: &Layout,
    ) -> Result<(KernelChoice, Operand, Operand)> {
        let (m, n, k) = (self.m, self.n, self.k);
        let (ra, ca) = if self.trans_a { (k, m) } else { (m, k) };
        let (rb, cb) = if self.trans_b { (n, k) } else { (k, n) };
        let op = |addr, rows, cols, l: &Layout| Operand {
            addr,
            rows,
            cols,
            ld: l.ld,
            stride: l.stride,
        };
        let (a, b) = (op(a_addr, ra, ca, la), op(b_addr, rb, cb, lb));
        let ok = sm90::eligible(
            m,
            n,
            k,
            self.batch,
            es,
            &a,
            &b,
            self.tile.is_some() || !self.fast_path,
        );
        let c = sm90::choose(self.kernel, GemmKernel::from_env()?, device, ok);
        Ok((c, a, b))
    }
    pub fn provider(self, provider: GemmProvider) -> Self {
        Gemm { provider, ..self }
    }

    /// The provider cache key of this GEMM with inputs `T` and output `O`.
    pub fn key<T: FloatElement, O: FloatElement>(&self) -> GemmKey {
        GemmKey {
            m: self.m,
            n: self.n,
            k: self.k,
            batch: self.batch,
            input: T::DTYPE,
            output: O::DTYPE,
            trans_a: self.trans_a,
            trans_b: self.trans_b,
            epilogue: self.epilogue,
        }
    }

    /// Which provider runs (or would run) this GEMM on `device`, and why:
    /// on the emulator always ferrotron; an explicit `CublasLt` that cannot
    /// run is an error (`BackendUnavailable`, or `InvalidArgument` for a GEMM
    /// cuBLASLt cannot express). Auto before its one-time measurement says
    /// `Reason::NeedsMeasurement`.
    pub fn selection<T: FloatElement, O: FloatElement>(
        &self,
        device: &Device,
    ) -> Result<Selection> {
        let key = self.key::<T, O>();
        // A forced tile or the element-load path only mean something for
        // ferrotron's kernel: Auto (and the env) keep to it.
        if self.provider == GemmProvider::Auto && (self.tile.is_some() || !self.fast_path) {
            return Ok(Selection {
                provider: Provider::Ferrotron,
                reason: provider::Reason::FerrotronOptions,
            });
        }
        let sel = provider::resolve(
            self.provider,
            GemmProvider::from_env()?,
            device.kind(),
            cublaslt_status(device),
            &key,
        )?;
        if sel.reason == provider::Reason::NeedsMeasurement {
            if let Some(p) = provider::ProviderCache::global().get(&key) {
                return Ok(Selection {
                    provider: p,
                    reason: provider::Reason::Measured,
                });
            }
        }
        Ok(sel)
    }
    pub fn trans_a(self, t: bool) -> Self {
        Gemm { trans_a: t, ..self }
    }
    pub fn trans_b(self, t: bool) -> Self {
        Gemm { trans_b: t, ..self }
    }
    pub fn alpha(self, alpha: f32) -> Self {
        Gemm { alpha, ..self }
    }
    pub fn beta(self, beta: f32) -> Self {
        Gemm { beta, ..self }
    }
    pub fn batch(self, batch: usize) -> Self {
        Gemm { batch, ..self }
    }
    pub fn epilogue(self, epilogue: Epilogue) -> Self {
        Gemm { epilogue, ..self }
    }
    pub fn tile(self, tile: Option<GemmTile>) -> Self {
        Gemm { tile, ..self }
    }
    pub fn fast_path(self, fast_path: bool) -> Self {
        Gemm { fast_path, ..self }
    }
    /// Leading dimensions of A, B, C, D and aux (`None`: packed).
    pub fn lds(
        self,
        lda: Option<usize>,
        ldb: Option<usize>,
        ldc: Option<usize>,
        ldd: Option<usize>,
        ld_aux: Option<usize>,
    ) -> Self {
        Gemm {
            lda,
            ldb,
            ldc,
            ldd,
            ld_aux,
            ..self
        }
    }
    /// Batch strides of A, B, C, D and aux (`None`: packed).
    pub fn strides(
        self,
        a: Option<usize>,
        b: Option<usize>,
        c: Option<usize>,
        d: Option<usize>,
        aux: Option<usize>,
    ) -> Self {
        Gemm {
            stride_a: a,
            stride_b: b,
            stride_c: c,
            stride_d: d,
            stride_aux: aux,
            ..self
        }
    }

    /// Validates everything, then enqueues the GEMM on `stream` with the
    /// provider [`Gemm::selection`] names. Auto's first call for a key on a
    /// GPU with cuBLASLt times both providers on scratch buffers of this
    /// call's sizes (synchronising the stream), once per process.
    pub fn run<T: FloatElement, O: FloatElement>(
        &self,
        stream: &Stream,
        inputs: GemmInputs<'_, T, O>,
        aux: Aux<'_, O>,
        d: &mut dyn DeviceWrite<O>,
    ) -> Result<()> {
        self.run_inner(stream, inputs, aux, d, false)
    }

    fn run_inner<T: FloatElement, O: FloatElement>(
        &self,
        stream: &Stream,
        inputs: GemmInputs<'_, T, O>,
        aux: Aux<'_, O>,
        d: &mut dyn DeviceWrite<O>,
        measuring: bool,
    ) -> Result<()> {
        if !matches!(T::DTYPE, DType::F16 | DType::BF16) {
            return Err(Error::invalid(OP, "a", "fp16 or bf16 inputs", T::DTYPE));
        }
        if O::DTYPE != T::DTYPE && O::DTYPE != DType::F32 {
            return Err(Error::invalid(
                OP,
                "d",
                format!("an output of the input type ({}) or f32", T::DTYPE),
                O::DTYPE,
            ));
        }
        for (arg, v) in [
            ("m", self.m),
            ("n", self.n),
            ("k", self.k),
            ("batch", self.batch),
        ] {
            to_i64(arg, v)?;
        }
        if !self.alpha.is_finite() || !self.beta.is_finite() {
            return Err(Error::invalid(
                OP,
                "alpha/beta",
                "finite values",
                format!("{}/{}", self.alpha, self.beta),
            ));
        }
        let (m, n, k, batch) = (self.m, self.n, self.k, self.batch);
        let (ra, ca) = if self.trans_a { (k, m) } else { (m, k) };
        let (rb, cb) = if self.trans_b { (n, k) } else { (k, n) };
        let ((la, need_a), (lb, need_b)) = self.operand_layouts()?;
        let (ld, need_d) = layout(
            "d",
            "ldd",
            "stride_d",
            m,
            n,
            batch,
            self.ldd,
            self.stride_d,
            true,
        )?;
        check_buf(stream, "a", inputs.a, need_a)?;
        check_buf(stream, "b", inputs.b, need_b)?;
        check_buf(stream, "d", d, need_d)?;

        // C: a separate buffer, or D itself when beta != 0 and c is None.
        let mut need_c = 0;
        let (c_addr, lc) = match (self.beta != 0.0, inputs.c) {
            (false, Some(_)) => {
                return Err(Error::invalid(OP, "c", "None when beta == 0", "a buffer"))
            }
            (false, None) => (0, Layout { ld: 0, stride: 0 }),
            (true, Some(c)) => {
                let (lc, need) = layout(
                    "c",
                    "ldc",
                    "stride_c",
                    m,
                    n,
                    batch,
                    self.ldc,
                    self.stride_c,
                    false,
                )?;
                check_buf(stream, "c", c, need)?;
                need_c = need;
                (c.addr(), lc)
            }
            (true, None) => {
                if self.ldc.is_some() || self.stride_c.is_some() {
                    return Err(Error::invalid(
                        OP,
                        "ldc/stride_c",
                        "unset when C is D (c = None)",
                        "set",
                    ));
                }
                (d.addr(), ld)
            }
        };

        // Epilogue operands.
        let needs_bias = matches!(self.epilogue, Epilogue::Bias);
        let allows_bias = matches!(self.epilogue, Epilogue::Bias | Epilogue::BiasGelu(_));
        match inputs.bias {
            Some(b) if allows_bias => check_buf(stream, "bias", b, n)?,
            Some(_) => {
                return Err(Error::invalid(
                    OP,
                    "bias",
                    format!("None with epilogue {:?}", self.epilogue),
                    "a buffer",
                ))
            }
            None if needs_bias => {
                return Err(Error::invalid(
                    OP,
                    "bias",
                    "a [n] buffer for Epilogue::Bias",
                    "None",
                ))
            }
            None => {}
        }
        let (code, gelu) = match self.epilogue {
            Epilogue::None => (crate::kernel_params::FTN_GEMM_EPI_NONE, Gelu::Tanh),
            Epilogue::Bias => (crate::kernel_params::FTN_GEMM_EPI_BIAS, Gelu::Tanh),
            Epilogue::BiasGelu(g) => (crate::kernel_params::FTN_GEMM_EPI_BIAS_GELU, g),
            Epilogue::DGelu(g) => (crate::kernel_params::FTN_GEMM_EPI_DGELU, g),
        };
        let aux_layout = |distinct| {
            layout(
                "aux",
                "ld_aux",
                "stride_aux",
                m,
                n,
                batch,
                self.ld_aux,
                self.stride_aux,
                distinct,
            )
        };
        let (aux_addr, lx, need_aux) = match (self.epilogue, aux) {
            (Epilogue::BiasGelu(_), Aux::Store(buf)) => {
                let (lx, need) = aux_layout(true)?;
                check_buf(stream, "aux", buf, need)?;
                (buf.addr(), lx, need)
            }
            (Epilogue::DGelu(_), Aux::PreActivation(buf)) => {
                let (lx, need) = aux_layout(false)?;
                check_buf(stream, "aux", buf, need)?;
                (buf.addr(), lx, need)
            }
            (Epilogue::DGelu(_), _) => {
                return Err(Error::invalid(
                    OP,
                    "aux",
                    "Aux::PreActivation for Epilogue::DGelu",
                    "another Aux",
                ))
            }
            (_, Aux::None) => (0, Layout { ld: 0, stride: 0 }, 0),
            (e, _) => {
                return Err(Error::invalid(
                    OP,
                    "aux",
                    format!("Aux::None with epilogue {e:?}"),
                    "an aux buffer",
                ))
            }
        };

        if m == 0 || n == 0 || batch == 0 {
            return Ok(());
        }
        let key = self.key::<T, O>();
        let cache = provider::ProviderCache::global();
        let mut sel = self.selection::<T, O>(stream.device())?;
        let explicit = matches!(
            sel.reason,
            provider::Reason::Requested | provider::Reason::Env
        );
        if sel.reason == provider::Reason::NeedsMeasurement {
            let scratch = Scratch {
                a: need_a,
                b: need_b,
                c: inputs.c.map(|_| need_c),
                d: need_d,
                bias: inputs.bias.is_some(),
                aux: need_aux,
            };
            sel.provider = cache.choose(&key, || self.measure::<T, O>(stream, &scratch))?;
        } else if !measuring {
            cache.log_once(&key, sel.provider, None);
        }
        if sel.provider == Provider::CublasLt {
            let mat = |addr: u64, l: &Layout, rows: usize, cols: usize| LtMat {
                addr,
                rows: rows as u64,
                cols: cols as u64,
                ld: l.ld as i64,
                stride: l.stride as i64,
            };
            let (c_addr, lc) = if self.beta == 0.0 {
                (d.addr(), ld)
            } else {
                (c_addr, lc)
            };
            let lt = LtGemm {
                input: T::DTYPE,
                output: O::DTYPE,
                m: m as u64,
                n: n as u64,
                k: k as u64,
                batch: i32::try_from(batch).map_err(|_| {
                    Error::invalid(OP, "batch", "at most i32::MAX for cuBLASLt", batch)
                })?,
                trans_a: self.trans_a,
                trans_b: self.trans_b,
                alpha: self.alpha,
                beta: self.beta,
                a: mat(inputs.a.addr(), &la, ra, ca),
                b: mat(inputs.b.addr(), &lb, rb, cb),
                c: mat(c_addr, &lc, m, n),
                d: mat(d.addr(), &ld, m, n),
                bias: inputs.bias.map_or(0, |b| b.addr()),
                aux: (aux_addr != 0).then(|| mat(aux_addr, &lx, m, n)),
                epilogue: match self.epilogue {
                    Epilogue::None => LtEpilogue::Default,
                    Epilogue::Bias => LtEpilogue::Bias,
                    Epilogue::BiasGelu(_) => LtEpilogue::Gelu,
                    Epilogue::DGelu(_) => LtEpilogue::DGelu,
                },
            };
            match run_cublaslt(stream, &lt) {
                Ok(()) => return Ok(()),
                // Auto chose cuBLASLt for this key, but it rejects this
                // call's layout (e.g. an aux leading dimension; the key has
                // no leading dimensions): nothing was enqueued, so ferrotron
                // runs it instead.
                Err(_) if !explicit => {}
                Err(e) => return Err(e),
            }
        }
        let es = T::DTYPE.size();
        let al = |addr: u64, l: &Layout, rows: usize| {
            addr % 16 == 0
                && (l.ld * es) % 16 == 0
                && (batch == 1 || (l.stride * es) % 16 == 0 || rows == 0)
        };
        let aligned =
            self.fast_path && al(inputs.a.addr(), &la, ra) && al(inputs.b.addr(), &lb, rb);
        let params = FtnGemmParams {
            d: d.addr() as *mut _,
            a: inputs.a.addr() as *const _,
            b: inputs.b.addr() as *const _,
            c: c_addr as *const _,
            bias: inputs.bias.map_or(0, |b| b.addr()) as *const _,
            aux: aux_addr as *mut _,
            m: m as i64,
            n: n as i64,
            k: k as i64,
            batch: batch as i64,
            lda: la.ld as i64,
            ldb: lb.ld as i64,
            ldc: lc.ld as i64,
            ldd: ld.ld as i64,
            ld_aux: lx.ld as i64,
            stride_a: la.stride as i64,
            stride_b: lb.stride as i64,
            stride_c: lc.stride as i64,
            stride_d: ld.stride as i64,
            stride_aux: lx.stride as i64,
            alpha: self.alpha,
            beta: self.beta,
            trans_a: self.trans_a as u32,
            trans_b: self.trans_b as u32,
            epilogue: code,
            gelu: gelu.code(),
            aligned: aligned as u32,
        };
        let (choice, a_op, b_op) = self.kernel_choice_at(
            stream.device(),
            es,
            inputs.a.addr(),
            &la,
            inputs.b.addr(),
            &lb,
        )?;
        if !measuring {
            sm90::log_once(&key, &choice);
        }
        if choice.kernel == GemmKernel::Wgmma {
            return sm90::launch(stream, params, &a_op, &b_op, T::DTYPE, O::DTYPE);
        }
        let p = plan::plan(m as u64, n as u64, batch as u64, self.tile).ok_or_else(|| {
            Error::invalid(
                OP,
                "m, n",
                "at most 2^31-1 output tiles",
                format!("{m}x{n}"),
            )
        })?;
        stream.launch(gemm_kernel(p.tile, T::DTYPE, O::DTYPE)?, p.cfg, params)
    }
}

/// Whether cuBLASLt can run on `device` (`Err` says why not).
fn cublaslt_status(device: &Device) -> std::result::Result<(), String> {
    match device.kind() {
        crate::backend::BackendKind::Emu => {
            Err("the emulator runs only ferrotron's kernels".into())
        }
        #[cfg(feature = "cuda")]
        crate::backend::BackendKind::Cuda => crate::backend::cublaslt::status(),
        #[cfg(not(feature = "cuda"))]
        crate::backend::BackendKind::Cuda => {
            Err("ferrotron was built without feature `cuda`".into())
        }
    }
}

#[cfg(feature = "cuda")]
use crate::backend::cublaslt::{LtEpilogue, LtGemm, LtMat};

#[cfg(feature = "cuda")]
fn run_cublaslt(stream: &Stream, g: &LtGemm) -> Result<()> {
    let raw = stream
        .cuda_bound_raw()?
        .ok_or_else(|| Error::BackendUnavailable {
            backend: "cublaslt",
            reason: "the emulator runs only ferrotron's kernels".into(),
        })?;
    let ws = stream.workspace(crate::backend::cublaslt::WORKSPACE_BYTES)?;
    crate::backend::cublaslt::matmul(g, raw, ws)
}

/// Without feature `cuda` cuBLASLt is never selected; these keep `run` one
/// piece of code.
#[cfg(not(feature = "cuda"))]
#[derive(Clone, Copy)]
enum LtEpilogue {
    Default,
    Bias,
    Gelu,
    DGelu,
}
#[cfg(not(feature = "cuda"))]
#[allow(dead_code)]
struct LtMat {
    addr: u64,
    rows: u64,
    cols: u64,
    ld: i64,
    stride: i64,
}
#[cfg(not(feature = "cuda"))]
#[allow(dead_code)]
struct LtGemm {
    input: DType,
    output: DType,
    m: u64,
    n: u64,
    k: u64,
    batch: i32,
    trans_a: bool,
    trans_b: bool,
    alpha: f32,
    beta: f32,
    a: LtMat,
    b: LtMat,
    c: LtMat,
    d: LtMat,
    bias: u64,
    aux: Option<LtMat>,
    epilogue: LtEpilogue,
}
#[cfg(not(feature = "cuda"))]
fn run_cublaslt(_: &Stream, _: &LtGemm) -> Result<()> {
    Err(Error::BackendUnavailable {
        backend: "cublaslt",
        reason: "ferrotron was built without feature `cuda`".into(),
    })
}

/// Element counts of one call's operands, for the measurement's scratch
/// buffers (`c: None`: C is D or unused).
struct Scratch {
    a: usize,
    b: usize,
    c: Option<usize>,
    d: usize,
    bias: bool,
    aux: usize,
}

/// Calls per provider timed by Auto's measurement (after one warm-up).
const MEASURE_REPS: usize = 5;

impl Gemm {
    /// Times both providers for this GEMM on zeroed scratch buffers of the
    /// call's sizes; a cuBLASLt failure (e.g. no algorithm) is "not
    /// measured", so ferrotron is chosen.
    fn measure<T: FloatElement, O: FloatElement>(
        &self,
        stream: &Stream,
        s: &Scratch,
    ) -> Result<provider::Timings> {
        let dev = stream.device();
        let a = dev.alloc_zeros::<T>(s.a)?;
        let b = dev.alloc_zeros::<T>(s.b)?;
        let bias = if s.bias {
            Some(dev.alloc_zeros::<T>(self.n)?)
        } else {
            None
        };
        let c = match s.c {
            Some(len) => Some(dev.alloc_zeros::<O>(len)?),
            None => None,
        };
        let mut d = dev.alloc_zeros::<O>(s.d)?;
        let mut aux = dev.alloc_zeros::<O>(s.aux)?;
        let mut time = |p: GemmProvider| -> Result<f64> {
            let op = self.provider(p);
            let mut t0 = None;
            for i in 0..=MEASURE_REPS {
                if i == 1 {
                    t0 = Some(stream.record_event()?);
                }
                let x = match self.epilogue {
                    Epilogue::BiasGelu(_) if s.aux > 0 => Aux::Store(&mut aux),
                    Epilogue::DGelu(_) => Aux::PreActivation(&aux),
                    _ => Aux::None,
                };
                let inputs = GemmInputs {
                    a: &a,
                    b: &b,
                    bias: bias.as_ref().map(|b| b as _),
                    c: c.as_ref().map(|b| b as _),
                };
                op.run_inner(stream, inputs, x, &mut d, true)?;
            }
            let t1 = stream.record_event()?;
            t1.synchronize()?;
            let t0 = t0.ok_or_else(|| Error::invalid(OP, "reps", ">= 1", 0))?;
            Ok(t0.elapsed_ms(&t1)? as f64 / MEASURE_REPS as f64)
        };
        let ferrotron_ms = time(GemmProvider::Ferrotron)?;
        let cublaslt_ms = time(GemmProvider::CublasLt).ok();
        Ok(provider::Timings {
            ferrotron_ms,
            cublaslt_ms,
        })
    }
}

/// Bias gradient: `dbias[c] = sum_r dy[r, c]` over a row-major `[rows, cols]`
/// matrix (leading dimension `ld`, default `cols`), fp32 accumulation in a
/// fixed order (bitwise reproducible), result in `T`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BiasGrad {
    pub rows: usize,
    pub cols: usize,
    pub ld: Option<usize>,
}

impl BiasGrad {
    pub fn new(rows: usize, cols: usize) -> Self {
        BiasGrad {
            rows,
            cols,
            ld: None,
        }
    }

    pub fn run<T: FloatElement>(
        &self,
        stream: &Stream,
        dy: &dyn DeviceRead<T>,
        dbias: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        let (rows, cols) = (self.rows, self.cols);
        let ld = self.ld.unwrap_or(cols.max(1));
        if ld < cols.max(1) {
            return Err(Error::invalid(
                BIAS_GRAD,
                "ld",
                format!(">= {}", cols.max(1)),
                ld,
            ));
        }
        let need = match (rows, cols) {
            (0, _) | (_, 0) => 0,
            _ => (rows - 1)
                .checked_mul(ld)
                .and_then(|v| v.checked_add(cols))
                .filter(|&v| v <= i64::MAX as usize)
                .ok_or_else(|| Error::invalid(BIAS_GRAD, "rows * ld", "fits in i64", "overflow"))?,
        };
        stream.device().check_same(BIAS_GRAD, "dy", dy.device())?;
        stream
            .device()
            .check_same(BIAS_GRAD, "dbias", dbias.device())?;
        crate::core::validate::len_at_least(BIAS_GRAD, "dy", dy.len(), need)?;
        if dbias.len() != cols {
            return Err(Error::invalid(
                BIAS_GRAD,
                "dbias",
                format!("exactly {cols} elements"),
                dbias.len(),
            ));
        }
        if cols == 0 {
            return Ok(());
        }
        if rows == 0 {
            return stream.fill_bytes(dbias, 0);
        }
        let (per, chunks) = plan::column_sum_chunks(rows as u64);
        let bytes = (chunks as usize)
            .checked_mul(cols)
            .and_then(|v| v.checked_mul(4))
            .ok_or_else(|| Error::invalid(BIAS_GRAD, "cols", "a workspace that fits", cols))?;
        let partial = stream.workspace(bytes)?;
        let col_blocks = plan_blocks(cols)?;
        let partials_k = kernels::GEMM_COLUMN_PARTIALS.for_dtype(T::DTYPE)?;
        let sum_k = kernels::COLUMN_SUM_PARTIALS.for_dtype(T::DTYPE)?;
        let cfg = crate::core::LaunchConfig {
            grid: [col_blocks, chunks as u32, 1],
            block: [256, 1, 1],
            dynamic_smem_bytes: 0,
        };
        stream.launch(
            partials_k,
            cfg,
            FtnColumnPartialsParams {
                partial: partial as *mut f32,
                x: dy.addr() as *const _,
                rows: rows as i64,
                cols: cols as i64,
                ld: ld as i64,
                rows_per_chunk: per as i64,
            },
        )?;
        stream.launch(
            sum_k,
            crate::core::LaunchConfig::linear(col_blocks, 256),
            FtnColumnSumParams {
                out: dbias.addr() as *mut _,
                partial: partial as *const f32,
                chunks: chunks as i64,
                cols: cols as i64,
            },
        )
    }
}

fn plan_blocks(cols: usize) -> Result<u32> {
    u32::try_from(cols.div_ceil(256))
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| Error::invalid(BIAS_GRAD, "cols", "at most 2^39 columns", cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tile has a kernel for each (input, output) pair the op accepts:
    /// fp16/bf16 inputs, output in the input type or fp32.
    #[test]
    fn every_tile_and_dtype_pair_is_stamped() {
        for tile in [GemmTile::T128x128, GemmTile::T64x64] {
            for input in [DType::F16, DType::BF16] {
                for output in [input, DType::F32] {
                    gemm_kernel(tile, input, output).unwrap();
                }
            }
            assert!(gemm_kernel(tile, DType::F32, DType::F32).is_err());
        }
        for d in [DType::F32, DType::F16, DType::BF16] {
            kernels::GEMM_COLUMN_PARTIALS.for_dtype(d).unwrap();
        }
    }
}
