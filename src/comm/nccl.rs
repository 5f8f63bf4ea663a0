//! The NCCL backend (feature `cuda`): NCCL loaded at first use from where
//! it is installed (`nccl_lib`: `FTN_NCCL_LIBRARY`, `LD_LIBRARY_PATH`,
//! `CUDA_HOME`, the `nvidia-nccl-cu13`/`-cu12` wheels), with cudarc's type
//! definitions. Operations go straight to
//! NCCL on the caller's stream: no extra copies and no host synchronisation.
//! `Communicator::wait` polls `ncclCommGetAsyncError` and aborts the
//! communicator on an error or timeout, so a dead peer becomes an error.
//! `ncclCommAbort` frees the communicator, so an aborted rank remembers why
//! (its fault): every later operation, split or wait fails at the call with
//! "communicator is broken: <fault>" instead of touching the freed handle,
//! and dropping it does not call `ncclCommDestroy` again. The wait and
//! the fault bookkeeping are pure logic in `super::fault`, tested without
//! a GPU.

use std::time::Duration;

use cudarc::nccl::sys;

use super::fault::{wait_polling, FirstFault};
use super::in_process::P2pPlan;
use super::nccl_lib::{check, nccl};
use super::{OpDesc, OpKind, ReduceOp};
use crate::backend::{Device, DeviceImpl, Stream};
use crate::core::{DType, Error, Result};

pub(crate) fn unique_id() -> Result<[u8; 128]> {
    let lib = nccl()?;
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: a valid out-pointer.
    check("ncclGetUniqueId", unsafe { (lib.get_unique_id)(&mut id) })?;
    Ok(id.internal.map(|c| c as u8))
}

fn dtype(d: DType) -> Result<sys::ncclDataType_t> {
    Ok(match d {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        DType::I32 => sys::ncclDataType_t::ncclInt32,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
        DType::U8 => sys::ncclDataType_t::ncclUint8,
    })
}

fn red_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
    }
}

pub(crate) struct NcclRank {
    comm: sys::ncclComm_t,
    device: Device,
    /// Why this rank's communicator was aborted (then `comm` is freed).
    aborted: FirstFault,
}

// SAFETY: an ncclComm_t may be used from any thread, one call at a time; the
// Communicator API takes &self but NCCL serialises per communicator.
unsafe impl Send for NcclRank {}
// SAFETY: as above.
unsafe impl Sync for NcclRank {}

impl NcclRank {
    pub fn new(device: &Device, rank: usize, size: usize, id: &[u8; 128]) -> Result<NcclRank> {
        let DeviceImpl::Cuda(cuda) = &device.inner.imp else {
            return Err(Error::invalid(
                "Communicator::nccl",
                "device",
                "a CUDA device",
                format!("{device:?}"),
            ));
        };
        if rank >= size || size > i32::MAX as usize {
            return Err(Error::invalid(
                "Communicator::nccl",
                "rank",
                format!("< size = {size}"),
                rank,
            ));
        }
        let lib = nccl()?;
        cuda.bind()?;
        let uid = sys::ncclUniqueId {
            internal: id.map(|b| b as core::ffi::c_char),
        };
        let mut comm = std::ptr::null_mut();
        // SAFETY: comm is a valid out-pointer; the id came from ncclGetUniqueId.
        let r = unsafe { (lib.comm_init_rank)(&mut comm, size as i32, uid, rank as i32) };
        check("ncclCommInitRank", r)?;
        Ok(NcclRank {
            comm,
            device: device.clone(),
            aborted: FirstFault::default(),
        })
    }

    /// Why this rank's communicator was aborted, if it was.
    pub fn fault(&self) -> Option<String> {
        self.aborted.get()
    }

    /// Fails once the communicator was aborted (its handle is freed then).
    fn check_usable(&self) -> Result<()> {
        self.aborted.check("nccl")
    }

    fn raw_stream(&self, stream: &Stream) -> Result<sys::cudaStream_t> {
        let s = stream.cuda_raw().ok_or_else(|| {
            Error::invalid(
                "nccl collective",
                "stream",
                "a CUDA stream",
                "an emulator stream",
            )
        })?;
        if let DeviceImpl::Cuda(c) = &self.device.inner.imp {
            c.bind()?;
        }
        Ok(s as sys::cudaStream_t)
    }

    pub fn enqueue(&self, stream: &Stream, desc: OpDesc, send: u64, recv: u64) -> Result<()> {
        self.check_usable()?;
        let lib = nccl()?;
        let s = self.raw_stream(stream)?;
        let (sp, rp) = (
            send as *const core::ffi::c_void,
            recv as *mut core::ffi::c_void,
        );
        let dt = desc
            .dtype
            .map(dtype)
            .transpose()?
            .unwrap_or(sys::ncclDataType_t::ncclUint8);
        let n = self.size()?;
        let scratch = match desc.kind {
            OpKind::Barrier => stream.workspace(1)? as *mut core::ffi::c_void,
            _ => std::ptr::null_mut(),
        };
        // SAFETY (each call): addresses and counts were validated against the
        // buffers and the world size by Communicator before this call.
        let r = unsafe {
            match desc.kind {
                OpKind::AllReduce(op) => {
                    (lib.all_reduce)(sp, rp, desc.count, dt, red_op(op), self.comm, s)
                }
                OpKind::AllGather => (lib.all_gather)(sp, rp, desc.count, dt, self.comm, s),
                OpKind::ReduceScatter(op) => {
                    (lib.reduce_scatter)(sp, rp, desc.count / n, dt, red_op(op), self.comm, s)
                }
                OpKind::Broadcast { root } => {
                    (lib.broadcast)(sp, rp, desc.count, dt, root as i32, self.comm, s)
                }
                OpKind::Barrier => {
                    // A one-byte in-place all-reduce on the stream's scratch
                    // memory: NCCL has no barrier of its own.
                    (lib.all_reduce)(
                        scratch,
                        scratch,
                        1,
                        dt,
                        sys::ncclRedOp_t::ncclSum,
                        self.comm,
                        s,
                    )
                }
            }
        };
        check(&format!("{:?}", desc.kind), r)
    }

    pub fn enqueue_p2p(&self, stream: &Stream, plan: &[P2pPlan]) -> Result<()> {
        self.check_usable()?;
        let lib = nccl()?;
        let s = self.raw_stream(stream)?;
        // SAFETY: no arguments.
        check("ncclGroupStart", unsafe { (lib.group_start)() })?;
        let mut first = Ok(());
        for p in plan {
            let dt = dtype(p.dtype)?;
            // SAFETY: addresses and counts validated by Communicator.
            let r = unsafe {
                if p.send {
                    (lib.send)(p.addr as *const _, p.count, dt, p.peer as i32, self.comm, s)
                } else {
                    (lib.recv)(p.addr as *mut _, p.count, dt, p.peer as i32, self.comm, s)
                }
            };
            if first.is_ok() {
                first = check("ncclSend/ncclRecv", r);
            }
        }
        // SAFETY: closes the group opened above.
        check("ncclGroupEnd", unsafe { (lib.group_end)() })?;
        first
    }

    fn size(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: a live communicator and a valid out-pointer.
        check("ncclCommCount", unsafe {
            (nccl()?.comm_count)(self.comm, &mut n)
        })?;
        Ok(n as usize)
    }

    pub fn split(
        &self,
        color: Option<usize>,
        key: usize,
    ) -> Result<Option<(usize, usize, NcclRank)>> {
        self.check_usable()?;
        let lib = nccl()?;
        let mut new = std::ptr::null_mut();
        let c = color.map_or(-1, |c| c as i32); // NCCL_SPLIT_NOCOLOR
                                                // SAFETY: a live communicator; `new` is a valid out-pointer; NULL
                                                // config means the parent's.
        let r =
            unsafe { (lib.comm_split)(self.comm, c, key as i32, &mut new, std::ptr::null_mut()) };
        check("ncclCommSplit", r)?;
        if new.is_null() {
            return Ok(None);
        }
        let sub = NcclRank {
            comm: new,
            device: self.device.clone(),
            aborted: FirstFault::default(),
        };
        let mut rank = 0;
        // SAFETY: a live communicator and a valid out-pointer.
        check("ncclCommUserRank", unsafe {
            (lib.comm_user_rank)(sub.comm, &mut rank)
        })?;
        let size = sub.size()?;
        Ok(Some((rank as usize, size, sub)))
    }

    /// Waits for `event`, polling NCCL's asynchronous error; aborts the
    /// communicator on an error or after `timeout`.
    pub fn wait(&self, event: &crate::backend::Event, timeout: Duration) -> Result<()> {
        self.check_usable()?;
        let lib = nccl()?;
        wait_polling(
            "nccl",
            &self.aborted,
            timeout,
            || event.is_complete(),
            || {
                // Under the fault's lock: a wait on another thread cannot
                // abort (free) the communicator during the query.
                let query = || {
                    let mut state = sys::ncclResult_t::ncclSuccess;
                    // SAFETY: a live communicator (no fault recorded, and
                    // none can be while the lock is held) and a valid
                    // out-pointer.
                    let _ = unsafe { (lib.comm_get_async_error)(self.comm, &mut state) };
                    (state != sys::ncclResult_t::ncclSuccess
                        && state != sys::ncclResult_t::ncclInProgress)
                        .then(|| format!("{state:?}"))
                };
                self.aborted
                    .while_healthy(query)
                    .unwrap_or_else(|| Some("(aborted by a wait on another thread)".into()))
            },
            || {
                // SAFETY: aborting a live communicator once (FirstFault runs
                // this for the first fault only, under its lock); it is
                // never used again after this.
                let _ = unsafe { (lib.comm_abort)(self.comm) };
            },
        )
    }
}

impl Drop for NcclRank {
    fn drop(&mut self) {
        // An aborted communicator was already freed by ncclCommAbort.
        if self.aborted.is_set() {
            return;
        }
        if let Ok(lib) = nccl() {
            // SAFETY: destroying our own communicator once (it exists, so
            // NCCL loaded); errors are ignored (never panic in Drop).
            let _ = unsafe { (lib.comm_destroy)(self.comm) };
        }
    }
}
