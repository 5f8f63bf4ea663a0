//! Named RNG streams for dropout, after Megatron's `CudaRNGStatesTracker`:
//! every stream is a Philox seed plus an offset into it (see
//! [`crate::core::philox`]). [`RngTracker::next`] hands out the `(seed,
//! offset)` of a call and advances the offset past the random values the call
//! consumes (rounded up to whole Philox blocks of 4), so no two calls of a
//! stream ever share random values.
//!
//! [`RngTracker::megatron`] makes Megatron's two streams: the default /
//! data-parallel stream seeded `seed` (identical on every tensor-parallel
//! rank: dropout of replicated activations) and the model-parallel stream
//! seeded `seed + 2718 + tp_rank` (different on every tensor-parallel rank:
//! dropout of sharded activations, e.g. attention probabilities).
//! Fork / restore of states is not provided; `get` and `set_offset` are
//! enough to checkpoint and replay.

use alloc::string::String;
use alloc::vec::Vec;

use super::{Error, Result};

/// Megatron's default stream name.
pub const DEFAULT_STREAM: &str = "default";
/// Megatron's `_MODEL_PARALLEL_RNG_TRACKER_NAME`.
pub const MODEL_PARALLEL_STREAM: &str = "model-parallel-rng";
/// Megatron's offset between the data- and model-parallel seeds.
pub const MODEL_PARALLEL_SEED_OFFSET: u64 = 2718;

/// The Philox position one op call uses: element `i` draws random value
/// `offset + i` of stream `seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PhiloxState {
    pub seed: u64,
    pub offset: u64,
}

/// Random values a call drawing `n` of them consumes: `n` rounded up to a
/// whole number of Philox blocks (4 words).
pub fn consumed(n: u64) -> Option<u64> {
    n.checked_add(3).map(|m| m & !3)
}

/// Named Philox streams.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RngTracker {
    streams: Vec<(String, PhiloxState)>,
}

const OP: &str = "rng_tracker";

impl RngTracker {
    /// No streams.
    pub fn new() -> Self {
        RngTracker::default()
    }

    /// Megatron's `model_parallel_cuda_manual_seed(seed)` on tensor-parallel
    /// rank `tp_rank`: [`DEFAULT_STREAM`] seeded `seed`,
    /// [`MODEL_PARALLEL_STREAM`] seeded `seed + 2718 + tp_rank` (wrapping).
    pub fn megatron(seed: u64, tp_rank: u64) -> Self {
        let mut t = RngTracker::new();
        t.streams
            .push((DEFAULT_STREAM.into(), PhiloxState { seed, offset: 0 }));
        let mp = seed
            .wrapping_add(MODEL_PARALLEL_SEED_OFFSET)
            .wrapping_add(tp_rank);
        t.streams.push((
            MODEL_PARALLEL_STREAM.into(),
            PhiloxState {
                seed: mp,
                offset: 0,
            },
        ));
        t
    }

    /// Adds stream `name` at offset 0. A name already present is an error
    /// (as in Megatron's tracker).
    pub fn add(&mut self, name: &str, seed: u64) -> Result<()> {
        if self.find(name).is_some() {
            return Err(Error::invalid(
                OP,
                "name",
                "a stream name not yet added",
                alloc::format!("{name:?}, already present"),
            ));
        }
        self.streams
            .push((name.into(), PhiloxState { seed, offset: 0 }));
        Ok(())
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.streams.iter().position(|(n, _)| n == name)
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.find(name).ok_or_else(|| {
            let names: Vec<&str> = self.streams.iter().map(|(n, _)| n.as_str()).collect();
            Error::invalid(
                OP,
                "name",
                alloc::format!("one of {names:?}"),
                alloc::format!("{name:?}"),
            )
        })
    }

    /// The current state of stream `name` (nothing is consumed).
    pub fn get(&self, name: &str) -> Result<PhiloxState> {
        Ok(self.streams[self.index(name)?].1)
    }

    /// Moves stream `name` to `offset` (restoring a checkpoint).
    pub fn set_offset(&mut self, name: &str, offset: u64) -> Result<()> {
        let i = self.index(name)?;
        self.streams[i].1.offset = offset;
        Ok(())
    }

    /// The state for a call drawing `n` random values from stream `name`,
    /// advancing the stream by `n` rounded up to a multiple of 4. An offset
    /// that would pass `u64::MAX` is an error (the stream is exhausted).
    pub fn next(&mut self, name: &str, n: u64) -> Result<PhiloxState> {
        let i = self.index(name)?;
        let state = self.streams[i].1;
        let next = consumed(n)
            .and_then(|c| state.offset.checked_add(c))
            .ok_or_else(|| {
                Error::invalid(
                    OP,
                    "n",
                    "a draw that fits in the stream's 2^64 values",
                    alloc::format!("{n} values at offset {}", state.offset),
                )
            })?;
        self.streams[i].1.offset = next;
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_seeds_and_advancing_offsets() {
        let mut t = RngTracker::megatron(1234, 3);
        assert_eq!(t.get(DEFAULT_STREAM).unwrap().seed, 1234);
        assert_eq!(t.get(MODEL_PARALLEL_STREAM).unwrap().seed, 1234 + 2718 + 3);
        let a = t.next(DEFAULT_STREAM, 10).unwrap();
        let b = t.next(DEFAULT_STREAM, 4).unwrap();
        let c = t.next(DEFAULT_STREAM, 0).unwrap();
        let d = t.next(DEFAULT_STREAM, 1).unwrap();
        assert_eq!((a.offset, b.offset, c.offset, d.offset), (0, 12, 16, 16));
        assert_eq!(t.get(DEFAULT_STREAM).unwrap().offset, 20);
        // Streams advance independently.
        assert_eq!(t.get(MODEL_PARALLEL_STREAM).unwrap().offset, 0);
        t.set_offset(DEFAULT_STREAM, 4).unwrap();
        assert_eq!(t.next(DEFAULT_STREAM, 3).unwrap().offset, 4);
    }

    #[test]
    fn errors_name_the_problem() {
        let mut t = RngTracker::megatron(1, 0);
        let e = t.next("nope", 1).unwrap_err().to_string();
        assert!(
            e.contains("nope") && e.contains(MODEL_PARALLEL_STREAM),
            "{e}"
        );
        let e = t.add(DEFAULT_STREAM, 5).unwrap_err().to_string();
        assert!(e.contains("already present"), "{e}");
        t.add("extra", 5).unwrap();
        t.set_offset("extra", u64::MAX - 8).unwrap();
        assert_eq!(t.next("extra", 8).unwrap().offset, u64::MAX - 8);
        assert!(t.next("extra", 1).is_err());
    }
}
