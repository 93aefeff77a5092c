//! Whether a received body may be handed to the node: every shared part lies within a segment
//! the peer announced and this side mapped, and the message's counts and sizes are within the
//! limits. Parts returned to us by reference are checked by the driver against the lease book
//! (they name our memory, not the peer's).

use crate::LimitField;
use crate::shm::wire::{Body, Part, Shared};

use super::{PeerSegment, ShmConnection};

/// The text a request or reply gets when it names memory whose descriptor was lost here.
pub(super) const LOST: &str = "the receiver is at its descriptor limit: the shared memory \
                               holding the message could not be received";

/// What a body check found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Check {
    /// It may be handed on.
    Fine,
    /// It names a segment not announced (yet).
    Unknown(u64),
    /// It names a segment whose descriptor was lost here (it may have been announced again
    /// since, on the socket).
    Lost(u64),
    /// It is wrong (the text says how).
    Invalid(String),
}

impl ShmConnection {
    pub(super) fn check_body(&self, body: &Body) -> Check {
        match body {
            Body::Inline(_) | Body::InlineSlices(_) => Check::Fine,
            Body::Packed(shared) => self.check_shared(shared),
            Body::Parts {
                metadata, buffers, ..
            } => {
                let limits = &self.config.limits;
                if let Err(e) = limits.check(LimitField::BufferCount, buffers.len() as u64) {
                    return Check::Invalid(e.to_string());
                }
                if let Err(e) = limits.check(LimitField::MetadataBytes, part_len(metadata)) {
                    return Check::Invalid(e.to_string());
                }
                let total = buffers
                    .iter()
                    .try_fold(0u64, |sum, part| sum.checked_add(part_len(part)));
                let Some(total) = total else {
                    return Check::Invalid("the buffers' lengths overflow".into());
                };
                if let Err(e) = limits.check(LimitField::WireBytes, total) {
                    return Check::Invalid(e.to_string());
                }
                for part in std::iter::once(metadata).chain(buffers) {
                    if let Part::Shared(shared) = part {
                        let check = self.check_shared(shared);
                        if check != Check::Fine {
                            return check;
                        }
                    }
                }
                Check::Fine
            }
        }
    }

    fn check_shared(&self, shared: &Shared) -> Check {
        let segment = shared.segment;
        let len = match self.peer_segments.get(&segment) {
            Some(PeerSegment::Mapped { len }) => *len,
            Some(PeerSegment::Mapping { .. }) => return Check::Unknown(segment),
            None if self.lost.contains(&segment) => return Check::Lost(segment),
            None => return Check::Unknown(segment),
        };
        match shared.offset.checked_add(shared.len) {
            Some(end) if end <= len => Check::Fine,
            Some(end) => {
                Check::Invalid(format!("a part ends at byte {end} of a {len}-byte segment"))
            }
            None => Check::Invalid("a part's range overflows".into()),
        }
    }
}

fn part_len(part: &Part) -> u64 {
    match part {
        Part::Inline(bytes) => bytes.len() as u64,
        Part::Shared(shared) => shared.len,
        Part::Returned(returned) => returned.len,
    }
}
