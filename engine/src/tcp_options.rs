//! The socket options every connection gets, in both roles, from the io_uring driver and the
//! blocking client alike: `TCP_NODELAY`, the session's keepalive, and on a same-host
//! connection the congestion control the session names (`SessionConfig::same_host_congestion`),
//! asked for before `connect` (client) or on a loopback listener (server) where that is
//! possible, since a socket that leaves BBR once connected keeps BBR's pacing. An option the
//! kernel refuses is logged and the connection goes on without it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::RawFd;

use tensorwire_proto::congestion::{self, Refused};
use tensorwire_proto::session::SessionConfig;

use crate::sys;

/// Sets the options of a socket about to connect to `peer`; [`connected`] checks again once
/// it is.
pub(crate) fn tune_connecting(fd: RawFd, peer: SocketAddr, session: &SessionConfig) {
    tune_common(fd, session);
    let on_this_host = congestion::peer_on_this_host(peer, routed_source);
    set_congestion(fd, on_this_host, session);
}

/// Sets the options of an accepted socket. One accepted on a loopback listener already has
/// the same-host congestion control ([`tune_listener`]); one accepted from this host on any
/// other listener switches now, keeping BBR's pacing at the new congestion control's rate.
pub(crate) fn tune_accepted(fd: RawFd, session: &SessionConfig) {
    tune_common(fd, session);
    connected(fd, session);
}

/// Once connected: a same-host connection the check before `connect` missed switches now
/// (the kernel ignores asking again for the congestion control a socket already has).
pub(crate) fn connected(fd: RawFd, session: &SessionConfig) {
    let (Ok(local), Ok(peer)) = (sys::local_addr(fd), sys::peer_addr(fd)) else {
        return;
    };
    set_congestion(fd, congestion::same_host(local, peer), session);
}

/// A listener bound to a loopback address asks for the same-host congestion control: the
/// sockets it accepts inherit it from the start.
pub(crate) fn tune_listener(fd: RawFd, local: SocketAddr, session: &SessionConfig) {
    set_congestion(fd, local.ip().to_canonical().is_loopback(), session);
}

fn tune_common(fd: RawFd, session: &SessionConfig) {
    if let Err(e) = sys::set_nodelay(fd) {
        tracing::debug!(error = %e, "TCP_NODELAY not set");
    }
    if let Err(e) = sys::set_keepalive(fd, session.keepalive) {
        tracing::debug!(error = %e, "TCP keepalive not set");
    }
}

fn set_congestion(fd: RawFd, on_this_host: bool, session: &SessionConfig) {
    let set = |name: &str| sys::set_congestion(fd, name);
    if let Err(refused) = session.same_host_congestion.apply(on_this_host, set) {
        let (name, error) = (refused.name, &refused.error);
        if refused.first {
            tracing::warn!(%error, name, "{}", Refused::<()>::MESSAGE);
        } else {
            tracing::debug!(%error, name, "{}", Refused::<()>::MESSAGE);
        }
    }
}

/// The local address the kernel's routing would send to `peer` from: a UDP socket connected
/// to it (which sends nothing) is given one.
fn routed_source(peer: SocketAddr) -> Option<SocketAddr> {
    let any = SocketAddr::new(unspecified(peer.ip()), 0);
    let socket = UdpSocket::bind(any).ok()?;
    socket.connect(peer).ok()?;
    socket.local_addr().ok()
}

fn unspecified(like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    use tensorwire_proto::congestion::SameHostCongestion;

    use super::*;

    /// A connected loopback pair: the connecting end and the accepted one.
    fn loopback_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    #[test]
    fn loopback_sockets_ask_for_reno_in_every_role_and_keep_their_other_options() {
        let session = SessionConfig::default();
        let (client, server) = loopback_pair();
        tune_accepted(server.as_raw_fd(), &session);
        assert_eq!(sys::congestion(server.as_raw_fd()).unwrap(), "reno");
        assert!(server.nodelay().unwrap());
        let peer = client.peer_addr().unwrap();
        let connecting = sys::tcp_socket(&peer).unwrap();
        tune_connecting(connecting.as_raw_fd(), peer, &session);
        assert_eq!(sys::congestion(connecting.as_raw_fd()).unwrap(), "reno");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        tune_listener(listener.as_raw_fd(), local, &session);
        let _client = TcpStream::connect(local).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert_eq!(sys::congestion(accepted.as_raw_fd()).unwrap(), "reno");
    }

    #[test]
    fn a_wildcard_listener_keeps_the_kernels_choice_for_what_it_accepts_from_afar() {
        let listener = TcpListener::bind("0.0.0.0:0").unwrap();
        let before = sys::congestion(listener.as_raw_fd()).unwrap();
        let local = listener.local_addr().unwrap();
        tune_listener(listener.as_raw_fd(), local, &SessionConfig::default());
        assert_eq!(sys::congestion(listener.as_raw_fd()).unwrap(), before);
    }

    #[test]
    fn system_keeps_the_kernels_choice_and_an_unknown_name_leaves_the_connection_usable() {
        let (client, _server) = loopback_pair();
        let before = sys::congestion(client.as_raw_fd()).unwrap();
        let mut session = SessionConfig::default();
        session.same_host_congestion = SameHostCongestion::system();
        tune_accepted(client.as_raw_fd(), &session);
        assert_eq!(sys::congestion(client.as_raw_fd()).unwrap(), before);
        session.same_host_congestion = SameHostCongestion::named("no_such_cc").unwrap();
        tune_accepted(client.as_raw_fd(), &session);
        assert_eq!(sys::congestion(client.as_raw_fd()).unwrap(), before);
        assert!(
            client.nodelay().unwrap(),
            "the other options were still set"
        );
    }

    #[test]
    fn a_peer_at_an_address_of_this_host_is_routed_from_that_address() {
        let loopback: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(routed_source(loopback).map(|s| s.ip()), Some(loopback.ip()));
        let own = routed_source("192.0.2.1:9".parse().unwrap()).map(|s| s.ip());
        if let Some(own) = own.filter(|ip| !ip.is_loopback()) {
            // The address this host would send from is its own: a peer there is on this host.
            let peer = SocketAddr::new(own, 9);
            assert_eq!(routed_source(peer).map(|s| s.ip()), Some(own));
        }
    }
}
