//! A one-shot result slot that async code (`Future`) and threads (`wait`) can both wait on, and
//! whose drop cancels the request behind it.

mod timer;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::inflight::InFlight;
use crate::sync::{lock, wait};
use tensorwire_proto::route::Route;
use tensorwire_proto::transport::{Answer, Completion, Deadline, Error, Reply};

pub(crate) use timer::{cancel as cancel_timer, schedule as schedule_timer};
#[cfg(test)]
pub(crate) use timer::{exclusive as exclusive_timers, sizes as timer_sizes};

/// The result of an `ask` or `tell` in progress.
///
/// Await it from any executor, or call [`Pending::wait`] from a thread.
///
/// **Dropping it cancels the request**: one that has not reached a connection yet is never
/// sent; one that is being sent or waits for its reply closes its connection (the peer may have
/// received all, part or none of it, and may act on it — a request is never known to be
/// undone). An in-process request that waits for mailbox space is withdrawn.
#[derive(Debug)]
#[must_use = "dropping a Pending cancels its request"]
pub struct Pending<T> {
    slot: Arc<Slot<T>>,
    /// The result was handed out already.
    taken: bool,
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
    /// Set once the result is there: what a spinning waiter watches (no lock).
    done: AtomicBool,
}

struct State<T> {
    result: Option<Result<T, Error>>,
    waker: Option<Waker>,
    done: bool,
    /// The caller dropped its `Pending`.
    cancelled: bool,
    /// Run once if the caller gives up (set by the transport carrying the request).
    on_cancel: Option<Box<dyn FnOnce() + Send>>,
    /// The deadline registered with the deadline thread, cancelled on completion.
    timer: Option<u64>,
    /// Threads blocked in `wait`/`wait_timeout`: the condition variable is signalled only if
    /// there are any (a signal is a system call even when nobody waits).
    waiting: usize,
    /// The path the request was last handed to.
    route: Option<Route>,
    /// Where the result goes for a request nobody waits for ([`Pending::detach`]).
    on_done: Option<OnDone<T>>,
    /// Nobody waits: dropping the `Pending` does not cancel it.
    detached: bool,
    /// Counts the request as in flight on its node until it completes.
    in_flight: Option<InFlight>,
}

impl<T> std::fmt::Debug for State<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("done", &self.done)
            .field("cancelled", &self.cancelled)
            .finish_non_exhaustive()
    }
}

/// What a detached request's result goes to.
type OnDone<T> = Box<dyn FnOnce(Result<T, Error>) + Send>;

pub(crate) fn pair<T>() -> (Completer<T>, Pending<T>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State {
            result: None,
            waker: None,
            done: false,
            cancelled: false,
            on_cancel: None,
            timer: None,
            waiting: 0,
            route: None,
            on_done: None,
            detached: false,
            in_flight: None,
        }),
        ready: Condvar::new(),
        done: AtomicBool::new(false),
    });
    (
        Completer {
            slot: Arc::clone(&slot),
        },
        Pending { slot, taken: false },
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
    ///
    /// # Errors
    ///
    /// The request's error.
    pub fn wait(mut self) -> Result<T, Error> {
        let mut state = lock(&self.slot.state);
        loop {
            if let Some(result) = state.result.take() {
                self.taken = true;
                return result;
            }
            if self.taken {
                return Err(spent());
            }
            state.waiting += 1;
            state = wait(&self.slot.ready, state, None);
            state.waiting -= 1;
        }
    }

    /// Blocks for at most `timeout`. `None` if the result is not there yet: the request goes
    /// on (its own deadline still applies) and this can be called again.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<T, Error>> {
        let deadline = Deadline::after(Instant::now(), timeout);
        let mut state = lock(&self.slot.state);
        loop {
            if let Some(result) = state.result.take() {
                self.taken = true;
                return Some(result);
            }
            if self.taken {
                return Some(Err(spent()));
            }
            let left = match deadline.at() {
                Some(at) => Some(at.checked_duration_since(Instant::now())?),
                None => None,
            };
            state.waiting += 1;
            state = wait(&self.slot.ready, state, left);
            state.waiting -= 1;
        }
    }

    /// Whether the result is there (`wait` would not block).
    pub fn is_ready(&self) -> bool {
        lock(&self.slot.state).result.is_some()
    }

    /// Polls for the result for at most `budget` without sleeping; whether it is there. A
    /// reply that comes within microseconds is then taken without paying a sleeping thread's
    /// wake-up; a later one costs at most `budget` of CPU.
    pub fn spin(&self, budget: Duration) -> bool {
        if self.slot.done.load(Ordering::Acquire) {
            return true;
        }
        if budget.is_zero() {
            return false;
        }
        // No yields in this poll (unlike the others, `crate::pause`): its budget is short
        // (20 µs), and yielding in it cost asks in flight from Python a fifth to a third of
        // their rate (`docs/benchmarks.md`, "Asks that come now and then").
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                if self.slot.done.load(Ordering::Acquire) {
                    return true;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= budget {
                return false;
            }
        }
    }

    /// Lets the request go on with nobody waiting for it (fire and forget): `done` gets its
    /// result, on whichever thread completes it (it must not block). A detached request is
    /// not cancelled by dropping it; its deadline still applies.
    pub fn detach(mut self, done: impl FnOnce(Result<T, Error>) + Send + 'static)
    where
        T: Send + 'static,
    {
        self.taken = true;
        let mut state = lock(&self.slot.state);
        state.detached = true;
        match state.result.take() {
            Some(result) => {
                drop(state);
                done(result);
            }
            None => state.on_done = Some(Box::new(done)),
        }
    }

    /// Counts the request as in flight with `token` until it completes.
    pub(crate) fn track(&self, token: InFlight) {
        let mut state = lock(&self.slot.state);
        if !state.done {
            state.in_flight = Some(token);
        }
    }

    /// The path the request was handed to: the local mailbox, shared memory, PTR1 or HTTP/2
    /// (`None` before it was routed, or for a result known at once). Its reply's memory follows
    /// from it: receive memory of this process (PTR1, HTTP/2) or a read-only view (the others).
    pub fn route(&self) -> Option<Route> {
        lock(&self.slot.state).route
    }
}

fn spent() -> Error {
    Error::Misuse("the result of this request was already taken".into())
}

impl<T> Future for Pending<T> {
    type Output = Result<T, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = lock(&self.slot.state);
        match state.result.take() {
            Some(result) => {
                drop(state);
                self.taken = true;
                Poll::Ready(result)
            }
            None if self.taken || state.done => Poll::Ready(Err(spent())),
            None => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        let hook = {
            let mut state = lock(&self.slot.state);
            if state.done || state.detached {
                return;
            }
            state.cancelled = true;
            state.on_cancel.take()
        };
        if let Some(hook) = hook {
            hook();
        }
    }
}

impl<T: Send + 'static> Completer<T> {
    /// Fails the request with `error()` at `deadline` (if it has one) unless it completed
    /// before. Needs no runtime: one process-wide deadline thread serves every deadline.
    pub(crate) fn expire_at(
        &self,
        deadline: Deadline,
        error: impl FnOnce() -> Error + Send + 'static,
    ) {
        let Some(at) = deadline.at() else {
            return;
        };
        let slot = Arc::downgrade(&self.slot);
        let id = schedule_timer(
            at,
            Box::new(move || {
                if let Some(slot) = slot.upgrade() {
                    Self { slot }.complete(Err(error()));
                }
            }),
        );
        let mut state = lock(&self.slot.state);
        if state.done {
            drop(state);
            cancel_timer(id); // completed in the meantime
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

    /// Whether the caller dropped its `Pending`.
    pub(crate) fn is_cancelled(&self) -> bool {
        lock(&self.slot.state).cancelled
    }

    /// Records the path the request is handed to.
    pub(crate) fn set_route(&self, route: Route) {
        lock(&self.slot.state).route = Some(route);
    }

    /// Runs `hook` when the caller gives up (at once if it already has).
    pub(crate) fn on_cancel(&self, hook: Box<dyn FnOnce() + Send>) {
        let mut state = lock(&self.slot.state);
        if state.cancelled {
            drop(state);
            hook();
        } else if !state.done {
            state.on_cancel = Some(hook);
        }
    }

    /// Delivers `result` (`None`: abandoned) unless a result is there already; whether it did.
    fn finish(&self, result: Option<Result<T, Error>>) -> bool {
        let (waker, timer, waiting, hook, detached, in_flight) = {
            let mut state = lock(&self.slot.state);
            if state.done {
                return false;
            }
            state.done = true;
            state.result = Some(result.unwrap_or(Err(Error::Abandoned)));
            self.slot.done.store(true, Ordering::Release);
            let detached = state
                .on_done
                .take()
                .and_then(|done| Some((done, state.result.take()?)));
            (
                state.waker.take(),
                state.timer.take(),
                state.waiting > 0,
                state.on_cancel.take(),
                detached,
                state.in_flight.take(),
            )
        };
        drop(hook); // outside the lock
        if let Some((done, result)) = detached {
            done(result);
        }
        if let Some(id) = timer {
            cancel_timer(id);
        }
        if waiting {
            self.slot.ready.notify_all();
        }
        if let Some(waker) = waker {
            waker.wake();
        }
        drop(in_flight); // last: a close waiting for it finds the caller told
        true
    }
}

impl<T> Drop for Completer<T> {
    /// A completer dropped without a result (a thread or core went away) fails the request
    /// as abandoned instead of leaving it hanging (a shutdown completes its requests with
    /// [`Error::Shutdown`] before it drops anything).
    fn drop(&mut self) {
        if self.finish(None) {
            tracing::warn!("a request was dropped without an answer");
        }
    }
}

/// An ask's completion: the transport's answer becomes a [`Reply`].
pub(crate) struct AskCompletion {
    pub(crate) completer: Completer<Reply>,
    /// Who is asked: an answer that does not fit an ask is that peer's fault.
    pub(crate) peer: SocketAddr,
}

/// The reply in `answer` to an ask of `peer`; an Ack is the peer breaking the protocol.
pub(crate) fn ask_reply(peer: SocketAddr, answer: Answer) -> Result<Reply, Error> {
    match answer {
        Answer::Reply(reply) => Ok(reply),
        Answer::Ack => Err(Error::UnexpectedReply {
            peer,
            request: "ask",
            reply: "Ack",
        }),
    }
}

/// A tell's completion: the transport's acknowledgement becomes `()`.
pub(crate) struct TellCompletion(pub(crate) Completer<()>);

impl Completion for AskCompletion {
    fn complete(self: Box<Self>, outcome: Result<Answer, Error>) {
        let peer = self.peer;
        self.completer
            .complete(outcome.and_then(|answer| ask_reply(peer, answer)));
    }

    fn is_cancelled(&self) -> bool {
        self.completer.is_cancelled()
    }

    fn on_cancel(&self, hook: Box<dyn FnOnce() + Send>) {
        self.completer.on_cancel(hook);
    }

    fn routed(&self, route: Route) {
        self.completer.set_route(route);
    }
}

impl Completion for TellCompletion {
    fn complete(self: Box<Self>, outcome: Result<Answer, Error>) {
        self.0.complete(outcome.map(|_| ()));
    }

    fn is_cancelled(&self) -> bool {
        self.0.is_cancelled()
    }

    fn on_cancel(&self, hook: Box<dyn FnOnce() + Send>) {
        self.0.on_cancel(hook);
    }

    fn routed(&self, route: Route) {
        self.0.set_route(route);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The deadline thread is process-wide: tests that count its entries run one at a time.
    fn timers() -> std::sync::MutexGuard<'static, ()> {
        timer::exclusive()
    }

    #[test]
    fn dropped_completer_fails_the_waiter_as_abandoned_instead_of_hanging() {
        let (completer, pending) = pair::<u32>();
        drop(completer);
        assert!(matches!(pending.wait(), Err(Error::Abandoned)));
    }

    #[test]
    fn completed_requests_leave_no_deadline_behind() {
        let _timers = timers();
        let far = Deadline::after(Instant::now(), Duration::from_secs(3600));
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
        let _timers = timers();
        let (completer, pending) = pair::<u32>();
        completer.expire_at(
            Deadline::after(Instant::now(), Duration::from_millis(20)),
            || Error::Shutdown,
        );
        assert!(matches!(pending.wait(), Err(Error::Shutdown)));
        drop(completer);
    }

    #[test]
    fn a_huge_deadline_is_no_deadline() {
        let _timers = timers();
        let (completer, mut pending) = pair::<u32>();
        completer.expire_at(Deadline::after(Instant::now(), Duration::MAX), || {
            Error::Shutdown
        });
        assert!(pending.wait_timeout(Duration::from_millis(10)).is_none());
        completer.complete(Ok(1));
        assert_eq!(pending.wait_timeout(Duration::MAX).unwrap().unwrap(), 1);
    }

    #[test]
    fn result_reaches_a_waiting_thread() {
        let (completer, pending) = pair::<u32>();
        let waiter = std::thread::spawn(move || pending.wait().unwrap());
        std::thread::sleep(Duration::from_millis(10));
        completer.complete(Ok(5));
        assert_eq!(waiter.join().unwrap(), 5);
    }

    #[test]
    fn wait_timeout_can_be_called_again_until_the_result_arrives() {
        let (completer, mut pending) = pair::<u32>();
        assert!(pending.wait_timeout(Duration::from_millis(1)).is_none());
        assert!(pending.wait_timeout(Duration::ZERO).is_none());
        completer.complete(Ok(3));
        assert_eq!(pending.wait_timeout(Duration::ZERO).unwrap().unwrap(), 3);
        assert!(
            pending.wait_timeout(Duration::ZERO).unwrap().is_err(),
            "spent"
        );
    }

    #[test]
    fn dropping_the_pending_runs_the_cancel_hook_once() {
        let (completer, pending) = pair::<u32>();
        let cancelled = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&cancelled);
        completer.on_cancel(Box::new(move || flag.store(true, Ordering::SeqCst)));
        assert!(!completer.is_cancelled());
        drop(pending);
        assert!(cancelled.load(Ordering::SeqCst));
        assert!(completer.is_cancelled());
        // A hook registered after the caller gave up runs at once.
        let late = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&late);
        completer.on_cancel(Box::new(move || flag.store(true, Ordering::SeqCst)));
        assert!(late.load(Ordering::SeqCst));
    }

    #[test]
    fn a_spinning_waiter_sees_a_result_completed_on_another_thread() {
        let (completer, pending) = pair::<u32>();
        assert!(!pending.spin(Duration::from_micros(50)));
        let done = std::thread::spawn(move || completer.complete(Ok(9)));
        assert!(pending.spin(Duration::from_secs(5)));
        done.join().unwrap();
        assert_eq!(pending.wait().unwrap(), 9);
    }

    #[test]
    fn a_detached_request_is_not_cancelled_and_its_result_reaches_the_callback() {
        let (completer, pending) = pair::<u32>();
        let cancelled = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&cancelled);
        completer.on_cancel(Box::new(move || flag.store(true, Ordering::SeqCst)));
        let (tx, rx) = std::sync::mpsc::channel();
        pending.detach(move |result| tx.send(result.unwrap()).unwrap());
        assert!(!completer.is_cancelled());
        completer.complete(Ok(4));
        assert_eq!(rx.recv().unwrap(), 4);
        assert!(!cancelled.load(Ordering::SeqCst));
        // Already complete when detached: the callback runs at once.
        let (completer, pending) = pair::<u32>();
        completer.complete(Ok(5));
        let (tx, rx) = std::sync::mpsc::channel();
        pending.detach(move |result| tx.send(result.unwrap()).unwrap());
        assert_eq!(rx.recv().unwrap(), 5);
    }

    #[test]
    fn a_completed_request_is_not_cancelled_by_dropping_its_pending() {
        let (completer, pending) = pair::<u32>();
        let cancelled = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&cancelled);
        completer.on_cancel(Box::new(move || flag.store(true, Ordering::SeqCst)));
        completer.complete(Ok(1));
        drop(pending);
        assert!(!cancelled.load(Ordering::SeqCst));
    }
}
