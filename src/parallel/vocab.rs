//! Megatron-Core's `VocabParallelEmbedding` and vocab-parallel cross-entropy:
//! sharding, validation and communication (the local kernels:
//! [`crate::ops::vocab_parallel`]; oracle: [`crate::reference::vocab_parallel`]).
//!
//! The vocabulary is padded to a multiple of `128 * tp`
//! ([`padded_vocab_size`]); rank `r` of the tensor-parallel communicator owns
//! vocab rows `[r * V / tp, (r + 1) * V / tp)` of the padded vocabulary `V`.
//!
//! * Embedding forward: local lookup (ids outside this rank's rows give zero
//!   rows), then all-reduce SUM. Backward: the dense fp32 weight-gradient
//!   shard `[V / tp, hidden]` from the (replicated) output gradient; no
//!   communication, deterministic (no float atomics): the (row, token) keys
//!   sorted on the device, then a segment sum per row in token order.
//! * Cross-entropy over logits sharded along the vocab dim (`[tokens, V / tp]`
//!   per rank), fp32 math, one pass over the logits: local row max, sum of
//!   exp relative to it, target logit (0 off-shard) and, with label
//!   smoothing, sum of logits; all-reduce MAX of the max, the sums of exp
//!   re-based on it (`* exp(local max - max)`), all-reduce SUM;
//!   `loss = max + log(sum exp) - target`. Backward (local):
//!   `grad = dloss * (softmax - onehot)`.
//!
//! Label smoothing `eps` follows the formula
//! `loss = (1 - eps) * nll + eps * mean over the V vocab entries of -log p`,
//! gradient `dloss * (softmax - (1 - eps) * onehot - eps / V)`. (Megatron's
//! code feeds this formula `eps * K / (K - 1)` in place of `eps`; pass that
//! value to reproduce it.) Labels outside `[0, V)` have no target on any rank:
//! their loss is `log(sum exp)` and their gradient the softmax (Megatron's
//! behaviour: the target logit counts as 0).
//!
//! Optionally ([`VocabParallelCrossEntropy::with_ignore_index`], PyTorch's
//! `ignore_index`, whose default there is -100): a row whose label equals the
//! ignore index has loss exactly 0 and a zero gradient row, label smoothing
//! included (the row contributes nothing). The loss is per token; a mean over
//! the batch divides by the number of rows not ignored, as PyTorch's
//! `reduction='mean'` does.

use crate::backend::{DeviceBuffer, DeviceRead, DeviceWrite, Stream};
use crate::comm::{CommElement, Communicator, ReduceOp};
use crate::core::dtype::FloatElement;
use crate::core::plan::vocab_parallel::{sort_len, MAX_GRID_X};
use crate::core::{validate, Element, Error, Result};
pub use crate::ops::vocab_parallel::TokenId;
use crate::ops::vocab_parallel::{self as local, CeShape, Shard};

/// Rows of the vocabulary are padded to a multiple of this times `tp`.
pub const VOCAB_PAD_MULTIPLE: usize = 128;

/// The vocabulary size padded up to a multiple of `128 * tp` (Megatron's
/// `make_vocab_size_divisible_by = 128`). `None` if `tp == 0` or on overflow.
pub fn padded_vocab_size(vocab: usize, tp: usize) -> Option<usize> {
    let m = VOCAB_PAD_MULTIPLE.checked_mul(tp)?;
    if m == 0 {
        return None;
    }
    vocab.div_ceil(m).checked_mul(m)
}

/// Rows `[start, start + rows)` of the padded vocabulary owned by `rank` of `tp`.
pub fn vocab_range(vocab: usize, tp: usize, rank: usize) -> Option<(usize, usize)> {
    let rows = padded_vocab_size(vocab, tp)? / tp;
    (rank < tp).then(|| (rank * rows, rows))
}

/// Rank `rank`'s shard `[V / tp, hidden]` of a full embedding table
/// `full = [vocab, hidden]` (row-major): the rows it owns, padding rows
/// (ids `>= vocab`) zero. Deterministic, so tests compare with the unsharded
/// table.
pub fn shard_vocab_rows<T: Element>(
    full: &[T],
    vocab: usize,
    hidden: usize,
    tp: usize,
    rank: usize,
) -> Result<Vec<T>> {
    const OP: &str = "shard_vocab_rows";
    let n = validate::elements(OP, vocab, hidden)?;
    if full.len() != n {
        return Err(Error::invalid(
            OP,
            "full",
            format!("exactly vocab * hidden = {vocab}x{hidden} = {n} elements"),
            full.len(),
        ));
    }
    let (start, rows) = vocab_range(vocab, tp, rank).ok_or_else(|| {
        Error::invalid(
            OP,
            "rank",
            format!("a rank in 0..tp with tp >= 1 (tp = {tp})"),
            rank,
        )
    })?;
    let zero: T = bytemuck::Zeroable::zeroed();
    let mut out = vec![zero; validate::elements(OP, rows, hidden)?];
    let end = (start + rows).min(vocab);
    if end > start {
        out[..(end - start) * hidden].copy_from_slice(&full[start * hidden..end * hidden]);
    }
    Ok(out)
}

fn check_len<T: Element>(
    op: &'static str,
    arg: &'static str,
    stream: &Stream,
    buf: &dyn DeviceRead<T>,
    len: usize,
    what: &str,
) -> Result<()> {
    stream.device().check_same(op, arg, buf.device())?;
    if buf.len() != len {
        return Err(Error::invalid(
            op,
            arg,
            format!("exactly {len} elements ({what})"),
            format!("a buffer of {} elements", buf.len()),
        ));
    }
    Ok(())
}

fn fits_i64(op: &'static str, arg: &'static str, v: usize) -> Result<()> {
    if v > i64::MAX as usize {
        return Err(Error::invalid(op, arg, "at most i64::MAX", v));
    }
    Ok(())
}

/// `VocabParallelEmbedding`: a `[vocab, hidden]` table whose padded rows are
/// split over the ranks of a tensor-parallel communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VocabParallelEmbedding {
    /// Unpadded vocabulary size.
    pub vocab: usize,
    pub hidden: usize,
}

/// A checked local lookup of this rank's vocabulary rows (zeros for ids
/// of other ranks) into `elements` = `tokens · hidden` values.
struct LocalLookup {
    shard: Shard,
    hidden: usize,
    elements: usize,
}

impl LocalLookup {
    fn run<T: FloatElement, I: TokenId>(
        &self,
        stream: &Stream,
        ids: &dyn DeviceRead<I>,
        weight_shard: &dyn DeviceRead<T>,
        out: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        if self.elements == 0 {
            return Ok(());
        }
        local::embedding_lookup(stream, ids, weight_shard, out, self.hidden, self.shard)
    }
}

const EMB_FWD: &str = "vocab_parallel_embedding_forward";
const EMB_FWD_SCATTERED: &str = "vocab_parallel_embedding_forward_scattered";
const EMB_BWD: &str = "vocab_parallel_embedding_backward";

impl VocabParallelEmbedding {
    pub fn new(vocab: usize, hidden: usize) -> Self {
        VocabParallelEmbedding { vocab, hidden }
    }

    /// `(vocab_start, shard_rows)` of `rank` of `tp`.
    pub fn shard(&self, tp: usize, rank: usize) -> Option<(usize, usize)> {
        vocab_range(self.vocab, tp, rank)
    }

    fn layout(&self, op: &'static str, comm: &Communicator) -> Result<(usize, usize)> {
        // An empty table is a caller error, not an embedding (Megatron
        // cannot build one either): never a silent no-op.
        if self.vocab == 0 {
            return Err(Error::invalid(op, "vocab", "a vocabulary size >= 1", 0));
        }
        if self.hidden == 0 {
            return Err(Error::invalid(op, "hidden", "a hidden size >= 1", 0));
        }
        let (start, rows) = self.shard(comm.size(), comm.rank()).ok_or_else(|| {
            Error::invalid(
                op,
                "vocab",
                format!(
                    "a size whose padding to 128 * {} fits in usize",
                    comm.size()
                ),
                self.vocab,
            )
        })?;
        validate::elements(op, rows, self.hidden)?;
        fits_i64(op, "vocab", start + rows)?;
        if rows > MAX_GRID_X {
            return Err(Error::invalid(
                op,
                "vocab",
                format!("at most {MAX_GRID_X} rows per rank"),
                rows,
            ));
        }
        Ok((start, rows))
    }

    /// `out[t, :] = weight[ids[t], :]` (zero for ids outside the padded
    /// vocabulary `[0, V)`; ids in `[vocab, V)` read their padding rows, as in
    /// Megatron), as the all-reduce over `comm` of each rank's local lookup. `weight_shard` is
    /// this rank's `[V / tp, hidden]` ([`shard_vocab_rows`]); `ids` and `out`
    /// (`[tokens, hidden]`) are the same on every rank. Every rank of `comm`
    /// must call it; returns when enqueued on `stream`.
    pub fn forward<T: FloatElement + CommElement, I: TokenId>(
        &self,
        comm: &Communicator,
        stream: &Stream,
        ids: &dyn DeviceRead<I>,
        weight_shard: &dyn DeviceRead<T>,
        out: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        let lookup = self.checked_lookup(EMB_FWD, comm, stream, ids, weight_shard)?;
        check_len(
            EMB_FWD,
            "out",
            stream,
            out,
            lookup.elements,
            "[tokens = ids.len(), hidden]",
        )?;
        lookup.run(stream, ids, weight_shard, out)?;
        if comm.size() > 1 {
            comm.all_reduce_in_place(stream, out, ReduceOp::Sum)?;
        }
        Ok(())
    }

    /// [`VocabParallelEmbedding::forward`] for sequence parallelism: this
    /// rank's `tokens / tp` rows of the lookup (rows `rank · tokens / tp`
    /// onwards), reduce-scattered instead of all-reduced (the same values,
    /// half the traffic). `ids` are the whole micro-batch's (the same on every
    /// rank, `tokens` a multiple of `tp`); `out_rows` is `[tokens / tp,
    /// hidden]`. The backward takes the whole `dy`: all-gather the rows'
    /// gradients first.
    pub fn forward_scattered<T: FloatElement + CommElement, I: TokenId>(
        &self,
        comm: &Communicator,
        stream: &Stream,
        ids: &dyn DeviceRead<I>,
        weight_shard: &dyn DeviceRead<T>,
        out_rows: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        let (tokens, tp) = (ids.len(), comm.size());
        if tokens % tp != 0 {
            return Err(Error::invalid(
                EMB_FWD_SCATTERED,
                "ids",
                format!("a multiple of tp = {tp} tokens"),
                tokens,
            ));
        }
        let lookup = self.checked_lookup(EMB_FWD_SCATTERED, comm, stream, ids, weight_shard)?;
        check_len(
            EMB_FWD_SCATTERED,
            "out_rows",
            stream,
            out_rows,
            lookup.elements / tp,
            "[tokens / tp, hidden]",
        )?;
        if tp == 1 {
            return lookup.run(stream, ids, weight_shard, out_rows);
        }
        // Every check done: the whole lookup's scratch (freed in stream order).
        let mut full = stream.device().alloc_zeros::<T>(lookup.elements)?;
        lookup.run(stream, ids, weight_shard, &mut full)?;
        comm.reduce_scatter(stream, &full, out_rows, ReduceOp::Sum)?;
        Ok(())
    }

    /// The checks a forward's local lookup needs (the communicator's layout,
    /// `ids` on the stream's device, `tokens · hidden` in range, the shard's
    /// length), and what it then runs.
    fn checked_lookup<T: FloatElement, I: TokenId>(
        &self,
        op: &'static str,
        comm: &Communicator,
        stream: &Stream,
        ids: &dyn DeviceRead<I>,
        weight_shard: &dyn DeviceRead<T>,
    ) -> Result<LocalLookup> {
        let (start, rows) = self.layout(op, comm)?;
        stream.device().check_same(op, "ids", ids.device())?;
        let elements = validate::elements(op, ids.len(), self.hidden)?;
        fits_i64(op, "tokens * hidden", elements)?;
        check_len(
            op,
            "weight_shard",
            stream,
            weight_shard,
            rows * self.hidden,
            "[padded vocab / tp, hidden]",
        )?;
        Ok(LocalLookup {
            shard: Shard {
                vocab_start: start,
                rows,
            },
            hidden: self.hidden,
            elements,
        })
    }

    /// This rank's weight gradient: `dweight[v, :] (+)= sum over tokens t with
    /// ids[t] == vocab_start + v of dy[t, :]`, fp32 (`[V / tp, hidden]`),
    /// summed in token order (bitwise deterministic). `dy` is the gradient of
    /// the forward's output (the same on every rank). `accumulate = true`
    /// adds to `dweight` (a main_grad), `false` overwrites it. No
    /// communication.
    pub fn backward<T: FloatElement, I: TokenId>(
        &self,
        comm: &Communicator,
        stream: &Stream,
        ids: &dyn DeviceRead<I>,
        dy: &dyn DeviceRead<T>,
        dweight: &mut dyn DeviceWrite<f32>,
        accumulate: bool,
    ) -> Result<()> {
        let (start, rows) = self.layout(EMB_BWD, comm)?;
        let tokens = ids.len();
        stream.device().check_same(EMB_BWD, "ids", ids.device())?;
        let n = validate::elements(EMB_BWD, tokens, self.hidden)?;
        fits_i64(EMB_BWD, "tokens * hidden", n)?;
        check_len(EMB_BWD, "dy", stream, dy, n, "[tokens = ids.len(), hidden]")?;
        check_len(
            EMB_BWD,
            "dweight",
            stream,
            dweight,
            rows * self.hidden,
            "[padded vocab / tp, hidden]",
        )?;
        if rows == 0 || self.hidden == 0 {
            return Ok(());
        }
        if tokens > u32::MAX as usize {
            return Err(Error::invalid(
                EMB_BWD,
                "ids",
                "fewer than 2^32 tokens",
                tokens,
            ));
        }
        let shard = Shard {
            vocab_start: start,
            rows,
        };
        let keys_len = sort_len(tokens).ok_or_else(|| {
            Error::invalid(EMB_BWD, "ids", "a token count that fits in usize", tokens)
        })?;
        // Scratch for the sorted (row, token) keys; released in stream order.
        let mut keys = stream.device().alloc_zeros::<i64>(keys_len)?;
        local::embedding_grad(
            stream,
            ids,
            dy,
            dweight,
            &mut keys,
            self.hidden,
            shard,
            accumulate,
        )
    }
}

/// Vocab-parallel cross-entropy over `[tokens, shard_vocab]` logits per rank
/// (the full padded vocabulary is `V = tp * shard_vocab`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VocabParallelCrossEntropy {
    pub tokens: usize,
    /// Vocab columns on each rank (`V / tp`).
    pub shard_vocab: usize,
    /// `eps` in `[0, 1)`; 0 disables label smoothing.
    pub label_smoothing: f32,
    /// PyTorch's `ignore_index`: rows whose label equals it get loss 0 and a
    /// zero gradient. `None` (the default): every label counts (one outside
    /// `[0, V)` as Megatron's, see the module docs).
    pub ignore_index: Option<i64>,
}

/// What the forward keeps for the backward: the per-token fp32 statistics
/// reduced over the ranks (row max; sum of exp, target logit[, sum of logits]).
#[derive(Debug)]
pub struct CrossEntropySaved {
    row_max: DeviceBuffer<f32>,
    sums: DeviceBuffer<f32>,
    tokens: usize,
    ignore_index: Option<i64>,
}

impl CrossEntropySaved {
    /// Per-token maximum logit over the whole vocabulary `[tokens]`.
    pub fn row_max(&self) -> &DeviceBuffer<f32> {
        &self.row_max
    }

    /// `[k, tokens]`: row 0 sum of `exp(x - max)`, row 1 target logit, row 2
    /// (with label smoothing) sum of the logits.
    pub fn sums(&self) -> &DeviceBuffer<f32> {
        &self.sums
    }
}

const CE_FWD: &str = "vocab_parallel_cross_entropy_forward";
const CE_BWD: &str = "vocab_parallel_cross_entropy_backward";

impl VocabParallelCrossEntropy {
    pub fn new(tokens: usize, shard_vocab: usize) -> Self {
        VocabParallelCrossEntropy {
            tokens,
            shard_vocab,
            label_smoothing: 0.0,
            ignore_index: None,
        }
    }

    /// Rows whose label equals `ignore_index` (e.g. PyTorch's default -100;
    /// any value, also one inside `[0, V)`) get loss 0 and a zero gradient;
    /// `None` disables it. With `i32` labels the value must fit in `i32`
    /// (else it could never match: an error naming `ignore_index`).
    pub fn with_ignore_index(self, ignore_index: Option<i64>) -> Self {
        VocabParallelCrossEntropy {
            ignore_index,
            ..self
        }
    }

    pub fn with_label_smoothing(self, label_smoothing: f32) -> Self {
        VocabParallelCrossEntropy {
            label_smoothing,
            ..self
        }
    }

    /// Validates the shape; returns `(elements, vocab_start, 1 / V)`.
    fn check<I: TokenId>(
        &self,
        op: &'static str,
        comm: &Communicator,
    ) -> Result<(usize, usize, f32)> {
        if let Some(ii) = self.ignore_index {
            if !I::IS_I64 && i32::try_from(ii).is_err() {
                return Err(Error::invalid(
                    op,
                    "ignore_index",
                    "a value that fits the i32 labels",
                    ii,
                ));
            }
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return Err(Error::invalid(
                op,
                "label_smoothing",
                "a value in [0, 1)",
                self.label_smoothing,
            ));
        }
        validate::positive(op, "shard_vocab", self.shard_vocab)?;
        let n = validate::elements(op, self.tokens, self.shard_vocab)?;
        fits_i64(op, "tokens * shard_vocab", n)?;
        let vocab = self.shard_vocab.checked_mul(comm.size()).ok_or_else(|| {
            Error::invalid(
                op,
                "shard_vocab",
                "a full vocabulary that fits in usize",
                self.shard_vocab,
            )
        })?;
        fits_i64(op, "shard_vocab * tp", vocab)?;
        if self.tokens > MAX_GRID_X {
            return Err(Error::invalid(
                op,
                "tokens",
                format!("at most {MAX_GRID_X}"),
                self.tokens,
            ));
        }
        Ok((
            n,
            comm.rank() * self.shard_vocab,
            (1.0 / vocab as f64) as f32,
        ))
    }

    fn smoothing(&self) -> bool {
        self.label_smoothing != 0.0
    }

    fn shape(&self, vocab_start: usize, inv_vocab: f32) -> CeShape {
        CeShape {
            tokens: self.tokens,
            cols: self.shard_vocab,
            vocab_start,
            smoothing: self.label_smoothing,
            inv_vocab,
            ignore_index: self.ignore_index,
        }
    }

    /// Per-token loss `[tokens]` (fp32) of this rank's logits shard and the
    /// (replicated) labels. Every rank of `comm` must call it; two
    /// all-reduces (MAX, then one SUM over the packed sums). Returns the
    /// statistics the backward needs; enqueued on `stream`.
    pub fn forward<T: FloatElement, I: TokenId>(
        &self,
        comm: &Communicator,
        stream: &Stream,
        logits: &dyn DeviceRead<T>,
        labels: &dyn DeviceRead<I>,
        loss: &mut dyn DeviceWrite<f32>,
    ) -> Result<CrossEntropySaved> {
        let (n, start, inv_vocab) = self.check::<I>(CE_FWD, comm)?;
        check_len(CE_FWD, "logits", stream, logits, n, "[tokens, shard_vocab]")?;
        check_len(CE_FWD, "labels", stream, labels, self.tokens, "[tokens]")?;
        check_len(CE_FWD, "loss", stream, loss, self.tokens, "[tokens]")?;
        let dev = stream.device();
        let rows = if self.smoothing() { 3 } else { 2 };
        let mut row_max = dev.alloc_zeros::<f32>(self.tokens)?;
        let mut sums = dev.alloc_zeros::<f32>(rows * self.tokens)?;
        if self.tokens == 0 {
            return Ok(CrossEntropySaved {
                row_max,
                sums,
                tokens: 0,
                ignore_index: self.ignore_index,
            });
        }
        let shape = self.shape(start, inv_vocab);
        if comm.size() > 1 {
            // One pass per rank on its own max, then the sums of exp re-based
            // on the reduced max before they are added up.
            let mut local_max = dev.alloc_zeros::<f32>(self.tokens)?;
            local::ce_stats(
                stream,
                logits,
                labels,
                &mut row_max,
                Some(&mut local_max),
                &mut sums,
                &shape,
            )?;
            comm.all_reduce_in_place(stream, &mut row_max, ReduceOp::Max)?;
            local::ce_rescale(stream, &mut sums, &row_max, &local_max, self.tokens)?;
            comm.all_reduce_in_place(stream, &mut sums, ReduceOp::Sum)?;
        } else {
            local::ce_stats(
                stream,
                logits,
                labels,
                &mut row_max,
                None,
                &mut sums,
                &shape,
            )?;
        }
        local::ce_loss(stream, labels, &row_max, &sums, loss, &shape)?;
        Ok(CrossEntropySaved {
            row_max,
            sums,
            tokens: self.tokens,
            ignore_index: self.ignore_index,
        })
    }

    /// This rank's logits gradient `[tokens, shard_vocab]`:
    /// `dloss[t] * (softmax - (1 - eps) * onehot - eps / V)`, a zero row for
    /// an ignored label. `logits`,
    /// `labels` and `saved` are those of the forward; `dloss` is `[tokens]`
    /// fp32. No communication.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: FloatElement, I: TokenId>(
        &self,
        comm: &Communicator,
        stream: &Stream,
        logits: &dyn DeviceRead<T>,
        labels: &dyn DeviceRead<I>,
        saved: &CrossEntropySaved,
        dloss: &dyn DeviceRead<f32>,
        grad: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        let (n, ..) = self.check::<I>(CE_BWD, comm)?;
        check_len(CE_BWD, "grad", stream, grad, n, "[tokens, shard_vocab]")?;
        self.backward_unchecked(comm, stream, logits, labels, saved, dloss, grad.addr())
    }

    /// As [`Self::backward`], overwriting `logits` with the gradient.
    pub fn backward_in_place<T: FloatElement, I: TokenId>(
        &self,
        comm: &Communicator,
        stream: &Stream,
        logits: &mut dyn DeviceWrite<T>,
        labels: &dyn DeviceRead<I>,
        saved: &CrossEntropySaved,
        dloss: &dyn DeviceRead<f32>,
    ) -> Result<()> {
        let addr = logits.addr();
        self.backward_unchecked(comm, stream, logits, labels, saved, dloss, addr)
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_unchecked<T: FloatElement, I: TokenId>(
        &self,
        comm: &Communicator,
        stream: &Stream,
        logits: &dyn DeviceRead<T>,
        labels: &dyn DeviceRead<I>,
        saved: &CrossEntropySaved,
        dloss: &dyn DeviceRead<f32>,
        grad: u64,
    ) -> Result<()> {
        let (n, start, inv_vocab) = self.check::<I>(CE_BWD, comm)?;
        check_len(CE_BWD, "logits", stream, logits, n, "[tokens, shard_vocab]")?;
        check_len(CE_BWD, "labels", stream, labels, self.tokens, "[tokens]")?;
        check_len(CE_BWD, "dloss", stream, dloss, self.tokens, "[tokens]")?;
        let rows = if self.smoothing() { 3 } else { 2 };
        if saved.tokens != self.tokens
            || saved.sums.len() != rows * self.tokens
            || saved.ignore_index != self.ignore_index
        {
            return Err(Error::invalid(
                CE_BWD,
                "saved",
                format!(
                    "the forward's statistics for {} tokens (label smoothing {}, ignore_index {:?})",
                    self.tokens, self.label_smoothing, self.ignore_index
                ),
                format!(
                    "statistics for {} tokens (ignore_index {:?})",
                    saved.tokens, saved.ignore_index
                ),
            ));
        }
        stream
            .device()
            .check_same(CE_BWD, "saved", saved.row_max.device())?;
        if n == 0 {
            return Ok(());
        }
        let shape = self.shape(start, inv_vocab);
        local::ce_grad(
            stream,
            grad,
            logits,
            labels,
            &saved.row_max,
            &saved.sums,
            dloss,
            &shape,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_and_ranges() {
        assert_eq!(padded_vocab_size(50257, 1), Some(50304));
        assert_eq!(padded_vocab_size(50257, 4), Some(50688));
        assert_eq!(padded_vocab_size(256, 2), Some(256));
        assert_eq!(padded_vocab_size(0, 2), Some(0));
        assert_eq!(padded_vocab_size(10, 0), None);
        assert_eq!(padded_vocab_size(usize::MAX, 2), None);
        assert_eq!(vocab_range(300, 2, 1), Some((256, 256)));
        assert_eq!(vocab_range(300, 2, 2), None);
    }

    #[test]
    fn sharding_pads_with_zero_rows() {
        let full: Vec<f32> = (0..300 * 2).map(|i| i as f32 + 1.0).collect();
        let s1 = shard_vocab_rows(&full, 300, 2, 2, 1).unwrap();
        assert_eq!(s1.len(), 256 * 2);
        assert_eq!(&s1[..88], &full[512..600]);
        assert!(s1[88..].iter().all(|&x| x == 0.0));
        let s0 = shard_vocab_rows(&full, 300, 2, 2, 0).unwrap();
        assert_eq!(&s0[..], &full[..512]);
        assert!(shard_vocab_rows(&full, 300, 2, 2, 2).is_err());
        assert!(shard_vocab_rows(&full[1..], 300, 2, 2, 0).is_err());
    }
}
