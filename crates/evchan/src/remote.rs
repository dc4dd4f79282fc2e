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
//!   [`max_message_size`](Connection::max_message_size) bytes. They need no credit (they
//!   consume no receive of the peer's), post on the send queue after what was sent before,
//!   and are awaited in the calling task as messages are. The peer's range is checked against
//!   the descriptor before posting ([`Error::Remote`], nothing posted, the connection goes
//!   on). A descriptor that lies about the peer's memory gets the peer device's refusal: the
//!   operation fails with [`Lost::WorkCompletion`](crate::Lost::WorkCompletion) (a remote
//!   access error) and, as for any failed work request on a reliable connection, the
//!   connection is lost.
//! - Cancel safety: dropping an operation's future before it was posted posts nothing;
//!   after, the operation still completes (a WRITE may land, an atomic still applies) and its
//!   slot stays with the connection until the completion, so nothing the device may still
//!   write is reused before.
//! - The target side is evchan-core's [`Exposed`]: no slice of the bytes while the peer can
//!   reach them; copies in and out and `AtomicU64` words meanwhile; [`Exposed::revoke`] for the
//!   bytes back (see [`evchan_core::verbs::remote`] for exactly what the revocation holds
//!   against).
//! - Scope of a grant: [`Connection::expose`] registers on the protection domain that this
//!   process's connections on the device share, so its rkey is valid on every one of them,
//!   not only on the connection it was exposed through: hand the descriptor only to peers you
//!   trust with it. (Memory windows bound to one connection are not built yet.)

pub use evchan_core::verbs::{
    Access, AllowsAtomic, AllowsRead, AllowsWrite, Exposed, RemoteAtomic, RemoteBuf, RemoteError,
    RemoteRead, RemoteReadWrite, RemoteWrite, Revoked,
};

use std::future::poll_fn;

use bytes::Bytes;
use evchan_core::verbs::{Error as VerbsError, Mr, QpHandle, Slot, SlotPool, SlotPostError};

use crate::error::{Error, Result};
use crate::wait::Role;
use crate::wire::{Fetch, Fetched, PostRemote, RemoteOp, Waiting, Wire};
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
    let mut waiting = Waiting::new(wire, Role::Remote);
    let mut hold = Hold {
        wire,
        op: RemoteOp {
            fetch,
            post,
            posted: None,
        },
    };
    poll_fn(|cx| wire.poll_remote(cx, &mut hold.op, &mut waiting.wait)).await
}

fn too_large(len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(Error::MessageTooLarge { len, max });
    }
    Ok(())
}

fn word(f: Fetched) -> u64 {
    match f {
        Fetched::Word(w) => w,
        _ => unreachable!("an atomic's completion brings its word"),
    }
}

impl SendHalf {
    /// Registers `len` zeroed bytes (rounded up to whole pages) for the peer with access `A`,
    /// on this connection's device: the [`Exposed`] memory, whose
    /// [`descriptor`](Exposed::descriptor) the peer needs (send it in a message, or in the
    /// private data of a connect or accept). See the [module docs](crate::remote) for what
    /// holds while it is exposed, and for the grant's scope (every connection of this
    /// process on the device).
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
        too_large(data.len(), self.max_message_size())?;
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
        too_large(len, self.max_message_size())?;
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
    /// returns once it completed: on a reliable connection, the peer's device acknowledged it.
    /// Whether the peer's application sees the bytes yet is for it to learn from a message
    /// sent after the write (messages and one-sided operations of one connection are carried
    /// in order). Any number may be in flight at once, each holding a send slot until its
    /// completion (sends wait for those slots too).
    ///
    /// Cancel safety: dropped before posting, nothing is written; after, the write still
    /// completes.
    ///
    /// # Errors
    /// [`Error::MessageTooLarge`] and [`Error::Remote`] (a range outside `to`, or nothing to
    /// write): refused before posting, the connection goes on. [`Error::ConnectionLost`] when
    /// the connection was lost before or by the write (a peer device's refusal of the rkey is
    /// [`Lost::WorkCompletion`](crate::Lost::WorkCompletion) with a remote access error),
    /// [`Error::PeerClosed`] after the peer disconnected; [`Error::Config`] outside a tokio
    /// runtime with its I/O driver.
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
    /// As [`write`](Self::write) (a `len` of 0 is [`Error::Remote`]).
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
    /// As [`write`](Self::write); [`Error::Remote`] also for a misaligned word.
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
