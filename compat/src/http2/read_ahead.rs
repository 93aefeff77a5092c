//! A read buffer beneath rustls. rustls asks its transport for at most 4 KiB per read (the
//! read size of its deframer), so without one a 64 MiB body cost 16,384 `recvfrom` calls;
//! with one, a call takes what the socket holds, up to the buffer's size, and rustls's reads
//! are copies out of it. One-way TLS at 64 MiB, medians of 3 interleaved runs: 0.68 → 0.79
//! GB/s at 1 MiB; 256 KiB gave about half that gain, 4 MiB no more than 1 MiB
//! (`docs/benchmarks.md`).
//!
//! The buffer starts at 16 KiB and doubles only when a read filled it, up to 1 MiB: memory
//! grows with bytes that arrived, so a connection that only handshakes (or a peer that opens
//! many and sends little) costs 16 KiB each. Writes go through unbuffered: rustls already
//! writes its records in one vectored call.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The buffer's first size.
const FIRST: usize = 16 << 10;
/// The buffer's largest size.
const MAX: usize = 1 << 20;

/// `stream`, read through a buffer that grows with what arrives.
pub(crate) struct ReadAhead<S> {
    stream: S,
    buf: Vec<u8>,
    /// The unread bytes are `buf[at..end]`.
    at: usize,
    end: usize,
}

impl<S> ReadAhead<S> {
    pub(crate) fn new(stream: S) -> Self {
        Self {
            stream,
            buf: Vec::new(),
            at: 0,
            end: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at == this.end {
            if this.buf.is_empty() {
                this.buf.resize(FIRST, 0);
            }
            let mut fill = ReadBuf::new(&mut this.buf);
            ready!(Pin::new(&mut this.stream).poll_read(cx, &mut fill))?;
            let read = fill.filled().len();
            (this.at, this.end) = (0, read);
            if read == this.buf.len() && read < MAX {
                // The socket held at least as much as the buffer: let the next read take more.
                this.buf.resize((read * 2).min(MAX), 0);
            }
        }
        let n = (this.end - this.at).min(out.remaining());
        out.put_slice(&this.buf[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn every_byte_comes_through_in_order_and_the_buffer_grows_only_with_what_arrived() {
        let data: Vec<u8> = (0..3u32 << 20)
            .map(|i| u8::try_from(i % 251).unwrap())
            .collect();
        let mut reader = ReadAhead::new(&data[..]);
        let mut small = [0u8; 100];
        reader.read_exact(&mut small).await.unwrap();
        assert_eq!(&small[..], &data[..100]);
        assert_eq!(reader.buf.len(), 2 * FIRST, "the first read filled 16 KiB");
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, &data[100..]);
        assert_eq!(reader.buf.len(), MAX);

        let mut quiet = ReadAhead::new(&b"hello"[..]);
        let mut got = Vec::new();
        quiet.read_to_end(&mut got).await.unwrap();
        assert_eq!((got.as_slice(), quiet.buf.len()), (&b"hello"[..], FIRST));
    }
}
