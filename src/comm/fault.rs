//! A communicator's first fault and the host-side wait that turns a dead
//! peer into an error, as pure logic: the NCCL backend (feature `cuda`)
//! runs [`wait_polling`] with closures over `cudaEventQuery`,
//! `ncclCommGetAsyncError` and `ncclCommAbort`; the tests here run it with
//! fakes, so the fault handling is checked on machines without a GPU.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::core::{Error, Result};

/// The first fault of a communicator: set once, never replaced or cleared.
#[derive(Debug, Default)]
pub(crate) struct FirstFault(Mutex<Option<String>>);

impl FirstFault {
    /// The fault, if there was one.
    pub fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a fault was recorded (for `Drop`, with exclusive access).
    pub fn is_set(&mut self) -> bool {
        self.0
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// `Err("communicator is broken: <fault>")` once a fault was recorded.
    pub fn check(&self, backend: &'static str) -> Result<()> {
        match self.get() {
            Some(f) => Err(Error::Backend {
                backend,
                message: format!("communicator is broken: {f}"),
            }),
            None => Ok(()),
        }
    }

    /// Runs `f` under the lock while no fault is recorded, so an abort on
    /// another thread cannot free what `f` uses meanwhile; `None` (and `f`
    /// not run) once a fault is recorded.
    pub fn while_healthy<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.is_none().then(f)
    }

    /// Records `message` unless a fault is already recorded; `first` (the
    /// abort) runs exactly once, for the first fault, under the lock, so
    /// two threads failing at once abort once.
    pub fn record(&self, message: String, first: impl FnOnce()) {
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            first();
            *f = Some(message);
        }
    }
}

/// Polls until `is_complete` says the operation finished (`Ok`), or
/// `async_error` reports an error or `timeout` passes: then the fault is
/// recorded, `abort` runs (once per communicator) and the error names what
/// happened. A communicator already broken fails before polling.
pub(crate) fn wait_polling(
    backend: &'static str,
    fault: &FirstFault,
    timeout: Duration,
    mut is_complete: impl FnMut() -> Result<bool>,
    mut async_error: impl FnMut() -> Option<String>,
    abort: impl FnOnce(),
) -> Result<()> {
    fault.check(backend)?;
    let deadline = Instant::now() + timeout;
    loop {
        if is_complete()? {
            return Ok(());
        }
        let error = async_error();
        if error.is_some() || Instant::now() >= deadline {
            let message = match error {
                Some(e) => format!("asynchronous {backend} error {e}; communicator aborted"),
                None => format!(
                    "operation did not complete within {timeout:?}; communicator aborted (a peer may be dead)"
                ),
            };
            fault.record(message.clone(), abort);
            return Err(Error::Backend { backend, message });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn msg(e: Error) -> String {
        e.to_string()
    }

    #[test]
    fn completes_without_a_fault_or_an_abort() {
        let f = FirstFault::default();
        let mut polls = 0;
        let aborts = AtomicUsize::new(0);
        wait_polling(
            "nccl",
            &f,
            Duration::from_secs(5),
            || {
                polls += 1;
                Ok(polls == 3)
            },
            || None,
            || {
                aborts.fetch_add(1, Ordering::Relaxed);
            },
        )
        .unwrap();
        assert_eq!(polls, 3);
        assert_eq!(aborts.load(Ordering::Relaxed), 0);
        assert!(f.get().is_none());
        f.check("nccl").unwrap();
    }

    #[test]
    fn an_async_error_aborts_at_once_and_breaks_every_later_call() {
        let f = FirstFault::default();
        let aborts = AtomicUsize::new(0);
        let start = Instant::now();
        let e = wait_polling(
            "nccl",
            &f,
            Duration::from_secs(60),
            || Ok(false),
            || Some("ncclRemoteError".into()),
            || {
                aborts.fetch_add(1, Ordering::Relaxed);
            },
        )
        .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5), "not at once");
        assert!(msg(e).contains("ncclRemoteError"));
        assert_eq!(aborts.load(Ordering::Relaxed), 1);
        let fault = f.get().unwrap();
        // every later call says so, a wait included, without polling or aborting again
        let e = msg(f.check("nccl").unwrap_err());
        assert!(
            e.contains("communicator is broken") && e.contains(&fault),
            "{e}"
        );
        let e = wait_polling(
            "nccl",
            &f,
            Duration::from_secs(1),
            || panic!("a broken communicator polls nothing"),
            || None,
            || panic!("aborted twice"),
        )
        .unwrap_err();
        assert!(msg(e).contains("communicator is broken"));
    }

    #[test]
    fn a_timeout_aborts_and_names_the_timeout() {
        let f = FirstFault::default();
        let aborts = AtomicUsize::new(0);
        let e = wait_polling(
            "nccl",
            &f,
            Duration::from_millis(20),
            || Ok(false),
            || None,
            || {
                aborts.fetch_add(1, Ordering::Relaxed);
            },
        )
        .unwrap_err();
        assert!(
            msg(e).contains("did not complete within 20ms"),
            "{}",
            f.get().unwrap()
        );
        assert_eq!(aborts.load(Ordering::Relaxed), 1);
        assert!(f.get().unwrap().contains("a peer may be dead"));
    }

    #[test]
    fn completion_wins_over_a_late_error_and_query_errors_pass_through() {
        let f = FirstFault::default();
        wait_polling(
            "nccl",
            &f,
            Duration::from_millis(1),
            || Ok(true),
            || Some("never asked".into()),
            || panic!("no abort"),
        )
        .unwrap();
        let e = wait_polling(
            "nccl",
            &f,
            Duration::from_secs(1),
            || {
                Err(Error::Backend {
                    backend: "cuda",
                    message: "event query failed".into(),
                })
            },
            || None,
            || panic!("no abort"),
        )
        .unwrap_err();
        assert!(msg(e).contains("event query failed"));
        assert!(f.get().is_none(), "a failed query is not a comm fault");
    }

    #[test]
    fn nothing_runs_on_a_communicator_once_it_is_aborted() {
        let f = FirstFault::default();
        assert_eq!(f.while_healthy(|| 7), Some(7));
        f.record("peer died".into(), || {});
        assert_eq!(
            f.while_healthy(|| panic!("ran on a freed communicator")),
            None::<()>
        );
    }

    #[test]
    fn two_threads_failing_at_once_abort_once_and_keep_the_first_fault() {
        let f = FirstFault::default();
        let aborts = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..4 {
                let (f, aborts) = (&f, &aborts);
                s.spawn(move || {
                    let _ = wait_polling(
                        "nccl",
                        f,
                        Duration::from_millis(10),
                        || Ok(false),
                        || (t % 2 == 0).then(|| format!("error of thread {t}")),
                        || {
                            aborts.fetch_add(1, Ordering::Relaxed);
                        },
                    );
                });
            }
        });
        assert_eq!(aborts.load(Ordering::Relaxed), 1);
        let first = f.get().unwrap();
        f.record("later".into(), || panic!("aborted twice"));
        assert_eq!(f.get().unwrap(), first);
    }
}
