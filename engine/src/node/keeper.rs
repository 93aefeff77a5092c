//! A driver for the node's unit tests that only keeps what it is handed.

use std::sync::Mutex;

use tensorwire_proto::transport::{Driver, Outbound, OutboundRequest};

use crate::sync::lock;

/// A driver that keeps every request it is handed.
#[derive(Default)]
pub(super) struct Keeper {
    pub(super) sent: Mutex<Vec<OutboundRequest>>,
}

impl Outbound for Keeper {
    fn send(&self, request: OutboundRequest) {
        lock(&self.sent).push(request);
    }
}

impl Driver for Keeper {
    fn name(&self) -> &'static str {
        "keeper"
    }

    fn shutdown(&self) {}
}
