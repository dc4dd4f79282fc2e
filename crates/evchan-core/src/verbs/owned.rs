//! The owned style: verbs objects that are `Send + Sync + 'static`, for handles that move
//! between tasks and threads (an async connection, a pool of them), beside the borrowed style
//! of the rest of [`verbs`](super).
//!
//! The borrowed style puts the destroy order in lifetimes: a [`Cq<'ch>`](Cq) borrows its
//! [`CompChannel`], a [`Pd<'ctx>`](Pd) its [`Context`]. That cannot describe an object that a
//! `'static` handle carries. Here the parent is kept alive by reference count instead, as
//! rustix has `OwnedFd` beside `BorrowedFd` and tokio `OwnedMutexGuard` beside `MutexGuard`:
//!
//! | owned | holds (by `Arc`) | lends |
//! |---|---|---|
//! | [`OwnedPd`] | its `Arc<Context>` | [`Pd`] ([`OwnedPd::pd`]) |
//! | [`OwnedCompChannel`] | its `Arc<Context>` | [`CompChannel`] ([`OwnedCompChannel::channel`]) |
//! | [`OwnedCq`] | its [`OwnedCompChannel`] | [`Cq`] ([`OwnedCq::cq`]) |
//! | [`OwnedMr<B>`](OwnedMr) | its [`OwnedPd`] | [`Mr`] ([`OwnedMr::mr`]) |
//! | `CqWaiter` (feature `tokio`) | its [`OwnedCompChannel`] | `AsyncWaiter` (`CqWaiter::waiter`) |
//!
//! So the wrong destroy order cannot be written: a parent goes only after its last child,
//! whatever order the handles are dropped in, on whatever thread. What an owned handle lends is
//! the borrowed type itself, borrowed from the handle, so every operation (polls, waits, posts,
//! acks) and every rule of the borrowed style applies unchanged.
//!
//! A QP made by an rdma_cm id on owned objects ([`CmId::create_qp_owned`]) belongs to the id,
//! which destroys it (when it goes, or by [`CmId::destroy_qp`]). Its [`QpHandle`] is the
//! revocable kind: it posts from anywhere while the QP lives and fails cleanly with
//! [`Error::QpDestroyed`] once it is gone; a post never reaches a destroyed QP (the destroy
//! waits for the posts inside).
//!
//! Leaking an owned handle ([`std::mem::forget`], `Box::leak`) leaks its object and every
//! parent; nothing else happens (no destroy waits on it, no descriptor is closed under it).
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use evchan_core::verbs::{Context, OwnedCompChannel, OwnedCq, OwnedMr, OwnedPd, SlotPool};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Arc::new(Context::open_first()?);
//! let pd = OwnedPd::new(ctx.clone())?;
//! let cq = OwnedCq::new(&OwnedCompChannel::new(ctx)?, 64)?;
//! let (pool, slots) = SlotPool::new(8, 4096)?;
//! let mr = OwnedMr::new(&pd, pool)?;
//! // All of them are 'static: move them into a thread (or a task), in any order.
//! std::thread::spawn(move || {
//!     let mut wcs = Vec::new();
//!     cq.cq().poll(&mut wcs, 16).unwrap();
//!     drop((pd, cq, mr, slots));
//! })
//! .join()
//! .unwrap();
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;

use crate::ffi::owned as ffi;

#[cfg(feature = "tokio")]
use super::AsyncWaiter;
use super::{
    Access, AllowsAtomic, AllowsRead, AllowsWrite, CompChannel, Context, Cq, Error, Mr, MrBuffer,
    Pd, PostedSlot, RemoteBuf, RemoteError, Result, Slot, SlotPool, SlotPostError,
};
#[allow(unused_imports)] // doc links
use crate::CmId;

/// A protection domain (`ibv_alloc_pd`) that keeps its [`Context`] alive: the owned form of
/// [`Pd`]. Cheap to clone (one `Arc`); `ibv_dealloc_pd` runs when the last clone and the last
/// [`OwnedMr`] and QP on it are gone.
#[derive(Clone)]
pub struct OwnedPd(Arc<ffi::PdCell>);

impl OwnedPd {
    /// `ibv_alloc_pd` on `ctx`.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_alloc_pd` error.
    #[doc(alias = "ibv_alloc_pd")]
    pub fn new(ctx: Arc<Context>) -> Result<Self> {
        Ok(Self(Arc::new(ffi::PdCell::new(ctx)?)))
    }

    /// The PD, borrowed from this handle.
    #[must_use]
    pub fn pd(&self) -> &Pd<'_> {
        self.0.pd()
    }

    /// The context the PD was allocated on.
    #[must_use]
    pub fn context(&self) -> &Arc<Context> {
        self.0.context()
    }

    pub(crate) fn cell(&self) -> &Arc<ffi::PdCell> {
        &self.0
    }
}

/// The same PD (one allocation, whatever the clone), not two alike.
impl PartialEq for OwnedPd {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for OwnedPd {}

impl fmt::Debug for OwnedPd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OwnedPd").field(self.pd()).finish()
    }
}

/// A completion channel (`ibv_create_comp_channel`) that keeps its [`Context`] alive: the
/// owned form of [`CompChannel`]. Cheap to clone; destroyed when the last clone and the last
/// [`OwnedCq`] and `CqWaiter` (feature `tokio`) on it are gone.
#[derive(Clone)]
pub struct OwnedCompChannel(Arc<ffi::ChannelCell>);

impl OwnedCompChannel {
    /// `ibv_create_comp_channel` on `ctx`, as [`CompChannel::new`].
    ///
    /// # Errors
    /// As [`CompChannel::new`].
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn new(ctx: Arc<Context>) -> Result<Self> {
        Ok(Self(Arc::new(ffi::ChannelCell::new(ctx)?)))
    }

    /// The channel, borrowed from this handle.
    #[must_use]
    pub fn channel(&self) -> &CompChannel<'_> {
        self.0.channel()
    }

    /// The context the channel was created on.
    #[must_use]
    pub fn context(&self) -> &Arc<Context> {
        self.0.context()
    }

    /// Registers the channel with the current tokio runtime's reactor: the owned form of
    /// [`CompChannel::async_waiter`].
    ///
    /// # Errors
    /// The reactor's registration error.
    ///
    /// # Panics
    /// Outside a tokio runtime with I/O enabled (as tokio's `AsyncFd`).
    #[cfg(feature = "tokio")]
    pub fn waiter(&self) -> std::io::Result<CqWaiter> {
        Ok(CqWaiter(ffi::WaiterCell::new(Arc::clone(&self.0))?))
    }
}

impl fmt::Debug for OwnedCompChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OwnedCompChannel")
            .field(self.channel())
            .finish()
    }
}

/// A completion queue (`ibv_create_cq`) that keeps its [`OwnedCompChannel`] alive: the owned
/// form of [`Cq`]. Cheap to clone; destroyed (its events' acks flushed first, as [`Cq`]'s drop
/// does) when the last clone and the last QP on it are gone.
#[derive(Clone)]
pub struct OwnedCq(Arc<ffi::CqCell>);

impl OwnedCq {
    /// `ibv_create_cq` on `channel` with room for at least `min_entries` completions, as
    /// [`Cq::new`].
    ///
    /// # Errors
    /// As [`Cq::new`].
    #[doc(alias = "ibv_create_cq")]
    pub fn new(channel: &OwnedCompChannel, min_entries: u32) -> Result<Self> {
        Ok(Self(Arc::new(ffi::CqCell::new(
            Arc::clone(&channel.0),
            min_entries,
        )?)))
    }

    /// The CQ, borrowed from this handle: poll, arm and wait on it as on any [`Cq`].
    #[must_use]
    pub fn cq(&self) -> &Cq<'_> {
        self.0.cq()
    }

    /// The channel the CQ reports to.
    #[must_use]
    pub fn channel(&self) -> OwnedCompChannel {
        OwnedCompChannel(Arc::clone(self.0.channel()))
    }

    pub(crate) fn cell(&self) -> &Arc<ffi::CqCell> {
        &self.0
    }
}

impl fmt::Debug for OwnedCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OwnedCq").field(self.cq()).finish()
    }
}

/// A memory region (`ibv_reg_mr`) that keeps its [`OwnedPd`] alive: the owned form of
/// [`Mr`]. Not `Clone` (it owns its buffer); deregistered when dropped, as [`Mr`].
pub struct OwnedMr<B: MrBuffer>(ffi::MrCell<B>);

impl<B: MrBuffer> OwnedMr<B> {
    /// `ibv_reg_mr` of `buf` on `pd` (local write access), as [`Mr::new`].
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_reg_mr` error; the buffer is dropped. See [`Self::try_new`]
    /// to get it back.
    #[doc(alias = "ibv_reg_mr")]
    pub fn new(pd: &OwnedPd, buf: B) -> Result<Self> {
        Self::try_new(pd, buf).map_err(|(e, _)| e)
    }

    /// [`new`](Self::new), giving the buffer back on failure.
    ///
    /// # Errors
    /// The `ibv_reg_mr` error, with the buffer.
    pub fn try_new(pd: &OwnedPd, buf: B) -> std::result::Result<Self, (Error, B)> {
        ffi::MrCell::new(Arc::clone(&pd.0), buf).map(Self)
    }

    /// The region, borrowed from this handle (post from it, read its keys).
    #[must_use]
    pub fn mr(&self) -> &Mr<'_, B> {
        self.0.mr()
    }

    /// The registered bytes, mutably ([`Mr::as_mut_slice`]).
    #[must_use]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }

    /// The PD the region is registered with.
    #[must_use]
    pub fn pd(&self) -> OwnedPd {
        OwnedPd(Arc::clone(self.0.pd()))
    }

    /// `ibv_dereg_mr`, then the buffer back, as [`Mr::into_inner`].
    ///
    /// # Errors
    /// As [`Mr::into_inner`].
    pub fn into_inner(self) -> Result<B> {
        self.0.into_inner()
    }
}

impl<B: MrBuffer> fmt::Debug for OwnedMr<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OwnedMr").field(self.mr()).finish()
    }
}

/// An [`OwnedCompChannel`] registered with a tokio runtime's reactor (feature `tokio`), from
/// [`OwnedCompChannel::waiter`]: the owned form of [`AsyncWaiter`]. Keeps the channel alive;
/// its registration goes before the channel's descriptor is closed.
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub struct CqWaiter(ffi::WaiterCell);

#[cfg(feature = "tokio")]
impl CqWaiter {
    /// The waiter, borrowed from this handle: [`AsyncWaiter::wait`] and
    /// [`AsyncWaiter::poll_wait`] on the channel's CQs.
    #[must_use]
    pub fn waiter(&self) -> &AsyncWaiter<'_, '_> {
        self.0.waiter()
    }

    /// The channel it waits on.
    #[must_use]
    pub fn channel(&self) -> OwnedCompChannel {
        OwnedCompChannel(Arc::clone(self.0.channel()))
    }
}

/// The QP of an rdma_cm id made on owned objects ([`CmId::create_qp_owned`]), for posting
/// from anywhere: `Send + Sync + 'static`, cheap to clone, revocable.
///
/// The id owns the QP and destroys it when it goes (or by [`CmId::destroy_qp`]); every handle
/// then fails its posts with [`Error::QpDestroyed`], the slot coming back unchanged. A post
/// that runs while the id destroys the QP finishes first (the destroy waits for it), so no
/// post ever reaches a destroyed QP. The PD and CQs the QP was made on stay alive until it is
/// destroyed, whatever is dropped first.
///
/// The posts are [`CmId::post_send_slot`] and [`CmId::post_recv_slot`]'s, with the same
/// checks (a slot of the region's pool, a region of the QP's PD).
#[derive(Clone)]
pub struct QpHandle(Arc<crate::ffi::owned::QpGate>);

impl QpHandle {
    pub(crate) fn new(gate: Arc<crate::ffi::owned::QpGate>) -> Self {
        Self(gate)
    }

    /// The QP's number (`ibv_qp::qp_num`), as the completions of its work requests carry it.
    #[must_use]
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num()
    }

    /// Whether the QP is still there (its id has not destroyed it). Only a hint: the id may
    /// destroy it right after.
    #[must_use]
    pub fn is_alive(&self) -> bool {
        self.0.is_open()
    }

    /// `ibv_modify_qp` to `IBV_QPS_ERR`, as [`Qp::modify_to_error`](super::Qp::modify_to_error):
    /// a test door, to make a live connection's QP fail as a fatal error would (its work
    /// requests flush). Run it where nothing else modifies the QP at the same time (libibverbs
    /// writes the QP's cached state unsynchronised).
    ///
    /// # Errors
    /// [`Error::QpDestroyed`] once the id destroyed the QP; [`Error::Io`] with the
    /// `ibv_modify_qp` error.
    #[doc(hidden)]
    pub fn modify_to_error(&self) -> Result<()> {
        self.0.with(|qp| match qp {
            Some(qp) => qp
                .modify(&super::qp::to_error())
                .map_err(Error::io("ibv_modify_qp")),
            None => Err(Error::QpDestroyed),
        })
    }

    /// `ibv_post_recv` into the whole of `slot`, as [`CmId::post_recv_slot`].
    ///
    /// # Errors
    /// [`SlotPostError`], with the slot: [`Error::QpDestroyed`] once the id destroyed the QP,
    /// else as [`CmId::post_recv_slot`].
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub fn post_recv_slot(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
    ) -> std::result::Result<PostedSlot, SlotPostError> {
        self.0.with(|qp| match qp {
            Some(qp) => self.tag(super::slots::recv_on(Some(qp), mr, slot)),
            None => Err(destroyed(slot)),
        })
    }

    /// `ibv_post_send` of a signaled SEND of `slot`'s first [`len`](Slot::len) bytes, with
    /// immediate data when `imm` is `Some`, as [`CmId::post_send_slot`].
    ///
    /// # Errors
    /// [`SlotPostError`], with the slot: [`Error::QpDestroyed`] once the id destroyed the QP,
    /// else as [`CmId::post_send_slot`] (`ENOMEM`: the send queue is full).
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub fn post_send_slot(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
        imm: Option<u32>,
    ) -> std::result::Result<PostedSlot, SlotPostError> {
        self.0.with(|qp| match qp {
            Some(qp) => self.tag(super::slots::send_on(Some(qp), mr, slot, imm)),
            None => Err(destroyed(slot)),
        })
    }

    /// A slot posted on this QP back without its completion, once the QP is destroyed: its
    /// id's `rdma_destroy_qp` (or the id's drop) destroyed it, and `ibv_destroy_qp` returned
    /// success, so the device touches none of its work requests' buffers any more. A
    /// receive's, a READ's or an atomic's slot comes back with length 0, a send's or a
    /// WRITE's as posted.
    ///
    /// This is how a pool shared by many QPs gets back the slots of a connection that ended
    /// with work requests in flight, whose completions were not reaped (a destroyed QP owes
    /// none).
    ///
    /// # Errors
    /// `posted` unchanged while the QP is not destroyed (alive, or its destroy failed), or when
    /// it was not posted through a handle of this QP (another QP, even one of the same number,
    /// or an id's or a [`Qp`](super::Qp)'s own post).
    pub fn reclaim(&self, posted: PostedSlot) -> std::result::Result<Slot, PostedSlot> {
        if posted.gate == self.0.serial() && self.0.is_destroyed() {
            Ok(posted.reclaimed())
        } else {
            Err(posted)
        }
    }

    /// Tags a post through this handle with its gate's serial ([`reclaim`](Self::reclaim)).
    #[inline]
    fn tag(
        &self,
        posted: std::result::Result<PostedSlot, SlotPostError>,
    ) -> std::result::Result<PostedSlot, SlotPostError> {
        posted.map(|mut p| {
            p.gate = self.0.serial();
            p
        })
    }
}

impl QpHandle {
    /// The post behind the one-sided methods: `op` with `slot`'s first `len` bytes, once
    /// `addr` (the remote range's check) is `Ok`.
    fn remote(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
        len: usize,
        addr: std::result::Result<u64, RemoteError>,
        op: impl FnOnce(u64) -> crate::ffi::verbs::RemoteOp,
    ) -> std::result::Result<PostedSlot, SlotPostError> {
        let addr = match addr {
            Ok(a) => a,
            Err(e) => {
                return Err(SlotPostError {
                    slot,
                    error: e.into(),
                })
            }
        };
        self.0.with(|qp| match qp {
            Some(qp) => self.tag(super::slots::remote_on(Some(qp), mr, slot, len, op(addr))),
            None => Err(destroyed(slot)),
        })
    }

    /// RDMA WRITE of `slot`'s first [`len`](Slot::len) bytes to `offset` of the peer's `to`
    /// (with immediate data when `imm` is `Some`, which consumes a receive of the peer's). The
    /// slot stays with the returned [`PostedSlot`] until the completion.
    ///
    /// # Errors
    /// [`SlotPostError`], with the slot: [`Error::Remote`] when the range is not inside `to`,
    /// or the slot is empty and `imm` is `None` (nothing posted), else as
    /// [`post_send_slot`](Self::post_send_slot).
    #[doc(alias = "IBV_WR_RDMA_WRITE")]
    pub fn post_write_slot<A: AllowsWrite>(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
        to: &RemoteBuf<A>,
        offset: u64,
        imm: Option<u32>,
    ) -> std::result::Result<PostedSlot, SlotPostError> {
        let len = slot.len();
        let rkey = to.rkey();
        let addr = write_range(to, offset, len, imm);
        self.remote(mr, slot, len, addr, |addr| {
            crate::ffi::verbs::RemoteOp::Write { addr, rkey, imm }
        })
    }

    /// RDMA READ of `len` (at least 1) bytes at `offset` of the peer's `from` into `slot`,
    /// whose bytes are back (its [`len`](Slot::len) set) only with the completion.
    ///
    /// READ and the atomics need the connection to allow them: an initiator depth of at least
    /// 1 on this side and responder resources of at least 1 on the peer's (rdma_cm's
    /// `ConnParam` defaults, 1 and 1; rdma_cm's CM then grants the peer's QP remote read and
    /// atomic access). With an initiator depth of 0, rdma_rxe holds the request and it never
    /// completes.
    ///
    /// # Errors
    /// [`SlotPostError`], with the slot: [`Error::Remote`] when the range is not inside `from`
    /// or `len` is above the slot's capacity (nothing posted), else as
    /// [`post_send_slot`](Self::post_send_slot).
    #[doc(alias = "IBV_WR_RDMA_READ")]
    pub fn post_read_slot<A: AllowsRead>(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
        from: &RemoteBuf<A>,
        offset: u64,
        len: usize,
    ) -> std::result::Result<PostedSlot, SlotPostError> {
        let rkey = from.rkey();
        let addr = from.bytes_range(offset, len);
        self.remote(mr, slot, len, addr, |addr| {
            crate::ffi::verbs::RemoteOp::Read { addr, rkey }
        })
    }

    /// 8-byte fetch-and-add of `add` on the aligned word at `offset` of the peer's `at`; the
    /// word's previous value arrives in the slot's first 8 bytes with the completion (read it
    /// with [`atomic_result`]).
    ///
    /// # Errors
    /// [`SlotPostError`], with the slot: [`Error::Remote`] when the word is not inside `at`,
    /// not aligned, or the slot is under 8 bytes (nothing posted), else as
    /// [`post_send_slot`](Self::post_send_slot).
    #[doc(alias = "IBV_WR_ATOMIC_FETCH_AND_ADD")]
    pub fn post_fetch_add_slot<A: AllowsAtomic>(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
        at: &RemoteBuf<A>,
        offset: u64,
        add: u64,
    ) -> std::result::Result<PostedSlot, SlotPostError> {
        let rkey = at.rkey();
        self.remote(mr, slot, 8, at.word(offset), |addr| {
            crate::ffi::verbs::RemoteOp::FetchAdd { addr, rkey, add }
        })
    }

    /// 8-byte compare-and-swap on the aligned word at `offset` of the peer's `at`: `swap` is
    /// written if the word equals `compare`; the previous value arrives in the slot as for
    /// [`post_fetch_add_slot`](Self::post_fetch_add_slot).
    ///
    /// # Errors
    /// As [`post_fetch_add_slot`](Self::post_fetch_add_slot).
    #[doc(alias = "IBV_WR_ATOMIC_CMP_AND_SWP")]
    pub fn post_compare_swap_slot<A: AllowsAtomic>(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
        at: &RemoteBuf<A>,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> std::result::Result<PostedSlot, SlotPostError> {
        let rkey = at.rkey();
        self.remote(mr, slot, 8, at.word(offset), |addr| {
            crate::ffi::verbs::RemoteOp::CompareSwap {
                addr,
                rkey,
                compare,
                swap,
            }
        })
    }
}

impl QpHandle {
    /// The post behind the registered-buffer methods: `op` with `mr`'s first `len` bytes as
    /// the local side, once `addr` (the remote range's check, `Ok(0)` for a SEND) is `Ok`.
    fn post_mr<B: MrBuffer + 'static>(
        &self,
        mr: OwnedMr<B>,
        len: usize,
        addr: std::result::Result<u64, RemoteError>,
        op: impl FnOnce(u64) -> crate::ffi::verbs::SlotOp,
        fetched: bool,
    ) -> std::result::Result<PostedMr<B>, MrPostError<B>> {
        let addr = match addr {
            Ok(a) => a,
            Err(e) => {
                return Err(MrPostError {
                    mr,
                    error: e.into(),
                })
            }
        };
        let have = mr.mr().as_slice().len();
        if len > have {
            return Err(MrPostError {
                mr,
                error: RemoteError::LocalTooSmall {
                    need: len,
                    capacity: have,
                }
                .into(),
            });
        }
        let qp_num = self.qp_num();
        self.0.with(|qp| {
            let Some(qp) = qp else {
                return Err(MrPostError {
                    mr,
                    error: Error::QpDestroyed,
                });
            };
            match mr.0.post(qp, len, op(addr)) {
                Ok((wr_id, cell)) => Ok(PostedMr {
                    mr: OwnedMr(cell),
                    wr_id,
                    qp_num,
                    fetched: fetched.then_some(len),
                }),
                Err((why, cell)) => Err(MrPostError {
                    mr: OwnedMr(cell),
                    error: match why {
                        crate::ffi::verbs::SlotRefusal::ForeignPd => Error::InvalidArgument(
                            "the buffer is registered on another PD than the QP's",
                        ),
                        crate::ffi::verbs::SlotRefusal::NotOfPool => {
                            Error::InvalidArgument("not a buffer of this region")
                        }
                        crate::ffi::verbs::SlotRefusal::Io(e) => Error::io("ibv_post_send")(e),
                    },
                }),
            }
        })
    }

    /// `ibv_post_send` of a signaled SEND of the first `len` bytes of `mr`'s buffer (none at
    /// all when `len` is 0), with immediate data when `imm` is `Some`: zero-copy, the device
    /// reads the buffer itself. The region stays with the returned [`PostedMr`] until the
    /// completion.
    ///
    /// # Errors
    /// [`MrPostError`], with the region: [`Error::QpDestroyed`] once the id destroyed the QP;
    /// [`Error::Remote`] ([`RemoteError::LocalTooSmall`]) when `len` is beyond the buffer;
    /// [`Error::InvalidArgument`] for a region of another PD than the QP's; else the
    /// `ibv_post_send` error (`ENOMEM`: the send queue is full).
    #[doc(alias = "ibv_post_send")]
    pub fn post_send_mr<B: MrBuffer + 'static>(
        &self,
        mr: OwnedMr<B>,
        len: usize,
        imm: Option<u32>,
    ) -> std::result::Result<PostedMr<B>, MrPostError<B>> {
        self.post_mr(
            mr,
            len,
            Ok(0),
            |_| crate::ffi::verbs::SlotOp::Send { len, imm },
            false,
        )
    }

    /// RDMA WRITE of the first `len` bytes of `mr`'s buffer to `offset` of the peer's `to`
    /// (with immediate data when `imm` is `Some`, which consumes a receive of the peer's),
    /// zero-copy. The region stays with the returned [`PostedMr`] until the completion.
    ///
    /// # Errors
    /// [`MrPostError`], with the region: [`Error::Remote`] when the range is not inside `to`,
    /// or `len` is 0 and `imm` is `None` (nothing posted), else as
    /// [`post_send_mr`](Self::post_send_mr).
    #[doc(alias = "IBV_WR_RDMA_WRITE")]
    pub fn post_write_mr<A: AllowsWrite, B: MrBuffer + 'static>(
        &self,
        mr: OwnedMr<B>,
        len: usize,
        to: &RemoteBuf<A>,
        offset: u64,
        imm: Option<u32>,
    ) -> std::result::Result<PostedMr<B>, MrPostError<B>> {
        let rkey = to.rkey();
        let addr = write_range(to, offset, len, imm);
        self.post_mr(
            mr,
            len,
            addr,
            |addr| crate::ffi::verbs::SlotOp::Remote {
                len,
                op: crate::ffi::verbs::RemoteOp::Write { addr, rkey, imm },
            },
            false,
        )
    }

    /// RDMA READ of `len` (at least 1) bytes at `offset` of the peer's `from` into the first
    /// `len` bytes of `mr`'s buffer, zero-copy: the bytes are there when [`PostedMr::complete`]
    /// gives the region back. Needs what [`post_read_slot`](Self::post_read_slot) needs.
    ///
    /// # Errors
    /// [`MrPostError`], with the region: [`Error::Remote`] when the range is not inside
    /// `from`, `len` is 0, or `len` is beyond the buffer (nothing posted), else as
    /// [`post_send_mr`](Self::post_send_mr).
    #[doc(alias = "IBV_WR_RDMA_READ")]
    pub fn post_read_mr<A: AllowsRead, B: MrBuffer + 'static>(
        &self,
        mr: OwnedMr<B>,
        len: usize,
        from: &RemoteBuf<A>,
        offset: u64,
    ) -> std::result::Result<PostedMr<B>, MrPostError<B>> {
        let rkey = from.rkey();
        let addr = from.bytes_range(offset, len);
        self.post_mr(
            mr,
            len,
            addr,
            |addr| crate::ffi::verbs::SlotOp::Remote {
                len,
                op: crate::ffi::verbs::RemoteOp::Read { addr, rkey },
            },
            true,
        )
    }
}

/// A registered buffer handed to the device by a posted work request
/// ([`QpHandle::post_send_mr`], [`post_write_mr`](QpHandle::post_write_mr),
/// [`post_read_mr`](QpHandle::post_read_mr)), until its completion: it shows no bytes, and
/// gives the region back only for that completion. Dropped before, the region is
/// deregistered (after which the device can no longer reach the bytes; the request, if still
/// queued, fails with a protection error) and only then freed; forgotten, the buffer is
/// leaked, never freed.
#[must_use = "the buffer comes back with `complete`; dropped, it is deregistered and freed"]
pub struct PostedMr<B: MrBuffer> {
    mr: OwnedMr<B>,
    wr_id: u64,
    qp_num: u32,
    /// A READ's length: what the device wrote on success.
    fetched: Option<usize>,
}

impl<B: MrBuffer> PostedMr<B> {
    /// The work request id its completion carries.
    #[must_use]
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// Whether `wc` is this work request's completion.
    #[must_use]
    pub fn is_completed_by(&self, wc: &super::WorkCompletion) -> bool {
        wc.qp_num() == self.qp_num && wc.wr_id() == self.wr_id
    }

    /// The region back, when `wc` is this work request's completion (any status: a completion
    /// means the device is done with the buffer); `Err(self)` otherwise. A READ's bytes are in
    /// the buffer on a successful completion.
    ///
    /// # Errors
    /// `self`, when `wc` is another work request's completion.
    pub fn complete(self, wc: &super::WorkCompletion) -> std::result::Result<OwnedMr<B>, Self> {
        if self.is_completed_by(wc) {
            Ok(self.mr)
        } else {
            Err(self)
        }
    }

    /// A READ's length (the bytes the device writes), `None` for a SEND or a WRITE.
    #[must_use]
    pub fn read_len(&self) -> Option<usize> {
        self.fetched
    }
}

impl<B: MrBuffer> fmt::Debug for PostedMr<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No bytes: the device may be writing them.
        f.debug_struct("PostedMr")
            .field("qp_num", &self.qp_num)
            .field("wr_id", &self.wr_id)
            .field("read_len", &self.fetched)
            .finish_non_exhaustive()
    }
}

/// Posting a registered buffer failed; the region comes back unchanged.
#[derive(thiserror::Error)]
#[error("{error}")]
pub struct MrPostError<B: MrBuffer> {
    /// The region that was to be posted.
    pub mr: OwnedMr<B>,
    /// Why (see the posting method).
    #[source]
    pub error: Error,
}

impl<B: MrBuffer> MrPostError<B> {
    /// Whether the send queue is full (`ENOMEM` from the post): try again after a completion.
    #[must_use]
    pub fn is_queue_full(&self) -> bool {
        self.error.is_queue_full()
    }
}

impl<B: MrBuffer> fmt::Debug for MrPostError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MrPostError")
            .field("mr", &self.mr)
            .field("error", &self.error)
            .finish()
    }
}

/// The previous value an atomic's completed slot holds: its first 8 bytes read in the host's
/// byte order; `None` for a slot under 8 bytes long. The byte order the device writes is the
/// provider's: rdma_rxe writes the host's (it converts the wire's big-endian value,
/// `atmack_orig`); some adapters are reported to write big-endian on little-endian hosts, where
/// the value must be byte-swapped.
#[must_use]
pub fn atomic_result(slot: &Slot) -> Option<u64> {
    let b: [u8; 8] = slot.as_slice().get(..8)?.try_into().ok()?;
    Some(u64::from_ne_bytes(b))
}

/// A WRITE's remote address: `len` bytes at `offset` inside `to`; an empty WRITE only with
/// immediate data (without, it would skip the responder's key check).
fn write_range<A: Access>(
    to: &RemoteBuf<A>,
    offset: u64,
    len: usize,
    imm: Option<u32>,
) -> std::result::Result<u64, RemoteError> {
    if len == 0 && imm.is_none() {
        return Err(RemoteError::Empty);
    }
    to.range(offset, len as u64)
}

fn destroyed(slot: Slot) -> SlotPostError {
    SlotPostError {
        slot,
        error: Error::QpDestroyed,
    }
}

impl fmt::Debug for QpHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpHandle")
            .field("qp_num", &self.qp_num())
            .field("alive", &self.is_alive())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn assert_owner<T: Send + Sync + 'static>() {}
    const _: () = assert_owner::<OwnedPd>();
    const _: () = assert_owner::<OwnedCompChannel>();
    const _: () = assert_owner::<OwnedCq>();
    const _: () = assert_owner::<OwnedMr<SlotPool>>();
    const _: () = assert_owner::<OwnedMr<Vec<u8>>>();
    const _: () = assert_owner::<QpHandle>();
    const _: () = assert_owner::<PostedMr<Vec<u8>>>();
    #[cfg(feature = "tokio")]
    const _: () = assert_owner::<CqWaiter>();
}
