//! What a GPT run is made of: the model's shape, how it is split over
//! ranks, and the checks that turn a bad combination into a named error
//! before any work starts.

use crate::core::pipeline::{PipelineConfig, ScheduleKind};
use crate::core::{Error, Result};

const OP: &str = "GptConfig";

/// The model: a pre-LayerNorm GPT with learned positions and an output
/// layer tied to the word embedding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    /// Unpadded vocabulary size (padded per rank as Megatron does).
    pub vocab: usize,
    /// Sequence length (tokens per sample).
    pub seq: usize,
    pub hidden: usize,
    pub heads: usize,
    pub layers: usize,
    /// MLP inner size (`4 · hidden` by default).
    pub ffn: usize,
    /// Hidden dropout (embedding and both residual branches), `[0, 1)`.
    pub hidden_dropout: f32,
    /// Attention-probability dropout, `[0, 1)`.
    pub attention_dropout: f32,
    /// Standard deviation of the normal initialisation (Megatron: 0.02;
    /// output projections scaled by `1/sqrt(2 · layers)`).
    pub init_std: f32,
    /// Seeds the initialisation and the dropout streams.
    pub seed: u64,
}

impl GptConfig {
    /// A small character-level model: 4 layers, hidden 128, 4 heads.
    pub fn small(vocab: usize, seq: usize) -> Self {
        GptConfig {
            vocab,
            seq,
            hidden: 128,
            heads: 4,
            layers: 4,
            ffn: 512,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
            init_std: 0.02,
            seed: 1234,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    /// Parameters of the unsharded model (the tied output layer counted once).
    pub fn parameters(&self) -> usize {
        let (h, f) = (self.hidden, self.ffn);
        let layer = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (f * h + f) + (h * f + h);
        self.vocab * h + self.seq * h + self.layers * layer + 2 * h
    }

    /// Training FLOPs per token: `6 · (non-embedding params + output layer)`
    /// for the matmuls plus the attention scores and context
    /// (`12 · layers · seq · hidden` for forward and backward).
    pub fn flops_per_token(&self) -> f64 {
        let (h, f, l) = (self.hidden as f64, self.ffn as f64, self.layers as f64);
        let matmul = l * (4.0 * h * h + 2.0 * h * f) + h * self.vocab as f64;
        6.0 * matmul + 12.0 * l * self.seq as f64 * h
    }

    pub(crate) fn validate(&self) -> Result<()> {
        for (arg, v) in [
            ("vocab", self.vocab),
            ("seq", self.seq),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("layers", self.layers),
            ("ffn", self.ffn),
        ] {
            if v == 0 {
                return Err(Error::invalid(OP, arg, "a positive size", 0));
            }
        }
        if self.hidden % self.heads != 0 {
            return Err(Error::invalid(
                OP,
                "heads",
                format!("a divisor of hidden = {}", self.hidden),
                self.heads,
            ));
        }
        for (arg, p) in [
            ("hidden_dropout", self.hidden_dropout),
            ("attention_dropout", self.attention_dropout),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(Error::invalid(OP, arg, "a probability in [0, 1)", p));
            }
        }
        if !(self.init_std.is_finite() && self.init_std > 0.0) {
            return Err(Error::invalid(
                OP,
                "init_std",
                "a finite value > 0",
                self.init_std,
            ));
        }
        Ok(())
    }
}

/// Activation recomputation (Korthikanti et al., Megatron's
/// `--recompute-granularity` / `--recompute-method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Recompute {
    /// Keep every activation.
    #[default]
    None,
    /// Core attention (softmax and attention dropout) recomputed in
    /// backward; the projections' activations kept.
    Selective,
    /// Full recomputation, `uniform`: the layers of each stage in groups of
    /// `n`; a group keeps only its input and is re-run before its backward.
    Uniform(usize),
    /// Full recomputation, `block`: the first `n` layers of each stage keep
    /// only their input; the others keep everything.
    Block(usize),
}

/// The pipeline schedule a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// 1F1B (gradient accumulation when `pp = 1`).
    OneFOneB,
    /// Interleaved 1F1B with `vp` chunks per rank.
    Interleaved,
}

/// Training precision: the parameters' and activations' type (fp32 master
/// weights and gradients either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Bf16,
    /// With dynamic loss scaling.
    Fp16,
}

/// How a run is split over `tp · pp · dp` ranks, and its batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParallelConfig {
    pub tp: usize,
    pub pp: usize,
    /// Chunks (virtual stages) per pipeline rank; > 1 only with
    /// [`Schedule::Interleaved`].
    pub vp: usize,
    pub dp: usize,
    pub schedule: Schedule,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Sequences per step over all data-parallel ranks (`micro_batch · dp ·
    /// micro-batches per rank`).
    pub global_batch: usize,
    pub recompute: Recompute,
    /// ZeRO-1: optimizer state sharded over the data-parallel ranks
    /// (otherwise every data-parallel rank keeps all of it).
    pub distributed_optimizer: bool,
    pub precision: Precision,
    /// Megatron's sequence parallelism: the LayerNorms and dropouts run on
    /// each tensor-parallel rank's `1/tp` of the micro-batch's tokens (their
    /// activations shrink by `tp`); the parallel linears all-gather the tokens
    /// before the column-parallel GEMM and reduce-scatter after the
    /// row-parallel one. Needs `seq · micro_batch` divisible by `tp`.
    pub sequence_parallel: bool,
}

impl ParallelConfig {
    /// One rank, everything else as `self`.
    pub fn single(self) -> Self {
        ParallelConfig {
            tp: 1,
            pp: 1,
            vp: 1,
            dp: 1,
            schedule: Schedule::OneFOneB,
            ..self
        }
    }

    pub fn world(&self) -> usize {
        self.tp * self.pp * self.dp
    }

    /// Micro-batches each data-parallel rank runs per step.
    pub fn micro_batches(&self) -> usize {
        self.global_batch / (self.micro_batch * self.dp).max(1)
    }

    /// The executor's schedule for this configuration.
    pub fn pipeline(&self) -> PipelineConfig {
        let kind = match (self.pp, self.schedule) {
            (1, _) => ScheduleKind::NoPipelining,
            (_, Schedule::OneFOneB) => ScheduleKind::OneFOneB,
            (_, Schedule::Interleaved) => ScheduleKind::Interleaved {
                vp: self.vp,
                group: None,
            },
        };
        PipelineConfig {
            pp: self.pp,
            microbatches: self.micro_batches(),
            kind,
        }
    }

    /// Every rule, each failure naming the argument: sizes positive,
    /// `tp · pp · dp == world`, heads and ffn divisible by `tp`, layers by
    /// `pp · vp`, the global batch by `micro_batch · dp`, the schedule's own
    /// rules.
    pub fn validate(&self, model: &GptConfig, world: usize) -> Result<()> {
        const P: &str = "ParallelConfig";
        model.validate()?;
        for (arg, v) in [
            ("tp", self.tp),
            ("pp", self.pp),
            ("vp", self.vp),
            ("dp", self.dp),
            ("micro_batch", self.micro_batch),
            ("global_batch", self.global_batch),
        ] {
            if v == 0 {
                return Err(Error::invalid(P, arg, "a positive size", 0));
            }
        }
        let ranks = self
            .tp
            .checked_mul(self.pp)
            .and_then(|x| x.checked_mul(self.dp));
        if ranks != Some(world) {
            return Err(Error::invalid(
                P,
                "tp * pp * dp",
                format!("the world size {world}"),
                format!("{} * {} * {}", self.tp, self.pp, self.dp),
            ));
        }
        if model.heads % self.tp != 0 {
            return Err(Error::invalid(
                P,
                "tp",
                format!("a divisor of heads = {}", model.heads),
                self.tp,
            ));
        }
        if model.ffn % self.tp != 0 {
            return Err(Error::invalid(
                P,
                "tp",
                format!("a divisor of ffn = {}", model.ffn),
                self.tp,
            ));
        }
        if self.vp > 1 && self.schedule != Schedule::Interleaved {
            return Err(Error::invalid(
                P,
                "vp",
                "1 unless the schedule is interleaved",
                self.vp,
            ));
        }
        let stages = self.pp * self.vp;
        if model.layers % stages != 0 {
            return Err(Error::invalid(
                P,
                "layers",
                format!(
                    "a multiple of pp * vp = {} * {} = {stages}",
                    self.pp, self.vp
                ),
                model.layers,
            ));
        }
        let tokens = model.seq.saturating_mul(self.micro_batch);
        if self.sequence_parallel && tokens % self.tp != 0 {
            return Err(Error::invalid(
                P,
                "sequence_parallel",
                format!(
                    "seq * micro_batch = {} * {} divisible by tp = {} (each rank holds 1/tp of the tokens)",
                    model.seq, self.micro_batch, self.tp
                ),
                tokens,
            ));
        }
        if self.global_batch % (self.micro_batch * self.dp) != 0 {
            return Err(Error::invalid(
                P,
                "global_batch",
                format!(
                    "a multiple of micro_batch * dp = {} * {}",
                    self.micro_batch, self.dp
                ),
                self.global_batch,
            ));
        }
        match self.recompute {
            Recompute::Uniform(0) | Recompute::Block(0) => {
                return Err(Error::invalid(
                    P,
                    "recompute",
                    "a layer count >= 1",
                    format!("{:?}", self.recompute),
                ))
            }
            _ => {}
        }
        if self.pp == 1 && self.schedule == Schedule::Interleaved {
            return Err(Error::invalid(
                P,
                "schedule",
                "1F1B when pp = 1 (interleaving needs pp >= 2)",
                "interleaved",
            ));
        }
        self.pipeline().validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn par() -> ParallelConfig {
        ParallelConfig {
            tp: 2,
            pp: 2,
            vp: 1,
            dp: 2,
            schedule: Schedule::OneFOneB,
            micro_batch: 2,
            global_batch: 16,
            recompute: Recompute::None,
            distributed_optimizer: true,
            precision: Precision::Bf16,
            sequence_parallel: false,
        }
    }

    fn arg_of(e: Error) -> String {
        match e {
            Error::InvalidArgument { arg, .. } => arg.to_string(),
            other => panic!("not an argument error: {other}"),
        }
    }

    #[test]
    fn bad_configurations_are_named() {
        let m = GptConfig::small(62, 64);
        assert!(par().validate(&m, 8).is_ok());
        assert_eq!(arg_of(par().validate(&m, 4).unwrap_err()), "tp * pp * dp");
        let heads3 = GptConfig {
            heads: 3,
            hidden: 129,
            ..m
        };
        let tp2 = par();
        assert_eq!(arg_of(tp2.validate(&heads3, 8).unwrap_err()), "tp");
        let layers3 = GptConfig { layers: 3, ..m };
        assert_eq!(arg_of(par().validate(&layers3, 8).unwrap_err()), "layers");
        let odd_batch = ParallelConfig {
            global_batch: 6,
            ..par()
        };
        assert_eq!(
            arg_of(odd_batch.validate(&m, 8).unwrap_err()),
            "global_batch"
        );
        let vp_no_inter = ParallelConfig { vp: 2, ..par() };
        assert_eq!(arg_of(vp_no_inter.validate(&m, 8).unwrap_err()), "vp");
        let bad_heads = GptConfig { heads: 5, ..m };
        assert_eq!(arg_of(par().validate(&bad_heads, 8).unwrap_err()), "heads");
        let p = GptConfig {
            hidden_dropout: 1.0,
            ..m
        };
        assert_eq!(arg_of(par().validate(&p, 8).unwrap_err()), "hidden_dropout");
    }

    #[test]
    fn parameter_count_matches_a_hand_count() {
        // vocab 10, seq 4, hidden 8, ffn 32, 1 layer:
        // embeddings 80 + 32; layer: 2 LN 32, qkv 192+24, proj 64+8,
        // fc1 256+32, fc2 256+8; final LN 16.
        let c = GptConfig {
            vocab: 10,
            seq: 4,
            hidden: 8,
            heads: 2,
            layers: 1,
            ffn: 32,
            ..GptConfig::small(10, 4)
        };
        assert_eq!(c.parameters(), 80 + 32 + 32 + 216 + 72 + 288 + 264 + 16);
    }
}
