//! Receiving PTR1 frames: heads through per-connection scratch, payload straight into final
//! memory, committed a bounded window ahead of the bytes that arrived.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use crate::body::Body;
use crate::config::SessionConfig;
use crate::error::{Format, WireError};
use crate::head::{FixedHeader, fixed_len};
use crate::len::{le_u32, len_u64};
use crate::ptr1::Frame;
use crate::session::read_buf::Lent;
use crate::session::read_buf::ReadBuf;
use crate::transport::{ReceiveMemory, RecvBuffer};

mod received;
mod scratch;
mod window;

pub(crate) use received::{Received, RecvError};

enum Stage {
    /// A server connection's first four bytes are not checked yet.
    Preface,
    /// Reading a fixed header and length table (the table grows as its bytes arrive).
    Head {
        fixed: Option<FixedHeader>,
        table: Vec<u8>,
    },
    /// Reading the path (through scratch: at most 64 KiB).
    Path(Body<RecvBuffer>),
    /// Head and path are in; waiting for `admit` or `refuse`.
    Admission(Body<RecvBuffer>),
    /// Reading the payload. `None` while lent to the driver.
    Body(Option<Body<RecvBuffer>>),
    /// Skipping the rest of a refused frame.
    Discard { remaining: u64 },
    /// Discarding everything until the peer closes (after an error reply).
    Drain,
    /// Closed or failed: nothing more is received.
    Done,
}

/// One connection's receiving side.
pub(crate) struct Receiver {
    config: Arc<SessionConfig>,
    memory: Arc<dyn ReceiveMemory>,
    /// `None` while lent to the driver. Bytes `start..end` are received and not consumed.
    scratch: Option<Box<[u8]>>,
    start: usize,
    end: usize,
    stage: Stage,
    /// While set, buffered bytes are not parsed (a request is being answered).
    held: bool,
    /// The peer finished sending (a read returned 0).
    eof: bool,
    /// A read failed; reported once the buffered bytes are parsed.
    read_error: Option<io::Error>,
    /// Bytes of the current frame consumed so far (head included); 0 between frames.
    frame_bytes: u64,
    /// Whether `Started` was reported for the current frame.
    started: bool,
    /// Version field of the current frame, once its header parsed.
    version: Option<u32>,
    /// Budget charged for the current frame's memory (filled and exposed).
    charged: u64,
    /// Memory lent for the current frame's sections, used in order before `memory` is asked
    /// (a stripe's parts of its request's buffers).
    lent: VecDeque<RecvBuffer>,
    /// The last read filled scratch to its end.
    scratch_filled: bool,
    /// Frames finished since scratch was last lent for a read.
    frames_since_read: u32,
}

impl Receiver {
    /// `preface`: the first four bytes must be `PTR1` (a server connection).
    pub(crate) fn new(
        config: Arc<SessionConfig>,
        memory: Arc<dyn ReceiveMemory>,
        preface: bool,
    ) -> Self {
        let scratch = vec![0; config.scratch_len.max(fixed_len(Format::Ptr1))].into_boxed_slice();
        Self {
            config,
            memory,
            scratch: Some(scratch),
            start: 0,
            end: 0,
            stage: if preface { Stage::Preface } else { head() },
            held: false,
            eof: false,
            read_error: None,
            frame_bytes: 0,
            started: false,
            version: None,
            charged: 0,
            lent: VecDeque::new(),
            scratch_filled: false,
            frames_since_read: 0,
        }
    }

    /// Memory for the next read, if a read is wanted now.
    pub(crate) fn poll_read(&mut self) -> Option<ReadBuf> {
        if self.eof || self.read_error.is_some() {
            return None;
        }
        let quantum = self.config.progress_quantum();
        let small_rest = self.small_rest();
        let inner = match &mut self.stage {
            Stage::Done | Stage::Admission(_) => return None,
            // The rest of a small body comes through scratch with whatever follows it (the
            // next requests of a client that pipelines) in the same read.
            Stage::Body(None) => return None,
            Stage::Body(body)
                if self.start == self.end
                    && body.as_ref().is_some_and(|b| b.remaining() > small_rest) =>
            {
                let body = body.take()?;
                if body.exposed_unfilled() == 0 {
                    self.stage = Stage::Body(Some(body));
                    return None;
                }
                Lent::Body(body)
            }
            // Bytes of a next frame are buffered while a request is answered: no read until
            // they are parsed, so they are never inside memory lent to the driver when parsing
            // resumes.
            _ if self.held && self.start < self.end => return None,
            _ => {
                self.grow_scratch_if_pipelined();
                self.frames_since_read = 0;
                let mut buf = self.scratch.take()?;
                if self.start > 0 {
                    buf.copy_within(self.start..self.end, 0);
                    self.end -= self.start;
                    self.start = 0;
                }
                if self.end == buf.len() {
                    self.scratch = Some(buf);
                    return None; // full (held bytes): the peer waits
                }
                Lent::Scratch {
                    buf,
                    from: self.end,
                }
            }
        };
        Some(ReadBuf { inner, quantum })
    }

    /// Takes back the memory of a read and what it brought: `Ok(n)` bytes (0 = the peer
    /// finished sending) or the error.
    pub(crate) fn handle_read(&mut self, buf: ReadBuf, result: io::Result<usize>) {
        let n = match result {
            Ok(0) => {
                self.eof = true;
                0
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                0
            }
            Err(e) => {
                self.read_error = Some(e);
                0
            }
        };
        match buf.inner {
            Lent::Scratch { buf, from } => {
                self.end = (from + n).min(buf.len());
                self.scratch_filled = n > 0 && self.end == buf.len();
                self.scratch = Some(buf);
            }
            Lent::Body(mut body) => {
                let advanced = body
                    .advance(n.min(usize::try_from(body.exposed_unfilled()).unwrap_or(usize::MAX)));
                self.frame_bytes += len_u64(n);
                self.stage = Stage::Body(Some(body));
                if let Err(e) = advanced {
                    self.fail_now(e.into());
                }
            }
        }
    }

    /// Parses what has arrived; returns the next thing worth knowing, or `None` when more
    /// bytes (or a decision) are needed.
    pub(crate) fn next(&mut self) -> Option<Received> {
        loop {
            if self.held && matches!(self.stage, Stage::Head { .. } | Stage::Preface) {
                return None; // no new frame is started while a request is being answered
            }
            let available = self.end - self.start;
            match &mut self.stage {
                Stage::Done | Stage::Admission(_) | Stage::Body(None) => return None,
                Stage::Preface => {
                    if available < 4 {
                        return self.need_more();
                    }
                    let scratch = self.scratch.as_deref()?;
                    if &scratch[self.start..self.start + 4] != b"PTR1" {
                        let bytes = scratch[self.start..self.end].to_vec();
                        self.stage = Stage::Done;
                        return Some(Received::ForeignPreface(bytes));
                    }
                    self.stage = head();
                }
                Stage::Head { .. } if available == 0 => return self.need_more(),
                Stage::Head { .. } if !self.started => {
                    self.started = true;
                    return Some(Received::Started);
                }
                Stage::Head { .. } => {
                    if let Some(event) = self.parse_head() {
                        return Some(event);
                    }
                    if matches!(self.stage, Stage::Head { .. }) {
                        return self.need_more();
                    }
                }
                Stage::Path(body) => {
                    if body.path().is_none() {
                        if available == 0 {
                            return self.need_more();
                        }
                        let left = body.layout().path_len()
                            - usize::try_from(body.received()).unwrap_or(usize::MAX);
                        let scratch = self.scratch.as_deref()?;
                        let input = &scratch[self.start..self.start + available.min(left)];
                        // The path is never allocated through the allocator.
                        let no_alloc = &mut |_| Err(WireError::from(crate::Misuse::DecoderFailed));
                        match body.fill(input, no_alloc) {
                            Ok(n) => {
                                self.start += n;
                                self.frame_bytes += len_u64(n);
                            }
                            Err(e) => return Some(self.fail_now(e.into())),
                        }
                        continue;
                    }
                    let Stage::Path(body) = std::mem::replace(&mut self.stage, Stage::Done) else {
                        return None;
                    };
                    let kind = body.layout().kind()?;
                    let version = body.layout().version();
                    let extension = body.layout().extension();
                    self.stage = Stage::Admission(body);
                    return Some(Received::Routed {
                        kind,
                        version,
                        extension,
                    });
                }
                Stage::Body(Some(_)) => {
                    if let Some(event) = self.fill_body() {
                        return Some(event);
                    }
                    if self.start == self.end {
                        return self.prepare_window().or_else(|| self.need_more());
                    }
                }
                Stage::Discard { remaining } => {
                    let skip = usize::try_from(*remaining).map_or(available, |r| r.min(available));
                    self.start += skip;
                    *remaining -= len_u64(skip);
                    if *remaining > 0 {
                        return self.need_more();
                    }
                    self.end_frame();
                    return Some(Received::Skipped);
                }
                Stage::Drain => {
                    self.start = self.end;
                    return self.need_more();
                }
            }
        }
    }

    /// Continue receiving the frame whose `Routed` was reported.
    pub(crate) fn admit(&mut self) {
        if let Stage::Admission(body) = std::mem::replace(&mut self.stage, Stage::Done) {
            self.stage = Stage::Body(Some(body));
        }
    }

    /// Continue receiving the frame whose `Routed` was reported into `sections`: its
    /// non-empty sections (metadata, then each buffer) take them in order, and only the ones
    /// beyond come from the receive memory. Each must be exactly its section's length.
    pub(crate) fn admit_into(&mut self, sections: Vec<RecvBuffer>) {
        self.lent = sections.into();
        self.admit();
    }

    /// The layout of the frame waiting for admission.
    pub(crate) fn layout(&self) -> Option<&crate::head::Layout> {
        match &self.stage {
            Stage::Admission(body) => Some(body.layout()),
            _ => None,
        }
    }

    /// Skip the rest of the frame whose `Routed` was reported, without committing memory.
    pub(crate) fn refuse(&mut self) {
        if let Stage::Admission(body) = std::mem::replace(&mut self.stage, Stage::Done) {
            self.stage = Stage::Discard {
                remaining: body.remaining(),
            };
        }
    }

    /// From now on everything received is discarded (after an error reply).
    pub(crate) fn drain(&mut self) {
        self.release();
        self.held = false;
        self.stage = Stage::Drain;
    }

    /// Stops (or resumes) starting new frames; reads still go into scratch while it has room,
    /// and the rest of a frame being skipped is still skipped.
    pub(crate) fn hold(&mut self, held: bool) {
        self.held = held;
    }

    /// The path of the frame waiting for admission.
    pub(crate) fn path(&self) -> Option<&str> {
        match &self.stage {
            Stage::Admission(body) => body.path(),
            _ => None,
        }
    }

    /// Whether the peer finished sending or the socket failed (seen even while held).
    pub(crate) fn peer_gone(&self) -> bool {
        self.eof || self.read_error.is_some()
    }

    /// Whether reading failed (a reset): the peer is gone for good.
    pub(crate) fn read_failed(&self) -> bool {
        self.read_error.is_some()
    }

    /// Whether nothing of a next frame has arrived (no buffered bytes, no frame started).
    pub(crate) fn is_between_frames(&self) -> bool {
        self.start == self.end && self.frame_bytes == 0 && matches!(self.stage, Stage::Head { .. })
    }

    /// Whether no byte of a frame (or of the preface) has arrived since the last frame.
    pub(crate) fn has_nothing_started(&self) -> bool {
        self.is_between_frames() || (self.start == self.end && matches!(self.stage, Stage::Preface))
    }

    fn parse_head(&mut self) -> Option<Received> {
        let limits = self.config.limits;
        let scratch = self.scratch.as_deref()?;
        let Stage::Head { fixed, table } = &mut self.stage else {
            return None;
        };
        let available = &scratch[self.start..self.end];
        let fixed_header = match fixed {
            Some(fixed) => *fixed,
            None => {
                if available.len() < ptr1_fixed() {
                    return None;
                }
                let header = &available[..ptr1_fixed()];
                if &header[..4] == b"PTR1" {
                    self.version = Some(le_u32(&header[8..12]));
                }
                let parsed = match FixedHeader::parse(Format::Ptr1, header, &limits) {
                    Ok(parsed) => parsed,
                    Err(e) => return Some(self.fail_now(e.into())),
                };
                self.start += ptr1_fixed();
                self.frame_bytes += len_u64(ptr1_fixed());
                *fixed = Some(parsed);
                parsed
            }
        };
        let table_len = match fixed_header.table_len() {
            Ok(len) => len,
            Err(e) => return Some(self.fail_now(e.into())),
        };
        let available = &scratch[self.start..self.end];
        let layout = if table.is_empty() && available.len() >= table_len {
            // The common case: the whole table is in scratch.
            let layout = fixed_header.layout(&available[..table_len], &limits);
            self.start += table_len;
            self.frame_bytes += len_u64(table_len);
            layout
        } else {
            // A table longer than what arrived (up to 8 × the buffer limit): its memory grows
            // with the bytes that arrive.
            let take = (table_len - table.len()).min(available.len());
            table.extend_from_slice(&available[..take]);
            self.start += take;
            self.frame_bytes += len_u64(take);
            if table.len() < table_len {
                return None;
            }
            fixed_header.layout(table, &limits)
        };
        match layout {
            Ok(layout) => {
                self.stage = Stage::Path(Body::new(layout));
                None
            }
            Err(e) => Some(self.fail_now(e.into())),
        }
    }

    /// Copies payload bytes that arrived in scratch into place; reports the frame once it is
    /// complete.
    fn fill_body(&mut self) -> Option<Received> {
        let available = self.end - self.start;
        let Stage::Body(Some(body)) = &mut self.stage else {
            return None;
        };
        if available > 0 && !body.is_complete() {
            let take = usize::try_from(body.remaining()).map_or(available, |r| r.min(available));
            let exposed = body.received() + body.exposed_unfilled();
            let grow = (body.received() + len_u64(take)).saturating_sub(exposed);
            if grow > 0 && !self.memory.charge(grow) {
                let text = self.budget_text(grow);
                return Some(self.fail_now(RecvError::Memory(text)));
            }
            self.charged += grow;
            let memory = Arc::clone(&self.memory);
            let lent = &mut self.lent;
            let scratch = self.scratch.as_deref()?;
            let input = &scratch[self.start..self.start + take];
            let Stage::Body(Some(body)) = &mut self.stage else {
                return None;
            };
            match body.fill(input, &mut |len| allocate(&*memory, lent, len)) {
                Ok(n) => {
                    self.start += n;
                    self.frame_bytes += len_u64(n);
                }
                Err(e) => return Some(self.fail_now(e)),
            }
        }
        let Stage::Body(Some(body)) = &self.stage else {
            return None;
        };
        if body.is_complete() {
            return self.finish();
        }
        None
    }

    fn finish(&mut self) -> Option<Received> {
        let Stage::Body(Some(body)) = std::mem::replace(&mut self.stage, head()) else {
            return None;
        };
        let wire_len = len_u64(body.layout().head_len()) + body.received();
        let version = self.version;
        self.end_frame();
        Some(match Frame::from_body(body) {
            Ok(frame) => Received::Frame { frame, wire_len },
            Err(e) => Received::Failed {
                error: e.into(),
                version,
            },
        })
    }

    /// What to report when no more bytes are buffered: the peer's close or the read error.
    fn need_more(&mut self) -> Option<Received> {
        if let Some(e) = self.read_error.take() {
            return Some(self.fail_now(RecvError::Io(e)));
        }
        if !self.eof {
            return None;
        }
        let mid_frame = self.frame_bytes > 0
            || self.start < self.end
            || !matches!(
                self.stage,
                Stage::Head { .. } | Stage::Drain | Stage::Preface
            );
        if mid_frame && !matches!(self.stage, Stage::Drain) {
            let received = self.frame_bytes + len_u64(self.end - self.start);
            return Some(self.fail_now(RecvError::Truncated { received }));
        }
        self.stage = Stage::Done;
        self.release();
        Some(Received::Closed)
    }

    fn fail_now(&mut self, error: RecvError) -> Received {
        self.stage = Stage::Done;
        self.release();
        self.lent.clear();
        Received::Failed {
            error,
            version: self.version,
        }
    }

    fn end_frame(&mut self) {
        self.frames_since_read = self.frames_since_read.saturating_add(1);
        self.release();
        self.lent.clear();
        self.frame_bytes = 0;
        self.started = false;
        self.version = None;
        if !matches!(self.stage, Stage::Done) {
            self.stage = head();
        }
    }

    fn release(&mut self) {
        if self.charged > 0 {
            self.memory.release(self.charged);
            self.charged = 0;
        }
    }

    fn budget_text(&self, bytes: u64) -> String {
        format!(
            "cannot commit {bytes} more bytes of receive memory now: frames still arriving may \
             hold at most {} bytes",
            self.memory.budget()
        )
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.release();
    }
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("buffered", &(self.end - self.start))
            .field("frame_bytes", &self.frame_bytes)
            .field("held", &self.held)
            .field("eof", &self.eof)
            .finish_non_exhaustive()
    }
}

/// Memory for a section of `len` bytes: the next lent one, else from `memory`.
pub(super) fn allocate(
    memory: &dyn ReceiveMemory,
    lent: &mut VecDeque<RecvBuffer>,
    len: usize,
) -> Result<RecvBuffer, RecvError> {
    match lent.pop_front() {
        Some(mut section) => {
            if section.as_mut().len() == len {
                Ok(section)
            } else {
                Err(RecvError::Memory(
                    "lent receive memory does not fit its section".to_owned(),
                ))
            }
        }
        None => memory.allocate(len).map_err(RecvError::from),
    }
}

fn head() -> Stage {
    Stage::Head {
        fixed: None,
        table: Vec::new(),
    }
}

const fn ptr1_fixed() -> usize {
    fixed_len(Format::Ptr1)
}
