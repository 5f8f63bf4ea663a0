//! Collectives (NCCL's argument order): all-reduce, all-gather,
//! reduce-scatter, broadcast, barrier, point-to-point and grouped p2p.

use std::ffi::{c_int, c_void};

use ferrotron::comm::{CommElement, P2p, ReduceOp};
use ferrotron::Result;

use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::dtype::dispatch_dtype;
use crate::abi::enums::parse_enum;
use crate::abi::views::view;
use crate::comm::ftnRedOp_t;
use crate::comm::{call, ftnComm_t, Call};
use crate::runtime::ftnStream_t;

fn red_op(op: &'static str, v: c_int) -> Result<ReduceOp> {
    Ok(match parse_enum(op, "op", v)? {
        ftnRedOp_t::ftnSum => ReduceOp::Sum,
        ftnRedOp_t::ftnMax => ReduceOp::Max,
        ftnRedOp_t::ftnMin => ReduceOp::Min,
        ftnRedOp_t::ftnAvg => ReduceOp::Avg,
    })
}

fn count_times(op: &'static str, arg: &'static str, count: usize, ranks: usize) -> Result<usize> {
    count.checked_mul(ranks).ok_or_else(|| {
        invalid(
            op,
            arg,
            "a count whose world-size multiple fits in size_t",
            count,
        )
    })
}

unsafe fn all_reduce_t<T: CommElement>(
    op: &'static str,
    c: &Call,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    red: ReduceOp,
) -> Result<()> {
    // SAFETY: pointer contracts: `count` elements each.
    let (s, mut r) = unsafe {
        (
            view::<T>(&c.dev, op, "sendbuff", send, count)?,
            view::<T>(&c.dev, op, "recvbuff", recv, count)?,
        )
    };
    c.comm.all_reduce(c.stream, &s, &mut r, red).map(drop)
}

/// `recvbuff = reduce over ranks of sendbuff` (`count` elements each; in
/// place when the two are equal). Enqueued on `stream`.
///
/// Bad input at the call (nothing enqueued): `comm` or `stream` NULL, stale
/// or of another kind, `datatype` outside `ftnDataType_t`, `op` outside
/// `ftnRedOp_t`, `sendbuff` / `recvbuff` NULL with `count > 0` or not
/// aligned to the element size: ftnInvalidArgument; a `stream` of another
/// context: ftnDeviceMismatch; a broken communicator: ftnBackendError.
/// `count` 0 still takes part (every rank must call it). At synchronize
/// (in-process), ftnBackendError: ranks that disagree on count, datatype or
/// op (the communicator stays usable); peers that time out or are gone (it
/// is then broken). Partial overlap of the buffers is not checked.
#[no_mangle]
pub unsafe extern "C" fn ftn_all_reduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: ftnComm_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|func| {
        let c = call(func, comm, stream)?;
        let r = red_op(func, op)?;
        // SAFETY: pointer contracts.
        dispatch_dtype!(func, "datatype", datatype, T => unsafe { all_reduce_t::<T>(func, &c, sendbuff, recvbuff, count, r) })
    })
}

unsafe fn all_gather_t<T: CommElement>(
    op: &'static str,
    c: &Call,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
) -> Result<()> {
    let total = count_times(op, "sendcount", count, c.comm.size())?;
    // SAFETY: pointer contracts.
    let (s, mut r) = unsafe {
        (
            view::<T>(&c.dev, op, "sendbuff", send, count)?,
            view::<T>(&c.dev, op, "recvbuff", recv, total)?,
        )
    };
    c.comm.all_gather(c.stream, &s, &mut r).map(drop)
}

/// `recvbuff` (`nranks * sendcount` elements) = the ranks' `sendbuff`s
/// (`sendcount` each) in rank order.
///
/// Bad input at the call (nothing enqueued): `comm` or `stream` NULL, stale
/// or of another kind, `datatype` outside `ftnDataType_t`, `nranks *
/// sendcount` overflowing, `sendbuff` / `recvbuff` NULL when they describe
/// elements or not aligned to the element size: ftnInvalidArgument; a
/// `stream` of another context: ftnDeviceMismatch; a broken communicator:
/// ftnBackendError. `sendcount` 0 still takes part. At synchronize
/// (in-process), ftnBackendError: ranks that disagree on count or datatype
/// (the communicator stays usable); peers that time out or are gone (it is
/// then broken).
#[no_mangle]
pub unsafe extern "C" fn ftn_all_gather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: ftnComm_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        let c = call(op, comm, stream)?;
        // SAFETY: pointer contracts.
        dispatch_dtype!(op, "datatype", datatype, T => unsafe { all_gather_t::<T>(op, &c, sendbuff, recvbuff, sendcount) })
    })
}

unsafe fn reduce_scatter_t<T: CommElement>(
    op: &'static str,
    c: &Call,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    red: ReduceOp,
) -> Result<()> {
    let total = count_times(op, "recvcount", count, c.comm.size())?;
    // SAFETY: pointer contracts.
    let (s, mut r) = unsafe {
        (
            view::<T>(&c.dev, op, "sendbuff", send, total)?,
            view::<T>(&c.dev, op, "recvbuff", recv, count)?,
        )
    };
    c.comm.reduce_scatter(c.stream, &s, &mut r, red).map(drop)
}

/// `recvbuff` (`recvcount` elements) = slice `rank` of the reduction over
/// ranks of `sendbuff` (`nranks * recvcount` elements).
///
/// Bad input at the call (nothing enqueued): `comm` or `stream` NULL, stale
/// or of another kind, `datatype` outside `ftnDataType_t`, `op` outside
/// `ftnRedOp_t`, `nranks * recvcount` overflowing, `sendbuff` / `recvbuff`
/// NULL when they describe elements or not aligned to the element size:
/// ftnInvalidArgument; a `stream` of another context: ftnDeviceMismatch; a
/// broken communicator: ftnBackendError. `recvcount` 0 still takes part. At
/// synchronize (in-process), ftnBackendError: ranks that disagree on count,
/// datatype or op (the communicator stays usable); peers that time out or
/// are gone (it is then broken).
#[no_mangle]
pub unsafe extern "C" fn ftn_reduce_scatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: ftnComm_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|func| {
        let c = call(func, comm, stream)?;
        let r = red_op(func, op)?;
        // SAFETY: pointer contracts.
        dispatch_dtype!(func, "datatype", datatype, T => unsafe { reduce_scatter_t::<T>(func, &c, sendbuff, recvbuff, recvcount, r) })
    })
}

unsafe fn broadcast_t<T: CommElement>(
    op: &'static str,
    c: &Call,
    buf: *mut c_void,
    count: usize,
    root: usize,
) -> Result<()> {
    // SAFETY: pointer contract.
    let mut b = unsafe { view::<T>(&c.dev, op, "buff", buf, count)? };
    c.comm.broadcast(c.stream, &mut b, root).map(drop)
}

/// Copies `buff` (`count` elements) of rank `root` into `buff` of every rank.
///
/// Bad input at the call (nothing enqueued): `comm` or `stream` NULL, stale
/// or of another kind, `datatype` outside `ftnDataType_t`, `root` negative
/// or `>= nranks`, `buff` NULL with `count > 0` or not aligned to the
/// element size: ftnInvalidArgument; a `stream` of another context:
/// ftnDeviceMismatch; a broken communicator: ftnBackendError. `count` 0
/// still takes part. At synchronize (in-process), ftnBackendError: ranks
/// that disagree on count, datatype or root (the communicator stays
/// usable); peers that time out or are gone (it is then broken).
#[no_mangle]
pub unsafe extern "C" fn ftn_broadcast(
    buff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: ftnComm_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        let c = call(op, comm, stream)?;
        let root = usize::try_from(root).map_err(|_| invalid(op, "root", "a rank >= 0", root))?;
        // SAFETY: pointer contracts.
        dispatch_dtype!(op, "datatype", datatype, T => unsafe { broadcast_t::<T>(op, &c, buff, count, root) })
    })
}

/// Completes (in `stream` order) when every rank has reached it.
///
/// Bad input at the call (nothing enqueued): `comm` or `stream` NULL, stale
/// or of another kind: ftnInvalidArgument; a `stream` of another context:
/// ftnDeviceMismatch; a broken communicator: ftnBackendError. Peers that do
/// not arrive within the timeout or are gone: ftnBackendError at
/// synchronize, and the communicator is broken.
#[no_mangle]
pub unsafe extern "C" fn ftn_barrier(comm: ftnComm_t, stream: ftnStream_t) -> ftnResult_t {
    export!(|op| {
        let c = call(op, comm, stream)?;
        c.comm.barrier(c.stream).map(drop)
    })
}

unsafe fn send_t<T: CommElement>(
    op: &'static str,
    c: &Call,
    buf: *const c_void,
    count: usize,
    peer: usize,
) -> Result<()> {
    // SAFETY: pointer contract.
    let b = unsafe { view::<T>(&c.dev, op, "sendbuff", buf, count)? };
    c.comm.send(c.stream, &b, peer).map(drop)
}

unsafe fn recv_t<T: CommElement>(
    op: &'static str,
    c: &Call,
    buf: *mut c_void,
    count: usize,
    peer: usize,
) -> Result<()> {
    // SAFETY: pointer contract.
    let mut b = unsafe { view::<T>(&c.dev, op, "recvbuff", buf, count)? };
    c.comm.recv(c.stream, &mut b, peer).map(drop)
}

/// Sends `count` elements to `peer`, which must post a matching `ftn_recv`.
/// A rank never sends to itself, on either backend (NCCL alone would take
/// it as a local copy; nothing here needs one: use `ftn_memcpy_dtod`).
///
/// Bad input at the call (nothing enqueued): `comm` or `stream` NULL, stale
/// or of another kind, `datatype` outside `ftnDataType_t`, `peer` negative,
/// `>= nranks` or this rank, `sendbuff` NULL with `count > 0` or not
/// aligned to the element size: ftnInvalidArgument; a `stream` of another
/// context: ftnDeviceMismatch; a broken communicator: ftnBackendError. At
/// synchronize, ftnBackendError: a receive of another count or datatype, a
/// peer that never receives (timeout) or is gone.
#[no_mangle]
pub unsafe extern "C" fn ftn_send(
    sendbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: ftnComm_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        let c = call(op, comm, stream)?;
        let peer = usize::try_from(peer).map_err(|_| invalid(op, "peer", "a rank >= 0", peer))?;
        // SAFETY: pointer contracts.
        dispatch_dtype!(op, "datatype", datatype, T => unsafe { send_t::<T>(op, &c, sendbuff, count, peer) })
    })
}

/// Receives `count` elements from `peer` (its `ftn_send` has the same count).
///
/// Bad input at the call (nothing enqueued): as for `ftn_send` (`recvbuff`
/// in place of `sendbuff`). At synchronize, ftnBackendError: a send of
/// another count or datatype, a peer that never sends (timeout) or is gone.
#[no_mangle]
pub unsafe extern "C" fn ftn_recv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: ftnComm_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        let c = call(op, comm, stream)?;
        let peer = usize::try_from(peer).map_err(|_| invalid(op, "peer", "a rank >= 0", peer))?;
        // SAFETY: pointer contracts.
        dispatch_dtype!(op, "datatype", datatype, T => unsafe { recv_t::<T>(op, &c, recvbuff, count, peer) })
    })
}

/// One operation of `ftn_group_p2p` (fixed layout).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnP2pOp_t {
    /// Device buffer of `count` elements (sent from, or received into).
    pub buff: *mut c_void,
    pub count: usize,
    pub peer: i32,
    /// 0: send `buff` to `peer`; non-zero: receive into `buff` from `peer`.
    pub is_recv: i32,
}

unsafe fn group_t<T: CommElement>(op: &'static str, c: &Call, ops: &[ftnP2pOp_t]) -> Result<()> {
    let mut views = crate::abi::args::try_vec(op, "ops", ops.len())?;
    for (i, o) in ops.iter().enumerate() {
        let peer = usize::try_from(o.peer).map_err(|_| {
            invalid(
                op,
                "ops[i].peer",
                "a rank >= 0",
                format!("{} (op {i})", o.peer),
            )
        })?;
        // SAFETY: pointer contract: `count` elements.
        views.push((
            unsafe { view::<T>(&c.dev, op, "ops[i].buff", o.buff, o.count)? },
            peer,
            o.is_recv != 0,
        ));
    }
    let mut group: Vec<P2p<'_, T>> = views
        .iter_mut()
        .map(|(v, peer, recv)| {
            if *recv {
                P2p::Recv(v, *peer)
            } else {
                P2p::Send(v, *peer)
            }
        })
        .collect();
    c.comm.group_p2p(c.stream, &mut group).map(drop)
}

/// A group of sends and receives that progress together (NCCL's
/// `ncclGroupStart/End` around `ncclSend/ncclRecv`): a ring exchange in one
/// group cannot deadlock. `ops` holds `count` entries.
///
/// Bad input at the call (nothing enqueued): `comm` or `stream` NULL, stale
/// or of another kind; `ops` NULL with `count > 0` or misaligned; a `count`
/// whose array overflows; `datatype` outside `ftnDataType_t`; an entry
/// (named `ops[i].<field>`) with `peer` negative, `>= nranks` or this rank,
/// or `buff` NULL with `count > 0` or not aligned to the element size:
/// ftnInvalidArgument; a `stream` of another context: ftnDeviceMismatch; a
/// broken communicator: ftnBackendError. `count` 0 enqueues an empty group.
/// At synchronize, ftnBackendError as for `ftn_send` / `ftn_recv`.
#[no_mangle]
pub unsafe extern "C" fn ftn_group_p2p(
    ops: *const ftnP2pOp_t,
    count: usize,
    datatype: c_int,
    comm: ftnComm_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        let c = call(op, comm, stream)?;
        if count
            .checked_mul(std::mem::size_of::<ftnP2pOp_t>())
            .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(invalid(
                op,
                "count",
                "a count whose array size fits in isize",
                count,
            ));
        }
        if count > 0 && ops.is_null() {
            return Err(invalid(
                op,
                "ops",
                format!("a non-NULL array of {count} ftnP2pOp_t"),
                "NULL",
            ));
        }
        if (ops as usize) % std::mem::align_of::<ftnP2pOp_t>() != 0 {
            return Err(invalid(
                op,
                "ops",
                "a pointer aligned for ftnP2pOp_t",
                format!("{ops:p}"),
            ));
        }
        let list = if count == 0 {
            &[][..]
        } else {
            // SAFETY: non-NULL, aligned, `count` entries by the contract.
            unsafe { std::slice::from_raw_parts(ops, count) }
        };
        // SAFETY: pointer contracts.
        dispatch_dtype!(op, "datatype", datatype, T => unsafe { group_t::<T>(op, &c, list) })
    })
}
