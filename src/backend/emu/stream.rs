//! Emulated streams and events. A stream is a worker thread that runs its
//! queue in order, asynchronously to the host; an event is a generation
//! counter that a stream's queue advances when it reaches the record, and
//! that another stream's queue can block on (cross-stream wait). So a missing
//! wait between a compute and a communication stream races here as on a GPU.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::core::{Error, Result};

pub(crate) type Task = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct Progress {
    enqueued: u64,
    done: u64,
    /// First failure since the last synchronize (sticky until reported).
    error: Option<Error>,
}

pub(crate) struct StreamCore {
    progress: Mutex<Progress>,
    changed: Condvar,
}

impl StreamCore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until everything enqueued so far has run.
    pub fn wait_idle(&self) {
        self.wait_reached(self.fence());
    }

    /// How many tasks have been enqueued so far: the stream has done
    /// everything enqueued before this call once [`Self::wait_reached`]
    /// with this value returns.
    pub fn fence(&self) -> u64 {
        self.lock().enqueued
    }

    /// Waits until `target` tasks have run.
    pub fn wait_reached(&self, target: u64) {
        let mut p = self.lock();
        while p.done < target {
            p = self.changed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits, then reports (and clears) the first failure.
    pub fn synchronize(&self) -> Result<()> {
        self.wait_idle();
        match self.lock().error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

pub(crate) struct EmuStream {
    pub(crate) core: Arc<StreamCore>,
    sender: Mutex<Option<Sender<Task>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    workers: u32,
}

impl EmuStream {
    pub fn spawn(workers: u32) -> EmuStream {
        let core = Arc::new(StreamCore {
            progress: Mutex::new(Progress::default()),
            changed: Condvar::new(),
        });
        let (tx, rx) = channel::<Task>();
        let worker_core = core.clone();
        let handle = std::thread::Builder::new()
            .name("ftn-emu-stream".into())
            .spawn(move || {
                for task in rx {
                    let result = task();
                    let mut p = worker_core.lock();
                    if let Err(e) = result {
                        p.error.get_or_insert(e);
                    }
                    p.done += 1;
                    drop(p);
                    worker_core.changed.notify_all();
                }
            })
            .expect("spawning an emulator stream thread");
        EmuStream {
            core,
            sender: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(handle)),
            workers,
        }
    }

    pub fn workers(&self) -> u32 {
        self.workers
    }

    pub fn enqueue(&self, task: Task) {
        let sender = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        let mut p = self.core.lock();
        p.enqueued += 1;
        drop(p);
        if let Some(tx) = sender.as_ref() {
            if tx.send(task).is_err() {
                // The worker is gone (only possible during drop): count it run.
                let mut p = self.core.lock();
                p.done += 1;
            }
        }
    }

    pub fn synchronize(&self) -> Result<()> {
        self.core.synchronize()
    }

    /// Enqueues the record of `event`.
    pub fn record(&self, event: &EmuEvent) {
        let generation = event.begin_record();
        let ev = event.clone();
        self.enqueue(Box::new(move || {
            ev.complete(generation);
            Ok(())
        }));
    }

    /// Makes later work on this stream wait for the most recent record of
    /// `event` (as of this call), like `cudaStreamWaitEvent`.
    pub fn wait(&self, event: &EmuEvent) {
        let target = event.recorded_generation();
        let ev = event.clone();
        self.enqueue(Box::new(move || {
            ev.wait_for(target);
            Ok(())
        }));
    }
}

impl Drop for EmuStream {
    fn drop(&mut self) {
        // Closing the channel lets the worker drain its queue and exit.
        self.sender.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
    }
}

#[derive(Default)]
struct EventState {
    recorded: u64,
    completed: u64,
    completed_at: Option<Instant>,
}

/// An emulated event (shared handle).
#[derive(Clone, Default)]
pub(crate) struct EmuEvent {
    state: Arc<(Mutex<EventState>, Condvar)>,
}

impl EmuEvent {
    fn lock(&self) -> std::sync::MutexGuard<'_, EventState> {
        self.state.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn begin_record(&self) -> u64 {
        let mut s = self.lock();
        s.recorded += 1;
        s.recorded
    }

    fn recorded_generation(&self) -> u64 {
        self.lock().recorded
    }

    fn complete(&self, generation: u64) {
        let mut s = self.lock();
        if generation > s.completed {
            s.completed = generation;
            s.completed_at = Some(Instant::now());
        }
        drop(s);
        self.state.1.notify_all();
    }

    fn wait_for(&self, generation: u64) {
        let mut s = self.lock();
        while s.completed < generation {
            s = self.state.1.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks the host until the latest record has been reached.
    pub fn synchronize(&self) {
        let target = self.recorded_generation();
        self.wait_for(target);
    }

    pub fn is_complete(&self) -> bool {
        let s = self.lock();
        s.completed >= s.recorded
    }

    /// Blocks the host until the latest record has been reached or
    /// `deadline` passes; true when it was reached.
    pub fn synchronize_until(&self, deadline: Instant) -> bool {
        let mut s = self.lock();
        let target = s.recorded;
        while s.completed < target {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = self
                .state
                .1
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    pub fn completed_at(&self) -> Option<Instant> {
        let s = self.lock();
        if s.completed >= s.recorded && s.recorded > 0 {
            s.completed_at
        } else {
            None
        }
    }
}
