//! Resuming a GPT checkpoint on another model-parallel layout: a checkpoint
//! directory holds one file per (tp, pp) rank of the run that saved it
//! (`tp{t}_pp{p}.safetensors`, per-parameter tensors named by parameter
//! name; the data-parallel size never mattered). A rank of a run with
//! another `tp` or `pp` builds the file it would have saved itself from
//! those: each tensor (the parameter, its fp32 master, both Adam moments)
//! joined over the saved tensor-parallel shards into the whole tensor, then
//! cut to this rank's shard, byte for byte (no value is converted). Layers
//! move between pipeline stages by name (`layers.{i}.…`, global indices);
//! the last stage's tied copy of the word embedding (`output.word`, only
//! at `pp > 1`) is taken from `embedding.word` when the saved run had none
//! (the two copies are equal: their gradients are summed every step).
//!
//! The padded vocabulary is a multiple of `128 · tp`, so it changes with
//! `tp`: the real rows move exactly; padding rows both layouts have are
//! kept, and rows only the new layout has are zero, as a fresh model's
//! padding rows are. (Padding logits take part in the softmax, as in
//! Megatron, so a model whose padded vocabulary grows computes a slightly
//! different loss; with a vocabulary already a multiple of `128 · tp` for
//! both layouts nothing changes.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::core::{Error, Result};
use crate::parallel::ddp::CHECKPOINT_FORMAT;
use crate::parallel::vocab::padded_vocab_size;

use super::config::GptConfig;
use super::world::{split_of, Split};

const OP: &str = "GptTrainer::load (resharding)";

/// The four tensors saved per parameter.
const KINDS: [&str; 4] = [
    "model",
    "optimizer/master",
    "optimizer/exp_avg",
    "optimizer/exp_avg_sq",
];

/// The checkpoint file of model-parallel rank `(tp, pp)` in `dir`.
pub(crate) fn rank_file(dir: &Path, tp: usize, pp: usize) -> PathBuf {
    dir.join(format!("tp{tp}_pp{pp}.safetensors"))
}

/// The `(tp, pp)` of the run that saved `dir`: the grid its
/// `tp{t}_pp{p}.safetensors` files cover (all of it, or a named error).
pub(crate) fn saved_layout(dir: &Path) -> Result<(usize, usize)> {
    let bad = |what: String| Error::invalid(OP, "checkpoint", "a checkpoint directory", what);
    let entries = std::fs::read_dir(dir).map_err(|e| bad(format!("'{}': {e}", dir.display())))?;
    let mut ranks = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let parsed = name
            .strip_prefix("tp")
            .and_then(|r| r.strip_suffix(".safetensors"))
            .and_then(|r| r.split_once("_pp"))
            .and_then(|(t, p)| Some((t.parse::<usize>().ok()?, p.parse::<usize>().ok()?)));
        ranks.extend(parsed);
    }
    let tp = ranks.iter().map(|r| r.0 + 1).max().unwrap_or(0);
    let pp = ranks.iter().map(|r| r.1 + 1).max().unwrap_or(0);
    if tp == 0 || ranks.len() != tp * pp {
        return Err(bad(format!(
            "'{}' with {} rank files, not a full tp x pp grid",
            dir.display(),
            ranks.len()
        )));
    }
    Ok((tp, pp))
}

/// One parameter of the resuming rank: its name and shard shape.
pub(crate) struct WantedParam<'a> {
    pub name: &'a str,
    pub shape: &'a [usize],
}

/// The saved files of a checkpoint, read.
struct Saved {
    tp: usize,
    pp: usize,
    /// `[pp][tp]` file contents.
    bytes: Vec<Vec<Vec<u8>>>,
}

impl Saved {
    fn read(dir: &Path, (tp, pp): (usize, usize)) -> Result<Self> {
        let mut bytes = Vec::with_capacity(pp);
        for p in 0..pp {
            let mut row = Vec::with_capacity(tp);
            for t in 0..tp {
                let f = rank_file(dir, t, p);
                row.push(std::fs::read(&f).map_err(|e| {
                    Error::invalid(
                        OP,
                        "checkpoint",
                        "readable rank files",
                        format!("'{}': {e}", f.display()),
                    )
                })?);
            }
            bytes.push(row);
        }
        Ok(Saved { tp, pp, bytes })
    }

    fn parse(&self) -> Result<Vec<Vec<SafeTensors<'_>>>> {
        self.bytes
            .iter()
            .map(|row| {
                row.iter()
                    .map(|b| {
                        SafeTensors::deserialize(b).map_err(|e| {
                            Error::invalid(OP, "checkpoint", "safetensors rank files", e)
                        })
                    })
                    .collect()
            })
            .collect()
    }
}

/// A whole tensor in bytes: `rows` rows of `row_bytes`.
struct Whole {
    dtype: Dtype,
    bytes: Vec<u8>,
    rows: usize,
}

/// Builds this rank's checkpoint file (tensor-parallel rank `tp_rank` of
/// `tp`) from the checkpoint in `dir` saved on another layout, with the
/// parameters `wanted` (this rank's registry: names and shard shapes),
/// writing it to `out`.
pub(crate) fn build_rank_file(
    cfg: &GptConfig,
    dir: &Path,
    (tp, tp_rank): (usize, usize),
    wanted: &[WantedParam<'_>],
    out: &Path,
) -> Result<()> {
    let saved = Saved::read(dir, saved_layout(dir)?)?;
    let files = saved.parse()?;
    // Which stage's files hold each saved parameter.
    let mut stage_of: HashMap<String, usize> = HashMap::new();
    for (p, row) in files.iter().enumerate() {
        for name in row[0].names() {
            if let Some(n) = name.strip_prefix("model/") {
                stage_of.insert(n.to_string(), p);
            }
        }
    }
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for w in wanted {
        // The tied copy comes from the embedding when the saved run had none.
        let source = if w.name == "output.word" && !stage_of.contains_key(w.name) {
            "embedding.word"
        } else {
            w.name
        };
        let p = *stage_of.get(source).ok_or_else(|| {
            Error::invalid(
                OP,
                "checkpoint",
                format!("a checkpoint of this model (parameter '{}')", w.name),
                format!("none in the {} x {} saved files", saved.tp, saved.pp),
            )
        })?;
        for kind in KINDS {
            let whole = join(&files[p], kind, source, saved.tp)?;
            let shard = cut(cfg, whole, w, (tp, tp_rank))?;
            tensors.push((
                format!("{kind}/{}", w.name),
                shard.0,
                w.shape.to_vec(),
                shard.1,
            ));
        }
    }
    let step = files[0][0]
        .tensor("optimizer/step")
        .map_err(|e| Error::invalid(OP, "checkpoint", "an optimizer/step tensor", e))?;
    tensors.push((
        "optimizer/step".into(),
        step.dtype(),
        step.shape().to_vec(),
        step.data().to_vec(),
    ));
    let views = tensors
        .iter()
        .map(|(n, d, s, b)| {
            TensorView::new(*d, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::invalid(OP, "checkpoint", "consistent tensors", e))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta: HashMap<String, String> = [
        ("format".to_string(), CHECKPOINT_FORMAT.to_string()),
        (
            "resharded_from".to_string(),
            format!("tp {} pp {}", saved.tp, saved.pp),
        ),
    ]
    .into_iter()
    .collect();
    let bytes = safetensors::serialize(views, &Some(meta))
        .map_err(|e| Error::invalid(OP, "checkpoint", "tensors safetensors can write", e))?;
    std::fs::write(out, bytes).map_err(|e| Error::Backend {
        backend: "filesystem",
        message: format!("{}: {e}", out.display()),
    })
}

/// `kind/name` joined over the saved tensor-parallel shards of one stage.
fn join(stage: &[SafeTensors<'_>], kind: &str, name: &str, tp: usize) -> Result<Whole> {
    let key = format!("{kind}/{name}");
    let parts = stage
        .iter()
        .map(|f| {
            f.tensor(&key).map_err(|_| {
                Error::invalid(
                    OP,
                    "checkpoint",
                    format!("a tensor '{key}' in every rank file of its stage"),
                    "missing",
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let dtype = parts[0].dtype();
    let shape = parts[0].shape().to_vec();
    if parts
        .iter()
        .any(|t| t.dtype() != dtype || t.shape() != shape.as_slice())
    {
        return Err(Error::invalid(
            OP,
            "checkpoint",
            format!("shards of '{key}' of one dtype and shape"),
            "shards that differ",
        ));
    }
    let rows = shape.first().copied().unwrap_or(1);
    let (bytes, rows) = match split_of(name) {
        Split::Replicated => (parts[0].data().to_vec(), rows),
        Split::Rows => (
            parts
                .iter()
                .flat_map(|t| t.data().iter().copied())
                .collect(),
            rows * tp,
        ),
        Split::Cols => {
            let row_bytes = parts[0].data().len() / rows.max(1);
            let mut v = Vec::with_capacity(row_bytes * rows * tp);
            for i in 0..rows {
                for t in &parts {
                    v.extend_from_slice(&t.data()[i * row_bytes..(i + 1) * row_bytes]);
                }
            }
            (v, rows)
        }
    };
    Ok(Whole { dtype, bytes, rows })
}

/// This rank's shard of `whole` for parameter `w`: `(dtype, bytes)`, the
/// word embedding re-padded to this layout's padded vocabulary first.
fn cut(
    cfg: &GptConfig,
    mut whole: Whole,
    w: &WantedParam<'_>,
    (tp, rank): (usize, usize),
) -> Result<(Dtype, Vec<u8>)> {
    let numel: usize = w.shape.iter().product();
    let elem = whole.dtype.size();
    if w.name == "embedding.word" || w.name == "output.word" {
        let padded = padded_vocab_size(cfg.vocab, tp).ok_or_else(|| {
            Error::invalid(OP, "vocab", "a vocabulary that can be padded", cfg.vocab)
        })?;
        let row_bytes = whole.bytes.len() / whole.rows.max(1);
        whole.bytes.resize(padded * row_bytes, 0);
        whole.rows = padded;
    }
    let rows_whole = whole.rows;
    let shard = match split_of(w.name) {
        Split::Replicated => whole.bytes,
        Split::Rows => {
            let n = whole.bytes.len() / tp;
            whole.bytes[rank * n..(rank + 1) * n].to_vec()
        }
        Split::Cols => {
            let row_bytes = whole.bytes.len() / rows_whole.max(1);
            let mine = row_bytes / tp;
            (0..rows_whole)
                .flat_map(|i| {
                    let at = i * row_bytes + rank * mine;
                    whole.bytes[at..at + mine].iter().copied()
                })
                .collect()
        }
    };
    if shard.len() != numel * elem {
        return Err(Error::invalid(
            OP,
            "checkpoint",
            format!(
                "'{}' of {numel} elements on this layout ({:?})",
                w.name, w.shape
            ),
            format!(
                "{} elements from the saved shards",
                shard.len() / elem.max(1)
            ),
        ));
    }
    Ok((whole.dtype, shard))
}
