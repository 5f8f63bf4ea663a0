//! Drives descriptor and argument validation of the C ABI with arbitrary
//! `size` fields, NULLs, misaligned pointers, negative and overflowing
//! dimensions and bad enum values. Real buffers are passed only when they
//! hold what the dimensions claim, so any crash, panic (ftnInternalError) or
//! accepted-invalid input is a bug in the validation.
#![no_main]

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::OnceLock;

use ferrotron_ffi::*;
use libfuzzer_sys::fuzz_target;

struct Env {
    ctx: ftnContext_t,
    stream: ftnStream_t,
}
// SAFETY: the handles are thread-safe (Arc/Mutex inside); libFuzzer calls
// the target from one thread anyway.
unsafe impl Send for Env {}
// SAFETY: as above.
unsafe impl Sync for Env {}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut ctx = null_mut();
        let mut stream = null_mut();
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(ftn_context_create(0, 0, &mut ctx), ftnResult_t::ftnSuccess);
            assert_eq!(ftn_stream_create(ctx, &mut stream), ftnResult_t::ftnSuccess);
        }
        Env { ctx, stream }
    })
}

struct Bytes<'a>(&'a [u8]);
impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |a, _| a << 8 | self.u8() as u64)
    }
    fn dim(&mut self) -> i64 {
        const I: [i64; 14] = [
            0,
            1,
            2,
            3,
            7,
            17,
            33,
            1025,
            -1,
            i64::MIN,
            i64::MAX,
            1 << 31,
            1 << 32,
            1 << 62,
        ];
        match self.u8() % 18 {
            k @ 0..=13 => I[k as usize],
            14 => (self.u8() % 64) as i64,
            _ => self.u64() as i64,
        }
    }
    fn size(&mut self, ours: usize) -> usize {
        match self.u8() % 10 {
            0 => 0,
            1 => 8,
            2 => ours - 1,
            3 => ours + 8,
            4 => ours + (self.u8() as usize),
            5 => 4097,
            6 => self.u64() as usize,
            _ => ours,
        }
    }
    fn f32(&mut self) -> f32 {
        match self.u8() % 6 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => 0.0,
            3 => -1.0,
            4 => f32::from_bits(self.u64() as u32),
            _ => 1e-5,
        }
    }
}

/// A descriptor in 8-aligned storage of at least its claimed size (when that
/// is plausible), trailing bytes zero or arbitrary.
fn desc_storage<D: Copy>(d: D, claimed: usize, b: &mut Bytes) -> Vec<u64> {
    let ours = std::mem::size_of::<D>();
    let bytes = if claimed <= FTN_MAX_DESC_SIZE {
        claimed.max(ours)
    } else {
        ours
    };
    let mut v = vec![0u64; bytes.div_ceil(8)];
    // SAFETY: v holds at least `ours` bytes; D is plain data.
    unsafe {
        std::ptr::copy_nonoverlapping(&d as *const D as *const u8, v.as_mut_ptr() as *mut u8, ours)
    };
    v[0] = claimed as u64;
    if b.u8() % 4 == 0 {
        let tail = &mut bytemuck_bytes(&mut v)[ours..];
        if let Some(x) = tail.first_mut() {
            *x = b.u8();
        }
    }
    v
}

fn bytemuck_bytes(v: &mut [u64]) -> &mut [u8] {
    // SAFETY: u64 storage viewed as bytes.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 8) }
}

/// Elements a `[rows, cols]` op touches, when small enough to allocate.
fn small(rows: i64, cols: i64) -> Option<usize> {
    let n = (rows as i128) * (cols as i128);
    (rows >= 0 && cols >= 0 && n <= 1 << 14 && cols <= 1 << 14).then_some(n as usize)
}

/// A pointer argument: NULL, a real buffer of `n` 4-byte elements (+1 for
/// misalignment), or misaligned. Only real buffers when `n` is Some.
fn arg(bufs: &mut Vec<Vec<u32>>, n: Option<usize>, b: &mut Bytes) -> *mut c_void {
    let Some(n) = n else { return null_mut() };
    match b.u8() % 8 {
        0 => null_mut(),
        1 => {
            bufs.push(vec![0; n + 2]);
            (bufs.last_mut().unwrap().as_mut_ptr() as *mut u8).wrapping_add(1) as *mut c_void
        }
        _ => {
            bufs.push(vec![0; n.max(1)]);
            bufs.last_mut().unwrap().as_mut_ptr() as *mut c_void
        }
    }
}

fn done(r: ftnResult_t, must_fail: bool, what: &str) {
    assert_ne!(
        r,
        ftnResult_t::ftnInternalError,
        "{what}: a panic inside the ABI"
    );
    if must_fail {
        assert_ne!(r, ftnResult_t::ftnSuccess, "{what}: invalid input accepted");
    }
    // SAFETY: a valid stream handle.
    let s = unsafe { ftn_stream_synchronize(env().stream) };
    assert_ne!(s, ftnResult_t::ftnInternalError, "{what}: synchronize");
}

fuzz_target!(|data: &[u8]| {
    let e = env();
    let mut b = Bytes(data);
    let mut bufs: Vec<Vec<u32>> = Vec::new();
    let op = b.u8() % 8;
    let (rows, cols) = (b.dim(), b.dim());
    let dtype = match b.u8() % 8 {
        0 | 1 | 2 => 0,
        3 => 1,
        4 => 2,
        _ => b.u8() as i32 - 64,
    };
    let n = small(rows, cols);
    let rn = small(rows, 1);
    let cn = small(1, cols);
    // Real buffers only when every buffer of the op is small.
    let ok = n.is_some();
    // Dims that must be rejected, and whether the op touches any element.
    let neg = rows < 0 || cols < 0;
    let any = !neg && (rows as i128) * (cols as i128) > 0;
    let (nn, rr, cc) = if ok { (n, rn, cn) } else { (None, None, None) };
    match op {
        0 | 1 => {
            let size = b.size(std::mem::size_of::<ftnBiasGeluDesc_t>());
            let d = ftnBiasGeluDesc_t {
                size,
                dtype,
                gelu: (b.u8() % 3) as i32,
                rows,
                cols,
            };
            let st = desc_storage(d, size, &mut b);
            let p = st.as_ptr() as *const ftnBiasGeluDesc_t;
            let p = if b.u8() % 16 == 0 {
                std::ptr::null()
            } else {
                p
            };
            let (x, bias, out, dy, db) = (
                arg(&mut bufs, nn, &mut b),
                arg(&mut bufs, cc, &mut b),
                arg(&mut bufs, nn, &mut b),
                arg(&mut bufs, nn, &mut b),
                arg(&mut bufs, cc, &mut b),
            );
            let bad = p.is_null()
                || size < 32
                || size > FTN_MAX_DESC_SIZE
                || neg
                || (any && (x.is_null() || out.is_null()));
            // SAFETY: every non-NULL pointer holds what the dims claim.
            let r = unsafe {
                if op == 0 {
                    ftn_bias_gelu_forward(e.stream, p, x, bias, out)
                } else {
                    ftn_bias_gelu_backward(e.stream, p, dy, x, bias, out, db)
                }
            };
            done(r, bad, "bias_gelu");
        }
        2 | 3 => {
            let size = b.size(std::mem::size_of::<ftnNormDesc_t>());
            let d = ftnNormDesc_t {
                size,
                dtype,
                zero_centered_gamma: b.u8() as i32 % 2,
                rows,
                hidden: cols,
                eps: b.f32(),
                reserved: (b.u8() % 8 == 0) as u32,
            };
            let st = desc_storage(d, size, &mut b);
            let p = st.as_ptr() as *const ftnNormDesc_t;
            let (x, g, be, y, mean, rstd) = (
                arg(&mut bufs, nn, &mut b),
                arg(&mut bufs, cc, &mut b),
                arg(&mut bufs, cc, &mut b),
                arg(&mut bufs, nn, &mut b),
                arg(&mut bufs, rr, &mut b),
                arg(&mut bufs, rr, &mut b),
            );
            let bad = size < 40
                || size > FTN_MAX_DESC_SIZE
                || d.reserved != 0
                || neg
                || (any && (x.is_null() || y.is_null()));
            // SAFETY: as above.
            let r = unsafe {
                if op == 2 {
                    ftn_layer_norm_forward(
                        e.stream,
                        p,
                        x,
                        g,
                        be,
                        y,
                        mean as *mut f32,
                        rstd as *mut f32,
                    )
                } else {
                    ftn_rms_norm_forward(e.stream, p, x, g, y, rstd as *mut f32)
                }
            };
            done(r, bad, "norm");
        }
        4 => {
            let size = b.size(std::mem::size_of::<ftnMultiTensorDesc_t>());
            let count = match b.u8() % 6 {
                0 => b.u64() as usize,
                1 => usize::MAX / 16,
                k => k as usize,
            };
            let d = ftnMultiTensorDesc_t {
                size,
                num_tensors: count,
                scale: b.f32(),
                reserved: 0,
                max_norm: b.f32() as f64,
            };
            let st = desc_storage(d, size, &mut b);
            let p = st.as_ptr() as *const ftnMultiTensorDesc_t;
            let mut list = Vec::new();
            if count <= 8 {
                for _ in 0..count {
                    let numel = b.dim();
                    let data = arg(&mut bufs, small(numel, 1), &mut b);
                    list.push(ftnTensor_t {
                        data,
                        numel,
                        dtype: (b.u8() % 4) as i32,
                        reserved: 0,
                    });
                }
            }
            let tensors = if count <= 8 {
                list.as_ptr()
            } else {
                std::ptr::null()
            };
            let out = arg(&mut bufs, Some(1), &mut b) as *mut f32;
            // SAFETY: as above; the list holds `count` entries or is NULL.
            let r = unsafe {
                match b.u8() % 3 {
                    0 => ftn_multi_tensor_l2_norm(e.stream, p, tensors, out),
                    1 => ftn_multi_tensor_unscale(e.stream, p, tensors, null_mut(), out),
                    _ => ftn_multi_tensor_clip_grad_norm(e.stream, p, tensors, out),
                }
            };
            let bad = size < 32 || size > FTN_MAX_DESC_SIZE || count > 8 || out.is_null();
            done(r, bad, "multi_tensor");
        }
        6 => {
            // softmax: [rows = batch*heads*sq, sk = cols]; heads = sq = 1
            let size = b.size(std::mem::size_of::<ftnSoftmaxDesc_t>());
            let mask = (b.u8() % 4) as i32;
            let d = ftnSoftmaxDesc_t {
                size,
                dtype,
                mask,
                batch: rows,
                heads: 1,
                sq: 1,
                sk: cols,
                scale: b.f32(),
                mask_broadcast: (b.u8() % 2) as i32,
            };
            let st = desc_storage(d, size, &mut b);
            let p = st.as_ptr() as *const ftnSoftmaxDesc_t;
            let (x, m, y) = (
                arg(&mut bufs, nn, &mut b),
                arg(&mut bufs, nn, &mut b),
                arg(&mut bufs, nn, &mut b),
            );
            let bad = size < 56
                || size > FTN_MAX_DESC_SIZE
                || neg
                || (any && (x.is_null() || y.is_null()));
            // SAFETY: as above (the mask needs batch*sq*sk bytes <= n * 4).
            let r = unsafe {
                if b.u8() % 2 == 0 {
                    ftn_softmax_forward(e.stream, p, x, m as *const u8, y)
                } else {
                    ftn_softmax_backward(e.stream, p, x, m, y)
                }
            };
            done(r, bad, "softmax");
        }
        7 => {
            // gemm: m = rows, n = cols, k from the input; packed layouts, batch 1
            let size = b.size(std::mem::size_of::<ftnGemmDesc_t>());
            let k = b.dim();
            // SAFETY: a plain-data descriptor: all-zero bytes are a valid value.
            let mut d: ftnGemmDesc_t = unsafe { std::mem::zeroed() };
            d.size = size;
            d.dtype = (b.u8() % 4) as i32;
            d.out_dtype = [0, d.dtype, 5][(b.u8() % 3) as usize];
            d.trans_a = (b.u8() % 2) as i32;
            d.trans_b = (b.u8() % 2) as i32;
            d.epilogue = (b.u8() % 5) as i32;
            d.m = rows;
            d.n = cols;
            d.k = k;
            d.batch = if b.u8() % 4 == 0 { b.dim() } else { 1 };
            d.alpha = b.f32();
            d.beta = if b.u8() % 2 == 0 { 0.0 } else { b.f32() };
            if b.u8() % 4 == 0 {
                d.lda = b.dim();
            }
            // Real buffers only when every operand is small (batch 1, packed).
            let small3 = small(rows, k)
                .zip(small(k, cols))
                .zip(n)
                .filter(|_| d.batch == 1 && d.lda == 0);
            let (ak, kb, mn) = match small3 {
                Some(((x, y), z)) => (Some(x), Some(y), Some(z)),
                None => (None, None, None),
            };
            let st = desc_storage(d, size, &mut b);
            let p = st.as_ptr() as *const ftnGemmDesc_t;
            let (a, bb, bias, c, aux, out) = (
                arg(&mut bufs, ak, &mut b),
                arg(&mut bufs, kb, &mut b),
                arg(&mut bufs, if small3.is_some() { cn } else { None }, &mut b),
                arg(&mut bufs, mn, &mut b),
                arg(&mut bufs, mn, &mut b),
                arg(&mut bufs, mn, &mut b),
            );
            let bad = size < 160
                || size > FTN_MAX_DESC_SIZE
                || neg
                || k < 0
                || d.batch < 0
                || (any && d.batch > 0 && out.is_null());
            // SAFETY: as above.
            let r = unsafe { ftn_gemm(e.stream, p, a, bb, bias, c, aux, out) };
            done(r, bad, "gemm");
        }
        _ => {
            let size = b.size(std::mem::size_of::<ftnGradScalerConfig_t>());
            let c = ftnGradScalerConfig_t {
                size,
                initial_scale: b.f32(),
                min_scale: b.f32(),
                growth_factor: b.f32(),
                backoff_factor: b.f32(),
                growth_interval: b.u64() as u32,
                hysteresis: b.u64() as u32,
            };
            let cs = desc_storage(c, size, &mut b);
            let cp = cs.as_ptr() as *const ftnGradScalerConfig_t;
            let mut state = ftnGradScalerState_t {
                size: b.size(24),
                scale: 0.0,
                growth_tracker: 0,
                hysteresis_tracker: 0,
                reserved: 0,
            };
            if state.size > 24 {
                state.size = 24; // storage is exactly 24 bytes
            }
            // SAFETY: the config storage holds its claimed size; state is 24 bytes.
            let r = unsafe { ftn_grad_scaler_host_init(cp, &mut state) };
            done(
                r,
                size < 32 || size > FTN_MAX_DESC_SIZE || state.size < 24,
                "scaler init",
            );
            if r == ftnResult_t::ftnSuccess {
                // SAFETY: as above.
                let r = unsafe { ftn_grad_scaler_host_update(cp, &mut state, 1) };
                done(r, false, "scaler update");
                let mut sc = null_mut();
                // SAFETY: valid handles and out-pointer.
                let r = unsafe { ftn_grad_scaler_create(e.ctx, cp, &state, &mut sc) };
                done(r, false, "scaler create");
                if r == ftnResult_t::ftnSuccess {
                    // SAFETY: a live scaler.
                    done(
                        unsafe { ftn_grad_scaler_destroy(sc) },
                        false,
                        "scaler destroy",
                    );
                }
            }
        }
    }
    drop(bufs);
});
