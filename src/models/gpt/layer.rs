//! One pre-LayerNorm transformer layer on one tensor-parallel rank:
//!
//! ```text
//! y1  = LN1(x)
//! x2  = x  + dropout(attention(y1))      TpAttention, then BiasDropoutAdd
//! y2  = LN2(x2)
//! out = x2 + dropout(mlp(y2))            TpMlp, then BiasDropoutAdd
//! ```
//!
//! A forward returns what its backward needs as a [`LayerSaved`] value (the
//! pipeline runs several micro-batches' forwards before their backwards).
//! With full recomputation it keeps only its input and the dropout
//! positions, and the backward runs the forward again first; dropout masks
//! are regenerated from their Philox positions, so the recomputed
//! activations are bitwise the stored ones.
//!
//! With sequence parallelism the LayerNorms, dropouts and residual adds run
//! on this rank's `1/tp` of the tokens (rows `first .. first + local` of the
//! micro-batch); the attention and MLP blocks all-gather and reduce-scatter
//! the tokens around their GEMMs. A dropout's Philox positions are those of
//! its rows in the whole micro-batch, so the masks are the ones the run
//! without sequence parallelism draws.

use crate::backend::{DeviceBuffer, Stream};
use crate::comm::Communicator;
use crate::core::rng::PhiloxState;
use crate::core::Result;
use crate::ops::dropout::{BiasDropoutAdd, DropoutMode};
use crate::ops::layernorm::LayerNorm;
use crate::parallel::attention::{AttentionGrads, AttentionOptions, AttentionSaved, TpAttention};
use crate::parallel::ddp::{ParamAndGradBuffers, ParamId};
use crate::parallel::linear::{LinearGrads, TpElement, WeightGrad};
use crate::parallel::mlp::{MlpGrads, MlpOptions, MlpSaved, TpMlp};

use super::config::GptConfig;
use super::grads::Accumulator;
use super::init;

/// The parameter names of a layer, in registration (forward) order.
pub const LAYER_PARAMS: [&str; 12] = [
    "ln1.weight",
    "ln1.bias",
    "attention.qkv.weight",
    "attention.qkv.bias",
    "attention.proj.weight",
    "attention.proj.bias",
    "ln2.weight",
    "ln2.bias",
    "mlp.fc1.weight",
    "mlp.fc1.bias",
    "mlp.fc2.weight",
    "mlp.fc2.bias",
];

/// The row-parallel linears of a layer: their input is split over the
/// tensor-parallel ranks, their output (and so their bias) is whole.
const ROW_PARALLEL_LINEARS: [&str; 2] = ["attention.proj.", "mlp.fc2."];

/// Whether a layer parameter is replicated over the tensor-parallel ranks
/// (LayerNorms and the row-parallel biases) rather than sharded. Derived
/// from the names in [`LAYER_PARAMS`], so a reordering cannot desynchronise
/// it; an index past the list is not a parameter (false).
pub fn layer_param_replicated(index: usize) -> bool {
    layer_param_is_norm(index)
        || LAYER_PARAMS.get(index).is_some_and(|name| {
            name.ends_with(".bias") && ROW_PARALLEL_LINEARS.iter().any(|l| name.starts_with(l))
        })
}

/// Whether a layer parameter is a LayerNorm weight or bias (with sequence
/// parallelism each rank's gradient of it covers only its own tokens).
pub fn layer_param_is_norm(index: usize) -> bool {
    LAYER_PARAMS
        .get(index)
        .is_some_and(|name| name.starts_with("ln"))
}

/// The shared arguments of a layer call.
pub(crate) struct Ctx<'a, T: TpElement> {
    pub tp: &'a Communicator,
    pub stream: &'a Stream,
    pub seq: usize,
    pub batch: usize,
    pub acc: &'a Accumulator<T>,
    /// Sequence parallelism: this rank holds rows `tp_rank · tokens / tp`
    /// onwards, `tokens / tp` of them (else all of them).
    pub sequence_parallel: bool,
}

impl<T: TpElement> Ctx<'_, T> {
    /// Tokens of the micro-batch.
    fn tokens(&self) -> usize {
        self.seq * self.batch
    }

    /// Tokens (rows) this rank's LayerNorms and dropouts see.
    fn local_tokens(&self) -> usize {
        if self.sequence_parallel {
            self.tokens() / self.tp.size()
        } else {
            self.tokens()
        }
    }

    /// The micro-batch row of this rank's first local token.
    fn first_token(&self) -> usize {
        if self.sequence_parallel {
            self.tp.rank() * self.local_tokens()
        } else {
            0
        }
    }

    /// `mode` for this rank's rows of a `[tokens, hidden]` dropout.
    fn rows_mode(&self, mode: DropoutMode, hidden: usize) -> DropoutMode {
        dropout_at_rows(mode, self.first_token(), hidden)
    }
}

/// `mode` for rows `first ..` of a `[tokens, hidden]` dropout: the Philox
/// positions those rows have in the whole tensor (a mask element's position
/// is the call's offset plus its index).
pub(crate) fn dropout_at_rows(mode: DropoutMode, first: usize, hidden: usize) -> DropoutMode {
    match mode {
        DropoutMode::Train(st) => DropoutMode::Train(PhiloxState {
            seed: st.seed,
            offset: st.offset.wrapping_add((first * hidden) as u64),
        }),
        m => m,
    }
}

/// The dropout positions of one layer call: attention probabilities, the
/// attention branch and the MLP branch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerRng {
    pub attention: DropoutMode,
    pub residual: [DropoutMode; 2],
}

/// LayerNorm weight and bias.
pub(crate) struct Norm<T: TpElement> {
    pub gamma: DeviceBuffer<T>,
    pub beta: DeviceBuffer<T>,
}

/// What a full forward keeps beyond the input.
struct Activations<T: TpElement> {
    y1: DeviceBuffer<T>,
    stats1: (DeviceBuffer<f32>, DeviceBuffer<f32>),
    attention: AttentionSaved<T>,
    x2: DeviceBuffer<T>,
    y2: DeviceBuffer<T>,
    stats2: (DeviceBuffer<f32>, DeviceBuffer<f32>),
    mlp: MlpSaved<T>,
}

/// One forward's saved state.
pub(crate) struct LayerSaved<T: TpElement> {
    x: DeviceBuffer<T>,
    rng: LayerRng,
    acts: Option<Activations<T>>,
}

impl<T: TpElement> LayerSaved<T> {
    /// Device bytes held (input, activations, statistics).
    pub(crate) fn bytes(&self) -> usize {
        let e = std::mem::size_of::<T>();
        let mut n = self.x.len() * e;
        if let Some(a) = &self.acts {
            n += (a.y1.len() + a.x2.len() + a.y2.len()) * e;
            n += 4 * (a.stats1.0.len() + a.stats1.1.len() + a.stats2.0.len() + a.stats2.1.len());
            n += a.attention.bytes() + a.mlp.bytes();
        }
        n
    }

    /// The input `[tokens, hidden]` this forward ran on.
    pub(crate) fn input(&self) -> &DeviceBuffer<T> {
        &self.x
    }
}

/// One layer's shards and parameter ids.
pub(crate) struct Layer<T: TpElement> {
    pub index: usize,
    pub hidden: usize,
    pub ln1: Norm<T>,
    pub attention: TpAttention<T>,
    pub ln2: Norm<T>,
    pub mlp: TpMlp<T>,
    pub ids: Vec<ParamId>,
    hidden_dropout: f32,
}

fn norm<T: TpElement>(tp: &Communicator, h: usize) -> Result<Norm<T>> {
    Ok(Norm {
        gamma: tp.device().upload(&init::constant::<T>(h, 1.0))?,
        beta: tp.device().upload(&init::constant::<T>(h, 0.0))?,
    })
}

fn stats(tp: &Communicator, rows: usize) -> Result<(DeviceBuffer<f32>, DeviceBuffer<f32>)> {
    Ok((
        tp.device().alloc_zeros(rows)?,
        tp.device().alloc_zeros(rows)?,
    ))
}

impl<T: TpElement> Layer<T> {
    /// Layer `index` of `cfg`, this tensor-parallel rank's shards of the
    /// deterministic initial values (Megatron's: N(0, std²) weights, the
    /// output projections' std scaled by `1/sqrt(2·layers)`, zero biases,
    /// unit LayerNorm gains).
    pub(crate) fn new(
        tp: &Communicator,
        cfg: &GptConfig,
        index: usize,
        selective_recompute: bool,
        sequence_parallel: bool,
    ) -> Result<Self> {
        let (h, f, d) = (cfg.hidden, cfg.ffn, cfg.head_dim());
        let name = |p: &str| format!("layers.{index}.{p}");
        let std = cfg.init_std;
        let out_std = std / (2.0 * cfg.layers as f32).sqrt();
        let w = |p: &str, n: usize, s: f32| init::normal::<T>(cfg.seed, &name(p), n, s);
        let zeros = |n: usize| init::constant::<T>(n, 0.0);
        let attention = TpAttention::from_full(
            tp,
            h,
            cfg.heads,
            d,
            &w("attention.qkv.weight", 3 * h * h, std),
            &zeros(3 * h),
            &w("attention.proj.weight", h * h, out_std),
            &zeros(h),
            AttentionOptions {
                attention_dropout: cfg.attention_dropout,
                recompute_core: selective_recompute,
                sequence_parallel,
                ..AttentionOptions::default()
            },
        )?;
        let mlp = TpMlp::from_full(
            tp,
            h,
            f,
            &w("mlp.fc1.weight", f * h, std),
            &zeros(f),
            &w("mlp.fc2.weight", h * f, out_std),
            &zeros(h),
            MlpOptions {
                sequence_parallel,
                ..MlpOptions::default()
            },
        )?;
        Ok(Layer {
            index,
            hidden: h,
            ln1: norm(tp, h)?,
            attention,
            ln2: norm(tp, h)?,
            mlp,
            ids: Vec::new(),
            hidden_dropout: cfg.hidden_dropout,
        })
    }

    /// The parameters in [`LAYER_PARAMS`] order: this rank's buffers.
    pub(crate) fn params_mut(&mut self) -> [&mut DeviceBuffer<T>; 12] {
        let missing = "TpAttention and TpMlp are built with biases";
        let a = &mut self.attention;
        let m = &mut self.mlp;
        [
            &mut self.ln1.gamma,
            &mut self.ln1.beta,
            &mut a.qkv.weight,
            a.qkv.bias.as_mut().expect(missing),
            &mut a.proj.weight,
            a.proj.bias.as_mut().expect(missing),
            &mut self.ln2.gamma,
            &mut self.ln2.beta,
            &mut m.fc1.weight,
            m.fc1.bias.as_mut().expect(missing),
            &mut m.fc2.weight,
            m.fc2.bias.as_mut().expect(missing),
        ]
    }

    fn dropout(&self, ctx: &Ctx<'_, T>) -> BiasDropoutAdd {
        BiasDropoutAdd::new(ctx.local_tokens(), self.hidden, self.hidden_dropout)
    }

    /// `out = layer(x)`; returns the saved state (`keep = false`: the input
    /// and dropout positions only, for full recomputation).
    pub(crate) fn forward(
        &mut self,
        ctx: &Ctx<'_, T>,
        x: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
        rng: LayerRng,
        keep: bool,
    ) -> Result<LayerSaved<T>> {
        let (s, dev) = (ctx.stream, ctx.tp.device());
        let (t, h) = (ctx.local_tokens(), self.hidden);
        let mut xin = dev.alloc_zeros::<T>(t * h)?;
        s.copy_device(x, &mut xin)?;
        let acts = self.forward_acts(ctx, &xin, out, rng)?;
        Ok(LayerSaved {
            x: xin,
            rng,
            acts: keep.then_some(acts),
        })
    }

    fn forward_acts(
        &mut self,
        ctx: &Ctx<'_, T>,
        x: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
        rng: LayerRng,
    ) -> Result<Activations<T>> {
        let (s, dev) = (ctx.stream, ctx.tp.device());
        let (t, h) = (ctx.local_tokens(), self.hidden);
        let ln = LayerNorm::new(t, h);
        let mut y1 = dev.alloc_zeros::<T>(t * h)?;
        let mut stats1 = stats(ctx.tp, t)?;
        ln.forward(
            s,
            x,
            Some(&self.ln1.gamma),
            Some(&self.ln1.beta),
            &mut y1,
            &mut stats1.0,
            &mut stats1.1,
        )?;
        let mut a = dev.alloc_zeros::<T>(t * h)?;
        self.attention.forward_with_dropout(
            ctx.tp,
            s,
            &y1,
            &mut a,
            ctx.seq,
            ctx.batch,
            rng.attention,
        )?;
        let attention = self.attention.take_saved().ok_or_else(|| {
            crate::core::Error::invalid("GptLayer", "attention", "saved activations", "none")
        })?;
        let mut x2 = dev.alloc_zeros::<T>(t * h)?;
        self.dropout(ctx)
            .forward(s, &a, None, x, &mut x2, ctx.rows_mode(rng.residual[0], h))?;
        let mut y2 = dev.alloc_zeros::<T>(t * h)?;
        let mut stats2 = stats(ctx.tp, t)?;
        ln.forward(
            s,
            &x2,
            Some(&self.ln2.gamma),
            Some(&self.ln2.beta),
            &mut y2,
            &mut stats2.0,
            &mut stats2.1,
        )?;
        // `a` is free again: the MLP output goes there.
        self.mlp.forward(ctx.tp, s, &y2, &mut a, ctx.tokens())?;
        let mlp = self.mlp.take_saved().ok_or_else(|| {
            crate::core::Error::invalid("GptLayer", "mlp", "saved activations", "none")
        })?;
        self.dropout(ctx)
            .forward(s, &a, None, &x2, out, ctx.rows_mode(rng.residual[1], h))?;
        Ok(Activations {
            y1,
            stats1,
            attention,
            x2,
            y2,
            stats2,
            mlp,
        })
    }

    /// Re-runs the forward of a recomputed layer so that `saved` holds its
    /// activations (a no-op if it does). Returns the layer's output.
    pub(crate) fn recompute(
        &mut self,
        ctx: &Ctx<'_, T>,
        saved: &mut LayerSaved<T>,
    ) -> Result<DeviceBuffer<T>> {
        let mut out = ctx.tp.device().alloc_zeros::<T>(saved.x.len())?;
        let acts = self.forward_acts(ctx, &saved.x, &mut out, saved.rng)?;
        saved.acts = Some(acts);
        Ok(out)
    }

    /// `dx` from `dout`, accumulating every weight gradient into its fp32
    /// main gradient in `grads`. Recomputes the forward first if `saved`
    /// kept only the input.
    pub(crate) fn backward(
        &mut self,
        ctx: &Ctx<'_, T>,
        mut saved: LayerSaved<T>,
        dout: &DeviceBuffer<T>,
        dx: &mut DeviceBuffer<T>,
        grads: &ParamAndGradBuffers,
    ) -> Result<()> {
        if saved.acts.is_none() {
            self.recompute(ctx, &mut saved)?;
        }
        let LayerSaved { x, rng, acts } = saved;
        let acts = acts.ok_or_else(|| {
            crate::core::Error::invalid("GptLayer", "saved", "activations", "none")
        })?;
        let (s, dev) = (ctx.stream, ctx.tp.device());
        let (t, h) = (ctx.local_tokens(), self.hidden);
        let ln = LayerNorm::new(t, h);
        let ids = self.ids.clone();
        let g = |k: usize| grads.grad::<f32>(ids[k]);
        let mut tmp_h = dev.alloc_zeros::<T>(h)?;
        let mut tmp_h2 = dev.alloc_zeros::<T>(h)?;

        // MLP branch: out = x2 + dropout(m).
        let mut dm = dev.alloc_zeros::<T>(t * h)?;
        self.dropout(ctx).backward(
            s,
            dout,
            &mut dm,
            None,
            None,
            ctx.rows_mode(rng.residual[1], h),
        )?;
        self.mlp.restore_saved(acts.mlp)?;
        let mut dy2 = dev.alloc_zeros::<T>(t * h)?;
        let f1 = self.mlp.fc1.out_per_rank();
        let mut fc1_b = dev.alloc_zeros::<T>(f1)?;
        {
            let (mut w1, mut w2) = (g(8)?, g(10)?);
            self.mlp.backward(
                ctx.tp,
                s,
                &acts.y2,
                &dm,
                &mut dy2,
                MlpGrads {
                    fc1: LinearGrads {
                        weight: WeightGrad::Accumulate(&mut w1),
                        bias: Some(&mut fc1_b),
                    },
                    fc2: LinearGrads {
                        weight: WeightGrad::Accumulate(&mut w2),
                        bias: Some(&mut tmp_h),
                    },
                },
            )?;
        }
        ctx.acc.add(s, &fc1_b, &mut g(9)?)?;
        ctx.acc.add(s, &tmp_h, &mut g(11)?)?;
        // LN2, then the residual: dx2 = dout + LN2'(dy2).
        let mut dx2 = dev.alloc_zeros::<T>(t * h)?;
        ln.backward(
            s,
            &dy2,
            &acts.x2,
            &acts.stats2.0,
            &acts.stats2.1,
            Some(&self.ln2.gamma),
            &mut dx2,
            Some(&mut tmp_h),
            Some(&mut tmp_h2),
        )?;
        ctx.acc.add(s, &tmp_h, &mut g(6)?)?;
        ctx.acc.add(s, &tmp_h2, &mut g(7)?)?;
        let add = BiasDropoutAdd::new(t, h, 0.0);
        // dy2 is free: dx2 + dout into it.
        add.forward(s, &dx2, None, dout, &mut dy2, DropoutMode::Eval)?;
        let dx2 = dy2;

        // Attention branch: x2 = x + dropout(a).
        self.dropout(ctx).backward(
            s,
            &dx2,
            &mut dm,
            None,
            None,
            ctx.rows_mode(rng.residual[0], h),
        )?;
        self.attention.restore_saved(acts.attention)?;
        let mut dy1 = dev.alloc_zeros::<T>(t * h)?;
        let qkv_n = self.attention.qkv.out_per_rank();
        let mut qkv_b = dev.alloc_zeros::<T>(qkv_n)?;
        {
            let (mut wq, mut wp) = (g(2)?, g(4)?);
            self.attention.backward(
                ctx.tp,
                s,
                &acts.y1,
                &dm,
                &mut dy1,
                AttentionGrads {
                    qkv: LinearGrads {
                        weight: WeightGrad::Accumulate(&mut wq),
                        bias: Some(&mut qkv_b),
                    },
                    proj: LinearGrads {
                        weight: WeightGrad::Accumulate(&mut wp),
                        bias: Some(&mut tmp_h),
                    },
                },
            )?;
        }
        ctx.acc.add(s, &qkv_b, &mut g(3)?)?;
        ctx.acc.add(s, &tmp_h, &mut g(5)?)?;
        // LN1, then the residual: dx = dx2 + LN1'(dy1).
        ln.backward(
            s,
            &dy1,
            &x,
            &acts.stats1.0,
            &acts.stats1.1,
            Some(&self.ln1.gamma),
            &mut dm,
            Some(&mut tmp_h),
            Some(&mut tmp_h2),
        )?;
        ctx.acc.add(s, &tmp_h, &mut g(0)?)?;
        ctx.acc.add(s, &tmp_h2, &mut g(1)?)?;
        add.forward(s, &dm, None, &dx2, dx, DropoutMode::Eval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replicated parameters are the LayerNorms and the biases of the
    /// row-parallel linears (Megatron's layout), by name.
    #[test]
    fn replicated_and_norm_parameters_by_name() {
        let named = |f: fn(usize) -> bool| -> Vec<&str> {
            (0..LAYER_PARAMS.len() + 2)
                .filter(|&i| f(i))
                .map(|i| LAYER_PARAMS[i])
                .collect()
        };
        assert_eq!(
            named(layer_param_replicated),
            [
                "ln1.weight",
                "ln1.bias",
                "attention.proj.bias",
                "ln2.weight",
                "ln2.bias",
                "mlp.fc2.bias"
            ]
        );
        assert_eq!(
            named(layer_param_is_norm),
            ["ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"]
        );
    }
}
