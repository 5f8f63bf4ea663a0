//! What the data-parallel tests (`tests/ddp*.rs`) share: ranks run with a
//! collective timeout, seeded parameter and gradient values, and the step
//! of their single-rank references that turns every rank's gradients into
//! the full one (mean over ranks, global norm, optional clip).

use std::time::Duration;

use ferrotron::comm::Communicator;
use ferrotron::ops::multi_tensor::{GradRef, MultiTensor, TensorRef};
use ferrotron::{DeviceBuffer, Stream};

/// The collective timeout of the data-parallel tests' communicators: a hung
/// rank fails the test instead of hanging it.
pub const RANK_TIMEOUT: Duration = Duration::from_secs(60);

/// `f(comm)` on every rank of an `n`-rank in-process communicator with
/// [`RANK_TIMEOUT`]; the results in rank order.
pub fn run_ranks<R: Send>(n: usize, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    super::ranks::run_ranks_with_timeout(n, RANK_TIMEOUT, f)
}

/// Deterministic values in [-2, 2) from a key (xorshift64).
pub fn values(key: u64, len: usize) -> Vec<f64> {
    let mut s = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect()
}

/// The gradient rank `rank` produces for parameter `p` in step (or
/// micro-batch) `step`.
pub fn grad_of(seed: u64, rank: usize, step: usize, p: usize, len: usize) -> Vec<f64> {
    values(
        seed ^ ((rank as u64) << 40) ^ ((step as u64) << 32) ^ ((p as u64) << 16),
        len,
    )
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A single-rank reference's gradients for `step`: for each parameter (of
/// `lens[p]` elements) the f64 mean over `dp` ranks of [`grad_of`],
/// uploaded as f32; their global L2 norm into `norm`; clipped to
/// `max_norm` when given.
pub fn reference_grads(
    s: &Stream,
    mt: &mut MultiTensor,
    norm: &mut DeviceBuffer<f32>,
    (seed, dp, step): (u64, usize, usize),
    lens: &[usize],
    max_norm: Option<f64>,
) -> Vec<DeviceBuffer<f32>> {
    let dev = s.device();
    let mut grads: Vec<_> = lens
        .iter()
        .enumerate()
        .map(|(p, &len)| {
            let mut g = vec![0.0f64; len];
            for r in 0..dp {
                g.iter_mut()
                    .zip(grad_of(seed, r, step, p, len))
                    .for_each(|(a, b)| *a += b / dp as f64);
            }
            dev.upload(&g.iter().map(|&x| x as f32).collect::<Vec<_>>())
                .unwrap()
        })
        .collect();
    {
        let list: Vec<TensorRef<'_>> = grads.iter().map(TensorRef::from).collect();
        mt.l2_norm(s, &list, norm).unwrap();
    }
    if let Some(max) = max_norm {
        let mut list: Vec<GradRef<'_>> = grads.iter_mut().map(GradRef::from).collect();
        mt.clip_by_norm(s, &mut list, norm, max).unwrap();
    }
    grads
}
