//! A GPT checkpoint directory's layout: per model-parallel rank `(t, p)`
//! of the run that saved it, `tp{t}_pp{p}.safetensors` (the optimizer
//! checkpoint of `parallel::ddp::checkpoint`, written by data-parallel
//! rank 0) and `tp{t}_pp{p}.state` (the trainer's step and loss-scaler
//! state). The data-parallel size leaves no trace in it.

use std::path::{Path, PathBuf};

use crate::core::{Error, Result};

/// The optimizer checkpoint file of model-parallel rank `(tp, pp)` in `dir`.
pub(crate) fn rank_file(dir: &Path, tp: usize, pp: usize) -> PathBuf {
    dir.join(format!("tp{tp}_pp{pp}.safetensors"))
}

/// The step and loss-scaler state file of model-parallel rank `(tp, pp)`.
pub(crate) fn state_file(dir: &Path, tp: usize, pp: usize) -> PathBuf {
    dir.join(format!("tp{tp}_pp{pp}.state"))
}

/// The `(tp, pp)` of the run that saved the GPT checkpoint in `dir`: the
/// grid its `tp{t}_pp{p}.safetensors` files cover (all of it, or a named
/// error). A run on another layout reshards it when it resumes.
pub fn saved_layout(dir: &Path) -> Result<(usize, usize)> {
    let bad = |what: String| {
        Error::invalid(
            "GptTrainer::load",
            "checkpoint",
            "a checkpoint directory",
            what,
        )
    };
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
