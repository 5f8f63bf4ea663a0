//! The NCCL backend (feature `cuda`): cudarc's NCCL bindings, loaded
//! dynamically (libnccl.so.2 must be on the loader path, e.g. from the
//! `nvidia-nccl-cu12` wheel's `nvidia/nccl/lib`). Operations go straight to
//! NCCL on the caller's stream: no extra copies and no host synchronisation.
//! `Communicator::wait` polls `ncclCommGetAsyncError` and aborts the
//! communicator on an error or timeout, so a dead peer becomes an error.

use std::time::{Duration, Instant};

use cudarc::nccl::{result, sys};

use super::in_process::P2pPlan;
use super::{OpDesc, OpKind, ReduceOp};
use crate::backend::{Device, DeviceImpl, Stream};
use crate::core::{DType, Error, Result};

fn nccl_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend {
        backend: "nccl",
        message: format!("{what}: {e:?}"),
    }
}

fn check_library() -> Result<()> {
    // SAFETY: only tries to open the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::BackendUnavailable {
            backend: "nccl",
            reason: "libnccl.so.2 was not found on the loader path (LD_LIBRARY_PATH)".into(),
        });
    }
    Ok(())
}

pub(crate) fn unique_id() -> Result<[u8; 128]> {
    check_library()?;
    let id = result::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
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
        check_library()?;
        cuda.bind()?;
        let uid = sys::ncclUniqueId {
            internal: id.map(|b| b as core::ffi::c_char),
        };
        let mut comm = std::ptr::null_mut();
        // SAFETY: comm is a valid out-pointer; the id came from ncclGetUniqueId.
        unsafe { result::comm_init_rank(&mut comm, size as i32, uid, rank as i32) }
            .map_err(|e| nccl_err("ncclCommInitRank", e))?;
        Ok(NcclRank {
            comm,
            device: device.clone(),
        })
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
                    result::all_reduce(sp, rp, desc.count, dt, red_op(op), self.comm, s)
                }
                OpKind::AllGather => result::all_gather(sp, rp, desc.count, dt, self.comm, s),
                OpKind::ReduceScatter(op) => {
                    result::reduce_scatter(sp, rp, desc.count / n, dt, red_op(op), self.comm, s)
                }
                OpKind::Broadcast { root } => {
                    result::broadcast(sp, rp, desc.count, dt, root as i32, self.comm, s)
                }
                OpKind::Barrier => {
                    // A one-byte in-place all-reduce on the stream's scratch
                    // memory: NCCL has no barrier of its own.
                    result::all_reduce(
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
        r.map(|_| ())
            .map_err(|e| nccl_err(&format!("{:?}", desc.kind), e))
    }

    pub fn enqueue_p2p(&self, stream: &Stream, plan: &[P2pPlan]) -> Result<()> {
        let s = self.raw_stream(stream)?;
        result::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let mut first = Ok(());
        for p in plan {
            let dt = dtype(p.dtype)?;
            // SAFETY: addresses and counts validated by Communicator.
            let r = unsafe {
                if p.send {
                    result::send(p.addr as *const _, p.count, dt, p.peer as i32, self.comm, s)
                } else {
                    result::recv(p.addr as *mut _, p.count, dt, p.peer as i32, self.comm, s)
                }
            };
            if let (Err(e), true) = (r, first.is_ok()) {
                first = Err(nccl_err("ncclSend/ncclRecv", e));
            }
        }
        result::group_end().map_err(|e| nccl_err("ncclGroupEnd", e))?;
        first
    }

    fn size(&self) -> Result<usize> {
        // SAFETY: a live communicator.
        unsafe { result::comm_count(self.comm) }
            .map(|n| n as usize)
            .map_err(|e| nccl_err("ncclCommCount", e))
    }

    pub fn split(
        &self,
        color: Option<usize>,
        key: usize,
    ) -> Result<Option<(usize, usize, NcclRank)>> {
        let mut new = std::ptr::null_mut();
        let c = color.map_or(-1, |c| c as i32); // NCCL_SPLIT_NOCOLOR
                                                // SAFETY: a live communicator; `new` is a valid out-pointer.
        unsafe { sys::ncclCommSplit(self.comm, c, key as i32, &mut new, std::ptr::null_mut()) }
            .result()
            .map_err(|e| nccl_err("ncclCommSplit", e))?;
        if new.is_null() {
            return Ok(None);
        }
        let sub = NcclRank {
            comm: new,
            device: self.device.clone(),
        };
        // SAFETY: a live communicator.
        let rank = unsafe { result::comm_user_rank(sub.comm) }
            .map_err(|e| nccl_err("ncclCommUserRank", e))?;
        let size = sub.size()?;
        Ok(Some((rank as usize, size, sub)))
    }

    /// Waits for `event`, polling NCCL's asynchronous error; aborts the
    /// communicator on an error or after `timeout`.
    pub fn wait(&self, event: &crate::backend::Event, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if event.is_complete()? {
                return Ok(());
            }
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator and a valid out-pointer.
            let _ = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut state) };
            let failed = state != sys::ncclResult_t::ncclSuccess
                && state != sys::ncclResult_t::ncclInProgress;
            if failed || Instant::now() >= deadline {
                // SAFETY: aborting a live communicator; later calls fail cleanly.
                let _ = unsafe { result::comm_abort(self.comm) };
                return Err(Error::Backend {
                    backend: "nccl",
                    message: if failed {
                        format!("asynchronous NCCL error {state:?}; communicator aborted")
                    } else {
                        format!("operation did not complete within {timeout:?}; communicator aborted (a peer may be dead)")
                    },
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for NcclRank {
    fn drop(&mut self) {
        // SAFETY: destroying our own communicator once; errors are ignored
        // (never panic in Drop).
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}
