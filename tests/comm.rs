//! Collectives over the in-process communicator: every operation and dtype
//! against a reference computed from all ranks' inputs, awkward lengths,
//! point-to-point rings, sub-communicators from the rank grid, and the errors
//! that replace hangs and overruns (wrong lengths, mismatched collectives, a
//! dead peer). Plus overlap semantics: a communication stream ordered after a
//! compute stream by an event sees the computed data; without the wait it
//! detectably does not.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::ranks::run_ranks_with_timeout as run_ranks;
use common::Rng;
use ferrotron::comm::{CommElement, P2p, ReduceOp};
use ferrotron::core::rank_grid::{Axis, RankGrid, RankOrder};
use ferrotron::ops::BiasGelu;
use ferrotron::{Device, DeviceBuffer};
use half::{bf16, f16};

const T: Duration = Duration::from_secs(60);

/// Per-rank inputs for rank r (deterministic from the seed), as f64 too.
fn inputs<E: CommElement>(seed: u64, rank: usize, len: usize, make: fn(f64) -> E) -> Vec<E> {
    let mut r = RngFrom(seed ^ (rank as u64 + 1).wrapping_mul(0x9E37_79B9));
    (0..len).map(|_| make(r.next())).collect()
}

struct RngFrom(u64);
impl RngFrom {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 8.0 - 4.0
    }
}

fn check_collectives<E: CommElement + PartialEq + std::fmt::Debug>(
    n: usize,
    len: usize,
    make: fn(f64) -> E,
    to_f64: fn(E) -> f64,
    rel_tol: f64,
) {
    let exact = rel_tol == 0.0;
    let (_, seed) = Rng::new(len as u64 * 31 + n as u64);
    let all: Vec<Vec<E>> = (0..n).map(|r| inputs(seed, r, len, make)).collect();
    let results = run_ranks(n, T, |c| {
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        let me = c.rank();
        let send = dev.upload(&all[me]).unwrap();
        let mut out = Vec::new();
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg] {
            let mut recv = dev.alloc_zeros::<E>(len).unwrap();
            c.all_reduce(&s, &send, &mut recv, op).unwrap();
            let mut inplace = dev.upload(&all[me]).unwrap();
            c.all_reduce_in_place(&s, &mut inplace, op).unwrap();
            s.synchronize().unwrap();
            out.push((recv.to_host().unwrap(), inplace.to_host().unwrap()));
        }
        let mut gathered = dev.alloc_zeros::<E>(len * c.size()).unwrap();
        c.all_gather(&s, &send, &mut gathered).unwrap();
        let each = len / c.size();
        let rs_send = dev.upload(&all[me][..each * c.size()]).unwrap();
        let mut scattered = dev.alloc_zeros::<E>(each).unwrap();
        c.reduce_scatter(&s, &rs_send, &mut scattered, ReduceOp::Sum)
            .unwrap();
        let root = len % c.size();
        let mut bcast = dev.upload(&all[me]).unwrap();
        c.broadcast(&s, &mut bcast, root).unwrap();
        c.barrier(&s).unwrap().synchronize().unwrap();
        s.synchronize().unwrap();
        (
            out,
            gathered.to_host().unwrap(),
            scattered.to_host().unwrap(),
            bcast.to_host().unwrap(),
        )
    });
    let tol = |d: f64, scale: f64| d <= rel_tol * scale.abs().max(1.0);
    #[allow(clippy::needless_range_loop)] // i indexes every rank's input
    for (rank, (reductions, gathered, scattered, bcast)) in results.iter().enumerate() {
        for (k, op) in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg]
            .iter()
            .enumerate()
        {
            for i in 0..len {
                let vals: Vec<f64> = (0..n).map(|r| to_f64(all[r][i])).collect();
                let want = match op {
                    ReduceOp::Sum => vals.iter().sum::<f64>(),
                    ReduceOp::Max => vals.iter().cloned().fold(f64::MIN, f64::max),
                    ReduceOp::Min => vals.iter().cloned().fold(f64::MAX, f64::min),
                    ReduceOp::Avg => vals.iter().sum::<f64>() / n as f64,
                };
                let got = to_f64(reductions[k].0[i]);
                let want = if exact && *op == ReduceOp::Avg {
                    (vals.iter().map(|v| *v as i64).sum::<i64>() / n as i64) as f64
                } else {
                    want
                };
                assert!(
                    tol((got - want).abs(), want),
                    "{op:?} rank {rank} i {i}: {got} vs {want} (seed {seed})"
                );
                assert_eq!(
                    reductions[k].0[i], reductions[k].1[i],
                    "in-place {op:?} differs (seed {seed})"
                );
                // Every rank gets bitwise the same answer.
                assert_eq!(
                    reductions[k].0[i], results[0].0[k].0[i],
                    "{op:?}: rank {rank} differs from rank 0"
                );
            }
        }
        for r in 0..n {
            assert_eq!(
                &gathered[r * len..(r + 1) * len],
                &all[r][..],
                "all_gather block {r} on rank {rank}"
            );
        }
        let each = len / n;
        for i in 0..each {
            let want: f64 = (0..n).map(|r| to_f64(all[r][rank * each + i])).sum();
            assert!(
                tol((to_f64(scattered[i]) - want).abs(), want),
                "reduce_scatter rank {rank} i {i} (seed {seed})"
            );
        }
        assert_eq!(bcast, &all[len % n], "broadcast on rank {rank}");
    }
}

#[test]
fn collectives_fp32_every_world_size_and_awkward_lengths() {
    for n in [1, 2, 3, 4] {
        for len in [0, 1, 7, 1000] {
            check_collectives::<f32>(n, len, |v| v as f32, |v| v as f64, 1e-5);
        }
    }
}

#[test]
fn collectives_half_types_and_integers() {
    check_collectives::<f16>(3, 257, f16::from_f64, |v| v.to_f64(), 1e-3);
    check_collectives::<bf16>(4, 100, bf16::from_f64, |v| v.to_f64(), 1e-2);
    check_collectives::<i32>(3, 65, |v| (v * 1000.0) as i32, |v| v as f64, 0.0);
    check_collectives::<i64>(2, 64, |v| (v * 1e12) as i64, |v| v as f64, 0.0);
    check_collectives::<u8>(4, 33, |v| ((v + 4.0) * 7.0) as u8, |v| v as f64, 0.0);
}

#[test]
fn ring_exchange_with_grouped_send_recv() {
    let n = 4;
    let got = run_ranks(n, T, |c| {
        let dev = c.device().clone();
        let s = c.stream().clone(); // the communicator's dedicated stream
        let me = c.rank();
        let send = dev.upload(&[me as i32 * 10; 5]).unwrap();
        let mut recv = dev.alloc_zeros::<i32>(5).unwrap();
        // Everyone sends right and receives from the left in one group.
        c.group_p2p(
            &s,
            &mut [
                P2p::Send(&send, (me + 1) % n),
                P2p::Recv(&mut recv, (me + n - 1) % n),
            ],
        )
        .unwrap();
        s.synchronize().unwrap();
        recv.to_host().unwrap()
    });
    for (r, v) in got.iter().enumerate() {
        assert_eq!(v, &vec![((r + n - 1) % n) as i32 * 10; 5]);
    }
}

#[test]
fn wrong_lengths_are_rejected_before_enqueueing() {
    run_ranks(2, T, |c| {
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        let send = dev.alloc_zeros::<f32>(4).unwrap();
        let mut small = dev.alloc_zeros::<f32>(7).unwrap();
        let e = c.all_gather(&s, &send, &mut small).unwrap_err().to_string();
        assert!(
            e.contains("`recv`") && e.contains("exactly 8") && e.contains("world size 2"),
            "{e}"
        );
        let e = c
            .reduce_scatter(
                &s,
                &small,
                &mut dev.alloc_zeros::<f32>(4).unwrap(),
                ReduceOp::Sum,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("`send`") && e.contains("exactly 8"), "{e}");
        let e = c
            .all_reduce(&s, &send, &mut small, ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        assert!(e.contains("exactly 4"), "{e}");
        assert!(c
            .broadcast(&s, &mut small, 2)
            .unwrap_err()
            .to_string()
            .contains("`root`"));
        assert!(c
            .send(&s, &send, c.rank())
            .unwrap_err()
            .to_string()
            .contains("another rank"));
        let foreign = Device::emu().alloc_zeros::<f32>(4).unwrap();
        assert!(c
            .all_reduce(
                &s,
                &foreign,
                &mut dev.alloc_zeros::<f32>(4).unwrap(),
                ReduceOp::Sum
            )
            .is_err());
    });
}

#[test]
fn mismatched_collectives_fail_on_every_rank() {
    let errs = run_ranks(2, T, |c| {
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        let a = dev.alloc_zeros::<f32>(8).unwrap();
        let mut b = dev.alloc_zeros::<f32>(8).unwrap();
        if c.rank() == 0 {
            c.all_reduce(&s, &a, &mut b, ReduceOp::Sum).unwrap();
        } else {
            c.all_reduce(&s, &a, &mut b, ReduceOp::Max).unwrap();
        }
        let e = s.synchronize().unwrap_err().to_string();
        // as documented: a mismatch does not break the communicator, and
        // the next matching collective on the same stream works
        let fault = c.fault();
        let mut x = dev.upload(&[c.rank() as f32 + 1.0; 3]).unwrap();
        c.all_reduce_in_place(&s, &mut x, ReduceOp::Sum).unwrap();
        s.synchronize().unwrap();
        (e, fault, x.to_host().unwrap())
    });
    for (e, fault, x) in errs {
        assert!(e.contains("does not match across ranks"), "{e}");
        assert!(fault.is_none(), "{fault:?}");
        assert_eq!(x, vec![3.0; 3]);
    }
}

#[test]
fn a_dead_peer_is_an_error_not_a_hang() {
    let errs = run_ranks(3, Duration::from_millis(300), |c| {
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        if c.rank() == 2 {
            return None; // never joins
        }
        let mut b = dev.alloc_zeros::<f32>(8).unwrap();
        c.all_reduce_in_place(&s, &mut b, ReduceOp::Sum).unwrap();
        Some(s.synchronize().unwrap_err().to_string())
    });
    // Rank 2 dropped its communicator: the others fail at once ("left");
    // had it stayed alive, they would time out naming it.
    let e = errs[0].as_ref().unwrap();
    assert!(
        (e.contains("timed out") || e.contains("left")) && e.contains("[2]"),
        "{e}"
    );
    // A send nobody receives also times out.
    let errs = run_ranks(2, Duration::from_millis(200), |c| {
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        if c.rank() == 0 {
            c.send(&s, &dev.alloc_zeros::<u8>(3).unwrap(), 1).unwrap();
            Some(s.synchronize().unwrap_err().to_string())
        } else {
            None
        }
    });
    assert!(
        errs[0].as_ref().unwrap().contains("send to rank 1"),
        "{:?}",
        errs[0]
    );
}

#[test]
fn wait_stream_fails_while_a_peer_is_late_and_succeeds_once_it_joins() {
    let gate = std::sync::Barrier::new(2);
    let got = run_ranks(2, Duration::from_secs(20), |c| {
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        let mut b = dev.upload(&[c.rank() as f32 + 1.0; 4]).unwrap();
        if c.rank() == 0 {
            c.all_reduce_in_place(&s, &mut b, ReduceOp::Sum).unwrap();
            let early = c.wait_stream(&s, Duration::from_millis(50));
            gate.wait(); // now rank 1 joins
            c.wait_stream(&s, Duration::from_secs(20)).unwrap();
            (early.map_err(|e| e.to_string()), b.to_host().unwrap())
        } else {
            gate.wait();
            c.all_reduce_in_place(&s, &mut b, ReduceOp::Sum).unwrap();
            s.synchronize().unwrap();
            (Ok(()), b.to_host().unwrap())
        }
    });
    let early = got[0].0.as_ref().unwrap_err();
    assert!(early.contains("did not complete within"), "{early}");
    for (_, v) in &got {
        assert_eq!(v, &vec![3.0; 4]);
    }
}

/// A grid that differs between ranks (same world: every rank joins) is
/// a named error on every rank, never a silently lopsided split; the
/// communicator stays usable afterwards.
#[test]
fn split_for_grid_with_different_grids_fails_on_every_rank() {
    let got = run_ranks(4, T, |c| {
        // ranks 0 and 1 think tp = 2, ranks 2 and 3 think tp = 4; then the
        // same grid with different axes on rank 3; then a consistent call
        let tp = if c.rank() < 2 { 2 } else { 4 };
        let grid = RankGrid::new(4, tp, 1, 1, RankOrder::TpCpEpDpPp).unwrap();
        let grids = c.split_for_grid(&grid, &[Axis::Tp]).map(|_| ());
        let same = RankGrid::new(4, 2, 1, 1, RankOrder::TpCpEpDpPp).unwrap();
        let axes: &[Axis] = if c.rank() == 3 {
            &[Axis::Dp]
        } else {
            &[Axis::Tp]
        };
        let axes = c.split_for_grid(&same, axes).map(|_| ());
        let ok = c.split_for_grid(&same, &[Axis::Tp]).map(|s| s.size());
        (grids, axes, ok, c.fault())
    });
    for (r, (grids, axes, ok, fault)) in got.into_iter().enumerate() {
        // each rank names the first rank whose grid differs from its own
        let other = if r < 2 {
            "rank 2 with world 4 tp 4 cp 1 dp 1"
        } else {
            "rank 0 with world 4 tp 2 cp 1 dp 2"
        };
        let e = grids.unwrap_err().to_string();
        assert!(
            e.contains("split_for_grid") && e.contains("`grid`") && e.contains(other),
            "rank {r}: {e}"
        );
        let other = if r < 3 {
            "rank 3 with world 4 tp 2 cp 1 dp 2 pp 1 order tp-cp-ep-dp-pp axes dp"
        } else {
            "rank 0 with world 4 tp 2 cp 1 dp 2 pp 1 order tp-cp-ep-dp-pp axes tp"
        };
        let e = axes.unwrap_err().to_string();
        assert!(e.contains(other), "rank {r}: {e}");
        assert_eq!(ok.unwrap(), 2, "rank {r}");
        assert!(fault.is_none(), "rank {r}: {fault:?}");
    }
}

#[test]
fn sub_communicators_from_the_rank_grid() {
    // 8 ranks, tp=2, pp=2, dp=2: all-reduce over each TP group and DP group.
    let grid = RankGrid::new(8, 2, 1, 2, RankOrder::TpCpEpDpPp).unwrap();
    let got = run_ranks(8, T, |c| {
        let tp = c.split_for_grid(&grid, &[Axis::Tp]).unwrap();
        let dp = c.split_for_grid(&grid, &[Axis::Dp]).unwrap();
        let odd = c.split((c.rank() % 2 == 1).then_some(0), 0).unwrap();
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        let mut a = dev.upload(&[c.rank() as i64]).unwrap();
        tp.all_reduce_in_place(&s, &mut a, ReduceOp::Sum).unwrap();
        let mut b = dev.upload(&[c.rank() as i64]).unwrap();
        dp.all_reduce_in_place(&s, &mut b, ReduceOp::Sum).unwrap();
        s.synchronize().unwrap();
        (
            a.to_host().unwrap()[0],
            b.to_host().unwrap()[0],
            tp.rank(),
            tp.size(),
            odd.map(|o| (o.rank(), o.size())),
        )
    });
    for (r, (tp_sum, dp_sum, tp_rank, tp_size, odd)) in got.iter().enumerate() {
        let tpg = grid.group(r, &[Axis::Tp]).unwrap();
        let dpg = grid.group(r, &[Axis::Dp]).unwrap();
        assert_eq!(*tp_sum, tpg.iter().sum::<usize>() as i64, "rank {r}");
        assert_eq!(*dp_sum, dpg.iter().sum::<usize>() as i64, "rank {r}");
        assert_eq!(
            (*tp_rank, *tp_size),
            (tpg.iter().position(|&x| x == r).unwrap(), 2)
        );
        assert_eq!(*odd, (r % 2 == 1).then_some((r / 2, 4)));
    }
}

/// Each rank computes y = gelu(x) on a compute stream held at a gate, then
/// all-reduces y on a communication stream, with or without waiting for the
/// compute event. Returns (reduced y, expected sum).
fn overlap(wait: bool) -> Vec<(Vec<f32>, Vec<f32>)> {
    run_ranks(2, T, |c| {
        let dev = c.device().clone();
        let compute = dev.new_stream().unwrap();
        let comm = dev.new_stream().unwrap();
        let x: Vec<f32> = (0..512)
            .map(|i| (i as f32 + c.rank() as f32) / 100.0)
            .collect();
        let xd = dev.upload(&x).unwrap();
        let mut y: DeviceBuffer<f32> = dev.alloc_zeros(512).unwrap();
        let (open, gate) = mpsc::channel::<()>();
        compute
            .launch_host_fn(move || {
                let _ = gate.recv_timeout(Duration::from_secs(30));
            })
            .unwrap();
        BiasGelu::new(1, 512)
            .forward(&compute, &xd, None, &mut y)
            .unwrap();
        let done = compute.record_event().unwrap();
        if wait {
            comm.wait_event(&done).unwrap();
        }
        let mut sum = dev.alloc_zeros::<f32>(512).unwrap();
        let h = c.all_reduce(&comm, &y, &mut sum, ReduceOp::Sum).unwrap();
        if !wait {
            h.synchronize().unwrap();
        }
        open.send(()).unwrap();
        compute.synchronize().unwrap();
        comm.synchronize().unwrap();
        let gelu = |v: f64| ferrotron::reference::bias_gelu::gelu(Default::default(), v);
        let expected: Vec<f32> = (0..512)
            .map(|i| (gelu(i as f64 / 100.0) + gelu((i + 1) as f64 / 100.0)) as f32)
            .collect();
        (sum.to_host().unwrap(), expected)
    })
}

#[test]
fn communication_ordered_after_compute_by_an_event_is_correct() {
    for (got, want) in overlap(true) {
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
        }
    }
}

#[test]
fn without_the_wait_the_collective_reads_unfinished_data() {
    // Proof that the test above can fail: the gated compute has not run, so
    // the unsynchronised all-reduce sums zeros.
    for (got, want) in overlap(false) {
        assert!(got.iter().all(|&v| v == 0.0));
        assert!(want.iter().any(|&v| v != 0.0));
    }
}
