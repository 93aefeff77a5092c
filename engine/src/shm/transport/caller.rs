//! A caller that waits for its own reply reads its connection's queue itself for a while
//! (the spin window), so the reply needs no hand-off between threads and no wake-up; requests
//! it finds on the way are delivered as the driver would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorwire_proto::stats;

use super::Transport;
use super::conn::Conn;
use super::inbound;
use super::spin::Spin;

/// One look in this many pumps the connection whatever [`Conn::input_published`] says (a
/// send waiting for room, replies the peer has read since reading paused for them).
pub(super) const FULL_LOOK_EVERY: u32 = 16;

/// Reads `conn` until `done()` or the spin window passes without a message.
pub(super) fn wait_here(t: &Arc<Transport>, conn: &Arc<Conn>, done: &dyn Fn() -> bool) {
    let window = t.config.spin;
    if window.is_zero() || conn.is_closed() {
        return;
    }
    conn.caller_reads();
    if super::conn::take_rang() {
        // This thread rang the peer: a socket's send wakes its reader as a sync wake-up (the
        // sender is taken to sleep next), which may queue it on this CPU, and this thread is
        // about to spin instead. One yield lets the woken side run now (RTT 4 KiB with 1 ms
        // gaps: docs/benchmarks.md, "Waking a sleeping peer without a shared file").
        std::thread::yield_now();
    }
    let mut spin = Spin::new(window);
    // The clock as of the last look: work found is dated by it (at most one look old), so
    // the reply that ends the wait costs no clock read of its own.
    let mut now = Instant::now();
    spin.worked(now);
    let mut looks = 0u32;
    while !done() && !conn.is_closed() {
        looks = looks.wrapping_add(1);
        // Most looks find nothing: they cost two loads, not a pump (the lock, the session).
        let read = if conn.input_published() || looks % FULL_LOOK_EVERY == 0 {
            let (read, deliver) = conn.pump(t);
            for delivered in deliver {
                inbound::deliver(t, conn, delivered);
            }
            read
        } else {
            0
        };
        if read > 0 {
            record(spin.worked(now));
            continue;
        }
        now = Instant::now();
        let (again, spent) = spin.idle(now);
        if !again {
            record(spent);
            break;
        }
        spin.pause();
    }
    if conn.caller_done(|| t.wake.is_asleep(), |pid| t.lending.book().holds(pid)) {
        t.wake.signal();
    }
}

fn record(spent: Duration) {
    if !spent.is_zero() {
        stats::global().record_shm_spin(u64::try_from(spent.as_micros()).unwrap_or(u64::MAX));
    }
}
