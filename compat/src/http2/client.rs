//! The HTTP/2 client: one connection per peer (streams multiplex), opened once however many
//! requests want it at the same time, opened again after it fails; each request under its
//! caller's deadline, cancelled (`RST_STREAM`) when its caller gives up, never replayed once
//! it may have been seen.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls_pki_types::ServerName;
use tensorwire_proto::transport::{
    ActorPath, Answer, Completion, Error, OutboundRequest, Reply, RequestKind,
};
use tensorwire_proto::{Encoded, Format, Limits, Malformed, WireError, stats};
use tokio::io::AsyncReadExt;
use tokio::sync::{Mutex as AsyncMutex, oneshot};

use crate::http2::prefixed::Prefixed;
use crate::http2::read_ahead::ReadAhead;
use crate::http2::recv::{self, MinRate, RecvError};
use crate::http2::send_body::ChunkBody;
use crate::http2::tls::ALPN_H2;
use crate::http2::wire;
use crate::http2::{Guard, Shared};
use crate::socket_options;

/// Connections by peer. Peers whose connection closed (or never opened) and that no request
/// is using are swept out whenever the map has doubled since the last sweep, so it stays
/// bounded by the peers in use, not by every peer ever called.
pub(crate) struct Peers {
    slots: std::sync::Mutex<PeerSlots>,
}

struct PeerSlots {
    by_peer: HashMap<SocketAddr, Slot>,
    /// The size that starts the next sweep.
    sweep_at: usize,
}

/// Peers the map holds before its first sweep.
const FIRST_SWEEP: usize = 16;

impl Default for Peers {
    fn default() -> Self {
        Self {
            slots: std::sync::Mutex::new(PeerSlots {
                by_peer: HashMap::new(),
                sweep_at: FIRST_SWEEP,
            }),
        }
    }
}

impl Peers {
    /// `peer`'s slot, made if there is none.
    fn slot(&self, peer: SocketAddr) -> Slot {
        let mut slots = crate::sync::lock(&self.slots);
        if !slots.by_peer.contains_key(&peer) && slots.by_peer.len() >= slots.sweep_at {
            slots.by_peer.retain(|_, slot| in_use(slot));
            slots.sweep_at = (slots.by_peer.len() * 2).max(FIRST_SWEEP);
        }
        Arc::clone(slots.by_peer.entry(peer).or_default())
    }

    /// Peers in the map.
    #[cfg(test)]
    fn len(&self) -> usize {
        crate::sync::lock(&self.slots).by_peer.len()
    }
}

/// Whether a request holds the slot, or it has an open connection.
fn in_use(slot: &Slot) -> bool {
    Arc::strong_count(slot) > 1
        || slot.try_lock().map_or(true, |sender| {
            sender.as_ref().is_some_and(|s| !s.is_closed())
        })
}

/// A peer's connection, if open; locked while one is being opened.
type Slot = Arc<AsyncMutex<Option<SendRequest<ChunkBody>>>>;

/// Starts `request` on the runtime; its outcome goes to its completion.
pub(crate) fn send(shared: &Arc<Shared>, request: OutboundRequest) {
    let OutboundRequest {
        peer,
        path,
        kind,
        message,
        deadline,
        completion,
        ..
    } = request;
    if completion.is_cancelled() {
        return completion.complete(Err(Error::Cancelled));
    }
    if shared.is_shut_down() {
        return completion.complete(Err(Error::Shutdown));
    }
    let encoded = match tensorwire_proto::ptm1::encode(&message, &shared.limits) {
        Ok(encoded) => encoded,
        Err(e) => return completion.complete(Err(Error::Encode(e))),
    };
    let (cancel, cancelled) = oneshot::channel::<()>();
    completion.on_cancel(Box::new(move || {
        let _ = cancel.send(());
    }));
    let shared = Arc::clone(shared);
    shared.handle.clone().spawn(async move {
        let what = kind.as_str();
        let exchange = exchange(&shared, peer, &path, kind, encoded);
        let at = deadline.at().map(tokio::time::Instant::from_std);
        let outcome = tokio::select! {
            outcome = async {
                match at {
                    Some(at) => tokio::time::timeout_at(at, exchange)
                        .await
                        .unwrap_or_else(|_| Err(deadline.error(what))),
                    None => exchange.await,
                }
            } => outcome,
            // Dropping the exchange resets its stream (RST_STREAM CANCEL).
            Ok(()) = cancelled => Err(Error::Cancelled),
        };
        complete(completion, outcome);
    });
}

fn complete(completion: Box<dyn Completion>, outcome: Result<Answer, Error>) {
    completion.complete(outcome);
}

/// One request and its answer.
async fn exchange(
    shared: &Arc<Shared>,
    peer: SocketAddr,
    path: &ActorPath,
    kind: RequestKind,
    encoded: Encoded,
) -> Result<Answer, Error> {
    let body_len = encoded.wire_len();
    let (head, parts) = encoded.into_parts();
    let scheme = if shared.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let uri = format!("{scheme}://{peer}{}", path.as_str());
    let mut refused = 0;
    loop {
        let mut sender = connection(shared, peer).await?;
        // The chunks are shared (`Bytes`): building the body again copies no payload.
        let body =
            ChunkBody::from_chunks(std::iter::once(head.clone()).chain(parts.iter().cloned()));
        let request = Request::post(&uri)
            .header(wire::MESSAGE_MODE, wire::mode_value(kind))
            .header(
                wire::MESSAGE_TYPE,
                HeaderValue::from_static(wire::TENSOR_MESSAGE_TYPE),
            )
            .header(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static(wire::OCTET_STREAM),
            )
            .body(body)
            .map_err(|e| Error::Misuse(format!("cannot build the HTTP/2 request: {e}")))?;
        sender.ready().await.map_err(|e| closed(peer, &e))?;
        stats::global().record_http2_fallback(body_len);
        match sender.send_request(request).await {
            Ok(response) => return answer(shared, peer, kind, response).await,
            // REFUSED_STREAM: the server did not process it (say, more streams than its limit
            // before its SETTINGS arrived), so sending it again cannot deliver it twice.
            Err(e) if is_refused(&e) && refused < MAX_REFUSED => refused += 1,
            Err(e) => return Err(closed(peer, &e)),
        }
    }
}

/// How often a request refused before processing is sent again.
const MAX_REFUSED: u32 = 8;

fn is_refused(error: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        source = cause.source();
    }
    false
}

/// Maps the response onto what a PTR1 peer would have answered.
async fn answer(
    shared: &Shared,
    peer: SocketAddr,
    kind: RequestKind,
    response: http::Response<Incoming>,
) -> Result<Answer, Error> {
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body();
    match (status, kind) {
        (StatusCode::ACCEPTED, RequestKind::Tell) => Ok(Answer::Ack),
        (StatusCode::OK, RequestKind::Ask) => {
            let response_type = headers
                .get(wire::RESPONSE_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("single");
            if response_type.eq_ignore_ascii_case("tensor") {
                let declared = wire::content_length(&headers).ok().flatten();
                let rate = MinRate {
                    bytes_per_second: shared.session.min_rate,
                    window: shared.session.rate_window,
                };
                let message = recv::receive(body, declared, &*shared.memory, &shared.limits, rate)
                    .await
                    .map_err(|e| received(peer, e, shared))?;
                Ok(Answer::Reply(Reply::Tensor(message)))
            } else {
                let msg_type = headers
                    .get(wire::MESSAGE_TYPE)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .unwrap_or_default();
                let data = collect(peer, body, shared).await?;
                Ok(Answer::Reply(Reply::Single { msg_type, data }))
            }
        }
        (status, _) if status.is_success() => Err(Error::UnexpectedReply {
            peer,
            request: kind.as_str(),
            reply: "success status",
        }),
        (status, _) => {
            // An error text may be longer than a small metadata limit (as PTR1 Error replies).
            let limit = Limits::MAX_ERROR_TEXT_BYTES.max(shared.limits.max_metadata_bytes());
            let text = collect_up_to(peer, body, limit).await.unwrap_or_default();
            let text = String::from_utf8_lossy(&text);
            let text = if text.is_empty() {
                status.to_string()
            } else {
                format!("{status}: {text}")
            };
            Err(Error::Remote {
                peer: Some(peer),
                text,
            })
        }
    }
}

/// A small body (a single reply, an error text), bounded by the metadata limit.
async fn collect(peer: SocketAddr, body: Incoming, shared: &Shared) -> Result<bytes::Bytes, Error> {
    collect_up_to(peer, body, shared.limits.max_metadata_bytes()).await
}

/// A body of at most `limit` bytes.
async fn collect_up_to(
    peer: SocketAddr,
    body: Incoming,
    limit: u64,
) -> Result<bytes::Bytes, Error> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    Limited::new(body, limit)
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .map_err(|e| Error::ConnectionClosed {
            peer,
            detail: Some(std::io::Error::other(e.to_string())),
        })
}

fn received(peer: SocketAddr, error: RecvError, shared: &Shared) -> Error {
    match error {
        RecvError::Wire(source) => Error::Protocol { peer, source },
        RecvError::Length {
            declared,
            described,
        } => Error::Protocol {
            peer,
            source: WireError::Malformed(Malformed::Truncated {
                format: Format::Ptm1,
                expected: described,
                received: declared,
            }),
        },
        RecvError::Memory(text) => Error::Memory(text),
        RecvError::Stalled(_) => Error::Timeout {
            what: "receiving the reply at the minimum rate",
            after: shared.session.rate_window,
        },
        RecvError::Broken(text) => Error::ConnectionClosed {
            peer,
            detail: Some(std::io::Error::other(text)),
        },
    }
}

/// A failed exchange: [`Error::Tls`] if TLS ended it (with TLS 1.3 a server that refuses our
/// certificate says so only after the handshake, as an alert on the first read), else a
/// closed connection with every cause in the text.
fn closed(peer: SocketAddr, error: &hyper::Error) -> Error {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let io = cause.downcast_ref::<std::io::Error>().or_else(|| {
            cause
                .downcast_ref::<h2::Error>()
                .and_then(h2::Error::get_io)
        });
        let tls = io
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        if let Some(tls) = tls {
            return Error::Tls {
                peer,
                reason: tls.to_string(),
            };
        }
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    Error::ConnectionClosed {
        peer,
        detail: Some(std::io::Error::other(text)),
    }
}

/// The peer's connection: the open one, or a new one (only one is opened at a time per peer;
/// requests that want it meanwhile wait for it).
async fn connection(
    shared: &Arc<Shared>,
    peer: SocketAddr,
) -> Result<SendRequest<ChunkBody>, Error> {
    let slot = shared.peers.slot(peer);
    let mut slot = slot.lock().await;
    if let Some(sender) = slot.as_ref().filter(|s| !s.is_closed()) {
        return Ok(sender.clone());
    }
    *slot = None;
    let sender = connect(shared, peer).await?;
    *slot = Some(sender.clone());
    Ok(sender)
}

async fn connect(shared: &Arc<Shared>, peer: SocketAddr) -> Result<SendRequest<ChunkBody>, Error> {
    let timeout = shared.session.connect_timeout;
    let tcp = tokio::time::timeout(timeout, socket_options::connect(peer, &shared.session))
        .await
        .map_err(|_| Error::Timeout {
            what: "connect",
            after: timeout,
        })?
        .map_err(|source| Error::Connect { peer, source })?;
    let _ = tcp.set_nodelay(true);
    match &shared.config.tls {
        None => handshake(shared, peer, tcp).await,
        Some(tls) => {
            let name = match &tls.server_name {
                Some(name) => ServerName::try_from(name.clone())
                    .map_err(|e| Error::Misuse(format!("invalid TLS server name {name:?}: {e}")))?,
                None => ServerName::IpAddress(peer.ip().into()),
            };
            let connector = tokio_rustls::TlsConnector::from(Arc::clone(&tls.client));
            let stream = tokio::time::timeout(
                shared.config.handshake_timeout,
                connector.connect(name, ReadAhead::new(tcp)),
            )
            .await
            .map_err(|_| Error::Timeout {
                what: "TLS handshake",
                after: shared.config.handshake_timeout,
            })?
            .map_err(|e| Error::Tls {
                peer,
                reason: e.to_string(),
            })?;
            if stream.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
                return Err(Error::Tls {
                    peer,
                    reason: "the server did not agree on h2".into(),
                });
            }
            let stream = verdict(shared, peer, stream).await?;
            handshake(shared, peer, stream).await
        }
    }
}

/// Waits for the server's first bytes (its HTTP/2 SETTINGS, sent as soon as it accepted us).
/// With TLS 1.3 a server that refuses our certificate says so only now, with an alert:
/// reading first turns that into a clear [`Error::Tls`] instead of a broken request.
async fn verdict<S>(shared: &Shared, peer: SocketAddr, mut stream: S) -> Result<Prefixed<S>, Error>
where
    S: tokio::io::AsyncRead + Unpin,
{
    let mut first = vec![0u8; 64];
    let timeout = shared.config.handshake_timeout;
    let read = tokio::time::timeout(timeout, stream.read(&mut first))
        .await
        .map_err(|_| Error::Timeout {
            what: "the server's first HTTP/2 frame",
            after: timeout,
        })?;
    match read {
        Ok(0) => Err(Error::Tls {
            peer,
            reason: "the server closed the connection after the handshake".into(),
        }),
        Ok(n) => {
            first.truncate(n);
            Ok(Prefixed::new(first, stream))
        }
        Err(e) => Err(
            match e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                Some(tls) => Error::Tls {
                    peer,
                    reason: tls.to_string(),
                },
                None => Error::Tls {
                    peer,
                    reason: e.to_string(),
                },
            },
        ),
    }
}

async fn handshake<I>(
    shared: &Arc<Shared>,
    peer: SocketAddr,
    io: I,
) -> Result<SendRequest<ChunkBody>, Error>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let config = &shared.config;
    let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(config.stream_window)
        .initial_connection_window_size(config.connection_window)
        .adaptive_window(config.adaptive_window)
        .max_frame_size(config.max_frame_size)
        .max_header_list_size(config.max_header_list_size)
        .max_send_buf_size(usize::try_from(config.max_frame_size).unwrap_or(1 << 20) * 2)
        .keep_alive_interval(config.keep_alive_interval)
        .keep_alive_timeout(config.keep_alive_timeout);
    let (sender, connection) =
        builder
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| Error::ConnectionClosed {
                peer,
                detail: Some(std::io::Error::other(format!("HTTP/2 handshake: {e}"))),
            })?;
    let guard = Guard::connection(shared);
    let mut shutdown = shared.shutdown.subscribe();
    tokio::spawn(async move {
        let _guard = guard;
        tokio::select! {
            result = connection => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "HTTP/2 client connection ended");
                }
            }
            () = crate::sync::stopped(&mut shutdown) => {}
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_without_a_connection_or_a_request_leave_the_map() {
        let peers = Peers::default();
        let peer = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        // A request is using this one (its connection is being opened).
        let held = peers.slot(peer(1));
        for port in 2..10_000 {
            drop(peers.slot(peer(port)));
        }
        assert!(peers.len() <= FIRST_SWEEP + 1, "{} peers kept", peers.len());
        assert!(
            Arc::ptr_eq(&held, &peers.slot(peer(1))),
            "the held slot was kept"
        );
    }
}
