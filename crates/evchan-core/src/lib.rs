//! Safe, synchronous core of evchan: RDMA's event channels with the C library's rules carried
//! by the types.
//!
//! - [`EventChannel`] — `rdma_create_event_channel`: the descriptor on which rdma_cm events
//!   arrive; blocking, non-blocking and timed reads; [`AsFd`](std::os::fd::AsFd) for polling.
//! - [`CmId`] (`cm::Id<'ch, State>`) — `rdma_create_id`: an id whose state is in its type, so
//!   connecting before the route is resolved, or accepting on an active id, does not compile.
//! - [`CmEvent`] (`cm::Event<'ch>`) — an event held until it is acked (on drop or by
//!   [`ack`](cm::Event::ack)); its private data is borrowed from it.
//! - [`cm::AnyId`] — an id with its state erased and checked at run time, for storing ids of
//!   mixed states together (e.g. a server's connections in one map).
//! - [`verbs`] — the verbs side: devices and contexts, PD, memory regions, the completion
//!   channel ([`verbs::CompChannel`]) with its CQs and batched acks, QPs, async device events.
//!
//! Besides RC connections with a QP (`ESTABLISHED` on both sides), the id covers a connect
//! without a QP (`CONNECT_RESPONSE`, then [`establish`](cm::Id::establish) via
//! `rdma_establish`) and UD service ID resolution on the UDP port space
//! ([`accept_datagram`](cm::Id::accept_datagram),
//! [`established_datagram`](cm::Id::established_datagram) with the peer's QP number, QKey and
//! address vector).
//!
//! The invariants of librdmacm that the types carry:
//!
//! 1. a channel outlives its ids and events (they borrow it);
//! 2. each event is acked exactly once, and its data is read only before the ack;
//! 3. destroying or migrating an id never waits forever on an event the same thread holds (the
//!    destroy is deferred to the ack; the migrate is refused with [`Error::Busy`]); every event
//!    is counted against its id exactly (a `CONNECT_REQUEST` against its listener), with no
//!    timed fallback; a destroy or migrate waits only for readers that already have an event in
//!    hand, whatever the flags of the channel's file (see [`EventChannel`] for the one case it
//!    cannot cover: a reader outside evchan taking events through a dup of the descriptor);
//!    a listening id cannot be migrated at all (a queued `CONNECT_REQUEST` would be lost; see
//!    [`cm::state::CanMigrate`]);
//! 4. private data is checked against its limit before the call;
//! 5. `ENODEV` is [`Error::NoDevice`], whose message says how to get a device.
//!
//! The invariants of libibverbs are listed in [`verbs`].
//!
//! All `unsafe` code lives in one private module (`ffi`); the rest of the crate denies it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod channel;
pub mod cm;
pub mod device;
mod error;
mod ffi;
#[cfg(feature = "tokio")]
mod readiness;
pub mod verbs;

/// Entry points of the fuzz targets (`fuzz/`): the decoding of kernel events from memory a
/// fuzzer fills. Feature `fuzzing`; not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use ffi::fuzzing;

pub use channel::EventChannel;
pub use cm::Event as CmEvent;
pub use cm::Id as CmId;
pub use error::{Error, NoDevice, PrivateDataTooLong, Result, UnexpectedEvent};
#[cfg(feature = "tokio")]
pub use readiness::{Readable, ReadyGuard};

// This crate's README's Rust example, compiled as a doc test (`no_run`: it needs a device).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The index of network interface `name` (`if_nametoindex(3)`), e.g. the scope id of an IPv6
/// link-local address on it; `None` when there is no such interface.
#[doc(alias = "if_nametoindex")]
#[must_use]
pub fn if_index(name: &str) -> Option<u32> {
    ffi::addr::if_index(name)
}
