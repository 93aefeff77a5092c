//! Moving a session's bytes on a tokio socket: readiness, then one non-blocking vectored read
//! or write.

use std::io::{self, IoSlice, IoSliceMut};
use std::time::Instant;

use tensorwire_proto::session::{ReadBuf, Transmit};
use tokio::net::TcpStream;

/// Most slices one `readv`/`writev` takes.
const MAX_SLICES: usize = 1024;

/// What one readiness wait brought.
pub(crate) enum Ready {
    /// A read finished (bytes, end of stream, or an error); give the buffer back.
    Read(ReadBuf, io::Result<usize>),
    /// Some bytes of the transmit were written (it is given back unless finished).
    Wrote(usize),
    /// Writing failed.
    WriteFailed(io::Error),
    /// Spurious readiness: nothing happened.
    Nothing,
}

/// Waits until the socket can be read (if `read` is set) or written (if `transmit` is set),
/// then does one non-blocking step.
pub(crate) async fn step(
    stream: &TcpStream,
    read: &mut Option<ReadBuf>,
    transmit: &mut Option<Transmit>,
) -> Ready {
    let interest = match (read.is_some(), transmit.is_some()) {
        (true, true) => tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
        (true, false) => tokio::io::Interest::READABLE,
        (false, true) => tokio::io::Interest::WRITABLE,
        (false, false) => return std::future::pending().await,
    };
    let ready = match stream.ready(interest).await {
        Ok(ready) => ready,
        Err(e) => return Ready::WriteFailed(e),
    };
    if ready.is_readable() || ready.is_read_closed() {
        if let Some(mut buf) = read.take() {
            let result = {
                let mut slices: Vec<IoSliceMut<'_>> = buf
                    .regions()
                    .take(MAX_SLICES)
                    .map(IoSliceMut::new)
                    .collect();
                stream.try_read_vectored(&mut slices)
            };
            match result {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => *read = Some(buf),
                result => return Ready::Read(buf, result),
            }
        }
    }
    if ready.is_writable() || ready.is_write_closed() {
        let outcome = transmit.as_mut().map(|tx| {
            let slices: Vec<IoSlice<'_>> = tx
                .write_slices()
                .take(MAX_SLICES)
                .map(IoSlice::new)
                .collect();
            let result = stream.try_write_vectored(&slices);
            drop(slices);
            result.map(|n| (n, tx.advance(n)))
        });
        match outcome {
            Some(Ok((n, finished))) => {
                if finished {
                    *transmit = None;
                }
                return Ready::Wrote(n);
            }
            Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
            Some(Err(e)) => {
                *transmit = None;
                return Ready::WriteFailed(e);
            }
            None => {}
        }
    }
    Ready::Nothing
}

/// Sleeps until `deadline` (forever if there is none).
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
