//! The baselines' (std, seed) sockets get the options tensorwire's drivers set on theirs —
//! `TCP_NODELAY`, and on a same-host connection the same congestion control
//! (`TENSORWIRE_SAME_HOST_CONGESTION`, default reno) — so a ratio of a driver to a baseline
//! compares the drivers, not a kernel setting one of them changed.

use std::os::fd::AsFd;

use anyhow::Result;
use tensorwire_proto::congestion::SameHostCongestion;

/// Sets the options of a baseline's connected (or accepted) stream.
pub(crate) fn like_tensorwire(stream: &impl AsFd) -> Result<()> {
    let socket = socket2::SockRef::from(stream);
    socket.set_tcp_nodelay(true)?;
    let (Some(local), Some(peer)) = (
        socket.local_addr()?.as_socket(),
        socket.peer_addr()?.as_socket(),
    ) else {
        return Ok(());
    };
    if let Some(name) = SameHostCongestion::from_env()?.for_connection(local, peer) {
        // As in tensorwire: a refused name keeps the kernel's choice.
        let _ = socket.set_tcp_congestion(name.as_bytes());
    }
    Ok(())
}
