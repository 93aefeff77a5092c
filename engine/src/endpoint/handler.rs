//! Running user handlers: on handler threads that take requests from the mailbox, or on the
//! thread that received the request. A panicking handler answers with an error and keeps
//! serving.

use std::sync::Arc;
use std::thread::JoinHandle;

use tensorwire_proto::transport::{Error, Reply};

use crate::endpoint::{Mailbox, Request};
use crate::panics::panic_text;

/// A request handler: its result answers an ask (`Err(text)` reaches the asker as a remote
/// error); for a tell it is ignored.
pub(crate) type Handler = dyn Fn(Request) -> Result<Reply, String> + Send + Sync;

/// Runs `handler`, turning a panic into an error answer.
pub(crate) fn run(handler: &Handler, request: Request) -> Result<Reply, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(request))).unwrap_or_else(
        |panic| {
            let text = panic_text(&*panic);
            tracing::warn!(
                panic = text,
                "a request handler panicked; answering with an error"
            );
            Err(format!("handler panicked: {text}"))
        },
    )
}

/// Starts `threads` threads that serve `mailbox` with `handler` until it closes.
pub(crate) fn spawn_handler_threads(
    name: &str,
    mailbox: &Arc<Mailbox>,
    handler: &Arc<Handler>,
    threads: usize,
) -> Result<Vec<JoinHandle<()>>, Error> {
    (0..threads.max(1))
        .map(|i| {
            let mailbox = Arc::clone(mailbox);
            let handler = Arc::clone(handler);
            std::thread::Builder::new()
                .name(format!("tensorwire-handler-{name}-{i}"))
                .spawn(move || {
                    while let Ok(Some(incoming)) = mailbox.pop(None) {
                        let (request, replier) = incoming.into_parts();
                        replier.reply(run(&*handler, request));
                    }
                })
                .map_err(|e| Error::io("spawning a handler thread", e))
        })
        .collect()
}
