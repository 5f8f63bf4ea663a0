//! Running one closure per rank of an in-process communicator, each on its
//! own thread (a rank may block the host while its peers enqueue their half
//! of a collective), and the small dense f64 products the parallel-layer
//! tests build their unsharded references from.

use std::time::Duration;

use ferrotron::comm::Communicator;
use ferrotron::Device;

/// `f(comm)` for every rank of an `n`-rank in-process communicator on
/// emulator devices, each on its own thread; the results in rank order.
pub fn run_ranks<R: Send>(n: usize, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    let devices: Vec<Device> = (0..n).map(|_| Device::emu()).collect();
    on_ranks(Communicator::in_process(&devices).unwrap(), f)
}

/// As [`run_ranks`] with the communicator's collective timeout set.
pub fn run_ranks_with_timeout<R: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    let devices: Vec<Device> = (0..n).map(|_| Device::emu()).collect();
    on_ranks(
        Communicator::in_process_with_timeout(&devices, timeout).unwrap(),
        f,
    )
}

fn on_ranks<R: Send>(comms: Vec<Communicator>, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `a [m, k] x b^T` with `b [n, k]`.
pub fn mm_bt(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|l| a[i * k + l] * b[j * k + l]).sum();
        }
    }
    c
}

/// `a [m, k] x b [k, n]`.
pub fn mm(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for l in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + l] * b[l * n + j];
            }
        }
    }
    c
}

/// `a^T b`, `a [k, m]`, `b [k, n]`.
pub fn mm_at(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for l in 0..k {
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] += a[l * m + i] * b[l * n + j];
            }
        }
    }
    c
}

/// Column sums of a row-major `[rows, cols]` matrix.
pub fn col_sums(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..cols)
        .map(|j| (0..rows).map(|i| a[i * cols + j]).sum())
        .collect()
}
