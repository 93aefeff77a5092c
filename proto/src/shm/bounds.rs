//! What each same-host peer *process* may hold of a node, and what all of them together may:
//! connections, connections still waiting for their hello, the peer segments mapped here
//! (each mapping is a kernel object counted against `vm.max_map_count`, and its bytes are
//! address space a forged size could otherwise claim), and the bytes of this node's own
//! slots lent to it and not yet released (held views keep a slot from being reused, so a
//! process that never releases would otherwise take the node's whole quota). A local process of the same user is
//! untrusted like a network peer: it gets nothing it did not pay for, and one such process
//! cannot use up what the others need.
//!
//! The book only counts; the driver asks before it takes, and says when it gives back.

use std::collections::HashMap;

/// The bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerBounds {
    /// Verified connections one peer process may have.
    pub connections_per_process: usize,
    /// Verified connections in all.
    pub connections: usize,
    /// Accepted connections one peer process may have waiting for their hello.
    pub greetings_per_process: usize,
    /// Accepted connections waiting for their hello, in all (past it the oldest is dropped).
    pub greetings: usize,
    /// Segments of one peer process mapped here at once.
    pub segments_per_process: usize,
    /// Bytes of one peer process's segments mapped here at once.
    pub mapped_bytes_per_process: u64,
    /// Peer segments mapped here at once, in all.
    pub segments: usize,
    /// Bytes of this node's slots one peer process may hold (lent, not yet released) before
    /// a further copy for it is refused (a request goes over the remote path, a reply is an
    /// error) until it releases. `u64::MAX` (the default) stands for half the node's
    /// shared-memory quota; any other value is taken as it is (the quota, or more, for no
    /// bound of its own).
    pub held_bytes_per_process: u64,
}

impl Default for PeerBounds {
    fn default() -> Self {
        Self {
            connections_per_process: 64,
            connections: 1024,
            greetings_per_process: 16,
            greetings: 256,
            segments_per_process: 1024,
            mapped_bytes_per_process: 256 << 30,
            segments: 16 << 10,
            held_bytes_per_process: u64::MAX,
        }
    }
}

impl PeerBounds {
    /// The defaults, with the totals fitted to what this process may open and map:
    /// `open_files` (`RLIMIT_NOFILE`; a connection holds about four descriptors, and a quarter
    /// of them stays for everything else) and `max_map_count` (`vm.max_map_count`; a quarter of
    /// it for peers' segments).
    pub fn fitted(open_files: u64, max_map_count: u64) -> Self {
        let base = Self::default();
        let connections = usize::try_from(open_files / 4 * 3 / 4).unwrap_or(usize::MAX);
        let segments = usize::try_from(max_map_count / 4).unwrap_or(usize::MAX);
        Self {
            connections: base.connections.min(connections).max(4),
            connections_per_process: base.connections_per_process.min(connections).max(2),
            segments: base.segments.min(segments).max(64),
            segments_per_process: base.segments_per_process.min(segments).max(16),
            ..base
        }
    }

    /// Whether process `pid`, which holds `held` bytes of this node's slots, may be lent a
    /// slot of `len` bytes more. A process that holds nothing may always be lent one slot,
    /// however large (a message larger than the bound still goes).
    ///
    /// # Errors
    ///
    /// [`OverBound::HeldOfProcess`] if that would pass
    /// [`PeerBounds::held_bytes_per_process`].
    pub fn may_hold(&self, pid: u32, held: u64, len: u64) -> Result<(), OverBound> {
        if held == 0 || held.saturating_add(len) <= self.held_bytes_per_process {
            return Ok(());
        }
        Err(OverBound::HeldOfProcess {
            pid,
            held,
            len,
            max: self.held_bytes_per_process,
        })
    }
}

/// Which bound a peer ran into.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OverBound {
    /// Too many connections from one process.
    #[error(
        "process {pid} already has {count} shared-memory connections to this node (at most {max})"
    )]
    ConnectionsOfProcess {
        /// The peer process.
        pid: u32,
        /// What it has.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// Too many connections in all.
    #[error("this node already has {max} shared-memory connections (its bound)")]
    Connections {
        /// The bound.
        max: usize,
    },
    /// Too many connections of one process waiting for their hello.
    #[error("process {pid} already has {max} shared-memory connections waiting for their hello")]
    GreetingsOfProcess {
        /// The peer process.
        pid: u32,
        /// The bound.
        max: usize,
    },
    /// Too many segments of one process mapped.
    #[error(
        "process {pid} already has {count} segments ({bytes} bytes) mapped here; one more of {len} \
         bytes would pass its bound ({max_segments} segments, {max_bytes} bytes)"
    )]
    SegmentsOfProcess {
        /// The peer process.
        pid: u32,
        /// Segments it has mapped here.
        count: usize,
        /// Their bytes.
        bytes: u64,
        /// The new segment's bytes.
        len: u64,
        /// The bound on segments.
        max_segments: usize,
        /// The bound on bytes.
        max_bytes: u64,
    },
    /// Too many peer segments mapped in all.
    #[error("this node already maps {max} segments of its peers (its bound)")]
    Segments {
        /// The bound.
        max: usize,
    },
    /// One process holds too much of this node's memory.
    #[error(
        "process {pid} holds {held} bytes of this node's shared memory it has not released \
         (or that copies under way for it will fill); {len} more would pass its bound ({max} \
         bytes)"
    )]
    HeldOfProcess {
        /// The peer process.
        pid: u32,
        /// Bytes of this node's slots it holds, and of those copies for it under way were
        /// promised.
        held: u64,
        /// The new slot's bytes.
        len: u64,
        /// The bound.
        max: u64,
    },
}

/// What every peer process holds now.
#[derive(Debug, Default)]
pub struct PeerBook {
    bounds: PeerBounds,
    by_process: HashMap<u32, Held>,
    connections: usize,
    greetings: usize,
    segments: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Held {
    connections: usize,
    greetings: usize,
    segments: usize,
    mapped_bytes: u64,
}

/// Whether a new greeting may wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Greeting {
    /// Yes.
    Admitted,
    /// Yes, but the oldest greeting of another process must be dropped first (all greetings
    /// are taken): the driver drops it and calls [`PeerBook::greeting_ended`] for it.
    AdmittedDropOldest,
    /// No.
    Refused(OverBound),
}

impl PeerBook {
    /// A book with these bounds.
    pub fn new(bounds: PeerBounds) -> Self {
        Self {
            bounds,
            ..Self::default()
        }
    }

    /// The bounds.
    pub fn bounds(&self) -> PeerBounds {
        self.bounds
    }

    /// Process `pid` connected and has yet to say hello.
    pub fn greeting(&mut self, pid: u32) -> Greeting {
        let held = self.by_process.entry(pid).or_default();
        if held.greetings >= self.bounds.greetings_per_process {
            let max = self.bounds.greetings_per_process;
            self.prune(pid);
            return Greeting::Refused(OverBound::GreetingsOfProcess { pid, max });
        }
        held.greetings += 1;
        self.greetings += 1;
        if self.greetings > self.bounds.greetings {
            // The caller drops the oldest one and reports it ended.
            return Greeting::AdmittedDropOldest;
        }
        Greeting::Admitted
    }

    /// A greeting of `pid` ended (said hello, timed out, or was dropped).
    pub fn greeting_ended(&mut self, pid: u32) {
        if let Some(held) = self.by_process.get_mut(&pid)
            && held.greetings > 0
        {
            held.greetings -= 1;
            self.greetings = self.greetings.saturating_sub(1);
        }
        self.prune(pid);
    }

    /// Process `pid` would open a verified connection.
    ///
    /// # Errors
    ///
    /// [`OverBound`] naming the bound it would pass.
    pub fn connection(&mut self, pid: u32) -> Result<(), OverBound> {
        if self.connections >= self.bounds.connections {
            return Err(OverBound::Connections {
                max: self.bounds.connections,
            });
        }
        let held = self.by_process.entry(pid).or_default();
        if held.connections >= self.bounds.connections_per_process {
            let count = held.connections;
            return Err(OverBound::ConnectionsOfProcess {
                pid,
                count,
                max: self.bounds.connections_per_process,
            });
        }
        held.connections += 1;
        self.connections += 1;
        Ok(())
    }

    /// A verified connection of `pid` closed.
    pub fn connection_closed(&mut self, pid: u32) {
        if let Some(held) = self.by_process.get_mut(&pid)
            && held.connections > 0
        {
            held.connections -= 1;
            self.connections = self.connections.saturating_sub(1);
        }
        self.prune(pid);
    }

    /// A segment of `len` bytes of process `pid` would be mapped.
    ///
    /// # Errors
    ///
    /// [`OverBound`] naming the bound it would pass.
    pub fn mapping(&mut self, pid: u32, len: u64) -> Result<(), OverBound> {
        if self.segments >= self.bounds.segments {
            return Err(OverBound::Segments {
                max: self.bounds.segments,
            });
        }
        let bounds = self.bounds;
        let held = self.by_process.entry(pid).or_default();
        if held.segments >= bounds.segments_per_process
            || held.mapped_bytes.saturating_add(len) > bounds.mapped_bytes_per_process
        {
            let (count, bytes) = (held.segments, held.mapped_bytes);
            self.prune(pid);
            return Err(OverBound::SegmentsOfProcess {
                pid,
                count,
                bytes,
                len,
                max_segments: bounds.segments_per_process,
                max_bytes: bounds.mapped_bytes_per_process,
            });
        }
        held.segments += 1;
        held.mapped_bytes += len;
        self.segments += 1;
        Ok(())
    }

    /// A segment of `len` bytes of `pid` was unmapped.
    pub fn unmapped(&mut self, pid: u32, len: u64) {
        if let Some(held) = self.by_process.get_mut(&pid)
            && held.segments > 0
        {
            held.segments -= 1;
            held.mapped_bytes = held.mapped_bytes.saturating_sub(len);
            self.segments = self.segments.saturating_sub(1);
        }
        self.prune(pid);
    }

    /// Verified connections in all.
    pub fn connections(&self) -> usize {
        self.connections
    }

    /// Peer segments mapped here in all.
    pub fn segments(&self) -> usize {
        self.segments
    }

    fn prune(&mut self, pid: u32) {
        if self.by_process.get(&pid) == Some(&Held::default()) {
            self.by_process.remove(&pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> PeerBounds {
        PeerBounds {
            connections_per_process: 2,
            connections: 3,
            greetings_per_process: 2,
            greetings: 3,
            segments_per_process: 2,
            mapped_bytes_per_process: 100,
            segments: 3,
            held_bytes_per_process: 100,
        }
    }

    #[test]
    fn one_process_cannot_take_every_connection() {
        let mut sut = PeerBook::new(small());
        assert_eq!(sut.connection(1), Ok(()));
        assert_eq!(sut.connection(1), Ok(()));
        assert!(matches!(
            sut.connection(1),
            Err(OverBound::ConnectionsOfProcess { pid: 1, .. })
        ));
        assert_eq!(sut.connection(2), Ok(()), "another process still gets in");
        assert_eq!(sut.connection(3), Err(OverBound::Connections { max: 3 }));
        sut.connection_closed(1);
        assert_eq!(
            sut.connection(3),
            Ok(()),
            "a closed connection gives its place back"
        );
    }

    #[test]
    fn a_process_that_never_says_hello_cannot_shut_others_out() {
        let mut sut = PeerBook::new(small());
        assert_eq!(sut.greeting(1), Greeting::Admitted);
        assert_eq!(sut.greeting(1), Greeting::Admitted);
        assert!(
            matches!(sut.greeting(1), Greeting::Refused(_)),
            "per process"
        );
        assert_eq!(sut.greeting(2), Greeting::Admitted);
        assert_eq!(
            sut.greeting(3),
            Greeting::AdmittedDropOldest,
            "all taken: the oldest goes, the newcomer waits"
        );
        sut.greeting_ended(1); // the driver dropped the oldest, of process 1
        sut.greeting_ended(2); // process 2 said hello
        assert_eq!(
            sut.greeting(1),
            Greeting::Admitted,
            "process 1 has one place again"
        );
        assert_eq!(sut.greeting(4), Greeting::AdmittedDropOldest);
    }

    #[test]
    fn mapped_segments_are_bounded_per_process_by_count_and_bytes_and_in_all() {
        let mut sut = PeerBook::new(small());
        assert_eq!(sut.mapping(1, 60), Ok(()));
        assert!(
            matches!(sut.mapping(1, 41), Err(OverBound::SegmentsOfProcess { .. })),
            "bytes"
        );
        assert_eq!(sut.mapping(1, 40), Ok(()));
        assert!(
            matches!(sut.mapping(1, 1), Err(OverBound::SegmentsOfProcess { .. })),
            "count"
        );
        assert_eq!(sut.mapping(2, 1), Ok(()));
        assert_eq!(sut.mapping(3, 1), Err(OverBound::Segments { max: 3 }));
        sut.unmapped(1, 60);
        assert_eq!(sut.segments(), 2);
        assert_eq!(sut.mapping(3, 1), Ok(()));
    }

    #[test]
    fn fitted_bounds_leave_room_for_everything_else() {
        let fitted = PeerBounds::fitted(1024, 65530);
        assert_eq!(
            fitted.connections, 192,
            "1024 descriptors: a quarter kept, four each"
        );
        assert_eq!(fitted.segments, 16_382);
        let tiny = PeerBounds::fitted(8, 100);
        assert!(tiny.connections >= 4 && tiny.segments >= 64);
    }

    #[test]
    fn a_process_is_lent_up_to_its_bound_on_held_bytes_and_told_what_it_holds() {
        let bounds = PeerBounds {
            held_bytes_per_process: 100,
            ..PeerBounds::default()
        };
        assert_eq!(bounds.may_hold(7, 60, 40), Ok(()), "up to the bound");
        assert_eq!(bounds.may_hold(7, 0, 1000), Ok(()), "one slot past it");
        assert!(bounds.may_hold(7, 1, 100).is_err());
        let over = bounds.may_hold(7, 61, 40).unwrap_err();
        assert_eq!(
            over,
            OverBound::HeldOfProcess {
                pid: 7,
                held: 61,
                len: 40,
                max: 100
            }
        );
        assert!(
            over.to_string().contains("process 7 holds 61 bytes"),
            "{over}"
        );
        assert_eq!(
            bounds.may_hold(7, u64::MAX, 1).map_err(|_| ()),
            Err(()),
            "no overflow"
        );
        assert_eq!(PeerBounds::default().may_hold(7, u64::MAX - 1, 1), Ok(()));
    }
}
