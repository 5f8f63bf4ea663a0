//! Vocab-parallel embedding and cross-entropy on TP = 1, 2, 4 ranks (the
//! in-process communicator on the emulator) against the unsharded float64
//! oracle: a vocabulary not divisible by 128 * tp (padding), out-of-range ids
//! and labels, label smoothing on and off, `ignore_index` (PyTorch's -100
//! and a label inside the vocabulary), fp32 and bf16 storage, i32 and i64
//! ids.

mod common;

use common::ranks::run_ranks;
use common::{assert_close, to_f64, Rng};
use ferrotron::core::dtype::FloatElement;
use ferrotron::parallel::vocab::{
    padded_vocab_size, shard_vocab_rows, TokenId, VocabParallelCrossEntropy, VocabParallelEmbedding,
};
use ferrotron::reference::vocab_parallel as oracle;
use ferrotron::DType;
use half::bf16;

/// Ids: mostly in `[0, vocab)` (with repeats), plus ids in the padding rows,
/// negative ids and ids past the padded vocabulary.
fn ids(rng: &mut Rng, tokens: usize, vocab: usize, padded: usize) -> Vec<i64> {
    let mut v: Vec<i64> = (0..tokens)
        .map(|_| (rng.next_u64() % vocab as u64) as i64)
        .collect();
    let specials = [
        -1,
        -(padded as i64),
        vocab as i64,
        padded as i64 - 1,
        padded as i64,
        padded as i64 + 7,
        0,
        vocab as i64 - 1,
    ];
    for (k, s) in specials.into_iter().enumerate() {
        let slot = (k * 5 + 3) % tokens;
        v[slot] = s;
    }
    // A repeated id, so some gradient rows sum several tokens.
    v[1] = v[2];
    v[tokens - 1] = v[2];
    v
}

fn cast_ids<I: TokenId + TryFrom<i64>>(ids: &[i64]) -> Vec<I> {
    ids.iter()
        .map(|&x| I::try_from(x).ok().expect("id fits"))
        .collect()
}

fn embedding_case<T: FloatElement + ferrotron::comm::CommElement, I: TokenId + TryFrom<i64>>(
    tp: usize,
    vocab: usize,
    hidden: usize,
    tokens: usize,
    few_ids: bool,
    salt: u64,
) {
    let (mut rng, seed) = Rng::new(salt);
    let padded = padded_vocab_size(vocab, tp).unwrap();
    let (full, full64) = rng.tensor::<T>(vocab * hidden, 1.0);
    let mut id64 = ids(&mut rng, tokens, vocab, padded);
    if few_ids {
        // Long runs of duplicates (segments of hundreds of tokens) in a few
        // rows, plus every 7th token off every shard.
        for (t, id) in id64.iter_mut().enumerate() {
            *id = if t % 7 == 3 {
                -5
            } else {
                (*id).rem_euclid(5) * 61
            };
        }
    }
    let (dy, dy64) = rng.tensor::<T>(tokens * hidden, 1.0);
    let prior: Vec<f32> = (0..padded / tp * hidden)
        .map(|_| rng.normal() as f32)
        .collect();
    let what = format!(
        "embedding tp={tp} vocab={vocab} hidden={hidden} tokens={tokens} {} ids {}",
        T::DTYPE,
        std::any::type_name::<I>()
    );

    let emb = VocabParallelEmbedding::new(vocab, hidden);
    let results = run_ranks(tp, |c| {
        let dev = c.device().clone();
        let s = c.stream().clone();
        let shard = shard_vocab_rows(&full, vocab, hidden, tp, c.rank()).unwrap();
        let w = dev.upload(&shard).unwrap();
        let ids_d = dev.upload(&cast_ids::<I>(&id64)).unwrap();
        let mut out = dev.alloc_zeros::<T>(tokens * hidden).unwrap();
        s.fill_bytes(&mut out, 0xFF).unwrap();
        emb.forward(&c, &s, &ids_d, &w, &mut out).unwrap();
        let dy_d = dev.upload(&dy).unwrap();
        let mut dw = dev.alloc_zeros::<f32>(shard.len()).unwrap();
        s.fill_bytes(&mut dw, 0xFF).unwrap();
        emb.backward(&c, &s, &ids_d, &dy_d, &mut dw, false).unwrap();
        let mut dw2 = dev.alloc_zeros::<f32>(shard.len()).unwrap();
        s.fill_bytes(&mut dw2, 0xFF).unwrap();
        emb.backward(&c, &s, &ids_d, &dy_d, &mut dw2, false)
            .unwrap();
        // Sequence parallelism: this rank's rows, reduce-scattered.
        let rows_out = (tokens % tp == 0).then(|| {
            let mut r = dev.alloc_zeros::<T>(tokens / tp * hidden).unwrap();
            s.fill_bytes(&mut r, 0xFF).unwrap();
            emb.forward_scattered(&c, &s, &ids_d, &w, &mut r).unwrap();
            r
        });
        let (start, _) = emb.shard(tp, c.rank()).unwrap();
        let mut acc = dev.upload(&prior).unwrap();
        emb.backward(&c, &s, &ids_d, &dy_d, &mut acc, true).unwrap();
        s.synchronize().unwrap();
        (
            start,
            out.to_host().unwrap(),
            dw.to_host().unwrap(),
            dw2.to_host().unwrap(),
            acc.to_host().unwrap(),
            rows_out.map(|r| r.to_host().unwrap()),
        )
    });

    let want_out = oracle::embedding_forward(&full64, vocab, hidden, &id64);
    let want_dw = oracle::embedding_backward(&dy64, padded, hidden, &id64);
    let rows = padded / tp;
    // The documented order, derived independently: fp32 sums over the
    // tokens in token order, from 0 (overwrite) or from the prior.
    let token_order = |init: &[f32], start: usize| -> Vec<f32> {
        let mut acc = init.to_vec();
        for (t, &id) in id64.iter().enumerate() {
            let r = id - start as i64;
            if r >= 0 && (r as usize) < rows {
                for h in 0..hidden {
                    acc[r as usize * hidden + h] += dy64[t * hidden + h] as f32;
                }
            }
        }
        acc
    };
    for (rank, (start, out, dw, dw2, acc, rows_out)) in results.into_iter().enumerate() {
        assert_eq!(start, rank * rows, "{what}");
        // Exactly one rank contributes each row: the all-reduce is exact.
        let out64 = to_f64(&out);
        assert_eq!(out64, want_out, "{what} rank {rank}: forward (seed {seed})");
        if let Some(r) = rows_out {
            let n = tokens / tp * hidden;
            assert_eq!(
                to_f64(&r),
                want_out[rank * n..(rank + 1) * n],
                "{what} rank {rank}: forward_scattered rows (seed {seed})"
            );
        }
        let want = &want_dw[start * hidden..(start + rows) * hidden];
        let got: Vec<f64> = dw.iter().map(|&x| x as f64).collect();
        assert_close(
            &format!("{what} rank {rank}: dweight"),
            DType::F32,
            seed,
            &got,
            want,
        );
        assert!(
            dw.iter().zip(&dw2).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what} rank {rank}: dweight not bitwise deterministic (seed {seed})"
        );
        let seq = token_order(&vec![0.0; rows * hidden], start);
        assert!(
            dw.iter().zip(&seq).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what} rank {rank}: dweight is not the fp32 sum in token order (seed {seed})"
        );
        let seq_acc = token_order(&prior, start);
        assert!(
            acc.iter().zip(&seq_acc).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what} rank {rank}: accumulated dweight is not prior + the sum in token order (seed {seed})"
        );
        let want_acc: Vec<f64> = want
            .iter()
            .zip(&prior)
            .map(|(w, &p)| w + p as f64)
            .collect();
        let got_acc: Vec<f64> = acc.iter().map(|&x| x as f64).collect();
        assert_close(
            &format!("{what} rank {rank}: accumulated dweight"),
            DType::F32,
            seed,
            &got_acc,
            &want_acc,
        );
    }
}

#[test]
fn embedding_matches_unsharded_on_tp_1_2_4() {
    for (i, tp) in [1usize, 2, 4].into_iter().enumerate() {
        let salt = 100 + i as u64;
        // 300 is not a multiple of 128 * tp: padded to 384 / 512 / 512.
        embedding_case::<f32, i64>(tp, 300, 24, 37, false, salt);
        embedding_case::<bf16, i32>(tp, 300, 24, 37, false, salt + 10);
        // hidden 30: not a multiple of the 16-byte vector (scalar path).
        embedding_case::<bf16, i64>(tp, 300, 30, 37, false, salt + 20);
    }
    // hidden > one block of threads (128-bit path, several column chunks),
    // 270 tokens: 512 sort keys in one tile.
    embedding_case::<f32, i32>(2, 130, 300, 270, false, 120);
    embedding_case::<f32, i64>(1, 130, 30, 270, false, 121);
    // hidden past two column groups of the block: threads take two groups
    // per step while both fit, then one (fp32: 4 columns a group, bf16: 8).
    embedding_case::<f32, i32>(2, 130, 2600, 40, false, 122);
    embedding_case::<bf16, i64>(1, 70, 4104, 40, true, 123);
}

#[test]
fn embedding_backward_sorts_many_tokens_and_long_duplicate_runs() {
    // 5000 tokens: 8192 sort keys = 4 shared-memory tiles plus the global
    // bitonic steps; ids from 5 rows (runs of ~800 tokens each) and off-shard.
    embedding_case::<bf16, i32>(2, 300, 8, 5000, true, 130);
    embedding_case::<f32, i64>(1, 300, 12, 2500, true, 131);
    embedding_case::<f32, i32>(4, 300, 8, 3000, false, 132);
}

fn ce_case<T: FloatElement, I: TokenId + TryFrom<i64>>(
    tp: usize,
    vocab: usize,
    tokens: usize,
    eps: f32,
    ignore: Option<i64>,
    salt: u64,
) {
    let padded = padded_vocab_size(vocab, tp).unwrap();
    ce_case_cols::<T, I>(tp, vocab, padded / tp, tokens, eps, ignore, salt);
}

/// [`ce_case`] with `shard` columns per rank (any width: the full vocabulary
/// is `tp * shard >= vocab`).
fn ce_case_cols<T: FloatElement, I: TokenId + TryFrom<i64>>(
    tp: usize,
    vocab: usize,
    shard: usize,
    tokens: usize,
    eps: f32,
    ignore: Option<i64>,
    salt: u64,
) {
    let (mut rng, seed) = Rng::new(salt);
    let padded = shard * tp;
    assert!(vocab <= padded);
    let (mut logits, mut logits64) = rng.tensor::<T>(tokens * padded, 3.0);
    let mut labels = ids(&mut rng, tokens, vocab, padded);
    if let Some(ii) = ignore {
        // Every fourth row ignored; the first of them has an infinite logit
        // (on the last rank), which would make its loss and gradient NaN if
        // the row were computed and then scaled by 0.
        for t in (1..tokens).step_by(4) {
            labels[t] = ii;
        }
        let inf = padded + padded - 1;
        logits[inf] = T::from_f64(f64::INFINITY);
        logits64[inf] = f64::INFINITY;
    }
    let dloss: Vec<f32> = (0..tokens).map(|_| rng.normal() as f32).collect();
    let dloss64: Vec<f64> = dloss.iter().map(|&x| x as f64).collect();
    let what = format!(
        "cross-entropy tp={tp} V={padded} tokens={tokens} eps={eps} ignore_index={ignore:?} {} labels {}",
        T::DTYPE,
        std::any::type_name::<I>()
    );
    let ce = VocabParallelCrossEntropy::new(tokens, shard)
        .with_label_smoothing(eps)
        .with_ignore_index(ignore);
    let results = run_ranks(tp, |c| {
        let dev = c.device().clone();
        let s = c.stream().clone();
        let r = c.rank();
        let mine: Vec<T> = (0..tokens)
            .flat_map(|t| logits[t * padded + r * shard..t * padded + (r + 1) * shard].to_vec())
            .collect();
        let x = dev.upload(&mine).unwrap();
        let lab = dev.upload(&cast_ids::<I>(&labels)).unwrap();
        let dl = dev.upload(&dloss).unwrap();
        let mut loss = dev.alloc_zeros::<f32>(tokens).unwrap();
        s.fill_bytes(&mut loss, 0xFF).unwrap();
        let saved = ce.forward(&c, &s, &x, &lab, &mut loss).unwrap();
        let mut grad = dev.alloc_zeros::<T>(mine.len()).unwrap();
        s.fill_bytes(&mut grad, 0xFF).unwrap();
        ce.backward(&c, &s, &x, &lab, &saved, &dl, &mut grad)
            .unwrap();
        let mut x2 = dev.upload(&mine).unwrap();
        ce.backward_in_place(&c, &s, &mut x2, &lab, &saved, &dl)
            .unwrap();
        s.synchronize().unwrap();
        (
            loss.to_host().unwrap(),
            grad.to_host().unwrap(),
            x2.to_host().unwrap(),
        )
    });
    let (want_loss, want_grad) =
        oracle::cross_entropy_ignoring(&logits64, padded, &labels, eps as f64, ignore, &dloss64);
    for (rank, (loss, grad, in_place)) in results.into_iter().enumerate() {
        let got: Vec<f64> = loss.iter().map(|&x| x as f64).collect();
        // fp32 math on the (rounded) logits: fp32 tolerance for every dtype.
        assert_close(
            &format!("{what} rank {rank}: loss"),
            DType::F32,
            seed,
            &got,
            &want_loss,
        );
        let want: Vec<f64> = (0..tokens)
            .flat_map(|t| {
                want_grad[t * padded + rank * shard..t * padded + (rank + 1) * shard].to_vec()
            })
            .collect();
        assert_close(
            &format!("{what} rank {rank}: grad"),
            T::DTYPE,
            seed,
            &to_f64(&grad),
            &want,
        );
        assert!(
            grad.iter()
                .zip(&in_place)
                .all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits()),
            "{what} rank {rank}: in-place backward differs (seed {seed})"
        );
        // Ignored rows contribute nothing: exact zeros, as the oracle says.
        for t in (0..tokens).filter(|&t| ignore == Some(labels[t])) {
            assert_eq!(want_loss[t], 0.0);
            assert_eq!(loss[t].to_bits(), 0, "{what} rank {rank}: loss[{t}]");
            assert!(
                grad[t * shard..(t + 1) * shard]
                    .iter()
                    .all(|g| g.to_f64() == 0.0),
                "{what} rank {rank}: grad row {t} of an ignored label"
            );
        }
    }
}

#[test]
fn cross_entropy_matches_unsharded_on_tp_1_2_4() {
    for (i, tp) in [1usize, 2, 4].into_iter().enumerate() {
        let salt = 200 + 10 * i as u64;
        for (k, eps) in [0.0f32, 0.1].into_iter().enumerate() {
            ce_case::<f32, i64>(tp, 300, 19, eps, None, salt + k as u64);
            ce_case::<bf16, i32>(tp, 300, 19, eps, None, salt + 5 + k as u64);
        }
    }
}

#[test]
fn cross_entropy_ignore_index_matches_unsharded_on_tp_1_2_4() {
    for (i, tp) in [1usize, 2, 4].into_iter().enumerate() {
        let salt = 300 + 10 * i as u64;
        for (k, eps) in [0.0f32, 0.1].into_iter().enumerate() {
            let k = k as u64;
            // PyTorch's default, outside the vocabulary (without the option
            // such a label has no target, with it the row is ignored).
            ce_case::<f32, i64>(tp, 300, 19, eps, Some(-100), salt + k);
            ce_case::<bf16, i32>(tp, 300, 19, eps, Some(-100), salt + 2 + k);
            // A real vocabulary id, on the last rank's shard: the rows are
            // ignored on every rank, not only where the target lives.
            ce_case::<f32, i32>(tp, 300, 19, eps, Some(299), salt + 4 + k);
            ce_case::<bf16, i64>(tp, 300, 19, eps, Some(0), salt + 6 + k);
        }
    }
}

#[test]
fn cross_entropy_row_paths_long_and_unaligned_rows() {
    // Rows longer than one step of the block (2 x 256 vectors): 4608 bf16 /
    // 2304 fp32 columns per rank (128-bit path, main loop and tail);
    // 3001 / 1003 columns (not a multiple of the vector: scalar path, main
    // loop and tail). Label smoothing and ignore_index on some.
    ce_case_cols::<bf16, i32>(1, 4600, 4608, 5, 0.0, None, 500);
    ce_case_cols::<bf16, i64>(2, 4600, 4608, 5, 0.1, Some(-100), 501);
    ce_case_cols::<f32, i64>(2, 4600, 2304, 5, 0.0, Some(7), 502);
    ce_case_cols::<bf16, i32>(1, 3001, 3001, 5, 0.1, None, 503);
    ce_case_cols::<f32, i32>(2, 2000, 1003, 5, 0.0, Some(-100), 504);
    ce_case_cols::<bf16, i64>(4, 100, 27, 9, 0.1, None, 505);
}

#[test]
fn cross_entropy_warp_and_block_statistics_at_the_threshold() {
    // The statistics take a warp per row up to 1024 columns (8 rows per
    // block: 13 tokens leave the second block's last three warps without a
    // row), a block per row from 1025: both sides of the switch, vector and
    // scalar rows, label smoothing (the sum of the logits) on some.
    use ferrotron::core::plan::vocab_parallel::CE_STATS_WARP_MAX_COLS as MAX;
    ce_case_cols::<bf16, i32>(1, MAX, MAX, 13, 0.1, None, 510);
    ce_case_cols::<f32, i64>(2, 2 * MAX, MAX, 13, 0.0, Some(-100), 511);
    ce_case_cols::<bf16, i64>(1, MAX + 1, MAX + 1, 13, 0.1, None, 512);
    ce_case_cols::<f32, i32>(2, 2 * MAX + 2, MAX + 1, 13, 0.0, None, 513);
    ce_case_cols::<bf16, i32>(2, 2 * MAX - 3, MAX - 1, 9, 0.1, None, 514);
}

#[test]
fn cross_entropy_is_bitwise_deterministic() {
    let (mut rng, seed) = Rng::new(600);
    let (tokens, shard) = (6usize, 4608usize);
    let (logits, _) = rng.tensor::<bf16>(2 * tokens * shard, 4.0);
    let labels: Vec<i32> = (0..tokens as i32).map(|t| t * 1500).collect();
    let dloss = vec![0.5f32; tokens];
    let run = || {
        let ce = VocabParallelCrossEntropy::new(tokens, shard).with_label_smoothing(0.1);
        run_ranks(2, |c| {
            let dev = c.device().clone();
            let s = c.stream().clone();
            let r = c.rank();
            let mine: Vec<bf16> = (0..tokens)
                .flat_map(|t| logits[(2 * t + r) * shard..(2 * t + r + 1) * shard].to_vec())
                .collect();
            let x = dev.upload(&mine).unwrap();
            let lab = dev.upload(&labels).unwrap();
            let dl = dev.upload(&dloss).unwrap();
            let mut loss = dev.alloc_zeros::<f32>(tokens).unwrap();
            let saved = ce.forward(&c, &s, &x, &lab, &mut loss).unwrap();
            let mut grad = dev.alloc_zeros::<bf16>(mine.len()).unwrap();
            ce.backward(&c, &s, &x, &lab, &saved, &dl, &mut grad)
                .unwrap();
            s.synchronize().unwrap();
            let bits: Vec<u32> = loss
                .to_host()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            let g: Vec<u16> = grad
                .to_host()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            (bits, g)
        })
    };
    assert_eq!(
        run(),
        run(),
        "cross-entropy differs between two runs (seed {seed})"
    );
}

#[test]
fn cross_entropy_ignore_index_bad_use_is_an_error() {
    run_ranks(2, |c| {
        let dev = c.device().clone();
        let s = c.stream().clone();
        let ce = VocabParallelCrossEntropy::new(3, 4);
        let x = dev.alloc_zeros::<f32>(12).unwrap();
        let ids32 = dev.upload(&[1i32, 2, 3]).unwrap();
        let mut loss = dev.alloc_zeros::<f32>(3).unwrap();
        // An ignore index that i32 labels can never equal.
        let e = ce
            .with_ignore_index(Some(1 << 40))
            .forward(&c, &s, &x, &ids32, &mut loss)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`ignore_index`"), "{e}");
        let ids64 = dev.upload(&[1i64, 2, 3]).unwrap();
        ce.with_ignore_index(Some(1 << 40))
            .forward(&c, &s, &x, &ids64, &mut loss)
            .unwrap();
        // The backward must use the forward's ignore index.
        let saved = ce
            .with_ignore_index(Some(-100))
            .forward(&c, &s, &x, &ids32, &mut loss)
            .unwrap();
        let mut g = dev.alloc_zeros::<f32>(12).unwrap();
        for other in [None, Some(-1)] {
            let e = ce
                .with_ignore_index(other)
                .backward(&c, &s, &x, &ids32, &saved, &loss, &mut g)
                .unwrap_err()
                .to_string();
            assert!(e.contains("`saved`"), "{e}");
        }
        ce.with_ignore_index(Some(-100))
            .backward(&c, &s, &x, &ids32, &saved, &loss, &mut g)
            .unwrap();
        s.synchronize().unwrap();
    });
}

#[test]
fn bad_arguments_are_errors_naming_the_argument() {
    run_ranks(2, |c| {
        let dev = c.device().clone();
        let s = c.stream().clone();
        let emb = VocabParallelEmbedding::new(300, 4);
        let ids = dev.upload(&[1i32, 2, 3]).unwrap();
        let w = dev.alloc_zeros::<f32>(256 * 4).unwrap();
        let bad_w = dev.alloc_zeros::<f32>(300 * 4).unwrap();
        let mut out = dev.alloc_zeros::<f32>(12).unwrap();
        let mut bad_out = dev.alloc_zeros::<f32>(11).unwrap();
        let e = emb
            .forward(&c, &s, &ids, &bad_w, &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`weight_shard`") && e.contains("1024"), "{e}");
        let e = emb
            .forward(&c, &s, &ids, &w, &mut bad_out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`out`"), "{e}");
        // Sequence parallelism: 3 tokens do not split over 2 ranks; 4 do,
        // into 2 rows a rank.
        let e = emb
            .forward_scattered(&c, &s, &ids, &w, &mut out)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`ids`") && e.contains("multiple of tp = 2"),
            "{e}"
        );
        let ids4 = dev.upload(&[1i32, 2, 3, 4]).unwrap();
        let e = emb
            .forward_scattered(&c, &s, &ids4, &w, &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`out_rows`") && e.contains("8"), "{e}");
        let mut dw = dev.alloc_zeros::<f32>(255 * 4).unwrap();
        let e = emb
            .backward(&c, &s, &ids, &out, &mut dw, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`dweight`"), "{e}");

        let ce = VocabParallelCrossEntropy::new(3, 4);
        let x = dev.alloc_zeros::<f32>(12).unwrap();
        let mut loss = dev.alloc_zeros::<f32>(3).unwrap();
        let e = ce
            .with_label_smoothing(1.0)
            .forward(&c, &s, &x, &ids, &mut loss)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`label_smoothing`"), "{e}");
        let e = ce
            .forward(&c, &s, &bad_out, &ids, &mut loss)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`logits`"), "{e}");
        let e = VocabParallelCrossEntropy::new(3, 0)
            .forward(&c, &s, &x, &ids, &mut loss)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`shard_vocab`"), "{e}");
        // Statistics of a forward without smoothing do not fit a smoothed backward.
        let saved = ce.forward(&c, &s, &x, &ids, &mut loss).unwrap();
        let mut g = dev.alloc_zeros::<f32>(12).unwrap();
        let e = ce
            .with_label_smoothing(0.1)
            .backward(&c, &s, &x, &ids, &saved, &loss, &mut g)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`saved`"), "{e}");
        s.synchronize().unwrap();
    });
}
