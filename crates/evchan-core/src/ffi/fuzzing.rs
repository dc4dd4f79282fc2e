//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not part of the API).
//!
//! Each one runs the decoding the library applies to what librdmacm and libibverbs hand over —
//! the same functions, on memory a fuzzer filled instead of the kernel — and shows the result
//! as the public typed event. What is left out: for `rdma_cm_event`, the accounting against
//! our own ids (`record_of`, the adoption of a `CONNECT_REQUEST`'s new id) and the ack, which
//! need a librdmacm that allocated the event; so `has_request()` is always false here.

use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::NonNull;

use evchan_sys as sys;

use super::cm::RawEvent;
use super::verbs::{RawAsyncEvent, RawWc};
use crate::cm::Event;
use crate::verbs::{AsyncEvent, WorkCompletion};

/// Decodes `event` as [`EventChannel::get_event`](crate::EventChannel::get_event) does one
/// from `rdma_get_cm_event`, and hands the typed event to `f`.
///
/// # Safety
///
/// `event` is laid out as librdmacm hands events over, readable and unchanged during the call:
/// `id` and `listen_id` null or pointing to a readable `rdma_cm_id` (its `qp_type` chooses the
/// member of `param`: `ud` for `IBV_QPT_UD`, `conn` otherwise); in the member chosen,
/// `private_data` null or pointing to at least `private_data_len` readable bytes — except for
/// `MULTICAST_JOIN` / `MULTICAST_ERROR`, where librdmacm puts the join's user context there
/// (any pointer).
pub unsafe fn cm_event<R>(
    event: NonNull<sys::rdma_cm_event>,
    f: impl FnOnce(&mut Event<'_>) -> R,
) -> R {
    // SAFETY: as librdmacm lays events out (caller); never dropped, so never acked.
    let raw = unsafe { RawEvent::unaccounted(event) };
    let mut event = ManuallyDrop::new(Event::new(raw));
    f(&mut event)
}

/// Decodes `wc` as [`Cq::poll`](crate::verbs::Cq::poll) does a completion from `ibv_poll_cq`.
#[must_use]
pub fn work_completion(wc: &sys::ibv_wc) -> WorkCompletion {
    WorkCompletion {
        raw: RawWc::read(wc),
    }
}

/// Decodes `event` as [`Context::get_async_event`](crate::verbs::Context::get_async_event) does
/// one from `ibv_get_async_event` (acks included: libibverbs' `ibv_ack_async_event` only
/// touches the element's object), and hands the typed event to `f`; dropped after it.
///
/// # Safety
///
/// `event` is laid out as libibverbs fills it: `event_type` any value; for a CQ event
/// (`IBV_EVENT_CQ_ERR`) the element points to a live `ibv_cq`, for QP events (1–7, 16) to a
/// live `ibv_qp`, for SRQ events (14, 15) to a live `ibv_srq`, for `IBV_EVENT_WQ_FATAL` (19)
/// to a live `ibv_wq` (each with an initialised mutex and condition variable: the ack uses
/// them); for every other value the element is `port_num` (any bytes).
pub unsafe fn async_event<R>(
    event: MaybeUninit<sys::ibv_async_event>,
    f: impl FnOnce(&AsyncEvent<'_>) -> R,
) -> R {
    let event = AsyncEvent::new(RawAsyncEvent::read(event));
    f(&event)
}
