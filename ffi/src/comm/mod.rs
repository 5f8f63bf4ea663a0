//! Communicators and collectives (NCCL's argument order).

use std::ffi::c_int;

use ferrotron::comm::Communicator;
use ferrotron::{Device, Result};

pub(crate) mod collectives;
pub(crate) mod job;

use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::enums::c_enum;
use crate::abi::handles::{check_out, get, handle, take, Child, ChildKind};
use crate::runtime::{ftnContext, ftnContext_t, ftnStream, ftnStream_t};

/// Reductions.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnRedOp_t {
    ftnSum = 0,
    ftnMax = 1,
    ftnMin = 2,
    /// Sum divided by the number of ranks (integer division for integers).
    ftnAvg = 3,
}
c_enum!(ftnRedOp_t: ftnSum, ftnMax, ftnMin, ftnAvg);

/// Bytes of an NCCL unique id.
pub const FTN_UNIQUE_ID_BYTES: usize = 128;

/// `ftn_comm_split` color of ranks that take part but get no communicator.
pub const FTN_SPLIT_NOCOLOR: c_int = -1;

/// An NCCL unique id: rank 0 creates it with `ftn_get_unique_id` and sends
/// the bytes to the other ranks (any way it likes).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ftnUniqueId_t {
    pub internal: [u8; FTN_UNIQUE_ID_BYTES],
}

handle!(ftnComm, ftnComm_t, 0x4654_4e43_4f4d_0005, "ftnComm_t", {
    comm: Communicator,
    child: Child,
    users: std::sync::Arc<std::sync::atomic::AtomicUsize>,
});

/// A new handle for `comm`, a child of the context `child` counts in.
pub(crate) fn wrap(comm: Communicator, child: Child) -> ftnComm_t {
    ftnComm::into_raw(comm, child, Default::default())
}

/// Held by a handle that borrows a communicator (a DDP): while one lives,
/// `ftn_comm_destroy` refuses to destroy the communicator.
pub(crate) struct CommUser(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl CommUser {
    pub(crate) fn new(c: &ftnComm) -> CommUser {
        c.users.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        CommUser(c.users.clone())
    }
}

impl Drop for CommUser {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Creates `nranks` ranks of one in-process communicator (emulator
/// contexts): rank `i` on `ctxs[i]` (the same context may be repeated),
/// written to `comms[i]`. A single thread may enqueue every rank's
/// collectives (they run on the streams' worker threads); the parallel
/// layers and blocks need one thread per rank (they may block the host).
/// A collective whose peers do not all arrive within 300 s fails with
/// ftnBackendError (`ftn_comm_init_all_with_timeout` sets another limit).
///
/// Bad input (at the call, nothing written to `comms`; ftnInvalidArgument):
/// `comms` NULL or not aligned for a pointer; `nranks` < 1; `ctxs` NULL;
/// any `ctxs[i]` NULL, stale or of another kind (all are checked before
/// anything is created); a CUDA context (in-process ranks need emulator
/// contexts). `comms` and `ctxs` are trusted to hold `nranks` entries.
#[no_mangle]
pub unsafe extern "C" fn ftn_comm_init_all(
    comms: *mut ftnComm_t,
    nranks: c_int,
    ctxs: *const ftnContext_t,
) -> ftnResult_t {
    export!(|op| {
        let t = ferrotron::comm::DEFAULT_TIMEOUT;
        // SAFETY: forwarded contracts.
        unsafe { init_all(op, comms, nranks, ctxs, t) }
    })
}

/// As `ftn_comm_init_all`, with the time (at least 1 ms) a collective waits
/// for its peers before it fails with ftnBackendError: a dead or missing
/// rank becomes an error instead of a hang.
///
/// Bad input: `timeout_ms` < 1: ftnInvalidArgument; otherwise as for
/// `ftn_comm_init_all` (nothing written to `comms` on failure).
#[no_mangle]
pub unsafe extern "C" fn ftn_comm_init_all_with_timeout(
    comms: *mut ftnComm_t,
    nranks: c_int,
    ctxs: *const ftnContext_t,
    timeout_ms: i64,
) -> ftnResult_t {
    export!(|op| {
        let ms = u64::try_from(timeout_ms)
            .ok()
            .filter(|&m| m >= 1)
            .ok_or_else(|| invalid(op, "timeout_ms", "at least 1", timeout_ms))?;
        // SAFETY: forwarded contracts.
        unsafe {
            init_all(
                op,
                comms,
                nranks,
                ctxs,
                std::time::Duration::from_millis(ms),
            )
        }
    })
}

/// # Safety
/// `comms` has room for `nranks` handles; `ctxs` holds `nranks` handles.
unsafe fn init_all(
    op: &'static str,
    comms: *mut ftnComm_t,
    nranks: c_int,
    ctxs: *const ftnContext_t,
    timeout: std::time::Duration,
) -> Result<()> {
    check_out(op, "comms", comms)?;
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| invalid(op, "nranks", "at least 1", nranks))?;
    if ctxs.is_null() {
        return Err(invalid(
            op,
            "ctxs",
            format!("a non-NULL array of {n} contexts"),
            "NULL",
        ));
    }
    // SAFETY: ctxs holds nranks handles by the contract.
    let handles = unsafe { std::slice::from_raw_parts(ctxs, n) };
    // Every handle is checked before anything is allocated for `nranks`
    // ranks: a count larger than the array ends at its first non-handle.
    for &h in handles {
        // SAFETY: handle contract.
        unsafe { get::<ftnContext>(op, "ctxs[i]", h)? };
    }
    let mut devs: Vec<Device> = Vec::new();
    let mut children = Vec::new();
    devs.try_reserve_exact(n)
        .and_then(|()| children.try_reserve_exact(n))
        .map_err(|_| invalid(op, "nranks", "a rank count whose tables fit in memory", n))?;
    for &h in handles {
        // SAFETY: handle contract.
        let c = unsafe { get::<ftnContext>(op, "ctxs[i]", h)? };
        devs.push(c.dev.clone());
        children.push(Child::new(&c.children, ChildKind::Comm));
    }
    let made = Communicator::in_process_with_timeout(&devs, timeout)?;
    for (i, (c, child)) in made.into_iter().zip(children).enumerate() {
        // SAFETY: comms holds nranks slots by the contract.
        unsafe { comms.add(i).write(wrap(c, child)) };
    }
    Ok(())
}

/// A new NCCL unique id (CUDA builds; `ftnBackendUnavailable` otherwise).
///
/// Bad input: `id` NULL or misaligned: ftnInvalidArgument, nothing written;
/// a build without CUDA: ftnBackendUnavailable; NCCL failing to make an id:
/// ftnBackendError.
#[no_mangle]
pub unsafe extern "C" fn ftn_get_unique_id(id: *mut ftnUniqueId_t) -> ftnResult_t {
    export!(|op| {
        check_out(op, "id", id)?;
        #[cfg(feature = "cuda")]
        {
            let bytes = Communicator::nccl_unique_id()?;
            // SAFETY: checked non-NULL.
            unsafe { id.write(ftnUniqueId_t { internal: bytes }) };
            Ok(())
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(ferrotron::Error::BackendUnavailable {
                backend: "nccl",
                reason: "libferrotron was built without feature `cuda`".into(),
            })
        }
    })
}

/// Rank `rank` of an `nranks`-rank NCCL communicator on a CUDA context,
/// from the unique id rank 0 created. Blocks until every rank has joined.
///
/// Bad input (at the call, `*comm` untouched; ftnInvalidArgument): `comm`
/// NULL or misaligned; `ctx` NULL, stale or of another kind; `id` NULL;
/// `nranks` < 1; `rank` outside `0..nranks`; with CUDA, an emulator
/// `ctx`. A build without CUDA: ftnBackendUnavailable (after the argument
/// checks); no NCCL library to load: an error naming what to install;
/// `ncclCommInitRank` failing: ftnBackendError. Ranks that disagree on
/// `nranks` or the id, or never join, are not detected: NCCL hangs or
/// fails.
#[no_mangle]
pub unsafe extern "C" fn ftn_comm_init_rank(
    comm: *mut ftnComm_t,
    ctx: ftnContext_t,
    nranks: c_int,
    id: *const ftnUniqueId_t,
    rank: c_int,
) -> ftnResult_t {
    export!(|op| {
        check_out(op, "comm", comm)?;
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        if id.is_null() {
            return Err(invalid(op, "id", "a non-NULL ftnUniqueId_t", "NULL"));
        }
        let n = usize::try_from(nranks)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| invalid(op, "nranks", "at least 1", nranks))?;
        let r = usize::try_from(rank)
            .ok()
            .filter(|&r| r < n)
            .ok_or_else(|| invalid(op, "rank", format!("a rank in 0..{n}"), rank))?;
        #[cfg(feature = "cuda")]
        {
            // SAFETY: checked non-NULL; a ftnUniqueId_t by the contract.
            let bytes = unsafe { (*id).internal };
            let made = Communicator::nccl(&c.dev, r, n, &bytes)?;
            // SAFETY: checked non-NULL.
            unsafe { comm.write(wrap(made, Child::new(&c.children, ChildKind::Comm))) };
            Ok(())
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (c, r);
            Err(ferrotron::Error::BackendUnavailable {
                backend: "nccl",
                reason: "libferrotron was built without feature `cuda` (use ftn_comm_init_all on the emulator)".into(),
            })
        }
    })
}

/// Destroys one rank (waits for its context's pending work first). Until
/// destroyed a communicator (and each handle from `ftn_comm_split*` /
/// `ftn_comm_get_stream`) keeps its context from being destroyed.
///
/// Bad input: NULL, stale or another kind of handle: ftnInvalidArgument. A
/// communicator used by a live DDP (`ftn_ddp_create`) is not destroyed:
/// ftnInvalidArgument; destroy the DDP first. Destroying a broken
/// communicator (after a timeout or a lost peer) succeeds; in-process,
/// peers waiting for this rank then fail at once. A pending failure of the
/// context's work is returned, and the rank is destroyed either way.
#[no_mangle]
pub unsafe extern "C" fn ftn_comm_destroy(comm: ftnComm_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let users = unsafe { get(op, "comm", comm)? }
            .users
            .load(std::sync::atomic::Ordering::SeqCst);
        if users > 0 {
            return Err(invalid(
                op,
                "comm",
                "a communicator no live DDP uses (destroy its DDPs first)",
                format!("a communicator used by {users} live DDPs"),
            ));
        }
        // SAFETY: handle contract.
        let c = unsafe { take(op, "comm", comm)? };
        let r = c.comm.device().synchronize();
        drop(c);
        r
    })
}

/// Number of ranks.
///
/// Bad input (ftnInvalidArgument, nothing written): `comm` NULL, stale or
/// of another kind; `count` NULL or not aligned for an `int`. Works on a
/// broken communicator.
#[no_mangle]
pub unsafe extern "C" fn ftn_comm_count(comm: ftnComm_t, count: *mut c_int) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle and out-pointer contracts.
        unsafe {
            let c = get(op, "comm", comm)?;
            crate::abi::handles::write_out(op, "count", count, c.comm.size() as c_int)
        }
    })
}

/// This rank's index.
///
/// Bad input (ftnInvalidArgument, nothing written): `comm` NULL, stale or
/// of another kind; `rank` NULL or not aligned for an `int`. Works on a
/// broken communicator.
#[no_mangle]
pub unsafe extern "C" fn ftn_comm_user_rank(comm: ftnComm_t, rank: *mut c_int) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle and out-pointer contracts.
        unsafe {
            let c = get(op, "comm", comm)?;
            crate::abi::handles::write_out(op, "rank", rank, c.comm.rank() as c_int)
        }
    })
}

/// Splits into sub-communicators: ranks with the same `color` form one,
/// ordered by `(key, rank)`; `color = FTN_SPLIT_NOCOLOR` takes part but
/// gets NULL. Every rank must call it, from its own thread (it blocks
/// until all have).
///
/// Bad input (at the call, `*newcomm` untouched): `comm` NULL, stale or of
/// another kind, `newcomm` NULL or misaligned, `color` negative other than
/// `FTN_SPLIT_NOCOLOR`, `key` negative: ftnInvalidArgument (checked before
/// joining, so peers are left waiting). A broken communicator, or peers
/// that do not all call within the communicator's timeout or are gone:
/// ftnBackendError, and the communicator is then broken on every rank.
#[no_mangle]
pub unsafe extern "C" fn ftn_comm_split(
    comm: ftnComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ftnComm_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "comm", comm)? };
        check_out(op, "newcomm", newcomm)?;
        let color = match color {
            FTN_SPLIT_NOCOLOR => None,
            c if c >= 0 => Some(c as usize),
            other => {
                return Err(invalid(
                    op,
                    "color",
                    "a color >= 0 or FTN_SPLIT_NOCOLOR",
                    other,
                ))
            }
        };
        let key = usize::try_from(key).map_err(|_| invalid(op, "key", "a key >= 0", key))?;
        let sub = c.comm.split(color, key)?;
        // SAFETY: checked non-NULL.
        unsafe { newcomm.write(sub.map_or(std::ptr::null_mut(), |s| wrap(s, c.child.clone()))) };
        Ok(())
    })
}

/// Waits from the host, up to `timeout_ms`, for everything enqueued on
/// `stream` so far (this communicator's collectives, and those a layer
/// enqueued on the communicator's own stream and made `stream` wait for).
/// On timeout it fails with ftnBackendError and, on NCCL, aborts the
/// communicator (a dead peer becomes an error instead of a hang); the
/// communicator is then broken (every later call fails with
/// ftnBackendError naming the fault) and must be destroyed. In-process the
/// operation keeps waiting (up to the communicator's own timeout) and the
/// communicator stays usable.
///
/// Bad input: `comm` or `stream` NULL, stale or of another kind, a negative
/// `timeout_ms`: ftnInvalidArgument, nothing waited for. `timeout_ms` 0
/// checks once; a `stream` of another context than the communicator's:
/// ftnDeviceMismatch. A timeout: ftnBackendError (NCCL: the communicator is
/// aborted and broken). A communicator that is already broken:
/// ftnBackendError naming the fault, on both backends, even with nothing
/// to wait for. In-process, failures of the awaited work are not
/// reported here (they come from the stream's synchronize); NCCL reports an
/// asynchronous NCCL error here as ftnBackendError and aborts.
#[no_mangle]
pub unsafe extern "C" fn ftn_comm_wait(
    comm: ftnComm_t,
    stream: ftnStream_t,
    timeout_ms: i64,
) -> ftnResult_t {
    export!(|op| {
        let c = call(op, comm, stream)?;
        // A stream of another context carries none of this communicator's
        // work: mixing contexts is ftnDeviceMismatch, as everywhere.
        c.comm
            .device()
            .check_same_as(op, "stream", c.stream.device(), "the communicator")?;
        let ms =
            u64::try_from(timeout_ms).map_err(|_| invalid(op, "timeout_ms", ">= 0", timeout_ms))?;
        c.comm
            .wait_stream(c.stream, std::time::Duration::from_millis(ms))
    })
}

/// A new handle to the communicator's own stream: the one the parallel
/// layers overlap their backward communication on. Make other streams
/// wait for it with events; destroy the handle with `ftn_stream_destroy`
/// (the stream itself lives as long as the communicator).
///
/// Bad input (ftnInvalidArgument, nothing written): `comm` NULL, stale or
/// of another kind; `stream` NULL or misaligned. Works on a broken
/// communicator.
#[no_mangle]
pub unsafe extern "C" fn ftn_comm_get_stream(
    comm: ftnComm_t,
    stream: *mut ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get::<ftnComm>(op, "comm", comm)? };
        check_out(op, "stream", stream)?;
        let s = ftnStream::into_raw(
            c.comm.stream().clone(),
            std::sync::Mutex::new(ferrotron::ops::multi_tensor::MultiTensor::new()),
            None,
            c.child.sibling(ChildKind::Stream),
        );
        // SAFETY: checked non-NULL.
        unsafe { stream.write(s) };
        Ok(())
    })
}

pub(crate) struct Call<'a> {
    pub(crate) comm: &'a Communicator,
    pub(crate) stream: &'a ferrotron::Stream,
    pub(crate) dev: Device,
}

/// The communicator and stream of a call, checked.
pub(crate) fn call<'a>(op: &'static str, comm: ftnComm_t, stream: ftnStream_t) -> Result<Call<'a>> {
    // SAFETY: handle contracts of every exported function.
    let (c, s) = unsafe {
        (
            get::<ftnComm>(op, "comm", comm)?,
            get::<ftnStream>(op, "stream", stream)?,
        )
    };
    Ok(Call {
        comm: &c.comm,
        stream: &s.stream,
        dev: s.stream.device().clone(),
    })
}
