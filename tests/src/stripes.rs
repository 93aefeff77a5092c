//! Helpers for the striping and pipelining tests: a strict PTR1 peer that knows nothing of
//! striping (it refuses any frame with a non-zero reserved byte) and notes requests that
//! arrive before the one before them is answered, and a proxy that cuts off one stripe.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tensorwire_proto::ptr1::{self, Frame};
use tensorwire_proto::stripe::{CAPABILITIES_PATH, CAPABILITIES_TYPE, capabilities_reply};
use tensorwire_proto::{FixedHeader, Format, Limits};

/// What the strict peer saw: per frame, its kind byte, reserved bytes, path and message.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The kind byte.
    pub kind: u8,
    /// Bytes 5..8 of the header (all zero in plain PTR1).
    pub reserved: [u8; 3],
    /// The frame as decoded.
    pub frame: Frame,
    /// Bytes of a further frame had arrived before this one was answered: the client
    /// pipelined (one that waits for each reply cannot have sent them yet).
    pub pipelined: bool,
}

/// A PTR1 server written from the protocol page alone, as another implementation would be:
/// it serves `/actors/echo` (a TensorResponse of the request), answers every other path with
/// an Error frame, and closes the connection on a frame with a non-zero reserved byte (after
/// recording it). It never heard of striping.
pub struct StrictPeer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    stall: Arc<Stall>,
}

/// Whether the peer holds the frames it reads unanswered, and how many it holds.
#[derive(Default)]
struct Stall {
    state: Mutex<StallState>,
    changed: Condvar,
}

#[derive(Default)]
struct StallState {
    holding: bool,
    held: usize,
}

impl Stall {
    /// Whether the frame just read is to be held (waits until the hold ends; the connection is
    /// then closed without an answer).
    fn holds(&self) -> bool {
        let mut state = self.lock();
        if !state.holding {
            return false;
        }
        state.held += 1;
        self.changed.notify_all();
        while state.holding {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        true
    }

    fn set(&self, hold: bool) {
        let mut state = self.lock();
        state.holding = hold;
        if !hold {
            state.held = 0;
        }
        self.changed.notify_all();
    }

    /// Waits until a connection holds a frame, at most `timeout`; whether one does.
    fn wait_held(&self, timeout: Duration) -> bool {
        let state = self.lock();
        let (state, _) = self
            .changed
            .wait_timeout_while(state, timeout, |s| s.held == 0)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.held > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StallState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl StrictPeer {
    /// Starts it on a loopback port.
    pub fn start() -> Self {
        Self::start_answering(None)
    }

    /// Starts it on a loopback port; with `pipeline`, it answers the capabilities Ask saying
    /// it takes that many requests per connection at once (it reads them one after another
    /// all the same), instead of refusing it as an unknown path.
    pub fn start_answering(pipeline: Option<u16>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
        Self::serve_on(listener, pipeline)
    }

    /// As [`StrictPeer::start_answering`], on connections whose segments are 536 bytes and
    /// whose receive buffer is 4 KiB (set on the listener, before any connection): a sender
    /// to it keeps only a few dozen KiB in its kernel buffers while it reads nothing, where
    /// loopback's 64 KiB segments let it hand the kernel megabytes.
    pub fn start_narrow(pipeline: Option<u16>) -> Self {
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("a socket");
        socket.set_recv_buffer_size(4 << 10).expect("SO_RCVBUF");
        socket.set_tcp_mss(536).expect("TCP_MAXSEG");
        socket.bind(&addr.into()).expect("binds");
        socket.listen(128).expect("listens");
        Self::serve_on(socket.into(), pipeline)
    }

    fn serve_on(listener: TcpListener, pipeline: Option<u16>) -> Self {
        let addr = listener.local_addr().expect("an address");
        listener.set_nonblocking(true).expect("non-blocking");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let stall = Arc::new(Stall::default());
        let (seen2, stop2, stall2) = (Arc::clone(&seen), Arc::clone(&stop), Arc::clone(&stall));
        std::thread::spawn(move || {
            while !stop2.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (seen, stall) = (Arc::clone(&seen2), Arc::clone(&stall2));
                        std::thread::spawn(move || {
                            serve_strictly(stream, &seen, &stall, pipeline);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            addr,
            seen,
            stop,
            stall,
        }
    }

    /// From now on every connection holds the next frame it reads unanswered and reads no
    /// further, until [`StrictPeer::close_held`].
    pub fn hold(&self) {
        self.stall.set(true);
    }

    /// Waits until a connection holds a frame (panics after 10 s).
    pub fn wait_held(&self) {
        assert!(
            self.stall.wait_held(Duration::from_secs(10)),
            "no connection received a frame to hold"
        );
    }

    /// Closes every connection holding a frame (without answering it); connections serve
    /// again from now on.
    pub fn close_held(&self) {
        self.stall.set(false);
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every frame it received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for StrictPeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.stall.set(false);
    }
}

fn serve_strictly(
    mut stream: TcpStream,
    seen: &Mutex<Vec<Seen>>,
    stall: &Stall,
    pipeline: Option<u16>,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let limits = Limits::default();
    loop {
        let Some((header, whole)) = read_whole_frame(&mut stream) else {
            return;
        };
        let Ok(frame) = ptr1::decode(Bytes::from(whole), &limits) else {
            return;
        };
        let reserved = [header[5], header[6], header[7]];
        let pipelined = more_to_read(&stream);
        seen.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Seen {
                kind: header[4],
                reserved,
                frame: frame.clone(),
                pipelined,
            });
        if stall.holds() {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
        if reserved != [0, 0, 0] {
            return; // not a frame this peer understands
        }
        let reply = match frame {
            Frame::Ask { path, message } if path == "/actors/echo" => {
                Frame::TensorResponse(message)
            }
            Frame::Ask { path, message } if path == CAPABILITIES_PATH && pipeline.is_some() => {
                Frame::SingleResponse {
                    version: message.version,
                    msg_type: CAPABILITIES_TYPE.into(),
                    data: capabilities_reply(None, pipeline.unwrap_or(1)),
                }
            }
            Frame::Ask { path, message } | Frame::Tell { path, message } => Frame::Error {
                version: message.version,
                text: format!("no endpoint at {path}"),
            },
            _ => return,
        };
        let Ok(encoded) = ptr1::encode(&reply, &limits) else {
            return;
        };
        if stream.write_all(&encoded.to_vec()).is_err() {
            return;
        }
    }
}

/// Whether bytes wait to be read on `stream` now.
fn more_to_read(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let waiting = matches!(stream.peek(&mut byte), Ok(n) if n > 0);
    let _ = stream.set_nonblocking(false);
    waiting
}

/// Reads one whole PTR1 frame (its fixed header and all of it); `None` at the end or on error.
fn read_whole_frame(stream: &mut TcpStream) -> Option<([u8; 28], Vec<u8>)> {
    let limits = Limits::default();
    let mut header = [0u8; 28];
    stream.read_exact(&mut header).ok()?;
    let fixed = FixedHeader::parse(Format::Ptr1, &header, &limits).ok()?;
    let mut table = vec![0u8; fixed.table_len().ok()?];
    stream.read_exact(&mut table).ok()?;
    let layout = fixed.layout(&table, &limits).ok()?;
    let body = usize::try_from(layout.body_len()).ok()?;
    let mut whole = Vec::with_capacity(28 + table.len() + body);
    whole.extend_from_slice(&header);
    whole.extend_from_slice(&table);
    whole.resize(whole.len() + body, 0);
    let from = 28 + table.len();
    stream.read_exact(&mut whole[from..]).ok()?;
    Some((header, whole))
}

/// How a [`StripeCutter`] cuts off the stripe it picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Forwards half of the stripe's body, then nothing more in either direction (a black
    /// hole: the connection stays open).
    BlackHole,
    /// Forwards half of the stripe's body, then shuts both connections down (each end reads
    /// the end of the stream mid-frame).
    Close,
}

/// A proxy between a client and a server that passes everything through, except that the
/// `nth` stripe frame (counted from 1 over all connections) is cut off half-way through its
/// body.
pub struct StripeCutter {
    addr: SocketAddr,
    stripes: Arc<AtomicUsize>,
    cut_done: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl StripeCutter {
    /// Starts it in front of `target`.
    pub fn start(target: SocketAddr, nth: usize, cut: Cut) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
        let addr = listener.local_addr().expect("an address");
        let stripes = Arc::new(AtomicUsize::new(0));
        let cut_done = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (stripes2, cut_done2, stop2) = (
            Arc::clone(&stripes),
            Arc::clone(&cut_done),
            Arc::clone(&stop),
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(target) else {
                    return;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
                    return;
                };
                std::thread::spawn(move || pump(server2, client2));
                let (stripes, cut_done) = (Arc::clone(&stripes2), Arc::clone(&cut_done2));
                let stop = Arc::clone(&stop2);
                std::thread::spawn(move || {
                    let cut = Cutting {
                        nth,
                        cut,
                        stripes: &stripes,
                        cut_done: &cut_done,
                        stop: &stop,
                    };
                    forward_frames(client, server, &cut);
                });
            }
        });
        Self {
            addr,
            stripes,
            cut_done,
            stop,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stripe frames that started through the proxy.
    pub fn stripes_seen(&self) -> usize {
        self.stripes.load(Ordering::Acquire)
    }

    /// Whether the chosen stripe was cut off.
    pub fn cut_done(&self) -> bool {
        self.cut_done.load(Ordering::Acquire)
    }
}

impl Drop for StripeCutter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

struct Cutting<'a> {
    nth: usize,
    cut: Cut,
    stripes: &'a AtomicUsize,
    cut_done: &'a AtomicBool,
    stop: &'a AtomicBool,
}

/// Copies everything from `from` to `to` until either ends.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

/// Copies request frames from the client to the server, cutting off the `nth` stripe.
fn forward_frames(mut client: TcpStream, mut server: TcpStream, cutting: &Cutting<'_>) {
    let limits = Limits::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let mut header = [0u8; 28];
        if client.read_exact(&mut header).is_err() {
            let _ = server.shutdown(Shutdown::Write);
            return;
        }
        let Ok(fixed) = FixedHeader::parse(Format::Ptr1, &header, &limits) else {
            return;
        };
        let Ok(table_len) = fixed.table_len() else {
            return;
        };
        let mut table = vec![0u8; table_len];
        if client.read_exact(&mut table).is_err() {
            return;
        }
        let Ok(layout) = fixed.layout(&table, &limits) else {
            return;
        };
        let chosen = header[5] == tensorwire_proto::stripe::EXTENSION_STRIPE
            && cutting.stripes.fetch_add(1, Ordering::AcqRel) + 1 == cutting.nth;
        if server.write_all(&header).is_err() || server.write_all(&table).is_err() {
            return;
        }
        let body = layout.body_len();
        let pass = if chosen { body / 2 } else { body };
        if copy_exactly(&mut client, &mut server, pass, &mut buf).is_err() {
            return;
        }
        if chosen {
            cutting.cut_done.store(true, Ordering::Release);
            match cutting.cut {
                Cut::BlackHole => {
                    // Holds both sockets open and forwards nothing more (until dropped).
                    while !cutting.stop.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                Cut::Close => {
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = server.shutdown(Shutdown::Both);
                }
            }
            return;
        }
    }
}

fn copy_exactly(
    from: &mut TcpStream,
    to: &mut TcpStream,
    mut left: u64,
    buf: &mut [u8],
) -> std::io::Result<()> {
    while left > 0 {
        let want = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
        let n = from.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        to.write_all(&buf[..n])?;
        left -= u64::try_from(n).unwrap_or(left);
    }
    Ok(())
}
