//! The in-flight mode on a tensorwire node: `inflight` asks outstanding, each completion
//! sending the next one from its own callback (on the thread that completed it), as each of
//! the baselines' tasks sends its next ask when its reply is in. Nothing waits in line behind
//! a slow reply, and no thread in between hands replies on.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use tensorwire_engine::{Node, Reply, TensorMessage};

use crate::Options;
use crate::measure::{Sample, check_echo, min_round_trips};

/// Timed from the first send to the last reply, the window drained at the end: every ask
/// counted is an ask completed, and the window is refilled at least a few times.
pub(crate) fn measure(
    node: &Node,
    peer: SocketAddr,
    options: &Options,
    message: &TensorMessage,
    timeout: Duration,
) -> Result<Sample> {
    let total = message.total_bytes();
    // Warm-up, as in the sequential modes: connection set-up and first-touch memory are not
    // measured.
    match node
        .ask(peer, "/actors/echo", message.clone(), timeout)
        .wait()?
    {
        Reply::Tensor(reply) => check_echo(options, message, &reply)?,
        other => return Err(anyhow!("echo answered {other:?}")),
    }
    let first = options
        .messages
        .map_or(options.inflight as u64, |n| n.min(options.inflight as u64));
    let chain = Arc::new(Chain {
        node: node.clone(),
        peer,
        message: message.clone(),
        options: options.clone(),
        timeout,
        at_least: options.inflight as u64 + min_round_trips(total),
        started: Instant::now(),
        state: Mutex::new(State {
            sample: Sample {
                untimed_bytes: total,
                ..Sample::default()
            },
            sent: first,
            outstanding: first,
            error: None,
        }),
        drained: Condvar::new(),
    });
    for _ in 0..first {
        send(&chain);
    }
    let mut state = lock(&chain.state);
    // Each ask carries its own deadline, so every one of them completes by then.
    let limit = Instant::now() + options.duration + timeout + Duration::from_secs(10);
    while state.outstanding > 0 {
        let left = limit.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(anyhow!("an ask in flight outlived its deadline"));
        }
        state = chain
            .drained
            .wait_timeout(state, left)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
    let mut sample = std::mem::take(&mut state.sample);
    let error = state.error.take();
    drop(state);
    // The last callbacks let go of the chain (and its node) right after the last reply.
    while Arc::strong_count(&chain) > 1 {
        std::thread::yield_now();
    }
    if let Some(error) = error {
        return Err(error);
    }
    sample.elapsed = chain.started.elapsed();
    sample.verified = options.verify;
    Ok(sample)
}

struct Chain {
    node: Node,
    peer: SocketAddr,
    message: TensorMessage,
    options: Options,
    timeout: Duration,
    at_least: u64,
    started: Instant,
    state: Mutex<State>,
    drained: Condvar,
}

struct State {
    sample: Sample,
    sent: u64,
    outstanding: u64,
    /// The first failure: no ask is sent after it.
    error: Option<anyhow::Error>,
}

thread_local! {
    /// Whether this thread is sending an ask already, and the sends asked for meanwhile: an
    /// ask whose reply is there at once (in-process, or an error) runs its completion inside
    /// `send`, and the next send it asks for waits here instead of nesting one stack frame
    /// deeper per ask.
    static SENDING: RefCell<Option<Vec<Arc<Chain>>>> = const { RefCell::new(None) };
}

/// Sends one ask (and any asked for by completions that ran meanwhile on this thread).
fn send(chain: &Arc<Chain>) {
    let nested = SENDING.with(|sending| {
        let mut sending = sending.borrow_mut();
        match &mut *sending {
            Some(deferred) => {
                deferred.push(Arc::clone(chain));
                true
            }
            None => {
                *sending = Some(Vec::new());
                false
            }
        }
    });
    if nested {
        return;
    }
    let mut next = Some(Arc::clone(chain));
    while let Some(chain) = next {
        send_one(&chain);
        next = SENDING.with(|sending| sending.borrow_mut().as_mut().and_then(Vec::pop));
    }
    SENDING.with(|sending| *sending.borrow_mut() = None);
}

/// Sends one ask; its completion records it and sends the next while more are wanted.
fn send_one(chain: &Arc<Chain>) {
    let at = Instant::now();
    let next = Arc::clone(chain);
    chain
        .node
        .ask(
            chain.peer,
            "/actors/echo",
            chain.message.clone(),
            chain.timeout,
        )
        .detach(move |result| {
            let checked = match result {
                Ok(Reply::Tensor(reply)) => check_echo(&next.options, &next.message, &reply),
                Ok(other) => Err(anyhow!("echo answered {other:?}")),
                Err(e) => Err(e.into()),
            };
            let more = {
                let mut state = lock(&next.state);
                state.outstanding -= 1;
                match checked {
                    // Latency includes the ask's wait for its reply, from when it was sent.
                    Ok(()) => {
                        state.sample.record(at.elapsed());
                        state.sample.ops += 1;
                        state.sample.payload_bytes += next.message.total_bytes();
                    }
                    Err(e) => {
                        state.error.get_or_insert(e);
                    }
                }
                let more = state.error.is_none()
                    && next.options.more(next.started, state.sent, next.at_least);
                if more {
                    state.sent += 1;
                    state.outstanding += 1;
                } else if state.outstanding == 0 {
                    next.drained.notify_all();
                }
                more
            };
            if more {
                send(&next);
            }
        });
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
