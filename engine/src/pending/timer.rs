//! The process-wide deadline thread for requests that no core thread watches (in-process
//! asks, waits for mailbox space, idle-slot release). Started on first use; sleeps until the
//! earliest deadline. A child made by `fork()` starts its own (see [`crate::fork`]).

use crate::fork::PerProcess;
use crate::sync::{lock, wait};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, Once};
use std::time::Instant;

pub(crate) type Action = Box<dyn FnOnce() + Send>;

/// Pending deadlines: the heap orders them, the map holds what to do. A cancelled entry
/// leaves the map at once and the heap lazily; the heap is rebuilt when stale entries
/// dominate, so memory stays proportional to the live deadlines.
#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    actions: std::collections::HashMap<u64, (Instant, Action)>,
    next_id: u64,
    /// While the thread sleeps: until when (`Some(None)`: until woken). `None` while it runs
    /// (it looks at the heap again before sleeping, so nothing needs to wake it).
    sleeping: Option<Option<Instant>>,
}

struct Timer {
    queue: Mutex<Queue>,
    changed: Condvar,
    /// Its thread, started by the first use in this process.
    started: Once,
}

fn timer() -> &'static Timer {
    static TIMER: PerProcess<Timer> = PerProcess::new();
    let timer = TIMER.get_or_init(|| Timer {
        queue: Mutex::new(Default::default()),
        changed: Condvar::new(),
        started: Once::new(),
    });
    timer.started.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("tensorwire-deadlines".into())
            .spawn(move || run(timer));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the deadline thread: in-process deadlines will not fire");
        }
    });
    timer
}

/// Runs `action` at `at` unless cancelled first; returns the id for [`cancel`].
pub(crate) fn schedule(at: Instant, action: Action) -> u64 {
    let timer = timer();
    let mut queue = lock(&timer.queue);
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
    // Wake the thread only if it would sleep past this deadline (a request's deadline is
    // usually later than the earliest one queued: no wake-up per request).
    let wake = match queue.sleeping {
        Some(None) => true,
        Some(Some(until)) => at < until,
        None => false,
    };
    if wake {
        queue.sleeping = None;
    }
    drop(queue);
    if wake {
        timer.changed.notify_one();
    }
    id
}

/// Tests that schedule deadlines, or count them, run one at a time: the thread is process-wide.
#[cfg(test)]
pub(crate) fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static TESTS: Mutex<()> = Mutex::new(());
    lock(&TESTS)
}

/// Entries in the heap and live deadlines (for tests).
#[cfg(test)]
pub(crate) fn sizes() -> (usize, usize) {
    let queue = lock(&timer().queue);
    (queue.heap.len(), queue.actions.len())
}

/// Forgets a deadline (its request completed).
pub(crate) fn cancel(id: u64) {
    let timer = timer();
    let action = lock(&timer.queue).actions.remove(&id);
    drop(action); // outside the lock: it may drop a request's last references
}

fn run(timer: &'static Timer) {
    let mut queue = lock(&timer.queue);
    loop {
        let now = Instant::now();
        match queue.heap.peek().copied() {
            Some(Reverse((at, id))) if at <= now => {
                queue.heap.pop();
                if let Some((_, action)) = queue.actions.remove(&id) {
                    drop(queue);
                    // A waker or drop that panics must not stop every other deadline.
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(action)).is_err() {
                        tracing::error!("a deadline action panicked; the deadline thread goes on");
                    }
                    queue = lock(&timer.queue);
                }
            }
            Some(Reverse((at, _))) => {
                queue.sleeping = Some(Some(at));
                queue = wait(&timer.changed, queue, Some(at - now));
                queue.sleeping = None;
            }
            None => {
                queue.sleeping = Some(None);
                queue = wait(&timer.changed, queue, None);
                queue.sleeping = None;
            }
        }
    }
}
