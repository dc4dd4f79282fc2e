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
#[cfg(feature = "tokio")]
pub(crate) mod tokio_fd;
pub(crate) mod verbs;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Whether `fd` is readable now: `poll(2)` with a zero timeout, `EINTR` retried.
///
/// The fast path of every read of a channel (each read is made only once this says an event
/// is queued). Unlike `evchan_sys::fd::poll_readable(fd, Some(Duration::ZERO))` it reads no
/// clock (that one computes a deadline: two `clock_gettime` per call; see
/// docs/BENCHMARKS.md for what the profile of an empty read showed).
#[inline]
pub(crate) fn readable_now(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is one valid, initialised pollfd and the count is 1; a zero timeout
        // never waits.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}
