//! Ids: the owner handle and the shared record that counts unacked events (see the parent
//! module's docs for the protocol).

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::io;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use evchan_sys as sys;

use super::{Gate, RawChannel};
use crate::ffi::addr::{self, SockAddr};
use crate::ffi::owned::{CqCell, PdCell, QpGate};
use crate::ffi::verbs::{check_same_context, ContextRef, Cq, Pd, PdRef, QpCaps, QpPtr};

/// The shared record of one C id: see the module docs.
pub(crate) struct IdInner {
    raw: NonNull<sys::rdma_cm_id>,
    /// The claims on the C id: one for the owner ([`Id`]) while it lives, plus one per event
    /// read for the id (counted against it) and not acked yet. Atomic, so that counting an
    /// event and acking it take no lock; only the drop of the last claim (or of an owner with a
    /// QP on the caller's PD and CQs) goes on to the gate and `state` (see [`Self::release`]).
    claims: AtomicUsize,
    state: Mutex<IdState>,
}

#[derive(Debug)]
struct IdState {
    /// The gate of the channel the id's events arrive on (the parent module's docs: "Readers
    /// and destroys"). Changed only by a migrate, which needs the owner and no pending event,
    /// so never while a destroy may read it.
    gate: Gate,
    /// `rdma_destroy_id` has been called (or is running).
    destroyed: bool,
    /// `rdma_create_qp` succeeded with library-made CQs: the QP goes with the id.
    has_qp: bool,
    /// `rdma_create_qp` succeeded on the caller's PD and CQs ([`Id::create_qp_with`], which
    /// borrows them only as long as the owner, or [`Id::create_qp_owned`]): the QP is
    /// destroyed when the owner goes (never deferred).
    user_qp: Option<UserQp>,
    /// Multicast groups joined and not left: left before the id is destroyed.
    groups: Vec<SocketAddr>,
}

/// A QP on the caller's PD and CQs.
#[derive(Debug)]
struct UserQp {
    /// librdmacm's own PD of the id, put back after the destroy (`rdma_create_qp` set the
    /// caller's).
    lib_pd: *mut sys::ibv_pd,
    /// The owned style's gate and the parents it keeps alive; `None` for a borrowed QP.
    owned: Option<OwnedQp>,
}

/// What [`Id::create_qp_owned`] keeps for its QP: the gate every handle shares, and the PD and
/// CQs, alive until the QP is destroyed.
#[derive(Debug)]
struct OwnedQp {
    gate: Arc<QpGate>,
    _parents: (Arc<PdCell>, Arc<CqCell>, Arc<CqCell>),
}

// SAFETY: the raw id is used only under the module's protocol: the owner (which is `!Sync`)
// issues the calls, and the destroy runs exactly once, from whichever thread takes the
// `destroyed` flag under the mutex.
unsafe impl Send for IdInner {}
// SAFETY: shared access only reads the pointer value, counts atomically, or goes through the
// mutex.
unsafe impl Sync for IdInner {}

impl IdInner {
    fn lock(&self) -> MutexGuard<'_, IdState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Called with the gate held and `destroyed` just set: no reader is inside
    /// `rdma_get_cm_event` with an event of the id, and none counted against it is pending.
    fn destroy(&self, has_qp: bool, groups: Vec<SocketAddr>) {
        for group in groups {
            let mut sa = SockAddr::new(group);
            // SAFETY: the id is live and joined `group`; no event of the id is pending (the
            // destroy runs only then), so the call does not wait on an ack we hold.
            let _ = unsafe { sys::rdma_leave_multicast(self.raw.as_ptr(), sa.as_mut_ptr()) };
        }
        if has_qp {
            // SAFETY: the id is live and has a QP created by `rdma_create_qp`; no reader can be
            // modifying it inside `rdma_get_cm_event` (the gate, see `release`).
            unsafe { sys::rdma_destroy_qp(self.raw.as_ptr()) }
        }
        // SAFETY: the id is live, destroyed once (the `destroyed` flag), and no event counted
        // against it is pending in our accounting nor being read (the gate), so this does not
        // wait on an ack we hold.
        let _ = unsafe { sys::rdma_destroy_id(self.raw.as_ptr()) };
    }

    /// Counts one more event read for the id and not acked. Called with the channel's gate
    /// held (`RawChannel::get_event`), so never while a destroy decides (`release`).
    #[inline]
    pub(super) fn add_pending(&self) {
        // Relaxed, as `Arc::clone`: whatever decides from the count (`release_slow`, a migrate,
        // a leave) reads it under the gate, which the caller holds now, so after this.
        self.claims.fetch_add(1, Ordering::Relaxed);
    }

    /// Events counted against the id and not acked yet, while its owner lives.
    fn pending(&self) -> usize {
        self.claims.load(Ordering::Acquire).saturating_sub(1)
    }

    /// `rdma_destroy_qp`'s steps, checked, for a QP made by [`Id::create_qp_with`] or [`Id::create_qp_owned`]
    /// (whose gate is closed first, and whose parents go after), and `pd` put back to
    /// librdmacm's. Called with the gate held and the state locked, so no reader touches the QP
    /// and no destroy of the id runs meanwhile, by the owner: from its drop or from
    /// [`Id::destroy_qp`].
    fn destroy_user_qp(&self, qp: UserQp) {
        if let Some(owned) = &qp.owned {
            // Waits for the posts inside; later ones are refused.
            owned.gate.close();
        }
        // SAFETY: the id is live (its owner is being dropped or is borrowed, so `destroyed` is
        // false) and has the QP (the caller took `user_qp`, so it is destroyed once); the
        // caller's PD and CQs are still borrowed by the owner (or held by `qp.owned`), and no
        // handle posts on the QP (its gate is closed). No reader of the
        // channel is inside `rdma_get_cm_event` (the gate), where librdmacm modifies the QP for
        // a CONNECT_RESPONSE or REJECTED of the id. Async events naming the QP are acked at read
        // (`ffi::verbs::RawAsyncEvent`), so `ibv_destroy_qp` does not wait on one. The CQs are
        // the caller's, so `rdma_destroy_qp` destroys no CQ.
        //
        // librdmacm's `rdma_destroy_qp` is `ibv_destroy_qp(id->qp)`, `id->qp = NULL`, and the
        // destroy of the CQs librdmacm made for the QP (none here: the caller gave both); it
        // drops `ibv_destroy_qp`'s result. The same steps here keep it: only a destroy that
        // returned success lets the QP's posted buffers be reclaimed (`QpHandle::reclaim`).
        // A failed one is tried once more; after a second failure the QP is left (leaked, as
        // `rdma_destroy_qp` leaves it) and its buffers stay lost.
        let qp_ptr = unsafe { (*self.raw.as_ptr()).qp };
        for _ in 0..2 {
            // SAFETY: `qp_ptr` is the id's QP, live (see above): not destroyed yet (a
            // destroy that returns success ends the loop).
            if unsafe { sys::ibv_destroy_qp(qp_ptr) } == 0 {
                if let Some(owned) = &qp.owned {
                    owned.gate.mark_destroyed();
                }
                break;
            }
        }
        // SAFETY: the id is live and its owner (the only writer) is borrowed by this call,
        // under the lock; the pointer is cleared as librdmacm does.
        unsafe { (*self.raw.as_ptr()).qp = std::ptr::null_mut() };
        // SAFETY: the id is live; its owner (the only writer) is being dropped or is borrowed
        // by this call, under the lock.
        unsafe { (*self.raw.as_ptr()).pd = qp.lib_pd };
        // The owned QP's parents go now, after the QP.
        drop(qp);
    }

    /// Drops one claim (the owner's, or one pending event's) and destroys the C id when it was
    /// the last one. The owner's claim first destroys a QP on the caller's PD and CQs, whose
    /// borrows end with the owner, even when the destroy of the id is deferred.
    ///
    /// # Why a reader on another thread cannot race the destroys
    ///
    /// librdmacm modifies the id's QP *inside* `rdma_get_cm_event` (CONNECT_RESPONSE: RTR and
    /// RTS; REJECTED: ERROR), before the event comes back and is counted here; `Id` being
    /// `!Sync` and the deferral to the last ack do not cover that window, since the event is
    /// not counted yet. So whatever is destroyed here is destroyed with the channel's gate held
    /// (parent module docs): readers already inside finish and count their event
    /// first (bounded: the fd is non-blocking, nobody waits inside for an event to come), later
    /// readers wait, and the decision to destroy now or defer is taken after that, from the
    /// count.
    ///
    /// The claim itself is dropped without a lock: only the drop that takes the count to zero
    /// (or an owner's with a QP to destroy) goes on. A count at zero can rise again before that
    /// drop gets the gate (a reader counts a late event of the id); the check under the gate
    /// then leaves the destroy to that event's ack, whose drop takes the count to zero again.
    /// Two drops that both went on are told apart by `destroyed`.
    #[inline]
    pub(super) fn release(&self, owner: bool) {
        // AcqRel, as `Arc`'s drop: every use of the id before a claim's drop happens before the
        // destroy that follows the last one.
        let last = self.claims.fetch_sub(1, Ordering::AcqRel) == 1;
        if last || (owner && self.lock().user_qp.is_some()) {
            self.release_slow(owner);
        }
    }

    #[cold]
    fn release_slow(&self, owner: bool) {
        let gate = Arc::clone(&self.lock().gate);
        let _no_reader = gate.lock().unwrap_or_else(PoisonError::into_inner);
        let mut st = self.lock();
        if owner {
            if let Some(qp) = st.user_qp.take() {
                self.destroy_user_qp(qp);
            }
        }
        // A reader may have counted another event while we waited for the gate: then the
        // destroy is that event's ack's. A QP on the caller's PD and CQs goes first, by the
        // owner's claim: a last ack that gets the gate before the owner leaves the id to it.
        let go = self.claims.load(Ordering::Acquire) == 0 && !st.destroyed && st.user_qp.is_none();
        if go {
            st.destroyed = true;
        }
        let has_qp = st.has_qp;
        let groups = if go {
            std::mem::take(&mut st.groups)
        } else {
            Vec::new()
        };
        drop(st);
        if go {
            self.destroy(has_qp, groups);
        }
    }
}

/// `rdma_cm_id::context` as an atomic: our writes (in [`Id::adopt`]) and reads (in
/// [`record_of`]) may run on two threads at once (see [`record_of`]).
///
/// # Safety
///
/// `id` is a live C id. librdmacm itself writes `context` only when it creates the id (before
/// anyone else can see it) and never writes it afterwards, so while the id is shared every
/// access to the field is one of ours, and atomic.
unsafe fn context_of<'a>(id: *mut sys::rdma_cm_id) -> &'a AtomicPtr<c_void> {
    // SAFETY: `id` is live (caller): the place expression only computes the field's address.
    let field = unsafe { ptr::addr_of_mut!((*id).context) };
    // SAFETY: the field is valid and aligned for a pointer for as long as the id lives; all
    // concurrent accesses go through this atomic view (caller).
    unsafe { AtomicPtr::from_ptr(field) }
}

/// Clones the record `id` points to through its `context`.
///
/// # The adoption race, closed by the channel's gate
///
/// librdmacm gives the new id of a `CONNECT_REQUEST` its *listener's* `context`;
/// [`Id::adopt`], run by the reader of the request before `RawChannel::get_event` returns,
/// re-points it at the new id's own record. Until then the new id's `context` names the
/// listener's record. Were an event *for the new id* read in that window, it would count
/// against the listener, and the new id's owner could then destroy it while that event is
/// unacked, which blocks (forever, if the owner holds the event itself).
///
/// No such window exists: the reads of one channel are serialised, from before
/// `rdma_get_cm_event` until the event is counted and the new id adopted (the parent module's
/// docs, "Readers and destroys"), and the new id's events arrive on the listener's channel
/// (librdmacm makes the new id on it, and it cannot be migrated before it is adopted). Before
/// the request is read, librdmacm does not know the new id at all and drops its events; after,
/// it is adopted. So the record found here always names `id`; should it not (a C id made
/// outside this module, which cannot happen), the event counts against no id rather than a
/// wrong one.
///
/// # Safety
///
/// `id` is NULL or a live C id that was returned in an event read just now and not yet acked,
/// by a reader holding its channel's gate; its `context` is NULL or points to a live
/// `IdInner` owned by an `Arc` (the module protocol).
#[inline]
pub(super) unsafe fn record_of(id: *mut sys::rdma_cm_id) -> Option<Arc<IdInner>> {
    if id.is_null() {
        return None;
    }
    // SAFETY: `id` is live (caller).
    let ctx = unsafe { context_of(id) }
        .load(Ordering::Acquire)
        .cast_const()
        .cast::<IdInner>();
    if ctx.is_null() {
        return None;
    }
    // SAFETY: `ctx` came from `Arc::as_ptr` and an `Arc` of it is alive (module docs): the id's
    // own record lives while the id does.
    unsafe { Arc::increment_strong_count(ctx) };
    // SAFETY: we own the strong count we just added.
    let record = unsafe { Arc::from_raw(ctx) };
    debug_assert!(
        record.raw.as_ptr() == id,
        "an event's id names another id's record"
    );
    (record.raw.as_ptr() == id).then_some(record)
}

/// The owner of one C id. `!Sync` (calls on one id are never concurrent); `Send`.
pub(crate) struct Id<'ch> {
    inner: Arc<IdInner>,
    _ch: PhantomData<(&'ch RawChannel, Cell<()>)>,
}

impl std::fmt::Debug for Id<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Id")
            .field("raw", &self.inner.raw)
            .field("claims", &self.inner.claims)
            .field("state", &*self.inner.lock())
            .finish()
    }
}

/// `errno`-style result of a `0 / -1` librdmacm call.
fn check(ret: c_int) -> io::Result<()> {
    sys::cvt(ret).map(drop)
}

/// Conversion of a timeout in milliseconds for librdmacm's `int timeout_ms`.
fn ms(timeout: std::time::Duration) -> c_int {
    c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX)
}

/// The fields of `struct rdma_conn_param` that callers choose.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ConnParamRaw<'a> {
    pub(crate) private_data: &'a [u8],
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) flow_control: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    pub(crate) srq: bool,
    pub(crate) qp_num: u32,
}

impl ConnParamRaw<'_> {
    fn to_c(self) -> io::Result<sys::rdma_conn_param> {
        let len = u8::try_from(self.private_data.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(sys::rdma_conn_param {
            private_data: if len == 0 {
                ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: len,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: u8::from(self.srq),
            qp_num: self.qp_num,
        })
    }
}

impl<'ch> Id<'ch> {
    /// `rdma_create_id` on `channel` in port space `ps`.
    pub(crate) fn create(channel: &'ch RawChannel, ps: u32) -> io::Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: live channel, valid out-pointer; the context is set right below, before the
        // id can produce any event.
        check(unsafe { sys::rdma_create_id(channel.ptr.as_ptr(), &mut raw, ptr::null_mut(), ps) })?;
        let raw = NonNull::new(raw).ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))?;
        // SAFETY: `raw` is a fresh id on `channel` that nothing else owns.
        Ok(unsafe { Self::adopt(raw, channel.gate()) })
    }

    /// Takes ownership of a C id and points its `context` at a new record.
    ///
    /// # Safety
    ///
    /// `raw` is a live C id on a channel that lives for `'ch` and whose gate is `gate`, owned
    /// by no one else, with no event of its own read and unacked.
    pub(super) unsafe fn adopt(raw: NonNull<sys::rdma_cm_id>, gate: &Gate) -> Self {
        let inner = Arc::new(IdInner {
            raw,
            claims: AtomicUsize::new(1),
            state: Mutex::new(IdState {
                gate: Arc::clone(gate),
                destroyed: false,
                has_qp: false,
                user_qp: None,
                groups: Vec::new(),
            }),
        });
        // SAFETY: `raw` is live and ours; the record outlives the C id (module docs). The
        // store is atomic and releases the record to readers of `context` (`record_of`).
        unsafe { context_of(raw.as_ptr()) }.store(
            Arc::as_ptr(&inner).cast_mut().cast::<c_void>(),
            Ordering::Release,
        );
        Self {
            inner,
            _ch: PhantomData,
        }
    }

    fn raw(&self) -> *mut sys::rdma_cm_id {
        self.inner.raw.as_ptr()
    }

    /// Runs `f` on the C id with the channel's gate held, for reading the fields
    /// that librdmacm rewrites *inside* `rdma_get_cm_event` while it processes one of the id's
    /// events: `route` (addresses, path records), `verbs`, `pd` and `port_num`
    /// (`ucma_query_addr` / `ucma_query_route` for `ADDR_RESOLVED` and `ROUTE_RESOLVED`). A
    /// reader on another thread may be doing that right now (channels are `Sync`, ids `Send`),
    /// so reading those fields without the gate would be a data race with C's writes. With
    /// the gate no reader is inside the call (parent module docs: "Readers and destroys"); it
    /// is held only for the read. Never called with the gate held (only `get_event` holds it,
    /// and it reads no id through here).
    fn read_locked<T>(&self, f: impl FnOnce(*const sys::rdma_cm_id) -> T) -> T {
        let gate = Arc::clone(&self.inner.lock().gate);
        let _no_reader = gate.lock().unwrap_or_else(PoisonError::into_inner);
        f(self.raw())
    }

    /// An opaque number naming this C id, equal to [`RawEvent::id_key`] of its events.
    pub(crate) fn key(&self) -> usize {
        self.raw() as usize
    }

    /// Events counted against this id and not acked yet.
    pub(crate) fn pending(&self) -> usize {
        self.inner.pending()
    }

    pub(crate) fn port_space(&self) -> u32 {
        // SAFETY: the id is live while its owner exists; `ps` is written once, by
        // `rdma_create_id`, before the id was shared. Only that field is read (no reference to
        // the whole struct, whose other fields librdmacm may be writing).
        unsafe { (*self.raw()).ps }
    }

    pub(crate) fn port_num(&self) -> u8 {
        // SAFETY: live id; read under the gate (`read_locked`), so librdmacm is not writing it.
        self.read_locked(|id| unsafe { (*id).port_num })
    }

    /// The device context, once an address is bound to a device or resolved.
    pub(crate) fn verbs(&self) -> Option<ContextRef<'_>> {
        // SAFETY: live id; read under the gate (`read_locked`), so librdmacm is not writing it.
        let verbs = self.read_locked(|id| unsafe { (*id).verbs });
        // SAFETY: `verbs` is NULL or the device context librdmacm keeps open while the id holds
        // its device (never cleared while the id lives).
        unsafe { ContextRef::from_raw(verbs) }
    }

    /// The protection domain librdmacm allocated for the id's device.
    pub(crate) fn pd(&self) -> Option<PdRef<'_>> {
        // SAFETY: live id; read under the gate (`read_locked`), so librdmacm is not writing it.
        let pd = self.read_locked(|id| unsafe { (*id).pd });
        // SAFETY: `pd` is NULL, the device's PD, which lives while the id holds the device, or
        // the caller's PD of a QP from `create_qp_with`, borrowed for `'ch` by the owner.
        unsafe { PdRef::from_raw(pd) }
    }

    /// `rdma_cm_id::qp`. Written only by the owner's own calls (`rdma_create_qp`, and
    /// `rdma_destroy_qp` in [`Self::destroy_qp`] or its drop); librdmacm's event processing only
    /// reads it.
    fn qp(&self) -> *mut sys::ibv_qp {
        // SAFETY: live id; only that field is read, and only the owner (borrowed here, `!Sync`)
        // writes it.
        unsafe { (*self.raw()).qp }
    }

    /// The id's QP, when [`Id::create_qp_with`] made it (on the caller's CQs); `None` for no
    /// QP or one with library-made CQs.
    pub(crate) fn user_qp(&self) -> Option<QpPtr<'_>> {
        self.inner.lock().user_qp.as_ref()?;
        // SAFETY: `qp` is NULL or the QP from `create_qp_with`, destroyed only in the owner's
        // drop (`release`) or by `destroy_qp` (`&mut self`), neither of which can run while
        // `self` is borrowed.
        unsafe { QpPtr::from_raw(self.qp()) }
    }

    pub(crate) fn qp_num(&self) -> Option<u32> {
        let qp = self.qp();
        // SAFETY: `qp` is NULL or the id's live QP.
        (!qp.is_null()).then(|| unsafe { (*qp).qp_num })
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.read_locked(|id| {
            // SAFETY: live id, read under the gate; the source address is a
            // `sockaddr_storage`-sized union field (the place expression reads nothing).
            let sa = unsafe { ptr::addr_of!((*id).route.addr.src_addr_union) };
            // SAFETY: `sa` points into the live id and is valid for any family's reads.
            unsafe { addr::read(sa.cast()) }
        })
    }

    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        self.read_locked(|id| {
            // SAFETY: as in `local_addr`, for the destination address.
            let sa = unsafe { ptr::addr_of!((*id).route.addr.dst_addr_union) };
            // SAFETY: `sa` points into the live id and is valid for any family's reads.
            unsafe { addr::read(sa.cast()) }
        })
    }

    /// `rdma_bind_addr`.
    pub(crate) fn bind(&self, a: SocketAddr) -> io::Result<()> {
        let mut sa = SockAddr::new(a);
        // SAFETY: live id; `sa` is a valid address for the call's duration.
        check(unsafe { sys::rdma_bind_addr(self.raw(), sa.as_mut_ptr()) })
    }

    /// `rdma_resolve_addr`.
    pub(crate) fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: std::time::Duration,
    ) -> io::Result<()> {
        let mut src = src.map(SockAddr::new);
        let mut dst = SockAddr::new(dst);
        let src_ptr = src.as_mut().map_or(ptr::null_mut(), SockAddr::as_mut_ptr);
        // SAFETY: live id; both addresses valid (or NULL source) for the call's duration.
        check(unsafe { sys::rdma_resolve_addr(self.raw(), src_ptr, dst.as_mut_ptr(), ms(timeout)) })
    }

    /// `rdma_resolve_route`.
    pub(crate) fn resolve_route(&self, timeout: std::time::Duration) -> io::Result<()> {
        // SAFETY: live id.
        check(unsafe { sys::rdma_resolve_route(self.raw(), ms(timeout)) })
    }

    /// `rdma_listen`.
    pub(crate) fn listen(&self, backlog: i32) -> io::Result<()> {
        // SAFETY: live id.
        check(unsafe { sys::rdma_listen(self.raw(), backlog) })
    }

    /// `rdma_create_qp` with the id's PD and library-created CQs.
    pub(crate) fn create_qp(&self, caps: QpCaps) -> io::Result<()> {
        self.create_qp_raw(ptr::null_mut(), ptr::null_mut(), ptr::null_mut(), caps)?;
        self.inner.lock().has_qp = true;
        Ok(())
    }

    /// `rdma_create_qp` on `pd`, completing sends on `send_cq` and receives on `recv_cq`.
    ///
    /// All three are borrowed for `'ch`, which the owner cannot outlive (`&mut self` makes
    /// `'ch` exact; `Id` has a `Drop` that uses it). The owner's drop destroys the QP before
    /// anything else (`release`), and [`Id::migrate`], which would give the id another
    /// lifetime, is refused while the QP lives. So the QP never outlives them.
    pub(crate) fn create_qp_with(
        &mut self,
        pd: &'ch Pd<'_>,
        send_cq: &'ch Cq<'_>,
        recv_cq: &'ch Cq<'_>,
        caps: QpCaps,
    ) -> io::Result<()> {
        // A PD of another context than the id's is refused by librdmacm itself (`EINVAL`);
        // CQs of another context than the PD's are not (see `check_same_context`).
        check_same_context(pd, send_cq, recv_cq)?;
        // SAFETY: live id; read under the gate (`read_locked`), so librdmacm is not writing it.
        let lib_pd = self.read_locked(|id| unsafe { (*id).pd });
        self.create_qp_raw(
            pd.ptr.as_ptr(),
            send_cq.ptr.as_ptr(),
            recv_cq.ptr.as_ptr(),
            caps,
        )?;
        self.inner.lock().user_qp = Some(UserQp {
            lib_pd,
            owned: None,
        });
        Ok(())
    }

    /// `rdma_create_qp` on the PD and CQs of the owned style, which the id's record keeps
    /// alive until the QP is destroyed: the gate of the QP, shared by every
    /// [`QpHandle`](crate::verbs::QpHandle). Destroyed, as a borrowed one, when the owner goes
    /// or by [`Self::destroy_qp`], after the gate is closed.
    pub(crate) fn create_qp_owned(
        &mut self,
        pd: &Arc<PdCell>,
        send_cq: &Arc<CqCell>,
        recv_cq: &Arc<CqCell>,
        caps: QpCaps,
    ) -> io::Result<Arc<QpGate>> {
        let (pd_raw, send_raw, recv_raw) = (&pd.pd().raw, &send_cq.cq().raw, &recv_cq.cq().raw);
        check_same_context(pd_raw, send_raw, recv_raw)?;
        // SAFETY: live id; read under the gate (`read_locked`), so librdmacm is not writing it.
        let lib_pd = self.read_locked(|id| unsafe { (*id).pd });
        self.create_qp_raw(
            pd_raw.ptr.as_ptr(),
            send_raw.ptr.as_ptr(),
            recv_raw.ptr.as_ptr(),
            caps,
        )?;
        // SAFETY: `rdma_create_qp` just made the id's QP, which only `destroy_user_qp` destroys,
        // and that closes the gate first.
        let qp = unsafe { QpPtr::from_raw(self.qp()) }
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))?;
        // SAFETY: as above.
        let gate = Arc::new(unsafe { QpGate::new(qp) });
        self.inner.lock().user_qp = Some(UserQp {
            lib_pd,
            owned: Some(OwnedQp {
                gate: Arc::clone(&gate),
                _parents: (Arc::clone(pd), Arc::clone(send_cq), Arc::clone(recv_cq)),
            }),
        });
        Ok(gate)
    }

    /// `rdma_destroy_qp` of the id's QP, made by [`Self::create_qp`] or [`Self::create_qp_with`],
    /// before the id itself goes; `EINVAL` when the id has no QP. Afterwards the id is as one
    /// that never had a QP: its drop destroys no QP, and `create_qp` may make another.
    ///
    /// `&mut self`: no [`QpPtr`] of [`Self::user_qp`] is alive, and the owner (`!Sync`) makes
    /// no other call meanwhile. Done with the channel's gate held, as the owner's drop does it
    /// ([`IdInner::release`]): no reader is inside `rdma_get_cm_event`, where librdmacm modifies
    /// the QP for a CONNECT_RESPONSE or REJECTED of the id.
    pub(crate) fn destroy_qp(&mut self) -> io::Result<()> {
        let gate = Arc::clone(&self.inner.lock().gate);
        let _no_reader = gate.lock().unwrap_or_else(PoisonError::into_inner);
        let mut st = self.inner.lock();
        if let Some(qp) = st.user_qp.take() {
            self.inner.destroy_user_qp(qp);
            return Ok(());
        }
        if !std::mem::take(&mut st.has_qp) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: live id (its owner is borrowed) with a QP from `rdma_create_qp` on
        // library-made CQs, which `rdma_destroy_qp` destroys with it: those CQs are never
        // handed out, so no event of theirs is held and the destroy waits on none. No reader is
        // inside `rdma_get_cm_event` (the gate), and `has_qp` is now false, so the id's own
        // destroy will not destroy the QP a second time.
        unsafe { sys::rdma_destroy_qp(self.raw()) };
        Ok(())
    }

    /// `rdma_create_qp`; NULL `pd` for the id's, NULL CQs for library-made ones.
    fn create_qp_raw(
        &self,
        pd: *mut sys::ibv_pd,
        send_cq: *mut sys::ibv_cq,
        recv_cq: *mut sys::ibv_cq,
        caps: QpCaps,
    ) -> io::Result<()> {
        // SAFETY: live id; `qp_type` is written once, by `rdma_create_id` (or, for a request's
        // id, before it was handed over), and only that field is read.
        let qp_type = unsafe { (*self.raw()).qp_type };
        let mut attr = caps.init_attr(qp_type, send_cq, recv_cq);
        // SAFETY: live id with a device (the caller's state guarantees it; librdmacm fails
        // with an errno otherwise, and with EINVAL for a PD of another device or a second QP);
        // `attr` is valid; the PD and CQs are NULL (library ones) or live objects of the
        // caller's that outlive the QP (`create_qp_with`).
        check(unsafe { sys::rdma_create_qp(self.raw(), pd, &mut attr) })
    }

    /// `rdma_join_multicast` (no user context).
    pub(crate) fn join_multicast(&self, group: SocketAddr) -> io::Result<()> {
        let mut sa = SockAddr::new(group);
        // SAFETY: live id; `sa` is valid for the call, which copies it.
        check(unsafe { sys::rdma_join_multicast(self.raw(), sa.as_mut_ptr(), ptr::null_mut()) })?;
        self.inner.lock().groups.push(group);
        Ok(())
    }

    /// `rdma_leave_multicast`. Refused with `EBUSY` while events counted against the id are
    /// unacked (the call waits for the acks of the group's events); `EADDRNOTAVAIL` for a group
    /// not joined.
    ///
    /// Decided and done with the channel's gate held, as a migrate: otherwise a
    /// reader on another thread could read (and count) an event of the group between the check
    /// and the call, and the call would then wait for its ack — forever, if that event is
    /// handed to this very thread. The kernel counts an event against the group only once it
    /// has been read, so with no reader inside `rdma_get_cm_event` the call never waits.
    pub(crate) fn leave_multicast(&self, group: SocketAddr) -> io::Result<()> {
        let gate = Arc::clone(&self.inner.lock().gate);
        let _no_reader = gate.lock().unwrap_or_else(PoisonError::into_inner);
        if self.inner.pending() > 0 {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        let mut st = self.inner.lock();
        let Some(i) = st.groups.iter().position(|g| *g == group) else {
            return Err(io::Error::from_raw_os_error(libc::EADDRNOTAVAIL));
        };
        st.groups.swap_remove(i);
        drop(st);
        let mut sa = SockAddr::new(group);
        // SAFETY: live id that joined `group`; no event of ours is pending, and none can be read
        // before the call returns (the gate).
        check(unsafe { sys::rdma_leave_multicast(self.raw(), sa.as_mut_ptr()) })
    }

    /// `rdma_connect`.
    pub(crate) fn connect(&self, p: ConnParamRaw<'_>) -> io::Result<()> {
        let mut c = p.to_c()?;
        // SAFETY: live id; `c` and the private data it points to are valid for the call, which
        // copies them.
        check(unsafe { sys::rdma_connect(self.raw(), &mut c) })
    }

    /// `rdma_accept`.
    pub(crate) fn accept(&self, p: ConnParamRaw<'_>) -> io::Result<()> {
        let mut c = p.to_c()?;
        // SAFETY: as `connect`; the parameter is never NULL (librdmacm reads it when the id has
        // no QP).
        check(unsafe { sys::rdma_accept(self.raw(), &mut c) })
    }

    /// `rdma_reject`.
    pub(crate) fn reject(&self, private_data: &[u8]) -> io::Result<()> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let data = if len == 0 {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: live id; the data is valid for `len` bytes and copied by the call.
        check(unsafe { sys::rdma_reject(self.raw(), data, len) })
    }

    /// `rdma_establish`: completes a connect whose `CONNECT_RESPONSE` arrived (an id without a
    /// QP); `EINVAL` for an id with one.
    pub(crate) fn establish(&self) -> io::Result<()> {
        // SAFETY: live id.
        check(unsafe { sys::rdma_establish(self.raw()) })
    }

    /// `rdma_disconnect`.
    pub(crate) fn disconnect(&self) -> io::Result<()> {
        // SAFETY: live id.
        check(unsafe { sys::rdma_disconnect(self.raw()) })
    }

    /// `rdma_migrate_id` to `to`. Refused with `EBUSY` (and the id given back) while events
    /// counted against the id are unacked, since the call would wait for their acks, and while
    /// the id has a QP on the caller's PD and CQs: those are borrowed for `'ch`, which the
    /// migrated id would no longer carry.
    ///
    /// Decided and done with the old channel's gate held, as a destroy (see
    /// [`IdInner::release`]): no event of the id is read and not yet counted meanwhile.
    pub(crate) fn migrate<'to>(self, to: &'to RawChannel) -> Result<Id<'to>, (Self, io::Error)> {
        let gate = Arc::clone(&self.inner.lock().gate);
        let no_reader = gate.lock().unwrap_or_else(PoisonError::into_inner);
        // A QP of the owned style keeps its parents itself: it may move with the id.
        let borrowed_qp = self
            .inner
            .lock()
            .user_qp
            .as_ref()
            .is_some_and(|qp| qp.owned.is_none());
        let busy = self.inner.pending() > 0 || borrowed_qp;
        if busy {
            drop(no_reader);
            return Err((self, io::Error::from_raw_os_error(libc::EBUSY)));
        }
        // SAFETY: live id and live target channel; no event of ours is pending or being read,
        // so the call does not wait for an ack.
        if let Err(e) = check(unsafe { sys::rdma_migrate_id(self.raw(), to.ptr.as_ptr()) }) {
            drop(no_reader);
            return Err((self, e));
        }
        self.inner.lock().gate = Arc::clone(to.gate());
        drop(no_reader);
        let this = ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so the `Arc` moves out exactly once.
        let inner = unsafe { ptr::read(&this.inner) };
        Ok(Id {
            inner,
            _ch: PhantomData,
        })
    }
}

impl Drop for Id<'_> {
    fn drop(&mut self) {
        self.inner.release(true);
    }
}
