//! Probe: do io_uring registered (fixed) buffers and provided-buffer rings pay for a TCP tensor
//! transport over loopback on this kernel?
//!
//! Each run: a sender thread doing plain blocking `write`s from a cache-warm 256 KiB source, a
//! receiver thread with its own ring (`SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN`, like the
//! engine). Measured per run: wall time, receiver thread CPU (`CLOCK_THREAD_CPUTIME_ID`), sender
//! thread CPU, and "wq" = process CPU minus both (io-wq workers the ring punted work to), and
//! the `io_uring_enter` calls and CQEs of the receiver. Variants run interleaved A/B/A/B after a
//! discarded warm-up pair; medians are printed with [min..max] and the ratios B/A.
//!
//! 1. Body receive, 1 MiB and 64 MiB messages into one pre-faulted anonymous mapping:
//!    A = `RECVMSG` + `MSG_WAITALL`, one iovec (the engine today); B = `READ_FIXED` of the same
//!    memory registered as fixed buffer 0, re-issued until each message is complete.
//!    1b: cost of registering (pinning) and unregistering a 64 MiB region.
//! 2. 4 KiB frames streamed one way (one `write` per frame, then 16 frames per `write`):
//!    A = one `RECV` of up to 16 KiB into scratch, re-armed per CQE (the engine's heads);
//!    B = multishot `RECV` on a provided-buffer ring of 16 KiB buffers, each CQE copied out.
//!
//! Run: `cargo run --release -p tensorwire-engine --example fixed_buffers_probe`
//! (`PROBE_REPS=n` sets repetitions, default 7; threads are pinned, sender to CPU 0 and receiver
//! to CPU 1, unless `PROBE_NO_PIN=1`). Pinning 64 MiB needs CAP_IPC_LOCK or RLIMIT_MEMLOCK.

use std::cell::Cell;
use std::io::{self, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Instant;

use io_uring::types::BufRingEntry;
use io_uring::{IoUring, cqueue, opcode, squeue, types};

const MIB: usize = 1 << 20;
const SRC_LEN: usize = 256 * 1024;
const FRAME: usize = 4096;
const SCRATCH: usize = 16 * 1024;
const PBUFS: u16 = 128;

/// An anonymous private mapping, unmapped on drop.
struct Mmap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory owned by this value, like a `Vec<u8>`; no thread affinity. Through
// `&Mmap` the safe methods only compute addresses (`at`, `iovec`), never touch the bytes; the
// bytes are written (or, for the provided buffers, read) through raw pointers by one receiver
// thread, or the kernel on its behalf, at a time.
unsafe impl Send for Mmap {}
// SAFETY: as above.
unsafe impl Sync for Mmap {}

impl Mmap {
    fn new(len: usize) -> io::Result<Self> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a fresh anonymous mapping with no address hint; the result is checked.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }
    /// Faults every page in (first touch: allocate and zero); returns the number of pages.
    fn touch(&mut self) -> usize {
        for off in (0..self.len).step_by(4096) {
            // SAFETY: off < len, so the byte is inside the mapping.
            unsafe { self.ptr.add(off).write_volatile(1) };
        }
        self.len / 4096
    }
    fn at(&self, off: usize) -> *mut u8 {
        assert!(off <= self.len);
        // SAFETY: off <= len: in the mapping or one past its end.
        unsafe { self.ptr.add(off) }
    }
    fn iovec(&self) -> libc::iovec {
        libc::iovec {
            iov_base: self.ptr.cast(),
            iov_len: self.len,
        }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly the mapping made in `new`, unmapped only here.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Wall clock, this thread's CPU, the process's CPU.
type Stamp = (Instant, u64, u64);

fn stamp() -> Stamp {
    let thread = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    (
        Instant::now(),
        thread,
        clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID),
    )
}

fn pin(cpu: usize) {
    if std::env::var_os("PROBE_NO_PIN").is_some() {
        return;
    }
    // SAFETY: cpu_set_t is plain data (all-zero = empty); cpu < CPU_SETSIZE; pid 0 = this thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        eprintln!(
            "!!! pinning to CPU {cpu} FAILED: {}",
            io::Error::last_os_error()
        );
    }
}

fn new_ring() -> io::Result<(IoUring, &'static str)> {
    let mut b = IoUring::builder();
    b.setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun();
    match b.build(64) {
        Ok(ring) => Ok((ring, "single_issuer|defer_taskrun|coop_taskrun")),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((IoUring::new(64)?, "none")),
        Err(e) => Err(e),
    }
}

fn ctx(what: &'static str) -> impl Fn(io::Error) -> io::Error {
    move |e| {
        io::Error::new(
            e.kind(),
            format!("{what}: {e} (errno {:?})", e.raw_os_error()),
        )
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    RecvMsgAll,
    ReadFixed,
    Recv,
    RecvMulti,
}

/// Receiver counters: CQEs, `io_uring_enter` calls, multishot (re)arms, `ENOBUFS` completions.
#[derive(Default, Clone, Copy)]
struct Rx {
    cqes: u64,
    enters: u64,
    arms: u64,
    enobufs: u64,
}

fn enter(ring: &IoUring, rx: &mut Rx) -> io::Result<()> {
    loop {
        rx.enters += 1;
        match ring.submit_and_wait(1) {
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            r => return r.map(drop).map_err(ctx("io_uring_enter")),
        }
    }
}

/// A provided-buffer ring set up by hand (the crate only wraps the register call): a
/// page-aligned mapping of `PBUFS` `io_uring_buf` entries whose tail is entry 0's `resv` field,
/// published with a release store, and `PBUFS` buffers of `SCRATCH` bytes.
struct BufRing {
    entries: Mmap,
    bufs: Mmap,
    tail: u16,
}

impl BufRing {
    fn new() -> io::Result<Self> {
        let entries = Mmap::new(usize::from(PBUFS) * size_of::<BufRingEntry>())?;
        let bufs = Mmap::new(usize::from(PBUFS) * SCRATCH)?;
        Ok(Self {
            entries,
            bufs,
            tail: 0,
        })
    }
    /// Hands buffer `bid` (back) to the kernel, visible after `publish`.
    fn give(&mut self, bid: u16) {
        let slot = usize::from(self.tail & (PBUFS - 1));
        let addr = self.bufs.at(usize::from(bid) * SCRATCH) as u64;
        // SAFETY: the slot is masked into the entries mapping; the kernel reads only slots between
        // its head and the published tail, and this one is past the published tail. For slot 0
        // the reference also spans the tail field the kernel reads, but the setters write only
        // addr, len and bid, never the tail.
        let e = unsafe { &mut *self.entries.ptr.cast::<BufRingEntry>().add(slot) };
        e.set_addr(addr);
        e.set_len(u32_len(SCRATCH));
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }
    fn publish(&self) {
        let base = self.entries.ptr.cast::<BufRingEntry>();
        // SAFETY: the tail is entry 0's resv field: u16 aligned, inside the mapping, and only
        // accessed atomically (the kernel reads it with an acquire load).
        let tail = unsafe { AtomicU16::from_ptr(BufRingEntry::tail(base).cast_mut()) };
        tail.store(self.tail, Ordering::Release);
    }
}

fn u32_len(n: usize) -> u32 {
    u32::try_from(n).expect("length fits u32")
}

type RxOut = io::Result<(Rx, Stamp, Stamp)>;

/// Receives `total` bytes with variant `v`: bodies of `msg` bytes into `dst` (A/B of [1]),
/// or heads into a 16 KiB scratch (A/B of [2]). `go` is the start barrier, called after setup.
fn receive(
    conn: &TcpStream,
    go: &dyn Fn() -> Stamp,
    v: Variant,
    dst: &Mmap,
    msg: usize,
    total: usize,
) -> RxOut {
    // The buffer ring is declared before the ring, so that the ring (and its requests) go first.
    let mut pbuf = (v == Variant::RecvMulti).then(BufRing::new).transpose()?;
    let (mut ring, _) = new_ring()?;
    let fd = types::Fd(conn.as_raw_fd());
    if v == Variant::ReadFixed {
        // SAFETY: dst outlives the ring, which is dropped at the end of this function.
        unsafe { ring.submitter().register_buffers(&[dst.iovec()]) }
            .map_err(ctx("register_buffers"))?;
    }
    if let Some(p) = &mut pbuf {
        // SAFETY: the entries mapping is page aligned, PBUFS (a power of two) entries long and
        // outlives the ring.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(p.entries.ptr as u64, PBUFS, 0, 0)
        }
        .map_err(ctx("register_buf_ring"))?;
        (0..PBUFS).for_each(|bid| p.give(bid));
        p.publish();
    }
    let mut scratch = vec![0u8; SCRATCH];
    let mut iov = dst.iovec();
    // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    let (mut rx, mut got, mut armed) = (Rx::default(), 0, false);
    let t0 = go();
    // The requests run in here; if one fails, a request may still be in flight (an
    // `io_uring_enter` error, a multishot receive still armed): the process exits without
    // unwinding, so `scratch`, `hdr`, `iov` and the provided buffers are never freed while
    // the kernel may still write into them.
    let mut io = || -> RxOut {
        let mut t1 = None;
        while let Some(p) = &mut pbuf {
            if !armed && got < total {
                let sqe = opcode::RecvMulti::new(fd, 0).build();
                // SAFETY: the buffer ring outlives the ring, which owns the request.
                unsafe { ring.submission().push(&sqe) }.map_err(|_| io::Error::other("SQ full"))?;
                (rx.arms, armed) = (rx.arms + 1, true);
            }
            if !armed {
                break; // every byte is in and the request is over (EOF)
            }
            enter(&ring, &mut rx)?;
            for cqe in ring.completion() {
                rx.cqes += 1;
                armed &= cqueue::more(cqe.flags());
                match cqe.result() {
                    0 if got < total => return Err(io::Error::other("recv_multi: early EOF")),
                    0 => {}
                    n if n > 0 => {
                        let n = usize::try_from(n).unwrap_or(0).min(SCRATCH);
                        let bid = cqueue::buffer_select(cqe.flags())
                            .ok_or_else(|| io::Error::other("no buffer id"))?;
                        // SAFETY: the kernel wrote n <= SCRATCH bytes into buffer bid, ours until
                        // given back below; scratch holds SCRATCH bytes; they do not overlap.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                p.bufs.at(usize::from(bid) * SCRATCH),
                                scratch.as_mut_ptr(),
                                n,
                            )
                        };
                        std::hint::black_box(&mut scratch);
                        p.give(bid);
                        got += n;
                    }
                    e if -e == libc::ENOBUFS => rx.enobufs += 1,
                    e => return Err(ctx("recv_multi")(io::Error::from_raw_os_error(-e))),
                }
            }
            p.publish();
            if got >= total && t1.is_none() {
                t1 = Some(stamp()); // then wait for the sender's EOF to end the request
            }
        }
        while pbuf.is_none() && got < total {
            let off = got % msg;
            let sqe = match v {
                Variant::RecvMsgAll => {
                    (iov.iov_base, iov.iov_len) = (dst.at(off).cast(), msg - off);
                    (hdr.msg_iov, hdr.msg_iovlen) = (&raw mut iov, 1);
                    let flags = u32::try_from(libc::MSG_WAITALL).unwrap_or(0);
                    opcode::RecvMsg::new(fd, &raw mut hdr).flags(flags).build()
                }
                Variant::ReadFixed => {
                    opcode::ReadFixed::new(fd, dst.at(off), u32_len(msg - off), 0).build()
                }
                _ => opcode::Recv::new(fd, scratch.as_mut_ptr(), u32_len(SCRATCH)).build(),
            };
            // SAFETY: hdr, iov, dst and scratch outlive the call, which waits for the completion.
            got += unsafe { one(&mut ring, &sqe, &mut rx) }?;
        }
        Ok((rx, t0, t1.unwrap_or_else(stamp)))
    };
    io().or_else(|e| {
        eprintln!("receive failed with a request possibly still in flight: {e}; exiting");
        std::process::exit(1)
    })
}

/// Submits one SQE, waits for its CQE, returns its byte count.
///
/// # Safety
/// Everything `sqe` points at must stay valid until this returns. On success this returns after
/// the request's completion; if `io_uring_enter` fails (other than `EINTR`) it returns early and
/// the request may still be in flight until the ring is dropped.
unsafe fn one(ring: &mut IoUring, sqe: &squeue::Entry, rx: &mut Rx) -> io::Result<usize> {
    // SAFETY: the caller keeps the SQE's memory valid; this waits for the request's completion
    // (except on an `io_uring_enter` error, see above).
    unsafe { ring.submission().push(sqe) }.map_err(|_| io::Error::other("SQ full"))?;
    loop {
        enter(ring, rx)?;
        if let Some(cqe) = ring.completion().next() {
            rx.cqes += 1;
            return match cqe.result() {
                n if n > 0 => Ok(usize::try_from(n).unwrap_or(0)),
                0 => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF")),
                e => Err(ctx("recv")(io::Error::from_raw_os_error(-e))),
            };
        }
    }
}

/// One run's totals: wall, receiver, sender and io-wq ns; bytes; messages; counters.
struct Sample {
    ns: [f64; 4],
    bytes: f64,
    msgs: f64,
    rx: Rx,
}

/// One connection: the sender writes `total` bytes in `write_len` writes, `receive` takes them.
fn run(
    total: usize,
    write_len: usize,
    msg: usize,
    src: &[u8],
    v: Variant,
    dst: &Mmap,
) -> io::Result<Sample> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let barrier = &barrier;
        let sender = s.spawn(move || -> io::Result<u64> {
            pin(0);
            let mut c = TcpStream::connect(addr)?;
            c.set_nodelay(true)?;
            barrier.wait();
            let t0 = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
            for off in (0..total).step_by(write_len) {
                c.write_all(&src[..write_len.min(total - off)])?;
            }
            Ok(clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) - t0)
        });
        let (conn, _) = listener.accept()?;
        let receiver = s.spawn(move || {
            pin(1);
            conn.set_nodelay(true)?;
            let waited = Cell::new(false);
            let go = || {
                waited.set(true);
                barrier.wait();
                stamp()
            };
            let out = receive(&conn, &go, v, dst, msg, total);
            if !waited.get() {
                barrier.wait();
            }
            if out.is_err() {
                let _ = conn.shutdown(Shutdown::Both); // unblock the sender
            }
            out
        });
        let out = receiver
            .join()
            .map_err(|_| io::Error::other("receiver panicked"))?;
        let tx = sender
            .join()
            .map_err(|_| io::Error::other("sender panicked"))?;
        let (rx, t0, t1) = out?;
        let (tx, rx_ns) = (tx? as f64, (t1.1 - t0.1) as f64);
        let wq = (t1.2 - t0.2) as f64 - rx_ns - tx;
        let ns = [(t1.0 - t0.0).as_nanos() as f64, rx_ns, tx, wq.max(0.0)];
        Ok(Sample {
            ns,
            bytes: total as f64,
            msgs: (total / msg) as f64,
            rx,
        })
    })
}

fn med(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// `median [min..max]` with `p` decimals.
fn fmt3((m, lo, hi): (f64, f64, f64), p: usize) -> String {
    format!("{m:.p$} [{lo:.p$}..{hi:.p$}]")
}

/// Prints one variant's medians; returns (throughput, receiver CPU, receiver + io-wq CPU).
fn report(label: &str, s: &[Sample], per_msg: bool) -> [f64; 3] {
    let m = |f: &dyn Fn(&Sample) -> f64| med(s.iter().map(f).collect());
    let unit = |x: &Sample| if per_msg { x.msgs } else { x.bytes };
    let rate = m(&|x| unit(x) / x.ns[0] * if per_msg { 1e3 } else { 1.0 });
    let rx = m(&|x| x.ns[1] / unit(x));
    let rxwq = m(&|x| (x.ns[1] + x.ns[3]) / unit(x));
    let (tx, wq) = (m(&|x| x.ns[2] / unit(x)).0, m(&|x| x.ns[3] / unit(x)).0);
    let per = |f: fn(&Rx) -> u64| m(&|x| f(&x.rx) as f64 / x.msgs).0;
    let (cqe, ent) = (per(|r| r.cqes), per(|r| r.enters));
    let (arms, nobuf) = (m(&|x| x.rx.arms as f64).0, m(&|x| x.rx.enobufs as f64).0);
    let (ru, cu, p) = if per_msg {
        ("Mmsg/s", "ns/msg", 1)
    } else {
        ("GB/s", "ns/B", 4)
    };
    let out = [rate.0, rx.0, rxwq.0];
    let (rate, rx, rxwq) = (fmt3(rate, 3), fmt3(rx, p), fmt3(rxwq, p));
    println!(
        "  {label:<22} n={} {ru} {rate}  rx {cu} {rx} +wq {wq:.p$} = {rxwq}",
        s.len()
    );
    println!(
        "  {:<22}     tx {cu} {tx:.p$}  cqe/msg {cqe:.3} enter/msg {ent:.3} multishot arms {arms} enobufs {nobuf}",
        ""
    );
    out
}

/// Runs A and B interleaved (one discarded warm-up pair), prints medians and B/A.
fn compare(
    title: &str,
    reps: usize,
    per_msg: bool,
    vs: [(Variant, &str); 2],
    f: impl Fn(Variant) -> io::Result<Sample>,
) {
    println!("\n{title}");
    let mut s: [Vec<Sample>; 2] = [Vec::new(), Vec::new()];
    for rep in 0..=reps {
        for ((v, name), out) in vs.iter().zip(&mut s) {
            match f(*v) {
                Ok(x) if rep > 0 => out.push(x),
                Ok(_) => {}
                Err(e) => println!("  !!! {name} rep {rep} FAILED: {e}"),
            }
        }
    }
    let a = report(&format!("A {}", vs[0].1), &s[0], per_msg);
    let b = report(&format!("B {}", vs[1].1), &s[1], per_msg);
    let r = |i: usize| b[i] / a[i];
    println!(
        "  B/A: throughput x{:.3}, receiver CPU x{:.3}, receiver+wq CPU x{:.3}",
        r(0),
        r(1),
        r(2)
    );
}

/// Times `f` in ms; a failure names `what`.
fn timed<T>(what: &'static str, f: impl FnOnce() -> io::Result<T>) -> io::Result<f64> {
    let t = Instant::now();
    f().map_err(ctx(what))?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// [1b] Pinning a 64 MiB region: medians over `reps`, in ms, each on a fresh ring.
fn registration_costs(reps: usize) -> io::Result<()> {
    let len = 64 * MIB;
    let mut r: [Vec<f64>; 6] = Default::default();
    for _ in 0..reps {
        let (mut warm, fresh) = (Mmap::new(len)?, Mmap::new(len)?);
        let (ring, _) = new_ring()?; // declared after the mappings: dropped (unregistered) first
        let sub = ring.submitter();
        // SAFETY: the mappings outlive the ring, hence any registration of them.
        let register = |iov: libc::iovec| unsafe { sub.register_buffers(&[iov]) };
        // SAFETY: as above; a null iovec clears the slot and references no memory.
        let update = |iov: libc::iovec| unsafe { sub.register_buffers_update(0, &[iov], None) };
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        r[0].push(timed("touch", || Ok(warm.touch()))?);
        r[1].push(timed("register_buffers", || register(fresh.iovec()))?);
        r[2].push(timed("unregister_buffers", || sub.unregister_buffers())?);
        r[3].push(timed("register_buffers", || register(warm.iovec()))?);
        sub.unregister_buffers()
            .map_err(ctx("unregister_buffers"))?;
        sub.register_buffers_sparse(1)
            .map_err(ctx("register_buffers_sparse"))?;
        r[4].push(timed("register_buffers_update", || update(warm.iovec()))?);
        r[5].push(timed("register_buffers_update", || update(empty))?);
    }
    let names = [
        "first touch (fault+zero), no pin",
        "register_buffers, untouched region",
        "unregister_buffers",
        "register_buffers, pre-faulted region",
        "buffers_update into sparse slot (pre-faulted)",
        "buffers_update clearing the slot",
    ];
    for (name, v) in names.iter().zip(r) {
        let m = med(v);
        let rate = len as f64 / m.0 / 1e6;
        println!("  {name:<46} {} ms  ({rate:.1} GB/s)", fmt3(m, 3));
    }
    Ok(())
}

fn main() -> io::Result<()> {
    let reps: usize = std::env::var("PROBE_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid, writable rlimit; geteuid has no preconditions.
    let (rc, euid) = unsafe {
        (
            libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim),
            libc::geteuid(),
        )
    };
    let who = if euid == 0 {
        "root: CAP_IPC_LOCK lets 64 MiB be pinned anyway"
    } else {
        "NOT root: pinning over it fails"
    };
    println!(
        "RLIMIT_MEMLOCK (ulimit -l) = {} KiB (rc {rc}), euid {euid}, {who}",
        lim.rlim_cur / 1024
    );
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    println!(
        "THP {}; ring flags {}; {reps} reps + 1 warm-up",
        thp.trim(),
        new_ring()?.1
    );
    let src: Vec<u8> = (0..SRC_LEN)
        .map(|i| u8::try_from(i % 251).unwrap_or(0))
        .collect();
    let mut dst = Mmap::new(64 * MIB)?;
    dst.touch();

    let body = [
        (Variant::RecvMsgAll, "recvmsg+WAITALL"),
        (Variant::ReadFixed, "read_fixed"),
    ];
    for (msg, total) in [(MIB, 2048 * MIB), (64 * MIB, 4096 * MIB)] {
        let title = format!(
            "[1] body receive, {} MiB messages, {} GiB per rep",
            msg / MIB,
            total >> 30
        );
        compare(&title, reps, false, body, |v| {
            run(total, SRC_LEN, msg, &src, v, &dst)
        });
    }
    println!("\n[1b] registration of a 64 MiB region ({reps} reps)");
    if let Err(e) = registration_costs(reps) {
        println!("  !!! registration FAILED: {e}");
    }

    let heads = [
        (Variant::Recv, "recv 16K re-armed"),
        (Variant::RecvMulti, "recv_multi+buf ring"),
    ];
    let frames = 256 * 1024;
    for per_write in [1, 16] {
        let title =
            format!("[2] heads: {frames} x 4 KiB frames one way, {per_write} frame(s) per write");
        compare(&title, reps, true, heads, |v| {
            run(frames * FRAME, per_write * FRAME, FRAME, &src, v, &dst)
        });
    }
    Ok(())
}
