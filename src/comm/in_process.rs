//! The in-process backend: N ranks as threads of one process, buffers in host
//! memory. Each operation runs as a task on the calling rank's stream (so it
//! is ordered with that rank's compute exactly as an NCCL kernel would be) and
//! meets the other ranks' tasks at a phased rendezvous:
//!   phase 0: every rank posts its buffers (shapes are compared: a mismatch is
//!            an error on every rank, not a hang or an overrun);
//!   phase 1: each rank reduces/copies the part it owns (all-reduce: its
//!            1/N slice, reading every rank's input once);
//!   phase 2: each rank copies the other slices from their owners.
//! A fault breaks the world: a rank that does not arrive within the timeout,
//! a peer that left (its communicator and every operation it enqueued were
//! dropped, e.g. because its thread panicked and unwound) while others wait
//! for it, or a point-to-point transfer that cannot complete. Every pending
//! operation then fails promptly and every later one (collective,
//! point-to-point or split, on any rank) fails at the call with
//! "communicator is broken: \<the first fault\>". Argument mismatches across
//! ranks (shapes, p2p lengths) are reported on the ranks involved and leave
//! the communicator usable.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::element::{reduce_into, CommElement};
use super::{OpDesc, OpKind};
use crate::backend::Stream;
use crate::core::{DType, Error, Result};

fn comm_err(message: String) -> Error {
    Error::Backend {
        backend: "in-process comm",
        message,
    }
}

#[derive(Clone, Copy)]
struct Post {
    desc: OpDesc,
    send: u64,
    recv: u64,
}

struct State {
    seq: u64,
    phase: u32,
    arrived: usize,
    posts: Vec<Option<Post>>,
}

/// A point-to-point transfer waiting in a mailbox.
struct Mail {
    addr: u64,
    count: usize,
    dtype: DType,
    /// None while pending; Some(Ok) copied; Some(Err) rejected by the receiver.
    outcome: Mutex<Option<std::result::Result<(), String>>>,
}

/// Pending sends per (sender, receiver), in posting order.
type Mailboxes = HashMap<(usize, usize), VecDeque<Arc<Mail>>>;

struct SplitRound {
    round: u64,
    arrived: usize,
    taken: usize,
    posts: Vec<Option<(Option<usize>, usize)>>,
    results: Vec<Option<(usize, usize, Arc<World>)>>,
}

/// State shared by the ranks of one communicator.
pub(crate) struct World {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
    mail: Mutex<Mailboxes>,
    mail_changed: Condvar,
    split: Mutex<SplitRound>,
    split_changed: Condvar,
    /// The first fault (see the module docs); set once, never cleared.
    fault: Mutex<Option<String>>,
    /// Ranks whose communicator and enqueued operations are all gone.
    departed: Vec<AtomicBool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl World {
    pub fn new(size: usize, timeout: Duration) -> Arc<World> {
        Arc::new(World {
            size,
            timeout,
            state: Mutex::new(State {
                seq: 0,
                phase: 0,
                arrived: 0,
                posts: vec![None; size],
            }),
            changed: Condvar::new(),
            mail: Mutex::new(HashMap::new()),
            mail_changed: Condvar::new(),
            split: Mutex::new(SplitRound {
                round: 0,
                arrived: 0,
                taken: 0,
                posts: vec![None; size],
                results: (0..size).map(|_| None).collect(),
            }),
            split_changed: Condvar::new(),
            fault: Mutex::new(None),
            departed: (0..size).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// The first fault, if the world is broken.
    pub fn fault(&self) -> Option<String> {
        lock(&self.fault).clone()
    }

    fn is_faulted(&self) -> bool {
        lock(&self.fault).is_some()
    }

    /// The error every operation of a broken world reports.
    fn broken_err(&self) -> Option<Error> {
        self.fault()
            .map(|b| comm_err(format!("communicator is broken: {b}")))
    }

    fn has_departed(&self, rank: usize) -> bool {
        self.departed[rank].load(Ordering::Acquire)
    }

    fn departed_ranks(&self) -> Vec<usize> {
        (0..self.size).filter(|&r| self.has_departed(r)).collect()
    }

    /// Wakes every waiter. Each lock is taken (and released) after the state
    /// it waits on changed, so no waiter misses the notification. Never
    /// called with any of these locks held.
    fn wake_all(&self) {
        drop(lock(&self.state));
        self.changed.notify_all();
        drop(lock(&self.mail));
        self.mail_changed.notify_all();
        drop(lock(&self.split));
        self.split_changed.notify_all();
    }

    /// Records `msg` as the fault (unless one is already recorded), wakes
    /// every waiter and returns the error for this rank. Called with no
    /// lock of this world held.
    fn break_with(&self, msg: String) -> Error {
        lock(&self.fault).get_or_insert_with(|| msg.clone());
        self.wake_all();
        comm_err(msg)
    }

    /// Rank `rank` is gone: its communicator and every operation it
    /// enqueued were dropped, so it will post nothing more.
    fn depart(&self, rank: usize) {
        self.departed[rank].store(true, Ordering::Release);
        self.wake_all();
    }

    fn wait<'a, T>(
        &self,
        cv: &Condvar,
        mut g: MutexGuard<'a, T>,
        deadline: Instant,
        mut done: impl FnMut(&T) -> bool,
    ) -> (MutexGuard<'a, T>, bool) {
        while !done(&g) {
            let now = Instant::now();
            if now >= deadline {
                return (g, false);
            }
            g = cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        (g, true)
    }

    /// Rank `rank` arrives at `phase` of collective `seq`; returns every
    /// rank's post once all have arrived.
    fn arrive(
        &self,
        seq: u64,
        phase: u32,
        rank: usize,
        post: Option<Post>,
        what: &str,
    ) -> Result<Vec<Post>> {
        let deadline = Instant::now() + self.timeout;
        let g = lock(&self.state);
        let (mut g, _) = self.wait(&self.changed, g, deadline, |s| {
            (s.seq, s.phase) >= (seq, phase)
                || self.is_faulted()
                || !self.departed_ranks().is_empty()
        });
        if (g.seq, g.phase) != (seq, phase) {
            drop(g);
            if let Some(e) = self.broken_err() {
                return Err(e);
            }
            let gone = self.departed_ranks();
            return Err(self.break_with(if gone.is_empty() {
                format!("rank {rank}: {what} (collective #{seq}) never became ready: earlier collectives did not finish within {:?}", self.timeout)
            } else {
                format!("rank {rank}: {what} (collective #{seq}) can never complete: ranks {gone:?} left (dropped their communicator, or their thread exited)")
            }));
        }
        if let Some(p) = post {
            g.posts[rank] = Some(p);
        }
        g.arrived += 1;
        if g.arrived == self.size {
            g.arrived = 0;
            let posts = g.posts.iter().flatten().copied().collect();
            if phase == 2 {
                g.seq += 1;
                g.phase = 0;
                g.posts.iter_mut().for_each(|p| *p = None);
            } else {
                g.phase += 1;
            }
            self.changed.notify_all();
            return Ok(posts);
        }
        let (g, _) = self.wait(&self.changed, g, deadline, |s| {
            (s.seq, s.phase) != (seq, phase)
                || self.is_faulted()
                || !self.departed_ranks().is_empty()
        });
        if (g.seq, g.phase) == (seq, phase) {
            let missing: Vec<usize> = (0..self.size).filter(|&r| g.posts[r].is_none()).collect();
            drop(g);
            if let Some(e) = self.broken_err() {
                return Err(e);
            }
            let gone = self.departed_ranks();
            let msg = if !gone.is_empty() {
                format!("rank {rank}: {what} (collective #{seq}) can never complete: ranks {gone:?} left (dropped their communicator, or their thread exited)")
            } else if phase == 0 {
                format!("rank {rank}: {what} (collective #{seq}) timed out after {:?} waiting for ranks {missing:?}", self.timeout)
            } else {
                format!(
                    "rank {rank}: {what} (collective #{seq}) timed out after {:?} in phase {phase}",
                    self.timeout
                )
            };
            return Err(self.break_with(msg));
        }
        Ok(g.posts.iter().flatten().copied().collect())
    }
}

/// Describes an operation for messages.
fn describe(d: &OpDesc) -> String {
    match d.dtype {
        Some(t) => format!("{:?}({t}, {} elements)", d.kind, d.count),
        None => format!("{:?}", d.kind),
    }
}

/// Marks its rank departed when the last holder goes: the [`Rank`] and every
/// operation it enqueued hold one, so a departed rank posts nothing more.
struct Presence {
    world: Arc<World>,
    rank: usize,
}

impl Drop for Presence {
    fn drop(&mut self) {
        self.world.depart(self.rank);
    }
}

/// One rank's handle.
pub(crate) struct Rank {
    world: Arc<World>,
    rank: usize,
    presence: Arc<Presence>,
}

/// A planned point-to-point transfer (validated by the caller).
#[derive(Clone, Copy)]
pub(crate) struct P2pPlan {
    pub send: bool,
    pub peer: usize,
    pub addr: u64,
    pub count: usize,
    pub dtype: DType,
}

/// # Safety
/// `addr` must point at `len` live elements of `T`, not written concurrently.
unsafe fn slice<'a, T>(addr: u64, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: forwarded from the caller.
    unsafe { std::slice::from_raw_parts(addr as *const T, len) }
}

/// # Safety
/// `addr` must point at `len` live elements of `T` that only this call touches.
unsafe fn slice_mut<'a, T>(addr: u64, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: forwarded from the caller.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut T, len) }
}

impl Rank {
    pub fn new(world: Arc<World>, rank: usize) -> Rank {
        let presence = Arc::new(Presence {
            world: world.clone(),
            rank,
        });
        Rank {
            world,
            rank,
            presence,
        }
    }

    /// The first fault of this rank's world, if it is broken.
    pub fn fault(&self) -> Option<String> {
        self.world.fault()
    }

    fn check_usable(&self) -> Result<()> {
        self.world.broken_err().map_or(Ok(()), Err)
    }

    pub fn enqueue<T: CommElement>(
        &self,
        stream: &Stream,
        seq: u64,
        desc: OpDesc,
        send: u64,
        recv: u64,
    ) -> Result<()> {
        self.check_usable()?;
        let world = self.world.clone();
        let rank = self.rank;
        let presence = self.presence.clone();
        stream.enqueue_task(Box::new(move || {
            let r = run_collective::<T>(&world, rank, seq, Post { desc, send, recv });
            drop(presence);
            r
        }))
    }

    pub fn enqueue_p2p(&self, stream: &Stream, plan: Vec<P2pPlan>) -> Result<()> {
        self.check_usable()?;
        let world = self.world.clone();
        let rank = self.rank;
        let presence = self.presence.clone();
        stream.enqueue_task(Box::new(move || {
            let r = run_p2p(&world, rank, &plan);
            drop(presence);
            r
        }))
    }

    pub fn split(&self, color: Option<usize>, key: usize) -> Result<Option<(usize, usize, Rank)>> {
        self.check_usable()?;
        let w = &self.world;
        let deadline = Instant::now() + w.timeout;
        let g = lock(&w.split);
        // Wait for the previous round to be fully collected.
        let (mut g, ok) = w.wait(&w.split_changed, g, deadline, |s| {
            s.taken == 0 || s.arrived == 0 || w.is_faulted()
        });
        if !ok || (g.taken != 0 && g.arrived != 0) {
            drop(g);
            return Err(w.broken_err().unwrap_or_else(|| {
                w.break_with(format!(
                    "rank {}: split: previous split never completed",
                    self.rank
                ))
            }));
        }
        let round = g.round;
        g.posts[self.rank] = Some((color, key));
        g.arrived += 1;
        if g.arrived == w.size {
            // Last to arrive builds every sub-communicator.
            let mut by_color: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
            for (r, p) in g.posts.iter().enumerate() {
                if let Some((Some(c), k)) = p {
                    by_color.entry(*c).or_default().push((*k, r));
                }
            }
            let mut results: Vec<Option<(usize, usize, Arc<World>)>> =
                (0..w.size).map(|_| None).collect();
            for (_, mut members) in by_color {
                members.sort_unstable();
                let sub = World::new(members.len(), w.timeout);
                for (i, (_, r)) in members.iter().enumerate() {
                    results[*r] = Some((i, members.len(), sub.clone()));
                }
            }
            g.results = results;
            g.round += 1;
            w.split_changed.notify_all();
        } else {
            let (g2, _) = w.wait(&w.split_changed, g, deadline, |s| {
                s.round > round
                    || w.is_faulted()
                    || (0..w.size).any(|r| s.posts[r].is_none() && w.has_departed(r))
            });
            g = g2;
            if g.round == round {
                let missing: Vec<usize> = (0..w.size).filter(|&r| g.posts[r].is_none()).collect();
                drop(g);
                if let Some(e) = w.broken_err() {
                    return Err(e);
                }
                let gone: Vec<usize> = missing
                    .iter()
                    .copied()
                    .filter(|&r| w.has_departed(r))
                    .collect();
                return Err(w.break_with(if gone.is_empty() {
                    format!(
                        "rank {}: split timed out after {:?} waiting for ranks {missing:?}",
                        self.rank, w.timeout
                    )
                } else {
                    format!(
                        "rank {}: split can never complete: ranks {gone:?} left (dropped their communicator, or their thread exited)",
                        self.rank
                    )
                }));
            }
        }
        let mine = g.results[self.rank].take();
        g.taken += 1;
        if g.taken == w.size {
            g.taken = 0;
            g.arrived = 0;
            g.posts.iter_mut().for_each(|p| *p = None);
            w.split_changed.notify_all();
        }
        Ok(mine.map(|(rank, size, world)| (rank, size, Rank::new(world, rank))))
    }
}

fn run_collective<T: CommElement>(world: &World, rank: usize, seq: u64, post: Post) -> Result<()> {
    let what = describe(&post.desc);
    let posts = world.arrive(seq, 0, rank, Some(post), &what)?;
    let mismatch = posts.iter().position(|p| p.desc != post.desc);
    if let Some(other) = mismatch {
        // Every rank sees the same posts, so all take this path together.
        let _ = world.arrive(seq, 1, rank, None, &what);
        let _ = world.arrive(seq, 2, rank, None, &what);
        return Err(comm_err(format!(
            "collective #{seq} does not match across ranks: rank {rank} called {what}, rank {other} called {}",
            describe(&posts[other].desc)
        )));
    }
    let n = world.size;
    let count = post.desc.count;
    // Why the raw slices below are sound: every post's addresses were
    // validated against these lengths before enqueueing; each rank's buffers
    // stay alive and untouched by their owners until phase 2 completes,
    // because the owners' streams are blocked in this very task; each rank
    // writes only its own recv buffer, and only parts no other rank reads in
    // the same phase.
    let slice_of = |r: usize, total: usize| (r * total / n, (r + 1) * total / n);
    match post.desc.kind {
        OpKind::AllReduce(op) => {
            // Phase 1: reduce this rank's slice of every input into its recv.
            let (lo, hi) = slice_of(rank, count);
            let inputs: Vec<&[T]> = posts
                .iter()
                // SAFETY: see above; `send` holds `count` elements.
                .map(|p| unsafe { &slice::<T>(p.send, count)[lo..hi] })
                .collect();
            let mut part = vec![T::zeroed(); hi - lo];
            reduce_into(op, &inputs, &mut part);
            // SAFETY: see above; in phase 1 only this rank touches slice lo..hi
            // of its recv (== its send when in place); in phase 2 nobody
            // reads the other slices of it, which this rank then fills.
            let out = unsafe { slice_mut::<T>(post.recv, count) };
            out[lo..hi].copy_from_slice(&part);
            world.arrive(seq, 1, rank, None, &what)?;
            // Phase 2: copy every other slice from the rank that owns it.
            for (r, p) in posts.iter().enumerate().filter(|(r, _)| *r != rank) {
                let (a, b) = slice_of(r, count);
                // SAFETY: see above; rank r finished slice a..b in phase 1
                // and writes only other slices of its recv now.
                let src = unsafe { &slice::<T>(p.recv, count)[a..b] };
                out[a..b].copy_from_slice(src);
            }
            world.arrive(seq, 2, rank, None, &what)?;
            Ok(())
        }
        OpKind::AllGather => {
            // SAFETY: see above; recv holds n * count elements.
            let out = unsafe { slice_mut::<T>(post.recv, count * n) };
            for (r, p) in posts.iter().enumerate() {
                // SAFETY: see above; send holds count elements.
                out[r * count..(r + 1) * count]
                    .copy_from_slice(unsafe { slice::<T>(p.send, count) });
            }
            world.arrive(seq, 1, rank, None, &what)?;
            world.arrive(seq, 2, rank, None, &what)?;
            Ok(())
        }
        OpKind::ReduceScatter(op) => {
            let each = count / n;
            let inputs: Vec<&[T]> = posts
                .iter()
                // SAFETY: see above; send holds count = n * each elements.
                .map(|p| unsafe { &slice::<T>(p.send, count)[rank * each..(rank + 1) * each] })
                .collect();
            // SAFETY: see above; recv holds `each` elements.
            reduce_into(op, &inputs, unsafe { slice_mut::<T>(post.recv, each) });
            world.arrive(seq, 1, rank, None, &what)?;
            world.arrive(seq, 2, rank, None, &what)?;
            Ok(())
        }
        OpKind::Broadcast { root } => {
            if rank != root {
                // SAFETY: see above; the root does not write its buffer here.
                let src = unsafe { slice::<T>(posts[root].send, count) };
                // SAFETY: see above; this rank's buffer, count elements.
                unsafe { slice_mut::<T>(post.recv, count) }.copy_from_slice(src);
            }
            world.arrive(seq, 1, rank, None, &what)?;
            world.arrive(seq, 2, rank, None, &what)?;
            Ok(())
        }
        OpKind::Barrier => {
            world.arrive(seq, 1, rank, None, &what)?;
            world.arrive(seq, 2, rank, None, &what)?;
            Ok(())
        }
    }
}

/// The error for a transfer with `peer` that cannot complete: the existing
/// fault, or a new one (the peer left, or the timeout passed).
fn p2p_fault(world: &World, rank: usize, what: &str, peer: usize) -> Error {
    if let Some(e) = world.broken_err() {
        return e;
    }
    world.break_with(if world.has_departed(peer) {
        format!("rank {rank}: {what} rank {peer}: rank {peer} left (dropped its communicator, or its thread exited) without a matching operation")
    } else {
        format!(
            "rank {rank}: {what} rank {peer} timed out after {:?} (no matching operation)",
            world.timeout
        )
    })
}

fn run_p2p(world: &World, rank: usize, plan: &[P2pPlan]) -> Result<()> {
    if let Some(e) = world.broken_err() {
        return Err(e);
    }
    let deadline = Instant::now() + world.timeout;
    let mut sent = Vec::new();
    {
        let mut boxes = lock(&world.mail);
        for p in plan.iter().filter(|p| p.send) {
            let m = Arc::new(Mail {
                addr: p.addr,
                count: p.count,
                dtype: p.dtype,
                outcome: Mutex::new(None),
            });
            boxes
                .entry((rank, p.peer))
                .or_default()
                .push_back(m.clone());
            sent.push((p.peer, m));
        }
        world.mail_changed.notify_all();
    }
    let mut first_err: Option<Error> = None;
    for p in plan.iter().filter(|p| !p.send) {
        let has_mail = |b: &Mailboxes| b.get(&(p.peer, rank)).is_some_and(|q| !q.is_empty());
        let g = lock(&world.mail);
        let (mut g, _) = world.wait(&world.mail_changed, g, deadline, |b| {
            has_mail(b) || world.is_faulted() || world.has_departed(p.peer)
        });
        if !has_mail(&g) || world.is_faulted() {
            drop(g);
            first_err.get_or_insert(p2p_fault(world, rank, "recv from", p.peer));
            continue;
        }
        let mail = g
            .get_mut(&(p.peer, rank))
            .and_then(VecDeque::pop_front)
            .expect("checked non-empty");
        drop(g);
        let outcome = if mail.count != p.count || mail.dtype != p.dtype {
            Err(format!(
                "rank {} sent {} elements of {} but rank {rank} expects {} of {}",
                p.peer, mail.count, mail.dtype, p.count, p.dtype
            ))
        } else {
            let bytes = p.count * p.dtype.size();
            // SAFETY: both buffers were validated to hold `bytes` bytes; the
            // sender's stream is blocked until this transfer is marked done.
            unsafe {
                std::ptr::copy_nonoverlapping(mail.addr as *const u8, p.addr as *mut u8, bytes)
            };
            Ok(())
        };
        if let Err(e) = &outcome {
            first_err.get_or_insert(comm_err(e.clone()));
        }
        *lock(&mail.outcome) = Some(outcome);
        // Notify under the mailbox lock the sender waits with: otherwise the
        // notification can fall between the sender's check of `outcome` and
        // its wait, and the send times out although it was received (seen
        // as rare 30 s timeouts of grouped pipeline transfers under load).
        let _g = lock(&world.mail);
        world.mail_changed.notify_all();
    }
    for (peer, m) in sent {
        let g = lock(&world.mail);
        let (mut g, _) = world.wait(&world.mail_changed, g, deadline, |_| {
            lock(&m.outcome).is_some() || world.is_faulted() || world.has_departed(peer)
        });
        if lock(&m.outcome).is_none() {
            // Withdraw the send while no receiver has claimed it: once this
            // task returns, its buffer may be freed, so it must not stay
            // in the mailbox for a late receiver to copy from.
            let queue = g.get_mut(&(rank, peer));
            let at = queue
                .as_ref()
                .and_then(|q| q.iter().position(|x| Arc::ptr_eq(x, &m)));
            if let (Some(q), Some(i)) = (queue, at) {
                q.remove(i);
                drop(g);
                first_err.get_or_insert(p2p_fault(world, rank, "send to", peer));
                continue;
            }
            // Claimed: the receiver is copying now and reports the outcome
            // in bounded time.
            while lock(&m.outcome).is_none() {
                g = world
                    .mail_changed
                    .wait(g)
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
        drop(g);
        if let Some(Err(e)) = lock(&m.outcome).as_ref() {
            first_err.get_or_insert(comm_err(e.clone()));
        }
    }
    first_err.map_or(Ok(()), Err)
}
