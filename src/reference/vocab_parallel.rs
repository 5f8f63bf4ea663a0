//! Oracle for the vocab-parallel embedding and cross-entropy (docs/semantics.md,
//! "Vocab-parallel"), on the unsharded tensors, in f64.

/// `out[t, :] = weight[ids[t], :]` for `0 <= ids[t] < vocab`, else zeros.
/// `weight` is `[vocab, hidden]` (the padded table, or the unpadded one:
/// padding rows are zero).
pub fn embedding_forward(weight: &[f64], vocab: usize, hidden: usize, ids: &[i64]) -> Vec<f64> {
    assert_eq!(weight.len(), vocab * hidden);
    let mut out = vec![0.0; ids.len() * hidden];
    for (t, &id) in ids.iter().enumerate() {
        if (0..vocab as i64).contains(&id) {
            let id = id as usize;
            out[t * hidden..(t + 1) * hidden]
                .copy_from_slice(&weight[id * hidden..(id + 1) * hidden]);
        }
    }
    out
}

/// `dweight[v, :] = sum over t with ids[t] == v of dy[t, :]`, `[vocab, hidden]`.
pub fn embedding_backward(dy: &[f64], vocab: usize, hidden: usize, ids: &[i64]) -> Vec<f64> {
    assert_eq!(dy.len(), ids.len() * hidden);
    let mut dw = vec![0.0; vocab * hidden];
    for (t, &id) in ids.iter().enumerate() {
        if (0..vocab as i64).contains(&id) {
            let id = id as usize;
            for h in 0..hidden {
                dw[id * hidden + h] += dy[t * hidden + h];
            }
        }
    }
    dw
}

/// Per-token cross-entropy of `logits = [tokens, vocab]` with label smoothing
/// `eps`: `(1 - eps) * (-log p[label]) + eps * mean_j(-log p[j])`; a label
/// outside `[0, vocab)` has no target (its nll term is `log sum exp`).
/// Returns `(loss [tokens], grad [tokens, vocab])` with
/// `grad = dloss * (p - (1 - eps) * onehot - eps / vocab)`.
pub fn cross_entropy(
    logits: &[f64],
    vocab: usize,
    labels: &[i64],
    eps: f64,
    dloss: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    cross_entropy_ignoring(logits, vocab, labels, eps, None, dloss)
}

/// [`cross_entropy`] with PyTorch's `ignore_index`: a token whose label
/// equals `ignore_index` has loss 0 and a zero gradient row (label smoothing
/// included); `None` ignores nothing.
pub fn cross_entropy_ignoring(
    logits: &[f64],
    vocab: usize,
    labels: &[i64],
    eps: f64,
    ignore_index: Option<i64>,
    dloss: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let tokens = labels.len();
    assert_eq!(logits.len(), tokens * vocab);
    assert_eq!(dloss.len(), tokens);
    let mut loss = vec![0.0; tokens];
    let mut grad = vec![0.0; tokens * vocab];
    for t in 0..tokens {
        if ignore_index == Some(labels[t]) {
            continue; // loss 0, gradient row 0
        }
        let x = &logits[t * vocab..(t + 1) * vocab];
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let se: f64 = x.iter().map(|&v| (v - m).exp()).sum();
        let lse = m + se.ln();
        let label = labels[t];
        let target = if (0..vocab as i64).contains(&label) {
            x[label as usize]
        } else {
            0.0
        };
        let mean = x.iter().sum::<f64>() / vocab as f64;
        loss[t] = (1.0 - eps) * (lse - target) + eps * (lse - mean);
        for (j, &v) in x.iter().enumerate() {
            let mut g = (v - lse).exp() - eps / vocab as f64;
            if j as i64 == label {
                g -= 1.0 - eps;
            }
            grad[t * vocab + j] = g * dloss[t];
        }
    }
    (loss, grad)
}
