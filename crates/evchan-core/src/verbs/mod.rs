//! The verbs side: devices, the completion channel, CQs, memory regions, QPs, async events.
//!
//! libibverbs reports completions through a **completion channel** (`ibv_comp_channel`), a file
//! descriptor that becomes readable when an armed completion queue gets a completion. This
//! module makes its rules part of the types:
//!
//! | rule of libibverbs | here |
//! |---|---|
//! | a CQ is destroyed before its channel (`ibv_destroy_comp_channel` fails with `EBUSY`) | [`Cq<'ch>`](Cq) borrows its [`CompChannel`]: dropping the channel first does not compile |
//! | `ibv_destroy_cq` waits until every event read for the CQ is acked | a [`CqEvent<'cq>`](CqEvent) borrows its [`Cq`]; acks are counted and flushed in batches, always before `ibv_destroy_cq` |
//! | each event is acked exactly once | [`CqEvent::ack`] takes `self`; drop acks otherwise |
//! | arm, then poll once more before sleeping, or a completion is lost | one helper does the loop: [`CompChannel::wait`] |
//! | a registered buffer must not move or be freed | [`Mr`] owns or exclusively borrows it while the `Mr` lives (a leaked `Mr` of a borrowed buffer stays registered after the borrow ends; no safe post can use it: see [`Mr`]) |
//! | the device owns a posted buffer until its completion | [`Qp::post_send`] / [`Qp::post_recv`] take the [`Mr`] by value and return it for the completion ([`Posted`]) |
//! | a work request's region is registered with the QP's PD | the owned posts refuse another PD's [`Mr`] before posting ([`ForeignPd`]) |
//!
//! Beside these borrowed types, [`owned`] has their `'static` forms ([`OwnedPd`],
//! [`OwnedCompChannel`], [`OwnedCq`], [`OwnedMr`], `CqWaiter`), which keep their parents alive
//! by reference count, and [`QpHandle`], the revocable handle of an rdma_cm id's QP, for
//! handles that move between tasks and threads.
//!
//! # With rdma_cm
//!
//! The same objects serve connections made by rdma_cm: after address resolution an id hands
//! out its device context ([`CmId::context`](crate::CmId::context), an owned [`Context`] that
//! keeps the device open however long the id lives); on it the caller makes a [`Pd`], a
//! [`CompChannel`], [`Cq`]s and [`Mr`]s as above, and the id creates its QP on them
//! ([`CmId::create_qp_with`](crate::CmId::create_qp_with)), so that its completions arrive on
//! the caller's channel. The id then borrows them, and posts as a [`Qp`] does
//! ([`CmId::post_send`](crate::CmId::post_send), [`CmId::post_recv`](crate::CmId::post_recv)).
//! [`ContextRef`] and [`PdRef`] are the borrowed views the id shows of what librdmacm holds.
//!
//! # Threads
//!
//! Every handle is `Send` and `Sync`: libibverbs objects are thread-safe, the pending-ack
//! count of a CQ is atomic. Several threads may poll one CQ or post on one QP. Wait on one
//! channel from one place at a time, though: CQs waited for by different threads belong on
//! different channels (see [`CompChannel::wait`]).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use evchan_core::verbs::{CompChannel, Context, Cq};
//!
//! # fn main() -> Result<(), evchan_core::verbs::Error> {
//! let ctx = Context::open_first()?;
//! let channel = CompChannel::new(&ctx)?;
//! let cq = Cq::new(&channel, 256)?;
//! // ... create QPs on `cq` and post work requests ...
//! let n = cq.wait(Some(Duration::from_secs(1)), |wc| {
//!     println!("wr {} finished: {:?}", wc.wr_id(), wc.status());
//! })?;
//! println!("{n} completions");
//! # Ok(())
//! # }
//! ```
//!
//! # References
//!
//! [`ibv_create_comp_channel(3)`](https://man7.org/linux/man-pages/man3/ibv_create_comp_channel.3.html),
//! [`ibv_get_cq_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_cq_event.3.html),
//! [`ibv_poll_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_poll_cq.3.html),
//! [`ibv_get_async_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_async_event.3.html).
#![warn(missing_docs)]

mod async_event;
mod cm;
mod comp_channel;
mod cq;
mod device;
mod error;
mod mr;
pub mod owned;
mod qp;
pub mod remote;
mod slots;
mod wc;

pub use crate::ffi::verbs::{MrBuffer, SendFlags, Sge};
pub use async_event::{AsyncElement, AsyncEvent, AsyncEventKind};
pub use cm::{ContextRef, PdRef, QpInit};
#[cfg(feature = "tokio")]
pub use comp_channel::AsyncWaiter;
pub use comp_channel::CompChannel;
pub use cq::{Cq, CqEvent, CqId, ACK_BATCH};
pub use device::{Context, Device, DeviceList, Gid, GidType, LinkLayer, Mtu, Pd, Port, PortState};
pub use error::{Error, ForeignPd, PostError, Result};
pub use mr::Mr;
#[cfg(feature = "tokio")]
pub use owned::CqWaiter;
pub use owned::{
    atomic_result, MrPostError, OwnedCompChannel, OwnedCq, OwnedMr, OwnedPd, PostedMr, QpHandle,
};
pub use qp::{Posted, Qp, QpCaps, QpState, RtrAttr, RtsAttr};
pub use remote::{
    Access, AllowsAtomic, AllowsRead, AllowsWrite, Exposed, RemoteAtomic, RemoteBuf, RemoteError,
    RemoteRead, RemoteReadWrite, RemoteWrite, Revoked,
};
pub use slots::{PostedSlot, Slot, SlotError, SlotPool, SlotPostError};
pub use wc::{WcOpcode, WcStatus, WorkCompletion};
