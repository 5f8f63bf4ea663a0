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
    let op = b.u8() % 13;
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
    };
    let st = desc_storage(d, size, b);
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
    let bad = size < 40
        || size > FTN_MAX_DESC_SIZE
        || tokens < 0
        || vocab < 1
        || d.reserved != 0
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
