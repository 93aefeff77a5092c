//! The asyncio bridge: engine completions wake an event loop through one eventfd, and the
//! loop drains every ready operation in one callback (no thread hop per message).
//!
//! Each operation is a Rust future (an ask's or tell's `Pending`, a mailbox receive). Its
//! waker pushes the operation's token and writes the eventfd only when the queue was empty;
//! `Pump.drain`, run by the loop's reader callback, polls the woken futures and returns the
//! finished ones. Cancelling drops the future, which cancels the engine operation.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Wake, Waker};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

use crate::buffers::drain_releases;

/// What a finished operation gives Python: a value, or an exception instance.
pub(crate) type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// An operation in flight.
pub(crate) type Job = Pin<Box<dyn Future<Output = Outcome> + Send>>;

struct Queue {
    eventfd: OwnedFd,
    woken: Mutex<Vec<u64>>,
    jobs: Mutex<HashMap<u64, Job>>,
    next: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
            let Some(mut job) = lock(&self.queue.jobs).remove(&token) else {
                continue; // cancelled, or finished already
            };
            let waker = Waker::from(Arc::new(Token {
                queue: Arc::downgrade(&self.queue),
                token,
            }));
            match job.as_mut().poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(outcome) => match outcome(py) {
                    Ok(value) => done.push((token, true, value)),
                    Err(err) => done.push((token, false, err.into_value(py).into_any())),
                },
                Poll::Pending => {
                    lock(&self.queue.jobs).insert(token, job);
                }
            }
        }
        done
    }

    /// Drops the operation (the engine cancels it). Idempotent.
    fn cancel(&self, token: u64) {
        let job = lock(&self.queue.jobs).remove(&token);
        drop(job);
    }

    /// Operations in flight.
    fn __len__(&self) -> usize {
        lock(&self.queue.jobs).len()
    }
}

impl Pump {
    /// Registers `job`; its first poll happens in the next `drain`. Returns its token.
    pub(crate) fn start(&self, job: Job) -> u64 {
        let token = self.queue.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.queue.jobs).insert(token, job);
        self.queue.wake(token);
        token
    }
}
