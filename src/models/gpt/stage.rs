//! One pipeline rank's share of the GPT: its chunks (virtual stages), each
//! a run of layers, with the embedding on the first global stage and the
//! final LayerNorm + tied output layer on the last, driven by the pipeline
//! executor ([`PipelineStage`]).
//!
//! * Embedding: `x0 = dropout(word[ids] + pos[i])` — the vocab-parallel
//!   lookup (all-reduced over TP), the positions added by a GEMM with a
//!   constant one-hot matrix (`[tokens, seq] · [seq, hidden]`, exact: one
//!   nonzero product per output), whose transposed GEMM sums the position
//!   gradient in fp32.
//! * Output: `logits = LN(x) · W_shardᵀ + mask`, `W` the word embedding
//!   (tied; at `pp > 1` the last stage holds a copy whose gradient is
//!   summed with the first stage's after the pipeline run), `mask` a
//!   constant `-10000` on the padded vocabulary columns (0 elsewhere), so
//!   padding gets probability 0 and no gradient and the loss does not
//!   depend on how far `tp` padded the vocabulary.
//! * The first stage's pipeline input is a 1-element placeholder (the
//!   tokens come from the batch) and its input gradient is zero.
//! * Sequence parallelism (`ParallelConfig::sequence_parallel`): between
//!   the embedding and the output layer each tensor-parallel rank holds
//!   `tokens / tp` rows (`[seq, batch]` order, so a run of positions), and
//!   that is what the pipeline sends. The embedding reduce-scatters its
//!   lookup and adds its rows' positions (its backward all-gathers the rows'
//!   gradients);
//!   the final LayerNorm runs on the rows and all-gathers its output for
//!   the output layer, whose input gradient is reduce-scattered back. The
//!   LayerNorm weights' gradients are then partial sums over each rank's
//!   rows, all-reduced over the tensor-parallel group once per step before
//!   the data-parallel reduction.

use std::collections::HashMap;

use crate::backend::{DeviceBuffer, DeviceRead, Stream};
use crate::comm::{Communicator, ReduceOp};
use crate::core::rng::{consumed, PhiloxState, MODEL_PARALLEL_SEED_OFFSET};
use crate::core::{Error, Result};
use crate::ops::dropout::{BiasDropoutAdd, DropoutMode};
use crate::ops::gemm::{Aux, Epilogue, Gemm, GemmInputs};
use crate::ops::layernorm::LayerNorm;
use crate::parallel::ddp::{DistributedDataParallel, ParamId};
use crate::parallel::linear::TpElement;
use crate::parallel::pipeline::PipelineStage;
use crate::parallel::vocab::{padded_vocab_size, vocab_range, VocabParallelEmbedding};

use super::config::{GptConfig, ParallelConfig, Recompute};
use super::grads::Accumulator;
use super::init;
use super::layer::{
    dropout_at_rows, layer_param_is_norm, layer_param_replicated, Ctx, Layer, LayerRng, LayerSaved,
    Norm, LAYER_PARAMS,
};
use super::norm_grads::NormGradReducer;

const OP: &str = "GptStage";

/// The value added to the logits of padded vocabulary entries.
pub const PADDED_LOGIT: f32 = -10000.0;

/// Word and position embeddings (global stage 0).
pub(crate) struct Embedding<T: TpElement> {
    pub word: DeviceBuffer<T>,
    pub pos: DeviceBuffer<T>,
    pub word_id: Option<ParamId>,
    pub pos_id: Option<ParamId>,
    /// `[tokens, seq]`, row `i·batch + j` one at column `i`.
    onehot: DeviceBuffer<T>,
    lookup: VocabParallelEmbedding,
}

/// Final LayerNorm and the output layer (last global stage).
pub(crate) struct Head<T: TpElement> {
    pub ln: Norm<T>,
    pub ln_ids: Vec<ParamId>,
    /// The last stage's copy of the word embedding (`pp > 1`); at `pp = 1`
    /// the embedding's own weight is used.
    pub word: Option<DeviceBuffer<T>>,
    pub word_id: Option<ParamId>,
    /// `[vocab / tp]`: 0, or [`PADDED_LOGIT`] on padded columns.
    mask: DeviceBuffer<T>,
}

/// A chunk: the layers of one global stage.
pub(crate) struct Chunk<T: TpElement> {
    pub global_stage: usize,
    pub layers: Vec<Layer<T>>,
}

/// What the head's forward keeps: the final LayerNorm's input, output and
/// statistics.
struct HeadSaved<T: TpElement> {
    x: DeviceBuffer<T>,
    yf: DeviceBuffer<T>,
    mean: DeviceBuffer<f32>,
    rstd: DeviceBuffer<f32>,
}

/// One micro-batch's saved state of one chunk.
#[derive(Default)]
struct ChunkSaved<T: TpElement> {
    layers: Vec<Option<LayerSaved<T>>>,
    /// Final LN input, output and statistics.
    head: Option<HeadSaved<T>>,
}

/// One recomputation group of a chunk's layers `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Group {
    start: usize,
    end: usize,
    recompute: bool,
}

fn groups(layers: usize, mode: Recompute) -> Vec<Group> {
    let one = |i: usize, recompute: bool| Group {
        start: i,
        end: i + 1,
        recompute,
    };
    match mode {
        Recompute::None | Recompute::Selective => (0..layers).map(|i| one(i, false)).collect(),
        Recompute::Block(n) => (0..layers).map(|i| one(i, i < n)).collect(),
        Recompute::Uniform(n) => (0..layers)
            .step_by(n)
            .map(|s| Group {
                start: s,
                end: (s + n).min(layers),
                recompute: true,
            })
            .collect(),
    }
}

/// This pipeline rank's model share.
pub struct GptStage<T: TpElement> {
    pub(crate) cfg: GptConfig,
    pub(crate) par: ParallelConfig,
    pub(crate) tp_rank: usize,
    pub(crate) chunks: Vec<Chunk<T>>,
    pub(crate) embedding: Option<Embedding<T>>,
    pub(crate) head: Option<Head<T>>,
    acc: Accumulator<T>,
    saved: HashMap<(usize, usize), ChunkSaved<T>>,
    /// Bytes each layer kept per micro-batch at its last forward (for the
    /// activation-memory report), by global layer index.
    pub(crate) layer_bytes: HashMap<usize, usize>,
    /// The sequence-parallel LayerNorm gradients' all-reduce (its buffer).
    norm_grads: NormGradReducer,
}

fn vocab_shard(vocab: usize, tp: &Communicator) -> Result<(usize, usize)> {
    vocab_range(vocab, tp.size(), tp.rank())
        .ok_or_else(|| Error::invalid(OP, "vocab", "a vocabulary that can be padded", vocab))
}

/// The full word embedding: `[padded vocab, hidden]`, the real rows
/// N(0, std²) and the padding rows zero (the same real rows at every tp).
fn full_word<T: TpElement>(cfg: &GptConfig, tp: usize) -> Result<Vec<T>> {
    let v = padded_vocab_size(cfg.vocab, tp)
        .ok_or_else(|| Error::invalid(OP, "vocab", "a vocabulary that can be padded", cfg.vocab))?;
    let mut w = init::normal::<T>(
        cfg.seed,
        "embedding.word",
        cfg.vocab * cfg.hidden,
        cfg.init_std,
    );
    w.resize(v * cfg.hidden, init::constant::<T>(1, 0.0)[0]);
    Ok(w)
}

fn shard_of<T: TpElement>(full: &[T], start: usize, rows: usize, h: usize) -> Vec<T> {
    full[start * h..(start + rows) * h].to_vec()
}

impl<T: TpElement> GptStage<T> {
    /// The chunks of pipeline rank `pp_rank`, tensor-parallel rank
    /// `tp.rank()`, with this rank's shards of the initial parameters.
    pub fn new(
        tp: &Communicator,
        cfg: &GptConfig,
        par: &ParallelConfig,
        pp_rank: usize,
    ) -> Result<Self> {
        let dev = tp.device();
        let stages = par.pp * par.vp;
        let per = cfg.layers / stages;
        let (h, t) = (cfg.hidden, cfg.seq * par.micro_batch);
        let selective = par.recompute == Recompute::Selective;
        let mut chunks = Vec::new();
        for c in 0..par.vp {
            let g = c * par.pp + pp_rank;
            let layers = (g * per..(g + 1) * per)
                .map(|i| Layer::new(tp, cfg, i, selective, par.sequence_parallel))
                .collect::<Result<Vec<_>>>()?;
            chunks.push(Chunk {
                global_stage: g,
                layers,
            });
        }
        let (start, rows) = vocab_shard(cfg.vocab, tp)?;
        let first = pp_rank == 0;
        let last = pp_rank == par.pp - 1;
        let word = if first || last {
            Some(shard_of(&full_word::<T>(cfg, tp.size())?, start, rows, h))
        } else {
            None
        };
        let embedding = match (first, &word) {
            (true, Some(w)) => {
                let mut onehot = vec![0.0f32; t * cfg.seq];
                for i in 0..cfg.seq {
                    for j in 0..par.micro_batch {
                        onehot[(i * par.micro_batch + j) * cfg.seq + i] = 1.0;
                    }
                }
                let onehot: Vec<T> = onehot.iter().map(|&v| T::from_f64(v as f64)).collect();
                Some(Embedding {
                    word: dev.upload(w)?,
                    pos: dev.upload(&init::normal::<T>(
                        cfg.seed,
                        "embedding.position",
                        cfg.seq * h,
                        cfg.init_std,
                    ))?,
                    word_id: None,
                    pos_id: None,
                    onehot: dev.upload(&onehot)?,
                    lookup: VocabParallelEmbedding::new(cfg.vocab, h),
                })
            }
            _ => None,
        };
        let head = match (last, &word) {
            (true, Some(w)) => {
                let mask: Vec<T> = (start..start + rows)
                    .map(|v| {
                        T::from_f64(if v < cfg.vocab {
                            0.0
                        } else {
                            PADDED_LOGIT as f64
                        })
                    })
                    .collect();
                Some(Head {
                    ln: Norm {
                        gamma: dev.upload(&init::constant::<T>(h, 1.0))?,
                        beta: dev.upload(&init::constant::<T>(h, 0.0))?,
                    },
                    ln_ids: Vec::new(),
                    word: if first { None } else { Some(dev.upload(w)?) },
                    word_id: None,
                    mask: dev.upload(&mask)?,
                })
            }
            _ => None,
        };
        Ok(GptStage {
            cfg: *cfg,
            par: *par,
            tp_rank: tp.rank(),
            chunks,
            embedding,
            head,
            acc: Accumulator::new(dev)?,
            saved: HashMap::new(),
            layer_bytes: HashMap::new(),
            norm_grads: NormGradReducer::default(),
        })
    }

    fn tokens(&self) -> usize {
        self.cfg.seq * self.par.micro_batch
    }

    /// Rows of the micro-batch this rank holds between the embedding and
    /// the output layer: `tokens / tp` with sequence parallelism.
    fn local_tokens(&self) -> usize {
        if self.par.sequence_parallel {
            self.tokens() / self.par.tp
        } else {
            self.tokens()
        }
    }

    /// Drops every saved micro-batch state (after a forward-only call).
    pub(crate) fn clear_saved(&mut self) {
        self.saved.clear();
    }

    /// Vocabulary columns on this rank.
    pub fn shard_vocab(&self) -> usize {
        padded_vocab_size(self.cfg.vocab, self.par.tp).unwrap_or(0) / self.par.tp
    }

    fn is_first(&self, chunk: usize) -> bool {
        self.chunks[chunk].global_stage == 0
    }

    fn is_last(&self, chunk: usize) -> bool {
        self.chunks[chunk].global_stage == self.par.pp * self.par.vp - 1
    }

    /// Every parameter of this rank in forward (registration) order, with
    /// its name, shard shape and buffer.
    pub(crate) fn params_mut(&mut self) -> Vec<ParamRef<'_, T>> {
        let mut out = Vec::new();
        let (h, vs, seq) = (self.cfg.hidden, self.shard_vocab(), self.cfg.seq);
        let last_stage = self.par.pp * self.par.vp - 1;
        let shapes = layer_shapes(&self.cfg, self.par.tp);
        let mut emb = self.embedding.as_mut();
        let mut head = self.head.as_mut();
        for chunk in self.chunks.iter_mut() {
            if chunk.global_stage == 0 {
                if let Some(e) = emb.take() {
                    out.push(ParamRef::new(
                        "embedding.word",
                        vec![vs, h],
                        false,
                        &mut e.word,
                    ));
                    out.push(ParamRef::new(
                        "embedding.position",
                        vec![seq, h],
                        true,
                        &mut e.pos,
                    ));
                }
            }
            for layer in chunk.layers.iter_mut() {
                let i = layer.index;
                for (k, buf) in layer.params_mut().into_iter().enumerate() {
                    out.push(ParamRef::new(
                        &format!("layers.{i}.{}", LAYER_PARAMS[k]),
                        shapes[k].clone(),
                        layer_param_replicated(k),
                        buf,
                    ));
                }
            }
            if chunk.global_stage == last_stage {
                if let Some(hd) = head.take() {
                    out.push(ParamRef::new(
                        "final_ln.weight",
                        vec![h],
                        true,
                        &mut hd.ln.gamma,
                    ));
                    out.push(ParamRef::new(
                        "final_ln.bias",
                        vec![h],
                        true,
                        &mut hd.ln.beta,
                    ));
                    if let Some(w) = hd.word.as_mut() {
                        let mut r = ParamRef::new("output.word", vec![vs, h], false, w);
                        r.tied_copy = true;
                        out.push(r);
                    }
                }
            }
        }
        out
    }

    /// Stores the registration ids (by parameter name) where the backward
    /// finds them. Errors: a name [`Self::params_mut`] lists is missing.
    pub(crate) fn assign_ids(&mut self, ids: &HashMap<String, ParamId>) -> Result<()> {
        let get = |n: &str| {
            ids.get(n)
                .copied()
                .ok_or_else(|| Error::invalid(OP, "ids", format!("an id for {n}"), "none"))
        };
        if let Some(e) = self.embedding.as_mut() {
            e.word_id = Some(get("embedding.word")?);
            e.pos_id = Some(get("embedding.position")?);
        }
        for chunk in self.chunks.iter_mut() {
            for layer in chunk.layers.iter_mut() {
                let i = layer.index;
                layer.ids = LAYER_PARAMS
                    .iter()
                    .map(|p| get(&format!("layers.{i}.{p}")))
                    .collect::<Result<_>>()?;
            }
        }
        if let Some(hd) = self.head.as_mut() {
            hd.ln_ids = vec![get("final_ln.weight")?, get("final_ln.bias")?];
            if hd.word.is_some() {
                hd.word_id = Some(get("output.word")?);
            }
        }
        Ok(())
    }
}

/// The shard shapes of a layer's parameters, in [`super::layer::LAYER_PARAMS`] order.
fn layer_shapes(cfg: &GptConfig, tp: usize) -> Vec<Vec<usize>> {
    let (h, f) = (cfg.hidden, cfg.ffn);
    vec![
        vec![h],
        vec![h],
        vec![3 * h / tp, h],
        vec![3 * h / tp],
        vec![h, h / tp],
        vec![h],
        vec![h],
        vec![h],
        vec![f / tp, h],
        vec![f / tp],
        vec![h, f / tp],
        vec![h],
    ]
}

/// One parameter of a rank: where it lives and how it is registered.
pub(crate) struct ParamRef<'a, T: TpElement> {
    pub name: String,
    pub shape: Vec<usize>,
    /// Replicated over the tensor-parallel ranks (counted once in the norm).
    pub replicated: bool,
    /// The last stage's copy of the tied word embedding.
    pub tied_copy: bool,
    pub buf: &'a mut DeviceBuffer<T>,
}

impl<'a, T: TpElement> ParamRef<'a, T> {
    fn new(name: &str, shape: Vec<usize>, replicated: bool, buf: &'a mut DeviceBuffer<T>) -> Self {
        ParamRef {
            name: name.into(),
            shape,
            replicated,
            tied_copy: false,
            buf,
        }
    }
}

/// One step's view of a rank for the pipeline executor: the model share,
/// the gradient buffers (and the data-parallel reducer to mark gradients
/// ready), the tensor-parallel group and the step's token ids.
pub(crate) struct StageRun<'r, 'c, T: TpElement> {
    pub stage: &'r mut GptStage<T>,
    pub ddp: &'r mut DistributedDataParallel<'c>,
    pub tp: &'r Communicator,
    /// Per micro-batch: `[tokens]` ids in `[seq, batch]` order.
    pub ids: &'r [DeviceBuffer<i32>],
    pub step: u64,
    pub dp_rank: usize,
    /// Evaluation: no dropout, nothing saved for a backward.
    pub eval: bool,
}

impl<T: TpElement> StageRun<'_, '_, T> {
    /// The Philox position of dropout `site` of `slot` (a layer, or
    /// `layers` for the embedding) in micro-batch `mb`: a function of the
    /// step and the global micro-batch, so every factorisation of the ranks
    /// draws the same masks for replicated activations.
    fn dropout_mode(&self, seed: u64, p: f32, mb: usize, slot: usize, site: u64) -> DropoutMode {
        if p == 0.0 || self.eval {
            return DropoutMode::Eval;
        }
        let (cfg, par) = (&self.stage.cfg, &self.stage.par);
        let m = par.micro_batches() as u64;
        let global_mb = self.dp_rank as u64 * m + mb as u64;
        let tokens = (cfg.seq * par.micro_batch) as u64;
        let scores = (par.micro_batch * cfg.heads * cfg.seq * cfg.seq) as u64;
        let stride = consumed(tokens * cfg.hidden as u64 + scores).unwrap_or(u64::MAX / 2);
        let call = ((self.step * m * par.dp as u64 + global_mb) * (cfg.layers as u64 + 1)
            + slot as u64)
            * 3
            + site;
        DropoutMode::Train(PhiloxState {
            seed,
            offset: call.wrapping_mul(stride),
        })
    }

    fn layer_rng(&self, mb: usize, layer: usize) -> LayerRng {
        let cfg = &self.stage.cfg;
        let mp_seed = cfg.seed + MODEL_PARALLEL_SEED_OFFSET + self.stage.tp_rank as u64;
        LayerRng {
            attention: self.dropout_mode(mp_seed, cfg.attention_dropout, mb, layer, 0),
            residual: [
                self.dropout_mode(cfg.seed, cfg.hidden_dropout, mb, layer, 1),
                self.dropout_mode(cfg.seed, cfg.hidden_dropout, mb, layer, 2),
            ],
        }
    }

    fn ids_of(&self, mb: usize) -> Result<&DeviceBuffer<i32>> {
        self.ids
            .get(mb)
            .ok_or_else(|| Error::invalid(OP, "microbatch", format!("< {}", self.ids.len()), mb))
    }

    fn embedding_forward(&mut self, stream: &Stream, mb: usize) -> Result<DeviceBuffer<T>> {
        let cfg = self.stage.cfg;
        let (lt, h) = (self.stage.local_tokens(), cfg.hidden);
        // This rank's rows of the micro-batch (all of them without sequence
        // parallelism): the lookup's rows reduce-scattered, their positions'
        // rows of the one-hot matrix, dropout at the rows' positions.
        let first = if self.stage.par.sequence_parallel {
            self.tp.rank() * lt
        } else {
            0
        };
        let mode = dropout_at_rows(
            self.dropout_mode(cfg.seed, cfg.hidden_dropout, mb, cfg.layers, 0),
            first,
            h,
        );
        let ids = self.ids_of(mb)?;
        let e = self
            .stage
            .embedding
            .as_ref()
            .ok_or_else(|| Error::invalid(OP, "chunk", "the first stage", "no embedding"))?;
        let dev = self.tp.device();
        let mut emb = dev.alloc_zeros::<T>(lt * h)?;
        if self.stage.par.sequence_parallel {
            e.lookup
                .forward_scattered(self.tp, stream, ids, &e.word, &mut emb)?;
        } else {
            e.lookup.forward(self.tp, stream, ids, &e.word, &mut emb)?;
        }
        Gemm::new(lt, h, cfg.seq).beta(1.0).run(
            stream,
            GemmInputs::<T, T> {
                a: &e.onehot.slice(first * cfg.seq..(first + lt) * cfg.seq)?,
                b: &e.pos,
                bias: None,
                c: None,
            },
            Aux::None,
            &mut emb,
        )?;
        if mode == DropoutMode::Eval {
            return Ok(emb);
        }
        let zeros = dev.alloc_zeros::<T>(lt * h)?;
        let mut x0 = dev.alloc_zeros::<T>(lt * h)?;
        BiasDropoutAdd::new(lt, h, cfg.hidden_dropout)
            .forward(stream, &emb, None, &zeros, &mut x0, mode)?;
        Ok(x0)
    }

    /// The whole `[tokens, hidden]` micro-batch tensor from every rank's
    /// rows (all-gathered; `rows` itself without sequence parallelism).
    fn all_rows(&self, stream: &Stream, rows: DeviceBuffer<T>) -> Result<DeviceBuffer<T>> {
        if !self.stage.par.sequence_parallel || self.tp.size() == 1 {
            return Ok(rows);
        }
        let mut full = self
            .tp
            .device()
            .alloc_zeros::<T>(self.stage.tokens() * self.stage.cfg.hidden)?;
        self.tp.all_gather(stream, &rows, &mut full)?;
        Ok(full)
    }

    fn embedding_backward(
        &mut self,
        stream: &Stream,
        mb: usize,
        dx0: DeviceBuffer<T>,
    ) -> Result<()> {
        let cfg = self.stage.cfg;
        let (t, h) = (self.stage.tokens(), cfg.hidden);
        let mode = self.dropout_mode(cfg.seed, cfg.hidden_dropout, mb, cfg.layers, 0);
        let dx0 = self.all_rows(stream, dx0)?;
        let d = if mode == DropoutMode::Eval {
            dx0
        } else {
            let mut d = self.tp.device().alloc_zeros::<T>(t * h)?;
            BiasDropoutAdd::new(t, h, cfg.hidden_dropout)
                .backward(stream, &dx0, &mut d, None, None, mode)?;
            d
        };
        let ids = self.ids_of(mb)?;
        let e = self
            .stage
            .embedding
            .as_ref()
            .ok_or_else(|| Error::invalid(OP, "chunk", "the first stage", "no embedding"))?;
        let missing = || Error::invalid(OP, "ids", "registered embedding parameters", "none");
        let grads = self.ddp.buffers();
        let mut gw = grads.grad::<f32>(e.word_id.ok_or_else(missing)?)?;
        e.lookup.backward(self.tp, stream, ids, &d, &mut gw, true)?;
        let mut gp = grads.grad::<f32>(e.pos_id.ok_or_else(missing)?)?;
        Gemm::new(cfg.seq, h, t).trans_a(true).beta(1.0).run(
            stream,
            GemmInputs::<T, f32> {
                a: &e.onehot,
                b: &d,
                bias: None,
                c: None,
            },
            Aux::None,
            &mut gp,
        )
    }

    /// The tied output weight of the last stage.
    fn output_weight(&self) -> Result<(&DeviceBuffer<T>, ParamId)> {
        let missing = || Error::invalid(OP, "chunk", "the last stage", "no output layer");
        let hd = self.stage.head.as_ref().ok_or_else(missing)?;
        match (&hd.word, hd.word_id) {
            (Some(w), Some(id)) => Ok((w, id)),
            _ => {
                let e = self.stage.embedding.as_ref().ok_or_else(missing)?;
                Ok((&e.word, e.word_id.ok_or_else(missing)?))
            }
        }
    }

    /// `(tokens, hidden, vocab columns on this rank)` of the output layer.
    fn head_dims(&self) -> (usize, usize, usize) {
        (
            self.stage.tokens(),
            self.stage.cfg.hidden,
            self.stage.shard_vocab(),
        )
    }

    /// The final LayerNorm and output layer (last stage only).
    fn head(&self) -> Result<&Head<T>> {
        self.stage
            .head
            .as_ref()
            .ok_or_else(|| Error::invalid(OP, "chunk", "the last stage", "no output layer"))
    }

    fn head_forward(
        &self,
        stream: &Stream,
        x: DeviceBuffer<T>,
        logits: &mut DeviceBuffer<T>,
    ) -> Result<HeadSaved<T>> {
        let (t, h, vs) = self.head_dims();
        let lt = self.stage.local_tokens();
        let dev = self.tp.device();
        let hd = self.head()?;
        let mut yf = dev.alloc_zeros::<T>(lt * h)?;
        let (mut mean, mut rstd) = (dev.alloc_zeros(lt)?, dev.alloc_zeros(lt)?);
        LayerNorm::new(lt, h).forward(
            stream,
            &x,
            Some(&hd.ln.gamma),
            Some(&hd.ln.beta),
            &mut yf,
            &mut mean,
            &mut rstd,
        )?;
        let yf = self.all_rows(stream, yf)?;
        let (w, _) = self.output_weight()?;
        Gemm::new(t, vs, h)
            .trans_b(true)
            .epilogue(Epilogue::Bias)
            .run(
                stream,
                GemmInputs::<T, T> {
                    a: &yf,
                    b: w,
                    bias: Some(&hd.mask),
                    c: None,
                },
                Aux::None,
                logits,
            )?;
        Ok(HeadSaved { x, yf, mean, rstd })
    }

    fn head_backward(
        &self,
        stream: &Stream,
        saved: HeadSaved<T>,
        dlogits: &DeviceBuffer<T>,
    ) -> Result<DeviceBuffer<T>> {
        let (t, h, vs) = self.head_dims();
        let dev = self.tp.device();
        let HeadSaved { x, yf, mean, rstd } = saved;
        let (w, wid) = self.output_weight()?;
        let hd = self.head()?;
        let mut dyf = dev.alloc_zeros::<T>(t * h)?;
        Gemm::new(t, h, vs).run(
            stream,
            GemmInputs::<T, T> {
                a: dlogits,
                b: w,
                bias: None,
                c: None,
            },
            Aux::None,
            &mut dyf,
        )?;
        // dyf is this rank's vocabulary shard's share: sum it over the ranks
        // (only this rank's rows, with sequence parallelism).
        let lt = self.stage.local_tokens();
        let dyf = if self.tp.size() == 1 {
            dyf
        } else if self.stage.par.sequence_parallel {
            let mut rows = dev.alloc_zeros::<T>(lt * h)?;
            self.tp
                .reduce_scatter(stream, &dyf, &mut rows, ReduceOp::Sum)?;
            rows
        } else {
            let mut dyf = dyf;
            self.tp
                .all_reduce_in_place(stream, &mut dyf, ReduceOp::Sum)?;
            dyf
        };
        let grads = self.ddp.buffers();
        Gemm::new(vs, h, t).trans_a(true).beta(1.0).run(
            stream,
            GemmInputs::<T, f32> {
                a: dlogits,
                b: &yf,
                bias: None,
                c: None,
            },
            Aux::None,
            &mut grads.grad::<f32>(wid)?,
        )?;
        let (mut dg, mut db) = (dev.alloc_zeros::<T>(h)?, dev.alloc_zeros::<T>(h)?);
        let mut dx = dev.alloc_zeros::<T>(lt * h)?;
        LayerNorm::new(lt, h).backward(
            stream,
            &dyf,
            &x,
            &mean,
            &rstd,
            Some(&hd.ln.gamma),
            &mut dx,
            Some(&mut dg),
            Some(&mut db),
        )?;
        let acc = &self.stage.acc;
        acc.add(stream, &dg, &mut grads.grad::<f32>(hd.ln_ids[0])?)?;
        acc.add(stream, &db, &mut grads.grad::<f32>(hd.ln_ids[1])?)?;
        Ok(dx)
    }

    /// The global index of layer `i` of `chunk`.
    fn layer_index(&self, chunk: usize, i: usize) -> usize {
        self.stage.chunks[chunk].layers[i].index
    }

    /// Runs layers `range` of `chunk` from `x`; returns the output and each
    /// layer's saved state.
    fn run_layers(
        &mut self,
        stream: &Stream,
        chunk: usize,
        mb: usize,
        range: std::ops::Range<usize>,
        mut x: DeviceBuffer<T>,
        keep: bool,
    ) -> Result<(DeviceBuffer<T>, Vec<LayerSaved<T>>)> {
        let mut saved = Vec::with_capacity(range.len());
        for i in range {
            let rng = self.layer_rng(mb, self.layer_index(chunk, i));
            let mut out = self.tp.device().alloc_zeros::<T>(x.len())?;
            let ctx = Ctx {
                tp: self.tp,
                stream,
                seq: self.stage.cfg.seq,
                batch: self.stage.par.micro_batch,
                acc: &self.stage.acc,
                sequence_parallel: self.stage.par.sequence_parallel,
            };
            let layer = &mut self.stage.chunks[chunk].layers[i];
            saved.push(layer.forward(&ctx, &x, &mut out, rng, keep)?);
            x = out;
        }
        Ok((x, saved))
    }

    /// Marks this chunk's gradients ready (the tied word embedding at
    /// `pp > 1` is marked by the trainer, after summing its two copies).
    fn mark_chunk_ready(&mut self, stream: &Stream, chunk: usize) -> Result<()> {
        let mut ids: Vec<ParamId> = Vec::new();
        let st = &self.stage;
        let tied_elsewhere = st.par.pp > 1;
        if st.is_first(chunk) {
            if let Some(e) = &st.embedding {
                ids.extend(e.pos_id);
                if !tied_elsewhere {
                    ids.extend(e.word_id);
                }
            }
        }
        for l in &st.chunks[chunk].layers {
            ids.extend(l.ids.iter().copied());
        }
        if st.is_last(chunk) {
            if let Some(hd) = &st.head {
                ids.extend(hd.ln_ids.iter().copied());
            }
        }
        if st.par.sequence_parallel && self.tp.size() > 1 {
            // Each rank's LayerNorm gradients cover its rows only.
            let mut partial: Vec<ParamId> = Vec::new();
            for l in &st.chunks[chunk].layers {
                partial.extend(
                    l.ids
                        .iter()
                        .enumerate()
                        .filter(|&(k, _)| layer_param_is_norm(k))
                        .map(|(_, &id)| id),
                );
            }
            if st.is_last(chunk) {
                if let Some(hd) = &st.head {
                    partial.extend(hd.ln_ids.iter().copied());
                }
            }
            self.stage
                .norm_grads
                .all_reduce(self.tp, stream, self.ddp.buffers(), &partial)?;
        }
        for id in ids.into_iter().rev() {
            self.ddp.mark_grad_ready(stream, id)?;
        }
        Ok(())
    }
}

impl<T: TpElement> PipelineStage<T> for StageRun<'_, '_, T> {
    fn forward(
        &mut self,
        stream: &Stream,
        chunk: usize,
        mb: usize,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let (t, h) = (self.stage.local_tokens(), self.stage.cfg.hidden);
        let x = if self.stage.is_first(chunk) {
            self.embedding_forward(stream, mb)?
        } else {
            if input.len() != t * h {
                return Err(Error::invalid(OP, "input", t * h, input.len()));
            }
            let mut x = self.tp.device().alloc_zeros::<T>(t * h)?;
            stream.copy_device(input, &mut x)?;
            x
        };
        let n = self.stage.chunks[chunk].layers.len();
        if self.eval {
            // Nothing kept: the layers' outputs only.
            let (x, _) = self.run_layers(stream, chunk, mb, 0..n, x, false)?;
            if self.stage.is_last(chunk) {
                self.head_forward(stream, x, output)?;
            } else {
                stream.copy_device(&x, output)?;
            }
            return Ok(());
        }
        let mut saved = ChunkSaved {
            layers: (0..n).map(|_| None).collect(),
            head: None,
        };
        let mut x = x;
        for g in groups(n, self.stage.par.recompute) {
            let (out, states) =
                self.run_layers(stream, chunk, mb, g.start..g.end, x, !g.recompute)?;
            for (k, st) in states.into_iter().enumerate() {
                let i = g.start + k;
                let global = self.layer_index(chunk, i);
                // A recomputed group keeps only its first layer's input.
                let keep = !g.recompute || k == 0;
                self.stage
                    .layer_bytes
                    .insert(global, if keep { st.bytes() } else { 0 });
                if keep {
                    saved.layers[i] = Some(st);
                }
            }
            x = out;
        }
        if self.stage.is_last(chunk) {
            saved.head = Some(self.head_forward(stream, x, output)?);
        } else {
            stream.copy_device(&x, output)?;
        }
        self.stage.saved.insert((chunk, mb), saved);
        Ok(())
    }

    fn backward_input(
        &mut self,
        stream: &Stream,
        chunk: usize,
        mb: usize,
        grad_output: &DeviceBuffer<T>,
        grad_input: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let mut saved = self.stage.saved.remove(&(chunk, mb)).ok_or_else(|| {
            Error::invalid(
                OP,
                "microbatch",
                "one whose forward ran",
                format!("{mb} (chunk {chunk})"),
            )
        })?;
        let mut dx = match saved.head.take() {
            Some(head) => self.head_backward(stream, head, grad_output)?,
            None => {
                let mut d = self.tp.device().alloc_zeros::<T>(grad_output.len())?;
                stream.copy_device(grad_output, &mut d)?;
                d
            }
        };
        let n = saved.layers.len();
        for g in groups(n, self.stage.par.recompute).into_iter().rev() {
            let states: Vec<LayerSaved<T>> = if g.recompute {
                let first = saved.layers[g.start].take().ok_or_else(|| {
                    Error::invalid(OP, "saved", "the recomputed group's input", "none")
                })?;
                let mut x = self.tp.device().alloc_zeros::<T>(first.input().len())?;
                stream.copy_device(first.input(), &mut x)?;
                self.run_layers(stream, chunk, mb, g.start..g.end, x, true)?
                    .1
            } else {
                (g.start..g.end)
                    .map(|i| {
                        saved.layers[i].take().ok_or_else(|| {
                            Error::invalid(OP, "saved", "a layer's saved state", "none")
                        })
                    })
                    .collect::<Result<_>>()?
            };
            for (k, st) in states.into_iter().enumerate().rev() {
                let i = g.start + k;
                let mut dnew = self.tp.device().alloc_zeros::<T>(dx.len())?;
                let ctx = Ctx {
                    tp: self.tp,
                    stream,
                    seq: self.stage.cfg.seq,
                    batch: self.stage.par.micro_batch,
                    acc: &self.stage.acc,
                    sequence_parallel: self.stage.par.sequence_parallel,
                };
                let grads = self.ddp.buffers();
                self.stage.chunks[chunk].layers[i].backward(&ctx, st, &dx, &mut dnew, grads)?;
                dx = dnew;
            }
        }
        if self.stage.is_first(chunk) {
            self.embedding_backward(stream, mb, dx)?;
            stream.fill_bytes(grad_input, 0)
        } else {
            stream.copy_device(&dx, grad_input)
        }
    }

    fn backward_weight(&mut self, stream: &Stream, chunk: usize, mb: usize) -> Result<()> {
        if mb + 1 == self.stage.par.micro_batches() {
            self.mark_chunk_ready(stream, chunk)?;
        }
        Ok(())
    }

    fn release(&mut self, chunk: usize, mb: usize) -> Result<()> {
        self.stage.saved.remove(&(chunk, mb));
        Ok(())
    }

    fn output_len(&self, chunk: usize, _mb: usize, _input_len: usize) -> usize {
        if self.stage.is_last(chunk) {
            self.stage.tokens() * self.stage.shard_vocab()
        } else {
            self.stage.local_tokens() * self.stage.cfg.hidden
        }
    }
}
