//! Resuming a GPT checkpoint on another model-parallel layout: a checkpoint
//! directory holds one file per (tp, pp) rank of the run that saved it
//! (`tp{t}_pp{p}.safetensors`, per-parameter tensors named by parameter
//! name; the data-parallel size never mattered). A rank of a run with
//! another `tp` or `pp` builds, in memory, the tensors it would have saved
//! itself from those, and hands them to the loader: each tensor (the parameter, its fp32 master, both Adam moments)
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
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors};

use crate::core::{Error, Result};
use crate::parallel::ddp::checkpoint::HostTensors;
use crate::parallel::vocab::padded_vocab_size;

use super::checkpoint_dir::{rank_file, saved_layout};
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

/// One parameter of the resuming rank: its name and shard shape.
pub(crate) struct WantedParam<'a> {
    pub name: &'a str,
    pub shape: &'a [usize],
}

fn unreadable(f: &Path, e: impl std::fmt::Display) -> Error {
    Error::invalid(
        OP,
        "checkpoint",
        "readable safetensors rank files",
        format!("'{}': {e}", f.display()),
    )
}

/// The parameter names a rank file holds, from its header alone (the
/// `model/<name>` keys of its JSON), without reading the tensors.
fn header_names(f: &Path) -> Result<Vec<String>> {
    use std::io::Read;
    let mut file = std::fs::File::open(f).map_err(|e| unreadable(f, e))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| unreadable(f, e))?;
    let n = usize::try_from(u64::from_le_bytes(len))
        .ok()
        .filter(|&n| n <= 100 << 20)
        .ok_or_else(|| unreadable(f, "a header length past 100 MiB"))?;
    let mut header = vec![0u8; n];
    file.read_exact(&mut header).map_err(|e| unreadable(f, e))?;
    let text = String::from_utf8(header).map_err(|e| unreadable(f, e))?;
    Ok(text
        .split("\"model/")
        .skip(1)
        .filter_map(|rest| rest.split_once('"').map(|(name, _)| name.to_string()))
        .collect())
}

/// The saved files of a checkpoint the resuming rank needs: every
/// tensor-parallel file of the stages holding its parameters, and stage
/// 0's (the step count, the word embedding).
struct Saved {
    tp: usize,
    pp: usize,
    /// `[pp][tp]` file contents; stages not needed stay empty.
    bytes: Vec<Vec<Vec<u8>>>,
    /// The stage holding each saved parameter.
    stage_of: HashMap<String, usize>,
}

impl Saved {
    fn read(dir: &Path, (tp, pp): (usize, usize), wanted: &[WantedParam<'_>]) -> Result<Self> {
        let mut stage_of = HashMap::new();
        for p in 0..pp {
            for name in header_names(&rank_file(dir, 0, p))? {
                stage_of.insert(name, p);
            }
        }
        let mut needed = vec![false; pp];
        needed[0] = true;
        for w in wanted {
            if let Some(&p) = stage_of.get(w.name) {
                needed[p] = true;
            }
        }
        let mut bytes = Vec::with_capacity(pp);
        for (p, &need) in needed.iter().enumerate() {
            let row = if need {
                (0..tp)
                    .map(|t| {
                        let f = rank_file(dir, t, p);
                        std::fs::read(&f).map_err(|e| unreadable(&f, e))
                    })
                    .collect::<Result<Vec<_>>>()?
            } else {
                Vec::new()
            };
            bytes.push(row);
        }
        Ok(Saved {
            tp,
            pp,
            bytes,
            stage_of,
        })
    }

    /// The files read, parsed (`[pp][tp]`; stages not read are empty).
    fn parse(&self) -> Result<Vec<Vec<SafeTensors<'_>>>> {
        self.bytes
            .iter()
            .map(|row| {
                row.iter()
                    .map(|b| {
                        SafeTensors::deserialize(b)
                            .map_err(|e| unreadable(Path::new("a rank file"), e))
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

/// The checkpoint tensors rank `tp_rank` of `tp` would have saved, built
/// in memory from the checkpoint in `dir` saved on another layout, for the
/// parameters `wanted` (this rank's registry: names and shard shapes).
pub(crate) fn rank_tensors(
    cfg: &GptConfig,
    dir: &Path,
    (tp, tp_rank): (usize, usize),
    wanted: &[WantedParam<'_>],
) -> Result<HostTensors> {
    let saved = Saved::read(dir, saved_layout(dir)?, wanted)?;
    let files = saved.parse()?;
    let stage_of = &saved.stage_of;
    let mut tensors = HostTensors::default();
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
            let (dtype, bytes) = cut(cfg, whole, w, (tp, tp_rank))?;
            tensors.push(format!("{kind}/{}", w.name), dtype, w.shape.to_vec(), bytes);
        }
    }
    let step = files[0][0]
        .tensor("optimizer/step")
        .map_err(|e| Error::invalid(OP, "checkpoint", "an optimizer/step tensor", e))?;
    tensors.push(
        "optimizer/step".into(),
        step.dtype(),
        step.shape().to_vec(),
        step.data().to_vec(),
    );
    Ok(tensors)
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

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    /// The header scan finds exactly the `model/` parameter names.
    #[test]
    fn header_names_lists_the_parameters() {
        let data = [0u8; 8];
        let t = |n: &str| {
            (
                n.to_string(),
                TensorView::new(Dtype::F32, vec![2], &data).unwrap(),
            )
        };
        let tensors = vec![
            t("model/layers.1.ln1.weight"),
            t("optimizer/master/layers.1.ln1.weight"),
            t("model/embedding.word"),
            t("optimizer/exp_avg/embedding.word"),
        ];
        let bytes = safetensors::serialize(tensors, &None).unwrap();
        let f = std::env::temp_dir().join(format!("ftn-header-{}.safetensors", std::process::id()));
        std::fs::write(&f, bytes).unwrap();
        let mut names = header_names(&f).unwrap();
        let _ = std::fs::remove_file(&f);
        names.sort();
        assert_eq!(names, ["embedding.word", "layers.1.ln1.weight"]);
    }
}
