//! The requests one connection carries and still owes an answer for, with their deadlines.
//! Ids are per connection: a reply is matched only against requests that went out on the
//! connection it came on, so nobody else's connection can answer them.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use crate::fast_hash::FastHash;
use crate::transport::RequestKind;

/// Requests waiting for their answer.
#[derive(Debug, Default)]
pub struct Outstanding {
    /// By this side's own ids (a peer's id is only looked up).
    waiting: HashMap<u64, Waiting, FastHash>,
    deadlines: BTreeSet<(Instant, u64)>,
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    kind: RequestKind,
    deadline: Option<Instant>,
}

impl Outstanding {
    /// Request `id` of `kind` went out and waits until `deadline`.
    pub fn insert(&mut self, id: u64, kind: RequestKind, deadline: Option<Instant>) {
        if let Some(at) = deadline {
            self.deadlines.insert((at, id));
        }
        if let Some(old) = self.waiting.insert(id, Waiting { kind, deadline }) {
            self.forget_deadline(id, old.deadline);
        }
    }

    /// Request `id` is answered (or given up): its kind, if it was waiting.
    pub fn remove(&mut self, id: u64) -> Option<RequestKind> {
        let waiting = self.waiting.remove(&id)?;
        self.forget_deadline(id, waiting.deadline);
        Some(waiting.kind)
    }

    /// The kind of request `id`, if it waits.
    pub fn kind(&self, id: u64) -> Option<RequestKind> {
        self.waiting.get(&id).map(|w| w.kind)
    }

    /// Removes and returns the requests whose deadline is not after `now`.
    pub fn expired(&mut self, now: Instant) -> Vec<(u64, RequestKind)> {
        let mut out = Vec::new();
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(waiting) = self.waiting.remove(&id) {
                out.push((id, waiting.kind));
            }
        }
        out
    }

    /// The earliest deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    /// Removes and returns every waiting request (the connection closed).
    pub fn drain(&mut self) -> Vec<(u64, RequestKind)> {
        self.deadlines.clear();
        let mut all: Vec<_> = self.waiting.drain().map(|(id, w)| (id, w.kind)).collect();
        all.sort_unstable_by_key(|&(id, _)| id);
        all
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    fn forget_deadline(&mut self, id: u64, deadline: Option<Instant>) {
        if let Some(at) = deadline {
            self.deadlines.remove(&(at, id));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn requests_expire_in_deadline_order_and_only_once() {
        let now = Instant::now();
        let mut sut = Outstanding::default();
        sut.insert(1, RequestKind::Ask, Some(now + Duration::from_secs(2)));
        sut.insert(2, RequestKind::Tell, Some(now + Duration::from_secs(1)));
        sut.insert(3, RequestKind::Ask, None);
        assert_eq!(sut.next_deadline(), Some(now + Duration::from_secs(1)));
        assert_eq!(sut.expired(now), vec![]);
        assert_eq!(
            sut.expired(now + Duration::from_secs(2)),
            vec![(2, RequestKind::Tell), (1, RequestKind::Ask)]
        );
        assert_eq!(sut.expired(now + Duration::from_secs(9)), vec![]);
        assert_eq!(sut.len(), 1, "the one without a deadline waits");
        assert_eq!(sut.next_deadline(), None);
    }

    #[test]
    fn an_answered_request_no_longer_expires() {
        let now = Instant::now();
        let mut sut = Outstanding::default();
        sut.insert(1, RequestKind::Ask, Some(now));
        assert_eq!(sut.remove(1), Some(RequestKind::Ask));
        assert_eq!(sut.remove(1), None);
        assert_eq!(sut.expired(now), vec![]);
        assert!(sut.is_empty());
    }
}
