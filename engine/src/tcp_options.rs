//! The socket options every PTR1 connection gets, in both roles, from the io_uring driver and
//! the blocking client alike: `TCP_NODELAY`, the session's keepalive, and on a same-host
//! connection the congestion control the session names (`SessionConfig::same_host_congestion`).
//! An option the kernel refuses is logged and the connection goes on without it.

use std::os::fd::RawFd;
use tensorwire_proto::congestion::Refused;
use tensorwire_proto::session::SessionConfig;

use crate::sys;

/// Sets the options of a connected (or just accepted) TCP socket. A socket still connecting
/// gets all but the congestion control: call [`choose_congestion`] once it is connected.
pub(crate) fn tune(fd: RawFd, session: &SessionConfig) {
    if let Err(e) = sys::set_nodelay(fd) {
        tracing::debug!(error = %e, "TCP_NODELAY not set");
    }
    if let Err(e) = sys::set_keepalive(fd, session.keepalive) {
        tracing::debug!(error = %e, "TCP keepalive not set");
    }
    choose_congestion(fd, session);
}

/// On a connected socket whose two ends are on this host, asks for the session's same-host
/// congestion control; otherwise (or not connected yet) does nothing.
pub(crate) fn choose_congestion(fd: RawFd, session: &SessionConfig) {
    let (Ok(local), Ok(peer)) = (sys::local_addr(fd), sys::peer_addr(fd)) else {
        return;
    };
    let set = |name: &str| sys::set_congestion(fd, name);
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
    fn a_loopback_connection_asks_for_reno_in_both_roles_and_keeps_its_other_options() {
        let (client, server) = loopback_pair();
        let session = SessionConfig::default();
        for stream in [&client, &server] {
            tune(stream.as_raw_fd(), &session);
            assert_eq!(sys::congestion(stream.as_raw_fd()).unwrap(), "reno");
            assert!(stream.nodelay().unwrap());
        }
    }

    #[test]
    fn system_keeps_the_kernels_choice_and_an_unknown_name_leaves_the_connection_usable() {
        let (client, _server) = loopback_pair();
        let before = sys::congestion(client.as_raw_fd()).unwrap();
        let mut session = SessionConfig::default();
        session.same_host_congestion = SameHostCongestion::system();
        tune(client.as_raw_fd(), &session);
        assert_eq!(sys::congestion(client.as_raw_fd()).unwrap(), before);
        session.same_host_congestion = SameHostCongestion::named("no_such_cc").unwrap();
        tune(client.as_raw_fd(), &session);
        assert_eq!(sys::congestion(client.as_raw_fd()).unwrap(), before);
        assert!(
            client.nodelay().unwrap(),
            "the other options were still set"
        );
    }
}
