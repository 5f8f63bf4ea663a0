//! The local (per-rank, communication-free) kernels of the vocab-parallel
//! embedding and cross-entropy (`cuda/vocab_parallel.cu`, plan:
//! [`crate::core::plan::vocab_parallel`], oracle:
//! [`crate::reference::vocab_parallel`]). [`crate::parallel::vocab`] shards,
//! validates and communicates; each function here enqueues one kernel over
//! shapes its caller has checked (lengths, `i64` ranges, grid limits).

use crate::backend::{DeviceRead, DeviceWrite, Stream};
use crate::comm::CommElement;
use crate::core::dtype::FloatElement;
use crate::core::plan::vocab_parallel::{
    ce_stats as ce_stats_plan, grid_stride, per_row, sort_steps, CeStatsKernel, SortStep,
};
use crate::core::{Element, Result};
use crate::kernel_params::{
    FtnVocabCeBwdParams, FtnVocabCeLossParams, FtnVocabCeRescaleParams, FtnVocabCeStatsParams,
    FtnVocabEmbedBwdParams, FtnVocabEmbedFwdParams, FtnVocabEmbedSortKeysParams,
    FtnVocabEmbedSortStepParams,
};
use crate::kernels;

/// Token-id and label element types: `i32` or `i64`.
pub trait TokenId: Element + CommElement {
    #[doc(hidden)]
    const IS_I64: bool;
}

impl TokenId for i32 {
    const IS_I64: bool = false;
}

impl TokenId for i64 {
    const IS_I64: bool = true;
}

/// Rows `[vocab_start, vocab_start + shard_rows)` of a vocabulary shard.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shard {
    pub vocab_start: usize,
    pub rows: usize,
}

/// `out[t, :] = weight_shard[ids[t] - vocab_start, :]`, zero rows for ids
/// outside the shard; `out` is `[ids.len(), hidden]`, non-empty.
pub(crate) fn embedding_lookup<T: FloatElement, I: TokenId>(
    stream: &Stream,
    ids: &dyn DeviceRead<I>,
    weight_shard: &dyn DeviceRead<T>,
    out: &mut dyn DeviceWrite<T>,
    hidden: usize,
    shard: Shard,
) -> Result<()> {
    let params = FtnVocabEmbedFwdParams {
        out: out.addr() as *mut _,
        weight: weight_shard.addr() as *const _,
        ids: ids.addr() as *const _,
        tokens: ids.len() as i64,
        hidden: hidden as i64,
        vocab_start: shard.vocab_start as i64,
        shard_rows: shard.rows as i64,
        ids_i64: I::IS_I64 as u32,
        pad_: 0,
    };
    let k = kernels::VOCAB_EMBED_FWD.for_dtype(T::DTYPE)?;
    stream.launch(k, grid_stride(out.len()), params)
}

/// `dweight[v, :] (+)= sum of dy[t, :] over tokens with ids[t] == start + v`,
/// in token order (`shard.rows >= 1`, `hidden >= 1`, `ids.len() < 2^32`):
/// the (row, token) keys sorted on the device (bitonic, [`sort_steps`]),
/// then one block per shard row summing its segment. `keys` is scratch of
/// `sort_len(ids.len())` elements.
#[allow(clippy::too_many_arguments)]
pub(crate) fn embedding_grad<T: FloatElement, I: TokenId>(
    stream: &Stream,
    ids: &dyn DeviceRead<I>,
    dy: &dyn DeviceRead<T>,
    dweight: &mut dyn DeviceWrite<f32>,
    keys: &mut dyn DeviceWrite<i64>,
    hidden: usize,
    shard: Shard,
    accumulate: bool,
) -> Result<()> {
    let n = keys.len();
    let key_params = FtnVocabEmbedSortKeysParams {
        keys: keys.addr() as *mut i64,
        ids: ids.addr() as *const _,
        tokens: ids.len() as i64,
        n: n as i64,
        vocab_start: shard.vocab_start as i64,
        shard_rows: shard.rows as i64,
        ids_i64: I::IS_I64 as u32,
        pad_: 0,
    };
    stream.launch(
        kernels::VOCAB_EMBED_SORT_KEYS.only()?,
        grid_stride(n),
        key_params,
    )?;
    for step in sort_steps(n) {
        let (kernel, cfg, k, j) = match step {
            SortStep::Tile { k, cfg } => (kernels::VOCAB_EMBED_SORT_TILE.only()?, cfg, k, 0),
            SortStep::Global { k, j, cfg } => (kernels::VOCAB_EMBED_SORT_STEP.only()?, cfg, k, j),
        };
        let params = FtnVocabEmbedSortStepParams {
            keys: keys.addr() as *mut i64,
            n: n as i64,
            k: k as i64,
            j: j as i64,
        };
        stream.launch(kernel, cfg, params)?;
    }
    let params = FtnVocabEmbedBwdParams {
        dweight: dweight.addr() as *mut f32,
        dy: dy.addr() as *const _,
        sorted: keys.addr() as *const i64,
        tokens: ids.len() as i64,
        hidden: hidden as i64,
        shard_rows: shard.rows as i64,
        accumulate: accumulate as u32,
        pad_: 0,
    };
    let k = kernels::VOCAB_EMBED_BWD.for_dtype(T::DTYPE)?;
    stream.launch(k, per_row(shard.rows), params)
}

/// Per-token fp32 statistics of a `[tokens, cols]` logits shard.
pub(crate) struct CeShape {
    pub tokens: usize,
    pub cols: usize,
    pub vocab_start: usize,
    pub smoothing: f32,
    /// `1 / V` of the full padded vocabulary.
    pub inv_vocab: f32,
    /// Rows whose label equals this get loss 0 and a zero gradient.
    pub ignore_index: Option<i64>,
}

/// One pass per row: `row_max[t]` = this shard's row max (also into
/// `local_max` when given), `sums[0, t]` = sum of `exp(x - row_max)`,
/// `sums[1, t]` = the target logit (0 off-shard), `sums[2, t]` (label
/// smoothing) = sum of the logits.
pub(crate) fn ce_stats<T: FloatElement, I: TokenId>(
    stream: &Stream,
    logits: &dyn DeviceRead<T>,
    labels: &dyn DeviceRead<I>,
    row_max: &mut dyn DeviceWrite<f32>,
    local_max: Option<&mut dyn DeviceWrite<f32>>,
    sums: &mut dyn DeviceWrite<f32>,
    s: &CeShape,
) -> Result<()> {
    let params = FtnVocabCeStatsParams {
        sums: sums.addr() as *mut f32,
        row_max: row_max.addr() as *mut f32,
        local_max: local_max.map_or(core::ptr::null_mut(), |b| b.addr() as *mut f32),
        logits: logits.addr() as *const _,
        labels: labels.addr() as *const _,
        tokens: s.tokens as i64,
        cols: s.cols as i64,
        vocab_start: s.vocab_start as i64,
        ids_i64: I::IS_I64 as u32,
        with_logit_sum: (s.smoothing != 0.0) as u32,
    };
    let plan = ce_stats_plan(s.tokens, s.cols);
    let k = match plan.kernel {
        CeStatsKernel::WarpPerRow => kernels::VOCAB_CE_STATS_WARP.for_dtype(T::DTYPE)?,
        CeStatsKernel::BlockPerRow => kernels::VOCAB_CE_STATS.for_dtype(T::DTYPE)?,
    };
    stream.launch(k, plan.cfg, params)
}

/// `sums[0, t] *= exp(local_max[t] - row_max[t])`: the local sums of
/// exponentials re-based on the max reduced over the ranks.
pub(crate) fn ce_rescale(
    stream: &Stream,
    sums: &mut dyn DeviceWrite<f32>,
    row_max: &dyn DeviceRead<f32>,
    local_max: &dyn DeviceRead<f32>,
    tokens: usize,
) -> Result<()> {
    let params = FtnVocabCeRescaleParams {
        sums: sums.addr() as *mut f32,
        row_max: row_max.addr() as *const f32,
        local_max: local_max.addr() as *const f32,
        tokens: tokens as i64,
    };
    stream.launch(
        kernels::VOCAB_CE_RESCALE.only()?,
        grid_stride(tokens),
        params,
    )
}

/// `loss[t]` from the reduced statistics (0 for an ignored label).
pub(crate) fn ce_loss<I: TokenId>(
    stream: &Stream,
    labels: &dyn DeviceRead<I>,
    row_max: &dyn DeviceRead<f32>,
    sums: &dyn DeviceRead<f32>,
    loss: &mut dyn DeviceWrite<f32>,
    s: &CeShape,
) -> Result<()> {
    let params = FtnVocabCeLossParams {
        loss: loss.addr() as *mut f32,
        row_max: row_max.addr() as *const f32,
        sums: sums.addr() as *const f32,
        labels: labels.addr() as *const _,
        tokens: s.tokens as i64,
        ignore_index: s.ignore_index.unwrap_or(0),
        smoothing: s.smoothing,
        inv_vocab: s.inv_vocab,
        ids_i64: I::IS_I64 as u32,
        has_ignore_index: s.ignore_index.is_some() as u32,
    };
    stream.launch(
        kernels::VOCAB_CE_LOSS.only()?,
        grid_stride(s.tokens),
        params,
    )
}

/// `grad = dloss * (softmax - (1 - eps) * onehot - eps / V)`, one block per
/// token row, into the `[tokens, cols]` buffer at `grad` (may be `logits` itself); zero rows for
/// ignored labels.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ce_grad<T: FloatElement, I: TokenId>(
    stream: &Stream,
    grad: u64,
    logits: &dyn DeviceRead<T>,
    labels: &dyn DeviceRead<I>,
    row_max: &dyn DeviceRead<f32>,
    sums: &dyn DeviceRead<f32>,
    dloss: &dyn DeviceRead<f32>,
    s: &CeShape,
) -> Result<()> {
    let params = FtnVocabCeBwdParams {
        grad: grad as *mut _,
        logits: logits.addr() as *const _,
        labels: labels.addr() as *const _,
        row_max: row_max.addr() as *const f32,
        sums: sums.addr() as *const f32,
        dloss: dloss.addr() as *const f32,
        tokens: s.tokens as i64,
        cols: s.cols as i64,
        vocab_start: s.vocab_start as i64,
        ignore_index: s.ignore_index.unwrap_or(0),
        smoothing: s.smoothing,
        inv_vocab: s.inv_vocab,
        ids_i64: I::IS_I64 as u32,
        has_ignore_index: s.ignore_index.is_some() as u32,
    };
    let k = kernels::VOCAB_CE_BWD.for_dtype(T::DTYPE)?;
    stream.launch(k, per_row(s.tokens), params)
}
