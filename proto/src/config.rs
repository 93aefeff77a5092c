//! Deadlines, rates and windows of PTR1 connections, and the client pool's bounds (shared by
//! the sessions and the transport seams).

use std::time::Duration;

use crate::congestion::SameHostCongestion;
use crate::limits::Limits;

/// How long each phase of a connection may take, and how receive memory is exposed.
///
/// The defaults suit a data-centre network. Every deadline is enforced by the sessions with
/// the time their driver passes in; none of them needs a runtime.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SessionConfig {
    /// Limits every received frame is checked against.
    pub limits: Limits,
    /// A new server connection must send its first four bytes within this (default 5 s).
    pub preface_timeout: Duration,
    /// A frame's head (fixed header, length table and path) must complete within this of its
    /// first byte (default 10 s): a peer trickling a header is closed.
    pub head_timeout: Duration,
    /// A frame's body, and a reply being written, must move at least this many bytes per
    /// second, measured over each [`SessionConfig::rate_window`] (default 64 KiB/s).
    pub min_rate: u64,
    /// The interval the minimum rate is measured over (default 30 s; at least 1 ms).
    pub rate_window: Duration,
    /// A server connection may sit idle between requests this long (default 300 s).
    pub idle_timeout: Duration,
    /// A request may wait this long for space in a full mailbox before the peer is told it
    /// could not be delivered (default 60 s).
    pub enqueue_timeout: Duration,
    /// After an error reply, input is discarded for at most this long before closing
    /// (default 2 s), so the reply is not destroyed by a reset.
    pub drain_timeout: Duration,
    /// Connecting to a peer may take this long (default 5 s).
    pub connect_timeout: Duration,
    /// Per-connection scratch for heads and small bodies (default 16 KiB).
    pub scratch_len: usize,
    /// The most receive memory exposed ahead of the bytes that arrived (default 16 MiB). The
    /// window starts at 64 KiB and grows to four times the bytes the peer actually sent (64
    /// times the body bytes over memory committed already, such as a warm pool slot), so a
    /// peer is never given memory it has not paid for with data.
    pub max_window: usize,
    /// TCP keepalive on every PTR1 connection, both roles (default on: 15 s idle, then 3
    /// probes 3 s apart). A peer that vanished without a FIN — a host gone, a link cut, a
    /// black hole — is noticed on a connection that sat idle about 24 s, and the pool drops
    /// it before a request could be handed to it. A connection reused sooner, or one with
    /// bytes in flight (keepalive does not probe those), is bounded by the request's
    /// deadline instead. `None` turns it off.
    pub keepalive: Option<Keepalive>,
    /// The TCP congestion control a connection asks for when both its ends are on this host
    /// (default `reno`, where BBR's pacing reorders segments; [`SameHostCongestion`]). A
    /// connection to another host keeps the kernel's. A node sets this from
    /// `NodeBuilder::same_host_congestion` or the environment, over what a
    /// `NodeBuilder::session` config held (as it does `limits`).
    pub same_host_congestion: SameHostCongestion,
}

/// TCP keepalive settings: after `idle` without traffic, `probes` probes `interval` apart; the
/// connection fails if none is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe (at least 1 s).
    pub idle: Duration,
    /// Time between probes (at least 1 s).
    pub interval: Duration,
    /// Unanswered probes before the connection fails (at least 1).
    pub probes: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(15),
            interval: Duration::from_secs(3),
            probes: 3,
        }
    }
}

impl Keepalive {
    /// Whole seconds before the first probe, between probes, and the probe count, within what
    /// Linux accepts for `TCP_KEEPIDLE` and `TCP_KEEPINTVL` (1 to 32,767 s) and `TCP_KEEPCNT`
    /// (1 to 127).
    pub fn socket_values(&self) -> (u32, u32, u32) {
        const MAX_SECS: u64 = 32_767;
        let secs = |d: Duration| u32::try_from(d.as_secs().clamp(1, MAX_SECS)).unwrap_or(1);
        (
            secs(self.idle),
            secs(self.interval),
            self.probes.clamp(1, 127),
        )
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            preface_timeout: Duration::from_secs(5),
            head_timeout: Duration::from_secs(10),
            min_rate: 64 << 10,
            rate_window: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            enqueue_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            scratch_len: 16 << 10,
            max_window: 16 << 20,
            keepalive: Some(Keepalive::default()),
            same_host_congestion: SameHostCongestion::default(),
        }
    }
}

impl SessionConfig {
    /// The smallest receive window (64 KiB, or less if `max_window` is smaller).
    pub fn min_window(&self) -> usize {
        self.max_window.min(64 << 10)
    }

    /// The most bytes a driver may let arrive before it reports progress: a quarter of what
    /// the minimum rate requires per window, so a peer that keeps the rate is seen to keep it
    /// (a window may see up to one quantum less than what moved in it). A receive that waits
    /// for more than this (`MSG_WAITALL` over a larger region, a larger `SO_RCVLOWAT`) could
    /// make a slow but honest peer look stalled.
    ///
    /// Writes are not cut to it: a send reports what the socket took each time the kernel
    /// lets it write, which is in lumps of about a third of the socket's send buffer (the
    /// kernel wakes a writer only once that much is free; up to about 1.3 MiB with a 4 MiB
    /// buffer). A peer reading barely above `min_rate` with a `rate_window` whose required
    /// bytes are below one such lump can so be cut off while writing; the defaults (64 KiB/s
    /// over 30 s, 1.9 MiB per window) leave room.
    pub fn progress_quantum(&self) -> usize {
        let window = self.rate_window.max(Duration::from_millis(1));
        let per_window = u128::from(self.min_rate) * window.as_millis() / 1000;
        usize::try_from(per_window / 4)
            .unwrap_or(usize::MAX)
            .max(4096)
    }
}

/// Bounds of a client's connections to one peer.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct ConnectionPoolConfig {
    /// Idle connections kept per peer (default 8); more are closed after `trim_after`.
    pub idle_per_peer: usize,
    /// Connections per peer at most (default 32); further requests wait in order.
    pub max_per_peer: usize,
    /// About how many request bytes one driver thread may have on their way to one peer at
    /// once (default 2 MiB; a driver whose threads share one pool multiplies it by them):
    /// a request of `n` bytes starts only while fewer than `busy_bytes_per_peer / n`
    /// connections to its peer are busy (always at least one, never more than
    /// `max_per_peer`), and otherwise waits in order for one to finish. Small requests get
    /// many connections; large ones few, because every connection more holds another
    /// message in the kernel's socket buffers, and once those outgrow the CPU caches every
    /// copy in and out of them gets slower (measured in `docs/benchmarks.md`).
    pub busy_bytes_per_peer: u64,
    /// Requests waiting for a connection at most, over all peers of one driver thread
    /// (default 16,384); a request beyond it fails at once with `Error::Overloaded`.
    pub max_waiting: usize,
    /// How long a connection above the idle cap may stay idle (default 1 s), so a burst does
    /// not close what the next burst would reopen.
    pub trim_after: Duration,
    /// Connections per peer (default 4, at most `max_per_peer`) from which small requests to a
    /// peer that takes pipelined requests go onto the busy connection carrying fewest instead
    /// of a new one: a few connections spread the work over the peer's threads, more only add
    /// wake-ups and small segments (`docs/benchmarks.md`, "Pipelining").
    pub pipeline_connections: usize,
}

impl Default for ConnectionPoolConfig {
    fn default() -> Self {
        Self {
            idle_per_peer: 8,
            max_per_peer: 32,
            busy_bytes_per_peer: 2 << 20,
            max_waiting: 16_384,
            trim_after: Duration::from_secs(1),
            pipeline_connections: 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_socket_values_are_whole_seconds_within_what_linux_takes() {
        let keepalive = Keepalive {
            idle: Duration::from_millis(2_700),
            interval: Duration::ZERO,
            probes: 0,
        };
        assert_eq!(keepalive.socket_values(), (2, 1, 1));
        let huge = Keepalive {
            idle: Duration::from_secs(u64::MAX),
            ..Keepalive::default()
        };
        assert_eq!(huge.socket_values(), (32_767, 3, 3));
        let many = Keepalive {
            probes: 1000,
            ..Keepalive::default()
        };
        assert_eq!(many.socket_values(), (15, 3, 127));
        assert_eq!(
            SessionConfig::default().keepalive,
            Some(Keepalive::default())
        );
    }
}
