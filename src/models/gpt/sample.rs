//! Text from a trained model: the unsharded parameters loaded into a
//! single-rank model, one forward per generated character over the last
//! `seq` characters (a shorter context sits at the start of the window;
//! causal attention ignores what follows it), sampled from the softmax of
//! the logits at the context's last position divided by a temperature.

use std::collections::HashMap;

use crate::backend::Device;
use crate::comm::Communicator;
use crate::core::dtype::bf16;
use crate::core::{Error, Result};

use super::config::{GptConfig, ParallelConfig, Precision, Recompute, Schedule};
use super::corpus::CharCorpus;
use super::trainer::{GptTrainer, RankComms, TrainConfig};

/// `chars` characters continuing `prompt` (which must be non-empty and
/// made of the corpus's characters), sampled at `temperature` (> 0) with a
/// seeded generator. Runs on one emulator rank in bf16.
pub fn generate(
    cfg: &GptConfig,
    params: &HashMap<String, Vec<f32>>,
    corpus: &CharCorpus,
    prompt: &str,
    chars: usize,
    temperature: f32,
    seed: u64,
) -> Result<String> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::invalid(
            "generate",
            "temperature",
            "a finite value > 0",
            temperature,
        ));
    }
    let mut ctx = corpus.encode(prompt)?;
    if ctx.is_empty() {
        return Err(Error::invalid(
            "generate",
            "prompt",
            "at least one character",
            "\"\"",
        ));
    }
    let cfg = GptConfig {
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
        ..*cfg
    };
    let par = ParallelConfig {
        tp: 1,
        pp: 1,
        vp: 1,
        dp: 1,
        schedule: Schedule::OneFOneB,
        micro_batch: 1,
        global_batch: 1,
        recompute: Recompute::None,
        distributed_optimizer: true,
        precision: Precision::Bf16,
        sequence_parallel: false,
    };
    let world = Communicator::in_process(&[Device::emu()])?
        .pop()
        .ok_or_else(|| Error::invalid("generate", "world", "one rank", 0))?;
    let comms = RankComms::split(world, &par)?;
    let mut model = GptTrainer::<bf16>::new(&comms, &cfg, &par, &TrainConfig::default(), false)?;
    model.load_full_params(params)?;
    let mut rng = seed ^ 0x2545_F491_4F6C_DD1D;
    let mut out = String::new();
    for _ in 0..chars {
        let start = ctx.len().saturating_sub(cfg.seq);
        let window = &ctx[start..];
        let mut ids = window.to_vec();
        ids.resize(cfg.seq, 0);
        let logits = model.forward_logits(&ids)?;
        let row = &logits[(window.len() - 1) * cfg.vocab..window.len() * cfg.vocab];
        let next = sample_row(row, temperature, &mut rng);
        ctx.push(next as i32);
        out.push_str(&corpus.decode(&[next as i32]));
    }
    Ok(out)
}

/// An index drawn from `softmax(row / temperature)` (xorshift64*).
fn sample_row(row: &[f32], temperature: f32, state: &mut u64) -> usize {
    let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = row
        .iter()
        .map(|&x| (((x - max) / temperature) as f64).exp())
        .collect();
    let total: f64 = w.iter().sum();
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    let u = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
    let mut acc = 0.0;
    for (i, x) in w.iter().enumerate() {
        acc += x / total;
        if u < acc {
            return i;
        }
    }
    w.len() - 1
}
