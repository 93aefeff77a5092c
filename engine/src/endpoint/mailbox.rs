//! A bounded queue of requests for one endpoint, with an ordered wait for space.
//!
//! Requests that find the mailbox full wait *in the mailbox*, in order, each under a ticket.
//! When a request is taken out, the oldest waiter moves in and is told so (which sends a
//! tell's Ack): one freed slot admits exactly one waiter, and a waiter that gave up was
//! withdrawn by its ticket, so it cannot swallow the wake-up meant for another.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tensorwire_proto::transport::{Deadline, Error};

use crate::endpoint::Incoming;
use crate::pause::Pause;

/// The outcome of a push.
pub(crate) enum Push {
    /// In the mailbox.
    Pushed,
    /// The mailbox is full: it waits under this ticket and is told when it gets in.
    Waiting(u64),
    /// The mailbox is closed; the request is handed back.
    Closed(Incoming),
    /// The mailbox is full and as many requests as it may hold wait for space already; the
    /// request is handed back.
    Full(Incoming),
}

#[derive(Debug)]
pub(crate) struct Mailbox {
    state: Mutex<State>,
    not_empty: Condvar,
    capacity: usize,
    /// Requests that may wait for space at most.
    waiting_capacity: usize,
    /// Takers polling in `pop_spinning` now.
    spinning: AtomicUsize,
    /// Requests in the queue (mirrors `state.queue`, read without the lock by pollers).
    queued: AtomicUsize,
    /// Mirrors `state.closed` for pollers, so a close ends a poll at once.
    closed: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Incoming>,
    /// Requests waiting for space by ticket: the oldest first, withdrawn by ticket at once.
    waiting: BTreeMap<u64, Incoming>,
    next_ticket: u64,
    /// The order given to the next request that enters the queue.
    next_seq: u64,
    closed: bool,
    /// Threads blocked in `pop`: the condition variable is signalled only if there are any.
    blocked_takers: usize,
    /// Tasks waiting in `poll_pop`, oldest first.
    async_takers: VecDeque<Waker>,
}

impl State {
    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }
}

impl Mailbox {
    /// A mailbox of `capacity` requests, with up to `waiting_capacity` more waiting for space.
    pub(crate) fn new(capacity: usize, waiting_capacity: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            not_empty: Condvar::new(),
            capacity: capacity.max(1),
            waiting_capacity,
            spinning: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Pushes without blocking; a full mailbox keeps the request waiting in order.
    pub(crate) fn push(&self, mut incoming: Incoming) -> Push {
        let mut state = self.lock();
        if state.closed {
            return Push::Closed(incoming);
        }
        if state.queue.len() >= self.capacity || !state.waiting.is_empty() {
            if state.waiting.len() >= self.waiting_capacity {
                return Push::Full(incoming);
            }
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            state.waiting.insert(ticket, incoming);
            return Push::Waiting(ticket);
        }
        incoming.settle(false);
        incoming.seq = state.take_seq();
        state.queue.push_back(incoming);
        self.queued.store(state.queue.len(), Ordering::Release);
        self.wake_a_taker(state);
        Push::Pushed
    }

    /// Puts a request taken from this mailbox back where it was, ahead of every request that
    /// entered after it (see `Endpoint::put_back`); dropped, its asker told, if the mailbox is
    /// closed.
    pub(crate) fn put_back(&self, incoming: Incoming) {
        let mut state = self.lock();
        if state.closed {
            drop(state);
            drop(incoming);
            return;
        }
        let at = state
            .queue
            .partition_point(|queued| queued.seq < incoming.seq);
        state.queue.insert(at, incoming);
        self.queued.store(state.queue.len(), Ordering::Release);
        self.wake_a_taker(state);
    }

    /// Takes back a waiting request (its sender gave up). `None` if it got in meanwhile.
    pub(crate) fn withdraw(&self, ticket: u64) -> Option<Incoming> {
        self.lock().waiting.remove(&ticket)
    }

    /// Takes the oldest request, waiting up to `timeout` (`None`: forever). `Ok(None)` on
    /// timeout.
    pub(crate) fn pop(&self, timeout: Option<Duration>) -> Result<Option<Incoming>, Error> {
        let deadline = timeout.map(|t| Deadline::after(std::time::Instant::now(), t));
        let mut state = self.lock();
        loop {
            if let Some(mut item) = state.queue.pop_front() {
                self.queued.store(state.queue.len(), Ordering::Release);
                self.admit_waiter(state);
                item.taken();
                return Ok(Some(item));
            }
            if state.closed {
                return Err(Error::MailboxClosed);
            }
            let left = match deadline.and_then(|d| d.at()) {
                None if deadline.is_some() => None, // a deadline too far to represent
                None => None,
                Some(at) => match at.checked_duration_since(std::time::Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(None),
                },
            };
            state.blocked_takers += 1;
            state = crate::sync::wait(&self.not_empty, state, left);
            state.blocked_takers -= 1;
        }
    }

    /// `pop`, polling for up to `spin` before it sleeps: while it polls, a push wakes no
    /// sleeping taker (this one takes the request), so a steady stream of requests costs no
    /// thread wake-ups. One taker polls at a time; others sleep at once.
    pub(crate) fn pop_spinning(
        &self,
        spin: Duration,
        timeout: Option<Duration>,
    ) -> Result<Option<Incoming>, Error> {
        let start = std::time::Instant::now();
        // One poller is enough to take the next request; more would only burn CPU.
        if self.spinning.fetch_add(1, Ordering::AcqRel) > 0 {
            self.spinning.fetch_sub(1, Ordering::AcqRel);
            return self.pop(timeout);
        }
        let mut pause = Pause::default();
        let found = loop {
            let ready =
                self.queued.load(Ordering::Acquire) > 0 || self.closed.load(Ordering::Acquire);
            if ready && let Some(found) = self.pop(Some(Duration::ZERO)).transpose() {
                break Some(found);
            }
            let idled = start.elapsed();
            if idled >= spin {
                break None;
            }
            // Whoever pushes the next request may wait for this CPU.
            pause.pause(idled);
        };
        self.spinning.fetch_sub(1, Ordering::AcqRel);
        match found {
            Some(found) => found.map(Some),
            // Anything pushed meanwhile is in the queue, which `pop` looks at first.
            None => self.pop(timeout.map(|t| t.saturating_sub(start.elapsed()))),
        }
    }

    /// The async form of `pop`.
    pub(crate) fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Result<Incoming, Error>> {
        let mut state = self.lock();
        if let Some(mut item) = state.queue.pop_front() {
            self.queued.store(state.queue.len(), Ordering::Release);
            self.admit_waiter(state);
            item.taken();
            return Poll::Ready(Ok(item));
        }
        if state.closed {
            return Poll::Ready(Err(Error::MailboxClosed));
        }
        if !state.async_takers.iter().any(|w| w.will_wake(cx.waker())) {
            state.async_takers.push_back(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Closes the mailbox: queued and waiting asks are answered with an error, takers woken.
    pub(crate) fn close(&self) {
        let (queued, waiting, wakers) = {
            let mut state = self.lock();
            state.closed = true;
            self.closed.store(true, Ordering::Release);
            self.queued.store(0, Ordering::Release);
            (
                std::mem::take(&mut state.queue),
                std::mem::take(&mut state.waiting),
                std::mem::take(&mut state.async_takers),
            )
        };
        self.not_empty.notify_all();
        wakers.into_iter().for_each(Waker::wake);
        drop(queued);
        drop(waiting);
    }

    pub(crate) fn len(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// The error for a request refused with [`Push::Full`].
    pub(crate) fn full_error(&self) -> Error {
        Error::Overloaded {
            what: "the list of requests waiting for mailbox space",
            capacity: self.waiting_capacity,
        }
    }

    /// After a pop: the oldest waiting request moves in and is told so (outside the lock).
    fn admit_waiter(&self, mut state: MutexGuard<'_, State>) {
        let Some((_, mut incoming)) = state.waiting.pop_first() else {
            return;
        };
        incoming.settle(true);
        incoming.seq = state.take_seq();
        state.queue.push_back(incoming);
        self.queued.store(state.queue.len(), Ordering::Release);
        self.wake_a_taker(state);
    }

    /// Wakes a blocked taker and every waiting task: a task whose `recv` future was dropped
    /// cannot take the wake-up meant for one still waiting (the woken ones that find nothing
    /// wait again).
    fn wake_a_taker(&self, mut state: MutexGuard<'_, State>) {
        let wakers = std::mem::take(&mut state.async_takers);
        // A taker polling for requests takes this one: a sleeping one need not be woken.
        let blocked = state.blocked_takers > 0 && self.spinning.load(Ordering::Acquire) == 0;
        drop(state);
        if blocked {
            self.not_empty.notify_one();
        }
        wakers.into_iter().for_each(Waker::wake);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;

    /// An ask whose answer lands in `answers`.
    fn ask(path: &str, answers: &Arc<Mutex<Vec<String>>>) -> Incoming {
        struct Noted(Arc<Mutex<Vec<String>>>);
        impl tensorwire_proto::transport::Responder for Noted {
            fn enqueued(&self) {}
            fn respond(self: Box<Self>, answer: Result<crate::Reply, String>) {
                let text = answer.err().unwrap_or_else(|| "ok".to_owned());
                crate::sync::lock(&self.0).push(text);
            }
        }
        let request = crate::endpoint::Request {
            path: path.to_owned(),
            kind: crate::RequestKind::Ask,
            message: crate::TensorMessage::new(1, bytes::Bytes::new(), Vec::new()),
            peer: None,
            identity: None,
            local_peer: None,
        };
        Incoming::new(request, Box::new(Noted(Arc::clone(answers))), None)
    }

    #[test]
    fn a_request_put_back_is_taken_first_and_wakes_a_waiting_taker() {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let mailbox = Arc::new(Mailbox::new(1, 4));
        assert!(matches!(mailbox.push(ask("/a", &answers)), Push::Pushed));
        let taken = mailbox.pop(Some(Duration::ZERO)).unwrap().unwrap();
        assert!(matches!(mailbox.push(ask("/b", &answers)), Push::Pushed));
        mailbox.put_back(taken); // past the capacity of 1: it was counted when it got in
        assert_eq!(mailbox.len(), 2);
        let order: Vec<String> = (0..2)
            .map(|_| mailbox.pop(Some(Duration::ZERO)).unwrap().unwrap())
            .map(|incoming| incoming.request().path.clone())
            .collect();
        assert_eq!(order, ["/a", "/b"], "the one put back comes first");

        let taker = {
            let mailbox = Arc::clone(&mailbox);
            std::thread::spawn(move || mailbox.pop(Some(Duration::from_secs(30))))
        };
        std::thread::sleep(Duration::from_millis(20));
        mailbox.put_back(ask("/c", &answers));
        let woken = taker.join().expect("the taker panicked").unwrap().unwrap();
        assert_eq!(woken.request().path, "/c");
        drop(woken);
        assert_eq!(
            crate::sync::lock(&answers).len(),
            3,
            "the dropped asks were answered"
        );
    }

    #[test]
    fn requests_put_back_in_any_order_return_to_the_order_they_came_in() {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let mailbox = Mailbox::new(8, 4);
        for path in ["/a", "/b", "/c"] {
            assert!(matches!(mailbox.push(ask(path, &answers)), Push::Pushed));
        }
        let a = mailbox.pop(Some(Duration::ZERO)).unwrap().unwrap();
        let b = mailbox.pop(Some(Duration::ZERO)).unwrap().unwrap();
        assert!(matches!(mailbox.push(ask("/d", &answers)), Push::Pushed));
        mailbox.put_back(a);
        mailbox.put_back(b);
        let order: Vec<String> = (0..4)
            .map(|_| mailbox.pop(Some(Duration::ZERO)).unwrap().unwrap())
            .map(|incoming| incoming.request().path.clone())
            .collect();
        assert_eq!(order, ["/a", "/b", "/c", "/d"]);
    }

    #[test]
    fn a_request_put_back_into_a_closed_mailbox_is_answered() {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let mailbox = Mailbox::new(4, 4);
        mailbox.close();
        mailbox.put_back(ask("/a", &answers));
        assert_eq!(mailbox.len(), 0);
        assert_eq!(crate::sync::lock(&answers).len(), 1, "its asker was told");
    }

    #[test]
    fn a_close_ends_a_taker_s_poll_at_once() {
        let mailbox = Arc::new(Mailbox::new(4, 4));
        let taker = {
            let mailbox = Arc::clone(&mailbox);
            std::thread::spawn(move || mailbox.pop_spinning(Duration::from_secs(30), None))
        };
        std::thread::sleep(Duration::from_millis(20));
        let closed_at = Instant::now();
        mailbox.close();
        let taken = taker.join().expect("the taker panicked");
        assert!(matches!(taken, Err(Error::MailboxClosed)), "{taken:?}");
        // Not the rest of its 30 s poll.
        assert!(closed_at.elapsed() < Duration::from_secs(10));
    }
}
