//! How a connection receives: the session says where the next bytes go, the connection picks
//! how the kernel should fill it (`MSG_WAITALL`, a low-water mark, or whatever is there) from
//! the size of what is left and whether the path lost segments lately.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use tensorwire_proto::session::ReadBuf;

use crate::sys;
use crate::uring::conn::Conn;
use crate::uring::op::{RecvMode, RecvMsg};

impl Conn {
    /// The receive the connection wants next, if its session wants bytes and none is in
    /// flight. `poll_first`: the kernel can wait for readiness before a receive's first try
    /// (what makes a low-water mark worth setting).
    pub(crate) fn next_recv(&mut self, poll_first: bool) -> Option<RecvMsg> {
        if self.recv_op.is_some() {
            return None;
        }
        let buf = self.session().poll_read()?;
        let (mut mode, mut mark) = recv_mode(&buf, poll_first);
        if mode == RecvMode::LowWater && lossy(self) {
            (mode, mark) = (RecvMode::Any, 1);
        }
        if mark != self.low_water && sys::set_receive_low_water(self.fd.as_raw_fd(), mark).is_ok() {
            self.low_water = mark;
        }
        let mode = if mode == RecvMode::LowWater && self.low_water != mark {
            RecvMode::Any // the mark could not be set: take what comes
        } else {
            mode
        };
        Some(RecvMsg::new(Arc::clone(&self.fd), buf, mode))
    }
}

/// Bodies with less than this left are received in one `MSG_WAITALL` step, without a mark.
const LOW_WATER_MIN: u64 = 128 << 10;
/// The largest low-water mark: bounds how much arrives between two wake-ups.
const LOW_WATER_MAX: u64 = 1 << 20;

/// Receive steps after a loss that take what comes instead of waiting for a mark.
const MARKS_OFF_AFTER_LOSS: u32 = 64;

/// Whether the connection saw a loss lately (a segment arrived out of order since the last
/// look, or within the last [`MARKS_OFF_AFTER_LOSS`] steps): then waiting for a low-water
/// mark holds back the bytes that are in while the retransmission is awaited, and costs a
/// third of the rate (measured across the test bed with 0.1 % of frames lost, 64 MiB one-way:
/// 0.20 GB/s with marks against 0.30 without, where without loss marks win 2.2 against 1.7).
fn lossy(conn: &mut Conn) -> bool {
    if let Ok(seen) = sys::received_out_of_order(conn.fd.as_raw_fd()) {
        if seen != conn.out_of_order {
            conn.out_of_order = seen;
            conn.marks_off = MARKS_OFF_AFTER_LOSS;
        }
    }
    if conn.marks_off == 0 {
        return false;
    }
    conn.marks_off -= 1;
    true
}

/// How to receive into `buf`, and the low-water mark that goes with it.
///
/// A window of payload no larger than the progress quantum is one `MSG_WAITALL` receive: the
/// kernel fills it as segments arrive and completes once (the quantum bounds how long a slow
/// but honest peer can go unseen). A larger window of a large body is received in a few big
/// steps instead of one wake-up per arriving segment: each step waits until half of what is
/// still to come (at most 1 MiB, at most the quantum) is queued, then takes everything there.
/// Heads are read as they come.
///
/// Measured with `ptr1-bench` one-way to the fixture (server CPU per message, same run): at
/// 1 MiB, `MSG_WAITALL` windows 183 µs against 219 µs with a mark; at 64 and 256 MiB the marks
/// win (15.6 against 19.1 ms, 59 against 78 ms).
fn recv_mode(buf: &ReadBuf, poll_first: bool) -> (RecvMode, usize) {
    if !buf.is_payload() {
        return (RecvMode::Any, 1);
    }
    let remaining = buf.frame_remaining();
    let capacity = buf.capacity();
    let quantum = buf.progress_quantum();
    if capacity <= quantum {
        return (RecvMode::All, 1);
    }
    if poll_first && remaining >= LOW_WATER_MIN {
        let mark = (remaining / 2).min(LOW_WATER_MAX);
        let mark = usize::try_from(mark)
            .unwrap_or(usize::MAX)
            .min(quantum)
            .max(1);
        return (RecvMode::LowWater, mark);
    }
    (RecvMode::Any, 1)
}
