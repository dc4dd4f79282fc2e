//! Events, owned from `rdma_get_cm_event` to `rdma_ack_cm_event`.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use evchan_sys as sys;

use super::code;
use super::id::{record_of, ConnParamRaw, Id, IdInner};
use super::{Gate, RawChannel};
use crate::cm::{AhAttr, GlobalRoute, UdInfo};

/// One event read from a channel, owned until `rdma_ack_cm_event`.
pub(crate) struct RawEvent<'ch> {
    ptr: NonNull<sys::rdma_cm_event>,
    /// The record of the id the event counts against (its `pending` includes this event).
    counted: Option<Arc<IdInner>>,
    /// For a `CONNECT_REQUEST`: the new id, until taken.
    new_id: Option<Id<'ch>>,
    /// The parameters are the UD ones (`param.ud`).
    ud: bool,
    _ch: PhantomData<&'ch RawChannel>,
}

// SAFETY: an event is plain memory owned by us until the ack, and `rdma_ack_cm_event` may be
// called from any thread; the new id inside is `Send`.
unsafe impl Send for RawEvent<'_> {}

impl std::fmt::Debug for RawEvent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawEvent")
            .field("event", &self.code())
            .field("status", &self.status())
            .field("id", &self.id_key())
            .finish_non_exhaustive()
    }
}

impl<'ch> RawEvent<'ch> {
    /// Wraps an event librdmacm just returned and does its accounting.
    ///
    /// # Safety
    ///
    /// `ptr` is an event just returned by `rdma_get_cm_event` on a channel that lives for `'ch`
    /// and whose gate is `gate`, not acked, and owned by no one else.
    #[inline]
    pub(super) unsafe fn adopt(ptr: NonNull<sys::rdma_cm_event>, gate: &Gate) -> Self {
        // SAFETY: a valid event (caller).
        let ev = unsafe { ptr.as_ref() };
        let is_request = ev.event == code::CONNECT_REQUEST;
        let counts_against = if is_request { ev.listen_id } else { ev.id };
        // SAFETY: the id is live while this event is unacked, and all our ids follow the
        // module protocol.
        let counted = unsafe { record_of(counts_against) };
        if let Some(rec) = &counted {
            rec.add_pending();
        }
        // SAFETY: the id is live while this event is unacked.
        let ud = unsafe { is_ud(ev) };
        let new_id = if is_request {
            // SAFETY: for a CONNECT_REQUEST, `id` is the new id librdmacm created for the
            // request on the listener's channel (`'ch`, gated by `gate`), ours alone, with no
            // event yet.
            NonNull::new(ev.id).map(|raw| unsafe { Id::adopt(raw, gate) })
        } else {
            None
        };
        Self {
            ptr,
            counted,
            new_id,
            ud,
            _ch: PhantomData,
        }
    }

    /// An event read as [`adopt`](Self::adopt) reads it, but counted against no id and
    /// handing over no new id: the decoding alone, for the fuzz targets (feature `fuzzing`).
    ///
    /// # Safety
    ///
    /// `ptr` is an event laid out as librdmacm hands them over: `id` (and `listen_id`) null or
    /// a readable `rdma_cm_id`, and for `private_data`, as chosen by the id's `qp_type` and the
    /// event code, a pointer to at least `private_data_len` readable bytes (or null), all
    /// unchanged for `'ch`. The result is never dropped (keep it in a `ManuallyDrop`): its
    /// drop would `rdma_ack_cm_event` an event librdmacm never allocated.
    #[cfg(feature = "fuzzing")]
    pub(crate) unsafe fn unaccounted(ptr: NonNull<sys::rdma_cm_event>) -> Self {
        // SAFETY: a readable event (caller).
        let ev = unsafe { ptr.as_ref() };
        // SAFETY: its `id` is null or readable (caller).
        let ud = unsafe { is_ud(ev) };
        Self {
            ptr,
            counted: None,
            new_id: None,
            ud,
            _ch: PhantomData,
        }
    }

    #[inline]
    fn get(&self) -> &sys::rdma_cm_event {
        // SAFETY: the event is owned by us until the ack in `drop`.
        unsafe { self.ptr.as_ref() }
    }

    /// `rdma_cm_event::event`.
    #[inline]
    pub(crate) fn code(&self) -> u32 {
        self.get().event
    }

    /// `rdma_cm_event::status`.
    #[inline]
    pub(crate) fn status(&self) -> i32 {
        self.get().status
    }

    /// The key of `rdma_cm_event::id` (see [`Id::key`]).
    pub(crate) fn id_key(&self) -> usize {
        self.get().id as usize
    }

    /// The key of `rdma_cm_event::listen_id`, for a `CONNECT_REQUEST`.
    pub(crate) fn listen_id_key(&self) -> Option<usize> {
        let l = self.get().listen_id;
        (!l.is_null()).then_some(l as usize)
    }

    fn is_multicast(&self) -> bool {
        matches!(self.code(), code::MULTICAST_JOIN | code::MULTICAST_ERROR)
    }

    /// The private data, borrowed from the event (librdmacm frees it at the ack).
    pub(crate) fn private_data(&self) -> &[u8] {
        if self.is_multicast() {
            // `param.ud.private_data` of multicast events is the join's user context.
            return &[];
        }
        let (data, len) = if self.ud {
            // SAFETY: reading the `ud` member of a UD id's event (librdmacm wrote it).
            let ud = unsafe { &self.get().param.ud };
            (ud.private_data, ud.private_data_len)
        } else {
            // SAFETY: reading the `conn` member of a connected id's event.
            let conn = unsafe { &self.get().param.conn };
            (conn.private_data, conn.private_data_len)
        };
        if data.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: librdmacm points `private_data` at `len` bytes inside the event allocation
        // (`cma_event::private_data`), valid and unchanged until the ack, which needs `self`.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }
    }

    /// `param.conn` without its private data, for a connected id's event.
    pub(crate) fn conn(&self) -> Option<ConnParamRaw<'static>> {
        if self.ud || self.is_multicast() {
            return None;
        }
        // SAFETY: reading the `conn` member of a connected id's event.
        let c = unsafe { self.get().param.conn };
        Some(ConnParamRaw {
            private_data: &[],
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            flow_control: c.flow_control,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
            srq: c.srq != 0,
            qp_num: c.qp_num,
        })
    }

    /// `param.ud` without its private data, for a UD id's event.
    pub(crate) fn ud(&self) -> Option<UdInfo> {
        if !self.ud && !self.is_multicast() {
            return None;
        }
        // SAFETY: reading the `ud` member of a UD id's event.
        let u = unsafe { self.get().param.ud };
        let a = u.ah_attr;
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        let dgid = unsafe { a.grh.dgid.raw };
        let global = (a.is_global != 0).then_some(GlobalRoute {
            dgid,
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        });
        Some(UdInfo {
            qp_num: u.qp_num,
            qkey: u.qkey,
            ah_attr: AhAttr {
                dlid: a.dlid,
                sl: a.sl,
                src_path_bits: a.src_path_bits,
                static_rate: a.static_rate,
                port_num: a.port_num,
                global,
            },
        })
    }

    /// Takes the new id of a `CONNECT_REQUEST` (once).
    pub(crate) fn take_new_id(&mut self) -> Option<Id<'ch>> {
        self.new_id.take()
    }

    /// Whether the new id of a `CONNECT_REQUEST` is still inside the event.
    pub(crate) fn has_new_id(&self) -> bool {
        self.new_id.is_some()
    }

    /// Destroys the new id of a `CONNECT_REQUEST` that nobody took (the event's drop, before
    /// the ack). Out of line: the id's drop is larger than the rest of the event's, and only
    /// a request's event has one.
    #[cold]
    #[inline(never)]
    fn drop_new_id(&mut self) {
        self.new_id = None;
    }
}

/// Whether the event's parameters are `param.ud` (the event of a UD id: the UDP and IPoIB port
/// spaces) rather than `param.conn`: librdmacm fills the member by the id's QP type.
///
/// # Safety
///
/// `ev.id` is null or points to a readable `rdma_cm_id`.
unsafe fn is_ud(ev: &sys::rdma_cm_event) -> bool {
    // SAFETY: non-null, so readable (caller).
    !ev.id.is_null() && unsafe { (*ev.id).qp_type } == sys::ibv_qp_type::IBV_QPT_UD
}

impl Drop for RawEvent<'_> {
    #[inline]
    fn drop(&mut self) {
        // A new id nobody took is destroyed first; its destroy does not wait on this event,
        // which counts against the listener.
        if self.new_id.is_some() {
            self.drop_new_id();
        }
        // SAFETY: our event, acked exactly once (here); nothing borrows it any more.
        let _ = unsafe { sys::rdma_ack_cm_event(self.ptr.as_ptr()) };
        if let Some(rec) = self.counted.take() {
            rec.release(false);
        }
    }
}
