//! The one module tree of evchan-core that calls C.
//!
//! # Safety
//!
//! Everything unsafe in the crate lives under this module; the rest of the crate is
//! `#![deny(unsafe_code)]` and only calls the safe, crate-private wrappers defined here (the
//! one exception: the `unsafe fn` raw posts of the public API, which only declare the caller's
//! contract and forward here). Each block carries a `// SAFETY:` comment and each `unsafe fn` a
//! `# Safety` section.
//!
//! The wrappers own their C objects and carry the lifetimes that librdmacm and libibverbs
//! require, so that the borrow checker enforces the C contracts even inside this module:
//!
//! - [`cm::RawChannel`] owns an `rdma_event_channel`; every [`cm::Id`] and [`cm::RawEvent`]
//!   borrows it (`'ch`), so the channel is destroyed only after all of them.
//! - [`cm::Id`] owns an `rdma_cm_id` together with a shared record that counts the events read
//!   for the id and not yet acked. `rdma_destroy_id` and `rdma_migrate_id` block until every
//!   event already read for the id is acked; the record defers the destroy to the last ack and
//!   refuses a migrate while events are pending, so neither can hang the thread that holds the
//!   event. The id also owns its QP (`rdma_create_qp`); a QP on the caller's PD and CQs is
//!   destroyed when the owner goes, never later (see [`cm::Id::create_qp_with`]). Every
//!   destroy (and migrate) first waits, on the channel's gate, for the readers that are inside
//!   `rdma_get_cm_event`, where librdmacm may be modifying the id's QP for an event not yet
//!   counted (see [`cm`], "Readers and destroys").
//! - [`cm::RawEvent`] owns one `rdma_cm_event` until `rdma_ack_cm_event`, and with it the private
//!   data the event points into.
//! - [`verbs`]: the device context (opened here, or librdmacm's held by a device reference),
//!   PD, memory regions, completion channel, CQs and QPs, each borrowing what it needs alive;
//!   the table is in its docs.
//!
//! Socket address conversions are in [`addr`].
#![allow(unsafe_code)]

pub(crate) mod addr;
pub(crate) mod cm;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod owned;
#[cfg(feature = "tokio")]
pub(crate) mod tokio_fd;
pub(crate) mod verbs;

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

/// Keeps a channel's own descriptor `fd` to the crate (`cm`'s module docs, "Readers and
/// destroys"; the completion channel does the same): sets it `O_NONBLOCK`, once, and returns
/// the readiness proxy that the public API hands out in its place.
pub(crate) fn seal(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    evchan_sys::fd::set_nonblocking(fd, true)?;
    evchan_sys::fd::readiness_proxy(fd)
}
