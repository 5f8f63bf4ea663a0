//! Collectives that overlap with compute (docs/architecture.md).
//!
//! A [`Communicator`] is one rank of a group. Every operation is enqueued on a
//! stream the caller passes (usually a dedicated communication stream) and
//! returns a [`CommHandle`]: an event another stream can wait on, so compute
//! and communication overlap and are ordered only where the caller says.
//! All ranks must issue the same collectives in the same order, as with NCCL.
//! Every buffer length is checked against the world size and the operation
//! before anything is enqueued: a safe call cannot write out of bounds.
//!
//! Backends: an in-process one (N ranks as threads of one process, host
//! memory, each rank's work on its own emulated streams), and NCCL (feature
//! `cuda`, loaded dynamically). Multi-process jobs share NCCL's unique id
//! through [`rendezvous`] (torchrun's environment variables).

mod element;
// Used by the NCCL backend; its tests run on every build.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod fault;
mod in_process;
#[cfg(feature = "cuda")]
mod nccl;
#[cfg(feature = "cuda")]
mod nccl_lib;
pub mod rendezvous;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use element::CommElement;

use crate::backend::{BackendKind, Device, DeviceBuffer, DeviceRead, DeviceWrite, Event, Stream};
use crate::core::{DType, Error, Result};

/// Reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    /// Sum divided by the number of ranks (integer division for integers).
    Avg,
}

/// Completion of one enqueued operation: wait on it from another stream or
/// from the host.
pub struct CommHandle {
    event: Event,
}

impl std::fmt::Debug for CommHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommHandle")
    }
}

impl CommHandle {
    /// The event recorded right after the operation on its stream.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// Makes later work on `stream` wait for the operation.
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        stream.wait_event(&self.event)
    }

    /// Blocks the host until the operation is done. Failures are reported by
    /// the stream's `synchronize`.
    pub fn synchronize(&self) -> Result<()> {
        self.event.synchronize()
    }
}

/// One point-to-point operation of a [`Communicator::group_p2p`] group.
pub enum P2p<'a, T: CommElement> {
    Send(&'a dyn DeviceRead<T>, usize),
    Recv(&'a mut dyn DeviceWrite<T>, usize),
}

/// What an operation moves: checked against the world size before enqueueing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    AllReduce(ReduceOp),
    AllGather,
    ReduceScatter(ReduceOp),
    Broadcast { root: usize },
    Barrier,
}

/// The shape of one collective as a rank posted it (compared across ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OpDesc {
    pub kind: OpKind,
    pub dtype: Option<DType>,
    /// Elements each rank sends.
    pub count: usize,
}

pub(crate) enum CommImpl {
    InProcess(in_process::Rank),
    #[cfg(feature = "cuda")]
    Nccl(nccl::NcclRank),
}

/// One rank of a communicator.
pub struct Communicator {
    rank: usize,
    size: usize,
    device: Device,
    /// The communicator's own stream, for callers that want a dedicated one.
    stream: Stream,
    imp: CommImpl,
    seq: AtomicU64,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {} on {:?})",
            self.rank, self.size, self.device
        )
    }
}

/// How long an in-process rank waits for its peers before the operation fails
/// (a dead or diverged peer becomes an error, not a hang).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

impl Communicator {
    /// `devices.len()` ranks in this process, rank `i` on `devices[i]`
    /// (emulator devices). Hand each to its own thread.
    pub fn in_process(devices: &[Device]) -> Result<Vec<Communicator>> {
        Self::in_process_with_timeout(devices, DEFAULT_TIMEOUT)
    }

    /// As [`Communicator::in_process`], with the peer timeout.
    pub fn in_process_with_timeout(
        devices: &[Device],
        timeout: Duration,
    ) -> Result<Vec<Communicator>> {
        if devices.is_empty() {
            return Err(Error::invalid(
                "Communicator::in_process",
                "devices",
                "at least one device",
                "none",
            ));
        }
        if timeout.is_zero() {
            return Err(Error::invalid(
                "Communicator::in_process_with_timeout",
                "timeout",
                "a positive duration (every wait would fail at once)",
                "0",
            ));
        }
        if let Some(d) = devices.iter().find(|d| d.kind() != BackendKind::Emu) {
            return Err(Error::invalid(
                "Communicator::in_process",
                "devices",
                "emulator devices (GPUs use NCCL)",
                format!("{d:?}"),
            ));
        }
        let world = in_process::World::new(devices.len(), timeout);
        devices
            .iter()
            .enumerate()
            .map(|(r, d)| {
                Ok(Communicator {
                    rank: r,
                    size: devices.len(),
                    device: d.clone(),
                    stream: d.new_stream()?,
                    imp: CommImpl::InProcess(in_process::Rank::new(world.clone(), r)),
                    seq: AtomicU64::new(0),
                })
            })
            .collect()
    }

    /// A rank of an NCCL communicator on `device` (a GPU), from the unique id
    /// rank 0 created (`nccl_unique_id`) and shared (see [`rendezvous`]).
    #[cfg(feature = "cuda")]
    pub fn nccl(
        device: &Device,
        rank: usize,
        size: usize,
        unique_id: &[u8; 128],
    ) -> Result<Communicator> {
        let imp = nccl::NcclRank::new(device, rank, size, unique_id)?;
        Ok(Communicator {
            rank,
            size,
            device: device.clone(),
            stream: device.new_stream()?,
            imp: CommImpl::Nccl(imp),
            seq: AtomicU64::new(0),
        })
    }

    /// A new NCCL unique id (rank 0 creates it; the others receive it).
    #[cfg(feature = "cuda")]
    pub fn nccl_unique_id() -> Result<[u8; 128]> {
        nccl::unique_id()
    }

    /// The NCCL library file in use, loading it if needed (see
    /// `FTN_NCCL_LIBRARY`); an error listing every place searched, and what
    /// to install, when there is none.
    #[cfg(feature = "cuda")]
    pub fn nccl_library() -> Result<String> {
        nccl_lib::library_path()
    }

    /// True for an NCCL communicator (whose point-to-point transfers are
    /// rendezvous and may not progress concurrently), false in-process.
    pub fn is_nccl(&self) -> bool {
        match &self.imp {
            CommImpl::InProcess(_) => false,
            #[cfg(feature = "cuda")]
            CommImpl::Nccl(_) => true,
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A stream dedicated to this communicator (created with it). Any stream
    /// of the same device may be passed to the operations instead.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    fn check_stream(&self, op: &'static str, stream: &Stream) -> Result<()> {
        self.device
            .check_same_as(op, "stream", stream.device(), "the communicator")
    }

    fn check_len<T: CommElement>(
        &self,
        op: &'static str,
        arg: &'static str,
        buf: &dyn DeviceRead<T>,
        want: usize,
        rule: &str,
    ) -> Result<()> {
        self.device
            .check_same_as(op, arg, buf.device(), "the communicator")?;
        if buf.len() != want {
            return Err(Error::invalid(
                op,
                arg,
                format!("exactly {want} elements ({rule}, world size {})", self.size),
                format!("a buffer of {} elements", buf.len()),
            ));
        }
        Ok(())
    }

    /// Checks `big.len() == size * small.len()` (all-gather, reduce-scatter).
    fn check_world_multiple<T: CommElement>(
        &self,
        op: &'static str,
        (small_arg, small): (&'static str, &dyn DeviceRead<T>),
        (big_arg, big): (&'static str, &dyn DeviceRead<T>),
        rule: &str,
    ) -> Result<()> {
        self.device
            .check_same_as(op, small_arg, small.device(), "the communicator")?;
        let want = small.len().checked_mul(self.size).ok_or_else(|| {
            Error::invalid(
                op,
                small_arg,
                "a length whose world-size multiple fits in usize",
                small.len(),
            )
        })?;
        self.check_len(op, big_arg, big, want, rule)
    }

    /// Enqueues collective `kind` moving `count` elements of `T` per rank.
    fn collective<T: CommElement>(
        &self,
        stream: &Stream,
        kind: OpKind,
        count: usize,
        send: u64,
        recv: u64,
    ) -> Result<CommHandle> {
        let desc = OpDesc {
            kind,
            dtype: Some(T::DTYPE),
            count,
        };
        self.enqueue::<T>(stream, desc, send, recv)
    }

    fn check_peer(&self, op: &'static str, arg: &'static str, peer: usize) -> Result<()> {
        if peer >= self.size || peer == self.rank {
            return Err(Error::invalid(
                op,
                arg,
                format!(
                    "another rank in 0..{} (this is rank {})",
                    self.size, self.rank
                ),
                peer,
            ));
        }
        Ok(())
    }

    fn enqueue<T: CommElement>(
        &self,
        stream: &Stream,
        desc: OpDesc,
        send: u64,
        recv: u64,
    ) -> Result<CommHandle> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        match &self.imp {
            CommImpl::InProcess(r) => r.enqueue::<T>(stream, seq, desc, send, recv)?,
            #[cfg(feature = "cuda")]
            CommImpl::Nccl(n) => n.enqueue(stream, desc, send, recv)?,
        }
        Ok(CommHandle {
            event: stream.record_event()?,
        })
    }

    /// `recv = reduce over ranks of send` (same length on every rank).
    pub fn all_reduce<T: CommElement>(
        &self,
        stream: &Stream,
        send: &dyn DeviceRead<T>,
        recv: &mut dyn DeviceWrite<T>,
        op: ReduceOp,
    ) -> Result<CommHandle> {
        const OP: &str = "all_reduce";
        self.check_stream(OP, stream)?;
        self.check_len(OP, "recv", recv, send.len(), "recv.len() == send.len()")?;
        self.device
            .check_same_as(OP, "send", send.device(), "the communicator")?;
        self.collective::<T>(
            stream,
            OpKind::AllReduce(op),
            send.len(),
            send.addr(),
            recv.addr(),
        )
    }

    /// In-place all-reduce of `buf`.
    pub fn all_reduce_in_place<T: CommElement>(
        &self,
        stream: &Stream,
        buf: &mut dyn DeviceWrite<T>,
        op: ReduceOp,
    ) -> Result<CommHandle> {
        self.check_stream("all_reduce_in_place", stream)?;
        self.device.check_same_as(
            "all_reduce_in_place",
            "buf",
            buf.device(),
            "the communicator",
        )?;
        self.collective::<T>(
            stream,
            OpKind::AllReduce(op),
            buf.len(),
            buf.addr(),
            buf.addr(),
        )
    }

    /// `recv = concat over ranks r of send_r` (`recv.len() == size * send.len()`).
    pub fn all_gather<T: CommElement>(
        &self,
        stream: &Stream,
        send: &dyn DeviceRead<T>,
        recv: &mut dyn DeviceWrite<T>,
    ) -> Result<CommHandle> {
        const OP: &str = "all_gather";
        self.check_stream(OP, stream)?;
        self.check_world_multiple(
            OP,
            ("send", send),
            ("recv", recv),
            "recv.len() == size * send.len()",
        )?;
        self.collective::<T>(
            stream,
            OpKind::AllGather,
            send.len(),
            send.addr(),
            recv.addr(),
        )
    }

    /// `recv = slice `rank` of (reduce over ranks of send)`
    /// (`send.len() == size * recv.len()`).
    pub fn reduce_scatter<T: CommElement>(
        &self,
        stream: &Stream,
        send: &dyn DeviceRead<T>,
        recv: &mut dyn DeviceWrite<T>,
        op: ReduceOp,
    ) -> Result<CommHandle> {
        const OP: &str = "reduce_scatter";
        self.check_stream(OP, stream)?;
        self.check_world_multiple(
            OP,
            ("recv", recv),
            ("send", send),
            "send.len() == size * recv.len()",
        )?;
        self.collective::<T>(
            stream,
            OpKind::ReduceScatter(op),
            send.len(),
            send.addr(),
            recv.addr(),
        )
    }

    /// Copies `buf` of rank `root` into `buf` of every rank.
    pub fn broadcast<T: CommElement>(
        &self,
        stream: &Stream,
        buf: &mut dyn DeviceWrite<T>,
        root: usize,
    ) -> Result<CommHandle> {
        const OP: &str = "broadcast";
        self.check_stream(OP, stream)?;
        self.device
            .check_same_as(OP, "buf", buf.device(), "the communicator")?;
        if root >= self.size {
            return Err(Error::invalid(
                OP,
                "root",
                format!("a rank in 0..{}", self.size),
                root,
            ));
        }
        self.collective::<T>(
            stream,
            OpKind::Broadcast { root },
            buf.len(),
            buf.addr(),
            buf.addr(),
        )
    }

    /// Completes when every rank has reached it in its stream.
    pub fn barrier(&self, stream: &Stream) -> Result<CommHandle> {
        self.check_stream("barrier", stream)?;
        let desc = OpDesc {
            kind: OpKind::Barrier,
            dtype: None,
            count: 0,
        };
        self.enqueue::<u8>(stream, desc, 0, 0)
    }

    /// Sends `buf` to `peer`, which must post a matching `recv`.
    pub fn send<T: CommElement>(
        &self,
        stream: &Stream,
        buf: &dyn DeviceRead<T>,
        peer: usize,
    ) -> Result<CommHandle> {
        self.group_p2p(stream, &mut [P2p::Send(buf, peer)])
    }

    /// Receives into `buf` from `peer` (its `send` must have the same length).
    pub fn recv<T: CommElement>(
        &self,
        stream: &Stream,
        buf: &mut dyn DeviceWrite<T>,
        peer: usize,
    ) -> Result<CommHandle> {
        self.group_p2p(stream, &mut [P2p::Recv(buf, peer)])
    }

    /// A group of sends and receives that progress together (NCCL's
    /// `ncclGroupStart/End`): a ring exchange in one group cannot deadlock.
    pub fn group_p2p<T: CommElement>(
        &self,
        stream: &Stream,
        ops: &mut [P2p<'_, T>],
    ) -> Result<CommHandle> {
        const OP: &str = "group_p2p";
        self.check_stream(OP, stream)?;
        let mut plan = Vec::with_capacity(ops.len());
        for op in ops.iter() {
            match op {
                P2p::Send(b, peer) => {
                    self.check_peer(OP, "send peer", *peer)?;
                    self.device
                        .check_same_as(OP, "send buffer", b.device(), "the communicator")?;
                    plan.push(in_process::P2pPlan {
                        send: true,
                        peer: *peer,
                        addr: b.addr(),
                        count: b.len(),
                        dtype: T::DTYPE,
                    });
                }
                P2p::Recv(b, peer) => {
                    self.check_peer(OP, "recv peer", *peer)?;
                    self.device
                        .check_same_as(OP, "recv buffer", b.device(), "the communicator")?;
                    plan.push(in_process::P2pPlan {
                        send: false,
                        peer: *peer,
                        addr: b.addr(),
                        count: b.len(),
                        dtype: T::DTYPE,
                    });
                }
            }
        }
        match &self.imp {
            CommImpl::InProcess(r) => r.enqueue_p2p(stream, plan)?,
            #[cfg(feature = "cuda")]
            CommImpl::Nccl(n) => n.enqueue_p2p(stream, &plan)?,
        }
        Ok(CommHandle {
            event: stream.record_event()?,
        })
    }

    /// Splits into sub-communicators: ranks with the same `color` form one,
    /// ordered by `(key, rank)`; `color = None` takes part but gets none.
    /// Every rank of this communicator must call it (from its own thread).
    pub fn split(&self, color: Option<usize>, key: usize) -> Result<Option<Communicator>> {
        match &self.imp {
            CommImpl::InProcess(r) => r
                .split(color, key)?
                .map(|(rank, size, imp)| self.sub(rank, size, CommImpl::InProcess(imp)))
                .transpose(),
            #[cfg(feature = "cuda")]
            CommImpl::Nccl(n) => n
                .split(color, key)?
                .map(|(rank, size, imp)| self.sub(rank, size, CommImpl::Nccl(imp)))
                .transpose(),
        }
    }

    /// The first fault of this communicator, if it is broken: `None` while
    /// it is usable. In-process: a peer timed out, left (its communicator
    /// was dropped, e.g. its thread panicked) while others waited, or a
    /// point-to-point transfer could not complete; the fault is shared by
    /// every rank. NCCL: [`Communicator::wait`] found an asynchronous error
    /// or timed out and aborted this rank's communicator. Once broken, every
    /// operation fails at the call with "communicator is broken: \<fault\>";
    /// dropping it is always safe and does not wait for peers.
    pub fn fault(&self) -> Option<String> {
        match &self.imp {
            CommImpl::InProcess(r) => r.fault(),
            #[cfg(feature = "cuda")]
            CommImpl::Nccl(n) => n.fault(),
        }
    }

    /// Waits for `handle` from the host, failing (and, on NCCL, aborting the
    /// communicator) if it does not complete within `timeout` — the way to
    /// turn a dead peer into an error on GPUs. In-process operations also
    /// time out by themselves (the communicator's timeout).
    pub fn wait(&self, handle: &CommHandle, timeout: Duration) -> Result<()> {
        match &self.imp {
            CommImpl::InProcess(r) => {
                // Broken is broken on every call, even with nothing left to wait for.
                if let Some(f) = r.fault() {
                    return Err(Error::Backend {
                        backend: "in-process comm",
                        message: format!("communicator is broken: {f}"),
                    });
                }
                let deadline = std::time::Instant::now() + timeout;
                if handle.event.synchronize_until(deadline)? {
                    Ok(())
                } else {
                    Err(Error::Backend {
                        backend: "in-process comm",
                        message: format!("operation did not complete within {timeout:?}"),
                    })
                }
            }
            #[cfg(feature = "cuda")]
            CommImpl::Nccl(n) => n.wait(&handle.event, timeout),
        }
    }

    /// Waits from the host for everything enqueued on `stream` so far (this
    /// communicator's collectives on it, and those a layer enqueued on the
    /// communicator's own stream and made `stream` wait for), with the
    /// failure and abort of [`Communicator::wait`] after `timeout`.
    pub fn wait_stream(&self, stream: &Stream, timeout: Duration) -> Result<()> {
        let handle = CommHandle {
            event: stream.record_event()?,
        };
        self.wait(&handle, timeout)
    }

    fn sub(&self, rank: usize, size: usize, imp: CommImpl) -> Result<Communicator> {
        Ok(Communicator {
            rank,
            size,
            device: self.device.clone(),
            stream: self.device.new_stream()?,
            imp,
            seq: AtomicU64::new(0),
        })
    }

    /// This rank's communicator for its group along `axes` of `grid` (e.g.
    /// its tensor-parallel group). Every rank must call it with the same grid
    /// and axes: the ranks first all-gather them, and a rank whose grid or
    /// axes differ from this rank's makes the call fail on every rank with
    /// the same named error (nothing is split; the communicator stays
    /// usable). A grid whose world is not this communicator's size fails at
    /// once, before joining (its peers then time out).
    pub fn split_for_grid(
        &self,
        grid: &crate::core::rank_grid::RankGrid,
        axes: &[crate::core::rank_grid::Axis],
    ) -> Result<Communicator> {
        if grid.world != self.size {
            return Err(Error::invalid(
                "split_for_grid",
                "grid",
                format!("a grid of world size {}", self.size),
                grid.world,
            ));
        }
        let (color, key) = grid.color_and_key(self.rank, axes)?;
        self.check_same_grid(grid, axes)?;
        self.split(Some(color), key)?.ok_or_else(|| Error::Backend {
            backend: "comm",
            message: "split returned no communicator for a colored rank".into(),
        })
    }

    /// Fails on every rank when the ranks' `(grid, axes)` differ: each rank
    /// all-gathers its own on the communicator's stream and compares.
    fn check_same_grid(
        &self,
        grid: &crate::core::rank_grid::RankGrid,
        axes: &[crate::core::rank_grid::Axis],
    ) -> Result<()> {
        use crate::core::rank_grid::{Axis, RankOrder};
        let order = match grid.order {
            RankOrder::TpCpEpDpPp => 0,
            RankOrder::TpCpEpPpDp => 1,
        };
        let bits = axes.iter().fold(0i64, |m, a| {
            m | match a {
                Axis::Tp => 1,
                Axis::Cp => 2,
                Axis::Dp => 4,
                Axis::Pp => 8,
            }
        });
        let mine = [grid.world, grid.tp, grid.cp, grid.dp, grid.pp]
            .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
            .into_iter()
            .chain([order, bits])
            .collect::<Vec<i64>>();
        let n = mine.len();
        let send = self.device.upload(&mine)?;
        let mut all = DeviceBuffer::<i64>::zeros(&self.device, n * self.size)?;
        self.all_gather(&self.stream, &send, &mut all)?;
        self.stream.synchronize()?;
        let mut host = vec![0i64; all.len()];
        self.stream.copy_to_host(&all, &mut host)?;
        let all = host;
        let show = |v: &[i64]| {
            let axes: Vec<&str> = ["tp", "cp", "dp", "pp"]
                .iter()
                .enumerate()
                .filter(|(i, _)| v[6] & (1 << i) != 0)
                .map(|(_, a)| *a)
                .collect();
            format!(
                "world {} tp {} cp {} dp {} pp {} order {} axes {}",
                v[0],
                v[1],
                v[2],
                v[3],
                v[4],
                ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"][(v[5] as usize).min(1)],
                axes.join("+")
            )
        };
        match all.chunks_exact(n).enumerate().find(|(_, v)| *v != mine) {
            None => Ok(()),
            Some((r, theirs)) => Err(Error::invalid(
                "split_for_grid",
                "grid",
                format!(
                    "the same grid and axes on every rank (rank {} has {})",
                    self.rank,
                    show(&mine)
                ),
                format!("rank {r} with {}", show(theirs)),
            )),
        }
    }
}
