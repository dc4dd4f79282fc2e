//! Async device events (`ibv_get_async_event` / `ibv_ack_async_event`).

use std::mem::MaybeUninit;

use evchan_sys as sys;
use libc::{c_int, c_void};

// ---------------------------------------------------------------------------------------------
// Async events
// ---------------------------------------------------------------------------------------------

/// What an async event names, copied out of the C event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawElement {
    /// The `cq_context` token of the CQ.
    Cq(u64),
    /// The QP number.
    Qp(u32),
    /// The SRQ (no safe handle exists yet; its address, for identification only).
    Srq(usize),
    /// The WQ (likewise).
    Wq(usize),
    /// A port number.
    Port(i32),
    /// The device as a whole.
    Device,
}

/// One event from `ibv_get_async_event`. Object events are acked at once (see the module
/// docs); the others are acked on drop.
pub(crate) struct RawAsyncEvent {
    event_type: u32,
    element: RawElement,
    /// The unacked C event, for kinds that name no object. Kept as `MaybeUninit` and only
    /// passed by pointer: its `event_type` may hold a value outside rdma-sys's Rust enum.
    pending: Option<MaybeUninit<sys::ibv_async_event>>,
}

impl std::fmt::Debug for RawAsyncEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawAsyncEvent")
            .field("event_type", &self.event_type)
            .field("element", &self.element)
            .field("acked", &self.pending.is_none())
            .finish()
    }
}

// SAFETY: a pending event names only a port or the device (plain integers); acking it from
// another thread is allowed by libibverbs.
unsafe impl Send for RawAsyncEvent {}
// SAFETY: no interior mutability; shared access only reads copied integers.
unsafe impl Sync for RawAsyncEvent {}

impl RawAsyncEvent {
    /// Copies what the event names out of it and acks object events at once.
    ///
    /// `ev` comes from `ibv_get_async_event`, or (the fuzz targets) is laid out as libibverbs
    /// fills it: for CQ, QP, SRQ and WQ kinds the element points to a live object of that kind.
    pub(crate) fn read(mut ev: MaybeUninit<sys::ibv_async_event>) -> Self {
        let base = ev.as_ptr().cast::<u8>();
        let type_at = base
            .wrapping_add(std::mem::offset_of!(sys::ibv_async_event, event_type))
            .cast::<u32>();
        let element_at = base.wrapping_add(std::mem::offset_of!(sys::ibv_async_event, element));
        // SAFETY: `ev` was filled by ibv_get_async_event. `event_type` is a C enum, stored as 4
        // aligned bytes; rdma-sys types it as a Rust enum with values 0..=19, so it is read as
        // a u32 (never as the Rust enum, which would be UB for a newer kernel's value).
        let event_type = unsafe { type_at.read() };
        // SAFETY: the element union is 8 aligned bytes of plain data written by the call.
        let element_ptr = unsafe { element_at.cast::<*mut c_void>().read() };
        let element = match event_type {
            0 => {
                let cq = element_ptr.cast::<sys::ibv_cq>();
                // SAFETY: for CQ_ERR the element is a CQ that cannot be freed before this event
                // is acked (ibv_destroy_cq waits for it).
                let token = unsafe { (*cq).cq_context } as u64;
                RawElement::Cq(token)
            }
            1..=7 | 16 => {
                let qp = element_ptr.cast::<sys::ibv_qp>();
                // SAFETY: for QP events the element is a QP that cannot be freed before this
                // event is acked (ibv_destroy_qp waits for it).
                RawElement::Qp(unsafe { (*qp).qp_num })
            }
            14 | 15 => RawElement::Srq(element_ptr as usize),
            19 => RawElement::Wq(element_ptr as usize),
            8 => RawElement::Device,
            _ => {
                // SAFETY: for every other kind the element is the `port_num` int, at offset 0 of
                // the (8-aligned) union.
                RawElement::Port(unsafe { element_at.cast::<c_int>().read() })
            }
        };
        match element {
            RawElement::Cq(_) | RawElement::Qp(_) | RawElement::Srq(_) | RawElement::Wq(_) => {
                // SAFETY: the event came from ibv_get_async_event and is acked exactly once, here;
                // C reads it through the pointer as the C type (a u32 enum), never as Rust's.
                unsafe { sys::ibv_ack_async_event(ev.as_mut_ptr()) };
                RawAsyncEvent {
                    event_type,
                    element,
                    pending: None,
                }
            }
            RawElement::Port(_) | RawElement::Device => RawAsyncEvent {
                event_type,
                element,
                pending: Some(ev),
            },
        }
    }

    pub(crate) fn event_type(&self) -> u32 {
        self.event_type
    }

    pub(crate) fn element(&self) -> RawElement {
        self.element
    }
}

impl Drop for RawAsyncEvent {
    fn drop(&mut self) {
        if let Some(ev) = self.pending.as_mut() {
            // SAFETY: the event came from ibv_get_async_event and was not acked (object events
            // were acked at read and have no pending event); acked exactly once, here.
            unsafe { sys::ibv_ack_async_event(ev.as_mut_ptr()) };
        }
    }
}
