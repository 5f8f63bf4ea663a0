//! The tensor-parallel MLP and causal self-attention blocks on TP = 1, 2, 4
//! in-process ranks against the unsharded float64 computation (written
//! here): outputs and every gradient (input, all weights, all biases),
//! sequence parallelism on and off, bf16 and fp16; the overlapped backward
//! (communication on the communicator's stream) against the serialised one,
//! bitwise. Sizes are odd (`ffn/tp = 9`, `head_dim = 6`, `hidden = 20`) so
//! the GEMMs take their unaligned paths. Attention dropout (mask from the
//! host Philox twin, per-rank model-parallel seeds) against the same f64
//! reference; selective recomputation against the stored path, bitwise; saved
//! activations moved out and back between micro-batches, bitwise. Padding
//! masks (an encoder's: per sequence, and one shared by the batch) in place
//! of the causal one, against the same reference.

mod common;

use common::ranks::{col_sums, mm, mm_at, mm_bt, run_ranks};
use common::{assert_close_scaled, to_f64, Rng};
use ferrotron::comm::Communicator;
use ferrotron::core::dtype::FloatElement;
use ferrotron::core::rng::{RngTracker, MODEL_PARALLEL_SEED_OFFSET, MODEL_PARALLEL_STREAM};
use ferrotron::ops::DropoutMode;
use ferrotron::ops::Gelu;
use ferrotron::parallel::attention::{
    AttentionGrads, AttentionMask, AttentionOptions, TpAttention,
};
use ferrotron::parallel::linear::{
    shard_cols, shard_rows, ColumnOptions, ColumnParallelLinear, LinearGrads, TpElement, WeightGrad,
};
use ferrotron::parallel::mlp::{MlpGrads, MlpOptions, TpMlp};
use ferrotron::reference::bias_gelu::{gelu, gelu_grad};
use ferrotron::reference::softmax::keeps;
use ferrotron::{Device, DeviceBuffer};
use half::{bf16, f16};

const HIDDEN: usize = 20;
const FFN: usize = 36;
const SEQ: usize = 6;
const BATCH: usize = 2;
const TOKENS: usize = SEQ * BATCH;
const HEADS: usize = 4;
const HEAD_DIM: usize = 6;

fn add_bias(y: &mut [f64], b: &[f64]) {
    let n = b.len();
    for (i, v) in y.iter_mut().enumerate() {
        *v += b[i % n];
    }
}

fn poisoned<T: TpElement>(c: &Communicator, n: usize) -> DeviceBuffer<T> {
    let mut b = c.device().alloc_zeros::<T>(n).unwrap();
    c.stream().fill_bytes(&mut b, 0xFF).unwrap();
    b
}

fn sr<T: Copy>(v: &[T], rows: usize, cols: usize, tp: usize, r: usize) -> Vec<T> {
    shard_rows(v, rows, cols, tp, r).unwrap()
}
fn sc<T: Copy>(v: &[T], rows: usize, cols: usize, tp: usize, r: usize) -> Vec<T> {
    shard_cols(v, rows, cols, tp, r).unwrap()
}

/// A block's problem: input, the two layers' weights and biases, dY.
struct Problem<T> {
    x: (Vec<T>, Vec<f64>),
    w1: (Vec<T>, Vec<f64>),
    b1: (Vec<T>, Vec<f64>),
    w2: (Vec<T>, Vec<f64>),
    b2: (Vec<T>, Vec<f64>),
    dy: (Vec<T>, Vec<f64>),
}

/// `(fc1 out, fc2 in)`: MLP `(FFN, FFN)`, attention `(3*H*D, H*D)`.
fn problem<T: FloatElement>(rng: &mut Rng, out1: usize, in2: usize) -> Problem<T> {
    Problem {
        x: rng.tensor(TOKENS * HIDDEN, 1.0),
        w1: rng.tensor(out1 * HIDDEN, 0.3),
        b1: rng.tensor(out1, 0.5),
        w2: rng.tensor(HIDDEN * in2, 0.3),
        b2: rng.tensor(HIDDEN, 0.5),
        dy: rng.tensor(TOKENS * HIDDEN, 1.0),
    }
}

/// The f64 results: y, dx, dw1, db1, dw2, db2 (full, unsharded).
type Full = [Vec<f64>; 6];

fn mlp_reference<T>(p: &Problem<T>, g: Gelu) -> Full {
    let mut pre = mm_bt(&p.x.1, &p.w1.1, TOKENS, FFN, HIDDEN);
    add_bias(&mut pre, &p.b1.1);
    let h: Vec<f64> = pre.iter().map(|&v| gelu(g, v)).collect();
    let mut y = mm_bt(&h, &p.w2.1, TOKENS, HIDDEN, FFN);
    add_bias(&mut y, &p.b2.1);
    let dh = mm(&p.dy.1, &p.w2.1, TOKENS, FFN, HIDDEN);
    let dpre: Vec<f64> = dh
        .iter()
        .zip(&pre)
        .map(|(&d, &v)| d * gelu_grad(g, v))
        .collect();
    [
        y,
        mm(&dpre, &p.w1.1, TOKENS, HIDDEN, FFN),
        mm_at(&dpre, &p.x.1, FFN, HIDDEN, TOKENS),
        col_sums(&dpre, TOKENS, FFN),
        mm_at(&p.dy.1, &h, HIDDEN, FFN, TOKENS),
        col_sums(&p.dy.1, TOKENS, HIDDEN),
    ]
}

/// Attention dropout of the reference: probability `p` and whether head `n`
/// of batch entry `b` keeps probability `(i, k)`.
struct RefDropout<'a> {
    p: f64,
    keep: &'a dyn Fn(usize, usize, usize, usize) -> bool,
}

/// The mask `TpAttention` draws on `tp` ranks with `AttnCfg { seed, .. }`:
/// rank `r` (heads `[r*hp, (r+1)*hp)`) uses its model-parallel stream
/// (`seed + 2718 + r`, offset 0) over its packed `[BATCH, hp, SEQ, SEQ]`
/// probabilities.
fn tp_keep(p: f32, seed: u64, tp: usize) -> impl Fn(usize, usize, usize, usize) -> bool {
    let hp = HEADS / tp;
    move |b, n, i, k| {
        let (r, nl) = (n / hp, n % hp);
        let s = seed + MODEL_PARALLEL_SEED_OFFSET + r as u64;
        keeps(p, s, 0, ((b * hp + nl) * SEQ + i) * SEQ + k)
    }
}

/// Unsharded self-attention in f64, with the module's layouts: rows
/// `i*BATCH + b`, QKV columns `(head, {q,k,v}, dim)`, context columns
/// `(head, dim)`; query `i` of sequence `b` attends to the keys `k` with
/// `!masked(b, i, k)` (none: zero probabilities, as the fused softmax
/// gives); with `drop`, `C = dropout(P) V`.
fn attention_reference<T>(p: &Problem<T>, masked: &Masked, drop: Option<RefDropout<'_>>) -> Full {
    // The multiplier of probability (b, n, i, k) after dropout.
    let f = |b: usize, n: usize, i: usize, k: usize| match &drop {
        None => 1.0,
        Some(dr) if (dr.keep)(b, n, i, k) => 1.0 / (1.0 - dr.p),
        Some(_) => 0.0,
    };
    let (h, d) = (HEADS, HEAD_DIM);
    let (w3, wc) = (3 * h * d, h * d);
    let scale = 1.0 / (d as f64).sqrt();
    let mut qkv = mm_bt(&p.x.1, &p.w1.1, TOKENS, w3, HIDDEN);
    add_bias(&mut qkv, &p.b1.1);
    let at = |part: usize, b: usize, n: usize, i: usize, j: usize| {
        (i * BATCH + b) * w3 + n * 3 * d + part * d + j
    };
    let mut ctx = vec![0.0; TOKENS * wc];
    let mut probs = vec![vec![0.0; SEQ * SEQ]; BATCH * h];
    for b in 0..BATCH {
        for n in 0..h {
            let pr = &mut probs[b * h + n];
            for i in 0..SEQ {
                let keys: Vec<usize> = (0..SEQ).filter(|&k| !masked(b, i, k)).collect();
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&k| {
                        scale
                            * (0..d)
                                .map(|j| qkv[at(0, b, n, i, j)] * qkv[at(1, b, n, k, j)])
                                .sum::<f64>()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                for (&k, v) in keys.iter().zip(&s) {
                    pr[i * SEQ + k] = (v - m).exp() / z;
                }
                for j in 0..d {
                    ctx[(i * BATCH + b) * wc + n * d + j] = (0..SEQ)
                        .map(|k| f(b, n, i, k) * pr[i * SEQ + k] * qkv[at(2, b, n, k, j)])
                        .sum();
                }
            }
        }
    }
    let mut y = mm_bt(&ctx, &p.w2.1, TOKENS, HIDDEN, wc);
    add_bias(&mut y, &p.b2.1);
    let dctx = mm(&p.dy.1, &p.w2.1, TOKENS, wc, HIDDEN);
    let dw2 = mm_at(&p.dy.1, &ctx, HIDDEN, wc, TOKENS);
    let db2 = col_sums(&p.dy.1, TOKENS, HIDDEN);
    let mut dqkv = vec![0.0; TOKENS * w3];
    for b in 0..BATCH {
        for n in 0..h {
            let pr = &probs[b * h + n];
            let dc = |i: usize, j: usize| dctx[(i * BATCH + b) * wc + n * d + j];
            for i in 0..SEQ {
                // The gradient of the dropped probabilities, through the mask.
                let dp: Vec<f64> = (0..SEQ)
                    .map(|k| {
                        f(b, n, i, k)
                            * (0..d)
                                .map(|j| dc(i, j) * qkv[at(2, b, n, k, j)])
                                .sum::<f64>()
                    })
                    .collect();
                let dot: f64 = (0..SEQ).map(|k| dp[k] * pr[i * SEQ + k]).sum();
                let ds: Vec<f64> = (0..SEQ)
                    .map(|k| scale * pr[i * SEQ + k] * (dp[k] - dot))
                    .collect();
                for j in 0..d {
                    dqkv[at(0, b, n, i, j)] += (0..SEQ)
                        .map(|k| ds[k] * qkv[at(1, b, n, k, j)])
                        .sum::<f64>();
                    for k in 0..SEQ {
                        dqkv[at(1, b, n, k, j)] += ds[k] * qkv[at(0, b, n, i, j)];
                        dqkv[at(2, b, n, k, j)] += f(b, n, i, k) * pr[i * SEQ + k] * dc(i, j);
                    }
                }
            }
        }
    }
    [
        y,
        mm(&dqkv, &p.w1.1, TOKENS, HIDDEN, w3),
        mm_at(&dqkv, &p.x.1, w3, HIDDEN, TOKENS),
        col_sums(&dqkv, TOKENS, w3),
        dw2,
        db2,
    ]
}

/// Whether query `i` of sequence `b` is kept from key `k`: `(b, i, k)`.
type Masked = dyn Fn(usize, usize, usize) -> bool;

/// The attention mask of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum MaskKind {
    /// Causal (`forward_with_dropout`).
    #[default]
    Causal,
    /// `[BATCH, 1, SEQ, SEQ]`: sequence `b` has `SEQ - 1 - 2b` real tokens,
    /// the rest padding, masked as query and as key (Megatron's BERT mask;
    /// the padding queries' rows are fully masked).
    PerSequence,
    /// `[1, 1, SEQ, SEQ]`, shared by the batch: blocks of 3 positions attend
    /// within their block only.
    Shared,
}

impl MaskKind {
    fn masked(self) -> impl Fn(usize, usize, usize) -> bool {
        move |b, i, k| match self {
            MaskKind::Causal => k > i,
            MaskKind::PerSequence => {
                let len = SEQ - 1 - 2 * b;
                i >= len || k >= len
            }
            MaskKind::Shared => i / 3 != k / 3,
        }
    }

    /// The uint8 mask the block takes (`None`: causal).
    fn bytes(self) -> Option<Vec<u8>> {
        let m = self.masked();
        let batches = match self {
            MaskKind::Causal => return None,
            MaskKind::PerSequence => BATCH,
            MaskKind::Shared => 1,
        };
        Some(
            (0..batches * SEQ * SEQ)
                .map(|e| {
                    let (b, i, k) = (e / (SEQ * SEQ), e / SEQ % SEQ, e % SEQ);
                    m(b, i, k) as u8
                })
                .collect(),
        )
    }
}

/// What one rank returns, in the order of [`Full`], this rank's parts.
type RankOut = [Vec<f64>; 6];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Block {
    Mlp,
    Attention,
}

impl Block {
    fn widths(self) -> (usize, usize) {
        match self {
            Block::Mlp => (FFN, FFN),
            Block::Attention => (3 * HEADS * HEAD_DIM, HEADS * HEAD_DIM),
        }
    }
}

/// The attention options a run sets beyond sequence parallelism and overlap:
/// dropout `p` with per-rank states from `RngTracker::megatron(seed, rank)`'s
/// model-parallel stream, selective recomputation.
#[derive(Clone, Copy, Debug, Default)]
struct AttnCfg {
    dropout: f32,
    recompute: bool,
    seed: u64,
    mask: MaskKind,
}

/// Runs one block's forward + backward on `tp` ranks. `fuse`: weight
/// gradients accumulated into fp32 main_grads (starting at zero) instead of
/// stored in `T`.
fn run_block<T: TpElement>(
    block: Block,
    p: &Problem<T>,
    tp: usize,
    sp: bool,
    overlap: bool,
    fuse: bool,
) -> Vec<RankOut> {
    run_block_with(block, p, tp, sp, overlap, fuse, AttnCfg::default())
}

#[allow(clippy::too_many_arguments)]
fn run_block_with<T: TpElement>(
    block: Block,
    p: &Problem<T>,
    tp: usize,
    sp: bool,
    overlap: bool,
    fuse: bool,
    cfg: AttnCfg,
) -> Vec<RankOut> {
    let (out1, in2) = block.widths();
    run_ranks(tp, |c| {
        let r = c.rank();
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        let rows = if sp { TOKENS / tp } else { TOKENS };
        let mine = |v: &[T]| {
            if sp {
                sr(v, TOKENS, HIDDEN, tp, r)
            } else {
                v.to_vec()
            }
        };
        let x = dev.upload(&mine(&p.x.0)).unwrap();
        let dy = dev.upload(&mine(&p.dy.0)).unwrap();
        let mut y = poisoned::<T>(&c, rows * HIDDEN);
        let mut dx = poisoned::<T>(&c, rows * HIDDEN);
        let (o1, i2) = (out1 / tp, in2 / tp);
        let mut gw1 = poisoned::<T>(&c, o1 * HIDDEN);
        let mut gw2 = poisoned::<T>(&c, HIDDEN * i2);
        let mut mw1 = dev.alloc_zeros::<f32>(o1 * HIDDEN).unwrap();
        let mut mw2 = dev.alloc_zeros::<f32>(HIDDEN * i2).unwrap();
        let mut gb1 = poisoned::<T>(&c, o1);
        let mut gb2 = poisoned::<T>(&c, HIDDEN);
        c.stream().synchronize().unwrap();
        let (g1, g2) = if fuse {
            (
                WeightGrad::Accumulate(&mut mw1),
                WeightGrad::Accumulate(&mut mw2),
            )
        } else {
            (WeightGrad::Store(&mut gw1), WeightGrad::Store(&mut gw2))
        };
        let l1 = LinearGrads {
            weight: g1,
            bias: Some(&mut gb1),
        };
        let l2 = LinearGrads {
            weight: g2,
            bias: Some(&mut gb2),
        };
        match block {
            Block::Mlp => {
                let o = MlpOptions {
                    sequence_parallel: sp,
                    overlap,
                    ..Default::default()
                };
                let mut m =
                    TpMlp::from_full(&c, HIDDEN, FFN, &p.w1.0, &p.b1.0, &p.w2.0, &p.b2.0, o)
                        .unwrap();
                m.forward(&c, &s, &x, &mut y, TOKENS).unwrap();
                m.backward(&c, &s, &x, &dy, &mut dx, MlpGrads { fc1: l1, fc2: l2 })
                    .unwrap();
            }
            Block::Attention => {
                let o = AttentionOptions {
                    sequence_parallel: sp,
                    overlap,
                    attention_dropout: cfg.dropout,
                    recompute_core: cfg.recompute,
                };
                let mut a = TpAttention::from_full(
                    &c, HIDDEN, HEADS, HEAD_DIM, &p.w1.0, &p.b1.0, &p.w2.0, &p.b2.0, o,
                )
                .unwrap();
                let mut rng = RngTracker::megatron(cfg.seed, r as u64);
                let state = rng
                    .next(MODEL_PARALLEL_STREAM, a.random_values(SEQ, BATCH))
                    .unwrap();
                let mode = DropoutMode::Train(state);
                match cfg.mask.bytes() {
                    None => a
                        .forward_with_dropout(&c, &s, &x, &mut y, SEQ, BATCH, mode)
                        .unwrap(),
                    Some(m) => {
                        let m = dev.upload(&m).unwrap();
                        let mask = AttentionMask::Padding(&m);
                        a.forward_masked(&c, &s, &x, &mut y, (SEQ, BATCH), mode, mask)
                            .unwrap()
                    }
                }
                let grads = AttentionGrads { qkv: l1, proj: l2 };
                a.backward(&c, &s, &x, &dy, &mut dx, grads).unwrap();
            }
        }
        s.synchronize().unwrap();
        let t = |b: &DeviceBuffer<T>| to_f64(&b.to_host().unwrap());
        let f = |b: &DeviceBuffer<f32>| -> Vec<f64> {
            b.to_host().unwrap().iter().map(|&v| v as f64).collect()
        };
        let (w1, w2) = if fuse {
            (f(&mw1), f(&mw2))
        } else {
            (t(&gw1), t(&gw2))
        };
        [t(&y), t(&dx), w1, t(&gb1), w2, t(&gb2)]
    })
}

fn check_block<T: TpElement>(block: Block, tp: usize, sp: bool, fuse: bool, salt: u64) {
    check_block_with::<T>(block, tp, sp, fuse, salt, AttnCfg::default());
}

fn check_block_with<T: TpElement>(
    block: Block,
    tp: usize,
    sp: bool,
    fuse: bool,
    salt: u64,
    mut cfg: AttnCfg,
) {
    let (out1, in2) = block.widths();
    let (mut rng, seed) = Rng::new(salt);
    let p = problem::<T>(&mut rng, out1, in2);
    cfg.seed = rng.next_u64() >> 1;
    let keep = tp_keep(cfg.dropout, cfg.seed, tp);
    let full = match block {
        Block::Mlp => mlp_reference(&p, Gelu::Tanh),
        Block::Attention => attention_reference(
            &p,
            &cfg.mask.masked(),
            (cfg.dropout > 0.0).then_some(RefDropout {
                p: cfg.dropout as f64,
                keep: &keep,
            }),
        ),
    };
    let outs = run_block_with(block, &p, tp, sp, true, fuse, cfg);
    assert_eq!(outs.len(), tp);
    for (r, out) in outs.iter().enumerate() {
        let rows_of = |v: &[f64]| {
            if sp {
                sr(v, TOKENS, HIDDEN, tp, r)
            } else {
                v.to_vec()
            }
        };
        let want = [
            rows_of(&full[0]),
            rows_of(&full[1]),
            sr(&full[2], out1, HIDDEN, tp, r),
            sr(&full[3], out1, 1, tp, r),
            sc(&full[4], HIDDEN, in2, tp, r),
            full[5].clone(),
        ];
        let names = [
            "output",
            "grad_input",
            "layer 1 weight grad",
            "layer 1 bias grad",
            "layer 2 weight grad",
            "layer 2 bias grad",
        ];
        for ((o, w), n) in out.iter().zip(&want).zip(names) {
            let what = format!("{block:?} tp={tp} sp={sp} fuse={fuse} {cfg:?} rank {r}: {n}");
            // The attention backward chains five ops that each store their
            // result in T (QKV, scores P, dP/dS, context, projection), so its
            // gradients carry up to ~3 single-op roundings; the MLP two.
            let factor = match block {
                Block::Attention => 3.0,
                _ => 2.0,
            };
            assert_close_scaled(&what, T::DTYPE, seed, o, w, factor);
        }
    }
}

#[test]
fn tp_mlp_matches_unsharded_on_tp_1_2_4_with_and_without_sp() {
    for tp in [1, 2, 4] {
        for sp in [false, true] {
            check_block::<bf16>(Block::Mlp, tp, sp, tp != 2, 100 + tp as u64);
        }
    }
    check_block::<f16>(Block::Mlp, 2, true, false, 107);
}

#[test]
fn tp_attention_matches_unsharded_on_tp_1_2_4_with_and_without_sp() {
    for tp in [1, 2, 4] {
        for sp in [false, true] {
            check_block::<bf16>(Block::Attention, tp, sp, tp != 2, 200 + tp as u64);
        }
    }
    check_block::<f16>(Block::Attention, 2, false, true, 207);
}

#[test]
fn tp_attention_with_dropout_matches_unsharded() {
    let cfg = |recompute| AttnCfg {
        dropout: 0.3,
        recompute,
        ..AttnCfg::default()
    };
    for (tp, sp) in [(1, false), (2, true), (4, false)] {
        check_block_with::<bf16>(Block::Attention, tp, sp, true, 400 + tp as u64, cfg(false));
    }
    check_block_with::<bf16>(Block::Attention, 2, false, false, 405, cfg(true));
    check_block_with::<f16>(Block::Attention, 2, true, true, 406, cfg(false));
}

/// Padding masks in place of the causal one (per sequence, with fully
/// masked rows; shared by the batch), with and without dropout, sequence
/// parallelism and selective recomputation.
#[test]
fn tp_attention_with_a_padding_mask_matches_unsharded() {
    let cfg = |mask, dropout, recompute| AttnCfg {
        dropout,
        recompute,
        seed: 0,
        mask,
    };
    use MaskKind::{PerSequence, Shared};
    let runs = [
        (1, false, cfg(PerSequence, 0.0, false)),
        (2, true, cfg(PerSequence, 0.0, true)),
        (4, false, cfg(PerSequence, 0.3, false)),
        (2, false, cfg(Shared, 0.0, false)),
        (2, true, cfg(Shared, 0.3, true)),
    ];
    for (i, (tp, sp, c)) in runs.into_iter().enumerate() {
        check_block_with::<bf16>(Block::Attention, tp, sp, true, 450 + i as u64, c);
    }
    check_block_with::<f16>(
        Block::Attention,
        2,
        false,
        true,
        460,
        cfg(PerSequence, 0.0, false),
    );
}

/// Selective recomputation (probabilities recomputed in backward from the
/// saved QKV and Philox state) gives the stored path's results bit for bit,
/// with and without dropout.
#[test]
fn recompute_core_equals_stored_bitwise() {
    let (mut rng, seed) = Rng::new(500);
    let (out1, in2) = Block::Attention.widths();
    let p = problem::<bf16>(&mut rng, out1, in2);
    for (tp, sp) in [(1, false), (2, true), (2, false)] {
        for (dropout, mask) in [
            (0.0, MaskKind::Causal),
            (0.25, MaskKind::Causal),
            (0.25, MaskKind::PerSequence),
        ] {
            let cfg = |recompute| AttnCfg {
                dropout,
                recompute,
                seed: 77,
                mask,
            };
            let a = run_block_with(Block::Attention, &p, tp, sp, true, true, cfg(false));
            let b = run_block_with(Block::Attention, &p, tp, sp, true, true, cfg(true));
            assert_eq!(
                a, b,
                "tp={tp} sp={sp} dropout={dropout} {mask:?} (seed {seed})"
            );
        }
    }
}

/// One micro-batch's input, output gradient and dropout state.
struct MicroBatch {
    x: Vec<bf16>,
    dy: Vec<bf16>,
    mode: DropoutMode,
}

/// Forward + backward of each micro-batch on one layer: one at a time
/// (`interleave = false`), or every forward first, moving the saved
/// activations out with `take_saved`, then the backwards in reverse order,
/// each after `restore_saved`. Returns, per micro-batch, the output, input
/// gradient and the four weight / bias gradients, plus the bytes of each
/// saved set.
fn run_micro_batches(
    c: &Communicator,
    p: &Problem<bf16>,
    options: AttentionOptions,
    mbs: &[MicroBatch],
    interleave: bool,
) -> (Vec<RankOut>, Vec<usize>) {
    let dev = c.device().clone();
    let s = dev.new_stream().unwrap();
    let mut a = TpAttention::from_full(
        c, HIDDEN, HEADS, HEAD_DIM, &p.w1.0, &p.b1.0, &p.w2.0, &p.b2.0, options,
    )
    .unwrap();
    let tp = c.size();
    let (o1, i2) = (3 * HEADS * HEAD_DIM / tp, HEADS * HEAD_DIM / tp);
    let t = |b: &DeviceBuffer<bf16>| to_f64(&b.to_host().unwrap());
    let xs: Vec<_> = mbs.iter().map(|m| dev.upload(&m.x).unwrap()).collect();
    let mut ys: Vec<_> = mbs
        .iter()
        .map(|_| poisoned::<bf16>(c, TOKENS * HIDDEN))
        .collect();
    // The poison is filled on the communicator's stream and the forwards
    // run on `s`: without this wait a fill could land after a forward wrote
    // y (seen once in ~60 runs: y all NaN, the 0xFF pattern).
    c.stream().synchronize().unwrap();
    let mut out = vec![None; mbs.len()];
    let mut bytes = Vec::new();
    let mut backward = |a: &mut TpAttention<bf16>, k: usize, y: &DeviceBuffer<bf16>| {
        let dy = dev.upload(&mbs[k].dy).unwrap();
        let mut dx = poisoned::<bf16>(c, TOKENS * HIDDEN);
        let mut gw1 = poisoned::<bf16>(c, o1 * HIDDEN);
        let mut gb1 = poisoned::<bf16>(c, o1);
        let mut gw2 = poisoned::<bf16>(c, HIDDEN * i2);
        let mut gb2 = poisoned::<bf16>(c, HIDDEN);
        c.stream().synchronize().unwrap();
        let grads = AttentionGrads {
            qkv: LinearGrads {
                weight: WeightGrad::Store(&mut gw1),
                bias: Some(&mut gb1),
            },
            proj: LinearGrads {
                weight: WeightGrad::Store(&mut gw2),
                bias: Some(&mut gb2),
            },
        };
        a.backward(c, &s, &xs[k], &dy, &mut dx, grads).unwrap();
        s.synchronize().unwrap();
        out[k] = Some([t(y), t(&dx), t(&gw1), t(&gb1), t(&gw2), t(&gb2)]);
    };
    if interleave {
        let mut saved = Vec::new();
        for (k, m) in mbs.iter().enumerate() {
            a.forward_with_dropout(c, &s, &xs[k], &mut ys[k], SEQ, BATCH, m.mode)
                .unwrap();
            let sv = a.take_saved().unwrap();
            assert_eq!(sv.shape(), (SEQ, BATCH));
            // The dropout applied: none at p = 0.
            let applied = match options.attention_dropout > 0.0 {
                true => m.mode,
                false => DropoutMode::Eval,
            };
            assert_eq!(sv.dropout(), applied);
            assert_eq!(sv.holds_probabilities(), !options.recompute_core);
            assert!(a.take_saved().is_none() && a.saved_shape().is_none());
            bytes.push(sv.bytes());
            saved.push(sv);
        }
        for k in (0..mbs.len()).rev() {
            a.restore_saved(saved.pop().unwrap()).unwrap();
            if k == 0 {
                // Freed workspace is allocated again, results unchanged.
                assert!(a.workspace_bytes() > 0);
                a.release_workspace();
                assert_eq!(a.workspace_bytes(), 0);
            }
            backward(&mut a, k, &ys[k]);
        }
    } else {
        for (k, m) in mbs.iter().enumerate() {
            a.forward_with_dropout(c, &s, &xs[k], &mut ys[k], SEQ, BATCH, m.mode)
                .unwrap();
            backward(&mut a, k, &ys[k]);
        }
    }
    (out.into_iter().map(Option::unwrap).collect(), bytes)
}

/// Pipeline-style use: two forwards with `take_saved` in between, then the
/// backwards in reverse order after `restore_saved`, equal bit for bit to
/// forward + backward one micro-batch at a time; stored and recomputed
/// probabilities, with and without dropout. `bytes()` counts what is held.
#[test]
fn saved_activations_move_between_micro_batches() {
    let (mut rng, seed) = Rng::new(600);
    let (out1, in2) = Block::Attention.widths();
    let p = problem::<bf16>(&mut rng, out1, in2);
    let inputs: Vec<_> = (0..2)
        .map(|_| {
            (
                rng.tensor::<bf16>(TOKENS * HIDDEN, 1.0).0,
                rng.tensor::<bf16>(TOKENS * HIDDEN, 1.0).0,
            )
        })
        .collect();
    for dropout in [0.0f32, 0.2] {
        for recompute in [false, true] {
            let options = AttentionOptions {
                attention_dropout: dropout,
                recompute_core: recompute,
                ..Default::default()
            };
            let tp = 2;
            let res = run_ranks(tp, |c| {
                let mut tracker = RngTracker::megatron(31, c.rank() as u64);
                let n = (BATCH * HEADS / tp * SEQ * SEQ) as u64;
                let mbs: Vec<MicroBatch> = inputs
                    .iter()
                    .map(|(x, dy)| MicroBatch {
                        x: x.clone(),
                        dy: dy.clone(),
                        mode: DropoutMode::Train(tracker.next(MODEL_PARALLEL_STREAM, n).unwrap()),
                    })
                    .collect();
                let (a, _) = run_micro_batches(&c, &p, options, &mbs, false);
                let (b, bytes) = run_micro_batches(&c, &p, options, &mbs, true);
                (a, b, bytes)
            });
            let hp = HEADS / tp;
            let (qkv, ctx, probs) = (
                TOKENS * 3 * hp * HEAD_DIM,
                TOKENS * hp * HEAD_DIM,
                BATCH * hp * SEQ * SEQ,
            );
            let held = match (recompute, dropout > 0.0) {
                (true, _) => qkv + ctx,
                (false, false) => qkv + ctx + probs,
                (false, true) => qkv + ctx + 2 * probs,
            } * 2;
            for (r, (a, b, bytes)) in res.iter().enumerate() {
                let what =
                    format!("dropout={dropout} recompute={recompute} rank {r} (seed {seed})");
                assert_eq!(a, b, "{what}");
                assert_eq!(bytes, &vec![held; 2], "{what}");
                // The two micro-batches really differ.
                assert_ne!(a[0][1], a[1][1], "{what}");
            }
        }
    }
}

#[test]
fn saved_activations_of_another_shape_are_rejected() {
    run_ranks(2, |c| {
        let z = |n: usize| vec![bf16::from_f32(0.125); n];
        let layer = |heads: usize, o: AttentionOptions| {
            let (w3, wc) = (3 * heads * HEAD_DIM, heads * HEAD_DIM);
            TpAttention::<bf16>::from_full(
                &c,
                HIDDEN,
                heads,
                HEAD_DIM,
                &z(w3 * HIDDEN),
                &z(w3),
                &z(HIDDEN * wc),
                &z(HIDDEN),
                o,
            )
        };
        let mut a = layer(HEADS, AttentionOptions::default()).unwrap();
        let mut b = layer(2, AttentionOptions::default()).unwrap();
        let dev = c.device();
        let x = dev.upload(&z(TOKENS * HIDDEN)).unwrap();
        let mut y = dev.alloc_zeros::<bf16>(TOKENS * HIDDEN).unwrap();
        b.forward(&c, c.stream(), &x, &mut y, SEQ, BATCH).unwrap();
        a.forward(&c, c.stream(), &x, &mut y, SEQ, BATCH).unwrap();
        let sv = a.take_saved().unwrap();
        match b.restore_saved(sv) {
            Err(ferrotron::Error::InvalidArgument { arg: "saved", .. }) => {}
            other => panic!("expected an error naming `saved`, got {:?}", other.err()),
        }
        assert_eq!(b.saved_shape(), Some((SEQ, BATCH)), "b kept its own");
        for p in [1.0f32, -0.5, f32::NAN] {
            let o = AttentionOptions {
                attention_dropout: p,
                ..Default::default()
            };
            match layer(HEADS, o) {
                Err(ferrotron::Error::InvalidArgument {
                    arg: "options.attention_dropout",
                    ..
                }) => {}
                other => panic!(
                    "p={p}: expected a named error, got {:?}",
                    other.err().map(|e| e.to_string())
                ),
            }
        }
        // A dropout probability set on the options after construction is
        // checked by the forward.
        a.options.attention_dropout = 2.0;
        let e = a
            .forward(&c, c.stream(), &x, &mut y, SEQ, BATCH)
            .unwrap_err()
            .to_string();
        assert!(e.contains("attention_dropout"), "{e}");
    });
}

#[test]
fn overlapped_backward_equals_serialised_bitwise() {
    let (mut rng, seed) = Rng::new(300);
    for block in [Block::Mlp, Block::Attention] {
        let (out1, in2) = block.widths();
        let p = problem::<bf16>(&mut rng, out1, in2);
        for sp in [false, true] {
            let a = run_block(block, &p, 4, sp, true, true);
            let b = run_block(block, &p, 4, sp, false, true);
            assert_eq!(a, b, "{block:?} sp={sp} (seed {seed})");
        }
    }
}

#[test]
fn invalid_arguments_are_errors() {
    run_ranks(2, |c| {
        let (out1, in2) = (9, 9);
        let z = |n: usize| vec![bf16::ZERO; n];
        let e = TpMlp::<bf16>::from_full(
            &c,
            HIDDEN,
            out1,
            &z(out1 * HIDDEN),
            &z(out1),
            &z(HIDDEN * in2),
            &z(HIDDEN),
            MlpOptions::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("`ffn`") && e.contains("multiple"), "{e}");
        let e = TpAttention::<bf16>::from_full(
            &c,
            HIDDEN,
            3,
            4,
            &z(36 * HIDDEN),
            &z(36),
            &z(HIDDEN * 12),
            &z(HIDDEN),
            AttentionOptions::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("heads"), "{e}");
        let mut a = TpAttention::<bf16>::from_full(
            &c,
            HIDDEN,
            2,
            4,
            &z(24 * HIDDEN),
            &z(24),
            &z(HIDDEN * 8),
            &z(HIDDEN),
            AttentionOptions::default(),
        )
        .unwrap();
        let dev = c.device();
        let x = dev.alloc_zeros::<bf16>(TOKENS * HIDDEN).unwrap();
        let mut dx = dev.alloc_zeros::<bf16>(TOKENS * HIDDEN).unwrap();
        let mut gw1 = dev.alloc_zeros::<bf16>(12 * HIDDEN).unwrap();
        let mut gw2 = dev.alloc_zeros::<bf16>(HIDDEN * 4).unwrap();
        let grads = AttentionGrads {
            qkv: LinearGrads {
                weight: WeightGrad::Store(&mut gw1),
                bias: None,
            },
            proj: LinearGrads {
                weight: WeightGrad::Store(&mut gw2),
                bias: None,
            },
        };
        let e = a
            .backward(&c, c.stream(), &x, &x, &mut dx, grads)
            .unwrap_err()
            .to_string();
        assert!(e.contains("preceding forward"), "{e}");
        let mut y = dev.alloc_zeros::<bf16>(5).unwrap();
        let e = a
            .forward(&c, c.stream(), &x, &mut y, SEQ, BATCH)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`output`"), "{e}");
        // A padding mask of neither [batch, 1, seq, seq] nor [1, 1, seq, seq].
        let mut y = dev.alloc_zeros::<bf16>(TOKENS * HIDDEN).unwrap();
        let m = dev.alloc_zeros::<u8>(SEQ * SEQ + 1).unwrap();
        let e = a
            .forward_masked(
                &c,
                c.stream(),
                &x,
                &mut y,
                (SEQ, BATCH),
                DropoutMode::Eval,
                AttentionMask::Padding(&m),
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("TpAttention") && e.contains("`mask`") && e.contains("37"),
            "{e}"
        );
        assert!(
            a.saved_shape().is_none(),
            "a rejected forward saved nothing"
        );
    });
}

#[test]
fn a_rejected_forward_keeps_the_saved_activations() {
    run_ranks(2, |c| {
        let ffn = 8;
        let z = |n: usize| vec![bf16::from_f32(0.25); n];
        let mut m = TpMlp::<bf16>::from_full(
            &c,
            HIDDEN,
            ffn,
            &z(ffn * HIDDEN),
            &z(ffn),
            &z(HIDDEN * ffn),
            &z(HIDDEN),
            MlpOptions::default(),
        )
        .unwrap();
        let dev = c.device();
        let s = c.stream();
        let x = dev.upload(&z(TOKENS * HIDDEN)).unwrap();
        let mut y = dev.alloc_zeros::<bf16>(TOKENS * HIDDEN).unwrap();
        m.forward(&c, s, &x, &mut y, TOKENS).unwrap();
        // Wrong output length, then a wrong-rank communicator: both rejected.
        let mut short = dev.alloc_zeros::<bf16>(3).unwrap();
        let e = m
            .forward(&c, s, &x, &mut short, TOKENS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`output`"), "{e}");
        assert_eq!(
            m.saved_tokens(),
            Some(TOKENS),
            "the rejected forward kept the activations"
        );
        let (mut gw1, mut gw2) = (
            dev.alloc_zeros::<bf16>(ffn / 2 * HIDDEN).unwrap(),
            dev.alloc_zeros::<bf16>(HIDDEN * ffn / 2).unwrap(),
        );
        let mut dx = dev.alloc_zeros::<bf16>(TOKENS * HIDDEN).unwrap();
        let grads = MlpGrads {
            fc1: LinearGrads {
                weight: WeightGrad::Store(&mut gw1),
                bias: None,
            },
            fc2: LinearGrads {
                weight: WeightGrad::Store(&mut gw2),
                bias: None,
            },
        };
        m.backward(&c, s, &x, &y, &mut dx, grads).unwrap();
        s.synchronize().unwrap();
        // Nonzero inputs and weights: the backward really ran.
        assert!(dx.to_host().unwrap().iter().any(|v| v.to_f32() != 0.0));
    });
}

#[test]
fn a_layer_used_with_another_ranks_communicator_is_an_error() {
    let devs = [Device::emu(), Device::emu()];
    let comms = Communicator::in_process(&devs).unwrap();
    let z = vec![bf16::ZERO; 16 * 8];
    let mut col = ColumnParallelLinear::<bf16>::from_full(
        &comms[0],
        8,
        16,
        &z,
        None,
        ColumnOptions {
            bias: false,
            ..Default::default()
        },
    )
    .unwrap();
    let dev = comms[1].device();
    let x = dev.alloc_zeros::<bf16>(4 * 8).unwrap();
    let mut y = dev.alloc_zeros::<bf16>(4 * 8).unwrap();
    let e = col
        .forward(&comms[1], comms[1].stream(), &x, &mut y, None, 4)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`comm`") && e.contains("rank 0 of the 2-rank"),
        "{e}"
    );
}
