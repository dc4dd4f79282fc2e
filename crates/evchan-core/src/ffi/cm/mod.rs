//! librdmacm: the event channel, ids and events, with the accounting that keeps
//! `rdma_destroy_id` / `rdma_migrate_id` from hanging.
//!
//! # The pending-event protocol
//!
//! Every id we create carries, in `rdma_cm_id::context`, a pointer to its [`id::IdInner`] record
//! (the target of an `Arc`). When an event is read, the record of the id the event *counts
//! against* (the listening id for a `CONNECT_REQUEST`, the event's id otherwise — as in
//! librdmacm's `cma_event::id_priv`) is cloned out of `context` and its `pending` count raised;
//! the ack lowers it. The id's owner ([`Id`]) and each pending event hold an `Arc` of the record,
//! so the record outlives the C id.
//!
//! - Dropping the owner with `pending == 0` destroys the C id at once; with `pending > 0` the
//!   destroy is deferred to the last ack (`rdma_destroy_id` would otherwise wait for that ack
//!   forever when both are in one thread).
//! - A migrate with `pending > 0` is refused with `EBUSY` instead of blocking.
//! - `context` is written (by `Id::adopt`) and read (by `record_of`) atomically, and a record
//!   read for an event must name the event's id: a new id handed over by a `CONNECT_REQUEST`
//!   carries its listener's `context` until the thread that read the request adopts it, and an
//!   event read for it meanwhile by another thread waits for that (see `id::record_of`, "The
//!   adoption race").
//! - The `Arc` cloned out of `context` is always alive at that point: librdmacm returns an event
//!   for an id only while the C id exists, the C id exists until `rdma_destroy_id` returns, and
//!   whoever calls `rdma_destroy_id` holds an `Arc` of the record until it has returned; and
//!   `rdma_destroy_id` does not return before this very event is acked.
//!
//! # Readers and destroys: the channel's gate
//!
//! `rdma_get_cm_event` does more than read: for a `CONNECT_RESPONSE` of an id with a QP,
//! librdmacm moves the QP to RTR and RTS (`ucma_process_conn_resp`, also `ibv_set_ece` /
//! `ibv_query_ece`), and for a `REJECTED` it moves it to ERROR, all *before* the call returns
//! and before we can count the event against the id. The id's owner may sit on another thread
//! (ids are `Send`, channels `Sync`), and dropping it destroys the QP (`rdma_destroy_qp`) at
//! once when no event is counted — so without more, a reader could modify a QP that is being
//! freed, and `rdma_destroy_id` could wait for the ack of an event that reader is about to
//! hand to the very thread that is blocked in the destroy.
//!
//! So each channel has a gate (a mutex, [`Gate`]): every reader holds it from before
//! `rdma_get_cm_event` until the event is counted ([`RawChannel::get_event`]), and every
//! destroy of an id or its QP, and every migrate, holds it too and only then decides, from the
//! pending count, whether to act now or defer to the last ack (`id::IdInner::release`).
//! A reader never waits inside the call for an event to come — waiting is done by `poll` outside
//! the gate — so a destroy waits at most for readers that are already processing an event,
//! never for the next event to arrive. That must hold whatever anyone else does with the
//! descriptors the channel hands out. So the channel's own descriptor never leaves the crate:
//! it is set `O_NONBLOCK` once, at creation, and what `AsFd` hands out is a readiness proxy for
//! it (an epoll instance watching it, `evchan_sys::fd::readiness_proxy`), a different open
//! file. Safe code can dup the proxy and change the proxy's flags, but it can neither change
//! the channel file's flags nor read the channel's events through it, so every read here is
//! one `rdma_get_cm_event` on a non-blocking file: it returns an event or `EAGAIN`, and so do
//! librdmacm's own retries inside the call (after it discards an event).
//!
//! The gate being a mutex, reads on one channel are serialised too, which makes the accounting
//! exact: a `CONNECT_REQUEST`'s new id is adopted
//! (its `context` re-pointed at its own record) by the reader of the request before the next
//! read of the channel starts, so no event of the new id can be read before that (see
//! `id::record_of`).
//!
//! What this does not cover: code that reaches the channel's descriptor by its number (raw,
//! `unsafe` descriptor calls; `/proc/self/fd` opens a new, separate channel file instead).
//! Through a dup of the proxy, safe code can register more descriptors with the proxy's epoll
//! instance, which makes the proxy report readiness the channel does not have: a waiter on the
//! proxy then reads `EAGAIN` (never a wait); the channel's own waits poll its descriptor, not
//! the proxy.

use std::ffi::c_int;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, PoisonError};

use evchan_sys as sys;

use super::verbs::ContextRef;

mod event;
mod id;

pub(crate) use event::RawEvent;
pub(crate) use id::{ConnParamRaw, Id};

/// The event type codes this module tells apart.
pub(crate) mod code {
    pub(crate) const CONNECT_REQUEST: u32 = 4;
    pub(crate) const MULTICAST_JOIN: u32 = 12;
    pub(crate) const MULTICAST_ERROR: u32 = 13;
}

/// A channel's gate (see the module docs): held by a reader from before `rdma_get_cm_event`
/// until its event is counted (and, for a `CONNECT_REQUEST`, its new id adopted), and by a
/// destroy or migrate of an id of the channel.
pub(crate) type Gate = Arc<Mutex<()>>;

/// An owned `struct rdma_event_channel`, with its fd set `O_NONBLOCK`, and the readiness proxy
/// of that fd that the public API hands out (module docs).
pub(crate) struct RawChannel {
    ptr: NonNull<sys::rdma_event_channel>,
    /// The kernel ends its registration when the channel's file closes, whichever of the two
    /// is dropped first.
    proxy: OwnedFd,
    gate: Gate,
}

// SAFETY: a channel is a file descriptor plus librdmacm bookkeeping that is internally locked:
// `rdma_get_cm_event` may run concurrently on one channel from several threads (each call
// allocates its own event; the kernel hands every event to exactly one reader), and nothing in
// the struct is tied to the creating thread.
unsafe impl Send for RawChannel {}
// SAFETY: see `Send`; every operation through `&RawChannel` is one of those thread-safe calls.
unsafe impl Sync for RawChannel {}

impl RawChannel {
    /// `rdma_create_event_channel`, `O_NONBLOCK` on its fd (see the module docs; librdmacm
    /// honours the flag only for reads of events, never for the commands it writes), and the
    /// fd's readiness proxy.
    pub(crate) fn create() -> io::Result<Self> {
        // SAFETY: no arguments; returns NULL with errno set on failure.
        let ptr = NonNull::new(unsafe { sys::rdma_create_event_channel() })
            .ok_or_else(sys::last_error)?;
        // SAFETY: `ptr` is a live channel (destroyed below if the rest fails).
        let raw_fd = unsafe { (*ptr.as_ptr()).fd };
        // SAFETY: the channel's fd is open until the channel is destroyed, after this borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(raw_fd) };
        match super::seal(fd) {
            Ok(proxy) => Ok(Self {
                ptr,
                proxy,
                gate: Gate::default(),
            }),
            Err(e) => {
                // SAFETY: created above, not shared, destroyed once.
                unsafe { sys::rdma_destroy_event_channel(ptr.as_ptr()) };
                Err(e)
            }
        }
    }

    pub(super) fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The readiness proxy of the channel's descriptor: what the public API hands out.
    pub(crate) fn proxy(&self) -> BorrowedFd<'_> {
        self.proxy.as_fd()
    }

    /// The channel's own file descriptor, open for as long as the channel lives. It must not
    /// leave the crate (module docs): the crate polls it and registers it with tokio, nothing
    /// more.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `ptr` is a live channel.
        let fd = unsafe { (*self.ptr.as_ptr()).fd };
        // SAFETY: the fd is open until `rdma_destroy_event_channel`, which only our `Drop`
        // calls, so it outlives the borrow of `self`.
        unsafe { BorrowedFd::borrow_raw(fd) }
    }

    /// `rdma_get_cm_event`: one read, which never waits for an event to come (`EAGAIN` when
    /// none is queued: the channel's file is non-blocking and nobody else can change that;
    /// module docs). `EINTR` and `EAGAIN` come back as errors for the caller to handle.
    ///
    /// The gate is held until the event is counted against its id (module docs); nothing in
    /// between takes it again (a `CONNECT_REQUEST`'s new id is adopted without it).
    #[inline]
    pub(crate) fn get_event(&self) -> io::Result<RawEvent<'_>> {
        let _reading = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
        let mut event = ptr::null_mut();
        // SAFETY: `ptr` is a live channel and `event` a valid out-pointer.
        sys::cvt(unsafe { sys::rdma_get_cm_event(self.ptr.as_ptr(), &mut event) })?;
        let event = NonNull::new(event).ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))?;
        // SAFETY: librdmacm just handed us this event, read from this channel; we own it until
        // we ack it.
        Ok(unsafe { RawEvent::adopt(event, &self.gate) })
    }
}

impl Drop for RawChannel {
    fn drop(&mut self) {
        // SAFETY: every `Id` and `RawEvent` borrows this channel (`'ch`), so none is left; the
        // pointer came from `rdma_create_event_channel` and is destroyed once.
        unsafe { sys::rdma_destroy_event_channel(self.ptr.as_ptr()) }
    }
}

/// `rdma_get_devices`: the names of the RDMA devices librdmacm can use.
pub(crate) fn device_names() -> io::Result<Vec<String>> {
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer; returns NULL with errno on failure.
    let list = unsafe { sys::rdma_get_devices(&mut n) };
    if list.is_null() {
        return Err(sys::last_error());
    }
    let count = usize::try_from(n).unwrap_or(0);
    // SAFETY: `list` holds `n` device contexts (and a NULL after them), valid until
    // `rdma_free_devices` below.
    let contexts = unsafe { std::slice::from_raw_parts(list, count) };
    let mut names = Vec::with_capacity(count);
    for &ctx in contexts {
        // SAFETY: each entry is a live context until `rdma_free_devices`.
        if let Some(c) = unsafe { ContextRef::from_raw(ctx) } {
            names.push(c.name());
        }
    }
    // SAFETY: `list` came from `rdma_get_devices` and is freed once.
    unsafe { sys::rdma_free_devices(list) };
    Ok(names)
}

#[cfg(test)]
/// `rdma_event_str`: the installed library's name of event code `code`.
pub(crate) fn event_str(code: u32) -> String {
    // SAFETY: takes any value; returns a static NUL-terminated string.
    let s = unsafe { sys::rdma_event_str(code) };
    if s.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL static string.
    unsafe { std::ffi::CStr::from_ptr(s) }
        .to_string_lossy()
        .into_owned()
}
