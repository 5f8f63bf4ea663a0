//! Stage layouts: which of the model's layers each pipeline stage holds.
//!
//! The model is an ordered list of named layers (typically `embedding`,
//! `decoder 0` … `decoder L−1`, `loss`). A layout assigns them to the
//! `pp · vp` global stages (stage `s` lives on pipeline rank `s mod pp`
//! as its chunk `s / pp`, see [`super`]): every layer exactly once, in
//! model order, each stage a contiguous run of layers, no stage empty.
//!
//! * [`StageLayout::from_assignment`] checks an explicit assignment; each
//!   broken rule is an [`Error::InvalidArgument`] naming the layer and the
//!   stage (a dropped layer, a layer assigned twice, an unknown layer,
//!   layers out of order, an empty stage, a stage count other than
//!   `pp · vp`).
//! * [`StageLayout::even`] is Megatron's split ([`EvenSplit`]): the
//!   decoder layers evenly over the pipeline ranks and each rank's share
//!   evenly over its `vp` chunks, optionally with the embedding and the loss
//!   counted as one layer each (`account_for_embedding_in_pipeline_split`,
//!   `account_for_loss_in_pipeline_split`), or with a given number of
//!   decoder layers on the first and/or last pipeline rank
//!   (`decoder_first_pipeline_num_layers`,
//!   `decoder_last_pipeline_num_layers`); the embedding is always on the
//!   first stage and the loss on the last.
//!
//! Empty stages are refused: a stage without layers would still cost a
//! transfer and a slot in every schedule step for nothing; use fewer stages
//! (or a smaller `vp`) instead.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::ops::Range;

use crate::core::{Error, Result};

/// The `op` name of every error of this module.
const OP: &str = "pipeline stage layout";

/// A checked assignment of the model's layers to the global stages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageLayout {
    layers: Vec<String>,
    /// `ranges[s]`: the indices into `layers` of stage `s`.
    ranges: Vec<Range<usize>>,
}

/// Megatron's even split of `decoder_layers` decoder layers between an
/// embedding (first stage) and a loss / output layer (last stage) over
/// `pp · vp` stages. See [`StageLayout::even`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvenSplit {
    pub decoder_layers: usize,
    pub pp: usize,
    /// Chunks (virtual stages) per pipeline rank, `>= 1`.
    pub vp: usize,
    /// Count the embedding as one layer of the first stage
    /// (`account_for_embedding_in_pipeline_split`).
    pub account_for_embedding: bool,
    /// Count the loss as one layer of the last stage
    /// (`account_for_loss_in_pipeline_split`).
    pub account_for_loss: bool,
    /// Decoder layers on the first pipeline rank (over its `vp` chunks;
    /// `decoder_first_pipeline_num_layers`).
    pub first_rank_layers: Option<usize>,
    /// Decoder layers on the last pipeline rank
    /// (`decoder_last_pipeline_num_layers`).
    pub last_rank_layers: Option<usize>,
}

impl EvenSplit {
    /// `decoder_layers` over `pp · vp` stages, no accounting, no uneven ends.
    pub fn new(decoder_layers: usize, pp: usize, vp: usize) -> Self {
        EvenSplit {
            decoder_layers,
            pp,
            vp,
            account_for_embedding: false,
            account_for_loss: false,
            first_rank_layers: None,
            last_rank_layers: None,
        }
    }
}

/// The layer names [`StageLayout::even`] uses: `embedding`,
/// `decoder 0` … `decoder {decoder_layers − 1}`, `loss`.
pub fn transformer_layers(decoder_layers: usize) -> Vec<String> {
    let mut v = Vec::with_capacity(decoder_layers + 2);
    v.push("embedding".to_string());
    for i in 0..decoder_layers {
        v.push(format!("decoder {i}"));
    }
    v.push("loss".to_string());
    v
}

impl StageLayout {
    /// Checks `assignment` (`assignment[s]`: the names of stage `s`'s
    /// layers, in order) against the model's `layers` for `stages = pp · vp`
    /// global stages.
    pub fn from_assignment<L, S>(layers: &[L], assignment: &[Vec<S>], stages: usize) -> Result<Self>
    where
        L: AsRef<str>,
        S: AsRef<str>,
    {
        if layers.is_empty() {
            return Err(Error::invalid(OP, "layers", "at least one layer", 0));
        }
        let names: Vec<&str> = layers.iter().map(AsRef::as_ref).collect();
        for (i, n) in names.iter().enumerate() {
            if let Some(j) = names[..i].iter().position(|m| m == n) {
                return Err(Error::invalid(
                    OP,
                    "layers",
                    "distinct layer names",
                    format!("`{n}` at positions {j} and {i}"),
                ));
            }
        }
        if assignment.len() != stages {
            return Err(Error::invalid(
                OP,
                "assignment",
                format!("{stages} stages (pp · vp)"),
                format!("{} stages", assignment.len()),
            ));
        }
        // stage_of[layer]: the stage it was assigned to.
        let mut stage_of: Vec<Option<usize>> = alloc::vec![None; names.len()];
        let mut order = Vec::with_capacity(names.len());
        for (s, st) in assignment.iter().enumerate() {
            if st.is_empty() {
                return Err(Error::invalid(
                    OP,
                    "assignment",
                    "at least one layer per stage (an empty stage would only forward \
                     activations; use fewer stages)",
                    format!("stage {s} is empty"),
                ));
            }
            for l in st {
                let l = l.as_ref();
                let i = names.iter().position(|n| *n == l).ok_or_else(|| {
                    Error::invalid(
                        OP,
                        "assignment",
                        "layers of the model",
                        format!("unknown layer `{l}` in stage {s}"),
                    )
                })?;
                if let Some(prev) = stage_of[i] {
                    return Err(Error::invalid(
                        OP,
                        "assignment",
                        "every layer exactly once",
                        format!("layer `{l}` duplicated (stage {prev} and stage {s})"),
                    ));
                }
                stage_of[i] = Some(s);
                order.push(i);
            }
        }
        if let Some(i) = stage_of.iter().position(Option::is_none) {
            return Err(Error::invalid(
                OP,
                "assignment",
                "every layer exactly once",
                format!("layer `{}` dropped (in no stage)", names[i]),
            ));
        }
        // Every layer once: `order` is a permutation; model order with
        // contiguous stages means it is the identity.
        if let Some(k) = order.iter().enumerate().position(|(k, &i)| k != i) {
            let b = order[k];
            let got = match k.checked_sub(1).map(|j| order[j]) {
                Some(a) => format!(
                    "layer `{}` (stage {}) follows `{}` (stage {})",
                    names[b],
                    stage_of[b].unwrap_or(0),
                    names[a],
                    stage_of[a].unwrap_or(0)
                ),
                None => format!(
                    "layer `{}` (stage {}) comes first instead of `{}`",
                    names[b],
                    stage_of[b].unwrap_or(0),
                    names[0]
                ),
            };
            return Err(Error::invalid(
                OP,
                "assignment",
                "layers in model order, each stage a contiguous run",
                got,
            ));
        }
        let mut ranges = Vec::with_capacity(stages);
        let mut start = 0;
        for st in assignment {
            ranges.push(start..start + st.len());
            start += st.len();
        }
        Ok(StageLayout {
            layers: names.iter().map(|n| n.to_string()).collect(),
            ranges,
        })
    }

    /// Megatron's even split over the layers of
    /// [`transformer_layers`]`(split.decoder_layers)`.
    ///
    /// Per pipeline rank: with `first_rank_layers` / `last_rank_layers`
    /// those ranks get that many decoder layers and the other ranks share
    /// the rest evenly; otherwise `decoder_layers` (plus one for each of the
    /// embedding and the loss when accounted for) is shared evenly. Each
    /// rank's share is shared evenly by its `vp` chunks; then the first
    /// stage gives up one decoder layer for the embedding and the last
    /// one for the loss when they are accounted for. Every division must be
    /// exact and every stage must end up with at least one layer
    /// (embedding and loss count); otherwise a named error.
    pub fn even(split: &EvenSplit) -> Result<Self> {
        let EvenSplit {
            decoder_layers: n,
            pp,
            vp,
            account_for_embedding: emb,
            account_for_loss: loss,
            first_rank_layers: first,
            last_rank_layers: last,
        } = *split;
        if pp < 1 {
            return Err(Error::invalid(OP, "pp", ">= 1", pp));
        }
        if vp < 1 {
            return Err(Error::invalid(OP, "vp", ">= 1", vp));
        }
        if (first.is_some() || last.is_some()) && (emb || loss) {
            return Err(Error::invalid(
                OP,
                "first_rank_layers / last_rank_layers",
                "not combined with account_for_embedding / account_for_loss (as in Megatron)",
                "both",
            ));
        }
        let per_rank: Vec<usize> = if first.is_some() || last.is_some() {
            let uneven = usize::from(first.is_some()) + usize::from(last.is_some());
            if pp < 2 {
                return Err(Error::invalid(
                    OP,
                    "pp",
                    ">= 2 with first_rank_layers / last_rank_layers",
                    pp,
                ));
            }
            let fixed = first.unwrap_or(0) + last.unwrap_or(0);
            if fixed > n {
                return Err(Error::invalid(
                    OP,
                    "first_rank_layers + last_rank_layers",
                    format!("<= decoder_layers = {n}"),
                    fixed,
                ));
            }
            let rest = n - fixed;
            let middle = pp - uneven;
            let each = if middle == 0 {
                if rest != 0 {
                    return Err(Error::invalid(
                        OP,
                        "decoder_layers",
                        format!(
                            "first_rank_layers + last_rank_layers = {fixed} (no other rank \
                             at pp = {pp})"
                        ),
                        n,
                    ));
                }
                0
            } else {
                if rest % middle != 0 {
                    return Err(Error::invalid(
                        OP,
                        "decoder_layers",
                        format!(
                            "the layers not on the first/last rank ({rest}) divisible by \
                             the {middle} other ranks"
                        ),
                        n,
                    ));
                }
                rest / middle
            };
            (0..pp)
                .map(|r| match (r, first, last) {
                    (0, Some(f), _) => f,
                    (r, _, Some(l)) if r == pp - 1 => l,
                    _ => each,
                })
                .collect()
        } else {
            let units = n + usize::from(emb) + usize::from(loss);
            if units % pp != 0 {
                return Err(Error::invalid(
                    OP,
                    "decoder_layers",
                    format!(
                        "decoder layers{}{} divisible by pp = {pp}",
                        if emb { " + 1 (embedding)" } else { "" },
                        if loss { " + 1 (loss)" } else { "" }
                    ),
                    format!("{n} ({units} in all)"),
                ));
            }
            alloc::vec![units / pp; pp]
        };
        for (r, &k) in per_rank.iter().enumerate() {
            if k % vp != 0 {
                return Err(Error::invalid(
                    OP,
                    "decoder_layers",
                    format!("every rank's share divisible by vp = {vp}"),
                    format!("{k} on rank {r} ({n} decoder layers)"),
                ));
            }
        }
        let stages = pp * vp;
        let mut ranges = Vec::with_capacity(stages);
        // Layer 0 is the embedding; decoder layers are 1..=n; n + 1 the loss.
        let mut next = 1;
        for s in 0..stages {
            let mut k = per_rank[s % pp] / vp;
            let mut start = next;
            if s == 0 {
                if emb {
                    k = k.checked_sub(1).ok_or_else(|| {
                        Error::invalid(
                            OP,
                            "decoder_layers",
                            "at least one layer unit on the first stage for the embedding",
                            n,
                        )
                    })?;
                }
                start = 0;
            }
            if s == stages - 1 && loss {
                k = k.checked_sub(1).ok_or_else(|| {
                    Error::invalid(
                        OP,
                        "decoder_layers",
                        "at least one layer unit on the last stage for the loss",
                        n,
                    )
                })?;
            }
            let mut end = next + k;
            if s == stages - 1 {
                end += 1;
            }
            if end == start {
                return Err(Error::invalid(
                    OP,
                    "decoder_layers",
                    "at least one layer on every stage",
                    format!("{n}: stage {s} would be empty"),
                ));
            }
            ranges.push(start..end);
            next += k;
        }
        Ok(StageLayout {
            layers: transformer_layers(n),
            ranges,
        })
    }

    /// The number of stages (`pp · vp`).
    pub fn stages(&self) -> usize {
        self.ranges.len()
    }

    /// The model's layers.
    pub fn layers(&self) -> &[String] {
        &self.layers
    }

    /// The indices into [`StageLayout::layers`] of global stage `stage`
    /// (empty if there is no such stage).
    pub fn range(&self, stage: usize) -> Range<usize> {
        self.ranges.get(stage).cloned().unwrap_or(0..0)
    }

    /// The names of global stage `stage`'s layers.
    pub fn stage_layers(&self, stage: usize) -> &[String] {
        &self.layers[self.range(stage)]
    }

    /// The stage holding layer `name`.
    pub fn stage_of(&self, name: &str) -> Option<usize> {
        let i = self.layers.iter().position(|l| l == name)?;
        self.ranges.iter().position(|r| r.contains(&i))
    }

    /// Layer counts per stage.
    pub fn counts(&self) -> Vec<usize> {
        self.ranges.iter().map(|r| r.len()).collect()
    }
}
