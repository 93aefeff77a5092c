//! The socket options the tokio driver's connections get. PTR1, in both roles: `TCP_NODELAY`
//! (frames end in partial segments that must not wait for an ACK), the session's TCP
//! keepalive, and on a same-host connection the congestion control the session names
//! (`SessionConfig::same_host_congestion`); HTTP/2 connections get the congestion control too.
//! Outgoing connections ask for it before `connect` ([`connect`]): a socket that leaves BBR
//! once connected keeps BBR's pacing. An option the kernel refuses is logged and the
//! connection goes on without it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use socket2::SockRef;
use tensorwire_proto::congestion::{self, Refused};
use tensorwire_proto::session::SessionConfig;
use tokio::net::{TcpSocket, TcpStream};

/// Connects to `peer`, on a socket that asked for the same-host congestion control first if
/// `peer` is on this host.
pub(crate) async fn connect(peer: SocketAddr, session: &SessionConfig) -> io::Result<TcpStream> {
    let socket = if peer.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    let on_this_host = congestion::peer_on_this_host(peer, routed_source);
    set_congestion(SockRef::from(&socket), on_this_host, session);
    let stream = socket.connect(peer).await?;
    // A same-host connection the check above missed switches now.
    choose_congestion(&stream, session);
    Ok(stream)
}

/// A listener bound to a loopback address asks for the same-host congestion control: the
/// sockets it accepts inherit it from the start.
pub(crate) fn tune_listener(listener: &std::net::TcpListener, session: &SessionConfig) {
    let loopback = listener
        .local_addr()
        .is_ok_and(|local| local.ip().to_canonical().is_loopback());
    set_congestion(SockRef::from(listener), loopback, session);
}

/// Sets the options of an accepted PTR1 stream: the same-host congestion control, then
/// [`tune`]'s.
pub(crate) fn tune_accepted(stream: &TcpStream, session: &SessionConfig) {
    choose_congestion(stream, session);
    tune(stream, session);
}

/// Sets `TCP_NODELAY` and the session's keepalive on a PTR1 stream (one from [`connect`]
/// chose its congestion control there; an accepted one: [`tune_accepted`]).
pub(crate) fn tune(stream: &TcpStream, session: &SessionConfig) {
    let _ = stream.set_nodelay(true);
    if let Some(keepalive) = session.keepalive {
        let (idle, interval, probes) = keepalive.socket_values();
        let params = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(idle.into()))
            .with_interval(Duration::from_secs(interval.into()))
            .with_retries(probes);
        if let Err(e) = SockRef::from(stream).set_tcp_keepalive(&params) {
            tracing::debug!(error = %e, "TCP keepalive not set");
        }
    }
}

/// On a stream whose two ends are on this host, asks for the session's same-host congestion
/// control (for an accepted stream: a connected one that switches keeps BBR's pacing, at the
/// new congestion control's rate; one that asked before `connect` already has it).
pub(crate) fn choose_congestion(stream: &TcpStream, session: &SessionConfig) {
    let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
        return;
    };
    set_congestion(
        SockRef::from(stream),
        congestion::same_host(local, peer),
        session,
    );
}

fn set_congestion(socket: SockRef<'_>, on_this_host: bool, session: &SessionConfig) {
    let set = |name: &str| socket.set_tcp_congestion(name.as_bytes());
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
    let any: IpAddr = if peer.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let socket = UdpSocket::bind((any, 0)).ok()?;
    socket.connect(peer).ok()?;
    socket.local_addr().ok()
}

#[cfg(test)]
mod tests {
    use tensorwire_proto::congestion::SameHostCongestion;
    use tokio::net::TcpListener;

    use super::*;

    fn congestion(stream: &TcpStream) -> Vec<u8> {
        let name = SockRef::from(stream).tcp_congestion().unwrap();
        name.into_iter().take_while(|&b| b != 0).collect()
    }

    #[tokio::test]
    async fn a_loopback_connection_asks_for_reno_in_both_roles_unless_told_to_keep_the_kernels() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let before = congestion(&client);
        let mut session = SessionConfig::default();
        session.same_host_congestion = SameHostCongestion::system();
        tune_accepted(&client, &session);
        assert_eq!(congestion(&client), before);
        session.same_host_congestion = SameHostCongestion::named("no_such_cc").unwrap();
        tune_accepted(&client, &session);
        assert_eq!(congestion(&client), before);
        assert!(client.nodelay().unwrap());
        for stream in [&client, &server] {
            tune(stream, &SessionConfig::default());
            assert_eq!(
                congestion(stream),
                before,
                "tune leaves the congestion control"
            );
            tune_accepted(stream, &SessionConfig::default());
            assert_eq!(congestion(stream), b"reno");
        }
        let connected = connect(listener.local_addr().unwrap(), &SessionConfig::default())
            .await
            .unwrap();
        assert_eq!(
            congestion(&connected),
            b"reno",
            "asked for before connecting"
        );
    }
}
