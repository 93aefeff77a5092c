//! Requests queued on a connection that fails before a byte of them was handed out: handed
//! back whole to go another way (once), never failed for a fault they could not have met.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pair::{Pair, ask, feed, message, peer};
use crate::Limits;
use crate::ptr1::{self, Frame};
use crate::session::{ClientEvent, ClientSession, CloseReason, RequestToken, SessionConfig};
use crate::transport::{Answer, Error, HeapMemory, ReceiveMemory, Reply, RequestKind};

/// A frame larger than what the client coalesces, so the request behind it stays queued
/// while it is written.
const LARGE: usize = 600 << 10;

/// A pair whose server refuses requests of more than one buffer at their head (and then
/// drains and closes the connection), with a pipe small enough that a large frame is still
/// being written when the refusal comes back.
fn refusing_pair() -> Pair {
    let server = SessionConfig {
        limits: Limits::builder().max_buffers(1).build(),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with_configs(SessionConfig::default(), server);
    sut.pipe_capacity = 16 << 10;
    sut
}

/// Whether `event` fails its request (rather than answering it or handing it back).
fn fails(event: &ClientEvent) -> bool {
    matches!(
        event,
        ClientEvent::Done {
            outcome: Err(_),
            ..
        }
    )
}

/// Starts, on a [`refusing_pair`], an ask of two buffers (refused) of [`LARGE`] bytes.
fn start_refused(sut: &mut Pair) -> RequestToken {
    sut.start(
        RequestKind::Ask,
        message(&[LARGE / 2, LARGE / 2]),
        Duration::from_secs(30),
    )
}

#[test]
fn a_request_queued_behind_one_the_peer_refused_is_handed_back_and_answered_elsewhere() {
    let mut sut = refusing_pair();
    let refused = start_refused(&mut sut);
    let queued = sut.start(RequestKind::Ask, message(&[8]), Duration::from_secs(30));
    sut.drive();
    assert_eq!(
        sut.done_tokens,
        vec![refused],
        "only the refused one has an outcome"
    );
    assert!(sut.done[0].as_ref().unwrap_err().remote_text().is_some());
    assert!(matches!(sut.client_closed, Some(CloseReason::ErrorReply)));
    assert!(sut.requests.is_empty(), "the server saw nothing of either");
    let (token, request) = sut.unsent.pop().expect("the queued request is handed back");
    assert_eq!(token, queued);
    assert!(request.was_given_back());
    assert_eq!(request.kind(), RequestKind::Ask);

    // The same request on another connection: answered as if nothing had happened.
    let mut elsewhere = Pair::new();
    elsewhere.start_request(request);
    elsewhere.drive();
    let Some(Ok(Answer::Reply(Reply::Tensor(reply)))) = elsewhere.done.pop() else {
        panic!("{:?}", elsewhere.done)
    };
    assert_eq!(reply.buffers[0].len(), 8);
}

#[test]
fn a_request_handed_back_once_fails_the_second_time() {
    let mut first = refusing_pair();
    start_refused(&mut first);
    first.start(RequestKind::Ask, message(&[8]), Duration::from_secs(30));
    first.drive();
    let (_, request) = first.unsent.pop().expect("handed back once");

    let mut second = refusing_pair();
    start_refused(&mut second);
    let again = second.start_request(request);
    second.drive();
    assert!(second.unsent.is_empty(), "not handed back a second time");
    assert_eq!(second.done_tokens.last(), Some(&again));
    assert!(
        matches!(
            second.done.last(),
            Some(Err(Error::ConnectionClosed { .. }))
        ),
        "{:?}",
        second.done
    );
}

#[test]
fn a_write_failure_fails_the_request_being_written_and_hands_back_the_one_behind() {
    let (mut client, writing, behind) = writing_one_with_one_behind();
    let now = Instant::now();
    client.handle_write_error(std::io::ErrorKind::BrokenPipe.into(), now);
    // The read decides: the peer closed without a word.
    let buf = client.poll_read().expect("a read is armed");
    client.handle_read(buf, Ok(0), now);
    let mut events = std::iter::from_fn(|| client.poll_event());
    assert!(matches!(
        events.next(),
        Some(ClientEvent::Done { token, outcome: Err(Error::ConnectionClosed { .. }) })
            if token == writing
    ));
    assert!(matches!(
        events.next(),
        Some(ClientEvent::Unsent { token, .. }) if token == behind
    ));
    assert!(matches!(events.next(), Some(ClientEvent::Close(_))));
    assert!(events.next().is_none());
}

#[test]
fn nothing_is_handed_back_while_the_node_shuts_down() {
    let (mut client, _, _) = writing_one_with_one_behind();
    client.shut_down();
    let events: Vec<_> = std::iter::from_fn(|| client.poll_event()).collect();
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(
        matches!(
            events[0],
            ClientEvent::Done {
                outcome: Err(Error::Shutdown),
                ..
            }
        ),
        "{events:?}"
    );
    assert!(
        fails(&events[1]),
        "failed with the one being written, not handed back: {events:?}"
    );
    assert!(matches!(
        events[2],
        ClientEvent::Close(CloseReason::Shutdown)
    ));
}

#[test]
fn requests_of_a_connection_that_never_opened_fail_rather_than_try_again() {
    let now = Instant::now();
    let memory: Arc<dyn ReceiveMemory> = Arc::new(HeapMemory::new(1 << 20));
    let config = Arc::new(SessionConfig::default());
    let mut client = ClientSession::connecting(config, memory, peer(), now);
    client.start(ask(8, now), now).unwrap();
    client.start(ask(8, now), now).unwrap();
    client.handle_connect_error(std::io::ErrorKind::ConnectionRefused.into());
    let events: Vec<_> = std::iter::from_fn(|| client.poll_event()).collect();
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(
        matches!(
            events[0],
            ClientEvent::Done {
                outcome: Err(Error::Connect { .. }),
                ..
            }
        ),
        "{events:?}"
    );
    assert!(fails(&events[1]), "failed, not handed back: {events:?}");
}

#[test]
fn a_request_given_up_on_while_queued_is_neither_handed_back_nor_answered_twice() {
    let mut sut = refusing_pair();
    start_refused(&mut sut);
    let cancelled = sut.start(RequestKind::Ask, message(&[8]), Duration::from_secs(30));
    let kept = sut.start(RequestKind::Ask, message(&[9]), Duration::from_secs(30));
    sut.step(); // the refused one's frame begins to go out; the two behind it wait
    sut.client.cancel(cancelled);
    sut.drive();
    assert_eq!(
        sut.unsent.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        vec![kept]
    );
    assert_eq!(
        sut.done_tokens.iter().filter(|t| **t == cancelled).count(),
        1,
        "one outcome: cancelled"
    );
}

/// A client session with a frame larger than a coalesced transmit being written and a small
/// request queued behind it: (session, the large one, the small one).
fn writing_one_with_one_behind() -> (ClientSession, RequestToken, RequestToken) {
    let now = Instant::now();
    let memory: Arc<dyn ReceiveMemory> = Arc::new(HeapMemory::new(1 << 20));
    let mut client = ClientSession::connected(Arc::new(SessionConfig::default()), memory, peer());
    let large = client.start(ask(LARGE, now), now).unwrap();
    let small = client.start(ask(8, now), now).unwrap();
    client.poll_transmit(now).expect("the large frame");
    (client, large, small)
}

fn reply(n: usize) -> Vec<u8> {
    ptr1::encode(&Frame::TensorResponse(message(&[n])), &Limits::default())
        .unwrap()
        .to_vec()
}

#[test]
fn a_reply_for_a_request_never_sent_is_not_delivered_and_the_request_is_handed_back() {
    // The peer answers the frame being written (it may: a coalesced write's end can still be
    // on its way), then sends one more reply, for a request it was never sent.
    let (mut client, large, small) = writing_one_with_one_behind();
    let now = Instant::now();
    feed(&mut client, &reply(30), now);
    feed(&mut client, &reply(40), now);
    let events: Vec<_> = std::iter::from_fn(|| client.poll_event()).collect();
    assert!(
        matches!(&events[0], ClientEvent::Done { token, outcome: Ok(_) } if *token == large),
        "{events:?}"
    );
    assert!(
        matches!(&events[1], ClientEvent::Unsent { token, .. } if *token == small),
        "the forged reply is not its outcome: {events:?}"
    );
    assert!(matches!(
        events[2],
        ClientEvent::Close(CloseReason::OutOfStep)
    ));
    assert_eq!(events.len(), 3);
}

#[test]
fn a_write_failure_once_everything_written_is_answered_ends_the_connection_at_once() {
    let (mut client, large, small) = writing_one_with_one_behind();
    let now = Instant::now();
    feed(&mut client, &reply(30), now); // answered while its last bytes were on their way
    client.handle_write_error(std::io::ErrorKind::BrokenPipe.into(), now);
    let events: Vec<_> = std::iter::from_fn(|| client.poll_event()).collect();
    assert!(matches!(&events[0], ClientEvent::Done { token, .. } if *token == large));
    assert!(
        matches!(&events[1], ClientEvent::Unsent { token, .. } if *token == small),
        "not left waiting for its deadline: {events:?}"
    );
    assert!(matches!(events[2], ClientEvent::Close(CloseReason::Io(_))));
    assert!(client.is_closed());
}

#[test]
fn a_reply_head_that_stalls_fails_the_request_it_answers_and_hands_back_those_not_sent() {
    let (mut client, large, small) = writing_one_with_one_behind();
    let now = Instant::now();
    feed(&mut client, &reply(30)[..3], now); // three bytes of a head, then nothing
    let at = client.poll_timeout().expect("the head's deadline");
    assert!(
        at < now + Duration::from_secs(30),
        "before the requests' own"
    );
    client.handle_timeout(at);
    let events: Vec<_> = std::iter::from_fn(|| client.poll_event()).collect();
    assert!(
        matches!(&events[0], ClientEvent::Done { token, outcome: Err(e) } if *token == large && e.is_timeout()),
        "{events:?}"
    );
    assert!(matches!(&events[1], ClientEvent::Unsent { token, .. } if *token == small));
}
