//! One-sided access on a [`Connection`]: RDMA WRITE, READ and 8-byte atomics on a peer's
//! memory, and memory exposed for the peer's.
//!
//! ```no_run
//! use evchan::remote::{RemoteBuf, RemoteWrite};
//!
//! # async fn f(server: evchan::Connection, mut client: evchan::Connection) -> Result<(), Box<dyn std::error::Error>> {
//! // The target: exposes 4 KiB for the peer to write, and sends it the descriptor.
//! let exposed = server.expose::<RemoteWrite>(4096)?;
//! server.send(exposed.descriptor().to_bytes()).await?;
//!
//! // The initiator: decodes the descriptor (untrusted bytes) and writes at offset 16.
//! let msg = client.recv().await?.expect("a descriptor");
//! let there = RemoteBuf::<RemoteWrite>::from_bytes(&msg)?;
//! client.write(&there, 16, b"hello").await?;
//! client.send("done").await?;
//!
//! // The target, told that the write is done: reads a copy while exposed, or revokes the
//! // peer's access and gets the bytes back as a plain slice.
//! let mut word = [0u8; 5];
//! exposed.read_at(16, &mut word)?;
//! let bytes = exposed.revoke()?;
//! assert_eq!(&bytes[16..21], b"hello");
//! # Ok(())
//! # }
//! ```
//!
//! - The initiator's operations ([`Connection::write`], [`read`](Connection::read),
//!   [`fetch_add`](Connection::fetch_add), [`compare_swap`](Connection::compare_swap)) copy
//!   their bytes through one of the connection's send slots, so each moves at most
//!   [`max_message_size`](Connection::max_message_size) bytes, and as many are in flight at
//!   once as the connection has send slots (`Config::send_depth`, shared with `send`, without
//!   a common order: a sender and an operation waiting for a slot each take the next one they
//!   find). They need no credit (they consume no receive of the peer's), post on the send
//!   queue after what was sent before, and are awaited in the calling task as messages are.
//! - The peer's range is checked against the descriptor before anything is posted or waited
//!   for ([`Error::Remote`]; the connection goes on). A descriptor that lies about the peer's
//!   memory gets the peer device's refusal: the operation fails with
//!   [`Lost::WorkCompletion`](crate::Lost::WorkCompletion) (a remote access error) and, as for
//!   any failed work request on a reliable connection, the connection is lost.
//! - READ and atomics need the peer to have granted responder resources when the connection
//!   was set up: an evchan connection grants and asks for up to 16 READs and atomics in
//!   flight at once (fewer where the device takes fewer), rping grants one; where a plain
//!   peer granted none they are refused ([`Error::NoReadResources`]). Beyond what the peer
//!   granted, the device holds them back until earlier ones complete. (A plain peer that
//!   accepts with responder resources copied from our request, 16, on a device that takes
//!   fewer, fails its accept: `rdma_accept`'s `EINVAL`.)
//! - An error returned after the operation was posted (the connection lost meanwhile) does not
//!   say that it did not take effect: a WRITE may have landed, an atomic may have applied.
//! - Cancel safety: dropping an operation's future before it was posted posts nothing;
//!   after, the operation still completes (a WRITE may land, an atomic still applies) and its
//!   slot stays with the connection until the completion, so nothing the device may still
//!   write is reused before.
//! - The target side is evchan-core's [`Exposed`]: no slice of the bytes while the peer can
//!   reach them; copies in and out and `AtomicU64` words meanwhile; [`Exposed::revoke`] for the
//!   bytes back (see [`evchan_core::verbs::remote`] for exactly what the revocation holds
//!   against).
//! - Scope of a grant: [`Connection::expose`] registers on the protection domain of the
//!   connection's evchan runtime on its device (one per device for all the connections made
//!   with the same `Config::shards`), so its rkey is valid on every one of those connections,
//!   not only on the one it was exposed through: hand the descriptor only to peers you trust
//!   with it. [`Exposed::grant`] gives another peer a grant of its own over the same bytes,
//!   revoked alone ([`Exposed::revoke_grant`]); every grant has the same scope. (Memory
//!   windows bound to one connection are not built: on rdma_rxe a type-2 window does not
//!   limit the range a peer reaches.)
//! - An [`Exposed`] holds its device open until it is dropped or revoked, past the
//!   connection's end: on a device without disassociation (rdma_rxe), a device removal waits
//!   for it.

pub use evchan_core::verbs::{
    Access, AllowsAtomic, AllowsRead, AllowsWrite, Exposed, RemoteAtomic, RemoteBuf, RemoteError,
    RemoteRead, RemoteReadWrite, RemoteWrite, Revoked,
};

use std::future::poll_fn;

use bytes::Bytes;
use evchan_core::verbs::{
    Error as VerbsError, Mr, OwnedMr, QpHandle, Slot, SlotPool, SlotPostError,
};

use crate::error::{Error, Result};
use crate::wait::Role;
use crate::wire::{Fetch, Fetched, PostRemote, Poster, RemoteOp, Waiting, Wire};
use crate::{Connection, SendHalf};

/// A one-sided operation's future's hold on its posted work request: dropped before the
/// result was taken, the connection forgets the entry (the slot comes back at the
/// completion).
struct Hold<'a> {
    wire: &'a Wire,
    op: RemoteOp<'a>,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.op.posted {
            self.wire.forget_remote(id);
        }
    }
}

async fn run(wire: &Wire, fetch: Fetch, post: &PostRemote<'_>) -> Result<Fetched> {
    run_op(wire, fetch, Poster::Slot(post), None, None).await.0
}

/// Posts (or, `posted`, has posted) an operation, and waits for its completion: its result,
/// and the registered buffer it had (`mr`), if the device gave it back.
pub(crate) async fn run_op(
    wire: &Wire,
    fetch: Fetch,
    post: Poster<'_>,
    mr: Option<OwnedMr<Vec<u8>>>,
    posted: Option<u64>,
) -> (Result<Fetched>, Option<OwnedMr<Vec<u8>>>) {
    let mut waiting = Waiting::new(wire, Role::Remote);
    let mut hold = Hold {
        wire,
        op: RemoteOp {
            fetch,
            post,
            posted,
            buffer: mr,
        },
    };
    let r = poll_fn(|cx| wire.poll_remote(cx, &mut hold.op, &mut waiting.wait)).await;
    (r, hold.op.buffer.take())
}

/// The checks before an operation waits for anything: the half is not shut down, the
/// operation's `len` bytes fit a slot (`max`), and `range` (the peer's range's check).
fn check(half: &SendHalf, len: usize, range: std::result::Result<u64, RemoteError>) -> Result<()> {
    if half.is_shut() {
        return Err(Error::ConnectionLost(crate::Lost::Closed));
    }
    let max = half.max_message_size();
    if len > max {
        return Err(Error::MessageTooLarge { len, max });
    }
    range?;
    Ok(())
}

fn word(f: Fetched) -> u64 {
    match f {
        Fetched::Word(w) => w,
        _ => unreachable!("an atomic's completion brings its word"),
    }
}

/// [`check`] for an atomic on the word at `offset`: 8 bytes, aligned.
fn check_word<A: Access>(half: &SendHalf, at: &RemoteBuf<A>, offset: u64) -> Result<()> {
    let capacity = half.max_message_size();
    if capacity < 8 {
        return Err(Error::Remote(RemoteError::LocalTooSmall {
            need: 8,
            capacity,
        }));
    }
    check(half, 8, at.word(offset))
}

impl SendHalf {
    /// Registers `len` zeroed bytes (in a mapping of their own) for the peer with access `A`,
    /// on this connection's device: the [`Exposed`] memory, whose
    /// [`descriptor`](Exposed::descriptor) the peer needs (send it in a message, or in the
    /// private data of a connect or accept). See the [module docs](crate::remote) for what
    /// holds while it is exposed, and for the grant's scope (every connection of the same
    /// evchan runtime on the device).
    ///
    /// # Errors
    /// [`Error::Verbs`] (an `InvalidArgument` for 0 or more than `u32::MAX` bytes; the
    /// `mmap` or `ibv_reg_mr` error: `ENOMEM` past `ulimit -l`, `EINVAL` for an access the
    /// device lacks); [`Error::ConnectionLost`] once the connection's objects are released.
    pub fn expose<A: Access>(&self, len: usize) -> Result<Exposed<A>> {
        let pd = self.wire().pd()?;
        Ok(Exposed::new(&pd, len)?)
    }

    /// RDMA WRITE of `data` at `offset` in the peer's `to`; returns once the write completed
    /// (on a reliable connection: the peer's device acknowledged it). See
    /// [`Connection::write`].
    ///
    /// # Errors
    /// As [`Connection::write`].
    pub async fn write<A: AllowsWrite>(
        &self,
        to: &RemoteBuf<A>,
        offset: u64,
        data: impl AsRef<[u8]>,
    ) -> Result<()> {
        let data = data.as_ref();
        check(self, data.len(), to.bytes_range(offset, data.len()))?;
        let post = |qp: &QpHandle, mr: &Mr<'_, SlotPool>, mut slot: Slot| {
            if slot.copy_from(data).is_err() {
                return Err(SlotPostError {
                    slot,
                    error: VerbsError::InvalidArgument("a write larger than its send slot"),
                });
            }
            qp.post_write_slot(mr, slot, to, offset, None)
        };
        run(self.wire(), Fetch::Nothing, &post).await.map(|_| ())
    }

    /// RDMA READ of `len` bytes at `offset` in the peer's `from`. See [`Connection::read`].
    ///
    /// # Errors
    /// As [`Connection::read`].
    pub async fn read<A: AllowsRead>(
        &self,
        from: &RemoteBuf<A>,
        offset: u64,
        len: usize,
    ) -> Result<Bytes> {
        check(self, len, from.bytes_range(offset, len))?;
        let post = |qp: &QpHandle, mr: &Mr<'_, SlotPool>, slot: Slot| {
            qp.post_read_slot(mr, slot, from, offset, len)
        };
        match run(self.wire(), Fetch::Bytes, &post).await? {
            Fetched::Bytes(b) => Ok(b),
            _ => unreachable!("a READ's completion brings its bytes"),
        }
    }

    /// Atomic fetch-and-add on the peer's word at `offset`. See [`Connection::fetch_add`].
    ///
    /// # Errors
    /// As [`Connection::fetch_add`].
    pub async fn fetch_add<A: AllowsAtomic>(
        &self,
        at: &RemoteBuf<A>,
        offset: u64,
        add: u64,
    ) -> Result<u64> {
        check_word(self, at, offset)?;
        let post = |qp: &QpHandle, mr: &Mr<'_, SlotPool>, slot: Slot| {
            qp.post_fetch_add_slot(mr, slot, at, offset, add)
        };
        run(self.wire(), Fetch::Word, &post).await.map(word)
    }

    /// Atomic compare-and-swap on the peer's word at `offset`. See
    /// [`Connection::compare_swap`].
    ///
    /// # Errors
    /// As [`Connection::compare_swap`].
    pub async fn compare_swap<A: AllowsAtomic>(
        &self,
        at: &RemoteBuf<A>,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        check_word(self, at, offset)?;
        let post = |qp: &QpHandle, mr: &Mr<'_, SlotPool>, slot: Slot| {
            qp.post_compare_swap_slot(mr, slot, at, offset, compare, swap)
        };
        run(self.wire(), Fetch::Word, &post).await.map(word)
    }
}

impl Connection {
    /// Memory exposed for the peer's one-sided access; see [`SendHalf::expose`].
    ///
    /// # Errors
    /// As [`SendHalf::expose`].
    pub fn expose<A: Access>(&self, len: usize) -> Result<Exposed<A>> {
        self.send_half().expose(len)
    }

    /// RDMA WRITE of `data` (at most [`max_message_size`](Self::max_message_size) bytes, copied
    /// into a send slot) at `offset` in the peer's `to`, posted after what was sent before;
    /// returns once it completed: on a reliable connection, the peer's device acknowledged it,
    /// so a message sent after this returns reaches the peer's application after the bytes
    /// are in its memory. Up to the connection's send slots may be in flight at once (tasks
    /// sharing the connection), each holding its slot until its completion (sends wait for
    /// those slots too).
    ///
    /// Cancel safety: dropped before posting, nothing is written; after, the write still
    /// completes.
    ///
    /// # Errors
    /// Refused before posting or waiting, the connection going on:
    /// [`Error::MessageTooLarge`], [`Error::Remote`] (a range outside `to`, or nothing to
    /// write), [`Error::ConnectionLost`] with [`Lost::Closed`](crate::Lost::Closed) after
    /// [`SendHalf::shutdown`], [`Error::Config`] outside a tokio runtime with its I/O driver.
    /// [`Error::ConnectionLost`] when the connection was lost before or during the write (a
    /// peer device's refusal of the rkey is [`Lost::WorkCompletion`](crate::Lost::WorkCompletion)
    /// with a remote access error), [`Error::PeerClosed`] after the peer disconnected: once
    /// posted, such an error leaves open whether the bytes landed.
    pub async fn write<A: AllowsWrite>(
        &self,
        to: &RemoteBuf<A>,
        offset: u64,
        data: impl AsRef<[u8]>,
    ) -> Result<()> {
        self.send_half().write(to, offset, data).await
    }

    /// RDMA READ of `len` bytes (at most [`max_message_size`](Self::max_message_size)) at
    /// `offset` in the peer's `from`: the bytes, copied out of the send slot they were read
    /// into once the read completed. A peer's write in progress may be seen in part.
    ///
    /// Cancel safety: dropped before posting, nothing is read; after, the read still
    /// completes into its slot, which stays with the connection until then.
    ///
    /// # Errors
    /// As [`write`](Self::write) (a `len` of 0 is [`Error::Remote`]);
    /// [`Error::NoReadResources`] toward a peer that takes no READ.
    pub async fn read<A: AllowsRead>(
        &self,
        from: &RemoteBuf<A>,
        offset: u64,
        len: usize,
    ) -> Result<Bytes> {
        self.send_half().read(from, offset, len).await
    }

    /// Atomic fetch-and-add of `add` on the peer's 8-byte word at `offset` (its address a
    /// multiple of 8): the word's value before, in the byte order the peer's device keeps
    /// (the host's, for rdma_rxe). Atomic with the other RDMA atomics on that word; with the
    /// peer's CPU only as its device says (see [`Exposed::atomic_u64`]).
    ///
    /// Cancel safety: dropped after posting, the addition still happens.
    ///
    /// # Errors
    /// As [`read`](Self::read); [`Error::Remote`] also for a misaligned word, or a connection
    /// whose messages are under 8 bytes. Once posted, an error leaves open whether the
    /// operation applied.
    pub async fn fetch_add<A: AllowsAtomic>(
        &self,
        at: &RemoteBuf<A>,
        offset: u64,
        add: u64,
    ) -> Result<u64> {
        self.send_half().fetch_add(at, offset, add).await
    }

    /// Atomic compare-and-swap on the peer's 8-byte word at `offset`: `swap` is stored if the
    /// word is `compare`; returns the word's value before (equal to `compare` when it was
    /// swapped). See [`fetch_add`](Self::fetch_add).
    ///
    /// # Errors
    /// As [`fetch_add`](Self::fetch_add).
    pub async fn compare_swap<A: AllowsAtomic>(
        &self,
        at: &RemoteBuf<A>,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        self.send_half()
            .compare_swap(at, offset, compare, swap)
            .await
    }
}
