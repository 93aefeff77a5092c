//! What a driver does with a PTR1 session, whichever its role: lend it memory to read into,
//! report what was read, take what it wants written, report what was written, and let its
//! deadlines pass. The events a session asks its node to act on differ by role and stay on
//! the sessions themselves.

use std::io;
use std::time::Instant;

use crate::session::{ClientSession, ReadBuf, ServerSession, Transmit};

/// The byte-moving side of a server or client session, for drivers that move the bytes of
/// both the same way.
pub trait DrivenSession {
    /// Memory for the next read, if one is wanted now.
    fn poll_read(&mut self) -> Option<ReadBuf>;
    /// A read finished: `Ok(n)` bytes arrived in `buf` (0: the peer finished), or it failed.
    fn handle_read(&mut self, buf: ReadBuf, result: io::Result<usize>, now: Instant);
    /// The bytes to write next, if any.
    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit>;
    /// `n` more bytes of the transmit were written.
    fn handle_written(&mut self, n: usize, now: Instant);
    /// Writing failed.
    fn handle_write_error(&mut self, error: io::Error, now: Instant);
    /// The earliest deadline.
    fn poll_timeout(&self) -> Option<Instant>;
    /// A deadline passed.
    fn handle_timeout(&mut self, now: Instant);
}

impl DrivenSession for ServerSession {
    fn poll_read(&mut self) -> Option<ReadBuf> {
        Self::poll_read(self)
    }
    fn handle_read(&mut self, buf: ReadBuf, result: io::Result<usize>, now: Instant) {
        Self::handle_read(self, buf, result, now);
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        Self::poll_transmit(self, now)
    }
    fn handle_written(&mut self, n: usize, now: Instant) {
        Self::handle_written(self, n, now);
    }
    fn handle_write_error(&mut self, error: io::Error, _now: Instant) {
        Self::handle_write_error(self, error);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Self::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Self::handle_timeout(self, now);
    }
}

impl DrivenSession for ClientSession {
    fn poll_read(&mut self) -> Option<ReadBuf> {
        Self::poll_read(self)
    }
    fn handle_read(&mut self, buf: ReadBuf, result: io::Result<usize>, now: Instant) {
        Self::handle_read(self, buf, result, now);
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        Self::poll_transmit(self, now)
    }
    fn handle_written(&mut self, n: usize, now: Instant) {
        Self::handle_written(self, n, now);
    }
    fn handle_write_error(&mut self, error: io::Error, now: Instant) {
        Self::handle_write_error(self, error, now);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Self::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Self::handle_timeout(self, now);
    }
}
