//! Serving one HTTP/2 request: check it, receive its PTM1 body into the node's memory, hand it
//! to the endpoint and map the answer back onto HTTP.
//!
//! | outcome | status |
//! |---|---|
//! | ask answered with a tensor / a single message | 200, `x-response-type: tensor` (PTM1 body) / `single` (+ `x-message-type`) |
//! | tell enqueued | 202 |
//! | handler error | 500 with its text |
//! | malformed body, bad `x-message-mode` | 400 |
//! | not `POST` | 405 |
//! | no such endpoint | 404 |
//! | over a limit (before the body is read when `content-length` says so) | 413 |
//! | not a tensor message (`x-message-type`) | 415 |
//! | body too slow | 408 |
//! | mailbox full past the enqueue deadline, receive budget used up, shutting down | 503 |

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use tensorwire_proto::WireError;
use tensorwire_proto::transport::{
    ActorPath, Delivery, InboundRequest, Reply, RequestKind, Responder, Withdraw,
};
use tokio::sync::mpsc;

use crate::http2::Shared;
use crate::http2::recv::{self, MinRate, RecvError};
use crate::http2::send_body::ChunkBody;
use crate::http2::wire::{self, Refusal};

/// Who is on the other end of a connection.
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    pub(crate) addr: SocketAddr,
    /// The name in its verified client certificate.
    pub(crate) identity: Option<String>,
}

/// Serves one request (hyper's service function).
pub(crate) async fn serve(
    shared: Arc<Shared>,
    peer: Peer,
    request: Request<Incoming>,
) -> Result<Response<ChunkBody>, Infallible> {
    let response = match answer(&shared, peer, request).await {
        Ok(response) => response,
        Err(refusal) => {
            tracing::debug!(status = %refusal.status, text = %refusal.text, "HTTP/2 request refused");
            text_response(refusal.status, refusal.text)
        }
    };
    Ok(response)
}

async fn answer(
    shared: &Shared,
    peer: Peer,
    request: Request<Incoming>,
) -> Result<Response<ChunkBody>, Refusal> {
    let (kind, declared, path) = match admit(shared, &request) {
        Ok(admitted) => admitted,
        Err(refusal) => {
            let small = wire::content_length(request.headers())
                .ok()
                .flatten()
                .is_some_and(|len| len <= DRAIN_BEFORE_REFUSING);
            if small && refusal.status != StatusCode::SERVICE_UNAVAILABLE {
                drain(request.into_body()).await;
            }
            return Err(refusal);
        }
    };
    let rate = MinRate {
        bytes_per_second: shared.session.min_rate,
        window: shared.session.rate_window,
    };
    let message = recv::receive(
        request.into_body(),
        declared,
        &*shared.memory,
        &shared.limits,
        rate,
    )
    .await
    .map_err(refusal)?;
    let mut inbound = InboundRequest::new(kind, path.as_str().to_owned(), message);
    inbound.peer = Some(peer.addr);
    inbound.identity = peer.identity;
    deliver(shared, inbound).await
}

/// A request body of at most this many bytes (by its `content-length`) is read before the
/// request is refused on its headers. Refusing first is allowed (the stream is then reset with
/// `NO_ERROR`), but clients that are still sending the body then may lose the response (curl
/// 7.88 reports no status at all, curl issue 22984); a small body costs little to read.
const DRAIN_BEFORE_REFUSING: u64 = 64 << 10;
/// The longest a refusal waits for that small body.
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_millis(200);

/// Reads and drops a small request body, for at most [`DRAIN_FOR`].
async fn drain(body: Incoming) {
    let limit = usize::try_from(DRAIN_BEFORE_REFUSING).unwrap_or(usize::MAX);
    let _ = tokio::time::timeout(DRAIN_FOR, Limited::new(body, limit).collect()).await;
}

/// What a request's headers say, or why it is refused before its body is read.
fn admit(
    shared: &Shared,
    request: &Request<Incoming>,
) -> Result<(RequestKind, Option<u64>, ActorPath), Refusal> {
    if shared.is_shut_down() {
        return Err(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the node is shutting down",
        ));
    }
    if request.method() != Method::POST {
        return Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "only POST is served",
        ));
    }
    let headers = request.headers();
    let kind = wire::mode(headers).map_err(|text| Refusal::new(StatusCode::BAD_REQUEST, text))?;
    if !wire::is_tensor(headers) {
        return Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "only tensor messages are served ({}: {})",
                wire::MESSAGE_TYPE,
                wire::TENSOR_MESSAGE_TYPE
            ),
        ));
    }
    let declared = wire::content_length(headers)
        .map_err(|text| Refusal::new(StatusCode::BAD_REQUEST, text))?;
    let path = ActorPath::parse(request.uri().path())
        .map_err(|e| Refusal::new(StatusCode::NOT_FOUND, e.to_string()))?;
    shared
        .inbound
        .admit(kind, path.as_str())
        .map_err(|text| Refusal::new(StatusCode::NOT_FOUND, text))?;
    Ok((kind, declared, path))
}

/// Hands the request to its endpoint and waits for what the caller should hear.
async fn deliver(shared: &Shared, request: InboundRequest) -> Result<Response<ChunkBody>, Refusal> {
    let (kind, path) = (request.kind, request.path.clone());
    let (tx, mut events) = mpsc::unbounded_channel();
    match shared
        .inbound
        .deliver(request, Box::new(HttpResponder { tx }))
    {
        Delivery::Enqueued => {}
        Delivery::Refused(text) => return Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, text)),
        Delivery::Waiting(withdraw) => {
            // Withdrawn if the caller goes away (this future is dropped) or the deadline passes.
            let mut waiting = Waiting(Some(withdraw));
            let timeout = shared.session.enqueue_timeout;
            match tokio::time::timeout(timeout, events.recv()).await {
                Ok(Some(Event::Enqueued)) => {}
                Ok(Some(Event::Answer(answer))) => {
                    waiting.0 = None;
                    return respond(shared, kind, answer);
                }
                Ok(None) => {
                    return Err(Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the endpoint closed",
                    ));
                }
                Err(_) if waiting.withdraw() => {
                    return Err(Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "the mailbox of {path} stayed full for {timeout:?}; the {} was not delivered",
                            kind.as_str()
                        ),
                    ));
                }
                Err(_) => {} // it got in meanwhile; its notice is on its way
            }
            waiting.0 = None;
        }
    }
    if kind == RequestKind::Tell {
        return Ok(empty_response(StatusCode::ACCEPTED));
    }
    loop {
        match events.recv().await {
            Some(Event::Enqueued) => {}
            Some(Event::Answer(answer)) => return respond(shared, kind, answer),
            None => {
                return Err(Refusal::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the endpoint dropped the request without an answer",
                ));
            }
        }
    }
}

fn respond(
    shared: &Shared,
    kind: RequestKind,
    answer: Result<Reply, String>,
) -> Result<Response<ChunkBody>, Refusal> {
    match answer {
        Err(text) => Err(Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, text)),
        Ok(_) if kind == RequestKind::Tell => Ok(empty_response(StatusCode::ACCEPTED)),
        Ok(Reply::Tensor(message)) => {
            let encoded =
                tensorwire_proto::ptm1::encode(&message, &shared.limits).map_err(|e| {
                    Refusal::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("cannot send the reply: {e}"),
                    )
                })?;
            let mut response = Response::new(ChunkBody::encoded(encoded));
            let headers = response.headers_mut();
            headers.insert(wire::RESPONSE_TYPE, HeaderValue::from_static("tensor"));
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static(wire::OCTET_STREAM),
            );
            Ok(response)
        }
        Ok(Reply::Single { msg_type, data }) => {
            let msg_type = HeaderValue::from_str(&msg_type).map_err(|_| {
                Refusal::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the reply's message type cannot be sent as an HTTP header value",
                )
            })?;
            let mut response = Response::new(ChunkBody::one(data));
            let headers = response.headers_mut();
            headers.insert(wire::RESPONSE_TYPE, HeaderValue::from_static("single"));
            headers.insert(wire::MESSAGE_TYPE, msg_type);
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static(wire::OCTET_STREAM),
            );
            Ok(response)
        }
    }
}

fn refusal(error: RecvError) -> Refusal {
    let status = match &error {
        RecvError::Wire(WireError::LimitExceeded(_)) => StatusCode::PAYLOAD_TOO_LARGE,
        RecvError::Wire(_) | RecvError::Length { .. } | RecvError::Broken(_) => {
            StatusCode::BAD_REQUEST
        }
        RecvError::Memory(_) => StatusCode::SERVICE_UNAVAILABLE,
        RecvError::Stalled(_) => StatusCode::REQUEST_TIMEOUT,
    };
    Refusal::new(status, error.to_string())
}

fn text_response(status: StatusCode, text: String) -> Response<ChunkBody> {
    let mut response = Response::new(ChunkBody::one(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn empty_response(status: StatusCode) -> Response<ChunkBody> {
    let mut response = Response::new(ChunkBody::empty());
    *response.status_mut() = status;
    response
}

/// What the endpoint tells a waiting request.
enum Event {
    Enqueued,
    Answer(Result<Reply, String>),
}

struct HttpResponder {
    tx: mpsc::UnboundedSender<Event>,
}

impl Responder for HttpResponder {
    fn enqueued(&self) {
        let _ = self.tx.send(Event::Enqueued);
    }

    fn respond(self: Box<Self>, answer: Result<Reply, String>) {
        let _ = self.tx.send(Event::Answer(answer));
    }
}

/// A request waiting for mailbox space; withdrawn when dropped still armed.
struct Waiting(Option<Box<dyn Withdraw>>);

impl Waiting {
    /// Withdraws it now: `true` if it was still waiting.
    fn withdraw(&mut self) -> bool {
        self.0.take().is_some_and(|withdraw| withdraw.withdraw())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(withdraw) = self.0.take() {
            withdraw.withdraw();
        }
    }
}
