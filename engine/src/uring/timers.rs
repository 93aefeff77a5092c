//! A core's connection deadlines: one entry per connection at most, ordered, removed exactly
//! when the deadline moves (no stale entries, no linear scans).

use std::collections::BTreeSet;
use std::time::Instant;

use crate::uring::conn::ConnKey;

#[derive(Default)]
pub(crate) struct Timers {
    set: BTreeSet<(Instant, ConnKey)>,
}

impl Timers {
    /// Moves `key`'s deadline from `old` to `new`.
    pub(crate) fn update(&mut self, key: ConnKey, old: Option<Instant>, new: Option<Instant>) {
        if old == new {
            return;
        }
        if let Some(at) = old {
            self.set.remove(&(at, key));
        }
        if let Some(at) = new {
            self.set.insert((at, key));
        }
    }

    pub(crate) fn next(&self) -> Option<Instant> {
        self.set.first().map(|&(at, _)| at)
    }

    /// The next connection whose deadline passed by `now` (its entry is removed).
    pub(crate) fn pop_expired(&mut self, now: Instant) -> Option<ConnKey> {
        let &(at, key) = self.set.first()?;
        if at > now {
            return None;
        }
        self.set.pop_first();
        Some(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.set.len()
    }
}
