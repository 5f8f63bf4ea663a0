//! Communicators under faults (in-process backend): a rank that panics while
//! its peers wait in a collective, a peer that drops its communicator before
//! or while others wait (collectives, point-to-point, split), and a peer that
//! is alive but late past the timeout. Every other rank gets an error (at
//! once when the peer is gone, within the timeout when it is only late), the
//! communicator then reports the first fault on every later call, and every
//! handle drops without hanging or panicking.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use ferrotron::comm::{Communicator, ReduceOp};
use ferrotron::Device;

/// A timeout far longer than any assertion below allows: failures that must
/// be prompt cannot be the timeout's doing.
const LONG: Duration = Duration::from_secs(60);
const PROMPT: Duration = Duration::from_secs(15);

fn comms(n: usize, timeout: Duration) -> Vec<Communicator> {
    let devices: Vec<Device> = (0..n).map(|_| Device::emu()).collect();
    Communicator::in_process_with_timeout(&devices, timeout).unwrap()
}

/// `f(comm)` on one thread per rank; panics are returned, not propagated.
fn on_ranks<R: Send>(
    comms: Vec<Communicator>,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<thread::Result<R>> {
    thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join()).collect()
    })
}

fn is_broken(e: &str) -> bool {
    e.contains("communicator is broken")
}

/// After a fault: every kind of call fails at the call with the fault, and
/// the handles then drop promptly.
fn check_broken_then_drop(c: Communicator, fault_has: &str) {
    let dev = c.device().clone();
    let s = dev.new_stream().unwrap();
    let fault = c.fault().expect("the communicator says it is broken");
    assert!(fault.contains(fault_has), "{fault}");
    let mut b = dev.alloc_zeros::<f32>(4).unwrap();
    let e = c
        .all_reduce_in_place(&s, &mut b, ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(is_broken(&e) && e.contains(&fault), "{e}");
    let peer = (c.rank() + 1) % c.size();
    let e = c.send(&s, &b, peer).unwrap_err().to_string();
    assert!(is_broken(&e) && e.contains(&fault), "{e}");
    let e = c.barrier(&s).unwrap_err().to_string();
    assert!(is_broken(&e), "{e}");
    let e = c.split(Some(0), c.rank()).unwrap_err().to_string();
    assert!(is_broken(&e), "{e}");
    // Even a wait with nothing pending says so (it used to return Ok on an idle stream).
    let e = c
        .wait_stream(&s, Duration::from_secs(1))
        .unwrap_err()
        .to_string();
    assert!(is_broken(&e) && e.contains(&fault), "{e}");
    s.synchronize().unwrap();
    let t = Instant::now();
    drop((s, b, c));
    assert!(t.elapsed() < PROMPT, "drop took {:?}", t.elapsed());
}

#[test]
fn a_rank_that_panics_while_others_wait_fails_them_promptly() {
    let start = Instant::now();
    let got = on_ranks(comms(3, LONG), |c| {
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        let mut b = dev.upload(&[1.0f32; 8]).unwrap();
        // Collective #0 completes on every rank.
        c.all_reduce_in_place(&s, &mut b, ReduceOp::Sum).unwrap();
        s.synchronize().unwrap();
        if c.rank() == 1 {
            thread::sleep(Duration::from_millis(100)); // the others are waiting
            panic!("rank 1 fails mid-step");
        }
        c.all_reduce_in_place(&s, &mut b, ReduceOp::Sum).unwrap();
        let e = s.synchronize().unwrap_err().to_string();
        assert_eq!(b.to_host().unwrap(), vec![3.0; 8]);
        drop((s, b));
        check_broken_then_drop(c, "left");
        e
    });
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    assert!(got[1].is_err(), "rank 1 panicked");
    for r in [0, 2] {
        let e = got[r].as_ref().unwrap();
        assert!(e.contains("[1] left"), "{e}");
    }
}

#[test]
fn a_peer_that_drops_its_communicator_fails_collectives_p2p_and_split() {
    // Collectives: rank 2 leaves before the others call.
    let start = Instant::now();
    let got = on_ranks(comms(3, LONG), |c| {
        if c.rank() == 2 {
            return None;
        }
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        let mut b = dev.alloc_zeros::<f32>(8).unwrap();
        thread::sleep(Duration::from_millis(50));
        // The call may already see the fault another rank recorded.
        let e = match c.all_reduce_in_place(&s, &mut b, ReduceOp::Sum) {
            Ok(_) => s.synchronize().unwrap_err().to_string(),
            Err(e) => e.to_string(),
        };
        drop((s, b));
        check_broken_then_drop(c, "[2] left");
        Some(e)
    });
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    for r in [0, 1] {
        let e = got[r].as_ref().unwrap().as_ref().unwrap();
        assert!(e.contains("[2] left"), "{e}");
    }

    // Point-to-point: the receiver's peer leaves while it waits, and a
    // sender's peer leaves without receiving.
    for receiver_waits in [true, false] {
        let start = Instant::now();
        let got = on_ranks(comms(2, LONG), |c| {
            let dev = c.device().clone();
            let waiter = if receiver_waits { 0 } else { 1 };
            if c.rank() != waiter {
                thread::sleep(Duration::from_millis(100));
                return None;
            }
            let s = dev.new_stream().unwrap();
            let mut b = dev.alloc_zeros::<u8>(16).unwrap();
            if receiver_waits {
                c.recv(&s, &mut b, 1).unwrap();
            } else {
                c.send(&s, &b, 0).unwrap();
            }
            let e = s.synchronize().unwrap_err().to_string();
            drop((s, b));
            check_broken_then_drop(c, "left");
            Some(e)
        });
        assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
        let waiter = if receiver_waits { 0 } else { 1 };
        let e = got[waiter].as_ref().unwrap().as_ref().unwrap();
        assert!(
            e.contains("left") && e.contains("without a matching"),
            "{e}"
        );
    }

    // Split: rank 0 leaves while ranks 1 and 2 wait in it.
    let start = Instant::now();
    let got = on_ranks(comms(3, LONG), |c| {
        if c.rank() == 0 {
            thread::sleep(Duration::from_millis(100));
            return None;
        }
        let e = c.split(Some(0), c.rank()).unwrap_err().to_string();
        check_broken_then_drop(c, "[0] left");
        Some(e)
    });
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    for r in [1, 2] {
        let e = got[r].as_ref().unwrap().as_ref().unwrap();
        assert!(e.contains("left"), "{e}");
    }
}

#[test]
fn a_late_peer_times_out_the_others_and_then_finds_the_communicator_broken() {
    let timeout = Duration::from_millis(300);
    let late = Barrier::new(3);
    let got = on_ranks(comms(3, timeout), |c| {
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        let mut b = dev.alloc_zeros::<f32>(8).unwrap();
        if c.rank() == 2 {
            // Alive and holding its communicator, but late.
            late.wait();
            let e = c
                .all_reduce_in_place(&s, &mut b, ReduceOp::Sum)
                .unwrap_err()
                .to_string();
            assert!(is_broken(&e) && e.contains("timed out"), "{e}");
            drop((s, b));
            check_broken_then_drop(c, "timed out");
            return (e, Duration::ZERO);
        }
        let t = Instant::now();
        c.all_reduce_in_place(&s, &mut b, ReduceOp::Sum).unwrap();
        let e = s.synchronize().unwrap_err().to_string();
        let waited = t.elapsed();
        late.wait();
        drop((s, b));
        check_broken_then_drop(c, "timed out");
        (e, waited)
    });
    for r in [0, 1] {
        let (e, waited) = got[r].as_ref().unwrap();
        assert!(e.contains("timed out") && e.contains("[2]"), "{e}");
        assert!(*waited < timeout + PROMPT, "waited {waited:?}");
    }
}

#[test]
fn a_timed_out_send_is_withdrawn_so_a_late_receiver_never_reads_it() {
    let timeout = Duration::from_millis(200);
    let late = Barrier::new(2);
    let got = on_ranks(comms(2, timeout), |c| {
        let dev = c.device().clone();
        let s = dev.new_stream().unwrap();
        if c.rank() == 0 {
            let b = dev.upload(&[7u8; 32]).unwrap();
            c.send(&s, &b, 1).unwrap();
            let e = s.synchronize().unwrap_err().to_string();
            drop(b); // freed: a late receiver must not copy from it
            late.wait();
            late.wait();
            drop(s);
            check_broken_then_drop(c, "timed out");
            e
        } else {
            late.wait();
            let mut b = dev.alloc_zeros::<u8>(32).unwrap();
            let e = c.recv(&s, &mut b, 0).unwrap_err().to_string();
            assert!(is_broken(&e), "{e}");
            assert_eq!(b.to_host().unwrap(), vec![0; 32]);
            late.wait();
            drop((s, b));
            check_broken_then_drop(c, "timed out");
            e
        }
    });
    let e = got[0].as_ref().unwrap();
    assert!(e.contains("send to rank 1 timed out"), "{e}");
}

#[test]
fn a_zero_timeout_is_rejected_as_in_the_c_abi() {
    let e = Communicator::in_process_with_timeout(&[Device::emu()], Duration::ZERO)
        .unwrap_err()
        .to_string();
    assert!(e.contains("timeout") && e.contains("positive"), "{e}");
}
