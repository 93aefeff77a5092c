//! A core thread: one ring, the connections placed on it for life, their timers and the
//! client pool. Nothing but the core thread touches its ring.

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tensorwire_proto::session::ConnectionPool;
use tensorwire_proto::transport::Error;

use crate::panics::panic_text;
use crate::pause::Pause;
use crate::uring::Context;
#[cfg(test)]
use crate::uring::commands::Fault;
use crate::uring::commands::{CoreHandle, Event, Inbox, Outgoing};
use crate::uring::conn::{ConnKey, ConnSlab, Role};
use crate::uring::op::{Op, OpKey, OpSlab, Owner};
use crate::uring::ring::Ring;
use crate::uring::timers::Timers;

mod client;
mod linger;
mod ops;
mod poll_policy;
mod server;
mod transfer;

/// How often, at most, a core republishes that the same connection moved bytes again.
const PUBLISH_EVERY_NS: u64 = 1_000_000;
/// How long a stopping core still waits for its operations after resetting the sockets that
/// zero-copy sends held (`linger.rs`).
const STOP_AFTER_RESET: Duration = Duration::from_millis(200);
/// New requests taken from the queue per loop turn, so completions are not starved.
const REQUESTS_PER_TURN: usize = 256;

pub(super) struct Core {
    ring: Ring,
    ctx: Arc<Context>,
    handle: CoreHandle,
    inbox: Inbox,
    ops: OpSlab,
    conns: ConnSlab,
    timers: Timers,
    pool: ConnectionPool<ConnKey, Outgoing>,
    listener: Option<RawFd>,
    accept: Option<OpKey>,
    wake: Option<OpKey>,
    accept_multishot: bool,
    accept_retry_at: Option<Instant>,
    /// Closed sockets an operation may still hold (zero-copy sends' pages): reset once their
    /// peer stops keeping the minimum rate, or when the core stops.
    lingering: linger::Lingering,
    /// Closing gracefully: nothing new is accepted, served connections close when done.
    draining: bool,
    stopping: bool,
    next_request: u64,
    /// Completions taken from the ring and not handled yet (kept here, so a panic in one
    /// leaves the others for the next turn).
    completions: std::collections::VecDeque<(u64, i32, u32)>,
    /// Whether and how long to busy-poll before sleeping.
    polling: poll_policy::PollPolicy,
    /// The connections that moved bytes last, for the busy-poll decision.
    recent: poll_policy::RecentConns<ConnKey>,
    /// `recent`'s stamps as last published to the other cores.
    published: [u64; 2],
    /// Requests to start outside the handler that found them (a connection freed up, a
    /// waiter may connect): a work list instead of recursion, however many wait.
    backlog: std::collections::VecDeque<Backlog>,
    /// The server connection whose events are being handled: an answer given to it
    /// meanwhile (a handler that answered at once) only updates its session, and that loop
    /// takes the events that follow — no recursion per pipelined request.
    serving_events: Option<ConnKey>,
    /// The time of the current loop turn.
    now: Instant,
    /// The core failed while it was not stopping: a new core may take its place.
    restartable: bool,
    /// A fault the driver's tests injected.
    #[cfg(test)]
    fault: Option<Fault>,
}

impl Core {
    /// A core on `ring`; `remains` are those of the failed core it replaces, if any.
    pub(super) fn new(
        ring: Ring,
        ctx: Arc<Context>,
        handle: CoreHandle,
        inbox: Inbox,
        listener: Option<RawFd>,
        remains: Option<Box<Remains>>,
    ) -> Self {
        let Remains {
            conns,
            pool,
            next_request,
        } = remains.map_or_else(
            || Remains {
                conns: ConnSlab::default(),
                pool: ConnectionPool::new(ctx.pool),
                next_request: 0,
            },
            |remains| *remains,
        );
        let polling = poll_policy::PollPolicy::new(ctx.busy_poll);
        Self {
            ring,
            pool,
            ctx,
            handle,
            inbox,
            ops: OpSlab::default(),
            conns,
            timers: Timers::default(),
            listener,
            accept: None,
            wake: None,
            accept_multishot: true,
            accept_retry_at: None,
            lingering: linger::Lingering::default(),
            draining: false,
            stopping: false,
            next_request,
            completions: std::collections::VecDeque::with_capacity(256),
            backlog: std::collections::VecDeque::new(),
            polling,
            recent: poll_policy::RecentConns::new(),
            published: [0, 0],
            serving_events: None,
            now: Instant::now(),
            restartable: false,
            #[cfg(test)]
            fault: None,
        }
    }

    /// Runs until shut down or failed. A panic in a turn (a handler run on the core, the drop of
    /// a user's buffer, a hand-off callback, a waker) is caught: every connection is closed,
    /// the operations in flight keep their memory until the kernel is done, and the core goes
    /// on. A core whose ring failed, or whose recovery panicked, ends with what a new core
    /// needs to take its place.
    pub(super) fn run(mut self) -> Ended {
        self.handle.enter();
        self.arm_wake();
        if self.handle.shared.draining.load(Ordering::Acquire) {
            self.drain(); // restarted while the driver closes
        }
        self.arm_accept();
        let mut stop_deadline = None;
        loop {
            let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.turn()));
            match turn {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.fail(format!("its ring failed: {e}"));
                    #[cfg(test)]
                    if self.fault == Some(Fault::RingErrorThenStall) {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    break;
                }
                Err(panic) => {
                    let text = panic_text(&*panic);
                    tracing::error!(
                        panic = text,
                        "a core thread panicked; closing its connections"
                    );
                    let recovered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.recover(text);
                    }));
                    if let Err(again) = recovered {
                        self.fail(format!(
                            "recovering from a panic ({text}) panicked: {}",
                            panic_text(&*again)
                        ));
                        break;
                    }
                }
            }
            if self.stopping {
                let deadline =
                    *stop_deadline.get_or_insert_with(|| self.now + self.ctx.shutdown_timeout);
                if self.conns.len() == 0 && self.ops.len() == 0 {
                    break;
                }
                if self.now >= deadline && self.lingering.reset_all() > 0 {
                    // Closed sockets whose zero-copy sends a peer never took: reset, their
                    // notifications come at once.
                    stop_deadline = Some(self.now + STOP_AFTER_RESET);
                    continue;
                }
                if self.now >= deadline {
                    tracing::warn!(
                        operations = self.ops.len(),
                        "operations still in flight at shutdown (a zero-copy notification that never came?); leaking their memory"
                    );
                    break;
                }
            }
        }
        // Anything still queued fails instead of hanging.
        while let Ok(outgoing) = self.inbox.requests.try_recv() {
            outgoing.completion.complete(Err(self.stop_error()));
        }
        if !self.restartable {
            return Ended::Stopped;
        }
        let pool = ConnectionPool::new(self.ctx.pool);
        Ended::Failed(Box::new(Remains {
            conns: std::mem::take(&mut self.conns),
            pool: std::mem::replace(&mut self.pool, pool),
            next_request: self.next_request,
        }))
    }

    /// Takes this core out of its driver (the driver sends it nothing more until a new core
    /// takes its place, and says why in every error once no core is left), then fails
    /// everything it holds and ends its accept (`release_accept`).
    fn fail(&mut self, reason: String) {
        tracing::error!(
            reason = %reason,
            "a core thread failed and is taken out of the driver; the other cores go on"
        );
        self.restartable = !self.stopping;
        self.handle.shared.set_failed(reason);
        let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.stop_all();
            self.release_accept();
        }));
        if stopped.is_err() {
            self.restartable = false; // what it holds is in doubt: nothing is handed on
            tracing::error!("failing the requests of a failed core panicked");
        }
    }

    /// What a request gets that this core can no longer carry.
    fn stop_error(&self) -> Error {
        self.handle.shared.failed_error().unwrap_or(Error::Shutdown)
    }

    /// One round: submit and wait (until the nearest deadline), then completions, timers and
    /// queued work.
    fn turn(&mut self) -> io::Result<()> {
        let idle_since = Instant::now();
        let polled = self.busy_poll(idle_since)?;
        let shared = &self.handle.shared;
        shared.sleeping.store(true, Ordering::SeqCst);
        let busy = polled || !self.inbox.requests.is_empty() || !self.inbox.events.is_empty();
        let waited = if busy {
            self.ring.submit_and_run()
        } else {
            let timeout = if self.stopping {
                Some(Duration::from_millis(10))
            } else {
                self.next_deadline()
                    .map(|at| at.saturating_duration_since(Instant::now()))
            };
            self.ring.submit_and_wait(timeout)
        };
        self.handle.shared.sleeping.store(false, Ordering::SeqCst);
        waited?;
        self.now = Instant::now();
        if polled || !busy {
            self.polling
                .idle_spell(self.now.saturating_duration_since(idle_since));
        }
        // Completions first: an idle peer's close is seen before a request could reuse it.
        self.ring.drain(&mut self.completions);
        while let Some((user_data, res, flags)) = self.completions.pop_front() {
            self.on_completion(OpKey::from_user_data(user_data), res, flags);
        }
        self.run_backlog();
        self.fire_timers();
        while let Ok(event) = self.inbox.events.try_recv() {
            self.on_event(event);
        }
        for _ in 0..REQUESTS_PER_TURN {
            let Ok(outgoing) = self.inbox.requests.try_recv() else {
                break;
            };
            self.start_outgoing(outgoing);
        }
        self.run_backlog();
        self.update_gauges();
        #[cfg(test)]
        match self.fault {
            Some(Fault::RingError | Fault::RingErrorThenStall) => {
                return Err(io::Error::other("an injected ring failure"));
            }
            Some(Fault::Panic) => {
                self.fault = None;
                panic!("an injected panic");
            }
            Some(Fault::PanicInRecovery) => panic!("an injected panic"),
            None => {}
        }
        Ok(())
    }

    /// Polls the ring and the queues instead of going to sleep, when [`poll_policy`] says a
    /// quick request-reply conversation is on, or briefly while this core carries one of
    /// several active connections (measured in `docs/benchmarks.md`, "Busy-polling" and
    /// "Several conversations"). Polling reads only shared memory; it enters the kernel only to submit
    /// what the last turn queued and to run work the kernel deferred to this thread
    /// (`IORING_SQ_TASKRUN`), never to wait. Returns whether work arrived.
    fn busy_poll(&mut self, idle_since: Instant) -> io::Result<bool> {
        if self.stopping {
            return Ok(false);
        }
        let own = poll_policy::active(self.recent.stamps(), idle_since);
        let Some(poll_for) = self
            .polling
            .poll_for(own, self.driver_active(own, idle_since))
        else {
            return Ok(false);
        };
        let Some(mut until) = idle_since.checked_add(poll_for) else {
            return Ok(false);
        };
        self.ring.submit_and_run()?;
        let mut pause = Pause::default();
        // Since when nothing moved: the start of the idle spell, then the last deferred work.
        let mut idle_from = idle_since;
        loop {
            if self.ring.has_completions()
                || !self.inbox.requests.is_empty()
                || !self.inbox.events.is_empty()
            {
                self.polling.found();
                return Ok(true);
            }
            let now = Instant::now();
            if now >= until {
                self.polling.missed();
                return Ok(false);
            }
            if self.ring.has_deferred_work() {
                // Bytes are moving (a receive or send went on in the kernel's task work):
                // the conversation is alive, so the poll goes on as long again.
                self.ring.submit_and_run()?;
                until = now.checked_add(poll_for).unwrap_or(until);
                idle_from = now;
            } else {
                // A peer woken onto this CPU (its client, its handler's caller) may wait for it.
                pause.pause(now.saturating_duration_since(idle_from));
            }
        }
    }

    /// Connection `key` moved bytes at `now`: remembered, and published for the other cores
    /// when another connection moved, or a millisecond after the last publication: they only
    /// ask whether it moved within the last 10 ms, and each store takes the cache line from
    /// the threads that post to this core.
    fn note_io(&mut self, key: ConnKey, now: Instant) {
        self.recent.note(key, now);
        let stamps = self.recent.stamps();
        if stamps[1] == self.published[1]
            && stamps[0].saturating_sub(self.published[0]) < PUBLISH_EVERY_NS
        {
            return;
        }
        for (shared, stamp) in self.handle.shared.recent_io.iter().zip(stamps) {
            shared.store(stamp, Ordering::Relaxed);
        }
        self.published = stamps;
    }

    /// Active connections of every core of this driver (0, 1 or 2 for more each), from the
    /// other cores' stamps and `own` for this one: a core polls as long as the budget allows
    /// only while the whole driver carries one conversation; with more, some thread of this
    /// process has work, and a core polls briefly at most ([`poll_policy::SHARED_POLL`]).
    fn driver_active(&self, own: usize, now: Instant) -> usize {
        let others = self.ctx.cores.get().map_or(0, |cores| {
            cores
                .iter()
                .filter(|core| !Arc::ptr_eq(&core.shared, &self.handle.shared))
                .map(|core| {
                    let stamps = core
                        .shared
                        .recent_io
                        .each_ref()
                        .map(|at| at.load(Ordering::Relaxed));
                    poll_policy::active(stamps, now)
                })
                .sum()
        });
        others + own
    }

    fn next_deadline(&self) -> Option<Instant> {
        [
            self.timers.next(),
            self.pool.poll_timeout(),
            self.accept_retry_at,
            self.lingering.next(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn fire_timers(&mut self) {
        let now = self.now;
        if self.accept_retry_at.is_some_and(|at| at <= now) {
            self.accept_retry_at = None;
            self.arm_accept();
        }
        if self.lingering.check(now) > 0 {
            tracing::debug!("reset closed connections whose peers stopped taking zero-copy sends");
        }
        // Each expired connection once per turn: a deadline that did not move cannot spin.
        let mut expired = Vec::new();
        while let Some(key) = self.timers.pop_expired(now) {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.timer = None;
            }
            expired.push(key);
        }
        for key in expired {
            self.on_timeout(key);
        }
        self.pool_timeouts();
        self.run_backlog();
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Enqueued { conn, seq } => self.on_enqueued(conn, seq),
            Event::Answer { conn, seq, answer } => self.on_answer(conn, seq, answer),
            Event::Cancel { conn, request } => self.on_cancel(conn, request),
            Event::CancelWaiting { id } => self.on_cancel_waiting(id),
            Event::Adopt(fd) => self.adopt(fd),
            Event::Drain => self.drain(),
            Event::Shutdown => self.stop_all(),
            #[cfg(test)]
            Event::Fault(fault) => self.fault = Some(fault),
        }
    }

    /// Handles the events this core posted to itself (handlers run on the core answer this
    /// way), until none are left.
    fn take_self_posted(&mut self) {
        loop {
            let events = CoreHandle::take_self_posted();
            if events.is_empty() {
                return;
            }
            events.into_iter().for_each(|event| self.on_event(event));
        }
    }

    /// After a caught panic: every connection (whose state may be half-updated) is closed, its
    /// request failed; the core's own operations are armed again if they were lost.
    fn recover(&mut self, text: &str) {
        #[cfg(test)]
        if self.fault == Some(Fault::PanicInRecovery) {
            panic!("an injected panic in recovery");
        }
        self.serving_events = None;
        let reason = format!("a panic was caught on its core thread: {text}");
        let panicked = || Error::DriverFailed {
            driver: "io_uring",
            reason: reason.clone(),
        };
        self.close_all(panicked);
        for Backlog { outgoing, .. } in std::mem::take(&mut self.backlog) {
            outgoing.completion.complete(Err(panicked()));
        }
        if self.wake.is_none() {
            self.arm_wake();
        }
        self.arm_accept();
    }

    /// Begins a graceful close: the accept ends, and each served connection finishes its
    /// request (reply written in full) and then closes. Outbound requests go on.
    fn drain(&mut self) {
        if self.draining {
            return;
        }
        self.draining = true;
        if let Some(op) = self.accept {
            self.submit(Owner::Core, Op::Cancel(crate::uring::op::Cancel::Op(op)));
        }
        self.accept_retry_at = None;
        let now = self.now;
        for key in self.conns.keys() {
            if let Some(server) = self.conns.server_mut(key) {
                server.session.finish(now);
                self.pump(key);
            }
        }
    }

    /// Fails every request, closes every connection and stops accepting.
    fn stop_all(&mut self) {
        if !self.stopping {
            self.stopping = true;
            // The core's own operations end too, so nothing is left for the kernel at exit.
            for op in [self.accept, self.wake].into_iter().flatten() {
                self.submit(Owner::Core, Op::Cancel(crate::uring::op::Cancel::Op(op)));
            }
        }
        // The waiters first: closing connections would hand them new ones.
        let shared = Arc::clone(&self.handle.shared);
        let error = || shared.failed_error().unwrap_or(Error::Shutdown);
        let (waiting, idle) = self.pool.drain();
        for outgoing in waiting {
            outgoing.completion.complete(Err(error()));
        }
        self.close_all(error);
        idle.into_iter().for_each(|conn| self.close(conn));
        for Backlog { outgoing, .. } in std::mem::take(&mut self.backlog) {
            outgoing.completion.complete(Err(error()));
        }
        while let Ok(outgoing) = self.inbox.requests.try_recv() {
            outgoing.completion.complete(Err(error()));
        }
    }

    /// Starts what the backlog holds, until it is empty (starting one may add more).
    fn run_backlog(&mut self) {
        while let Some(Backlog { conn, outgoing }) = self.backlog.pop_front() {
            match conn {
                Some(conn) => self.begin(conn, outgoing),
                None => self.connect(outgoing),
            }
        }
    }

    fn update_gauges(&self) {
        let shared = &self.handle.shared;
        shared
            .connections
            .store(self.conns.len(), Ordering::Relaxed);
        shared.timers.store(self.timers.len(), Ordering::Relaxed);
        shared.operations.store(self.ops.len(), Ordering::Relaxed);
        shared.peers.store(self.pool.peers(), Ordering::Relaxed);
        shared.waiting.store(self.pool.waiting(), Ordering::Relaxed);
        if self.draining {
            let serving = self
                .conns
                .values()
                .filter(|conn| matches!(conn.role, Role::Server(_)))
                .count();
            shared.serving.store(serving, Ordering::Release);
            shared.drain_seen.store(true, Ordering::Release);
        }
    }
}

/// How a core's run ended.
pub(super) enum Ended {
    /// Shut down (or failed while shutting down): nothing takes its place.
    Stopped,
    /// Failed while serving: a new core on a new ring may take its place, with these.
    Failed(Box<Remains>),
}

/// What a failed core hands to the core that replaces it: its connection slab and its pool,
/// both emptied by the failure, and its request counter. The new core hands out connection
/// keys, waiter ids and request ids that go on from these, so an answer or a cancel still on
/// its way for one of the old connections finds nothing instead of a new connection that
/// happens to reuse its number.
pub(super) struct Remains {
    conns: ConnSlab,
    pool: ConnectionPool<ConnKey, Outgoing>,
    next_request: u64,
}

/// A request to start once the current handler is done: on a connection, or on a new one.
struct Backlog {
    conn: Option<ConnKey>,
    outgoing: Outgoing,
}

impl Drop for Core {
    fn drop(&mut self) {
        if self.ops.len() > 0 {
            // The kernel may still write into memory of these operations: never free it. (The
            // ring itself may close: the kernel keeps what it needs of it.)
            std::mem::forget(std::mem::take(&mut self.ops));
        }
    }
}
