//! The rdma_cm side: ids, events and their parameters.
//!
//! [`Id`] is an `rdma_cm_id` with its state in its type; [`Event`] is an event held until its
//! ack. Both borrow the [`EventChannel`](crate::EventChannel) they belong to.

mod event;
mod id;
mod kind;
mod param;
pub mod state;

pub use crate::error::Message;
pub use event::{ConnInfo, Event, UdInfo};
pub use id::{Id, IdKey, Transition, TransitionError};
pub use kind::{EventKind, RejectReason, Status};
pub use param::{ConnParam, PortSpace};
