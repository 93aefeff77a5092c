//! A one-shot result slot that both async code (`Future`) and threads (`wait`) can wait on.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::Error;

/// The receiving half: the result of an `ask` or `tell` in progress.
///
/// Await it from any executor, or call [`Pending::wait`] from a thread. Dropping it does not
/// cancel the request (it still completes, or fails at its deadline).
#[derive(Debug)]
#[must_use = "a request's result tells whether it was delivered"]
pub struct Pending<T> {
    slot: Arc<Slot<T>>,
}

/// The sending half, held by whoever completes the request.
#[derive(Debug)]
pub(crate) struct Completer<T> {
    slot: Arc<Slot<T>>,
}

#[derive(Debug)]
struct Slot<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

#[derive(Debug)]
struct State<T> {
    result: Option<Result<T, Error>>,
    waker: Option<Waker>,
    done: bool,
    /// The deadline registered with the timer thread, cancelled on completion.
    timer: Option<u64>,
    /// Threads blocked in `wait`/`wait_timeout`: the condition variable is signalled only if
    /// there are any (a signal is a system call even when nobody waits).
    waiting: usize,
}

pub(crate) fn pair<T>() -> (Completer<T>, Pending<T>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State {
            result: None,
            waker: None,
            done: false,
            timer: None,
            waiting: 0,
        }),
        ready: Condvar::new(),
    });
    (
        Completer {
            slot: Arc::clone(&slot),
        },
        Pending { slot },
    )
}

impl<T> Pending<T> {
    /// A result that is already known.
    pub(crate) fn ready(result: Result<T, Error>) -> Self {
        let (completer, pending) = pair();
        completer.complete(result);
        pending
    }

    /// Blocks the calling thread until the result is there.
    pub fn wait(self) -> Result<T, Error> {
        let mut state = lock(&self.slot.state);
        loop {
            if let Some(result) = state.result.take() {
                return result;
            }
            state.waiting += 1;
            state = self
                .slot
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiting -= 1;
        }
    }

    /// Blocks for at most `timeout`; `None` if the result is not there yet (the request goes
    /// on; its own deadline still applies).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<T, Error>> {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.slot.state);
        loop {
            if let Some(result) = state.result.take() {
                return Some(result);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            state.waiting += 1;
            state = self
                .slot
                .ready
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            state.waiting -= 1;
        }
    }
}

impl<T> Future for Pending<T> {
    type Output = Result<T, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = lock(&self.slot.state);
        match state.result.take() {
            Some(result) => Poll::Ready(result),
            None if state.done => Poll::Ready(Err(Error::Shutdown)),
            None => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<T: Send + 'static> Completer<T> {
    /// Fails the request with `error()` at `deadline` unless it completed before. Needs no
    /// runtime: one process-wide timer thread serves every deadline.
    pub(crate) fn expire_at(
        &self,
        deadline: Instant,
        error: impl FnOnce() -> Error + Send + 'static,
    ) {
        let slot = Arc::downgrade(&self.slot);
        let id = timer::schedule(
            deadline,
            Box::new(move || {
                if let Some(slot) = slot.upgrade() {
                    Self { slot }.complete(Err(error()));
                }
            }),
        );
        let mut state = lock(&self.slot.state);
        if state.done {
            drop(state);
            timer::cancel(id); // completed in the meantime
        } else {
            state.timer = Some(id);
        }
    }
}

impl<T> Completer<T> {
    /// Delivers the result; the first call wins.
    pub(crate) fn complete(self, result: Result<T, Error>) {
        self.finish(Some(result));
    }

    fn finish(&self, result: Option<Result<T, Error>>) {
        let (waker, timer, waiting) = {
            let mut state = lock(&self.slot.state);
            if state.done {
                return;
            }
            state.done = true;
            state.result = Some(result.unwrap_or(Err(Error::Shutdown)));
            (state.waker.take(), state.timer.take(), state.waiting > 0)
        };
        if let Some(id) = timer {
            timer::cancel(id);
        }
        if waiting {
            self.slot.ready.notify_all();
        }
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Drop for Completer<T> {
    /// A completer dropped without a result (a thread or core went away) fails the request
    /// instead of leaving it hanging.
    fn drop(&mut self) {
        self.finish(None);
    }
}

/// The process-wide deadline thread for requests that no core thread watches (in-process
/// asks). Started on first use; sleeps until the earliest deadline.
mod timer {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
    use std::time::Instant;

    type Action = Box<dyn FnOnce() + Send>;

    /// Pending deadlines: the heap orders them, the map holds what to do. A cancelled entry
    /// leaves the map at once and the heap lazily; the heap is rebuilt when stale entries
    /// dominate, so memory stays proportional to the live deadlines.
    #[derive(Default)]
    struct Queue {
        heap: BinaryHeap<Reverse<(Instant, u64)>>,
        actions: std::collections::HashMap<u64, (Instant, Action)>,
        next_id: u64,
    }

    struct Timer {
        queue: Mutex<Queue>,
        changed: Condvar,
    }

    fn timer() -> &'static Timer {
        static TIMER: OnceLock<Timer> = OnceLock::new();
        TIMER.get_or_init(|| {
            let spawned = std::thread::Builder::new()
                .name("tensorwire-deadlines".into())
                .spawn(run);
            if let Err(e) = spawned {
                eprintln!("tensorwire: cannot start the deadline thread: {e}");
            }
            Timer {
                queue: Mutex::new(Default::default()),
                changed: Condvar::new(),
            }
        })
    }

    /// Runs `action` at `at` unless cancelled first; returns the id for [`cancel`].
    pub(super) fn schedule(at: Instant, action: Action) -> u64 {
        let timer = timer();
        let mut queue = timer.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let id = queue.next_id;
        queue.next_id += 1;
        if queue.heap.len() > 2 * queue.actions.len() + 1024 {
            let live: BinaryHeap<_> = queue
                .actions
                .iter()
                .map(|(&id, &(at, _))| Reverse((at, id)))
                .collect();
            queue.heap = live;
        }
        queue.heap.push(Reverse((at, id)));
        queue.actions.insert(id, (at, action));
        drop(queue);
        timer.changed.notify_one();
        id
    }

    /// Entries in the heap and live deadlines (for tests).
    #[cfg(test)]
    pub(super) fn sizes() -> (usize, usize) {
        let queue = timer().queue.lock().unwrap_or_else(PoisonError::into_inner);
        (queue.heap.len(), queue.actions.len())
    }

    /// Forgets a deadline (its request completed).
    pub(super) fn cancel(id: u64) {
        let timer = timer();
        let action = timer
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .actions
            .remove(&id);
        drop(action); // outside the lock: it may drop a request's last references
    }

    fn run() {
        let timer = timer();
        let mut queue = timer.queue.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = Instant::now();
            match queue.heap.peek().copied() {
                Some(Reverse((at, id))) if at <= now => {
                    queue.heap.pop();
                    if let Some((_, action)) = queue.actions.remove(&id) {
                        drop(queue);
                        action();
                        queue = timer.queue.lock().unwrap_or_else(PoisonError::into_inner);
                    }
                }
                Some(Reverse((at, _))) => {
                    queue = timer
                        .changed
                        .wait_timeout(queue, at - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                None => {
                    queue = timer
                        .changed
                        .wait(queue)
                        .unwrap_or_else(PoisonError::into_inner)
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_completer_fails_the_waiter_instead_of_hanging() {
        let (completer, pending) = pair::<u32>();
        drop(completer);
        assert!(matches!(pending.wait(), Err(Error::Shutdown)));
    }

    #[test]
    fn completed_requests_leave_no_deadline_behind() {
        let far = Instant::now() + Duration::from_secs(3600);
        for i in 0..10_000u32 {
            let (completer, pending) = pair::<u32>();
            completer.expire_at(far, || Error::Shutdown);
            completer.complete(Ok(i));
            assert_eq!(pending.wait().unwrap(), i);
        }
        let (heap, live) = timer::sizes();
        assert_eq!(live, 0, "every deadline was cancelled");
        assert!(
            heap <= 1024 + 1,
            "stale heap entries were compacted: {heap}"
        );
    }

    #[test]
    fn deadline_fails_a_request_nobody_answers() {
        let (completer, pending) = pair::<u32>();
        completer.expire_at(Instant::now() + Duration::from_millis(20), || {
            Error::Shutdown
        });
        assert!(matches!(pending.wait(), Err(Error::Shutdown)));
        drop(completer);
    }

    #[test]
    fn result_reaches_a_waiting_thread() {
        let (completer, pending) = pair::<u32>();
        let waiter = std::thread::spawn(move || pending.wait().unwrap());
        std::thread::sleep(Duration::from_millis(10));
        completer.complete(Ok(5));
        assert_eq!(waiter.join().unwrap(), 5);
    }
}
