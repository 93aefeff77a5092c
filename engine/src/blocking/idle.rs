//! The blocking calls' idle connections by peer: the most recently used first, a cap per peer,
//! and a sweep that drops connections idle too long (their server closes them anyway) and the
//! peers left without any, so the map stays bounded by the peers in use, not by every peer
//! ever called.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Idle connections (`C`) by peer.
pub(crate) struct IdleConns<C> {
    by_peer: HashMap<SocketAddr, Vec<(C, Instant)>>,
    per_peer: usize,
    /// Connections idle this long are dropped by the next sweep.
    max_idle: Duration,
    /// The map's size that starts the next sweep (twice what the last one left).
    sweep_at: usize,
}

/// Peers the map holds before its first sweep.
const FIRST_SWEEP: usize = 16;

impl<C> IdleConns<C> {
    pub(crate) fn new(per_peer: usize, max_idle: Duration) -> Self {
        Self {
            by_peer: HashMap::new(),
            per_peer,
            max_idle,
            sweep_at: FIRST_SWEEP,
        }
    }

    /// The most recently parked connection to `peer`, if any.
    pub(crate) fn take(&mut self, peer: SocketAddr) -> Option<C> {
        let list = self.by_peer.get_mut(&peer)?;
        let conn = list.pop().map(|(conn, _)| conn);
        if list.is_empty() {
            self.by_peer.remove(&peer);
        }
        conn
    }

    /// Parks `conn` to `peer`; `Some(conn)` back if the peer has its cap already (close it).
    pub(crate) fn put(&mut self, peer: SocketAddr, conn: C, now: Instant) -> Option<C> {
        if !self.by_peer.contains_key(&peer) && self.by_peer.len() >= self.sweep_at {
            self.sweep(now);
        }
        let list = self.by_peer.entry(peer).or_default();
        if list.len() >= self.per_peer {
            return Some(conn);
        }
        list.push((conn, now));
        None
    }

    /// Everything parked (shutdown).
    pub(crate) fn drain(&mut self) -> Vec<C> {
        self.by_peer
            .drain()
            .flat_map(|(_, list)| list.into_iter().map(|(conn, _)| conn))
            .collect()
    }

    /// Peers with a parked connection.
    #[cfg(test)]
    pub(crate) fn peers(&self) -> usize {
        self.by_peer.len()
    }

    fn sweep(&mut self, now: Instant) {
        let max_idle = self.max_idle;
        self.by_peer.retain(|_, list| {
            list.retain(|(_, since)| now.saturating_duration_since(*since) < max_idle);
            !list.is_empty()
        });
        self.sweep_at = (self.by_peer.len() * 2).max(FIRST_SWEEP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn peers_called_once_long_ago_do_not_stay_in_the_map() {
        let mut sut = IdleConns::new(2, Duration::from_secs(10));
        let start = Instant::now();
        for port in 0..10_000u16 {
            let now = start + Duration::from_secs(u64::from(port));
            assert!(sut.put(peer(port), port, now).is_none());
        }
        // Only connections parked in the last 10 s, and at most twice the sweep's survivors.
        assert!(sut.peers() <= 2 * 10 + FIRST_SWEEP, "{}", sut.peers());
        assert_eq!(sut.take(peer(9_999)), Some(9_999));
        assert_eq!(sut.take(peer(0)), None, "swept long ago");
    }

    #[test]
    fn the_cap_per_peer_holds_and_taking_the_last_forgets_the_peer() {
        let mut sut = IdleConns::new(2, Duration::from_secs(10));
        let now = Instant::now();
        assert!(sut.put(peer(1), 1, now).is_none());
        assert!(sut.put(peer(1), 2, now).is_none());
        assert_eq!(
            sut.put(peer(1), 3, now),
            Some(3),
            "over the cap: handed back"
        );
        assert_eq!(sut.take(peer(1)), Some(2), "the most recent first");
        assert_eq!(sut.take(peer(1)), Some(1));
        assert_eq!(sut.peers(), 0);
        assert_eq!(sut.drain().len(), 0);
    }
}
