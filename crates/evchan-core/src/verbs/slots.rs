//! Registered slot pools: receive (and send) buffers that can outlive their memory region,
//! for zero-copy receive.
//!
//! [`SlotPool`] has the design, the safety argument and an example; the unsafe half is in
//! `ffi::verbs::slots`.

use std::fmt;
use std::io;
use std::sync::Arc;

use crate::cm::state::State;
use crate::ffi::verbs as ffi;
use crate::CmId;

use super::qp::no_qp;
use super::{Error, Mr, Qp, WorkCompletion};

/// Why a [`SlotPool`] cannot be made, or a length does not fit a [`Slot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SlotError {
    /// A pool of zero slots.
    #[error("a slot pool needs at least one slot")]
    NoSlots,
    /// Slots of zero bytes.
    #[error("a slot needs at least one byte")]
    EmptySlot,
    /// A slot larger than one work request can carry (`u32::MAX` bytes).
    #[error("a slot of {size} bytes is larger than a work request can carry (4 GiB - 1)")]
    SlotTooLarge {
        /// The slot size asked for.
        size: usize,
    },
    /// `count × size` (rounded up to pages) overflows.
    #[error("{count} slots of {size} bytes do not fit in the address space")]
    PoolTooLarge {
        /// The number of slots asked for.
        count: usize,
        /// The slot size asked for.
        size: usize,
    },
    /// The allocation failed.
    #[error("out of memory allocating a slot pool of {bytes} bytes")]
    OutOfMemory {
        /// The bytes asked of the allocator.
        bytes: usize,
    },
    /// A length past the slot's capacity ([`Slot::set_len`], [`Slot::copy_from`]).
    #[error("length {len} is over the slot's capacity of {capacity} bytes")]
    LenOverCapacity {
        /// The length asked for.
        len: usize,
        /// The slot's capacity.
        capacity: usize,
    },
}

impl From<SlotError> for io::Error {
    fn from(e: SlotError) -> io::Error {
        let kind = match e {
            SlotError::OutOfMemory { .. } => io::ErrorKind::OutOfMemory,
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// `count` equal slots of registered memory in one zeroed, page-aligned mapping, for
/// zero-copy receive: the [`MrBuffer`](super::MrBuffer) of one memory region, whose slots are
/// [`Slot`] tokens that can outlive it.
///
/// A pool is one anonymous mapping (`mmap`, whole pages) of `count` slots of `size` bytes,
/// unmapped when the pool and its last slot are gone, so its memory goes back to the system
/// then, not to the allocator's arenas. It is registered as **one** memory region
/// ([`Pd::reg_mr`](super::Pd::reg_mr) / [`Mr::new`]). Its slots are handed out once, at creation, as [`Slot`]s: exclusive, owned (`Send + Sync + 'static`) tokens that keep
/// the pool's memory alive, so received bytes can go on living in the slot after the
/// connection, the [`Mr`], the [`Pd`](super::Pd) and the [`Context`](super::Context) are gone
/// (e.g. as `bytes::Bytes::from_owner(slot)`, since a slot is `AsRef<[u8]>`).
///
/// Slot `i` is the bytes `i × size .. (i + 1) × size` of the region. A slot is posted by
/// value on a [`Qp`] or an rdma_cm id's QP ([`CmId`]) —
/// [`post_recv_slot`](Qp::post_recv_slot), [`post_send_slot`](Qp::post_send_slot) — and comes
/// back from the [`PostedSlot`] for its work request's completion
/// ([`PostedSlot::complete`]), with [`Slot::len`] set to the bytes received.
///
/// # Why it is safe
///
/// The device writes (or reads) a slot only while it is posted, and a posted slot's token is
/// inside its [`PostedSlot`], which shows no bytes and gives the token back only for that work
/// request's completion: so Rust never holds a reference to bytes the device may write. The
/// memory is freed only when the pool (held by its registered [`Mr`] until `ibv_dereg_mr`) and
/// every slot, posted or not, are gone, so it is never freed while the device can reach it.
///
/// What follows from it:
///
/// - dropping or [`forget`](std::mem::forget)ting a [`PostedSlot`] before its completion loses
///   that slot for good (it is never handed out again); its memory stays allocated until the
///   [`Mr`] is deregistered *and* every other slot of the pool is gone (forgotten: forever);
/// - the [`Mr`] of a pool shows no bytes ([`Mr::as_slice`] is empty, [`Mr::len`] is 0): a slice
///   of the whole pool would alias the slots, and the posted ones the device writes;
/// - a slot posted with the [`Mr`] of another pool, or with an [`Mr`] of another PD than the
///   QP's, is refused before the call, and comes back in the [`SlotPostError`].
///
/// # Example
///
/// ```no_run
/// use evchan_core::verbs::{CompChannel, Context, Cq, Pd, Qp, QpCaps, RtrAttr, RtsAttr, SlotPool};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::open_first()?;
/// let pd = Pd::new(&ctx)?;
/// let channel = CompChannel::new(&ctx)?;
/// let cq = Cq::new(&channel, 256)?;
/// let (a, b) = (Qp::new_rc(&pd, &cq, &cq, QpCaps::default())?,
///               Qp::new_rc(&pd, &cq, &cq, QpCaps::default())?);
/// let gid = ctx.gids(1)?.into_iter().last().expect("a GID");
/// for (qp, peer) in [(&a, &b), (&b, &a)] {
///     qp.modify_to_init(1)?;
///     qp.modify_to_rtr(&RtrAttr::new(1, peer.qp_num(), &gid, gid.raw))?;
///     qp.modify_to_rts(&RtsAttr::default())?;
/// }
/// let (pool, mut slots) = SlotPool::new(8, 4096)?;
/// let mr = pd.reg_mr(pool)?;
/// let rx = b.post_recv_slot(&mr, slots.pop().unwrap())?;
/// let mut tx = slots.pop().unwrap();
/// tx.copy_from(b"hello")?;
/// let tx = a.post_send_slot(&mr, tx, None)?;
/// let (mut rx, mut tx) = (Some(rx), Some(tx));
/// let mut received = None;
/// while rx.is_some() || tx.is_some() {
///     cq.wait(None, |wc| {
///         match rx.take().map(|p| p.complete(&wc)) {
///             Some(Ok(slot)) => received = Some(slot),
///             Some(Err(p)) => rx = Some(p),
///             None => {}
///         }
///         if let Some(p) = tx.take() {
///             match p.complete(&wc) {
///                 Ok(slot) => slots.push(slot),
///                 Err(p) => tx = Some(p),
///             }
///         }
///     })?;
/// }
/// drop((a, b, mr));
/// // The received slot outlives its region, QPs, PD and context.
/// drop(cq);
/// drop(channel);
/// drop(pd);
/// drop(ctx);
/// assert_eq!(received.unwrap().as_slice(), b"hello");
/// # Ok(())
/// # }
/// ```
///
/// # References
///
/// [`ibv_reg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html),
/// [`ibv_post_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html),
/// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
pub struct SlotPool {
    pub(crate) raw: Arc<ffi::SlotRegion>,
}

impl SlotPool {
    /// Allocates `count` zeroed slots of `size` bytes and hands out every slot's token, once:
    /// `slots[i].index() == i`.
    ///
    /// # Errors
    /// [`SlotError`]: zero slots or bytes, a slot over `u32::MAX` bytes, a pool that overflows
    /// the address space, or an allocation failure.
    pub fn new(count: usize, size: usize) -> Result<(SlotPool, Vec<Slot>), SlotError> {
        let (raw, slots) = ffi::SlotRegion::new(count, size, |raw| Slot { raw, len: 0 })?;
        Ok((SlotPool { raw }, slots))
    }

    /// The memory a pool of `count` slots of `size` bytes takes: `count × size` rounded up to
    /// whole pages (its mapping). `None` when [`new`](Self::new) would refuse the sizes.
    #[must_use]
    pub fn mapped_bytes(count: usize, size: usize) -> Option<usize> {
        ffi::SlotRegion::mapped_bytes(count, size)
    }

    /// The number of slots.
    #[must_use]
    pub fn count(&self) -> usize {
        self.raw.count()
    }

    /// The size of each slot in bytes.
    #[must_use]
    pub fn slot_size(&self) -> usize {
        self.raw.slot_size()
    }

    /// Whether `slot` is one of this pool's.
    #[must_use]
    pub fn contains(&self, slot: &Slot) -> bool {
        std::ptr::eq(&*self.raw, slot.raw.region())
    }
}

impl fmt::Debug for SlotPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotPool")
            .field("addr", &self.raw.addr())
            .field("count", &self.count())
            .field("slot_size", &self.slot_size())
            .finish()
    }
}

/// The exclusive token of one slot of a [`SlotPool`]: its bytes, and how many of them are
/// valid ([`len`](Self::len)).
///
/// Owned (`Send + Sync + 'static`, not `Clone`): it keeps the pool's memory alive however long
/// it lives, also after the [`Mr`], the PD and the device context are gone. The valid length
/// is set by a receive's completion ([`PostedSlot::complete`]) or by [`set_len`](Self::set_len)
/// before a send. [`AsRef<[u8]>`](AsRef) is [`as_slice`](Self::as_slice), so a slot can own a
/// `bytes::Bytes` (`Bytes::from_owner(slot)`). `Debug` shows the index and the length, never
/// the contents.
///
/// A slot is not `Clone`: its token is the only way to its bytes.
///
/// ```compile_fail
/// # let (_pool, mut slots) = evchan_core::verbs::SlotPool::new(1, 8).unwrap();
/// let slot = slots.pop().unwrap();
/// let twin = slot.clone(); // no second token of one slot
/// ```
pub struct Slot {
    raw: ffi::RawSlot,
    len: usize,
}

impl Slot {
    /// The slot's index in its pool.
    #[must_use]
    pub fn index(&self) -> usize {
        self.raw.index()
    }

    /// The slot's size in bytes (the pool's slot size).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.raw.capacity()
    }

    /// The valid bytes: what the last receive into the slot brought, or what
    /// [`set_len`](Self::set_len) set (0 for a new slot, and after a failed receive).
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether [`len`](Self::len) is 0.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The valid bytes, `..len()`.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        self.raw.bytes(self.len)
    }

    /// The whole slot (`..capacity()`), to fill before a send; then [`set_len`](Self::set_len).
    /// The same as [`buf_mut`](Self::buf_mut).
    #[must_use]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.raw.bytes_mut()
    }

    /// The whole slot (`..capacity()`), to fill before a send; then [`set_len`](Self::set_len).
    #[must_use]
    pub fn buf_mut(&mut self) -> &mut [u8] {
        self.raw.bytes_mut()
    }

    /// Sets the valid length, e.g. what a send will carry.
    ///
    /// # Errors
    /// [`SlotError::LenOverCapacity`] when `len > capacity()`; the length is then unchanged.
    pub fn set_len(&mut self, len: usize) -> Result<(), SlotError> {
        if len > self.capacity() {
            return Err(SlotError::LenOverCapacity {
                len,
                capacity: self.capacity(),
            });
        }
        self.len = len;
        Ok(())
    }

    /// Copies `data` to the start of the slot and sets the length to `data.len()`.
    ///
    /// # Errors
    /// [`SlotError::LenOverCapacity`] when `data` does not fit; the slot is then unchanged.
    pub fn copy_from(&mut self, data: &[u8]) -> Result<(), SlotError> {
        let capacity = self.capacity();
        let dst = self
            .raw
            .bytes_mut()
            .get_mut(..data.len())
            .ok_or(SlotError::LenOverCapacity {
                len: data.len(),
                capacity,
            })?;
        dst.copy_from_slice(data);
        self.len = data.len();
        Ok(())
    }
}

impl AsRef<[u8]> for Slot {
    /// [`as_slice`](Slot::as_slice): the valid bytes.
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("index", &self.index())
            .field("len", &self.len)
            .finish()
    }
}

/// A [`Slot`] lent to the device by a posted work request, until its completion.
///
/// It shows no bytes. [`complete`](Self::complete) gives the slot back for this work request's
/// completion (any status); for a receive, with [`Slot::len`] set to the bytes received
/// (`min(byte_len, capacity)`, 0 on an error status). Dropping or forgetting it before loses
/// the slot (see [`SlotPool`], "Why it is safe"); no memory the device may still touch is freed or
/// read.
///
/// While the device owns the slot, its bytes are out of reach:
///
/// ```compile_fail
/// # fn f(posted: &evchan_core::verbs::PostedSlot) {
/// let bytes: &[u8] = posted.as_ref(); // a posted slot shows no bytes
/// # }
/// ```
#[must_use = "the slot comes back with `complete`; dropped, it is lost"]
pub struct PostedSlot {
    slot: Slot,
    wr_id: u64,
    qp_num: u32,
    recv: bool,
    /// A READ's or an atomic's length: the device writes that many bytes of the slot, which
    /// are its length after a successful completion.
    fetched: Option<usize>,
    /// The serial of the [`QpHandle`](super::QpHandle) gate it was posted through (0: posted
    /// through an id or a [`Qp`](super::Qp)): what [`QpHandle::reclaim`](super::QpHandle::reclaim)
    /// checks.
    pub(super) gate: u64,
}

impl PostedSlot {
    /// The `wr_id` the work request was posted with (chosen by evchan, top bit set, unique
    /// among all owned posts of the process).
    #[must_use]
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The QP it was posted on.
    #[must_use]
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Whether it is a receive (else a send).
    #[must_use]
    pub fn is_recv(&self) -> bool {
        self.recv
    }

    /// The slot's index in its pool.
    #[must_use]
    pub fn index(&self) -> usize {
        self.slot.index()
    }

    /// Whether `wc` is this work request's completion.
    #[must_use]
    pub fn is_completed_by(&self, wc: &WorkCompletion) -> bool {
        wc.qp_num() == self.qp_num && wc.wr_id() == self.wr_id
    }

    /// The slot back, when `wc` is this work request's completion (any status: a completion
    /// means the device is done with the slot); `Err(self)` otherwise. For a receive, the
    /// slot's length is set to `min(wc.byte_len(), capacity)` on success, 0 on an error status;
    /// for an RDMA READ or an atomic, to the length asked (8 for an atomic) on success, 0 on an
    /// error status.
    ///
    /// # Errors
    /// `self`, when `wc` is another work request's completion.
    pub fn complete(self, wc: &WorkCompletion) -> Result<Slot, Self> {
        if !self.is_completed_by(wc) {
            return Err(self);
        }
        let mut slot = self.slot;
        if let Some(n) = self.fetched {
            slot.len = if wc.is_success() { n } else { 0 };
        } else if self.recv {
            slot.len = if wc.is_success() {
                usize::try_from(wc.byte_len()).map_or(slot.capacity(), |n| n.min(slot.capacity()))
            } else {
                0
            };
        }
        Ok(slot)
    }
}

impl PostedSlot {
    /// The slot back without a completion, for a QP that is destroyed (the caller checked):
    /// its length as posted for a send or a WRITE, 0 for a receive, a READ or an atomic (as
    /// after an error completion).
    pub(super) fn reclaimed(self) -> Slot {
        let mut slot = self.slot;
        if self.recv || self.fetched.is_some() {
            slot.len = 0;
        }
        slot
    }
}

impl fmt::Debug for PostedSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostedSlot")
            .field("index", &self.slot.index())
            .field("recv", &self.recv)
            .field("qp_num", &self.qp_num)
            .field("wr_id", &self.wr_id)
            .finish()
    }
}

/// Posting a slot failed; the slot comes back unchanged.
#[derive(thiserror::Error)]
#[error("{error}")]
pub struct SlotPostError {
    /// The slot that was to be posted.
    pub slot: Slot,
    /// Why: [`Error::InvalidArgument`] for a slot of another pool than the region's, or a
    /// region of another PD than the QP's; [`Error::Io`] for an id without a QP of the
    /// caller's, a UD QP, or the `ibv_post_send` / `ibv_post_recv` error (`ENOMEM`: the queue
    /// is full, see [`is_queue_full`](Self::is_queue_full)).
    #[source]
    pub error: Error,
}

impl SlotPostError {
    /// The OS error code, when the post itself failed.
    #[must_use]
    pub fn raw_os_error(&self) -> Option<i32> {
        self.error.raw_os_error()
    }

    /// Whether the work queue is full (`ENOMEM` from the post): backpressure, try again after
    /// a completion.
    #[must_use]
    pub fn is_queue_full(&self) -> bool {
        self.error.is_queue_full()
    }
}

impl fmt::Debug for SlotPostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotPostError")
            .field("slot", &self.slot)
            .field("error", &self.error)
            .finish()
    }
}

impl From<SlotPostError> for io::Error {
    /// The error, without the slot (which is dropped).
    fn from(e: SlotPostError) -> io::Error {
        e.error.into()
    }
}

/// The post behind the four methods; `qp` is `None` for an id without a QP of the caller's.
fn post(
    call: &'static str,
    qp: Option<ffi::QpPtr<'_>>,
    mr: &Mr<'_, SlotPool>,
    slot: Slot,
    op: ffi::SlotOp,
) -> Result<PostedSlot, SlotPostError> {
    let Some(qp) = qp else {
        return Err(SlotPostError {
            slot,
            error: Error::io(call)(no_qp()),
        });
    };
    let len = slot.len;
    match ffi::post_slot(qp, &mr.raw, slot.raw, op) {
        Ok((wr_id, raw)) => Ok(PostedSlot {
            slot: Slot { raw, len },
            wr_id,
            qp_num: qp.qp_num(),
            gate: 0,
            recv: matches!(op, ffi::SlotOp::Recv),
            fetched: match op {
                ffi::SlotOp::Remote {
                    len,
                    op:
                        ffi::RemoteOp::Read { .. }
                        | ffi::RemoteOp::FetchAdd { .. }
                        | ffi::RemoteOp::CompareSwap { .. },
                } => Some(len),
                _ => None,
            },
        }),
        Err((why, raw)) => Err(SlotPostError {
            slot: Slot { raw, len },
            error: match why {
                ffi::SlotRefusal::NotOfPool => {
                    Error::InvalidArgument("the slot is not of the memory region's pool")
                }
                ffi::SlotRefusal::ForeignPd => Error::InvalidArgument(
                    "the memory region is of another PD than the QP's (register the pool on the QP's PD)",
                ),
                ffi::SlotRefusal::Io(e) => Error::io(call)(e),
            },
        }),
    }
}

/// A one-sided operation with `slot`'s first `len` bytes as its local side (checked against
/// the slot's capacity here).
pub(super) fn remote_on(
    qp: Option<ffi::QpPtr<'_>>,
    mr: &Mr<'_, SlotPool>,
    slot: Slot,
    len: usize,
    op: ffi::RemoteOp,
) -> Result<PostedSlot, SlotPostError> {
    if len > slot.capacity() {
        let capacity = slot.capacity();
        return Err(SlotPostError {
            slot,
            error: super::RemoteError::LocalTooSmall {
                need: len,
                capacity,
            }
            .into(),
        });
    }
    post(
        "ibv_post_send",
        qp,
        mr,
        slot,
        ffi::SlotOp::Remote { len, op },
    )
}

pub(super) fn recv_on(
    qp: Option<ffi::QpPtr<'_>>,
    mr: &Mr<'_, SlotPool>,
    slot: Slot,
) -> Result<PostedSlot, SlotPostError> {
    post("ibv_post_recv", qp, mr, slot, ffi::SlotOp::Recv)
}

pub(super) fn send_on(
    qp: Option<ffi::QpPtr<'_>>,
    mr: &Mr<'_, SlotPool>,
    slot: Slot,
    imm: Option<u32>,
) -> Result<PostedSlot, SlotPostError> {
    let len = slot.len;
    post(
        "ibv_post_send",
        qp,
        mr,
        slot,
        ffi::SlotOp::Send { len, imm },
    )
}

impl Qp<'_> {
    /// `ibv_post_recv` into the whole of `slot`, a slot of the pool `mr` registered. The slot
    /// stays with the returned [`PostedSlot`] until the completion, which sets its length.
    ///
    /// # Errors
    /// [`SlotPostError`], with the slot: a slot of another pool than `mr`'s, an `mr` of
    /// another PD than the QP's (both refused before the call), or the `ibv_post_recv` error
    /// (`ENOMEM`: the receive queue is full).
    #[doc(alias = "ibv_post_recv")]
    pub fn post_recv_slot(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
    ) -> Result<PostedSlot, SlotPostError> {
        recv_on(Some(self.ffi_ptr()), mr, slot)
    }

    /// `ibv_post_send` of a signaled SEND of `slot`'s first [`len`](Slot::len) bytes (none at
    /// all when it is 0: no scatter/gather element, e.g. an immediate-only message), with
    /// immediate data when `imm` is `Some`. The slot stays with the returned [`PostedSlot`]
    /// until the completion.
    ///
    /// # Errors
    /// [`SlotPostError`], with the slot: as for [`post_recv_slot`](Self::post_recv_slot), with
    /// the `ibv_post_send` error (`ENOMEM`: the send queue is full).
    #[doc(alias = "ibv_post_send")]
    pub fn post_send_slot(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
        imm: Option<u32>,
    ) -> Result<PostedSlot, SlotPostError> {
        send_on(Some(self.ffi_ptr()), mr, slot, imm)
    }
}

impl<S: State> CmId<'_, S> {
    /// `ibv_post_recv` on the id's QP into the whole of `slot`, as
    /// [`Qp::post_recv_slot`]. Receives may be posted before `connect` / `accept`.
    ///
    /// # Errors
    /// [`SlotPostError`], with the slot: the id has no QP from
    /// [`create_qp_with`](Self::create_qp_with), its QP is UD (UDP port space), a slot of
    /// another pool than `mr`'s, an `mr` of another PD than the QP's, or the `ibv_post_recv`
    /// error.
    #[doc(alias = "ibv_post_recv")]
    pub fn post_recv_slot(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
    ) -> Result<PostedSlot, SlotPostError> {
        recv_on(self.raw.user_qp(), mr, slot)
    }

    /// `ibv_post_send` on the id's QP of a signaled SEND of `slot`'s first
    /// [`len`](Slot::len) bytes (possibly none), as [`Qp::post_send_slot`].
    ///
    /// # Errors
    /// As [`post_recv_slot`](Self::post_recv_slot), with the `ibv_post_send` error (`EINVAL`
    /// before the connection is established, `ENOMEM` when the send queue is full).
    #[doc(alias = "ibv_post_send")]
    pub fn post_send_slot(
        &self,
        mr: &Mr<'_, SlotPool>,
        slot: Slot,
        imm: Option<u32>,
    ) -> Result<PostedSlot, SlotPostError> {
        send_on(self.raw.user_qp(), mr, slot, imm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn assert_owner<T: Send + Sync + 'static>() {}
    const _: () = assert_owner::<Slot>();
    const _: () = assert_owner::<SlotPool>();
    const _: () = assert_owner::<PostedSlot>();
    const _: () = assert_owner::<SlotPostError>();

    #[test]
    fn sizes_and_indices() {
        let (pool, slots) = SlotPool::new(5, 100).unwrap();
        assert_eq!(pool.count(), 5);
        assert_eq!(pool.slot_size(), 100);
        assert_eq!(slots.len(), 5);
        for (i, s) in slots.iter().enumerate() {
            assert_eq!(s.index(), i);
            assert_eq!(s.capacity(), 100);
            assert_eq!(s.len(), 0);
            assert!(s.is_empty());
            assert!(pool.contains(s));
        }
        let (other, other_slots) = SlotPool::new(1, 100).unwrap();
        assert!(!other.contains(&slots[0]));
        assert!(!pool.contains(&other_slots[0]));
    }

    #[test]
    fn bad_sizes() {
        assert_eq!(SlotPool::new(0, 8).unwrap_err(), SlotError::NoSlots);
        assert_eq!(SlotPool::new(8, 0).unwrap_err(), SlotError::EmptySlot);
        assert!(matches!(
            SlotPool::new(usize::MAX, 2).unwrap_err(),
            SlotError::PoolTooLarge { .. }
        ));
        assert!(matches!(
            SlotPool::new(isize::MAX as usize / 4096, 4096).unwrap_err(),
            SlotError::PoolTooLarge { .. } | SlotError::OutOfMemory { .. }
        ));
        #[cfg(target_pointer_width = "64")]
        assert!(matches!(
            SlotPool::new(1, 1 << 32).unwrap_err(),
            SlotError::SlotTooLarge { .. }
        ));
        let e: io::Error = SlotError::NoSlots.into();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn zeroed_and_disjoint() {
        let (_pool, mut slots) = SlotPool::new(3, 10).unwrap();
        for s in &mut slots {
            assert_eq!(s.buf_mut(), &[0u8; 10][..]);
        }
        for (i, s) in slots.iter_mut().enumerate() {
            s.buf_mut().fill(i as u8 + 1);
            s.set_len(10).unwrap();
        }
        for (i, s) in slots.iter().enumerate() {
            assert_eq!(s.as_slice(), &[i as u8 + 1; 10][..]);
        }
    }

    #[test]
    fn len_bounds() {
        let (_pool, mut slots) = SlotPool::new(1, 16).unwrap();
        let mut s = slots.pop().unwrap();
        s.set_len(16).unwrap();
        assert_eq!(s.as_slice().len(), 16);
        assert_eq!(
            s.set_len(17).unwrap_err(),
            SlotError::LenOverCapacity {
                len: 17,
                capacity: 16
            }
        );
        assert_eq!(s.len(), 16, "unchanged after a refused set_len");
        s.copy_from(b"hello").unwrap();
        assert_eq!(s.as_slice(), b"hello");
        assert_eq!(AsRef::<[u8]>::as_ref(&s), b"hello");
        assert!(s.copy_from(&[1u8; 17]).is_err());
        assert_eq!(s.as_slice(), b"hello", "unchanged after a refused copy");
        s.set_len(0).unwrap();
        assert!(s.as_slice().is_empty());
        assert_eq!(s.as_mut_slice().len(), 16);
    }

    #[test]
    fn slot_outlives_pool() {
        let (pool, mut slots) = SlotPool::new(2, 8).unwrap();
        slots[1].copy_from(b"kept").unwrap();
        drop(pool);
        let kept = slots.pop().unwrap();
        drop(slots);
        assert_eq!(kept.as_slice(), b"kept");
    }

    #[test]
    fn pool_shows_no_bytes() {
        use crate::verbs::MrBuffer;
        let (mut pool, slots) = SlotPool::new(2, 8).unwrap();
        assert!(MrBuffer::as_slice(&pool).is_empty());
        assert!(MrBuffer::as_mut_slice(&mut pool).is_empty());
        drop(slots);
    }

    #[test]
    fn debug_shows_no_contents() {
        let (_pool, mut slots) = SlotPool::new(1, 8).unwrap();
        slots[0].copy_from(b"secret").unwrap();
        let s = format!("{:?}", slots[0]);
        assert_eq!(s, "Slot { index: 0, len: 6 }");
    }
}
