//! Errors of the verbs layer.

use std::fmt;
use std::io;

use super::{CqId, Mr, MrBuffer};

/// What a verbs call can fail with.
///
/// OS and driver errors keep their [`io::Error`] and name the C call that returned them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The machine has no RDMA device (or the kernel has no RDMA support).
    #[error(
        "no RDMA device found: use a host with an RDMA NIC, add a soft-RoCE device \
         (`rdma link add rxe0 type rxe netdev <interface>`), or run inside the project's VM \
         (`cargo xtask vm -- <command>`)"
    )]
    NoDevice,
    /// No device has the name asked for.
    #[error("no RDMA device named `{0}`")]
    DeviceNotFound(String),
    /// A libibverbs call failed.
    #[error("{call} failed: {source}")]
    Io {
        /// The C call, e.g. `"ibv_create_cq"`.
        call: &'static str,
        /// The error it returned.
        #[source]
        source: io::Error,
    },
    /// An argument is out of the range the C call accepts; the call was not made.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// A completion event arrived for a CQ that was not in the list passed to
    /// [`CompChannel::get_cq_event`](super::CompChannel::get_cq_event). The event has been
    /// acked; poll (and re-arm) that CQ.
    #[error("completion event for CQ {0:?}, which is not in the list given; it was acked")]
    UnlistedCq(CqId),
    /// The QP of a [`QpHandle`](super::QpHandle) is gone: its rdma_cm id destroyed it (when
    /// the id went, or by `destroy_qp`). Nothing was posted.
    #[error("the QP was destroyed by its rdma_cm id; nothing was posted")]
    QpDestroyed,
    /// A one-sided operation's range is not inside the peer's descriptor, or an atomic's word
    /// is not aligned, or the local slot is too small: nothing was posted.
    #[error("{0}")]
    Remote(#[from] super::RemoteError),
}

impl Error {
    pub(crate) fn io(call: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Io { call, source }
    }

    /// Whether a post found the work queue full (`ENOMEM` from an `ibv_post_*` call):
    /// backpressure, try again after a completion.
    #[must_use]
    pub fn is_queue_full(&self) -> bool {
        matches!(self, Error::Io { call, source }
            if call.starts_with("ibv_post_") && source.raw_os_error() == Some(libc::ENOMEM))
    }

    /// The OS error code, when the error came from a C call.
    #[must_use]
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Io { source, .. } => source,
            Error::NoDevice | Error::DeviceNotFound(_) => {
                io::Error::new(io::ErrorKind::NotFound, e)
            }
            Error::InvalidArgument(_) | Error::Remote(_) => {
                io::Error::new(io::ErrorKind::InvalidInput, e)
            }
            Error::UnlistedCq(_) => io::Error::other(e),
            Error::QpDestroyed => io::Error::new(io::ErrorKind::NotConnected, e),
        }
    }
}

/// The result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The memory region given to an owned post is registered with another PD than the QP's.
///
/// Refused before the post: on one device the HCA's PD check would fail the work request, but
/// across two devices the region's lkey could name a region of the QP's device, and the device
/// would reach memory never registered for it. It comes as the payload of
/// [`PostError::source`] (kind [`io::ErrorKind::InvalidInput`]); see
/// [`PostError::is_foreign_pd`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the memory region is registered with another protection domain than the QP's")]
pub struct ForeignPd;

/// Posting a work request failed; the memory region comes back unchanged.
#[derive(thiserror::Error)]
#[error("{call} failed: {source}")]
pub struct PostError<'pd, B: MrBuffer> {
    /// The C call, `"ibv_post_send"` or `"ibv_post_recv"` (or the range check before it).
    pub call: &'static str,
    /// Why.
    #[source]
    pub source: io::Error,
    /// The region that was to be posted.
    pub mr: Mr<'pd, B>,
}

impl<B: MrBuffer> PostError<'_, B> {
    /// Whether the post was refused because the region is registered with another PD than
    /// the QP's ([`ForeignPd`]).
    #[must_use]
    pub fn is_foreign_pd(&self) -> bool {
        self.source.get_ref().is_some_and(|e| e.is::<ForeignPd>())
    }
}

impl<B: MrBuffer> fmt::Debug for PostError<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostError")
            .field("call", &self.call)
            .field("source", &self.source)
            .field("mr", &self.mr)
            .finish()
    }
}
