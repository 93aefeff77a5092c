//! Answers to requests sent within the process, straight into a `Pending`.

use std::sync::{Arc, Mutex};

use tensorwire_proto::transport::{Error, Reply, Responder};

use crate::pending::{Completer, schedule_timer};
use crate::sync::lock;

/// A request's result slot, shared with the sender: whichever side settles it first takes
/// the completer (the sender completes a tell at once when the mailbox takes it directly, and
/// fails a request the node refused).
pub(crate) type SharedCompleter<T> = Arc<Mutex<Option<Completer<T>>>>;

/// Where the answer to an in-process request goes.
pub(crate) enum LocalResponder {
    /// The asker's result.
    Ask(SharedCompleter<Reply>),
    /// A tell's result.
    Tell(SharedCompleter<()>),
}

impl Responder for LocalResponder {
    fn enqueued(&self) {
        if let Self::Tell(slot) = self {
            if let Some(completer) = take(slot) {
                // Completing wakes the sender's task or thread: not under the mailbox's lock.
                schedule_timer(
                    std::time::Instant::now(),
                    Box::new(move || completer.complete(Ok(()))),
                );
            }
        }
    }

    fn respond(self: Box<Self>, answer: Result<Reply, String>) {
        let remote = |text| Error::Remote { peer: None, text };
        match *self {
            Self::Ask(slot) => {
                if let Some(completer) = take(&slot) {
                    completer.complete(answer.map_err(remote));
                }
            }
            Self::Tell(slot) => {
                if let Some(completer) = take(&slot) {
                    completer.complete(answer.map(|_| ()).map_err(remote));
                }
            }
        }
    }
}

fn take<T>(slot: &SharedCompleter<T>) -> Option<Completer<T>> {
    lock(slot).take()
}
