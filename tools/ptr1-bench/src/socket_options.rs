//! The baselines' (std, seed) sockets get the options tensorwire's drivers set on theirs —
//! `TCP_NODELAY`, and on a same-host connection the same congestion control
//! (`TENSORWIRE_SAME_HOST_CONGESTION`, default reno), asked for the same way: before
//! `connect`, on a loopback listener, else once accepted — so a ratio of a driver to a
//! baseline compares the drivers, not a kernel setting one of them changed.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;

use socket2::{Domain, SockRef, Socket, Type};

use tensorwire_proto::congestion::SameHostCongestion;

/// The same-host congestion control, from `TENSORWIRE_SAME_HOST_CONGESTION` as a node reads it.
pub(crate) fn choice() -> anyhow::Result<SameHostCongestion> {
    Ok(SameHostCongestion::from_env()?)
}

/// A blocking connection to `peer` whose socket asked for the same-host congestion control
/// before connecting if `peer` is a loopback address (where the fixtures run), as tensorwire's
/// drivers do; a peer at another address of this host switches once connected.
pub(crate) fn connect(peer: SocketAddr) -> anyhow::Result<TcpStream> {
    let choice = choice()?;
    let socket = Socket::new(Domain::for_address(peer), Type::STREAM, None)?;
    let loopback = peer.ip().to_canonical().is_loopback();
    // As in tensorwire: a refused name keeps the kernel's choice.
    let _ = choice.apply(loopback, |name| socket.set_tcp_congestion(name.as_bytes()));
    socket.connect(&peer.into())?;
    let stream = TcpStream::from(socket);
    like_tensorwire(&stream, &choice);
    Ok(stream)
}

/// A listener on `listen`; bound to a loopback address, it asks for the same-host congestion
/// control, which the sockets it accepts inherit.
pub(crate) fn listen(
    listen: SocketAddr,
    choice: &SameHostCongestion,
) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(listen)?;
    let loopback = listener.local_addr()?.ip().to_canonical().is_loopback();
    let socket = SockRef::from(&listener);
    let _ = choice.apply(loopback, |name| socket.set_tcp_congestion(name.as_bytes()));
    Ok(listener)
}

/// Sets the options of a baseline's connected (or accepted) stream. A stream whose peer is
/// already gone is left as it is: the baseline finds out on its first read.
pub(crate) fn like_tensorwire(stream: &impl AsFd, choice: &SameHostCongestion) {
    let socket = SockRef::from(stream);
    let _ = socket.set_tcp_nodelay(true);
    let (Ok(local), Ok(peer)) = (socket.local_addr(), socket.peer_addr()) else {
        return;
    };
    let (Some(local), Some(peer)) = (local.as_socket(), peer.as_socket()) else {
        return;
    };
    if let Some(name) = choice.for_connection(local, peer) {
        // As in tensorwire: a refused name keeps the kernel's choice.
        let _ = socket.set_tcp_congestion(name.as_bytes());
    }
}
