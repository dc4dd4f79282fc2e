//! A byte-stream view of a connection: tokio's `AsyncRead` and `AsyncWrite`.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::connection::{Connection, RecvHalf, SendHalf};

/// A [`Connection`] as a byte stream, so that `tokio_util::codec` framing and existing
/// protocols run over RDMA unchanged.
///
/// Writes are cut into messages of at most the connection's maximum size; reads concatenate
/// messages, so boundaries are not kept. `poll_flush` returns at once: written bytes are
/// posted in order (a write waits for a send slot and a credit) and delivered unless the
/// connection is lost. `poll_shutdown` sends the
/// close message; the peer reads EOF after everything written.
///
/// ```no_run
/// use futures_util::SinkExt;
/// use tokio_util::codec::{Framed, LengthDelimitedCodec};
///
/// # async fn f(conn: evchan::Connection) -> std::io::Result<()> {
/// let mut framed = Framed::new(evchan::Stream::new(conn), LengthDelimitedCodec::new());
/// framed.send(bytes::Bytes::from_static(b"hello")).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Stream {
    send: SendHalf,
    recv: RecvHalf,
    chunk: Bytes,
    eof: bool,
    /// When the current busy poll of a write began (see `Config::busy_poll`).
    write_spin: Option<Instant>,
}

impl Stream {
    /// The stream view of `conn`.
    #[must_use]
    pub fn new(conn: Connection) -> Self {
        let (send, recv) = conn.split();
        Self {
            send,
            recv,
            chunk: Bytes::new(),
            eof: false,
            write_spin: None,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while this.chunk.is_empty() && !this.eof {
            match ready!(this.recv.poll_recv(cx)) {
                Ok(Some(b)) => this.chunk = b,
                Ok(None) => this.eof = true,
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
        let n = this.chunk.len().min(buf.remaining());
        buf.put_slice(&this.chunk[..n]);
        this.chunk.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = self.get_mut();
        Poll::Ready(Ok(ready!(this.send.poll_write(
            cx,
            buf,
            &mut this.write_spin
        ))?))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.send.shutdown();
        Poll::Ready(Ok(()))
    }
}
