//! Host copies through pinned staging memory.
//!
//! `cuMemcpyHtoDAsync` from pageable memory is synchronous for the host and
//! may serialise with other work; from page-locked memory it is a true DMA
//! on the stream. Each stream that copies host data keeps two page-locked
//! slots (grown on demand up to [`MAX_SLOT_BYTES`]) and reuses them: a copy
//! is split into slot-sized chunks that alternate between the slots, so the
//! host's `memcpy` of one chunk overlaps the DMA of the other. A slot is
//! refilled only after the event recorded behind its previous DMA.

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};

use super::driver_err;
use crate::core::Result;

/// Largest slot; larger copies are chunked.
pub(super) const MAX_SLOT_BYTES: usize = 8 << 20;
const MIN_SLOT_BYTES: usize = 64 << 10;

struct Slot {
    ptr: *mut u8,
    /// Recorded after the last DMA that touched the slot.
    done: CudaEvent,
    busy: bool,
}

pub(super) struct Staging {
    slots: [Slot; 2],
    bytes: usize,
}

// SAFETY: the slots are page-locked host allocations owned by this struct;
// access is serialised by the owning stream's mutex.
unsafe impl Send for Staging {}

fn slot_bytes_for(n: usize) -> usize {
    n.clamp(MIN_SLOT_BYTES, MAX_SLOT_BYTES).next_power_of_two()
}

impl Slot {
    fn new(ctx: &std::sync::Arc<CudaContext>, bytes: usize) -> Result<Slot> {
        let done = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver_err("creating a staging event", e))?;
        // SAFETY: plain page-locked allocation of `bytes` > 0.
        let ptr = unsafe { result::malloc_host(bytes, 0) }
            .map_err(|e| driver_err(&format!("allocating {bytes} bytes of pinned memory"), e))?;
        Ok(Slot {
            ptr: ptr.cast(),
            done,
            busy: false,
        })
    }

    /// Waits until the slot's previous DMA finished.
    fn idle(&mut self) -> Result<()> {
        if self.busy {
            self.done
                .synchronize()
                .map_err(|e| driver_err("waiting for a staging copy", e))?;
            self.busy = false;
        }
        Ok(())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = self.idle();
        // SAFETY: from malloc_host; no DMA uses it any more.
        let _ = unsafe { result::free_host(self.ptr.cast()) };
    }
}

impl Staging {
    /// Staging able to move `n`-byte copies in as few chunks as allowed.
    pub fn new(ctx: &std::sync::Arc<CudaContext>, n: usize) -> Result<Staging> {
        let bytes = slot_bytes_for(n);
        Ok(Staging {
            slots: [Slot::new(ctx, bytes)?, Slot::new(ctx, bytes)?],
            bytes,
        })
    }

    /// Whether an `n`-byte copy would be chunked finer than a fresh staging.
    pub fn too_small_for(&self, n: usize) -> bool {
        self.bytes < slot_bytes_for(n)
    }

    /// Enqueues `dst[..src.len()] = src` on `stream`; returns once `src` has
    /// been staged (the caller may reuse it).
    pub fn htod(&mut self, stream: &CudaStream, dst: u64, src: &[u8]) -> Result<()> {
        for (i, part) in src.chunks(self.bytes).enumerate() {
            let slot = &mut self.slots[i % 2];
            slot.idle()?;
            // SAFETY: the slot holds `self.bytes` >= part.len() bytes and no
            // DMA reads it (idle above).
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), slot.ptr, part.len()) };
            let offset = (i * self.bytes) as u64;
            // SAFETY: dst + offset has part.len() bytes (the caller checked
            // the whole range); the slot stays untouched until `done`.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst + offset,
                    slot.ptr.cast(),
                    part.len(),
                    stream.cu_stream(),
                )
            }
            .result()
            .map_err(|e| driver_err("copy host to device", e))?;
            slot.done
                .record(stream)
                .map_err(|e| driver_err("recording a staging event", e))?;
            slot.busy = true;
        }
        Ok(())
    }

    /// Copies `src[..dst.len()]` into `dst` after the work enqueued on
    /// `stream` so far; returns when `dst` is filled.
    pub fn dtoh(&mut self, stream: &CudaStream, src: u64, dst: &mut [u8]) -> Result<()> {
        let chunk = self.bytes;
        let chunks = dst.len().div_ceil(chunk);
        // The chunk whose DMA is in flight and not yet copied out.
        let mut pending: Option<usize> = None;
        for i in 0..chunks {
            let range = i * chunk..dst.len().min((i + 1) * chunk);
            let slot = &mut self.slots[i % 2];
            slot.idle()?;
            // SAFETY: src + start has range.len() bytes (checked by the
            // caller); the slot has room and nobody reads it until `done`.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    slot.ptr.cast(),
                    src + range.start as u64,
                    range.len(),
                    stream.cu_stream(),
                )
            }
            .result()
            .map_err(|e| driver_err("copy device to host", e))?;
            slot.done
                .record(stream)
                .map_err(|e| driver_err("recording a staging event", e))?;
            slot.busy = true;
            if let Some(p) = pending.replace(i) {
                self.copy_out(p, dst)?;
            }
        }
        if let Some(p) = pending {
            self.copy_out(p, dst)?;
        }
        Ok(())
    }

    fn copy_out(&mut self, i: usize, dst: &mut [u8]) -> Result<()> {
        let chunk = self.bytes;
        let range = i * chunk..dst.len().min((i + 1) * chunk);
        let slot = &mut self.slots[i % 2];
        slot.idle()?;
        let out = &mut dst[range];
        // SAFETY: the slot's DMA of this chunk finished (idle); the slot
        // holds out.len() bytes of it.
        unsafe { std::ptr::copy_nonoverlapping(slot.ptr, out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}
