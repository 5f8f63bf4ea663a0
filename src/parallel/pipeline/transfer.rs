//! The executor's messages: receives posted ahead of the computation and
//! completed when it needs them, sends on per-peer streams, and the shape
//! messages of [`ShapeMode::Variable`].

use std::time::{Duration, Instant};

use super::pool::Pool;
use crate::backend::{DeviceBuffer, Stream};
use crate::comm::{CommElement, CommHandle, Communicator};
use crate::core::{Error, Result};

/// How long activation and gradient messages are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeMode {
    /// Every message has the executor's `activation_len` elements (the
    /// default).
    Static,
    /// Every message is preceded, to the same peer on the same stream, by
    /// a one-element `i64` shape message holding its element count,
    /// `1..=max_len`; the receiver allocates what the shape says.
    Variable { max_len: usize },
}

/// The `op` of the executor's argument errors.
pub(super) const RUN: &str = "PipelineExecutor::run";

/// A receive posted on the communicator's stream and not yet completed.
pub(super) enum Posted<T: CommElement> {
    /// The message itself (static shapes).
    Data(DeviceBuffer<T>, CommHandle),
    /// Its shape message (variable shapes); the data is received once the
    /// shape is known.
    Shape(DeviceBuffer<i64>, CommHandle, usize),
}

impl<T: CommElement> Posted<T> {
    pub(super) fn handle(&self) -> &CommHandle {
        match self {
            Posted::Data(_, h) | Posted::Shape(_, h, _) => h,
        }
    }
}

/// The buffers and settings every transfer of one run uses.
pub(super) struct Transfers<'c, T: CommElement> {
    pub comm: &'c Communicator,
    pub shapes: ShapeMode,
    pub activation_len: usize,
    pub timeout: Duration,
    pub pool: Pool<T>,
    pub shape_pool: Pool<i64>,
    /// Sends in flight: handle, buffer (released when done), what it was.
    pub sends: Vec<(CommHandle, DeviceBuffer<T>, String)>,
    pub shape_sends: Vec<(CommHandle, DeviceBuffer<i64>)>,
}

impl<'c, T: CommElement> Transfers<'c, T> {
    /// Posts the receive of a message from `peer` on the communicator's
    /// stream (the shape message with variable shapes); returns at once.
    pub fn post_recv(&mut self, peer: usize) -> Result<Posted<T>> {
        let cs = self.comm.stream();
        match self.shapes {
            ShapeMode::Static => {
                let mut buf = self.pool.take(self.comm, self.activation_len, cs)?;
                let h = self.comm.recv(cs, &mut buf, peer)?;
                Ok(Posted::Data(buf, h))
            }
            ShapeMode::Variable { .. } => {
                let mut buf = self.shape_pool.take(self.comm, 1, cs)?;
                let h = self.comm.recv(cs, &mut buf, peer)?;
                Ok(Posted::Shape(buf, h, peer))
            }
        }
    }

    /// Waits (with the timeout) for a posted receive — with variable
    /// shapes, reads the shape, then receives the data — and makes
    /// `stream` wait for it.
    pub fn complete(&mut self, stream: &Stream, posted: Posted<T>) -> Result<DeviceBuffer<T>> {
        let cs = self.comm.stream();
        let (buf, h) = match posted {
            Posted::Data(buf, h) => {
                self.wait_recv(&h)?;
                (buf, h)
            }
            Posted::Shape(sb, h, peer) => {
                self.wait_recv(&h)?;
                let mut n = [0i64];
                cs.copy_to_host(&sb, &mut n)?;
                self.shape_pool.free.push((sb, None));
                let max_len = match self.shapes {
                    ShapeMode::Variable { max_len } => max_len,
                    ShapeMode::Static => 0,
                };
                let len = usize::try_from(n[0])
                    .ok()
                    .filter(|&l| (1..=max_len).contains(&l));
                let len = len.ok_or_else(|| {
                    Error::invalid(
                        RUN,
                        "shape message",
                        format!("an element count in 1..={max_len} (max_len) from rank {peer}"),
                        n[0],
                    )
                })?;
                let mut buf = self.pool.take(self.comm, len, cs)?;
                let h = self.comm.recv(cs, &mut buf, peer)?;
                self.wait_recv(&h)?;
                (buf, h)
            }
        };
        h.wait_on(stream)?;
        Ok(buf)
    }

    pub(super) fn wait_recv(&self, h: &CommHandle) -> Result<()> {
        self.comm.wait(h, self.timeout)?;
        // A transfer that failed (e.g. timed out in-process) still completes
        // its event; the stream reports the failure. Nothing later is
        // posted on this stream yet.
        self.comm.stream().synchronize()
    }

    /// Sends `buf` (preceded by its shape with variable shapes) to `peer`
    /// on `send_stream` once the computation on `stream` so far is done.
    pub fn send(
        &mut self,
        stream: &Stream,
        send_stream: &Stream,
        peer: usize,
        buf: DeviceBuffer<T>,
        what: String,
    ) -> Result<()> {
        send_stream.wait_event(&stream.record_event()?)?;
        if let ShapeMode::Variable { .. } = self.shapes {
            let mut sb = self.shape_pool.take(self.comm, 1, send_stream)?;
            send_stream.copy_from_host(&[buf.len() as i64], &mut sb)?;
            let h = self.comm.send(send_stream, &sb, peer)?;
            self.shape_sends.push((h, sb));
        }
        let h = self.comm.send(send_stream, &buf, peer)?;
        self.sends.push((h, buf, what));
        Ok(())
    }

    /// Returns the buffers of completed sends to the pools (Megatron's
    /// `deallocate_output_tensor`). A failed send is reported by
    /// [`Transfers::finish_sends`].
    pub fn release_sent(&mut self) -> Result<()> {
        let mut still = Vec::with_capacity(self.sends.len());
        for (h, b, w) in self.sends.drain(..) {
            if h.event().is_complete()? {
                self.pool.free.push((b, None));
            } else {
                still.push((h, b, w));
            }
        }
        self.sends = still;
        let mut still = Vec::with_capacity(self.shape_sends.len());
        for (h, b) in self.shape_sends.drain(..) {
            if h.event().is_complete()? {
                self.shape_pool.free.push((b, None));
            } else {
                still.push((h, b));
            }
        }
        self.shape_sends = still;
        Ok(())
    }

    /// Waits for every send in flight; the error names the first that
    /// failed to complete in time.
    pub fn finish_sends(&mut self) -> std::result::Result<(), (String, Error)> {
        for (h, b) in self.shape_sends.drain(..) {
            self.comm
                .wait(&h, self.timeout)
                .map_err(|e| ("a shape message".to_string(), e))?;
            self.shape_pool.free.push((b, None));
        }
        for (h, b, w) in self.sends.drain(..) {
            self.comm.wait(&h, self.timeout).map_err(|e| (w, e))?;
            self.pool.free.push((b, None));
        }
        Ok(())
    }

    /// After an error: waits (until one shared deadline, ignoring their
    /// failures) for the posted receive and the sends in flight, so no
    /// buffer is dropped while a transfer may still use it.
    pub fn drain(&mut self, posted: Option<Posted<T>>) {
        let deadline = Instant::now() + self.timeout;
        let left = || deadline.saturating_duration_since(Instant::now());
        if let Some(p) = &posted {
            let _ = self.comm.wait(p.handle(), left());
        }
        for (h, _) in &self.shape_sends {
            let _ = self.comm.wait(h, left());
        }
        for (h, _, _) in &self.sends {
            let _ = self.comm.wait(h, left());
        }
    }
}
