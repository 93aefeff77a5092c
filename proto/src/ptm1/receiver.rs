//! Receiving one PTM1 body from chunks (HTTP/2 DATA frames) straight into final memory, with
//! a pause after the head so the caller can check it (against `content-length`, a receive
//! budget) before any payload memory is asked for.

use crate::body::{Body, ReceiveBuffer};
use crate::error::{Format, Malformed, Misuse, WireError};
use crate::head::{HeadDecoder, Layout};
use crate::len::len_u64;
use crate::limits::Limits;
use crate::message::TensorMessage;

/// A PTM1 body arriving in chunks.
///
/// [`BodyReceiver::push`] takes bytes up to the end of the head and stops there
/// ([`Pushed::head`] is the layout, once); later calls copy payload into memory from the
/// allocator, which is asked for a section only when its first byte arrives, so nothing is
/// committed for lengths the peer declared but did not send.
#[derive(Debug)]
pub struct BodyReceiver<B> {
    limits: Limits,
    state: State<B>,
}

/// What one [`BodyReceiver::push`] did.
#[derive(Debug)]
#[non_exhaustive]
pub struct Pushed {
    /// Bytes taken from the chunk: all of it, unless the head completed (push the rest again)
    /// or the body did (the rest is trailing garbage).
    pub consumed: usize,
    /// The body's layout, the one time the head completes.
    pub head: Option<Layout>,
}

#[derive(Debug)]
enum State<B> {
    Head(HeadDecoder),
    Body(Body<B>),
    /// The message, and the body's length.
    Done(TensorMessage, u64),
    /// An error was returned; further input is refused.
    Failed,
}

impl<B: ReceiveBuffer> BodyReceiver<B> {
    /// A receiver checking against `limits`.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            state: State::Head(HeadDecoder::new(Format::Ptm1)),
        }
    }

    /// Takes the next bytes of the body.
    ///
    /// # Errors
    ///
    /// Malformed input or limits as soon as they can be seen; [`Malformed::TrailingBytes`] for
    /// bytes after the end of the message; whatever `alloc` returns. After an error every call
    /// fails with [`Misuse::DecoderFailed`].
    pub fn push<E: From<WireError>>(
        &mut self,
        chunk: &[u8],
        alloc: &mut impl FnMut(usize) -> Result<B, E>,
    ) -> Result<Pushed, E> {
        let state = std::mem::replace(&mut self.state, State::Failed);
        let (state, pushed) = match state {
            State::Failed => return Err(WireError::from(Misuse::DecoderFailed).into()),
            State::Head(mut head) => {
                let (consumed, layout) = head.push(chunk, &self.limits)?;
                match layout {
                    Some(layout) if layout.body_len() == 0 => {
                        let wire_len = layout.wire_len();
                        let message = finish(Body::<B>::new(layout.clone()))?;
                        let head = Some(layout);
                        (State::Done(message, wire_len), Pushed { consumed, head })
                    }
                    Some(layout) => {
                        let body = Body::new(layout.clone());
                        let head = Some(layout);
                        (State::Body(body), Pushed { consumed, head })
                    }
                    None => (
                        State::Head(head),
                        Pushed {
                            consumed,
                            head: None,
                        },
                    ),
                }
            }
            State::Body(mut body) => {
                let consumed = body.fill(chunk, alloc)?;
                let state = if body.is_complete() {
                    let wire_len = body.layout().wire_len();
                    State::Done(finish(body)?, wire_len)
                } else {
                    State::Body(body)
                };
                (
                    state,
                    Pushed {
                        consumed,
                        head: None,
                    },
                )
            }
            State::Done(message, wire_len) if chunk.is_empty() => (
                State::Done(message, wire_len),
                Pushed {
                    consumed: 0,
                    head: None,
                },
            ),
            State::Done(_, expected) => {
                return Err(WireError::from(Malformed::TrailingBytes {
                    format: Format::Ptm1,
                    expected,
                    extra: len_u64(chunk.len()),
                })
                .into());
            }
        };
        self.state = state;
        Ok(pushed)
    }

    /// The layout, once the head has arrived.
    pub fn layout(&self) -> Option<&Layout> {
        match &self.state {
            State::Body(body) => Some(body.layout()),
            _ => None,
        }
    }

    /// Whether the whole message has arrived.
    pub fn is_complete(&self) -> bool {
        matches!(self.state, State::Done(..))
    }

    /// Ends the body and returns the message.
    ///
    /// # Errors
    ///
    /// [`Malformed::Truncated`] if the body ended before the message did;
    /// [`Misuse::DecoderFailed`] after an error.
    pub fn finish(self) -> Result<TensorMessage, WireError> {
        match self.state {
            State::Done(message, _) => Ok(message),
            State::Head(head) => Err(Malformed::Truncated {
                format: Format::Ptm1,
                expected: head.expected_len(),
                received: len_u64(head.buffered()),
            }
            .into()),
            State::Body(body) => Err(Malformed::Truncated {
                format: Format::Ptm1,
                expected: body.layout().wire_len(),
                received: len_u64(body.layout().head_len()) + body.received(),
            }
            .into()),
            State::Failed => Err(Misuse::DecoderFailed.into()),
        }
    }
}

fn finish<B: ReceiveBuffer>(body: Body<B>) -> Result<TensorMessage, WireError> {
    super::message_from_body(body)
}

#[cfg(test)]
#[path = "receiver_tests.rs"]
mod tests;
