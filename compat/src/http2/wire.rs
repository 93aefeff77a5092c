//! How a tensor request and its answer map onto HTTP/2, as the reference implementation does
//! (`POST` to the actor path, `x-message-mode`, `x-message-type`, `x-response-type`), plus the
//! statuses for the cases it leaves open.

use http::{HeaderMap, HeaderValue, StatusCode};
use tensorwire_proto::transport::RequestKind;

/// Ask or tell.
pub(crate) const MESSAGE_MODE: &str = "x-message-mode";
/// Marks a PTM1 body (requests), or names a single reply's message type (responses).
pub(crate) const MESSAGE_TYPE: &str = "x-message-type";
/// `tensor` (a PTM1 body) or `single` (raw data) on a 200 answer.
pub(crate) const RESPONSE_TYPE: &str = "x-response-type";
/// The value of `x-message-type` that marks a PTM1 body.
pub(crate) const TENSOR_MESSAGE_TYPE: &str = "__pulsing_tensor_message__";
/// The content type every body is sent with (the reference does not check it).
pub(crate) const OCTET_STREAM: &str = "application/octet-stream";

/// The request kind from `x-message-mode` (missing means ask, as in the reference).
pub(crate) fn mode(headers: &HeaderMap) -> Result<RequestKind, String> {
    let Some(value) = headers.get(MESSAGE_MODE) else {
        return Ok(RequestKind::Ask);
    };
    let text = value.to_str().unwrap_or_default().trim();
    if text.eq_ignore_ascii_case("ask") {
        Ok(RequestKind::Ask)
    } else if text.eq_ignore_ascii_case("tell") {
        Ok(RequestKind::Tell)
    } else {
        Err(format!(
            "{MESSAGE_MODE} must be ask or tell, not {:?}",
            String::from_utf8_lossy(value.as_bytes())
        ))
    }
}

/// The header value of a request kind.
pub(crate) fn mode_value(kind: RequestKind) -> HeaderValue {
    HeaderValue::from_static(match kind {
        RequestKind::Ask => "ask",
        RequestKind::Tell => "tell",
    })
}

/// Whether the request says its body is a PTM1 tensor message.
pub(crate) fn is_tensor(headers: &HeaderMap) -> bool {
    headers
        .get(MESSAGE_TYPE)
        .is_some_and(|v| v.as_bytes() == TENSOR_MESSAGE_TYPE.as_bytes())
}

/// The `content-length` a request declares, if any (`Err` if it is not a number).
pub(crate) fn content_length(headers: &HeaderMap) -> Result<Option<u64>, String> {
    let Some(value) = headers.get(http::header::CONTENT_LENGTH) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| "content-length is not a number".to_owned())
}

/// Why a request was refused, and the status that says so.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) text: String,
}

impl Refusal {
    pub(crate) fn new(status: StatusCode, text: impl Into<String>) -> Self {
        Self {
            status,
            text: text.into(),
        }
    }
}
