//! Errors of the async layer.

use std::fmt;
use std::io;

use evchan_core::cm::RejectReason;
use evchan_core::verbs::{AsyncEventKind, WcStatus};

use crate::proto::{HandshakeError, ProtocolError};

/// The result of this crate's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The step of a connection's setup that failed or timed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// `rdma_resolve_addr` → `ADDR_RESOLVED`.
    Address,
    /// `rdma_resolve_route` → `ROUTE_RESOLVED`.
    Route,
    /// `rdma_connect` (or `rdma_accept`) → `ESTABLISHED`.
    Connect,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Address => "address resolution",
            Step::Route => "route resolution",
            Step::Connect => "connection establishment",
        })
    }
}

/// Why an established connection ended without a clean close.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Lost {
    /// The peer disconnected (`DISCONNECTED`) without closing the stream first.
    #[error("the peer disconnected without closing")]
    Disconnected,
    /// The peer broke the protocol.
    #[error("protocol violation by the peer: {0}")]
    Protocol(#[from] ProtocolError),
    /// A work request failed (e.g. retries exceeded: the peer is gone or the wire is cut).
    #[error("a work request failed: {0:?}")]
    WorkCompletion(WcStatus),
    /// A verbs call on the connection failed.
    #[error("{0}")]
    Verbs(String),
    /// The connection's QP entered the error state without a failed work request of its own:
    /// the device reported a QP async event, or the QP's work requests were flushed while the
    /// connection was not closing (something moved the QP to the error state).
    #[error("the connection's QP failed ({})", qp_error_cause(*.event))]
    QpError {
        /// The async event (`IBV_EVENT_QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`,
        /// `PATH_MIG_ERR`); `None` when only flushed work requests showed it.
        event: Option<AsyncEventKind>,
    },
    /// An RDMA device went away (`DEVICE_REMOVAL`, or its verbs device node vanished). Every
    /// listener and connection of the runtime fails with it — those on other devices too —
    /// and their resources are released at once, so that the device can go; new handles start
    /// a fresh runtime (see `docs/RELIABILITY.md`).
    #[error("the RDMA device was removed")]
    DeviceRemoved,
    /// This side closed the connection.
    #[error("the connection was closed")]
    Closed,
    /// The background shard that drove the connection's control path stopped on an error
    /// (its thread failed): everything of the connection was released.
    #[error("the shard driving the connection shut down")]
    Shutdown,
}

/// Why a busy evchan server refused a connection ([`Error::Rejected`]'s `busy`).
///
/// On the wire, for any librdmacm client: the reject's private data is the ASCII text
/// `evchan-busy:` followed by the cause's name (`connections`, `backlog`, `descriptors`,
/// `memory`), with
/// no terminator
/// (the IB CM pads it with zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Busy {
    /// The listener holds [`Config::max_connections`](crate::Config::max_connections)
    /// connections.
    Connections,
    /// The listener holds [`Config::backlog`](crate::Config::backlog) half-open connections
    /// (requests not yet accepted, or accepted and not yet established).
    Backlog,
    /// The server process is out of file descriptors (`EMFILE`, `ENFILE`) for its shard's
    /// completion channel, which the shard makes with its first connection on a device (a
    /// connection needs no descriptor of its own).
    Descriptors,
    /// The listener's connections hold its
    /// [`Config::memory_budget`](crate::Config::memory_budget): another one's buffers would go
    /// beyond it.
    Memory,
}

impl Busy {
    /// The reject private data's prefix.
    pub(crate) const PREFIX: &'static [u8] = b"evchan-busy:";

    /// The cause's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Busy::Connections => "connections",
            Busy::Backlog => "backlog",
            Busy::Descriptors => "descriptors",
            Busy::Memory => "memory",
        }
    }

    /// The reject's private data.
    pub(crate) fn private_data(self) -> Vec<u8> {
        [Self::PREFIX, self.name().as_bytes()].concat()
    }

    /// The cause of a reject's private data (zeros after it ignored), if it is a busy reject.
    pub(crate) fn from_private_data(data: &[u8]) -> Option<Self> {
        let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let name = data[..end].strip_prefix(Self::PREFIX)?;
        [
            Busy::Connections,
            Busy::Backlog,
            Busy::Descriptors,
            Busy::Memory,
        ]
        .into_iter()
        .find(|b| b.name().as_bytes() == name)
    }
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Busy::Connections => "it holds its maximum of connections",
            Busy::Backlog => "its backlog of half-open connections is full",
            Busy::Descriptors => "it is out of file descriptors",
            Busy::Memory => "its memory budget for connections is spent",
        })
    }
}

/// An error of the async connection API.
///
/// Its `Debug` is its message, then each cause on a line of its own: what a `main` that
/// returns `Result<(), evchan::Error>` prints on failure (`Error: …`), help included (the
/// no-device error says how to get a device). Match on the variants for the details.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No RDMA device; the message says how to get one.
    #[error(transparent)]
    NoDevice(#[from] evchan_core::NoDevice),
    /// The peer rejected the connection (`REJECTED`): reason 8 when nobody listens on the port,
    /// 28 when the application (or evchan's admission control) rejected it; with the private
    /// data it sent, and why when an evchan server was too busy to take it.
    #[error("connection rejected: {reason}{}", busy.map(|b| format!(" (the server is busy: {b})")).unwrap_or_default())]
    Rejected {
        /// The IB CM reject reason.
        reason: RejectReason,
        /// The reject's private data (user data of an evchan peer, as sent; for a busy
        /// server, `evchan-busy:` and the cause).
        private_data: Vec<u8>,
        /// An evchan server refused the connection for want of room: retry later, or elsewhere.
        busy: Option<Busy>,
    },
    /// The peer is unreachable (`UNREACHABLE`).
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// A setup step took longer than its timeout.
    #[error("{0} timed out")]
    TimedOut(Step),
    /// Address or route resolution failed (`ADDR_ERROR`, `ROUTE_ERROR`).
    #[error("{step} failed: {source}")]
    Resolve {
        /// Which step.
        step: Step,
        /// The kernel's errno.
        #[source]
        source: io::Error,
    },
    /// `CONNECT_ERROR`: the connection could not be set up.
    #[error("connect failed: {0}")]
    Connect(String),
    /// A message above the peer's maximum; refused before anything was sent.
    #[error("a message of {len} bytes is above the maximum of {max} bytes")]
    MessageTooLarge {
        /// The message's length.
        len: usize,
        /// The largest message the peer accepts.
        max: usize,
    },
    /// Private data above what the message can carry after evchan's 16-byte handshake.
    #[error("private data of {len} bytes is above the {max} bytes this message can carry")]
    PrivateDataTooLong {
        /// Its length.
        len: usize,
        /// The limit for the user's private data.
        max: usize,
    },
    /// The peer's handshake is malformed.
    #[error("bad handshake from the peer: {0}")]
    Handshake(#[from] HandshakeError),
    /// The peer closed its sending side: nothing more can come (from `send` after the peer
    /// went away cleanly).
    #[error("the peer closed the connection")]
    PeerClosed,
    /// The connection ended abnormally.
    #[error("connection lost: {0}")]
    ConnectionLost(#[from] Lost),
    /// A one-sided operation's range is not inside the peer's descriptor, is misaligned (an
    /// atomic) or empty, or its local slot is too small (an atomic's 8 bytes on a connection
    /// whose messages are smaller): refused before anything was posted; the connection goes
    /// on.
    #[error(transparent)]
    Remote(#[from] evchan_core::verbs::RemoteError),
    /// An RDMA READ or atomic on a connection whose peer granted no responder resources when
    /// it was set up (its `responder_resources` 0: a plain librdmacm peer may do that), which
    /// therefore takes none: refused before posting; the connection goes on.
    #[error("the peer takes no RDMA READ or atomic on this connection (no responder resources)")]
    NoReadResources,
    /// The configured resources are exhausted (e.g. CQ entries of a shard).
    #[error("resources exhausted: {0}")]
    Exhausted(&'static str),
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An error of the safe core (rdma_cm).
    #[error(transparent)]
    Core(evchan_core::Error),
    /// An error of the safe core (verbs).
    #[error(transparent)]
    Verbs(#[from] evchan_core::verbs::Error),
    /// A slot pool could not be made (e.g. out of memory).
    #[error(transparent)]
    Slots(#[from] evchan_core::verbs::SlotError),
    /// An OS error of the runtime (threads, descriptors).
    #[error("evchan runtime: {0}")]
    Io(#[from] io::Error),
}

impl Error {
    /// Whether the error is the missing RDMA device.
    #[must_use]
    pub fn is_no_device(&self) -> bool {
        match self {
            Error::NoDevice(_) => true,
            Error::Core(e) => matches!(e, evchan_core::Error::NoDevice(_)),
            Error::Verbs(e) => matches!(e, evchan_core::verbs::Error::NoDevice),
            _ => false,
        }
    }
}

impl Error {
    /// Whether this error, or one of its causes, is the OS refusing a descriptor (`EMFILE`:
    /// the process's limit; `ENFILE`: the system's).
    pub(crate) fn is_out_of_descriptors(&self) -> bool {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cause {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if matches!(io.raw_os_error(), Some(23 | 24)) {
                    return true;
                }
            }
            cause = e.source();
        }
        false
    }
}

impl From<evchan_core::Error> for Error {
    fn from(e: evchan_core::Error) -> Self {
        match e {
            evchan_core::Error::NoDevice(nd) => Error::NoDevice(nd),
            e => Error::Core(e),
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = match &e {
            e if e.is_no_device() => io::ErrorKind::NotFound,
            Error::Rejected { .. } => io::ErrorKind::ConnectionRefused,
            Error::Unreachable(_) => io::ErrorKind::HostUnreachable,
            Error::TimedOut(_) => io::ErrorKind::TimedOut,
            Error::MessageTooLarge { .. }
            | Error::PrivateDataTooLong { .. }
            | Error::Config(_)
            | Error::Remote(_)
            | Error::NoReadResources => io::ErrorKind::InvalidInput,
            Error::Handshake(_) => io::ErrorKind::InvalidData,
            Error::PeerClosed => io::ErrorKind::BrokenPipe,
            Error::ConnectionLost(Lost::Closed) => io::ErrorKind::NotConnected,
            Error::ConnectionLost(_) => io::ErrorKind::ConnectionReset,
            Error::Io(e) => e.kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
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

fn qp_error_cause(event: Option<AsyncEventKind>) -> String {
    match event {
        Some(kind) => format!("async event {kind:?}"),
        None => "its work requests were flushed".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::Busy;

    #[test]
    fn busy_rejects_round_trip_and_nothing_else_is_busy() {
        for b in [Busy::Connections, Busy::Backlog, Busy::Descriptors] {
            let mut wire = b.private_data();
            assert_eq!(Busy::from_private_data(&wire), Some(b));
            // The IB CM pads the private data with zeros.
            wire.resize(148, 0);
            assert_eq!(Busy::from_private_data(&wire), Some(b));
        }
        assert_eq!(Busy::Connections.private_data(), b"evchan-busy:connections");
        for other in [
            &b""[..],
            b"go away",
            b"evchan-busy:",
            b"evchan-busy:connectionsX",
            b"evchan-busy:backlog\0x",
        ] {
            assert_eq!(Busy::from_private_data(other), None, "{other:?}");
        }
    }
}
