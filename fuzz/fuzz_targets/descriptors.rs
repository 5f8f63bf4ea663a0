//! Drives descriptor and argument validation of the C ABI with arbitrary
//! `size` fields, NULLs, misaligned pointers, negative and overflowing
//! dimensions and bad enum values. Real buffers are passed only when they
//! hold what the dimensions claim, so any crash, panic (ftnInternalError) or
//! accepted-invalid input is a bug in the validation. Covers the op
//! descriptors, the parallel layers, and the optimizer / data-parallel
//! exports (fused Adam, parameter registry, DDP, distributed optimizer,
//! memory accounting).
#![no_main]

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::OnceLock;

use ferrotron_ffi::*;
use libfuzzer_sys::fuzz_target;

struct Env {
    ctx: ftnContext_t,
    stream: ftnStream_t,
    /// A one-rank in-process communicator: the parallel layers, mappings
    /// and vocab ops run from this single thread.
    comm: ftnComm_t,
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
        let mut comm = null_mut();
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(ftn_context_create(0, 0, &mut ctx), ftnResult_t::ftnSuccess);
            assert_eq!(ftn_stream_create(ctx, &mut stream), ftnResult_t::ftnSuccess);
            assert_eq!(ftn_comm_init_all(&mut comm, 1, &ctx), ftnResult_t::ftnSuccess);
        }
        Env { ctx, stream, comm }
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

/// The descriptor as a library reading `claimed` bytes of it sees it: the
/// fields past `claimed` (an older version's caller) read as zero.
fn effective<D: Copy>(d: D, claimed: usize) -> D {
    let ours = std::mem::size_of::<D>();
    let mut out = d;
    if claimed < ours {
        // SAFETY: D is plain data (all-zero bytes valid); the range
        // claimed..ours lies inside `out`.
        unsafe {
            std::ptr::write_bytes((&mut out as *mut D as *mut u8).add(claimed), 0, ours - claimed)
        };
    }
    out
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
    // Selector bytes below 208 keep the mapping of the first 13 ops (the
    // committed regressions replay the same paths); 208..=255 pick the
    // optimizer and data-parallel exports.
    let sel = b.u8();
    let op = if sel < 208 { sel % 13 } else { 13 + (sel - 208) % 3 };
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
        8 => parallel_linear(&mut b, &mut bufs, (rows, cols), dtype),
        9 => mapping(&mut b, &mut bufs, (rows, cols)),
        10 => cross_entropy(&mut b, &mut bufs, (rows, cols), dtype),
        11 => rank_grid(&mut b),
        12 => copy(&mut b, &mut bufs, (rows, cols)),
        13 => adam(&mut b, &mut bufs),
        14 => ddp(&mut b, &mut bufs),
        15 => memory_accounting(&mut b),
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

/// A column- or row-parallel layer on one rank: create from fuzzed
/// descriptor and host weights, then a forward with a fuzzed token count.
fn parallel_linear(b: &mut Bytes, bufs: &mut Vec<Vec<u32>>, (inp, out): (i64, i64), dtype: i32) {
    let e = env();
    let column = b.u8() % 2 == 0;
    let tokens = b.dim();
    let w = small(inp, out);
    let (weight, bias) = (arg(bufs, w, b), arg(bufs, small(out, 1), b));
    let flags = b.u8() as i32;
    let bit = |k: i32| (flags >> k) & 1;
    let (size, r) = if column {
        let size = b.size(std::mem::size_of::<ftnColumnParallelLinearDesc_t>());
        let d = ftnColumnParallelLinearDesc_t {
            size,
            dtype,
            bias: bit(0),
            in_features: inp,
            out_features: out,
            gather_output: bit(1),
            skip_bias_add: bit(2),
            sequence_parallel: bit(3),
            activation: (b.u8() % 4) as i32,
            serialize_comm: bit(4),
            reserved: 0,
        };
        let st = desc_storage(d, size, b);
        let mut layer = null_mut();
        // SAFETY: the weights hold out*in and out elements when non-NULL.
        let r = unsafe {
            ftn_column_parallel_linear_create(e.comm, st.as_ptr() as *const _, weight, bias, &mut layer)
        };
        if r == ftnResult_t::ftnSuccess {
            let (x, y, pre) = (
                arg(bufs, small(tokens, inp), b),
                arg(bufs, small(tokens, out), b),
                arg(bufs, small(tokens, out), b),
            );
            // SAFETY: buffers hold what the shapes claim when non-NULL.
            let f = unsafe { ftn_column_parallel_linear_forward(layer, e.comm, e.stream, x, y, pre, tokens) };
            done(f, tokens < 0, "column forward");
            // SAFETY: a live layer.
            done(unsafe { ftn_column_parallel_linear_destroy(layer) }, false, "column destroy");
        }
        (size, r)
    } else {
        let size = b.size(std::mem::size_of::<ftnRowParallelLinearDesc_t>());
        let d = ftnRowParallelLinearDesc_t {
            size,
            dtype,
            bias: bit(0),
            in_features: inp,
            out_features: out,
            input_is_parallel: bit(1),
            skip_bias_add: bit(2),
            sequence_parallel: bit(3),
            serialize_comm: bit(4),
        };
        let st = desc_storage(d, size, b);
        let mut layer = null_mut();
        // SAFETY: as above.
        let r = unsafe {
            ftn_row_parallel_linear_create(e.comm, st.as_ptr() as *const _, weight, bias, &mut layer)
        };
        if r == ftnResult_t::ftnSuccess {
            let (x, y) = (arg(bufs, small(tokens, inp), b), arg(bufs, small(tokens, out), b));
            // SAFETY: as above.
            let f = unsafe { ftn_row_parallel_linear_forward(layer, e.comm, e.stream, x, y, tokens) };
            done(f, tokens < 0, "row forward");
            // SAFETY: a live layer.
            done(unsafe { ftn_row_parallel_linear_destroy(layer) }, false, "row destroy");
        }
        (size, r)
    };
    let v1 = if column { 56 } else { 48 };
    let bad = size < v1 || size > FTN_MAX_DESC_SIZE || inp < 0 || out < 0 || !(1..=2).contains(&dtype);
    done(r, bad, "parallel linear create");
}

/// A mapping's forward or backward on one rank with fuzzed shape and type.
fn mapping(b: &mut Bytes, bufs: &mut Vec<Vec<u32>>, (rows, cols): (i64, i64)) {
    let e = env();
    let m = b.u8() as i32 % 9 - 1;
    let datatype = b.u8() as i32 % 8 - 1;
    // With one rank every output has the input's shape; 8-byte types need 2 words.
    let n = small(rows, cols).map(|n| 2 * n);
    let (x, y) = (arg(bufs, n, b), arg(bufs, n, b));
    let backward = b.u8() % 2 == 0;
    // SAFETY: buffers hold rows*cols elements of any type when non-NULL.
    let r = unsafe {
        if backward {
            ftn_tp_mapping_backward(m, x, y, rows, cols, datatype, e.comm, e.stream)
        } else {
            ftn_tp_mapping_forward(m, x, y, rows, cols, datatype, e.comm, e.stream)
        }
    };
    let bad = !(0..=6).contains(&m) || !(0..=5).contains(&datatype) || rows < 0 || cols < 0;
    done(r, bad, "mapping");
}

/// The vocab-parallel cross-entropy forward on one rank.
fn cross_entropy(b: &mut Bytes, bufs: &mut Vec<Vec<u32>>, (tokens, vocab): (i64, i64), dtype: i32) {
    let e = env();
    let size = b.size(std::mem::size_of::<ftnCrossEntropyDesc_t>());
    let d = ftnCrossEntropyDesc_t {
        size,
        dtype,
        label_dtype: b.u8() as i32 % 4 + 3,
        tokens,
        shard_vocab: vocab,
        label_smoothing: b.f32(),
        reserved: (b.u8() % 8 == 0) as u32,
        ignore_index: b.dim(),
        has_ignore_index: (b.u8() % 3) as i32,
        reserved2: (b.u8() % 8 == 0) as u32,
    };
    let st = desc_storage(d, size, b);
    // What the library reads: the first min(size, ours) bytes (version 1,
    // 40 bytes, has no ignore index).
    let d = effective(d, size);
    // One 256-thread block per token: real buffers only for a few hundred
    // tokens, so an input stays well inside libFuzzer's 10 s (the emulator
    // under ASan sets up every thread of every block).
    let few = |n: Option<usize>| n.filter(|_| tokens <= 256);
    let t = few(small(tokens, 2));
    let (x, labels, loss) = (
        arg(bufs, few(small(tokens, vocab)), b),
        arg(bufs, t, b),
        arg(bufs, t, b),
    );
    let mut saved = null_mut();
    // SAFETY: buffers hold what the shapes claim when non-NULL (labels: 2
    // words per token, enough for int64).
    let r = unsafe {
        ftn_vocab_parallel_cross_entropy_forward(
            st.as_ptr() as *const _,
            e.comm,
            e.stream,
            x,
            labels,
            loss as *mut f32,
            &mut saved,
        )
    };
    // Sizes below ours: exactly version 1's (40) or refused.
    let ours = std::mem::size_of::<ftnCrossEntropyDesc_t>();
    let bad = size < 40
        || (size > 40 && size < ours)
        || size > FTN_MAX_DESC_SIZE
        || tokens < 0
        || vocab < 1
        || d.reserved != 0
        || d.reserved2 != 0
        || (d.has_ignore_index != 0 && d.label_dtype == 4 && i32::try_from(d.ignore_index).is_err())
        || !(0.0..1.0).contains(&d.label_smoothing)
        || !(4..=5).contains(&d.label_dtype);
    done(r, bad, "cross entropy");
    if r == ftnResult_t::ftnSuccess {
        // SAFETY: a live handle.
        done(unsafe { ftn_cross_entropy_saved_destroy(saved) }, false, "saved destroy");
    }
}

/// Rank-grid queries with fuzzed sizes and ranks.
fn rank_grid(b: &mut Bytes) {
    let size = b.size(std::mem::size_of::<ftnRankGridDesc_t>());
    let mut v = || b.dim().clamp(i32::MIN as i64, i32::MAX as i64) as i32;
    let d = ftnRankGridDesc_t {
        size,
        // Small worlds: a group query walks every rank.
        world: v() % 4096,
        tp: v(),
        cp: v(),
        pp: v(),
        order: v() % 3,
        reserved: 0,
    };
    let rank = v();
    let axes = v() % 17;
    let st = desc_storage(d, size, b);
    let p = st.as_ptr() as *const ftnRankGridDesc_t;
    let mut coords = ftnRankCoords_t {
        size: 24,
        tp: 0,
        cp: 0,
        dp: 0,
        pp: 0,
    };
    let mut ranks = [0; 64];
    let mut count = 0;
    // SAFETY: the descriptor storage holds its claimed size; the outputs are valid.
    let (r1, r2) = unsafe {
        (
            ftn_rank_grid_coords(p, rank, &mut coords),
            ftn_rank_grid_group(p, rank, axes, ranks.as_mut_ptr(), 64, &mut count),
        )
    };
    let bad = size < 32 || size > FTN_MAX_DESC_SIZE || d.world < 1 || rank < 0 || rank >= d.world;
    done(r1, bad, "rank grid coords");
    done(r2, bad || !(1..=15).contains(&axes), "rank grid group");
}

/// A strided 2-D copy with fuzzed blocks.
fn copy(b: &mut Bytes, bufs: &mut Vec<Vec<u32>>, (rows, cols): (i64, i64)) {
    let e = env();
    let blk = |b: &mut Bytes| ftnBlock2d_t {
        offset: if b.u8() % 2 == 0 { 0 } else { b.dim() },
        pitch: if b.u8() % 2 == 0 { cols } else { b.dim() },
    };
    let (sb, db) = (blk(b), blk(b));
    let extent = |k: ftnBlock2d_t| {
        let last = (rows as i128 - 1) * k.pitch as i128 + k.offset as i128 + cols as i128;
        (rows > 0 && cols > 0 && k.pitch >= cols && k.offset >= 0 && last <= 1 << 14)
            .then_some(last as usize)
    };
    let (src, dst) = (arg(bufs, extent(sb), b), arg(bufs, extent(db), b));
    // SAFETY: each non-NULL buffer holds its block.
    let r = unsafe { ftn_copy_2d(e.stream, 0, src, sb, dst, db, rows, cols) };
    let any = rows > 0 && cols > 0;
    let bad = rows < 0
        || cols < 0
        || (any && (src.is_null() || dst.is_null() || sb.pitch < cols || db.pitch < cols));
    done(r, bad, "copy_2d");
}

/// A pointer to one scalar of the emulator's "device" memory: NULL, a real
/// (aligned) buffer holding `init`, or a misaligned one.
fn scalar(bufs: &mut Vec<Vec<u32>>, init: u32, b: &mut Bytes) -> *mut c_void {
    let p = arg(bufs, Some(2), b);
    if !p.is_null() && (p as usize) % 4 == 0 {
        // SAFETY: an aligned real buffer of at least 2 words.
        unsafe { (p as *mut u32).write(init) };
    }
    p
}

fn aligned_real(p: *mut c_void, align: usize) -> bool {
    !p.is_null() && (p as usize) % align == 0
}

/// A loss-scaler argument: NULL, a live device scaler (returned for the
/// caller to destroy), or a value that was never a handle.
fn scaler_arg(b: &mut Bytes) -> (ftnGradScaler_t, bool) {
    match b.u8() % 4 {
        0 => {
            let mut cfg = ftnGradScalerConfig_t {
                size: std::mem::size_of::<ftnGradScalerConfig_t>(),
                initial_scale: 0.0,
                min_scale: 0.0,
                growth_factor: 0.0,
                backoff_factor: 0.0,
                growth_interval: 0,
                hysteresis: 0,
            };
            let mut sc = null_mut();
            // SAFETY: valid config and out-pointers.
            let ok = unsafe {
                ftn_grad_scaler_config_default(&mut cfg) == ftnResult_t::ftnSuccess
                    && ftn_grad_scaler_create(env().ctx, &cfg, std::ptr::null(), &mut sc)
                        == ftnResult_t::ftnSuccess
            };
            assert!(ok, "grad scaler fixture");
            (sc, true)
        }
        1 => (b.u64() as usize as ftnGradScaler_t, false),
        _ => (null_mut(), false),
    }
}

/// Fused Adam: a fuzzed config, then a step over a fuzzed tensor list with
/// fuzzed descriptor, scalars and unscale arguments.
fn adam(b: &mut Bytes, bufs: &mut Vec<Vec<u32>>) {
    let e = env();
    let csize = b.size(std::mem::size_of::<ftnAdamConfig_t>());
    let mut c = ftnAdamConfig_t {
        size: std::mem::size_of::<ftnAdamConfig_t>(),
        beta1: 0.0,
        beta2: 0.0,
        eps: 0.0,
        mode: 0,
    };
    // SAFETY: a valid config.
    assert_eq!(unsafe { ftn_adam_config_default(&mut c) }, ftnResult_t::ftnSuccess);
    c.size = csize;
    if b.u8() % 2 == 0 {
        c.beta1 = b.f32();
    }
    if b.u8() % 2 == 0 {
        c.beta2 = b.f32();
    }
    if b.u8() % 2 == 0 {
        c.eps = b.f32();
    }
    if b.u8() % 3 == 0 {
        c.mode = b.u8() as i32 % 4 - 1;
    }
    let cs = desc_storage(c, csize, b);
    let c = effective(c, csize);
    let mut adam = null_mut();
    // SAFETY: the config storage holds its claimed size; a valid out-pointer.
    let r = unsafe { ftn_adam_create(e.ctx, cs.as_ptr() as *const ftnAdamConfig_t, &mut adam) };
    let bad = csize < 24
        || csize > FTN_MAX_DESC_SIZE
        || !(0.0..1.0).contains(&c.beta1)
        || !(0.0..1.0).contains(&c.beta2)
        || !(c.eps.is_finite() && c.eps > 0.0)
        || !(0..=1).contains(&c.mode);
    done(r, bad, "adam create");
    if r != ftnResult_t::ftnSuccess {
        return;
    }

    let count = match b.u8() % 8 {
        0 => b.u64() as usize,
        1 => usize::MAX / 64,
        k => (k - 2) as usize,
    };
    let dsize = b.size(std::mem::size_of::<ftnAdamStepDesc_t>());
    let d = ftnAdamStepDesc_t {
        size: dsize,
        num_tensors: count,
    };
    let ds = desc_storage(d, dsize, b);
    let mut list = Vec::new();
    let mut tensors_bad = false;
    let with_model = b.u8() % 2 == 0;
    if count <= 6 {
        for _ in 0..count {
            let numel = b.dim();
            let n = small(numel, 1);
            let t = ftnAdamTensor_t {
                param: arg(bufs, n, b),
                exp_avg: arg(bufs, n, b),
                exp_avg_sq: arg(bufs, n, b),
                grad: arg(bufs, n, b),
                model: if with_model || b.u8() % 8 == 0 {
                    arg(bufs, n, b)
                } else {
                    null_mut()
                },
                numel,
                grad_dtype: (b.u8() % 8) as i32 - 1,
                model_dtype: (b.u8() % 8) as i32 - 1,
                weight_decay: if b.u8() % 2 == 0 { 0.0 } else { b.f32() },
                reserved: (b.u8() % 8 == 0) as i32,
            };
            let any = numel > 0;
            let floats = |d: i32| (0..=2).contains(&d);
            tensors_bad |= numel < 0
                || t.reserved != 0
                || !floats(t.grad_dtype)
                || !(t.weight_decay.is_finite() && t.weight_decay >= 0.0)
                || (any
                    && [t.param, t.exp_avg, t.exp_avg_sq, t.grad as *mut c_void]
                        .iter()
                        .any(|p| p.is_null()));
            list.push(t);
        }
    }
    let tensors = match b.u8() % 8 {
        0 => std::ptr::null(),
        1 if !list.is_empty() => (list.as_ptr() as *const u8).wrapping_add(4) as *const ftnAdamTensor_t,
        _ if count <= 6 => list.as_ptr(),
        _ => std::ptr::null(),
    };
    let lr = scalar(bufs, 1e-3f32.to_bits(), b);
    let step = scalar(bufs, 0, b);
    let (scaler, live) = scaler_arg(b);
    let inv = if b.u8() % 3 == 0 {
        scalar(bufs, 1f32.to_bits(), b)
    } else {
        null_mut()
    };
    let found = if b.u8() % 2 == 0 {
        scalar(bufs, 0, b)
    } else {
        null_mut()
    };
    // SAFETY: descriptor storage holds its claimed size; the list holds
    // `count` entries when `count <= 6` (else it is NULL); every non-NULL
    // buffer holds what its numel claims.
    let r = unsafe {
        ftn_adam_step(
            e.stream,
            adam,
            ds.as_ptr() as *const ftnAdamStepDesc_t,
            tensors,
            lr as *const f32,
            step as *mut i32,
            inv as *const f32,
            scaler,
            found as *const f32,
        )
    };
    let bad = dsize < 16
        || dsize > FTN_MAX_DESC_SIZE
        || count > 6
        || (count > 0 && (tensors.is_null() || tensors != list.as_ptr()))
        || tensors_bad
        || !aligned_real(lr, 4)
        || !aligned_real(step, 4)
        || (!inv.is_null() && !scaler.is_null())
        || (!scaler.is_null() && !live);
    done(r, bad, "adam step");
    if live {
        // SAFETY: a live scaler.
        done(unsafe { ftn_grad_scaler_destroy(scaler) }, false, "scaler destroy");
    }
    // SAFETY: a live optimizer; a second destroy is a stale handle.
    unsafe {
        done(ftn_adam_destroy(adam), false, "adam destroy");
        done(ftn_adam_destroy(adam), true, "adam double destroy");
    }
}

/// A parameter registry with fuzzed names, shapes and dtypes, a DDP over the
/// one-rank communicator with a fuzzed config, the gradient protocol in a
/// fuzzed order, and the distributed optimizer.
fn ddp(b: &mut Bytes, bufs: &mut Vec<Vec<u32>>) {
    let e = env();
    let mut reg = null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { ftn_param_registry_create(&mut reg) }, ftnResult_t::ftnSuccess);
    let names: [&[u8]; 4] = [b"w\0", b"b\0", b"layer.0.weight\0", b"\xff\xfe\0"];
    let mut total: i128 = 0;
    let mut registered = 0i64;
    for _ in 0..(b.u8() % 5) {
        let name = match b.u8() % 6 {
            0 => std::ptr::null(),
            k => names[(k as usize - 1) % 4].as_ptr() as *const std::ffi::c_char,
        };
        let ndims = match b.u8() % 8 {
            0 => -1,
            1 => 17,
            2 => 0,
            k => (k % 3) as i32 + 1,
        };
        // Small shapes mostly (a DDP allocates them); sometimes huge ones,
        // which the registry (host metadata) must reject or the DDP must
        // fail to allocate with an error.
        let mut shape = [0i64; 17];
        for d in shape.iter_mut() {
            *d = if b.u8() % 8 == 0 { b.dim() } else { (b.u8() % 9) as i64 };
        }
        let shape_p = if b.u8() % 8 == 0 { std::ptr::null() } else { shape.as_ptr() };
        let (pd, gd) = ((b.u8() % 7) as i32 - 1, (b.u8() % 7) as i32 - 1);
        let mut id = -1i64;
        let id_p: *mut i64 = if b.u8() % 16 == 0 { null_mut() } else { &mut id };
        // SAFETY: names are NUL-terminated; shape holds 17 entries (more
        // than any accepted ndims) or is NULL.
        let r = unsafe { ftn_param_registry_register(reg, name, shape_p, ndims, pd, gd, id_p) };
        let floats = |d: i32| (0..=2).contains(&d);
        let nd = ndims.clamp(0, 17) as usize;
        let bad = name.is_null()
            || id_p.is_null()
            || !(0..=16).contains(&ndims)
            || (ndims > 0 && shape_p.is_null())
            || (!shape_p.is_null() && shape[..nd].iter().any(|&d| d < 0))
            || !floats(pd)
            || !floats(gd);
        done(r, bad, "registry register");
        if r == ftnResult_t::ftnSuccess {
            assert_eq!(id, registered, "parameter ids count up");
            registered += 1;
            let numel = shape[..nd]
                .iter()
                .fold(1i128, |a, &d| a.saturating_mul(d as i128));
            total = total.saturating_add(numel);
        }
    }
    let csize = b.size(std::mem::size_of::<ftnDdpConfig_t>());
    let dist = b.u8() % 2 == 0;
    let cfg = ftnDdpConfig_t {
        size: csize,
        bucket_size: if b.u8() % 2 == 0 { 0 } else { b.dim() },
        distributed_optimizer: if dist { 1 } else { (b.u8() % 3 == 0) as i32 * 2 },
        averaging: (b.u8() % 5) as i32 - 1,
        check_for_nan_in_grad: (b.u8() % 2) as i32,
        reserved: (b.u8() % 8 == 0) as i32,
    };
    let cs = desc_storage(cfg, csize, b);
    let cfg = effective(cfg, csize);
    let mut ddp = null_mut();
    // Only a DDP whose buffers are small is created (the emulator zeroes
    // them); a huge registry still goes through every check before that.
    let r = if total <= 1 << 14 {
        // SAFETY: the config storage holds its claimed size.
        unsafe { ftn_ddp_create(e.comm, reg, cs.as_ptr() as *const ftnDdpConfig_t, &mut ddp) }
    } else {
        ftnResult_t::ftnInvalidArgument
    };
    let bad = registered == 0
        || csize < 32
        || csize > FTN_MAX_DESC_SIZE
        || cfg.bucket_size < 0
        || !(0..=2).contains(&cfg.averaging)
        || cfg.reserved != 0;
    done(r, bad, "ddp create");
    // SAFETY: a live registry (the DDP keeps its own copy).
    done(unsafe { ftn_param_registry_destroy(reg) }, false, "registry destroy");
    if r != ftnResult_t::ftnSuccess {
        return;
    }
    let is_dist = cfg.distributed_optimizer != 0;
    let mut opt: ftnDistOpt_t = null_mut();
    let mut live_scalers = Vec::new();
    for _ in 0..(b.u8() % 12) {
        let id = match b.u8() % 4 {
            0 => b.dim(),
            _ => (b.u8() as i64) % (registered + 1),
        };
        let mut ptr = null_mut();
        let out: *mut *mut c_void = if b.u8() % 16 == 0 { null_mut() } else { &mut ptr };
        // SAFETY: valid handles; out is NULL or valid.
        let r = unsafe {
            match b.u8() % 8 {
                0 => ftn_ddp_get_grad(ddp, id, out),
                1 => ftn_ddp_get_param(ddp, id, out),
                2 | 3 => ftn_ddp_mark_grad_ready(ddp, e.stream, id),
                4 => ftn_ddp_set_is_last_microbatch(ddp, b.u8() as i32 % 3 - 1),
                5 => ftn_ddp_finish_grad_sync(ddp, e.stream),
                6 => ftn_ddp_zero_grad_buffer(ddp, e.stream),
                _ if opt.is_null() => {
                    let osize = b.size(std::mem::size_of::<ftnDistOptConfig_t>());
                    let oc = ftnDistOptConfig_t {
                        size: osize,
                        beta1: if b.u8() % 2 == 0 { 0.9 } else { b.f32() },
                        beta2: if b.u8() % 2 == 0 { 0.999 } else { b.f32() },
                        eps: if b.u8() % 2 == 0 { 1e-8 } else { b.f32() },
                        mode: (b.u8() % 4) as i32 - 1,
                        weight_decay: if b.u8() % 2 == 0 { 0.01 } else { b.f32() },
                        reserved: (b.u8() % 8 == 0) as i32,
                        max_grad_norm: if b.u8() % 2 == 0 { 1.0 } else { b.f32() as f64 },
                    };
                    let os = desc_storage(oc, osize, b);
                    let oc = effective(oc, osize);
                    let r = ftn_dist_opt_create(ddp, os.as_ptr() as *const ftnDistOptConfig_t, &mut opt);
                    let bad = !is_dist
                        || osize < 40
                        || osize > FTN_MAX_DESC_SIZE
                        || !(0.0..1.0).contains(&oc.beta1)
                        || !(0.0..1.0).contains(&oc.beta2)
                        || !(oc.eps.is_finite() && oc.eps > 0.0)
                        || !(0..=1).contains(&oc.mode)
                        || !(oc.weight_decay.is_finite() && oc.weight_decay >= 0.0)
                        || !(oc.max_grad_norm.is_finite() && oc.max_grad_norm >= 0.0)
                        || oc.reserved != 0;
                    done(r, bad, "dist opt create");
                    if r != ftnResult_t::ftnSuccess {
                        opt = null_mut();
                    }
                    r
                }
                _ => {
                    let lr = scalar(bufs, 1e-3f32.to_bits(), b);
                    let step = scalar(bufs, 0, b);
                    let (scaler, live) = scaler_arg(b);
                    if live {
                        live_scalers.push(scaler);
                    }
                    let found = if b.u8() % 2 == 0 { scalar(bufs, 0, b) } else { null_mut() };
                    let r = ftn_dist_opt_step(opt, ddp, e.stream, lr as *const f32, step as *mut i32, scaler, found as *mut f32);
                    let bad = !aligned_real(lr, 4)
                        || !aligned_real(step, 4)
                        || (!scaler.is_null() && !live)
                        || (live && !aligned_real(found, 4))
                        || (scaler.is_null() && !found.is_null());
                    done(r, bad, "dist opt step");
                    r
                }
            }
        };
        done(r, false, "ddp call");
    }
    // SAFETY: live handles (the optimizer before its DDP); then stale ones.
    unsafe {
        if !opt.is_null() {
            done(ftn_dist_opt_destroy(opt), false, "dist opt destroy");
        }
        done(ftn_ddp_destroy(ddp), false, "ddp destroy");
        done(ftn_ddp_destroy(ddp), true, "ddp double destroy");
        done(ftn_ddp_finish_grad_sync(ddp, e.stream), true, "ddp stale");
        for sc in live_scalers {
            done(ftn_grad_scaler_destroy(sc), false, "scaler destroy");
        }
    }
}

/// Megatron's memory table and the default weight decay with fuzzed inputs.
fn memory_accounting(b: &mut Bytes) {
    let (pd, gd) = ((b.u8() % 8) as i32 - 1, (b.u8() % 8) as i32 - 1);
    let dp = match b.u8() % 4 {
        0 => b.u64() as i32,
        k => k as i32 - 1,
    };
    let dist = b.u8() as i32 % 3 - 1;
    let mut bytes = f64::NAN;
    let out: *mut f64 = match b.u8() % 8 {
        0 => null_mut(),
        _ => &mut bytes,
    };
    // SAFETY: out is NULL or valid.
    let r = unsafe { ftn_ddp_bytes_per_param(pd, gd, dp, dist, out) };
    let floats = |d: i32| (0..=2).contains(&d);
    done(r, out.is_null() || !floats(pd) || !floats(gd) || dp < 1, "bytes per param");
    if r == ftnResult_t::ftnSuccess {
        assert!(bytes.is_finite() && bytes > 0.0, "bytes per param {bytes}");
    }
    let n = (b.u8() % 6) as usize;
    let mut ndims = [0i64; 5];
    for d in ndims.iter_mut() {
        *d = b.dim();
    }
    let mut wd = [f32::NAN; 5];
    let (np, op): (*const i64, *mut f32) = match b.u8() % 6 {
        0 => (std::ptr::null(), wd.as_mut_ptr()),
        1 => (ndims.as_ptr(), null_mut()),
        _ => (ndims.as_ptr(), wd.as_mut_ptr()),
    };
    let n = n.min(5);
    let decay = b.f32();
    // SAFETY: the arrays hold 5 entries, n <= 5.
    let r = unsafe { ftn_adam_default_weight_decay(np, n, decay, op) };
    let bad = (n > 0 && (np.is_null() || op.is_null()))
        || (n > 0 && ndims[..n].iter().any(|&d| d < 0))
        || !(decay.is_finite() && decay >= 0.0);
    done(r, bad, "default weight decay");
}
