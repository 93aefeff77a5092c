//! The socket options the tokio driver's connections get. PTR1, in both roles: `TCP_NODELAY`
//! (frames end in partial segments that must not wait for an ACK), the session's TCP
//! keepalive, and on a same-host connection the congestion control the session names
//! (`SessionConfig::same_host_congestion`); HTTP/2 connections get the congestion control too.
//! An option the kernel refuses is logged and the connection goes on without it.

use std::time::Duration;

use tensorwire_proto::congestion::Refused;
use tensorwire_proto::session::SessionConfig;
use tokio::net::TcpStream;

/// Sets the options of a connected (or just accepted) stream.
pub(crate) fn tune(stream: &TcpStream, session: &SessionConfig) {
    let _ = stream.set_nodelay(true);
    let socket = socket2::SockRef::from(stream);
    if let Some(keepalive) = session.keepalive {
        let (idle, interval, probes) = keepalive.socket_values();
        let params = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(idle.into()))
            .with_interval(Duration::from_secs(interval.into()))
            .with_retries(probes);
        if let Err(e) = socket.set_tcp_keepalive(&params) {
            tracing::debug!(error = %e, "TCP keepalive not set");
        }
    }
    choose_congestion(stream, session);
}

/// On a stream whose two ends are on this host, asks for the session's same-host congestion
/// control.
pub(crate) fn choose_congestion(stream: &TcpStream, session: &SessionConfig) {
    let socket = socket2::SockRef::from(stream);
    let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
        return;
    };
    let set = |name: &str| socket.set_tcp_congestion(name.as_bytes());
    if let Err(refused) = session.same_host_congestion.apply(local, peer, set) {
        let (name, error) = (refused.name, &refused.error);
        if refused.first {
            tracing::warn!(%error, name, "{}", Refused::<()>::MESSAGE);
        } else {
            tracing::debug!(%error, name, "{}", Refused::<()>::MESSAGE);
        }
    }
}

#[cfg(test)]
mod tests {
    use tensorwire_proto::congestion::SameHostCongestion;
    use tokio::net::TcpListener;

    use super::*;

    fn congestion(stream: &TcpStream) -> Vec<u8> {
        let name = socket2::SockRef::from(stream).tcp_congestion().unwrap();
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
        tune(&client, &session);
        assert_eq!(congestion(&client), before);
        session.same_host_congestion = SameHostCongestion::named("no_such_cc").unwrap();
        tune(&client, &session);
        assert_eq!(congestion(&client), before);
        assert!(client.nodelay().unwrap());
        for stream in [&client, &server] {
            tune(stream, &SessionConfig::default());
            assert_eq!(congestion(stream), b"reno");
        }
    }
}
