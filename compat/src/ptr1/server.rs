//! Accepted connections on tokio: one task per connection drives its server session.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tensorwire_proto::session::{ServerEvent, ServerSession};
use tensorwire_proto::transport::{Delivery, Reply, Responder, Withdraw};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::ptr1::io::{self, Ready};
use crate::ptr1::{Shared, stopped};
use crate::socket_options;

/// Pause before accepting again after an error (for instance out of file descriptors).
const ACCEPT_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

pub(crate) async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut draining = shared.draining.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    socket_options::tune_accepted(&stream, &shared.session);
                    // Counted here, so a drain that starts now waits for it.
                    shared.serving.fetch_add(1, Ordering::AcqRel);
                    Shared::spawn(&shared, serve(Arc::clone(&shared), stream, peer));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; retrying in 100 ms");
                    tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                }
            },
            () = stopped(&mut shutdown) => return,
            () = stopped(&mut draining) => return,
        }
    }
}

/// What handlers send back to a connection's task.
enum Answer {
    Enqueued(u64),
    Reply(u64, Result<Reply, String>),
}

async fn serve(shared: Arc<Shared>, stream: TcpStream, peer: std::net::SocketAddr) {
    let _serving = Serving(Arc::clone(&shared));
    serve_connection(shared, stream, peer).await;
}

/// Counts a served connection (counted up by the accept loop) as open until dropped.
struct Serving(Arc<Shared>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.serving.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn serve_connection(shared: Arc<Shared>, mut stream: TcpStream, peer: std::net::SocketAddr) {
    shared.connections.fetch_add(1, Ordering::Relaxed);
    let mut session = ServerSession::new(
        Arc::clone(&shared.session),
        Arc::clone(&shared.memory),
        shared.require_tls,
        Instant::now(),
    )
    .with_stripes(shared.stripes.clone(), Some(peer));
    let (answers_tx, mut answers) = mpsc::unbounded_channel();
    let mut shutdown = shared.shutdown.subscribe();
    let mut draining = shared.draining.subscribe();
    let mut waiting: Option<(u64, Box<dyn Withdraw>)> = None;
    let mut read = None;
    let mut transmit = None;
    'connection: loop {
        let now = Instant::now();
        'settle: loop {
            while let Some(event) = session.poll_event() {
                match event {
                    ServerEvent::Admit { kind, path } => {
                        session.admit(shared.inbound.admit(kind, &path), now);
                    }
                    ServerEvent::Request { seq, mut request } => {
                        request.peer = Some(peer);
                        let responder = Box::new(TaskResponder {
                            answers: answers_tx.clone(),
                            seq,
                        });
                        match shared.inbound.deliver(request, responder) {
                            Delivery::Enqueued => session.handle_enqueued(seq, now),
                            Delivery::Waiting(withdraw) => waiting = Some((seq, withdraw)),
                            Delivery::Refused(text) => session.handle_answer(seq, Err(text), now),
                        }
                    }
                    ServerEvent::Withdraw { seq } => {
                        // Without a handle the request already got in (its Enqueued is on its way).
                        let withdrawn = waiting
                            .take_if(|(s, _)| *s == seq)
                            .is_some_and(|(_, withdraw)| withdraw.withdraw());
                        session.handle_withdrawn(seq, withdrawn, now);
                    }
                    ServerEvent::ShutdownWrite => {
                        let _ = stream.shutdown().await;
                    }
                    ServerEvent::Close(reason) => {
                        tracing::debug!(%reason, %peer, "closing a server connection");
                        break 'connection;
                    }
                    ServerEvent::HandOff { preface } => {
                        hand_off(&shared, stream, preface);
                        shared.connections.fetch_sub(1, Ordering::Relaxed);
                        return;
                    }
                    _ => {}
                }
            }
            // Answers sent already (a handler that answered at once): taken before the transmit,
            // so the replies to a pipelining client's requests that are ready go out together.
            let mut answered = false;
            while let Ok(answer) = answers.try_recv() {
                answered = true;
                apply(&mut session, &mut waiting, answer);
            }
            if !answered {
                break 'settle;
            }
        }
        if transmit.is_none() {
            transmit = session.poll_transmit(now);
        }
        if read.is_none() {
            read = session.poll_read();
        }
        let deadline = session.poll_timeout();
        tokio::select! {
            ready = io::step(&stream, &mut read, &mut transmit) => match ready {
                Ready::Read(buf, result) => session.handle_read(buf, result, Instant::now()),
                Ready::Wrote(n) => session.handle_written(n, Instant::now()),
                Ready::WriteFailed(e) => session.handle_write_error(e),
                Ready::Nothing => {}
            },
            answer = answers.recv() => {
                if let Some(answer) = answer {
                    apply(&mut session, &mut waiting, answer);
                }
            }
            () = io::sleep_until(deadline) => session.handle_timeout(Instant::now()),
            () = stopped(&mut shutdown) => session.shut_down(),
            () = stopped(&mut draining), if !session.is_finishing() => {
                session.finish(Instant::now());
            }
        }
    }
    if let Some((_, withdraw)) = waiting {
        withdraw.withdraw();
    }
    shared.connections.fetch_sub(1, Ordering::Relaxed);
}

/// A handler's word on a request: in the mailbox, or its answer.
fn apply(
    session: &mut ServerSession,
    waiting: &mut Option<(u64, Box<dyn Withdraw>)>,
    answer: Answer,
) {
    match answer {
        Answer::Enqueued(seq) => {
            if waiting.as_ref().is_some_and(|(s, _)| *s == seq) {
                *waiting = None;
            }
            session.handle_enqueued(seq, Instant::now());
        }
        Answer::Reply(seq, answer) => session.handle_answer(seq, answer, Instant::now()),
    }
}

fn hand_off(shared: &Shared, stream: TcpStream, preface: Vec<u8>) {
    let Some(handoff) = &shared.handoff else {
        return;
    };
    match stream.into_std() {
        Ok(stream) => {
            let _ = stream.set_nonblocking(false);
            handoff.hand_off(stream, preface);
        }
        Err(e) => tracing::warn!(error = %e, "cannot hand off a connection; closed"),
    }
}

/// Answers one request served by a connection task, from whichever thread answers it.
struct TaskResponder {
    answers: mpsc::UnboundedSender<Answer>,
    seq: u64,
}

impl Responder for TaskResponder {
    fn enqueued(&self) {
        let _ = self.answers.send(Answer::Enqueued(self.seq));
    }

    fn respond(self: Box<Self>, answer: Result<Reply, String>) {
        let _ = self.answers.send(Answer::Reply(self.seq, answer));
    }
}
