//! The anchors of the owned style (`crate::verbs::owned`): a borrowed-style object made on a
//! parent that the same value keeps alive by reference count, and the revocable gate of a QP
//! that an rdma_cm id owns.
//!
//! # Safety
//!
//! Each cell holds a borrowed-style object whose lifetime parameter is `'static`, made from a
//! reference into an [`Arc`] that the cell holds too: the borrow is not really `'static`, it
//! lasts as long as the cell. That is sound because
//!
//! - the `Arc`'s allocation never moves and is freed only when its last clone goes, and the
//!   cell's clone is a field declared *after* the object, so the object is dropped first (Rust
//!   drops fields in declaration order; no cell has a `Drop` of its own that could reorder
//!   it);
//! - the object is never handed out with its `'static` parameter: every accessor returns
//!   `&'a T<'a>` for a borrow `'a` of the cell (the types are covariant, so this is a plain
//!   coercion), so nothing reached through it can outlive the cell. Nothing moves the object
//!   out of a cell but [`MrCell::into_inner`], which consumes the region before the parent
//!   goes.
//!
//! [`QpGate`] is the other half: the QP belongs to its rdma_cm id, which destroys it; the gate
//! is shared with every [`QpHandle`](crate::verbs::QpHandle). A post holds the gate's read lock
//! for the whole `ibv_post_*` call and posts only while the gate is open; the id closes it with
//! the write lock, which waits for every post inside, before `rdma_destroy_qp`. So no post ever
//! reaches a destroyed QP, and one that comes later fails cleanly.

use std::ptr::NonNull;
use std::sync::{Arc, PoisonError, RwLock};

use evchan_sys as sys;

use super::verbs::QpPtr;
use crate::verbs::{CompChannel, Context, Cq, Mr, MrBuffer, Pd};

/// `*parent`, borrowed for `'static`.
///
/// # Safety
///
/// The caller keeps a clone of `parent` for as long as the returned reference (or anything
/// made from it) is used, and never hands either out as `'static` (see the module's docs).
unsafe fn anchor<T: ?Sized>(parent: &Arc<T>) -> &'static T {
    // SAFETY: `Arc::as_ptr` points at the live, pinned allocation; the caller keeps it alive.
    unsafe { &*Arc::as_ptr(parent) }
}

/// A PD on a context held by reference count.
#[derive(Debug)]
pub(crate) struct PdCell {
    // Declared before its parent: dropped first (module docs).
    pd: Pd<'static>,
    ctx: Arc<Context>,
}

impl PdCell {
    pub(crate) fn new(ctx: Arc<Context>) -> crate::verbs::Result<Self> {
        // SAFETY: `ctx` is kept in the cell, after `pd`; `pd` is only lent out shortened.
        let pd = Pd::new(unsafe { anchor(&ctx) })?;
        Ok(Self { pd, ctx })
    }

    pub(crate) fn pd(&self) -> &Pd<'_> {
        &self.pd
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

/// A completion channel on a context held by reference count.
#[derive(Debug)]
pub(crate) struct ChannelCell {
    channel: CompChannel<'static>,
    ctx: Arc<Context>,
}

impl ChannelCell {
    pub(crate) fn new(ctx: Arc<Context>) -> crate::verbs::Result<Self> {
        // SAFETY: as in `PdCell::new`.
        let channel = CompChannel::new(unsafe { anchor(&ctx) })?;
        Ok(Self { channel, ctx })
    }

    pub(crate) fn channel(&self) -> &CompChannel<'_> {
        &self.channel
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

/// A CQ on a completion channel held by reference count.
#[derive(Debug)]
pub(crate) struct CqCell {
    cq: Cq<'static>,
    channel: Arc<ChannelCell>,
}

impl CqCell {
    pub(crate) fn new(channel: Arc<ChannelCell>, entries: u32) -> crate::verbs::Result<Self> {
        // SAFETY: `channel` is kept in the cell, after `cq`, and holds the channel's own
        // parent; `cq` is only lent out shortened.
        let cq = Cq::new(&unsafe { anchor(&channel) }.channel, entries)?;
        Ok(Self { cq, channel })
    }

    pub(crate) fn cq(&self) -> &Cq<'_> {
        &self.cq
    }

    pub(crate) fn channel(&self) -> &Arc<ChannelCell> {
        &self.channel
    }
}

/// A memory region on a PD held by reference count.
pub(crate) struct MrCell<B: MrBuffer> {
    mr: Mr<'static, B>,
    pd: Arc<PdCell>,
}

impl<B: MrBuffer> MrCell<B> {
    pub(crate) fn new(pd: Arc<PdCell>, buf: B) -> Result<Self, (crate::verbs::Error, B)> {
        // SAFETY: `pd` is kept in the cell, after `mr`; `mr` is only lent out shortened (or
        // consumed by `into_inner` before `pd` goes).
        let mr = Mr::new(&unsafe { anchor(&pd) }.pd, buf)?;
        Ok(Self { mr, pd })
    }

    /// As [`new`](Self::new), registered with `access` (`ibv_access_flags`).
    pub(crate) fn with_access(
        pd: Arc<PdCell>,
        buf: B,
        access: u32,
    ) -> Result<Self, (crate::verbs::Error, B)> {
        // SAFETY: as in `new`.
        let mr = Mr::with_access(&unsafe { anchor(&pd) }.pd, buf, access)?;
        Ok(Self { mr, pd })
    }

    pub(crate) fn mr(&self) -> &Mr<'_, B> {
        &self.mr
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        self.mr.as_mut_slice()
    }

    pub(crate) fn pd(&self) -> &Arc<PdCell> {
        &self.pd
    }

    /// Posts `op` on `qp` with the buffer's first `len` bytes as the local side (no element
    /// when `len` is 0), with a fresh owned `wr_id` (top bit set): `Ok(wr_id)` with the region,
    /// which the caller keeps in the posted request's record until its completion (a record
    /// that shows no bytes and gives the region back only for this request's completion, or
    /// deregisters it before freeing the buffer when dropped, or leaks it when forgotten); or
    /// the refusal, with the region.
    ///
    /// Refused before the call: a region of another PD than `qp`'s, a UD QP, and `len` beyond
    /// the buffer's bytes.
    pub(crate) fn post(
        self,
        qp: QpPtr<'_>,
        len: usize,
        op: super::verbs::SlotOp,
    ) -> Result<(u64, Self), (super::verbs::SlotRefusal, Self)>
    where
        B: 'static,
    {
        use super::verbs::SlotRefusal;
        let raw = &self.mr.raw;
        if raw.pd_of_mr() != qp.pd_of_qp() {
            return Err((SlotRefusal::ForeignPd, self));
        }
        if qp.qp_type() == sys::ibv_qp_type::IBV_QPT_UD {
            let e = std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "registered buffers are posted on connected (RC) QPs only; this QP is UD",
            );
            return Err((SlotRefusal::Io(e), self));
        }
        let one = match super::verbs::sge_of(raw, 0..len) {
            Ok(sge) => [sge],
            Err(e) => return Err((SlotRefusal::Io(e), self)),
        };
        let sges: &[super::verbs::Sge] = if len == 0 { &[] } else { &one };
        let wr_id = super::verbs::fresh_owned_wr_id();
        // SAFETY: the element lies in the buffer's bytes (`sge_of` took it from them), under
        // the region's lkey, and the region is of `qp`'s PD (checked); every region of the safe
        // layer but an exposed one is registered with local write access. The region moves into
        // the caller's record of the request (this function's contract), which shows no bytes
        // until the completion, so nobody else reads or writes them while the device may; it
        // keeps the buffer allocated and in place (`B: 'static`: a forgotten record leaks it).
        // Deregistered first (the record dropped), the device can no longer reach the bytes.
        let posted = unsafe { super::verbs::post_op(qp, wr_id, sges, op) };
        match posted {
            Ok(()) => Ok((wr_id, self)),
            Err(e) => Err((SlotRefusal::Io(e), self)),
        }
    }

    /// Deregisters (before the PD's clone goes) and gives the buffer back.
    pub(crate) fn into_inner(self) -> crate::verbs::Result<B> {
        let MrCell { mr, pd } = self;
        let buf = mr.into_inner();
        drop(pd);
        buf
    }
}

/// A completion channel's tokio registration, on a channel held by reference count.
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub(crate) struct WaiterCell {
    waiter: crate::verbs::AsyncWaiter<'static, 'static>,
    channel: Arc<ChannelCell>,
}

#[cfg(feature = "tokio")]
impl WaiterCell {
    pub(crate) fn new(channel: Arc<ChannelCell>) -> std::io::Result<Self> {
        // SAFETY: `channel` is kept in the cell, after `waiter` (whose registration is dropped,
        // deregistering the descriptor, before the channel closes it); `waiter` is only lent
        // out shortened.
        let waiter = unsafe { anchor(&channel) }.channel.async_waiter()?;
        Ok(Self { waiter, channel })
    }

    pub(crate) fn waiter(&self) -> &crate::verbs::AsyncWaiter<'_, '_> {
        &self.waiter
    }

    pub(crate) fn channel(&self) -> &Arc<ChannelCell> {
        &self.channel
    }
}

/// The revocable gate of a QP owned by an rdma_cm id (module docs).
#[derive(Debug)]
pub(crate) struct QpGate {
    qp: NonNull<sys::ibv_qp>,
    qp_num: u32,
    /// This gate among every gate of the process (from 1): what a post through it is tagged
    /// with ([`crate::verbs::PostedSlot`]'s), unlike the QP number, which a later QP may reuse.
    serial: u64,
    /// Open (`true`) until the id destroys the QP.
    open: RwLock<bool>,
    /// Set once `ibv_destroy_qp` returned success: the device is done with every buffer of
    /// the QP's work requests.
    destroyed: std::sync::atomic::AtomicBool,
}

// SAFETY: the pointer is used only under the read lock while the gate is open (the QP is then
// live; verbs posts are thread-safe), and the id closes the gate under the write lock before it
// destroys the QP.
unsafe impl Send for QpGate {}
// SAFETY: as above.
unsafe impl Sync for QpGate {}

impl QpGate {
    /// The gate of `qp`, open.
    ///
    /// # Safety
    ///
    /// `qp` is live, and whoever destroys it calls [`close`](Self::close) first.
    pub(crate) unsafe fn new(qp: QpPtr<'_>) -> Self {
        static SERIALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            qp: qp.as_non_null(),
            qp_num: qp.qp_num(),
            serial: SERIALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            open: RwLock::new(true),
            destroyed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }

    /// Whether `ibv_destroy_qp` destroyed the QP (and returned success).
    pub(crate) fn is_destroyed(&self) -> bool {
        self.destroyed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The QP was destroyed: called by its id once `ibv_destroy_qp` returned success, the
    /// gate closed before.
    pub(crate) fn mark_destroyed(&self) {
        self.destroyed
            .store(true, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn is_open(&self) -> bool {
        *self.open.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// `f` with the QP while the gate is open (holding it open meanwhile), `None` once closed.
    #[inline]
    pub(crate) fn with<T>(&self, f: impl FnOnce(Option<QpPtr<'_>>) -> T) -> T {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        if !*open {
            return f(None);
        }
        // SAFETY: the gate is open and its read lock held until `f` returns, so the QP is live
        // for the borrow (`close` waits for the lock before the QP is destroyed).
        let qp = unsafe { QpPtr::from_raw(self.qp.as_ptr()) };
        f(qp)
    }

    /// Closes the gate: waits for the posts inside, refuses every later one.
    pub(crate) fn close(&self) {
        *self.open.write().unwrap_or_else(PoisonError::into_inner) = false;
    }
}
