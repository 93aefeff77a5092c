//! The tickets a node hands out in answer to knocks: single-use, short-lived, bound to the TCP
//! address that knocked, and bounded in number (a flood of knocks evicts the oldest: shared
//! memory is then set up again, never trusted without one). Time and randomness are passed in.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Tickets outstanding at most, by default.
pub const MAX_TICKETS: usize = 1024;
/// How long a ticket may wait to be redeemed, by default.
pub const TICKET_TTL: Duration = Duration::from_secs(10);

/// The tickets a node has issued and not yet seen redeemed.
#[derive(Debug)]
pub struct Tickets {
    issued: VecDeque<Ticket>,
    max: usize,
    ttl: Duration,
}

#[derive(Debug)]
struct Ticket {
    id: u64,
    secret: [u8; 16],
    /// The TCP address the knock came from: a ticket is redeemed only by that knocker.
    knocker: SocketAddr,
    issued: Instant,
}

impl Default for Tickets {
    fn default() -> Self {
        Self::new(MAX_TICKETS, TICKET_TTL)
    }
}

impl Tickets {
    /// At most `max` tickets, each valid for `ttl`.
    pub fn new(max: usize, ttl: Duration) -> Self {
        Self {
            issued: VecDeque::new(),
            max: max.max(1),
            ttl,
        }
    }

    /// Records ticket `id` with `secret` (both random, from the caller) for `knocker`.
    pub fn issue(&mut self, now: Instant, knocker: SocketAddr, id: u64, secret: [u8; 16]) {
        self.expire(now);
        if self.issued.len() >= self.max {
            self.issued.pop_front();
        }
        self.issued.push_back(Ticket {
            id,
            secret,
            knocker,
            issued: now,
        });
    }

    /// Redeems ticket `id` for the client that says it knocked from `knocker`: its secret,
    /// once, if it is still valid and was issued to that knocker.
    pub fn redeem(&mut self, now: Instant, id: u64, knocker: &str) -> Option<[u8; 16]> {
        self.expire(now);
        let at = self.issued.iter().position(|t| t.id == id)?;
        let ticket = self.issued.remove(at)?;
        (ticket.knocker.to_string() == knocker).then_some(ticket.secret)
    }

    /// Tickets outstanding.
    pub fn len(&self) -> usize {
        self.issued.len()
    }

    /// Whether none is outstanding.
    pub fn is_empty(&self) -> bool {
        self.issued.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        while self
            .issued
            .front()
            .is_some_and(|t| now.saturating_duration_since(t.issued) >= self.ttl)
        {
            self.issued.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn a_ticket_is_redeemed_once_and_only_by_its_knocker() {
        let now = Instant::now();
        let mut sut = Tickets::default();
        sut.issue(now, addr(5000), 1, [1; 16]);
        sut.issue(now, addr(5001), 2, [2; 16]);
        assert_eq!(
            sut.redeem(now, 1, "127.0.0.1:5001"),
            None,
            "another knocker"
        );
        assert_eq!(
            sut.redeem(now, 1, "127.0.0.1:5000"),
            None,
            "a refused try spends it"
        );
        assert_eq!(sut.redeem(now, 2, "127.0.0.1:5001"), Some([2; 16]));
        assert_eq!(sut.redeem(now, 2, "127.0.0.1:5001"), None, "single use");
    }

    #[test]
    fn a_ticket_expires_after_its_time() {
        let now = Instant::now();
        let mut sut = Tickets::new(8, Duration::from_secs(10));
        sut.issue(now, addr(5000), 1, [1; 16]);
        let later = now + Duration::from_secs(10);
        assert_eq!(sut.redeem(later, 1, "127.0.0.1:5000"), None);
        assert!(sut.is_empty());
    }

    #[test]
    fn a_flood_of_knocks_evicts_the_oldest_tickets() {
        let now = Instant::now();
        let mut sut = Tickets::new(3, Duration::from_secs(10));
        for id in 1..=5 {
            sut.issue(now, addr(5000), id, [0; 16]);
        }
        assert_eq!(sut.len(), 3);
        assert_eq!(sut.redeem(now, 1, "127.0.0.1:5000"), None);
        assert_eq!(sut.redeem(now, 5, "127.0.0.1:5000"), Some([0; 16]));
    }
}
