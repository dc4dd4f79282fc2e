//! Registered buffers: messages and one-sided operations without a copy.
//!
//! [`Connection::send`] and [`Connection::write`] copy their bytes into one of the
//! connection's send slots, and [`Connection::read`] copies them out of one: simple, and the
//! caller's memory is free again at once. A [`Buffer`] is memory registered with the
//! connection's device, which the device reads (or, for a READ, writes) itself: no copy, and
//! a one-sided operation as long as the peer's descriptor allows, not only up to
//! [`max_message_size`](Connection::max_message_size) — within the port's largest message
//! (`ibv_port_attr::max_msg_sz`, 2 GiB on rdma_rxe), beyond which the device fails the
//! operation and, as for any failed work request, the connection is lost.
//!
//! ```no_run
//! use evchan::remote::{RemoteBuf, RemoteReadWrite};
//!
//! # async fn f(conn: evchan::Connection, there: RemoteBuf<RemoteReadWrite>) -> evchan::Result<()> {
//! // Register once, then reuse: each operation takes the buffer and gives it back.
//! let mut buf = conn.buffer(1 << 20)?;
//! buf.fill(7);
//! let buf = conn.write_buffer(&there, 0, buf).await?; // 1 MiB, one RDMA WRITE
//! let mut buf = conn.read_buffer(&there, 0, buf).await?; // and back
//! assert!(buf.iter().all(|&b| b == 7));
//!
//! buf.set_len(5)?;
//! buf.copy_from_slice(b"hello");
//! let _buf = conn.send_buffer(buf).await?; // a message of 5 bytes, sent from the buffer
//! # Ok(())
//! # }
//! ```
//!
//! - Ownership: an operation takes the [`Buffer`] by value and gives it back once the device
//!   is done with it (its work request completed), as io_uring's owned buffers do; until then
//!   nothing else can read or write its bytes. A READ's bytes are in the buffer it gives back.
//! - Errors give the buffer back too ([`BufferError::buffer`]), unless the connection ended
//!   while the device still had it (the connection then deregisters and frees it), or the
//!   tokio runtime began to shut down while the operation waited for its completion (the
//!   buffer then comes back to the connection at the completion, and is freed).
//! - Cancel safety: dropped before posting, the future drops the buffer with it and nothing
//!   is sent, written or read. Dropped after, the operation completes all the same (a message
//!   is delivered, a WRITE lands, a READ fills the buffer) and the buffer stays with the
//!   connection until the completion, then is deregistered and freed: the program never gets
//!   back memory the device may still write. A forgotten future ([`std::mem::forget`]) never
//!   gets its buffer: the connection keeps it, once completed, until the connection's data
//!   path goes (as for a dropped one, nothing can reach its bytes meanwhile). A `send_buffer`
//!   forgotten while it waits for its turn among the senders keeps its place in that line, as
//!   a forgotten `send` does: the senders after it wait for good.
//! - A message from a buffer is one message like any other: it needs a credit, arrives in
//!   order with the copied ones, and is at most [`max_message_size`](Connection::max_message_size)
//!   bytes (the peer's receive slots). Its future returns once the message's SEND completed
//!   (on a reliable connection: the peer's device has it), not as soon as it is posted as
//!   [`Connection::send`]'s does; toward a plain librdmacm peer that posts no receive, that
//!   is never (its device answers receiver-not-ready, retried without end).
//! - Each operation in flight takes one of the connection's send slots as its send queue
//!   entry (the slot's bytes are not used), so at most `Config::send_depth` of them, messages
//!   and one-sided operations together, are in flight at once.
//! - Scope: a buffer is registered on the protection domain of the connection's evchan
//!   runtime on its device, and works on every connection of that runtime on that device; on
//!   another it is refused before anything is posted. It grants the peer nothing: no rkey
//!   leaves this process, so a peer cannot reach it (see [`crate::remote`] for memory the
//!   peer may access).

use std::fmt;
use std::future::poll_fn;
use std::ops::{Deref, DerefMut};

use evchan_core::verbs::{
    AllowsRead, AllowsWrite, Error as VerbsError, OwnedMr, QpHandle, RemoteBuf, RemoteError,
};

use crate::error::{Error, Lost, Result};
use crate::wait::Role;
use crate::wire::{Fetch, PostBuffer, Poster, Waiting, Wire};
use crate::{Connection, SendHalf};

/// Memory registered with a connection's device, for messages and one-sided operations
/// without a copy (see the [module docs](crate::buffer)). Its bytes are plain, zeroed at
/// first: read and write them through `Deref`/`DerefMut` (the first [`len`](Self::len) bytes)
/// while the buffer is yours.
pub struct Buffer {
    mr: OwnedMr<Vec<u8>>,
    len: usize,
}

impl Buffer {
    /// How many bytes the buffer holds at most.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.mr.mr().as_slice().len()
    }

    /// The bytes an operation moves: the first `len` of the buffer (its capacity at first).
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether [`len`](Self::len) is 0.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets how many bytes the next operation moves (the bytes keep their values).
    ///
    /// # Errors
    /// [`Error::Remote`] ([`RemoteError::LocalTooSmall`]) beyond the capacity; nothing
    /// changes.
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        let capacity = self.capacity();
        if len > capacity {
            return Err(Error::Remote(RemoteError::LocalTooSmall {
                need: len,
                capacity,
            }));
        }
        self.len = len;
        Ok(())
    }
}

impl Deref for Buffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.mr.mr().as_slice()[..self.len]
    }
}

impl DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.mr.as_mut_slice()[..len]
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for Buffer {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// An operation on a [`Buffer`] failed: why, and the buffer, unless the connection ended
/// while the device had it (the connection then deregistered and freed it). Converts into
/// [`Error`] (the buffer dropped), so `?` works in functions returning [`crate::Result`].
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct BufferError {
    /// Why.
    #[source]
    pub error: Error,
    /// The buffer, unchanged but for a READ's bytes (which may be partly written).
    pub buffer: Option<Buffer>,
}

impl From<BufferError> for Error {
    fn from(e: BufferError) -> Error {
        e.error
    }
}

/// What an operation on a buffer returns.
pub type BufferResult = std::result::Result<Buffer, BufferError>;

fn refuse(error: Error, buffer: Buffer) -> BufferResult {
    Err(BufferError {
        error,
        buffer: Some(buffer),
    })
}

/// The checks before an operation on `buf` waits for anything: the half is not shut down, and
/// `buf` is registered where the connection posts.
fn check(half: &SendHalf, buf: &Buffer) -> Result<()> {
    if half.is_shut() {
        return Err(Error::ConnectionLost(Lost::Closed));
    }
    if !half.wire().is_pd(&buf.mr.pd())? {
        return Err(Error::Verbs(VerbsError::InvalidArgument(
            "the buffer is registered on another device, or for another evchan runtime, than \
             the connection's",
        )));
    }
    Ok(())
}

/// Posts (or, `posted`, has posted) the operation on `mr`, waits for its completion; the
/// buffer back, or why not.
async fn run(
    wire: &Wire,
    fetch: Fetch,
    post: Poster<'_>,
    mr: Option<OwnedMr<Vec<u8>>>,
    posted: Option<u64>,
    len: usize,
) -> BufferResult {
    let (r, mr) = crate::remote::run_op(wire, fetch, post, mr, posted).await;
    let buffer = mr.map(|mr| Buffer { mr, len });
    match (r, buffer) {
        (Ok(_), Some(b)) => Ok(b),
        (Ok(_), None) => unreachable!("a completed operation gives its buffer back"),
        (Err(error), buffer) => Err(BufferError { error, buffer }),
    }
}

impl SendHalf {
    /// Registers a [`Buffer`] of `capacity` zeroed bytes with this connection's device (local
    /// access only: the peer gets no key to it).
    ///
    /// # Errors
    /// [`Error::Verbs`]: `InvalidArgument` for 0 bytes, the `ibv_reg_mr` error (`ENOMEM` past
    /// `ulimit -l`); [`Error::ConnectionLost`] once the connection's objects are released.
    pub fn buffer(&self, capacity: usize) -> Result<Buffer> {
        if capacity == 0 {
            return Err(Error::Verbs(VerbsError::InvalidArgument(
                "a buffer of 0 bytes",
            )));
        }
        let pd = self.wire().pd()?;
        let mr = OwnedMr::new(&pd, vec![0u8; capacity])?;
        Ok(Buffer { mr, len: capacity })
    }

    /// Sends `buf`'s bytes as one message, zero-copy. See [`Connection::send_buffer`].
    ///
    /// # Errors
    /// As [`Connection::send_buffer`].
    pub async fn send_buffer(&self, buf: Buffer) -> BufferResult {
        if let Err(e) = check(self, &buf) {
            return refuse(e, buf);
        }
        let (len, max) = (buf.len, self.max_message_size());
        if len > max {
            return refuse(Error::MessageTooLarge { len, max }, buf);
        }
        let wire = self.wire();
        let mut mr = Some(buf.mr);
        let posted = {
            let mut waiting = Waiting::new(wire, Role::Send);
            poll_fn(|cx| wire.poll_send_buffer(cx, &mut mr, len, &mut waiting.wait)).await
        };
        match posted {
            Ok(id) => run(wire, Fetch::Nothing, Poster::Posted, None, Some(id), len).await,
            Err(error) => Err(BufferError {
                error,
                buffer: mr.map(|mr| Buffer { mr, len }),
            }),
        }
    }

    /// RDMA WRITE of `buf`'s bytes at `offset` in the peer's `to`, zero-copy. See
    /// [`Connection::write_buffer`].
    ///
    /// # Errors
    /// As [`Connection::write_buffer`].
    pub async fn write_buffer<A: AllowsWrite>(
        &self,
        to: &RemoteBuf<A>,
        offset: u64,
        buf: Buffer,
    ) -> BufferResult {
        let len = buf.len;
        let range = to.bytes_range(offset, len);
        let post =
            |qp: &QpHandle, mr: OwnedMr<Vec<u8>>| qp.post_write_mr(mr, len, to, offset, None);
        self.one_sided(buf, range, Fetch::Nothing, &post).await
    }

    /// RDMA READ of `buf.len()` bytes at `offset` in the peer's `from` into `buf`, zero-copy.
    /// See [`Connection::read_buffer`].
    ///
    /// # Errors
    /// As [`Connection::read_buffer`].
    pub async fn read_buffer<A: AllowsRead>(
        &self,
        from: &RemoteBuf<A>,
        offset: u64,
        buf: Buffer,
    ) -> BufferResult {
        let len = buf.len;
        let range = from.bytes_range(offset, len);
        let post = |qp: &QpHandle, mr: OwnedMr<Vec<u8>>| qp.post_read_mr(mr, len, from, offset);
        self.one_sided(buf, range, Fetch::Bytes, &post).await
    }

    /// A one-sided operation on `buf`, once the peer's `range` checked out.
    async fn one_sided(
        &self,
        buf: Buffer,
        range: std::result::Result<u64, RemoteError>,
        fetch: Fetch,
        post: &PostBuffer<'_>,
    ) -> BufferResult {
        if let Err(e) = check(self, &buf).and(range.map_err(Error::Remote)) {
            return refuse(e, buf);
        }
        let len = buf.len;
        run(
            self.wire(),
            fetch,
            Poster::Buffer(post),
            Some(buf.mr),
            None,
            len,
        )
        .await
    }
}

impl Connection {
    /// A [`Buffer`] of `capacity` zeroed bytes registered with this connection's device; see
    /// [`SendHalf::buffer`].
    ///
    /// # Errors
    /// As [`SendHalf::buffer`].
    pub fn buffer(&self, capacity: usize) -> Result<Buffer> {
        self.send_half().buffer(capacity)
    }

    /// Sends the first [`len`](Buffer::len) bytes of `buf` as one message, zero-copy: the
    /// device reads them from the buffer. Returns the buffer once the message's SEND
    /// completed. In every other way a message as [`send`](Self::send)'s: it waits for its
    /// turn among the senders and for a credit, and arrives in order with the others.
    ///
    /// Cancel safety: see the [module docs](crate::buffer).
    ///
    /// # Errors
    /// Refused before anything is posted, with the buffer: [`Error::MessageTooLarge`] above
    /// [`max_message_size`](Self::max_message_size); [`Error::Verbs`] (`InvalidArgument`) for
    /// a buffer of another device or evchan runtime; [`Error::ConnectionLost`] with
    /// [`Lost::Closed`] after [`SendHalf::shutdown`]. Then as [`send`](Self::send)'s, and a
    /// failed completion ([`Error::ConnectionLost`]) — with the buffer unless the connection
    /// ended while the device still had it.
    pub async fn send_buffer(&self, buf: Buffer) -> BufferResult {
        self.send_half().send_buffer(buf).await
    }

    /// RDMA WRITE of the first [`len`](Buffer::len) bytes of `buf` at `offset` in the peer's
    /// `to`, zero-copy and as long as `to` allows (see the [module docs](crate::buffer) for the
    /// bound); returns the buffer once the write
    /// completed. Otherwise as [`write`](Self::write).
    ///
    /// # Errors
    /// Refused before anything is posted, with the buffer: [`Error::Remote`] (a range outside
    /// `to`, or an empty buffer), and as [`send_buffer`](Self::send_buffer); then as
    /// [`write`](Self::write).
    pub async fn write_buffer<A: AllowsWrite>(
        &self,
        to: &RemoteBuf<A>,
        offset: u64,
        buf: Buffer,
    ) -> BufferResult {
        self.send_half().write_buffer(to, offset, buf).await
    }

    /// RDMA READ of [`buf.len()`](Buffer::len) bytes at `offset` in the peer's `from` into
    /// `buf`, zero-copy and as long as `from` allows; returns the buffer, holding the
    /// bytes, once the read completed. Otherwise as [`read`](Self::read).
    ///
    /// # Errors
    /// As [`write_buffer`](Self::write_buffer); [`Error::NoReadResources`] toward a peer
    /// that takes no READ.
    pub async fn read_buffer<A: AllowsRead>(
        &self,
        from: &RemoteBuf<A>,
        offset: u64,
        buf: Buffer,
    ) -> BufferResult {
        self.send_half().read_buffer(from, offset, buf).await
    }
}
