//! Process-wide transport counters with the keys other PTR1/PTM1 implementations report.
//!
//! Counters are relaxed atomics: cheap to bump on every frame, read together as one
//! [`Snapshot`] (each value is exact; values read together may be a few frames apart).

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

/// The counters of this process; every transport in it records here.
pub fn global() -> &'static TransportStats {
    static GLOBAL: TransportStats = TransportStats::new();
    &GLOBAL
}

/// Which payload path the process used last.
///
/// Not a per-message label: concurrent traffic on different paths makes it change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CopyModel {
    /// No tensor frame has been sent yet.
    Unused,
    /// PTR1 over TCP: one copy into the kernel, one out into the final receive memory.
    DirectTcp,
    /// PTM1 over HTTP/2 (with or without TLS).
    PackedHttp2Compatibility,
    /// Same-host shared memory.
    SharedMemory,
}

impl CopyModel {
    /// The value reported under `active_copy_model`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unused => "unused",
            Self::DirectTcp => "direct_tcp",
            Self::PackedHttp2Compatibility => "packed_http2_compatibility",
            Self::SharedMemory => "shared_memory",
        }
    }

    const fn from_u8(value: u8) -> Self {
        match value {
            1 => Self::DirectTcp,
            2 => Self::PackedHttp2Compatibility,
            3 => Self::SharedMemory,
            _ => Self::Unused,
        }
    }

    const fn to_u8(self) -> u8 {
        match self {
            Self::Unused => 0,
            Self::DirectTcp => 1,
            Self::PackedHttp2Compatibility => 2,
            Self::SharedMemory => 3,
        }
    }
}

impl fmt::Display for CopyModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of transport counters (see [`global`]).
#[derive(Debug)]
pub struct TransportStats {
    raw_frames_sent: AtomicU64,
    raw_frames_received: AtomicU64,
    raw_bytes_sent: AtomicU64,
    raw_bytes_received: AtomicU64,
    http2_fallback_frames: AtomicU64,
    http2_fallback_bytes: AtomicU64,
    raw_connections_accepted: AtomicU64,
    shm_messages_sent: AtomicU64,
    shm_bytes_sent: AtomicU64,
    shm_bytes_copied: AtomicU64,
    shm_zero_copy_buffers: AtomicU64,
    shm_fd_failures: AtomicU64,
    shm_credit_waits: AtomicU64,
    shm_credit_fallbacks: AtomicU64,
    shm_credit_refusals: AtomicU64,
    shm_copy_thread_copies: AtomicU64,
    shm_spin_micros: AtomicU64,
    shm_doorbells: AtomicU64,
    shm_peers_refused: AtomicU64,
    stripes_sent: AtomicU64,
    stripes_received: AtomicU64,
    striped_requests_sent: AtomicU64,
    striped_requests_received: AtomicU64,
    active_copy_model: AtomicU8,
}

impl TransportStats {
    /// All counters zero, copy model `unused`.
    pub const fn new() -> Self {
        Self {
            raw_frames_sent: AtomicU64::new(0),
            raw_frames_received: AtomicU64::new(0),
            raw_bytes_sent: AtomicU64::new(0),
            raw_bytes_received: AtomicU64::new(0),
            http2_fallback_frames: AtomicU64::new(0),
            http2_fallback_bytes: AtomicU64::new(0),
            raw_connections_accepted: AtomicU64::new(0),
            shm_messages_sent: AtomicU64::new(0),
            shm_bytes_sent: AtomicU64::new(0),
            shm_bytes_copied: AtomicU64::new(0),
            shm_zero_copy_buffers: AtomicU64::new(0),
            shm_fd_failures: AtomicU64::new(0),
            shm_credit_waits: AtomicU64::new(0),
            shm_credit_fallbacks: AtomicU64::new(0),
            shm_credit_refusals: AtomicU64::new(0),
            shm_copy_thread_copies: AtomicU64::new(0),
            shm_spin_micros: AtomicU64::new(0),
            shm_doorbells: AtomicU64::new(0),
            shm_peers_refused: AtomicU64::new(0),
            stripes_sent: AtomicU64::new(0),
            stripes_received: AtomicU64::new(0),
            striped_requests_sent: AtomicU64::new(0),
            striped_requests_received: AtomicU64::new(0),
            active_copy_model: AtomicU8::new(0),
        }
    }

    /// A PTR1 frame of `wire_bytes` (head included) was completely written; sets the copy model
    /// to `direct_tcp`.
    pub fn record_raw_frame_sent(&self, wire_bytes: u64) {
        self.record_raw_frames_sent(1, wire_bytes);
    }

    /// `frames` PTR1 frames of `wire_bytes` together were completely written.
    pub fn record_raw_frames_sent(&self, frames: u64, wire_bytes: u64) {
        self.raw_frames_sent.fetch_add(frames, Relaxed);
        self.raw_bytes_sent.fetch_add(wire_bytes, Relaxed);
        self.set_active_copy_model(CopyModel::DirectTcp);
    }

    /// A PTR1 frame of `wire_bytes` was completely read.
    pub fn record_raw_frame_received(&self, wire_bytes: u64) {
        self.raw_frames_received.fetch_add(1, Relaxed);
        self.raw_bytes_received.fetch_add(wire_bytes, Relaxed);
    }

    /// A tensor request of `body_bytes` was sent over HTTP/2 (client side only); sets the copy
    /// model to `packed_http2_compatibility`.
    pub fn record_http2_fallback(&self, body_bytes: u64) {
        self.http2_fallback_frames.fetch_add(1, Relaxed);
        self.http2_fallback_bytes.fetch_add(body_bytes, Relaxed);
        self.set_active_copy_model(CopyModel::PackedHttp2Compatibility);
    }

    /// A server accepted a connection that opened with PTR1.
    pub fn record_raw_connection_accepted(&self) {
        self.raw_connections_accepted.fetch_add(1, Relaxed);
    }

    /// A message of `payload_bytes` went over shared memory, `copied_bytes` of them copied
    /// into a slot and `zero_copy_buffers` buffers sent where they were (loaned slots); sets
    /// the copy model to `shared_memory`.
    pub fn record_shm_sent(&self, payload_bytes: u64, copied_bytes: u64, zero_copy_buffers: u64) {
        self.shm_messages_sent.fetch_add(1, Relaxed);
        self.shm_bytes_sent.fetch_add(payload_bytes, Relaxed);
        self.shm_bytes_copied.fetch_add(copied_bytes, Relaxed);
        self.shm_zero_copy_buffers
            .fetch_add(zero_copy_buffers, Relaxed);
        self.set_active_copy_model(CopyModel::SharedMemory);
    }

    /// Descriptors passed with a shared-memory message were lost (the receiver was at its
    /// descriptor limit) or refused (missing seals, wrong size).
    pub fn record_shm_fd_failure(&self) {
        self.shm_fd_failures.fetch_add(1, Relaxed);
    }

    /// A same-host send or reply was handed to the copy thread (a large copy, or one that
    /// waits for credit) instead of being copied on the thread that sent it.
    pub fn record_shm_copy_thread_copy(&self) {
        self.shm_copy_thread_copies.fetch_add(1, Relaxed);
    }

    /// A same-host send found every slot held by receivers and waited for one to come back.
    pub fn record_shm_credit_wait(&self) {
        self.shm_credit_waits.fetch_add(1, Relaxed);
    }

    /// No credit came back in time and the send went over the remote path instead.
    pub fn record_shm_credit_fallback(&self) {
        self.shm_credit_fallbacks.fetch_add(1, Relaxed);
    }

    /// No credit came back in time and the send failed (the node refuses rather than falls
    /// back).
    pub fn record_shm_credit_refusal(&self) {
        self.shm_credit_refusals.fetch_add(1, Relaxed);
    }

    /// A thread waiting for same-host messages spun `micros` without finding any (the CPU
    /// its spin window cost).
    pub fn record_shm_spin(&self, micros: u64) {
        self.shm_spin_micros.fetch_add(micros, Relaxed);
    }

    /// A same-host peer was rung (a `Bell` sent on the socket: it was about to sleep).
    pub fn record_shm_doorbell(&self) {
        self.shm_doorbells.fetch_add(1, Relaxed);
    }

    /// A same-host peer was refused something by a bound (a connection, a hello slot, a
    /// mapping) or disconnected for passing one.
    pub fn record_shm_peer_refused(&self) {
        self.shm_peers_refused.fetch_add(1, Relaxed);
    }

    /// A striped request went out as `stripes` stripes (each acknowledged) and its request.
    pub fn record_striped_request_sent(&self, stripes: u64) {
        self.striped_requests_sent.fetch_add(1, Relaxed);
        self.stripes_sent.fetch_add(stripes, Relaxed);
    }

    /// A stripe was received into its parts.
    pub fn record_stripe_received(&self) {
        self.stripes_received.fetch_add(1, Relaxed);
    }

    /// A striped request was put together from its stripes and delivered.
    pub fn record_striped_request_received(&self) {
        self.striped_requests_received.fetch_add(1, Relaxed);
    }

    /// Records the path used last.
    pub fn set_active_copy_model(&self, model: CopyModel) {
        self.active_copy_model.store(model.to_u8(), Relaxed);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            raw_frames_sent: self.raw_frames_sent.load(Relaxed),
            raw_frames_received: self.raw_frames_received.load(Relaxed),
            raw_bytes_sent: self.raw_bytes_sent.load(Relaxed),
            raw_bytes_received: self.raw_bytes_received.load(Relaxed),
            http2_fallback_frames: self.http2_fallback_frames.load(Relaxed),
            http2_fallback_bytes: self.http2_fallback_bytes.load(Relaxed),
            raw_connections_accepted: self.raw_connections_accepted.load(Relaxed),
            shm_messages_sent: self.shm_messages_sent.load(Relaxed),
            shm_bytes_sent: self.shm_bytes_sent.load(Relaxed),
            shm_bytes_copied: self.shm_bytes_copied.load(Relaxed),
            shm_zero_copy_buffers: self.shm_zero_copy_buffers.load(Relaxed),
            shm_fd_failures: self.shm_fd_failures.load(Relaxed),
            shm_credit_waits: self.shm_credit_waits.load(Relaxed),
            shm_credit_fallbacks: self.shm_credit_fallbacks.load(Relaxed),
            shm_credit_refusals: self.shm_credit_refusals.load(Relaxed),
            shm_copy_thread_copies: self.shm_copy_thread_copies.load(Relaxed),
            shm_spin_micros: self.shm_spin_micros.load(Relaxed),
            shm_doorbells: self.shm_doorbells.load(Relaxed),
            shm_peers_refused: self.shm_peers_refused.load(Relaxed),
            stripes_sent: self.stripes_sent.load(Relaxed),
            stripes_received: self.stripes_received.load(Relaxed),
            striped_requests_sent: self.striped_requests_sent.load(Relaxed),
            striped_requests_received: self.striped_requests_received.load(Relaxed),
            active_copy_model: CopyModel::from_u8(self.active_copy_model.load(Relaxed)),
        }
    }
}

impl Default for TransportStats {
    fn default() -> Self {
        Self::new()
    }
}

/// The counters at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// PTR1 frames written, client and server together.
    pub raw_frames_sent: u64,
    /// PTR1 frames read.
    pub raw_frames_received: u64,
    /// PTR1 bytes written, heads included.
    pub raw_bytes_sent: u64,
    /// PTR1 bytes read, heads included.
    pub raw_bytes_received: u64,
    /// Tensor requests sent over HTTP/2.
    pub http2_fallback_frames: u64,
    /// PTM1 bytes in those requests.
    pub http2_fallback_bytes: u64,
    /// Connections a server accepted as PTR1.
    pub raw_connections_accepted: u64,
    /// Messages sent over shared memory.
    pub shm_messages_sent: u64,
    /// Payload bytes in them.
    pub shm_bytes_sent: u64,
    /// Of those, bytes copied into a slot (the rest travelled in loaned slots).
    pub shm_bytes_copied: u64,
    /// Buffers sent where they were, without a copy.
    pub shm_zero_copy_buffers: u64,
    /// Passed descriptors lost or refused.
    pub shm_fd_failures: u64,
    /// Same-host sends that found the shared memory all held and waited for credit.
    pub shm_credit_waits: u64,
    /// Of those, sends that went over the remote path after waiting.
    pub shm_credit_fallbacks: u64,
    /// Of those, sends that failed after waiting.
    pub shm_credit_refusals: u64,
    /// Same-host sends and replies copied on the copy thread rather than on the thread that
    /// sent them (copies over 64 KiB, and those that wait for credit).
    pub shm_copy_thread_copies: u64,
    /// Microseconds threads spun waiting for same-host messages without finding any.
    pub shm_spin_micros: u64,
    /// Bells sent to wake a sleeping same-host peer (one system call each).
    pub shm_doorbells: u64,
    /// Same-host peers refused by a bound, or disconnected for passing one.
    pub shm_peers_refused: u64,
    /// Stripes sent (of striped requests; each acknowledged by the receiver).
    pub stripes_sent: u64,
    /// Stripes received.
    pub stripes_received: u64,
    /// Striped requests sent after their stripes.
    pub striped_requests_sent: u64,
    /// Striped requests put together from their stripes and delivered.
    pub striped_requests_received: u64,
    /// The path used last.
    pub active_copy_model: CopyModel,
}

impl Snapshot {
    /// The numeric counters under their report keys, in a fixed order
    /// (`active_copy_model` is separate: it is text).
    pub fn counters(&self) -> [(&'static str, u64); 23] {
        [
            ("raw_frames_sent", self.raw_frames_sent),
            ("raw_frames_received", self.raw_frames_received),
            ("raw_bytes_sent", self.raw_bytes_sent),
            ("raw_bytes_received", self.raw_bytes_received),
            ("http2_fallback_frames", self.http2_fallback_frames),
            ("http2_fallback_bytes", self.http2_fallback_bytes),
            ("raw_connections_accepted", self.raw_connections_accepted),
            ("shm_messages_sent", self.shm_messages_sent),
            ("shm_bytes_sent", self.shm_bytes_sent),
            ("shm_bytes_copied", self.shm_bytes_copied),
            ("shm_zero_copy_buffers", self.shm_zero_copy_buffers),
            ("shm_fd_failures", self.shm_fd_failures),
            ("shm_credit_waits", self.shm_credit_waits),
            ("shm_credit_fallbacks", self.shm_credit_fallbacks),
            ("shm_credit_refusals", self.shm_credit_refusals),
            ("shm_copy_thread_copies", self.shm_copy_thread_copies),
            ("shm_spin_micros", self.shm_spin_micros),
            ("shm_doorbells", self.shm_doorbells),
            ("shm_peers_refused", self.shm_peers_refused),
            ("stripes_sent", self.stripes_sent),
            ("stripes_received", self.stripes_received),
            ("striped_requests_sent", self.striped_requests_sent),
            ("striped_requests_received", self.striped_requests_received),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_counters_are_zero_and_model_is_unused() {
        let sut = TransportStats::new().snapshot();
        assert!(sut.counters().iter().all(|(_, value)| *value == 0));
        assert_eq!(sut.active_copy_model.as_str(), "unused");
    }

    #[test]
    fn raw_and_http2_records_update_their_counters_and_the_model() {
        let sut = TransportStats::new();
        sut.record_raw_frame_sent(100);
        sut.record_raw_frame_sent(28);
        sut.record_raw_frame_received(40);
        sut.record_raw_connection_accepted();
        assert_eq!(sut.snapshot().active_copy_model, CopyModel::DirectTcp);
        sut.record_http2_fallback(64);
        let snap = sut.snapshot();
        assert_eq!(
            snap.counters(),
            [
                ("raw_frames_sent", 2),
                ("raw_frames_received", 1),
                ("raw_bytes_sent", 128),
                ("raw_bytes_received", 40),
                ("http2_fallback_frames", 1),
                ("http2_fallback_bytes", 64),
                ("raw_connections_accepted", 1),
                ("shm_messages_sent", 0),
                ("shm_bytes_sent", 0),
                ("shm_bytes_copied", 0),
                ("shm_zero_copy_buffers", 0),
                ("shm_fd_failures", 0),
                ("shm_credit_waits", 0),
                ("shm_credit_fallbacks", 0),
                ("shm_credit_refusals", 0),
                ("shm_copy_thread_copies", 0),
                ("shm_spin_micros", 0),
                ("shm_doorbells", 0),
                ("shm_peers_refused", 0),
                ("stripes_sent", 0),
                ("stripes_received", 0),
                ("striped_requests_sent", 0),
                ("striped_requests_received", 0),
            ]
        );
        assert_eq!(
            snap.active_copy_model.as_str(),
            "packed_http2_compatibility"
        );
        sut.set_active_copy_model(CopyModel::SharedMemory);
        assert_eq!(
            sut.snapshot().active_copy_model.to_string(),
            "shared_memory"
        );
    }

    #[test]
    fn counters_from_many_threads_are_not_lost() {
        let sut = TransportStats::new();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| (0..10_000).for_each(|_| sut.record_raw_frame_received(3)));
            }
        });
        let snap = sut.snapshot();
        assert_eq!(
            (snap.raw_frames_received, snap.raw_bytes_received),
            (40_000, 120_000)
        );
    }
}
