//! The executor's buffer pool.

use crate::backend::{DeviceBuffer, Event, Stream};
use crate::comm::{CommElement, Communicator};
use crate::core::Result;

/// Buffers the executor is done with, reused instead of freed and
/// allocated again (an allocation waits for the private allocation
/// stream). `Some(event)`: the last use was on a stream
/// up to that event; a reuse on another stream waits for it first.
pub(super) struct Pool<T: CommElement> {
    pub(super) free: Vec<(DeviceBuffer<T>, Option<Event>)>,
}

impl<T: CommElement> Pool<T> {
    pub(super) fn take(
        &mut self,
        comm: &Communicator,
        len: usize,
        user: &Stream,
    ) -> Result<DeviceBuffer<T>> {
        match self.free.iter().rposition(|(b, _)| b.len() == len) {
            Some(i) => {
                let (b, ev) = self.free.swap_remove(i);
                if let Some(ev) = ev {
                    user.wait_event(&ev)?;
                }
                Ok(b)
            }
            None => comm.device().alloc_zeros(len),
        }
    }

    /// Returns `b` after its last use on `stream`.
    pub(super) fn put_after(&mut self, b: DeviceBuffer<T>, stream: &Stream) -> Result<()> {
        let ev = stream.record_event()?;
        self.free.push((b, Some(ev)));
        Ok(())
    }
}
