//! Completion channels, CQs and CQ event acks.

use std::io;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};

use evchan_sys as sys;
use libc::{c_int, c_void};

use super::*;

// ---------------------------------------------------------------------------------------------
// Completion channel, CQ, CQ events
// ---------------------------------------------------------------------------------------------

/// `ibv_create_comp_channel` / `ibv_destroy_comp_channel`. Its fd is set `O_NONBLOCK` and
/// never leaves the crate; the public API hands out a readiness proxy of it instead (an epoll
/// instance watching it, a different open file: see `ffi::cm`'s module docs, which do the same
/// for the CM channel). Nobody else can clear the flag, so every read is one `read` that
/// returns an event or `EAGAIN`, never a wait.
#[derive(Debug)]
pub(crate) struct CompChannel<'ctx> {
    pub(super) ptr: NonNull<sys::ibv_comp_channel>,
    proxy: OwnedFd,
    events_read: AtomicU64,
    _ctx: PhantomData<&'ctx Context>,
}

// SAFETY: completion channels are thread-safe (reads of one fd; ibv_get_cq_event takes no lock
// that another thread could hold forever).
unsafe impl Send for CompChannel<'_> {}
// SAFETY: as above.
unsafe impl Sync for CompChannel<'_> {}

impl<'ctx> CompChannel<'ctx> {
    pub(crate) fn new(ctx: &'ctx Context) -> io::Result<Self> {
        // SAFETY: live context.
        let ptr = NonNull::new(unsafe { sys::ibv_create_comp_channel(ctx.ptr.as_ptr()) })
            .ok_or_else(null_err)?;
        // SAFETY: live channel (destroyed below if the rest fails).
        let raw_fd = unsafe { (*ptr.as_ptr()).fd };
        // SAFETY: the channel's fd is open until the channel is destroyed, after this borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(raw_fd) };
        match crate::ffi::seal(fd) {
            Ok(proxy) => Ok(CompChannel {
                ptr,
                proxy,
                events_read: AtomicU64::new(0),
                _ctx: PhantomData,
            }),
            Err(e) => {
                // SAFETY: created above, no CQ on it, destroyed once.
                let _ = unsafe { sys::ibv_destroy_comp_channel(ptr.as_ptr()) };
                Err(e)
            }
        }
    }

    /// The readiness proxy of the channel's fd: what the public API hands out.
    pub(crate) fn proxy(&self) -> BorrowedFd<'_> {
        self.proxy.as_fd()
    }

    /// The channel's own fd: polled and registered with tokio inside the crate, never handed
    /// out (the type's docs).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: live channel; `fd` is written once at creation.
        let fd = unsafe { (*self.ptr.as_ptr()).fd };
        // SAFETY: the channel's fd is open from creation until ibv_destroy_comp_channel, which
        // runs only in Drop, after every borrow of self has ended.
        unsafe { BorrowedFd::borrow_raw(fd) }
    }

    /// How many events `get_cq_event` has read from this channel.
    pub(crate) fn events_read(&self) -> u64 {
        self.events_read.load(Ordering::Relaxed)
    }

    /// `ibv_get_cq_event` on the non-blocking fd: `Ok(None)` on `EAGAIN` (see the type's
    /// docs).
    #[inline]
    pub(crate) fn get_cq_event(&self) -> io::Result<Option<CqEventAck>> {
        let mut cq: *mut sys::ibv_cq = ptr::null_mut();
        let mut cq_context: *mut c_void = ptr::null_mut();
        loop {
            // SAFETY: live channel; both out-pointers are valid.
            let ret = unsafe { sys::ibv_get_cq_event(self.ptr.as_ptr(), &mut cq, &mut cq_context) };
            if ret == 0 {
                break;
            }
            let e = sys::last_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(None),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        self.events_read.fetch_add(1, Ordering::Relaxed);
        match NonNull::new(cq) {
            Some(cq) => Ok(Some(CqEventAck {
                cq,
                token: cq_context as u64,
            })),
            None => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

impl CompChannel<'_> {
    /// `ibv_destroy_comp_channel`, reporting its result (Drop ignores it).
    pub(crate) fn destroy(self) -> io::Result<()> {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: as in Drop, which will not run (ManuallyDrop): destroyed once.
        let ret = unsafe { sys::ibv_destroy_comp_channel(me.ptr.as_ptr()) };
        sys::cvt_errno(ret)
    }
}

impl Drop for CompChannel<'_> {
    fn drop(&mut self) {
        // SAFETY: every CQ on the channel borrows it, so none is alive and the C refcount is
        // zero: EBUSY cannot happen. Destroyed once; this also closes the fd.
        let _ = unsafe { sys::ibv_destroy_comp_channel(self.ptr.as_ptr()) };
    }
}

static NEXT_CQ_TOKEN: AtomicU64 = AtomicU64::new(1);

/// `ibv_create_cq` / `ibv_destroy_cq`, with the pending (deferred) ack count of its events.
#[derive(Debug)]
pub(crate) struct Cq<'ch> {
    pub(in crate::ffi) ptr: NonNull<sys::ibv_cq>,
    token: u64,
    /// Two counts in one atomic, so that a guard's ack moves its event from one to the other
    /// in one step ([`CqEventAck::defer_held`]):
    /// - the low 32 bits ([`PENDING`]): events read and deferred, acked at the next flush;
    /// - the high 32 bits (units of [`HELD`]): events of this CQ held, unacked, by guards (the
    ///   public `CqEvent`, which borrows the `Cq`): raised by [`Cq::hold`], lowered once the
    ///   guard has acked or deferred its event. Whatever is left when the CQ goes belongs to
    ///   guards leaked with `mem::forget`, whose acks are then made for them (see
    ///   [`Cq::ack_everything`]).
    acks: AtomicU64,
    _ch: PhantomData<&'ch CompChannel<'ch>>,
}

/// The pending acks' bits of [`Cq::acks`] (and one pending ack: 1).
const PENDING: u64 = (1 << 32) - 1;
/// One held event in [`Cq::acks`].
const HELD: u64 = 1 << 32;

// SAFETY: CQs are thread-safe libibverbs objects (providers lock poll/arm); the ack count is
// atomic.
unsafe impl Send for Cq<'_> {}
// SAFETY: as above.
unsafe impl Sync for Cq<'_> {}

/// One plain-data work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawWc {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) opcode: u32,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`, per `wc_flags`.
    pub(crate) imm_or_rkey: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: u32,
}

impl RawWc {
    /// Copies a completion out of libibverbs' `struct ibv_wc`.
    pub(crate) fn read(wc: &sys::ibv_wc) -> Self {
        // SAFETY: both members of the union are u32.
        let imm_or_rkey = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
        RawWc {
            wr_id: wc.wr_id,
            status: wc.status,
            opcode: wc.opcode,
            vendor_err: wc.vendor_err,
            byte_len: wc.byte_len,
            imm_or_rkey,
            qp_num: wc.qp_num,
            src_qp: wc.src_qp,
            wc_flags: wc.wc_flags,
        }
    }
}

impl<'ch> Cq<'ch> {
    pub(crate) fn new(ch: &'ch CompChannel<'_>, cqe: c_int) -> io::Result<Self> {
        let token = NEXT_CQ_TOKEN.fetch_add(1, Ordering::Relaxed);
        // SAFETY: live channel; its `context` is the live context it was created on.
        let ctx = unsafe { (*ch.ptr.as_ptr()).context };
        // SAFETY: live context and channel; `cq_context` is an opaque token, never dereferenced.
        let cq = unsafe { sys::ibv_create_cq(ctx, cqe, token as *mut c_void, ch.ptr.as_ptr(), 0) };
        Ok(Cq {
            ptr: NonNull::new(cq).ok_or_else(null_err)?,
            token,
            acks: AtomicU64::new(0),
            _ch: PhantomData,
        })
    }

    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    pub(crate) fn capacity(&self) -> i32 {
        // SAFETY: live CQ; `cqe` is written at creation.
        unsafe { (*self.ptr.as_ptr()).cqe }
    }

    /// `ibv_req_notify_cq`.
    #[inline]
    pub(crate) fn req_notify(&self, solicited_only: bool) -> io::Result<()> {
        // SAFETY: live CQ.
        let ret = unsafe { sys::ibv_req_notify_cq(self.ptr.as_ptr(), c_int::from(solicited_only)) };
        sys::cvt_errno(ret)
    }

    /// `ibv_poll_cq` for at most `max` (≤ [`POLL_BATCH`]) completions, each handed to `each`
    /// in order; how many came. The provider writes into an uninitialised buffer: nothing is
    /// zeroed or copied for entries that do not come.
    #[inline]
    pub(crate) fn poll_each(&self, max: usize, mut each: impl FnMut(RawWc)) -> io::Result<usize> {
        let n = max.min(POLL_BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut wcs: [MaybeUninit<sys::ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        // SAFETY: live CQ; `wcs` has room for `n <= POLL_BATCH` entries.
        let got =
            unsafe { sys::ibv_poll_cq(self.ptr.as_ptr(), n as c_int, wcs.as_mut_ptr().cast()) };
        let got = usize::try_from(got)
            .map_err(|_| io::Error::from_raw_os_error(got.unsigned_abs() as i32))?
            .min(n);
        for wc in &wcs[..got] {
            // SAFETY: ibv_poll_cq initialised the first `got` entries.
            each(RawWc::read(unsafe { wc.assume_init_ref() }));
        }
        Ok(got)
    }

    /// `ibv_poll_cq` for one completion, straight into one `ibv_wc` (no batch buffer): the
    /// fast path of [`crate::verbs::Cq::poll_one`], an empty poll above all.
    #[inline]
    pub(crate) fn poll_one(&self) -> io::Result<Option<RawWc>> {
        let mut wc = MaybeUninit::<sys::ibv_wc>::uninit();
        // SAFETY: live CQ; `wc` has room for the one entry asked for.
        let got = unsafe { sys::ibv_poll_cq(self.ptr.as_ptr(), 1, wc.as_mut_ptr()) };
        match got {
            0 => Ok(None),
            // SAFETY: ibv_poll_cq initialised the one entry it returned.
            1 => Ok(Some(RawWc::read(unsafe { wc.assume_init_ref() }))),
            n if n < 0 => Err(io::Error::from_raw_os_error(n.unsigned_abs() as i32)),
            // More than asked for: a provider bug; report it rather than trust `wc`.
            _ => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }

    /// Acks every deferred event now (`ibv_ack_cq_events` with the count); the held count is
    /// left as it is.
    pub(crate) fn flush_acks(&self) {
        let n = self.acks.fetch_and(!PENDING, Ordering::AcqRel) & PENDING;
        self.ack_n(n);
    }

    /// `ibv_ack_cq_events` of `n` events read for this CQ and not acked (and taken out of
    /// [`Self::acks`] by the caller), in calls of at most `u32::MAX`.
    fn ack_n(&self, mut n: u64) {
        while n > 0 {
            let now = u32::try_from(n).unwrap_or(u32::MAX);
            // SAFETY: live CQ; `now <= n` events were read for it and not yet acked.
            unsafe { sys::ibv_ack_cq_events(self.ptr.as_ptr(), now) };
            n -= u64::from(now);
        }
    }

    pub(crate) fn pending_acks(&self) -> u32 {
        // The low 32 bits: the mask makes the conversion exact.
        (self.acks.load(Ordering::Acquire) & PENDING) as u32
    }

    /// A guard now holds one unacked event of this CQ (it borrows the CQ).
    #[inline]
    pub(crate) fn hold(&self) {
        self.acks.fetch_add(HELD, Ordering::AcqRel);
    }

    /// The guard has given its event back unacked to the CQ's count: acked at once instead
    /// (the `CqEventAck`'s drop), the hold is released ([`CqEventAck::defer_held`]'s other
    /// path).
    fn release(&self) {
        self.acks.fetch_sub(HELD, Ordering::AcqRel);
    }

    /// Before `ibv_destroy_cq`, which waits until every event read for the CQ is acked: acks
    /// the deferred events and those of guards that were leaked (`mem::forget` is safe, and a
    /// forgotten guard never acks). Guards borrow the CQ, so when it goes none is alive and the
    /// held count is exactly the events of leaked ones — never one acked already, which
    /// would make the destroy wait forever just the same (it waits for equality).
    fn ack_everything(&self) {
        let all = self.acks.swap(0, Ordering::AcqRel);
        self.ack_n((all & PENDING) + (all >> 32));
    }
}

impl Cq<'_> {
    /// Flushes the pending acks, then `ibv_destroy_cq`, reporting its result (Drop ignores it).
    pub(crate) fn destroy(self) -> io::Result<()> {
        self.ack_everything();
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: as in Drop, which will not run (ManuallyDrop): destroyed once, acks flushed.
        let ret = unsafe { sys::ibv_destroy_cq(me.ptr.as_ptr()) };
        sys::cvt_errno(ret)
    }
}

impl Drop for Cq<'_> {
    fn drop(&mut self) {
        // Every event read for this CQ is either counted pending in `acks` (flushed here) or
        // still held by a CqEventAck, which acks on drop without needing this handle. The public
        // guard borrows the Cq, so in safe code none is alive now, and the events of guards
        // leaked with `mem::forget` are acked for them: ibv_destroy_cq cannot wait.
        self.ack_everything();
        // SAFETY: QPs borrow the CQ, so none uses it; destroyed once.
        let _ = unsafe { sys::ibv_destroy_cq(self.ptr.as_ptr()) };
    }
}

/// One completion event read from a channel and not yet acked.
///
/// Dropping it acks it at once; [`defer`](Self::defer) moves the ack into its CQ's batch.
#[derive(Debug)]
pub(crate) struct CqEventAck {
    cq: NonNull<sys::ibv_cq>,
    token: u64,
}

// SAFETY: acking from another thread is allowed; the CQ cannot be freed while this is unacked.
unsafe impl Send for CqEventAck {}
// SAFETY: shared access only reads the token.
unsafe impl Sync for CqEventAck {}

impl CqEventAck {
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// Adds this event to `cq`'s pending acks (flushing at [`ACK_BATCH`]), or, when `cq` is not
    /// the event's CQ, gives the event back.
    #[inline]
    pub(crate) fn defer(self, cq: &Cq<'_>) -> Result<(), Self> {
        if cq.ptr != self.cq {
            return Err(self);
        }
        std::mem::forget(self);
        if cq.acks.fetch_add(1, Ordering::AcqRel) & PENDING >= u64::from(ACK_BATCH) - 1 {
            cq.flush_acks();
        }
        Ok(())
    }

    /// [`defer`](Self::defer) of an event that a guard held ([`Cq::hold`] on `cq`): one
    /// atomic step counts its ack as pending and releases the hold (flushing at
    /// [`ACK_BATCH`]). When `cq` is not the event's CQ, the event is acked at once and the
    /// hold released.
    #[inline]
    pub(crate) fn defer_held(self, cq: &Cq<'_>) {
        if cq.ptr != self.cq {
            drop(self); // acks it
            cq.release();
            return;
        }
        std::mem::forget(self);
        // +1 pending, -1 held: the held count is at least this event's, so nothing borrows
        // across the two halves.
        let before = cq.acks.fetch_add(1u64.wrapping_sub(HELD), Ordering::AcqRel);
        if before & PENDING >= u64::from(ACK_BATCH) - 1 {
            cq.flush_acks();
        }
    }
}

impl Drop for CqEventAck {
    fn drop(&mut self) {
        // SAFETY: the event was read for this CQ and not acked (defer forgets self), so the CQ
        // is still allocated: ibv_destroy_cq waits for this very ack before freeing it.
        unsafe { sys::ibv_ack_cq_events(self.cq.as_ptr(), 1) };
    }
}
