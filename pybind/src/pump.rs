//! The asyncio bridge: engine completions wake an event loop through one eventfd, and the
//! loop drains every ready operation in one callback (no thread hop per message).
//!
//! Each operation is a Rust future (an ask's or tell's `Pending`, a mailbox receive), polled
//! once when it starts. Its waker (made once per operation) pushes the operation's token and
//! writes the eventfd only when the queue was empty; `Pump.drain`, run by the loop's reader
//! callback, polls the woken futures and returns the finished ones. Cancelling drops the
//! future, which cancels the engine operation.
//!
//! A queue inherited through `fork()` belongs to the parent: in the child it starts nothing,
//! never reads the eventfd (it would take the parent's wake-ups), and its operations are
//! forgotten, never dropped (dropping one would cancel it on the parent's connections, and may
//! wait on a lock a parent thread held at the fork).

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Wake, Waker};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use tensorwire_engine::fork::Birth;

use crate::buffers::drain_releases;
use crate::errors::to_py;
use crate::sync::lock;

/// What a finished operation gives Python: a value, or an exception instance.
pub(crate) type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// An operation in flight.
pub(crate) type Job = Pin<Box<dyn Future<Output = Outcome> + Send>>;

struct Queue {
    eventfd: OwnedFd,
    woken: Mutex<Vec<u64>>,
    /// Operations in flight, each with the waker it was last polled with.
    jobs: Mutex<HashMap<u64, (Job, Waker)>>,
    next: AtomicU64,
    /// The process that made it.
    birth: Birth,
}

impl Drop for Queue {
    fn drop(&mut self) {
        if self.birth.is_inherited() {
            let jobs = std::mem::take(self.jobs.get_mut().unwrap_or_else(PoisonError::into_inner));
            std::mem::forget(jobs);
        }
    }
}

impl Queue {
    fn wake(&self, token: u64) {
        let mut woken = lock(&self.woken);
        let was_empty = woken.is_empty();
        woken.push(token);
        drop(woken);
        if was_empty {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd; a full counter (EAGAIN)
            // means the loop is already due to wake.
            let _ = unsafe {
                libc::write(
                    self.eventfd.as_raw_fd(),
                    (&raw const one).cast::<libc::c_void>(),
                    8,
                )
            };
        }
    }
}

struct Token {
    queue: Weak<Queue>,
    token: u64,
}

impl Wake for Token {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(queue) = self.queue.upgrade() {
            queue.wake(self.token);
        }
    }
}

/// One event loop's completion queue (create one per loop; `tensorwire.aio` does).
#[pyclass(frozen, module = "tensorwire._native", name = "Pump")]
pub(crate) struct Pump {
    queue: Arc<Queue>,
}

#[pymethods]
impl Pump {
    #[new]
    fn new() -> PyResult<Self> {
        // SAFETY: eventfd takes no pointers; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(PyOSError::new_err(format!(
                "eventfd for the asyncio completion queue: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Self {
            queue: Arc::new(Queue {
                // SAFETY: `fd` is a fresh descriptor nothing else owns.
                eventfd: unsafe { OwnedFd::from_raw_fd(fd) },
                woken: Mutex::new(Vec::new()),
                jobs: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
                birth: Birth::here(),
            }),
        })
    }

    /// The eventfd to register with `loop.add_reader`.
    fn fileno(&self) -> i32 {
        self.queue.eventfd.as_raw_fd()
    }

    /// Polls the woken operations; returns `(token, ok, value_or_exception)` for each that
    /// finished.
    fn drain(&self, py: Python<'_>) -> Vec<(u64, bool, Py<PyAny>)> {
        if self.queue.birth.is_inherited() {
            return Vec::new(); // the parent's: its eventfd and its operations are not ours
        }
        drain_releases(py);
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd (EAGAIN when
        // nothing was written: fine).
        let _ = unsafe {
            libc::read(
                self.queue.eventfd.as_raw_fd(),
                (&raw mut count).cast::<libc::c_void>(),
                8,
            )
        };
        let mut tokens = std::mem::take(&mut *lock(&self.queue.woken));
        tokens.sort_unstable();
        tokens.dedup();
        let mut done = Vec::new();
        for token in tokens {
            let Some((mut job, waker)) = lock(&self.queue.jobs).remove(&token) else {
                continue; // cancelled, or finished already
            };
            match job.as_mut().poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(outcome) => match outcome(py) {
                    Ok(value) => done.push((token, true, value)),
                    Err(err) => done.push((token, false, err.into_value(py).into_any())),
                },
                Poll::Pending => {
                    lock(&self.queue.jobs).insert(token, (job, waker));
                }
            }
        }
        done
    }

    /// Drops the operation (the engine cancels it); idempotent. If it had finished already
    /// (its result not delivered yet), returns `(ok, value_or_exception)` instead, so nothing
    /// that arrived — a request taken from a mailbox — is lost.
    fn cancel(&self, py: Python<'_>, token: u64) -> Option<(bool, Py<PyAny>)> {
        let (mut job, waker) = lock(&self.queue.jobs).remove(&token)?;
        if self.queue.birth.is_inherited() {
            std::mem::forget((job, waker)); // the parent's operation
            return None;
        }
        match job.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(outcome) => Some(match outcome(py) {
                Ok(value) => (true, value),
                Err(err) => (false, err.into_value(py).into_any()),
            }),
            Poll::Pending => None, // dropped here: the engine cancels it
        }
    }

    /// Operations in flight.
    fn __len__(&self) -> usize {
        lock(&self.queue.jobs).len()
    }
}

impl Pump {
    /// `Ok` in the process that made this queue; a child made by `fork()` since must run an
    /// event loop of its own (`asyncio.run`), whose queue is new.
    pub(crate) fn here(&self) -> PyResult<()> {
        self.queue
            .birth
            .check()
            .map_err(|e| to_py(&e, "this event loop's completion queue (run a new loop)"))
    }

    /// Registers `job` and polls it once now (its waker is set; a job already done is
    /// delivered by the next `drain`). Returns its token.
    pub(crate) fn start(&self, mut job: Job) -> u64 {
        let token = self.queue.next.fetch_add(1, Ordering::Relaxed);
        let waker = Waker::from(Arc::new(Token {
            queue: Arc::downgrade(&self.queue),
            token,
        }));
        // Polled under the jobs' lock: a `drain` on another thread that sees this token woken
        // waits for the job to be listed instead of taking the wake for a cancelled one.
        let mut jobs = lock(&self.queue.jobs);
        match job.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(outcome) => {
                let ready: Job = Box::pin(std::future::ready(outcome));
                jobs.insert(token, (ready, waker));
                drop(jobs);
                self.queue.wake(token);
            }
            Poll::Pending => {
                jobs.insert(token, (job, waker));
            }
        }
        token
    }
}
