//! The router: which path one send takes (proto's pure route function applied to what this
//! node knows of the peer), and the explanation users get for it.

use std::net::SocketAddr;

use tensorwire_proto::route::{self, Capabilities, Locality, Preference, Route};
use tensorwire_proto::transport::Error;

use super::send::Target;
use super::{Node, NodeInner, local};
use crate::shm::transport::Reach;

/// Which paths one send may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Via {
    /// The node's preference (`PULSING_TENSOR_TRANSPORT` or [`NodeBuilder::preference`]).
    ///
    /// [`NodeBuilder::preference`]: crate::NodeBuilder::preference
    Preferred,
    /// This preference, for this send.
    Prefer(Preference),
    /// This path and no other: if the router cannot take it to this peer, the send fails
    /// with [`Error::RouteUnavailable`] saying why (no silent fallback).
    Only(Route),
}

impl Via {
    /// The `Via` of the older `force: Option<Preference>` arguments.
    pub fn from_force(force: Option<Preference>) -> Self {
        force.map_or(Self::Preferred, Self::Prefer)
    }
}

/// The path a send to a peer takes, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteChoice {
    /// The path.
    pub route: Route,
    /// Why: the preference and where it came from, the peer's locality, shared memory, TLS.
    pub reason: String,
}

impl Node {
    /// The path a send to `peer` takes now (with `force`, as [`Node::ask_via`] would send),
    /// and why. Shared memory is chosen only once the peer proved it is on this host; if that
    /// is being found out, this waits for the answer (at most the hello timeout).
    ///
    /// # Errors
    ///
    /// [`Error::DriverUnavailable`] when the path it must take is not plugged in.
    pub fn route_to(
        &self,
        peer: SocketAddr,
        force: Option<Preference>,
    ) -> Result<RouteChoice, Error> {
        self.route_for(peer, Via::from_force(force))
    }

    /// Whether a send to `to` goes to a node of this process now (its mailbox gets the
    /// message's buffers as they are, without a copy).
    pub fn delivers_in_process(&self, to: &super::Destination) -> bool {
        if !self.inner.in_process_delivery || local::lookup(to.peer()).is_none() {
            return false;
        }
        matches!(
            self.inner.choose_to_send(to.peer(), to.via()),
            Ok(Target::Local(_))
        )
    }

    /// [`Node::route_to`] for a send made with `via`.
    ///
    /// # Errors
    ///
    /// [`Error::DriverUnavailable`], or [`Error::RouteUnavailable`] for a [`Via::Only`] path
    /// the router cannot take.
    pub fn route_for(&self, peer: SocketAddr, via: Via) -> Result<RouteChoice, Error> {
        let (_, decision) = self.inner.choose(peer, via, true)?;
        let mut reason = explain(&decision, via);
        if let Via::Only(wanted) = via
            && wanted != decision.route
        {
            reason = format!(
                "{} was asked for, but it is not available (a send fails): {reason}",
                route_name(wanted)
            );
        }
        Ok(RouteChoice {
            route: decision.route,
            reason,
        })
    }
}

impl NodeInner {
    /// Where a send to `peer` goes: the pure route function of proto, applied per send. With
    /// `settle`, a probe of the peer that is under way is waited for (for explanations).
    pub(super) fn choose(
        &self,
        peer: SocketAddr,
        via: Via,
        settle: bool,
    ) -> Result<(Target, Decision), Error> {
        let preference = match via {
            Via::Preferred => self.preference,
            Via::Prefer(preference) => preference,
            Via::Only(Route::RawTcp) => Preference::Raw,
            Via::Only(Route::Http2) => Preference::Http2,
            Via::Only(Route::SharedMemory) => Preference::SharedMemory,
            Via::Only(Route::LocalMailbox) => Preference::Auto,
        };
        // A network path asked for skips the in-process shortcut.
        let in_process = matches!(
            via,
            Via::Preferred | Via::Prefer(Preference::Auto) | Via::Only(Route::LocalMailbox)
        );
        let local = (self.in_process_delivery && in_process)
            .then(|| local::lookup(peer))
            .flatten();
        let wants_shm = matches!(preference, Preference::Auto | Preference::SharedMemory);
        let reach = match (&local, wants_shm, &self.shm) {
            (Some(_), ..) | (None, false, _) => None,
            (None, true, Some(shm)) if settle => {
                Some(shm.reach_settled(peer, self.shm_hello_timeout))
            }
            (None, true, Some(shm)) => Some(shm.reach(peer)),
            (None, true, None) => Some(Reach::NotLocal(self.shm_off.clone())),
        };
        let shm_ok = matches!(reach, Some(Reach::Local | Reach::Probing));
        let locality = if local.is_some() {
            Locality::SameProcess
        } else if shm_ok {
            Locality::SameHost
        } else {
            Locality::Remote
        };
        let caps = Capabilities {
            raw: true,
            shared_memory: shm_ok,
        };
        let tls = self.encrypts || self.require_tls;
        let route = route::select(preference, locality, caps, tls);
        let decision = Decision {
            route,
            preference,
            locality,
            tls,
            reach,
        };
        let target = match route {
            Route::LocalMailbox => local
                .map(Target::Local)
                .ok_or(Error::ConnectionClosed { peer, detail: None })?,
            Route::RawTcp => Target::Driver,
            Route::SharedMemory => Target::Shm {
                insist: matches!(via, Via::Only(Route::SharedMemory)),
            },
            Route::Http2 if self.transport.is_some() => Target::Transport,
            Route::Http2 => {
                return Err(Error::DriverUnavailable {
                    driver: "http2",
                    reason: "this send must go over HTTP/2 (TLS is required, or \
                         PULSING_TENSOR_TRANSPORT asks for it)"
                        .into(),
                    hint: "plug in tensorwire-compat's HTTP/2 transport with \
                       NodeBuilder::transport(Arc::new(tensorwire_compat::Http2::new(config)))",
                });
            }
        };
        Ok((target, decision))
    }

    /// [`NodeInner::choose`] for a send: a [`Via::Only`] path the router cannot take is an
    /// error saying why.
    pub(super) fn choose_to_send(&self, peer: SocketAddr, via: Via) -> Result<Target, Error> {
        let (target, decision) = self.choose(peer, via, false)?;
        if let Via::Only(wanted) = via
            && wanted != decision.route
        {
            return Err(Error::RouteUnavailable {
                route: route_name(wanted),
                reason: format!(
                    "the router picks {} for {peer}: {}",
                    route_name(decision.route),
                    explain(&decision, via)
                ),
            });
        }
        Ok(target)
    }

    /// Where a send goes that shared memory could not take (the peer is not on this host, or
    /// its memory is full): the remote path the preference allows.
    pub(super) fn remote_target(&self) -> Target {
        if (self.encrypts || self.require_tls) && self.transport.is_some() {
            Target::Transport
        } else {
            Target::Driver
        }
    }
}

/// What the route function was given and what it chose.
pub(super) struct Decision {
    pub(super) route: Route,
    preference: Preference,
    locality: Locality,
    tls: bool,
    /// What shared memory said of the peer, when it was asked.
    reach: Option<Reach>,
}

/// The name of a path (`local`, `shm`, `raw`, `http2`).
pub(crate) fn route_name(route: Route) -> &'static str {
    match route {
        Route::LocalMailbox => "local",
        Route::SharedMemory => "shm",
        Route::RawTcp => "raw",
        Route::Http2 => "http2",
    }
}

fn explain(decision: &Decision, via: Via) -> String {
    let Decision {
        preference,
        locality,
        tls,
        ref reach,
        ..
    } = *decision;
    let source = match via {
        Via::Preferred => {
            "the node's preference (PULSING_TENSOR_TRANSPORT or NodeBuilder::preference)"
        }
        Via::Prefer(_) => "asked for this send",
        Via::Only(_) => "the only path allowed for this send",
    };
    let locality = match (locality, reach) {
        (Locality::SameProcess, _) => "the peer is in this process".to_owned(),
        (_, Some(Reach::Local)) => {
            "the peer proved it is on this host (knock and shared-memory hello)".to_owned()
        }
        (_, Some(Reach::Probing)) => {
            "shared memory with the peer is being set up (sends wait for it)".to_owned()
        }
        (_, Some(Reach::NotLocal(why))) => format!("no shared memory: {why}"),
        (_, None) => "shared memory was not considered for this preference".to_owned(),
    };
    let tls = if tls { "; TLS is on" } else { "" };
    format!("preference {preference:?} ({source}); {locality}{tls}")
}
