//! Which of ferrotron's two GEMM kernels runs a [`Gemm`](super::gemm::Gemm)
//! (when ferrotron, not cuBLASLt, is the provider), and the launch of the
//! Hopper one.
//!
//! * `mma`: `cuda/gemm.cu` (mma.sync + cp.async), every GPU and the emulator.
//! * `wgmma`: `cuda/gemm_sm90.cu` (wgmma + TMA, warp-specialised,
//!   persistent), built for sm_90a only.
//!
//! The choice: [`Gemm::kernel`](super::gemm::Gemm::kernel) if not `Auto`,
//! else `FTN_GEMM_KERNEL` (`auto`, `mma`, `wgmma` or `sm90`), else the
//! device's default: `wgmma` on an sm_90 GPU, `mma` elsewhere (the emulator
//! included, where wgmma is slow to emulate). A `wgmma` request falls back
//! to `mma`, with the reason in [`KernelChoice`], where it cannot run: a
//! GPU other than sm_90 or a build without sm_90a, `k = 0`, operands TMA
//! cannot address (base address, leading dimension or batch stride not
//! 16-byte aligned, batch strides that overlap or broadcast), or the
//! mma-only options (`tile`, `fast_path = false`).

use std::collections::HashSet;
use std::sync::Mutex;

use crate::backend::tensor_map::{self, TiledMap, TmaDType};
use crate::backend::{BackendKind, Stream};
use crate::core::plan::gemm as plan;
use crate::core::{DType, Result};
use crate::kernel_params::{FtnGemmParams, FtnGemmSm90Params};
use crate::kernels;
use crate::{Device, Error};

const OP: &str = "gemm";
/// The environment variable naming the kernel (`auto`, `mma`, `wgmma`/`sm90`).
pub const ENV_KERNEL: &str = "FTN_GEMM_KERNEL";

/// Which ferrotron kernel a GEMM asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GemmKernel {
    /// `FTN_GEMM_KERNEL`, else the device's default.
    #[default]
    Auto,
    /// `cuda/gemm.cu`: mma.sync with a cp.async pipeline.
    Mma,
    /// `cuda/gemm_sm90.cu`: wgmma + TMA (sm_90a, and the emulator).
    Wgmma,
}

impl GemmKernel {
    pub fn name(self) -> &'static str {
        match self {
            GemmKernel::Auto => "auto",
            GemmKernel::Mma => "mma",
            GemmKernel::Wgmma => "wgmma",
        }
    }

    /// Parses `auto`, `mma`, `wgmma` or `sm90` (case-insensitive).
    pub fn parse(s: &str) -> Result<GemmKernel> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(GemmKernel::Auto),
            "mma" => Ok(GemmKernel::Mma),
            "wgmma" | "sm90" => Ok(GemmKernel::Wgmma),
            _ => Err(Error::invalid(
                OP,
                ENV_KERNEL,
                "auto, mma, wgmma or sm90",
                s,
            )),
        }
    }

    /// `FTN_GEMM_KERNEL`, if set.
    pub fn from_env() -> Result<Option<GemmKernel>> {
        match std::env::var(ENV_KERNEL) {
            Ok(v) => GemmKernel::parse(&v).map(Some),
            Err(_) => Ok(None),
        }
    }
}

/// Why a kernel was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelReason {
    /// `Gemm::kernel` named it.
    Requested,
    /// `FTN_GEMM_KERNEL` named it.
    Env,
    /// The device's default (wgmma on sm_90, mma elsewhere).
    DeviceDefault,
    /// wgmma was asked for (or the default) but cannot run this GEMM: why.
    Fallback(&'static str),
}

/// The kernel that runs (never `Auto`) and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelChoice {
    pub kernel: GemmKernel,
    pub reason: KernelReason,
}

/// One stored operand as the GEMM validated it: `[rows, cols]` with
/// leading dimension `ld` and batch stride `stride` (elements).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand {
    pub addr: u64,
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
    pub stride: usize,
}

/// Whether TMA can address `o` (element size `es`, `batch` entries).
fn tma_addressable(o: &Operand, es: usize, batch: usize) -> std::result::Result<(), &'static str> {
    const LIMIT: u128 = 1 << 40; // strides below 2^40 bytes
    let (ld, stride) = ((o.ld * es) as u128, (o.stride * es) as u128);
    if o.addr % 16 != 0 {
        return Err("an operand's address is not 16-byte aligned (TMA)");
    }
    if ld % 16 != 0 {
        return Err("a leading dimension is not a multiple of 16 bytes (TMA)");
    }
    if o.rows as u128 > 1 << 32 || o.cols as u128 > 1 << 32 || ld >= LIMIT {
        return Err("an operand dimension beyond TMA's 2^32 elements or stride beyond 2^40 bytes");
    }
    if batch > 1 {
        if stride % 16 != 0 {
            return Err("a batch stride is not a multiple of 16 bytes (TMA)");
        }
        if (o.stride as u128) < (o.rows as u128) * (o.ld as u128) || stride >= LIMIT {
            return Err("a batch stride overlaps (or broadcasts) the matrices (TMA)");
        }
    } else if (o.rows as u128) * ld >= LIMIT {
        return Err("an operand beyond 2^40 bytes (TMA)");
    }
    Ok(())
}

/// Whether the wgmma kernel can run this GEMM (shape and operands).
#[allow(clippy::too_many_arguments)]
pub(crate) fn eligible(
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    es: usize,
    a: &Operand,
    b: &Operand,
    mma_options: bool,
) -> std::result::Result<(), &'static str> {
    if mma_options {
        return Err("a forced tile or fast_path = false (options of the mma kernel)");
    }
    if k == 0 {
        return Err("k = 0 (a TMA map needs every dimension >= 1)");
    }
    tma_addressable(a, es, batch)?;
    tma_addressable(b, es, batch)?;
    if plan::plan_sm90(m as u64, n as u64, batch as u64, 1).is_none() {
        return Err("2^31 or more output tiles");
    }
    Ok(())
}

/// The kernel for a request on `device`, given whether the GEMM is eligible.
pub(crate) fn choose(
    requested: GemmKernel,
    env: Option<GemmKernel>,
    device: &Device,
    eligible: std::result::Result<(), &'static str>,
) -> KernelChoice {
    let sm90 = device.compute_capability() == Some((9, 0));
    let (want, reason) = match (requested, env) {
        (GemmKernel::Auto, Some(k)) if k != GemmKernel::Auto => (k, KernelReason::Env),
        (GemmKernel::Auto, _) => (
            if sm90 && built_for_sm90a() {
                GemmKernel::Wgmma
            } else {
                GemmKernel::Mma
            },
            KernelReason::DeviceDefault,
        ),
        (k, _) => (k, KernelReason::Requested),
    };
    let fallback = |why| KernelChoice {
        kernel: GemmKernel::Mma,
        reason: KernelReason::Fallback(why),
    };
    if want == GemmKernel::Mma {
        return KernelChoice {
            kernel: want,
            reason,
        };
    }
    if device.kind() == BackendKind::Cuda && !sm90 {
        return fallback("the GPU is not sm_90 (the wgmma kernel is built for sm_90a only)");
    }
    if device.kind() == BackendKind::Cuda && !built_for_sm90a() {
        return fallback("this build has no sm_90a image (FTN_CUDA_ARCHS)");
    }
    match eligible {
        Ok(()) => KernelChoice {
            kernel: GemmKernel::Wgmma,
            reason,
        },
        Err(why) => fallback(why),
    }
}

fn built_for_sm90a() -> bool {
    #[cfg(feature = "cuda")]
    {
        crate::backend::cuda_archs()
            .split(',')
            .any(|a| a.trim() == "sm_90a")
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// With `FTN_LOG` set, one stderr line per (GEMM, kernel) first used.
pub(crate) fn log_once(key: &super::gemm_provider::GemmKey, c: &KernelChoice) {
    static LOGGED: Mutex<Option<HashSet<(super::gemm_provider::GemmKey, GemmKernel)>>> =
        Mutex::new(None);
    if !std::env::var("FTN_LOG").is_ok_and(|v| !v.is_empty() && v != "0") {
        return;
    }
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if logged
        .get_or_insert_with(HashSet::new)
        .insert((*key, c.kernel))
    {
        eprintln!(
            "[ferrotron] gemm [{key}] ferrotron kernel {} ({:?})",
            c.kernel.name(),
            c.reason
        );
    }
}

/// The TMA map of one operand: rank 3 {cols, rows, batch}; the box is
/// {64, 128, 1} when the operand is K-contiguous, else {64, 64, 1}.
fn operand_map(
    device: &Device,
    dtype: TmaDType,
    es: usize,
    o: &Operand,
    batch: usize,
    k_major: bool,
) -> Result<crate::kernel_params::FtnTensorMap> {
    let bk = crate::kernel_params::FTN_GEMM_SM90_BK;
    let stride = if batch > 1 { o.stride } else { o.rows * o.ld };
    let dims = [o.cols as u64, o.rows as u64, batch as u64];
    let strides = [(o.ld * es) as u64, (stride * es) as u64];
    let boxes = [
        bk,
        if k_major {
            crate::kernel_params::FTN_GEMM_SM90_BM
        } else {
            64
        },
        1,
    ];
    tensor_map::encode_tiled(
        device,
        OP,
        &TiledMap {
            dtype,
            addr: o.addr,
            dims: &dims,
            strides: &strides,
            boxes: &boxes,
        },
    )
}

/// Launches `cuda/gemm_sm90.cu` for `g` (validated and eligible), with
/// inputs `input` and output `output`.
pub(crate) fn launch(
    stream: &Stream,
    g: FtnGemmParams,
    a: &Operand,
    b: &Operand,
    input: DType,
    output: DType,
) -> Result<()> {
    let device = stream.device();
    let dtype = match input {
        DType::F16 => TmaDType::F16,
        DType::BF16 => TmaDType::BF16,
        d => return Err(Error::invalid(OP, "a", "fp16 or bf16 inputs", d)),
    };
    let (es, batch) = (input.size(), g.batch as usize);
    let p = plan::plan_sm90(
        g.m as u64,
        g.n as u64,
        g.batch as u64,
        device.multiprocessor_count(),
    )
    .ok_or_else(|| Error::invalid(OP, "m, n, batch", "fewer than 2^31 output tiles", g.m))?;
    let params = FtnGemmSm90Params {
        // op(A) [m, k]: K-contiguous unless transposed; op(B) [k, n]:
        // K-contiguous when transposed.
        tmap_a: operand_map(device, dtype, es, a, batch, g.trans_a == 0)?,
        tmap_b: operand_map(device, dtype, es, b, batch, g.trans_b != 0)?,
        g,
        tiles_m: p.tiles_m as i64,
        tiles_n: p.tiles_n as i64,
        group_m: p.group_m as i64,
    };
    let kernel = kernels::GEMM_WGMMA.for_dtypes(&[input, output])?;
    stream.launch(kernel, p.cfg, params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(addr: u64, rows: usize, cols: usize, ld: usize, stride: usize) -> Operand {
        Operand {
            addr,
            rows,
            cols,
            ld,
            stride,
        }
    }

    #[test]
    fn parse_names() {
        assert_eq!(GemmKernel::parse("SM90").unwrap(), GemmKernel::Wgmma);
        assert_eq!(GemmKernel::parse("wgmma").unwrap(), GemmKernel::Wgmma);
        assert_eq!(GemmKernel::parse(" mma ").unwrap(), GemmKernel::Mma);
        assert_eq!(GemmKernel::parse("").unwrap(), GemmKernel::Auto);
        let e = GemmKernel::parse("hgemm").unwrap_err().to_string();
        assert!(e.contains(ENV_KERNEL) && e.contains("hgemm"), "{e}");
    }

    #[test]
    fn tma_rules() {
        let ok = op(256, 64, 64, 64, 4096);
        assert!(eligible(64, 64, 64, 2, 2, &ok, &ok, false).is_ok());
        assert!(eligible(64, 64, 64, 2, 2, &ok, &ok, true).is_err());
        assert!(eligible(64, 64, 0, 2, 2, &ok, &ok, false).is_err());
        // Address, leading dimension (17 halves = 34 bytes), batch stride.
        for bad in [
            op(258, 64, 64, 64, 4096),
            op(256, 64, 17, 17, 64 * 17),
            op(256, 64, 64, 64, 4100),
            op(256, 64, 64, 64, 0),
            op(256, 64, 64, 64, 64 * 63),
        ] {
            assert!(
                eligible(64, 64, 64, 2, 2, &ok, &bad, false).is_err(),
                "{bad:?}"
            );
            assert!(
                eligible(64, 64, 64, 2, 2, &bad, &ok, false).is_err(),
                "{bad:?}"
            );
        }
        // One batch entry: the stride is not used.
        assert!(eligible(64, 64, 64, 1, 2, &op(256, 64, 64, 64, 0), &ok, false).is_ok());
    }

    #[test]
    fn emulator_default_is_mma_and_requests_fall_back() {
        let dev = Device::emu();
        let c = choose(GemmKernel::Auto, None, &dev, Ok(()));
        assert_eq!(c.kernel, GemmKernel::Mma);
        assert_eq!(c.reason, KernelReason::DeviceDefault);
        let c = choose(GemmKernel::Auto, Some(GemmKernel::Wgmma), &dev, Ok(()));
        assert_eq!((c.kernel, c.reason), (GemmKernel::Wgmma, KernelReason::Env));
        let c = choose(GemmKernel::Mma, Some(GemmKernel::Wgmma), &dev, Ok(()));
        assert_eq!(
            (c.kernel, c.reason),
            (GemmKernel::Mma, KernelReason::Requested)
        );
        let c = choose(GemmKernel::Wgmma, None, &dev, Err("why"));
        assert_eq!(
            (c.kernel, c.reason),
            (GemmKernel::Mma, KernelReason::Fallback("why"))
        );
    }

    #[test]
    fn every_dtype_pair_is_stamped() {
        for input in [DType::F16, DType::BF16] {
            for output in [input, DType::F32] {
                kernels::GEMM_WGMMA.for_dtypes(&[input, output]).unwrap();
            }
        }
    }
}
