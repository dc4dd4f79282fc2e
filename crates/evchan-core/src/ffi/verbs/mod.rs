//! Handles of libibverbs objects, and the only calls into libibverbs.
//!
//! One module tree, split by object (`device`, `async_event`, `mr`, `cq`, `qp`): every `unsafe`
//! of the verbs side is here, to be reviewed together.
//!
//! # Safety
//!
//! Each handle owns one C object and frees it on drop, except the two that only *borrow* what
//! librdmacm owns ([`ContextRef`], [`PdRef`]). The lifetimes say what a C object needs alive,
//! so that drop order is enforced by the borrow checker:
//!
//! | handle | borrows | because |
//! |---|---|---|
//! | [`Context`] | nothing (the device list may be freed once a device is open) | |
//! | [`Pd<'ctx>`] | the context | `ibv_dealloc_pd` needs the context |
//! | [`CompChannel<'ctx>`] | the context | `ibv_destroy_comp_channel` locks `context->mutex` |
//! | [`Cq<'ch>`] | the completion channel | `ibv_destroy_comp_channel` fails with `EBUSY` while a CQ uses it |
//! | [`Mr<'pd, B>`] | the PD, and owns or exclusively borrows its buffer `B` | `ibv_dealloc_pd` fails with `EBUSY` while an MR uses it |
//! | [`Qp<'res>`] | the PD and both CQs | `ibv_destroy_cq` fails with `EBUSY` while a QP uses it |
//! | [`ContextRef<'a>`], [`PdRef<'a>`] | the rdma_cm id they were read from | librdmacm keeps them while the id holds its device |
//!
//! Acks are the other half. libibverbs' `ibv_destroy_cq` (and `ibv_destroy_qp`) wait on a
//! condition variable until every completion event (resp. async event) already read for the
//! object is acked; an event read but never acked makes the destroy hang forever. So:
//!
//! - a completion event read from a channel is a [`CqEventAck`], which acks itself at once on
//!   drop, or is [`CqEventAck::defer`]red into its [`Cq`]'s pending count; [`Cq`]'s drop acks the
//!   pending count before `ibv_destroy_cq`. Acks are never counted for an event that was not read
//!   (over-acking would make the destroy wait forever too: it waits for equality).
//! - an async event naming a CQ, QP, SRQ or WQ is acked as soon as it has been read and the
//!   object's identity copied out ([`RawAsyncEvent`]), so no destroy can wait on it.

use std::io;
use std::marker::PhantomData;
use std::ptr::NonNull;

use evchan_sys as sys;

mod async_event;
mod cq;
mod device;
pub(crate) mod exposed;
mod mr;
mod qp;
mod raw_post;
mod slots;

pub(crate) use async_event::{RawAsyncEvent, RawElement};
pub(crate) use cq::{CompChannel, Cq, CqEventAck, RawWc};
pub(crate) use device::{Context, DeviceList};
pub use mr::MrBuffer;
pub(crate) use mr::{fresh_owned_wr_id, Mr, Pd, Posted};
pub(crate) use qp::{check_same_context, same_context, sge_of, Qp, QpCaps, QpModify, RemoteOp};
pub use qp::{SendFlags, Sge};
pub(crate) use slots::{post_op, post_slot, RawSlot, SlotOp, SlotRefusal, SlotRegion};

/// A C object borrowed for `'a`, owned by someone else (librdmacm, or one of our handles):
/// the pointer and the lifetime, nothing else. Its verbs are on the aliases below.
pub(crate) struct Borrowed<'a, T> {
    ptr: NonNull<T>,
    _owner: PhantomData<&'a T>,
}

/// A borrowed `struct ibv_context` (an open device).
pub(crate) type ContextRef<'a> = Borrowed<'a, sys::ibv_context>;
/// A borrowed `struct ibv_pd`.
pub(crate) type PdRef<'a> = Borrowed<'a, sys::ibv_pd>;
/// A borrowed QP: ours ([`Qp::ptr`]) or an rdma_cm id's (`ffi::cm::Id::user_qp`). Every verb
/// that does not destroy the QP goes through it.
pub(crate) type QpPtr<'a> = Borrowed<'a, sys::ibv_qp>;

impl<T> Borrowed<'_, T> {
    /// Borrows `ptr`, or `None` when it is NULL.
    ///
    /// # Safety
    ///
    /// `ptr` is NULL or a live object that stays alive (not freed, closed or destroyed) for the
    /// chosen lifetime.
    pub(crate) unsafe fn from_raw(ptr: *mut T) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| Self {
            ptr,
            _owner: PhantomData,
        })
    }

    /// The object's address, as an opaque key (the same object, the same key).
    pub(crate) fn key(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The object's address.
    pub(crate) fn as_non_null(&self) -> NonNull<T> {
        self.ptr
    }
}

impl<T> Clone for Borrowed<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Borrowed<'_, T> {}

impl<T> std::fmt::Debug for Borrowed<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.ptr.fmt(f)
    }
}

/// Acks are flushed with one `ibv_ack_cq_events` call once this many are pending for a CQ.
pub(crate) const ACK_BATCH: u32 = 64;

/// The most work completions one `ibv_poll_cq` call of [`Cq::poll`] asks for.
pub(crate) const POLL_BATCH: usize = 32;

fn null_err() -> io::Error {
    let e = sys::last_error();
    // libibverbs sometimes returns NULL without setting errno; never report "success".
    if e.raw_os_error() == Some(0) {
        io::Error::from_raw_os_error(libc::ENOMEM)
    } else {
        e
    }
}
