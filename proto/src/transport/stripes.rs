//! The receiving side of striping ([`crate::stripe`]): the stripes of each striped request,
//! received on any connections of a node into parts of one allocation per cut buffer, until
//! the request itself arrives and takes them. It lives beside the seam because every driver
//! gets it through [`super::DriverSetup`] and hands it to its server sessions.
//!
//! Shared by every server session of a node (whichever thread or core runs it). A stripe frame
//! claims its parts when its head is in ([`StripeStore::claim`]); each part is marked done
//! when the frame completes, and a part dropped before that (the connection failed, the frame
//! was refused) fails the whole request: its assembly is removed, and the request, when it
//! comes, is answered with an Error and never delivered. The request takes the assembly
//! ([`StripeStore::take`]) and gets each cut buffer as one [`Bytes`], joined without a copy.
//!
//! Bounds: at most [`MAX_ASSEMBLIES`] requests' stripes at once, at most
//! [`MAX_ASSEMBLIES_PER_PEER`] of them and a wire limit's worth of bytes
//! ([`Limits::max_wire_bytes`]) begun by one peer host; once [`ASSEMBLY_TTL`] has passed since
//! a request's first stripe, a new stripe of it is taken only if its stripes brought at least
//! [`MIN_ASSEMBLY_RATE`] bytes for every second past that (else it fails the request: a peer
//! cannot keep an assembly alive by sending a small new stripe now and then, while stripes
//! that wait for a connection behind their request's others, which move bytes meanwhile, are
//! taken); a request has at most
//! [`MAX_CUT_BUFFERS`] cut buffers, each at an index a message can have; the bytes of completed
//! parts are charged to the node's receive budget until their request takes them, and given
//! back whichever way the assembly goes; an assembly with no stripe arriving and no request for
//! [`ASSEMBLY_TTL`] is dropped with its memory.

use std::collections::HashMap;
use std::net::IpAddr;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::memory::{ReceiveMemory, RecvBuffer, RecvStorage};
use super::split::JoinStorage;
use crate::len::len_u64;
use crate::limits::Limits;
use crate::stripe::{
    BufferPlace, Capabilities, MAX_CUT_BUFFERS, StripeDescriptor, StripedHeader, Token, part,
};

/// Most striped requests whose stripes a node holds at once.
pub const MAX_ASSEMBLIES: usize = 1024;
/// Most striped requests whose stripes a node holds at once for one peer host (the one whose
/// stripe began them), so that one peer cannot take every place.
pub const MAX_ASSEMBLIES_PER_PEER: usize = 64;
/// How long stripes wait for their request once none is arriving any more; also how long after
/// a request's first stripe the others may begin without having moved bytes.
pub const ASSEMBLY_TTL: Duration = Duration::from_secs(30);
/// Bytes per second a request's stripes must have brought on average, counted from
/// [`ASSEMBLY_TTL`] after its first, for a new stripe of it to be taken (the default minimum
/// rate of a connection, `SessionConfig::min_rate`).
pub const MIN_ASSEMBLY_RATE: u64 = 64 << 10;

/// Most stripes a node takes per request, by default.
pub const DEFAULT_MAX_STRIPES: u16 = 16;

/// The stripes a node holds, by request.
pub struct StripeStore {
    memory: Arc<dyn ReceiveMemory>,
    limits: Limits,
    max_stripes: u16,
    inner: Arc<Mutex<Assemblies>>,
}

impl std::fmt::Debug for StripeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripeStore")
            .field("max_stripes", &self.max_stripes)
            .field("assemblies", &lock(&self.inner).by_token.len())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Assemblies {
    by_token: HashMap<Token, Assembly>,
    memory: Option<Arc<dyn ReceiveMemory>>,
}

struct Assembly {
    /// The host whose stripe began it (its bytes count against that host's bound).
    peer: IpAddr,
    /// When its first stripe came.
    created: Instant,
    count: u16,
    /// Cut buffers by their index in the request.
    buffers: HashMap<u32, CutBuffer>,
    /// Bytes of every cut buffer so far (bounded by the wire limit).
    total: u64,
    /// Parts claimed and neither done nor dropped.
    active: usize,
    /// Since when nothing arrives (seen by a sweep).
    idle_since: Option<Instant>,
    /// Budget charged for parts that are done.
    charged: u64,
    /// Bytes of the parts that are done.
    received: u64,
}

impl Assembly {
    fn new(peer: IpAddr, created: Instant, count: u16) -> Self {
        Self {
            peer,
            created,
            count,
            buffers: HashMap::new(),
            total: 0,
            active: 0,
            idle_since: None,
            charged: 0,
            received: 0,
        }
    }
}

struct CutBuffer {
    len: usize,
    /// Parts not claimed yet, by stripe number (`None`: claimed, or empty).
    unclaimed: Vec<Option<RecvBuffer>>,
    /// Parts done, by stripe number (empty parts count as done).
    done: Vec<bool>,
    joiner: Option<Box<dyn JoinStorage>>,
}

impl StripeStore {
    /// A store receiving into `memory`, checking against `limits`, taking at most
    /// `max_stripes` (2..=[`crate::stripe::MAX_STRIPES`]) per request.
    pub fn new(memory: Arc<dyn ReceiveMemory>, limits: Limits, max_stripes: u16) -> Self {
        let inner = Assemblies {
            by_token: HashMap::new(),
            memory: Some(Arc::clone(&memory)),
        };
        Self {
            memory,
            limits,
            max_stripes: max_stripes.clamp(2, crate::stripe::MAX_STRIPES),
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    /// What this node tells a peer that asks for its capabilities.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_stripes: self.max_stripes,
        }
    }

    /// Requests whose stripes are held now.
    pub fn len(&self) -> usize {
        lock(&self.inner).by_token.len()
    }

    /// Whether no stripes are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memory for the parts of one stripe frame, in the order of its buffers. Each is to
    /// be filled and then frozen (which marks it done); dropping one unfrozen fails its
    /// request.
    ///
    /// # Errors
    ///
    /// A text for the peer: too many stripes or requests (for the node, or begun by `peer`),
    /// a stripe that begins too long after its request's first, a part claimed twice, lengths
    /// or buffers that do not agree with earlier stripes or the limits, or no memory.
    pub fn claim(
        &self,
        descriptor: &StripeDescriptor,
        peer: IpAddr,
        now: Instant,
    ) -> Result<Vec<RecvBuffer>, String> {
        if descriptor.count > self.max_stripes {
            return Err(format!(
                "{} stripes is more than this node takes ({})",
                descriptor.count, self.max_stripes
            ));
        }
        let mut inner = lock(&self.inner);
        let expired = inner.sweep(now);
        let begun = inner.begun(descriptor.token, peer, now, &self.limits);
        let claimed = begun.and_then(|room| {
            let assembly = inner
                .by_token
                .entry(descriptor.token)
                .or_insert_with(|| Assembly::new(peer, now, descriptor.count));
            claim_parts(assembly, descriptor, room, &*self.memory, &self.limits)
        });
        let parts = match claimed {
            Ok(parts) => parts,
            Err(text) => {
                // A stripe that cannot be received fails its request.
                let failed = inner.remove(descriptor.token);
                drop(inner);
                drop((failed, expired));
                return Err(text);
            }
        };
        assembly_active(&mut inner, descriptor.token, parts.len());
        drop(inner);
        drop(expired);
        let home = Arc::downgrade(&self.inner);
        Ok(parts
            .into_iter()
            .map(|(buffer, mut inner)| {
                let len = inner.as_mut().len();
                RecvBuffer::new(Piece {
                    inner: Some(inner),
                    len,
                    home: home.clone(),
                    token: descriptor.token,
                    buffer,
                    index: descriptor.index,
                })
            })
            .collect())
    }

    /// Takes the stripes of a striped request: its cut buffers, in order, each one
    /// [`Bytes`] of the memory its parts were received into.
    ///
    /// # Errors
    ///
    /// A text for the peer if stripes are missing, failed, expired or do not match the header.
    pub fn take(&self, header: &StripedHeader, now: Instant) -> Result<Vec<Bytes>, String> {
        let mut inner = lock(&self.inner);
        let expired = inner.sweep(now);
        let assembly = inner.remove(header.token);
        drop(inner);
        drop(expired);
        let Some(mut assembly) = assembly else {
            return Err(
                "the stripes of this striped request are missing (one failed, or they \
                        expired): it was not delivered"
                    .to_owned(),
            );
        };
        let cut = header
            .buffers
            .iter()
            .enumerate()
            .filter_map(|(i, place)| match place {
                BufferPlace::Cut(len) => Some((i, *len)),
                BufferPlace::Inline => None,
            });
        let mut out = Vec::new();
        let mut used = 0;
        for (index, len) in cut {
            let buffer = u32::try_from(index)
                .ok()
                .and_then(|i| assembly.buffers.remove(&i));
            let Some(mut buffer) = buffer.filter(|b| len_u64(b.len) == len) else {
                return Err(format!(
                    "buffer {index} of this striped request did not arrive as stripes"
                ));
            };
            used += 1;
            if assembly.count != header.count || buffer.done.iter().any(|done| !done) {
                return Err(format!(
                    "a stripe of buffer {index} of this striped request is missing"
                ));
            }
            let joined = buffer.joiner.take().map(JoinStorage::join);
            match joined {
                Some(Ok(bytes)) => out.push(bytes),
                _ => {
                    return Err(format!(
                        "a stripe of buffer {index} of this striped request is still arriving"
                    ));
                }
            }
        }
        if used == 0 || !assembly.buffers.is_empty() {
            return Err("the stripes do not match this striped request".to_owned());
        }
        Ok(out)
    }

    /// Drops the assemblies nothing arrived for in [`ASSEMBLY_TTL`] (call now and then; the
    /// store also sweeps on every claim and take).
    pub fn sweep(&self, now: Instant) {
        let expired = lock(&self.inner).sweep(now);
        drop(expired);
    }
}

/// Finds or creates each cut buffer of the descriptor and takes this stripe's part of it; new
/// cut buffers hold at most `room` bytes together (what the peer's bound leaves).
fn claim_parts(
    assembly: &mut Assembly,
    descriptor: &StripeDescriptor,
    mut room: u64,
    memory: &dyn ReceiveMemory,
    limits: &Limits,
) -> Result<Vec<(u32, RecvBuffer)>, String> {
    if assembly.count != descriptor.count {
        return Err("stripes of one request disagree on their count".to_owned());
    }
    let count = descriptor.count;
    let index = usize::from(descriptor.index);
    let mut parts = Vec::with_capacity(descriptor.pieces.len());
    for piece in &descriptor.pieces {
        let len = usize::try_from(piece.buffer_len).map_err(|_| "buffer too long".to_owned())?;
        if !assembly.buffers.contains_key(&piece.buffer) {
            if u64::from(piece.buffer) >= limits.max_buffers()
                || assembly.buffers.len() >= MAX_CUT_BUFFERS
            {
                return Err(format!(
                    "buffer {} cannot be a cut buffer of a request (at most {} buffers, {} cut)",
                    piece.buffer,
                    limits.max_buffers(),
                    MAX_CUT_BUFFERS
                ));
            }
            let total = assembly.total.saturating_add(piece.buffer_len);
            if total > limits.max_wire_bytes() {
                return Err(format!(
                    "the stripes of one request hold more than the wire limit of {} bytes",
                    limits.max_wire_bytes()
                ));
            }
            room = room.checked_sub(piece.buffer_len).ok_or_else(|| {
                format!(
                    "the stripes this peer began hold more than the wire limit of {} bytes",
                    limits.max_wire_bytes()
                )
            })?;
            let ranges: Vec<Range<usize>> = (0..count)
                .map(|k| part(len, count, k))
                .filter(|range| !range.is_empty())
                .collect();
            let split = memory
                .allocate_split(len, &ranges)
                .map_err(|e| e.to_string())?;
            let mut parts = split.parts.into_iter();
            let unclaimed = (0..count)
                .map(|k| {
                    (!part(len, count, k).is_empty())
                        .then(|| parts.next())
                        .flatten()
                })
                .collect::<Vec<_>>();
            let done = unclaimed.iter().map(Option::is_none).collect();
            assembly.total = total;
            assembly.buffers.insert(
                piece.buffer,
                CutBuffer {
                    len,
                    unclaimed,
                    done,
                    joiner: Some(split.joiner),
                },
            );
        }
        let Some(buffer) = assembly.buffers.get_mut(&piece.buffer) else {
            return Err("internal: a cut buffer vanished".to_owned());
        };
        if buffer.len != len {
            return Err(format!(
                "stripes of one request disagree on the length of buffer {}",
                piece.buffer
            ));
        }
        let part = buffer.unclaimed.get_mut(index).and_then(Option::take);
        let Some(part) = part else {
            return Err(format!(
                "stripe {index} of buffer {} arrived twice",
                piece.buffer
            ));
        };
        parts.push((piece.buffer, part));
    }
    Ok(parts)
}

fn assembly_active(inner: &mut Assemblies, token: Token, parts: usize) {
    if let Some(assembly) = inner.by_token.get_mut(&token) {
        assembly.active += parts;
        assembly.idle_since = None;
    }
}

impl Assemblies {
    /// Removes what expired; returned, to be dropped outside the lock.
    fn sweep(&mut self, now: Instant) -> Vec<Assembly> {
        let mut expired = Vec::new();
        let tokens: Vec<Token> = self
            .by_token
            .iter_mut()
            .filter_map(|(token, assembly)| {
                if assembly.active > 0 {
                    return None;
                }
                let since = *assembly.idle_since.get_or_insert(now);
                now.checked_duration_since(since)
                    .is_some_and(|idle| idle >= ASSEMBLY_TTL)
                    .then_some(*token)
            })
            .collect();
        for token in tokens {
            expired.extend(self.remove(token));
        }
        expired
    }

    /// Takes a request's assembly out, giving its budget back: the one way an assembly goes.
    fn remove(&mut self, token: Token) -> Option<Assembly> {
        let mut assembly = self.by_token.remove(&token)?;
        if let Some(memory) = &self.memory {
            memory.release(std::mem::take(&mut assembly.charged));
        }
        Some(assembly)
    }

    /// Whether a stripe of `token` from `peer` may claim parts now: `Ok` with the bytes new
    /// cut buffers may add for the peer that began its assembly, or why not.
    fn begun(
        &self,
        token: Token,
        peer: IpAddr,
        now: Instant,
        limits: &Limits,
    ) -> Result<u64, String> {
        let owner = match self.by_token.get(&token) {
            Some(assembly) => {
                let late = now
                    .saturating_duration_since(assembly.created)
                    .saturating_sub(ASSEMBLY_TTL);
                let owed = u64::try_from(
                    late.as_millis()
                        .saturating_mul(u128::from(MIN_ASSEMBLY_RATE))
                        / 1000,
                )
                .unwrap_or(u64::MAX);
                if !late.is_zero() && assembly.received < owed {
                    return Err(format!(
                        "this stripe began {} s after its request's first, whose stripes brought \
                         {} bytes since (at least {MIN_ASSEMBLY_RATE} bytes/s after {} s)",
                        now.saturating_duration_since(assembly.created).as_secs(),
                        assembly.received,
                        ASSEMBLY_TTL.as_secs()
                    ));
                }
                assembly.peer
            }
            None => {
                if self.by_token.len() >= MAX_ASSEMBLIES {
                    return Err(format!(
                        "this node holds the stripes of {MAX_ASSEMBLIES} requests already"
                    ));
                }
                let held = self.by_token.values().filter(|a| a.peer == peer).count();
                if held >= MAX_ASSEMBLIES_PER_PEER {
                    return Err(format!(
                        "this node holds the stripes of {MAX_ASSEMBLIES_PER_PEER} requests from \
                         {peer} already"
                    ));
                }
                peer
            }
        };
        let bytes: u64 = self
            .by_token
            .values()
            .filter(|a| a.peer == owner)
            .map(|a| a.total)
            .sum();
        Ok(limits.max_wire_bytes().saturating_sub(bytes))
    }

    /// Part `index` of `buffer` of `token` is filled.
    fn done(&mut self, token: Token, buffer: u32, index: u16, len: usize) {
        let Some(assembly) = self.by_token.get_mut(&token) else {
            return;
        };
        assembly.active = assembly.active.saturating_sub(1);
        assembly.received = assembly.received.saturating_add(len_u64(len));
        let charged = self
            .memory
            .as_ref()
            .is_some_and(|memory| memory.charge(len_u64(len)));
        if charged {
            assembly.charged += len_u64(len);
        }
        let marked = assembly
            .buffers
            .get_mut(&buffer)
            .and_then(|b| b.done.get_mut(usize::from(index)))
            .map(|done| *done = true)
            .is_some();
        if !charged || !marked {
            // Over the receive budget (or inconsistent): the request fails.
            self.fail(token);
        }
    }

    /// The request's stripes failed: its assembly goes.
    fn fail(&mut self, token: Token) {
        drop(self.remove(token));
    }
}

/// One stripe's part of a cut buffer, lent to the session receiving the stripe.
struct Piece {
    inner: Option<RecvBuffer>,
    len: usize,
    home: Weak<Mutex<Assemblies>>,
    token: Token,
    buffer: u32,
    index: u16,
}

impl RecvStorage for Piece {
    fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.inner {
            Some(inner) => inner.as_mut(),
            None => &mut [],
        }
    }

    fn prepare(&mut self, range: Range<usize>) {
        if let Some(inner) = &mut self.inner {
            crate::ReceiveBuffer::prepare(inner, range);
        }
    }

    fn committed(&self) -> usize {
        self.inner
            .as_ref()
            .map_or(0, crate::ReceiveBuffer::committed)
    }

    /// The part is filled: it is marked done and handed back; a part alone freezes into
    /// nothing (its bytes reach the request through [`StripeStore::take`]).
    fn freeze(mut self: Box<Self>) -> Bytes {
        if self.inner.take().is_none() {
            return Bytes::new();
        }
        // Handed back (above) before the request may join the buffer.
        if let Some(home) = self.home.upgrade() {
            lock(&home).done(self.token, self.buffer, self.index, self.len);
        }
        Bytes::new()
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        if self.inner.take().is_some() {
            // Dropped unfilled: the stripe failed, and so does its request.
            if let Some(home) = self.home.upgrade() {
                let failed = lock(&home).remove(self.token);
                drop(failed);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
#[path = "stripes_tests.rs"]
mod tests;
