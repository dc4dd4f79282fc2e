//! A byte-stream view of a connection: tokio's `AsyncRead` and `AsyncWrite`.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::connection::{Connection, RecvHalf, SendHalf};
use crate::wait::Role;
use crate::wire::Wait;

/// A [`Connection`] as a byte stream, so that `tokio_util::codec` framing and existing
/// protocols run over RDMA unchanged.
///
/// Writes are cut into messages of at most the connection's maximum size; reads concatenate
/// messages, so boundaries are not kept. A message's receive buffer goes back to the
/// connection (for a receive whose credit it grants) as soon as its last byte has been read: a
/// request/reply
/// protocol works with any `recv_depth`, 1 included. `poll_flush` returns at once: written
/// bytes are posted in order (a write waits for a send slot and a credit) and delivered unless
/// the connection is lost. `poll_shutdown` sends the close message; the peer reads EOF after
/// everything written.
///
/// With [`Config::busy_poll`](crate::Config::busy_poll), a read or a write spins for at most
/// the window from its first poll; a read or write polled again after more than the window
/// (it was abandoned, or slept through the reactor) starts a new window.
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
    /// The unread rest of the message being read (empty: no message held).
    chunk: Bytes,
    eof: bool,
    read: Direction,
    write: Direction,
}

/// One direction's wait, and when it was last polled (see the busy-poll rule above).
#[derive(Debug, Default)]
struct Direction {
    wait: Wait,
    polled: Option<Instant>,
}

impl Direction {
    fn begin(&mut self, window: Option<std::time::Duration>) {
        if window.is_some() {
            if let Some(last) = self.polled {
                self.wait.restart_spin_if_idle(window, last);
            }
            self.polled = Some(Instant::now());
        }
    }
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
            read: Direction::default(),
            write: Direction::default(),
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
        if this.chunk.is_empty() && !this.eof {
            this.read.begin(this.recv.wire().busy_poll_window());
        }
        while this.chunk.is_empty() && !this.eof {
            match ready!(this.recv.poll_recv(cx, &mut this.read.wait)) {
                Ok(Some(b)) => this.chunk = b,
                Ok(None) => this.eof = true,
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
        let n = this.chunk.len().min(buf.remaining());
        buf.put_slice(&this.chunk[..n]);
        this.chunk.advance(n);
        if this.chunk.is_empty() {
            // Consumed: the buffer goes back (for a receive whose credit is granted) now, not
            // when the next message replaces it.
            this.chunk = Bytes::new();
        }
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
        this.write.begin(this.send.wire().busy_poll_window());
        Poll::Ready(Ok(ready!(this.send.poll_write(
            cx,
            buf,
            &mut this.write.wait
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

impl Drop for Stream {
    fn drop(&mut self) {
        // A read or write left pending leaves its line.
        self.recv.wire().end_wait(Role::Recv, &mut self.read.wait);
        self.send.wire().end_wait(Role::Send, &mut self.write.wait);
    }
}
