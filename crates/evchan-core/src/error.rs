//! Errors of evchan-core.

use std::fmt;
use std::io;

use crate::cm::{EventKind, PortSpace, Status};

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in evchan-core.
///
/// OS failures keep their [`io::Error`] and name the C call; the other variants are checks this
/// crate makes before (or instead of) calling C.
///
/// Its `Debug` is its message, then each cause on a line of its own: what a `main` that
/// returns `Result<(), evchan_core::Error>` prints on failure (`Error: …`), help included (the
/// no-device error says how to get a device). Match on the variants for the details.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The machine has no usable RDMA device (librdmacm reported `ENODEV`).
    #[error(transparent)]
    NoDevice(#[from] NoDevice),
    /// A C call failed with an OS error.
    #[error("{call} failed: {source}")]
    Os {
        /// The C call, e.g. `"rdma_resolve_addr"`.
        call: &'static str,
        /// The OS error it reported.
        #[source]
        source: io::Error,
    },
    /// Private data longer than its message can carry; checked before any C call.
    #[error(transparent)]
    PrivateDataTooLong(#[from] PrivateDataTooLong),
    /// An event that does not complete the transition asked for.
    #[error(transparent)]
    UnexpectedEvent(#[from] UnexpectedEvent),
    /// The operation is not for an id of this port space (e.g. `rdma_accept` of a UDP id,
    /// which completes with no event: use the datagram variant the message names).
    #[error("{call} is not for an id in the {port_space:?} port space: {hint}")]
    WrongPortSpace {
        /// The operation refused.
        call: &'static str,
        /// The id's port space.
        port_space: PortSpace,
        /// What to call instead.
        hint: &'static str,
    },
    /// An [`AnyId`](crate::cm::AnyId) is not in the state the operation needs.
    #[error("the id is in state `{actual}`, not {expected}")]
    WrongState {
        /// The state (or states) needed.
        expected: &'static str,
        /// The state the id is in.
        actual: &'static str,
    },
    /// `rdma_migrate_id` or `rdma_leave_multicast` would block: events read for the id are not
    /// acked yet.
    #[error(
        "{call} refused: {pending} event(s) read for this id are not acked yet \
         (librdmacm would wait for those acks forever); ack them first"
    )]
    Busy {
        /// The C call refused.
        call: &'static str,
        /// Unacked events counted against the id.
        pending: usize,
    },
}

impl Error {
    /// An [`Error::Os`] for `call`, or [`Error::NoDevice`] when the error is `ENODEV`.
    pub(crate) fn os(call: &'static str, source: io::Error) -> Self {
        if source.raw_os_error() == Some(libc::ENODEV) {
            Self::NoDevice(NoDevice { call, source })
        } else {
            Self::Os { call, source }
        }
    }

    /// The OS error code behind this error, if there is one.
    #[must_use]
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Self::NoDevice(e) => e.source.raw_os_error(),
            Self::Os { source, .. } => source.raw_os_error(),
            Self::Busy { .. } => Some(libc::EBUSY),
            Self::PrivateDataTooLong(_)
            | Self::UnexpectedEvent(_)
            | Self::WrongPortSpace { .. }
            | Self::WrongState { .. } => None,
        }
    }

    /// Whether this is [`Error::NoDevice`].
    #[must_use]
    pub fn is_no_device(&self) -> bool {
        matches!(self, Self::NoDevice(_))
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Os { source, .. } => source,
            Error::NoDevice(_) => io::Error::new(io::ErrorKind::NotFound, e),
            Error::Busy { .. } => io::Error::new(io::ErrorKind::WouldBlock, e),
            other => io::Error::new(io::ErrorKind::InvalidInput, other),
        }
    }
}

/// No usable RDMA device: a C call failed with `ENODEV`.
///
/// Its message says how to get a device.
#[derive(Debug, thiserror::Error)]
#[error(
    "no RDMA device: {call} failed ({source}). To get one: use a machine with an RDMA NIC; or \
     create a soft-RoCE device on a network interface with \
     `rdma link add rxe0 type rxe netdev <iface>` (needs the rdma_rxe module); or run the \
     program inside evchan's soft-RoCE VM with `cargo xtask vm -- <cmd>`"
)]
pub struct NoDevice {
    call: &'static str,
    source: io::Error,
}

impl NoDevice {
    pub(crate) fn new(call: &'static str) -> Self {
        Self {
            call,
            source: io::Error::from_raw_os_error(libc::ENODEV),
        }
    }

    /// The C call that found no device.
    #[must_use]
    pub fn call(&self) -> &'static str {
        self.call
    }
}

/// The message that carries private data, for [`PrivateDataTooLong`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Message {
    /// `rdma_connect` (an IB CM REQ, or a SIDR REQ for UDP).
    Connect,
    /// `rdma_accept` (REP, or SIDR REP for UDP).
    Accept,
    /// `rdma_reject` (REJ, or SIDR REP for UDP).
    Reject,
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Connect => "rdma_connect",
            Self::Accept => "rdma_accept",
            Self::Reject => "rdma_reject",
        })
    }
}

/// Private data over the limit of its message and port space.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "private data of {len} bytes is too long for {message} in the {port_space:?} port space \
     (at most {max} bytes)"
)]
pub struct PrivateDataTooLong {
    /// The message.
    pub message: Message,
    /// The id's port space.
    pub port_space: PortSpace,
    /// The length given.
    pub len: usize,
    /// The most the message can carry.
    pub max: usize,
}

/// An event that does not complete the transition asked for: another kind, or an event of
/// another id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct UnexpectedEvent {
    /// The kind that completes the transition.
    pub expected: EventKind,
    /// The kind given.
    pub got: EventKind,
    /// Its status.
    pub status: Status,
    /// Whether the event belongs to the id at all.
    pub same_id: bool,
}

impl UnexpectedEvent {
    fn describe(&self) -> String {
        if self.same_id {
            format!(
                "expected {} for this id, got {} ({})",
                self.expected, self.got, self.status
            )
        } else {
            format!(
                "expected {} for this id, got {} of another id",
                self.expected, self.got
            )
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")?;
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            write!(f, "\n  caused by: {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enodev_becomes_no_device_with_help() {
        let e = Error::os(
            "rdma_create_event_channel",
            io::Error::from_raw_os_error(libc::ENODEV),
        );
        assert!(e.is_no_device());
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV));
        let msg = e.to_string();
        assert!(msg.contains("rdma link add rxe0 type rxe netdev"), "{msg}");
        assert!(msg.contains("cargo xtask vm --"), "{msg}");
        assert!(msg.contains("RDMA NIC"), "{msg}");
    }

    #[test]
    fn other_errno_stays_os() {
        let e = Error::os(
            "rdma_listen",
            io::Error::from_raw_os_error(libc::EADDRINUSE),
        );
        assert!(!e.is_no_device());
        assert!(e.to_string().starts_with("rdma_listen failed"));
        let io: io::Error = e.into();
        assert_eq!(io.raw_os_error(), Some(libc::EADDRINUSE));
    }

    #[test]
    fn private_data_message_names_limit() {
        let e = PrivateDataTooLong {
            message: Message::Connect,
            port_space: PortSpace::Tcp,
            len: 57,
            max: 56,
        };
        assert_eq!(
            e.to_string(),
            "private data of 57 bytes is too long for rdma_connect in the Tcp port space (at most 56 bytes)"
        );
    }
}
