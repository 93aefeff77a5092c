//! Taking over a connection: classify its first bytes (a TLS ClientHello or the h2c preface),
//! run the TLS handshake under a deadline, and serve HTTP/2 on it with a first-request
//! deadline of our own (hyper has none). Connections come from the PTR1 listener's hand-off
//! (with the bytes it already read) or from a standalone listener.

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::http2::prefixed::Prefixed;
use crate::http2::read_ahead::ReadAhead;
use crate::http2::service::{self, Peer};
use crate::http2::tls::{ALPN_H2, identity};
use crate::http2::{Guard, Shared};
use crate::socket_options;

/// What a connection's first bytes say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A TLS record (handshake, `0x16`).
    Tls,
    /// The HTTP/2 client preface (`PRI `).
    H2c,
    /// Anything else.
    Other,
}

/// Classifies at least the first byte (two are needed to tell `PRI ` from `PTR1`).
pub(crate) fn classify(prefix: &[u8]) -> Kind {
    match prefix {
        [0x16, ..] => Kind::Tls,
        [b'P', b'R', ..] => Kind::H2c,
        _ => Kind::Other,
    }
}

/// Serves a handed-off connection whose first bytes (`prefix`) were already read.
pub(crate) async fn serve(shared: Arc<Shared>, stream: TcpStream, prefix: Vec<u8>) {
    let _guard = Guard::connection(&shared);
    let Ok(addr) = stream.peer_addr() else { return };
    let _ = stream.set_nodelay(true);
    socket_options::choose_congestion(&stream, &shared.session);
    // A second handle on the socket, for a close that loses nothing written (`linger`).
    let kept = stream.as_fd().try_clone_to_owned().ok();
    serve_stream(&shared, addr, stream, prefix).await;
    if let Some(fd) = kept {
        linger(fd, shared.session.drain_timeout).await;
    }
}

/// Closes a served connection without losing what was written to it: the write side is shut
/// down (the peer reads every byte sent, then the end), and what the peer still sends (window
/// updates, a PING's answer) is read and dropped until it closes too, for at most `limit`.
/// Closing with that input unread would reset the connection instead, and the tail of a reply
/// still on its way would be lost (a graceful close ends a connection right after its last
/// response is written).
async fn linger(fd: OwnedFd, limit: Duration) {
    let stream = std::net::TcpStream::from(fd);
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(mut stream) = TcpStream::from_std(stream) else {
        return;
    };
    let _ = stream.shutdown().await;
    let mut sink = vec![0u8; 16 << 10];
    let _ = tokio::time::timeout(limit, async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

async fn serve_stream(shared: &Arc<Shared>, addr: SocketAddr, stream: TcpStream, prefix: Vec<u8>) {
    let io = Prefixed::new(prefix, stream);
    match classify(&io.prefix) {
        Kind::Tls => serve_tls(shared, addr, io).await,
        Kind::H2c if shared.config.require_tls => {
            tracing::debug!(%addr, "h2c refused: this node requires TLS");
        }
        Kind::H2c => {
            serve_http2(
                shared,
                Peer {
                    addr,
                    identity: None,
                },
                io,
            )
            .await
        }
        Kind::Other => tracing::debug!(%addr, "neither TLS nor HTTP/2: closed"),
    }
}

/// A standalone listener (without the engine's PTR1 listener): reads the first bytes of each
/// connection under the preface deadline, then serves it as a hand-off would be.
pub(crate) async fn listen(shared: Arc<Shared>, listener: TcpListener) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((mut stream, _)) => {
                    let shared = Arc::clone(&shared);
                    tokio::spawn(async move {
                        let mut prefix = [0u8; 4];
                        let deadline = shared.config.preface_timeout;
                        let read = tokio::time::timeout(deadline, stream.read(&mut prefix)).await;
                        if let Ok(Ok(n)) = read && n > 0 {
                            serve(shared, stream, prefix[..n].to_vec()).await;
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP/2 accept failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = crate::sync::stopped(&mut shutdown) => return,
        }
    }
}

async fn serve_tls(shared: &Arc<Shared>, addr: SocketAddr, io: Prefixed<TcpStream>) {
    let Some(acceptor) = shared.acceptor.clone() else {
        tracing::debug!(%addr, "TLS refused: this node has no TLS certificate");
        return;
    };
    let handshake = tokio::time::timeout(
        shared.config.handshake_timeout,
        acceptor.accept(ReadAhead::new(io)),
    )
    .await;
    let stream = match handshake {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return tracing::debug!(%addr, error = %e, "TLS handshake failed"),
        Err(_) => return tracing::debug!(%addr, "TLS handshake timed out"),
    };
    let (_, connection) = stream.get_ref();
    if connection.alpn_protocol() != Some(ALPN_H2) {
        // A client that offered no ALPN at all gets here: rustls refuses only a wrong offer.
        return tracing::debug!(%addr, "TLS client did not agree on h2: closed");
    }
    let identity = identity(connection.peer_certificates());
    serve_http2(shared, Peer { addr, identity }, stream).await;
}

/// Serves HTTP/2 on `io` until it closes, the first-request deadline passes without a
/// request, or the node shuts down (GOAWAY; requests in flight may finish).
async fn serve_http2<I>(shared: &Arc<Shared>, peer: Peer, io: I)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let config = &shared.config;
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(config.stream_window)
        .initial_connection_window_size(config.connection_window)
        .adaptive_window(config.adaptive_window)
        .max_frame_size(config.max_frame_size)
        .max_concurrent_streams(config.max_concurrent_streams)
        .max_header_list_size(config.max_header_list_size)
        .max_send_buf_size(usize::try_from(config.max_frame_size).unwrap_or(1 << 20) * 2)
        .keep_alive_interval(config.keep_alive_interval)
        .keep_alive_timeout(config.keep_alive_timeout);
    let seen = Arc::new(AtomicBool::new(false));
    let service = {
        let (shared, seen) = (Arc::clone(shared), Arc::clone(&seen));
        service_fn(move |request| {
            seen.store(true, Ordering::Relaxed);
            service::serve(Arc::clone(&shared), peer.clone(), request)
        })
    };
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut shutdown = shared.shutdown.subscribe();
    // Until the first request: its deadline (then the connection is dropped: nothing is in
    // flight). After GOAWAY at shutdown: how long requests in flight may take to finish (h2
    // also waits for the peer to answer a PING, which a silent peer never does).
    let deadline = tokio::time::sleep(config.first_request_timeout);
    tokio::pin!(deadline);
    let mut phase = Phase::FirstRequest;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "HTTP/2 connection ended");
                }
                return;
            }
            () = &mut deadline, if phase != Phase::Serving => {
                if phase == Phase::Closing {
                    return tracing::debug!("HTTP/2 connection did not finish after GOAWAY: dropped");
                }
                if seen.load(Ordering::Relaxed) {
                    phase = Phase::Serving; // keep-alive watches the rest
                } else {
                    // Nothing in flight to finish: close at once.
                    return tracing::debug!("no request within the first-request deadline: closed");
                }
            }
            () = crate::sync::stopped(&mut shutdown), if phase != Phase::Closing => {
                connection.as_mut().graceful_shutdown();
                deadline.as_mut().reset(tokio::time::Instant::now() + DRAIN_AT_SHUTDOWN);
                phase = Phase::Closing;
            }
        }
    }
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No request yet: the first-request deadline runs.
    FirstRequest,
    /// Requests arrived; keep-alive pings detect a dead peer.
    Serving,
    /// GOAWAY sent; requests in flight may finish until the drain deadline.
    Closing,
}

/// How long requests in flight may take to finish once the node shuts down.
const DRAIN_AT_SHUTDOWN: Duration = Duration::from_secs(5);
