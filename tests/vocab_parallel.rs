//! Vocab-parallel embedding and cross-entropy on TP = 1, 2, 4 ranks (the
//! in-process communicator on the emulator) against the unsharded float64
//! oracle: a vocabulary not divisible by 128 * tp (padding), out-of-range ids
//! and labels, label smoothing on and off, fp32 and bf16 storage, i32 and
//! i64 ids.

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
    salt: u64,
) {
    let (mut rng, seed) = Rng::new(salt);
    let padded = padded_vocab_size(vocab, tp).unwrap();
    let (full, full64) = rng.tensor::<T>(vocab * hidden, 1.0);
    let id64 = ids(&mut rng, tokens, vocab, padded);
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
        )
    });

    let want_out = oracle::embedding_forward(&full64, vocab, hidden, &id64);
    let want_dw = oracle::embedding_backward(&dy64, padded, hidden, &id64);
    let rows = padded / tp;
    for (rank, (start, out, dw, dw2, acc)) in results.into_iter().enumerate() {
        assert_eq!(start, rank * rows, "{what}");
        // Exactly one rank contributes each row: the all-reduce is exact.
        let out64 = to_f64(&out);
        assert_eq!(out64, want_out, "{what} rank {rank}: forward (seed {seed})");
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
        embedding_case::<f32, i64>(tp, 300, 24, 37, salt);
        embedding_case::<bf16, i32>(tp, 300, 24, 37, salt + 10);
    }
    // hidden > one block of threads, tokens > one chunk of ids.
    embedding_case::<f32, i32>(2, 130, 300, 270, 120);
}

fn ce_case<T: FloatElement, I: TokenId + TryFrom<i64>>(
    tp: usize,
    vocab: usize,
    tokens: usize,
    eps: f32,
    salt: u64,
) {
    let (mut rng, seed) = Rng::new(salt);
    let padded = padded_vocab_size(vocab, tp).unwrap();
    let shard = padded / tp;
    let (logits, logits64) = rng.tensor::<T>(tokens * padded, 3.0);
    let labels = ids(&mut rng, tokens, vocab, padded);
    let dloss: Vec<f32> = (0..tokens).map(|_| rng.normal() as f32).collect();
    let dloss64: Vec<f64> = dloss.iter().map(|&x| x as f64).collect();
    let what = format!(
        "cross-entropy tp={tp} V={padded} tokens={tokens} eps={eps} {} labels {}",
        T::DTYPE,
        std::any::type_name::<I>()
    );
    let ce = VocabParallelCrossEntropy::new(tokens, shard).with_label_smoothing(eps);
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
        oracle::cross_entropy(&logits64, padded, &labels, eps as f64, &dloss64);
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
    }
}

#[test]
fn cross_entropy_matches_unsharded_on_tp_1_2_4() {
    for (i, tp) in [1usize, 2, 4].into_iter().enumerate() {
        let salt = 200 + 10 * i as u64;
        for (k, eps) in [0.0f32, 0.1].into_iter().enumerate() {
            ce_case::<f32, i64>(tp, 300, 19, eps, salt + k as u64);
            ce_case::<bf16, i32>(tp, 300, 19, eps, salt + 5 + k as u64);
        }
    }
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
