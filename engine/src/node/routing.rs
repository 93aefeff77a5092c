//! The router: which path one send takes (proto's pure route function applied to what this
//! node knows of the peer), and the explanation users get for it.

use std::net::SocketAddr;

use tensorwire_proto::route::{self, Capabilities, Locality, Preference, Route};
use tensorwire_proto::transport::Error;

use super::{Node, Target, local};

/// The path a send to a peer takes, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteChoice {
    /// The path.
    pub route: Route,
    /// Why: the preference and where it came from, the peer's locality, TLS.
    pub reason: String,
}

impl Node {
    /// The path a send to `peer` takes now (with `force`, as [`Node::ask_via`] would send),
    /// and why. Shared memory is chosen only once the peer proved it is on this host (its
    /// first same-host hello), so the answer can change from PTR1 to shared memory after the
    /// first exchange.
    ///
    /// # Errors
    ///
    /// [`Error::DriverUnavailable`] when the path it must take is not plugged in.
    pub fn route_to(
        &self,
        peer: SocketAddr,
        force: Option<Preference>,
    ) -> Result<RouteChoice, Error> {
        let (_, decision) = self.choose(peer, force)?;
        Ok(RouteChoice {
            route: decision.route,
            reason: explain(&decision, force.is_some()),
        })
    }

    /// Where a send to `peer` goes: the pure route function of proto, applied per send.
    pub(super) fn route(
        &self,
        peer: SocketAddr,
        force: Option<Preference>,
    ) -> Result<Target, Error> {
        self.choose(peer, force).map(|(target, _)| target)
    }

    /// The route function's inputs for `peer`, and where they lead (the explanation is
    /// formatted only when asked for, by [`Node::route_to`]: not on every send).
    fn choose(
        &self,
        peer: SocketAddr,
        force: Option<Preference>,
    ) -> Result<(Target, Decision), Error> {
        let preference = force.unwrap_or(self.inner.preference);
        // A forced network path skips the in-process shortcut.
        let local =
            if self.inner.in_process_delivery && matches!(force, None | Some(Preference::Auto)) {
                local::lookup(peer)
            } else {
                None
            };
        // Same host only once the peer proved it on the shared-memory socket.
        let wants_shm = matches!(preference, Preference::Auto | Preference::SharedMemory);
        let shm_ok = local.is_none()
            && wants_shm
            && self
                .inner
                .shm
                .as_ref()
                .is_some_and(|shm| shm.reachable(peer));
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
        let tls = self.inner.encrypts || self.inner.require_tls;
        let route = route::select(preference, locality, caps, tls);
        let decision = Decision {
            route,
            preference,
            locality,
            tls,
        };
        let target = match route {
            Route::LocalMailbox => local
                .map(Target::Local)
                .ok_or(Error::ConnectionClosed { peer, detail: None })?,
            Route::RawTcp => Target::Driver,
            Route::SharedMemory => Target::Shm,
            Route::Http2 if self.inner.transport.is_some() => Target::Transport,
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
}

/// What the route function was given and what it chose.
struct Decision {
    route: Route,
    preference: Preference,
    locality: Locality,
    tls: bool,
}

fn explain(decision: &Decision, forced: bool) -> String {
    let Decision {
        preference,
        locality,
        tls,
        ..
    } = *decision;
    let source = if forced {
        "forced for this send"
    } else {
        "the node's preference (PULSING_TENSOR_TRANSPORT or NodeBuilder::preference)"
    };
    let locality = match locality {
        Locality::SameProcess => "the peer is in this process",
        Locality::SameHost => "the peer proved it is on this host (shared-memory hello)",
        Locality::Remote => "the peer is not known to share this process or host",
    };
    let tls = if tls { ", TLS is on" } else { "" };
    format!("preference {preference:?} ({source}); {locality}{tls}")
}
