//! Starting one send: the node's router picks the path, then the send goes to the in-process
//! mailbox, the PTR1 driver, the HTTP/2 transport or shared memory; the blocking form runs a
//! PTR1 exchange on the caller's thread. Asks and tells share this code through [`Call`].

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
        match (shm_peer, &self.inner.shm) {
            (Some(peer), Some(shm)) => shm.wait_here(peer, &|| pending.spin(Duration::ZERO)),
            _ => {
                pending.spin(self.inner.busy_poll);
            }
        }
        loop {
            let slice = if interrupt.is_some() {
                INTERRUPT_SLICE
            } else {
                Duration::MAX
            };
            if let Some(result) = pending.wait_timeout(slice) {
                let route = pending.route().unwrap_or(Route::LocalMailbox);
                return result.map(|out| (out, route));
            }
            if interrupt.is_some_and(|stop| stop()) {
                return Err(Error::Cancelled); // dropping `pending` cancels the request
            }
        }
    }
}

impl Node {
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
            _ => self.stripes.send(request),
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
