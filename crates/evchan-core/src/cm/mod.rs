//! The rdma_cm side: ids, events and their parameters.
//!
//! [`Id`] is an `rdma_cm_id` with its state in its type; [`Event`] is an event held until its
//! ack. Both borrow the [`EventChannel`](crate::EventChannel) they belong to. [`AnyId`] erases
//! an id's state, for storing ids of mixed states together.

pub(crate) mod any;
mod event;
mod handshake;
mod id;
mod kind;
mod param;
pub mod state;

pub use crate::error::Message;
pub use any::{AnyId, AnyTransition};
pub use event::{AhAttr, ConnInfo, Event, GlobalRoute, UdInfo};
pub use id::{Id, IdKey, Transition, TransitionError, TransitionExt};
pub use kind::{EventKind, RejectReason, Status};
pub use param::{ConnParam, PortSpace};
