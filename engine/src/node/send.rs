//! Starting one send: the node's router picks the path, then the send goes to the in-process
//! mailbox, the PTR1 driver, the HTTP/2 transport or shared memory; the blocking form runs a
//! PTR1 exchange on the caller's thread. Asks and tells share this code through [`Call`].

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorwire_proto::TensorMessage;
use tensorwire_proto::route::Route;
use tensorwire_proto::transport::{
    ActorPath, Answer, Completion, Deadline, Error, OutboundRequest, Reply, RequestKind,
};

use super::{Destination, Node, NodeInner, local};
use crate::pending::{AskCompletion, Pending, TellCompletion, ask_reply, pair};

impl Node {
    /// Routes and starts one send; `here`: the caller waits for it anyway, so a copy may run
    /// on its thread.
    pub(super) fn start<C: Call>(
        &self,
        to: &Destination,
        message: TensorMessage,
        timeout: Duration,
        here: bool,
    ) -> Pending<C::Output> {
        let deadline = Deadline::after(Instant::now(), timeout);
        if let Err(e) = self.inner.usable() {
            return Pending::ready(Err(e));
        }
        let pending = match self.inner.choose_to_send(to.peer, to.via) {
            Ok(Target::Local(target)) => C::local(&target, &to.path, message, deadline),
            Ok(target) => self.dispatch::<C>(target, to, message, deadline, here),
            Err(e) => return Pending::ready(Err(e)),
        };
        pending.track(self.inner.outbound.enter());
        pending
    }

    pub(super) fn blocking<C: Call>(
        &self,
        to: &Destination,
        message: TensorMessage,
        timeout: Duration,
        interrupt: Option<&dyn Fn() -> bool>,
    ) -> Result<(C::Output, Route), Error> {
        let deadline = Deadline::after(Instant::now(), timeout);
        self.inner.usable()?;
        let _in_flight = self.inner.outbound.enter();
        let target = self.inner.choose_to_send(to.peer, to.via)?;
        let shm_peer = matches!(target, Target::Shm { .. }).then_some(to.peer);
        let mut pending = match target {
            // A request to stripe goes through the driver (the stripes are carried by it).
            Target::Driver if self.inner.stripes.wants(to.peer, &message) => {
                self.dispatch::<C>(Target::Driver, to, message, deadline, true)
            }
            Target::Driver => {
                let answer = self.inner.blocking.exchange(
                    to.peer,
                    C::KIND,
                    &to.path,
                    message,
                    deadline,
                    interrupt,
                )?;
                return C::answer(to.peer, answer).map(|out| (out, Route::RawTcp));
            }
            Target::Local(target) => C::local(&target, &to.path, message, deadline),
            target => self.dispatch::<C>(target, to, message, deadline, true),
        };
        self.wait_here(shm_peer, &mut pending, None, interrupt)
            .unwrap_or(Err(Error::Cancelled))
    }

    /// Waits on the calling thread for `pending`, as the blocking calls wait: over shared
    /// memory to `shm_peer` the caller reads that connection itself within the spin window;
    /// for an in-process endpoint's answer it polls for the node's busy-poll budget; then it
    /// sleeps (an answer a driver thread brings is waited for asleep). `None` once `limit`
    /// (if any) passed first; `interrupt` is asked every 100 ms and ends the wait with
    /// [`Error::Cancelled`] (the request goes on until `pending` is dropped).
    pub(super) fn wait_here<T>(
        &self,
        shm_peer: Option<SocketAddr>,
        pending: &mut Pending<T>,
        limit: Option<Duration>,
        interrupt: Option<&dyn Fn() -> bool>,
    ) -> Option<Result<(T, Route), Error>> {
        let until = limit.map(|limit| Deadline::after(Instant::now(), limit));
        let stopped = Cell::new(false);
        match (shm_peer, &self.inner.shm) {
            (Some(peer), Some(shm)) => {
                // Reading the connection goes on while messages keep coming: a limit or an
                // interrupt ends it too (the clock is read every 64 looks, and only for them).
                // When `interrupt` was last asked: from the first look that reads the clock.
                let (looks, asked) = (Cell::new(0u32), Cell::new(None::<Instant>));
                let done = || {
                    if pending.spin(Duration::ZERO) {
                        return true;
                    }
                    if until.is_none() && interrupt.is_none() {
                        return false;
                    }
                    looks.set(looks.get().wrapping_add(1));
                    if looks.get() % 64 != 0 {
                        return false;
                    }
                    let now = Instant::now();
                    if until.is_some_and(|until| until.has_passed(now)) {
                        return true;
                    }
                    if let Some(stop) = interrupt {
                        let since = asked.get().unwrap_or(now);
                        asked.set(Some(since));
                        if now.duration_since(since) >= INTERRUPT_SLICE {
                            asked.set(Some(now));
                            stopped.set(stop());
                        }
                    }
                    stopped.get()
                };
                shm.wait_here(peer, &done);
            }
            // An in-process endpoint's handler brings the answer in well under a wake-up.
            _ if pending.route() == Some(Route::LocalMailbox) => {
                pending.spin(self.inner.busy_poll);
            }
            // A driver thread brings it: a caller polling for it takes the CPU that thread
            // needs wherever the two share one (`docs/benchmarks.md`, "A caller that polls
            // for a driver thread").
            _ => {}
        }
        if stopped.get() {
            return Some(Err(Error::Cancelled));
        }
        loop {
            let mut slice = if interrupt.is_some() {
                INTERRUPT_SLICE
            } else {
                Duration::MAX
            };
            if let Some(at) = until.as_ref().and_then(Deadline::at) {
                slice = slice.min(at.saturating_duration_since(Instant::now()));
            }
            if let Some(result) = pending.wait_timeout(slice) {
                let route = pending.route().unwrap_or(Route::LocalMailbox);
                return Some(result.map(|out| (out, route)));
            }
            if interrupt.is_some_and(|stop| stop()) {
                return Some(Err(Error::Cancelled));
            }
            if until
                .as_ref()
                .is_some_and(|until| until.has_passed(Instant::now()))
            {
                return None;
            }
        }
    }
}

impl Node {
    /// Waits on the calling thread for a send to `to` started with [`Node::ask_to`] or
    /// [`Node::tell_to`] — several may be in flight, waited for in any order — the way
    /// [`Node::ask_blocking_to`] waits: over shared memory the caller reads the connection
    /// itself within the spin window ([`NodeBuilder::shm_spin`](crate::NodeBuilder::shm_spin)),
    /// for an in-process endpoint's answer it polls for the busy-poll budget, then it sleeps
    /// (an answer a driver thread brings is waited for asleep). Returns the result and the
    /// path that carried it, or `None` once `limit` (if any) passed first: the request goes on
    /// (its own timeout still applies) and can be waited for again. `interrupt` is asked every
    /// 100 ms; when it says stop, the wait ends with [`Error::Cancelled`] and the request goes
    /// on until `pending` is dropped. In a child made by `fork()`, [`Error::Forked`] at once.
    pub fn wait_for<T>(
        &self,
        to: &Destination,
        pending: &mut Pending<T>,
        limit: Option<Duration>,
        interrupt: Option<&dyn Fn() -> bool>,
    ) -> Option<Result<(T, Route), Error>> {
        if let Err(e) = self.check_process() {
            // Inherited by a child made by fork(): the connections are the parent's.
            return Some(Err(e));
        }
        let shm_peer = (pending.route() == Some(Route::SharedMemory)).then_some(to.peer);
        self.wait_here(shm_peer, pending, limit, interrupt)
    }

    /// Hands one send to the path `target` and returns what its caller waits on.
    fn dispatch<C: Call>(
        &self,
        target: Target,
        to: &Destination,
        message: TensorMessage,
        deadline: Deadline,
        here: bool,
    ) -> Pending<C::Output> {
        let (completion, pending) = C::pair(to.peer);
        let request = OutboundRequest::new(
            to.peer,
            to.path.clone(),
            C::KIND,
            message,
            deadline,
            completion,
        );
        self.inner.dispatch(target, request, here);
        pending
    }
}

/// How often a blocking call asks its interrupt whether to give up.
const INTERRUPT_SLICE: Duration = Duration::from_millis(100);
/// An ask or a tell, for the code both share.
pub(super) trait Call {
    type Output: Send + 'static;
    const KIND: RequestKind;
    fn pair(peer: SocketAddr) -> (Box<dyn Completion>, Pending<Self::Output>);
    fn local(
        target: &NodeInner,
        path: &ActorPath,
        message: TensorMessage,
        deadline: Deadline,
    ) -> Pending<Self::Output>;
    fn answer(peer: SocketAddr, answer: Answer) -> Result<Self::Output, Error>;
}

pub(super) struct Ask;
pub(super) struct Tell;

impl Call for Ask {
    type Output = Reply;
    const KIND: RequestKind = RequestKind::Ask;
    fn pair(peer: SocketAddr) -> (Box<dyn Completion>, Pending<Reply>) {
        let (completer, pending) = pair();
        (Box::new(AskCompletion { completer, peer }), pending)
    }
    fn local(t: &NodeInner, p: &ActorPath, m: TensorMessage, d: Deadline) -> Pending<Reply> {
        local::ask(t, p, m, d)
    }
    fn answer(peer: SocketAddr, answer: Answer) -> Result<Reply, Error> {
        ask_reply(peer, answer)
    }
}

impl Call for Tell {
    type Output = ();
    const KIND: RequestKind = RequestKind::Tell;
    fn pair(_: SocketAddr) -> (Box<dyn Completion>, Pending<()>) {
        let (completer, pending) = pair();
        (Box::new(TellCompletion(completer)), pending)
    }
    fn local(t: &NodeInner, p: &ActorPath, m: TensorMessage, d: Deadline) -> Pending<()> {
        local::tell(t, p, m, d)
    }
    fn answer(_: SocketAddr, _: Answer) -> Result<(), Error> {
        Ok(())
    }
}

/// Where one send goes (see `routing.rs`).
pub(super) enum Target {
    Local(Arc<NodeInner>),
    Driver,
    Transport,
    /// Shared memory; `insist`: the caller allows no other path.
    Shm {
        insist: bool,
    },
}
impl NodeInner {
    /// Hands a routed send to its transport, telling its completion which path it took.
    fn dispatch(&self, target: Target, request: OutboundRequest, here: bool) {
        let route = match target {
            Target::Local(_) | Target::Driver => Route::RawTcp,
            Target::Transport => Route::Http2,
            Target::Shm { .. } => Route::SharedMemory,
        };
        request.completion.routed(route);
        match (target, &self.transport, &self.shm) {
            (Target::Transport, Some(transport), _) => transport.send(request),
            (Target::Shm { insist }, _, Some(shm)) => shm.send(request, insist, here),
            _ => {
                let in_flight = self.outbound.get();
                self.stripes.send(self.pipelines.mark(request, in_flight));
            }
        }
    }

    /// A send shared memory handed back (the peer is not on this host, or the memory is
    /// full): the remote path.
    pub(super) fn send_remote(&self, request: OutboundRequest) {
        if self.is_shut_down() {
            return request.completion.complete(Err(Error::Shutdown));
        }
        self.dispatch(self.remote_target(), request, false);
    }
}
