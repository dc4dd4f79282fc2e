//! Event kinds (`enum rdma_cm_event_type`) and statuses.

use std::fmt;
use std::io;

/// The kind of an rdma_cm event: `enum rdma_cm_event_type`.
///
/// All twenty codes librdmacm defines, and [`EventKind::Unknown`] for a code this crate does
/// not know (a newer library), which comes through as a value, never a panic.
#[doc(alias = "rdma_cm_event_type")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// 0: `rdma_resolve_addr` succeeded.
    AddrResolved,
    /// 1: `rdma_resolve_addr` failed; the status is a negative errno.
    AddrError,
    /// 2: `rdma_resolve_route` succeeded.
    RouteResolved,
    /// 3: `rdma_resolve_route` failed; the status is a negative errno.
    RouteError,
    /// 4: a connection request on a listening id; the event hands over the new id.
    ConnectRequest,
    /// 5: the peer accepted and the id has no QP (the user completes with `rdma_establish`).
    ConnectResponse,
    /// 6: an error while establishing the connection; negative errno.
    ConnectError,
    /// 7: the peer could not be reached; negative errno.
    Unreachable,
    /// 8: the peer rejected the connection; the status is an IB reject reason.
    Rejected,
    /// 9: the connection is established.
    Established,
    /// 10: the connection is disconnected.
    Disconnected,
    /// 11: the RDMA device of the id was removed.
    DeviceRemoval,
    /// 12: a multicast join completed.
    MulticastJoin,
    /// 13: a multicast join failed, or an error on a joined group.
    MulticastError,
    /// 14: the network address of the id changed.
    AddrChange,
    /// 15: the id's QP left the timewait state.
    TimewaitExit,
    /// 16: `rdma_resolve_addrinfo` succeeded (rdma-core ≥ 52).
    AddrinfoResolved,
    /// 17: `rdma_resolve_addrinfo` failed.
    AddrinfoError,
    /// 18: a user event (`rdma_user_event`).
    User,
    /// 19: internal to librdmacm.
    Internal,
    /// A code this crate does not know.
    Unknown(u32),
}

const KNOWN: [EventKind; 20] = [
    EventKind::AddrResolved,
    EventKind::AddrError,
    EventKind::RouteResolved,
    EventKind::RouteError,
    EventKind::ConnectRequest,
    EventKind::ConnectResponse,
    EventKind::ConnectError,
    EventKind::Unreachable,
    EventKind::Rejected,
    EventKind::Established,
    EventKind::Disconnected,
    EventKind::DeviceRemoval,
    EventKind::MulticastJoin,
    EventKind::MulticastError,
    EventKind::AddrChange,
    EventKind::TimewaitExit,
    EventKind::AddrinfoResolved,
    EventKind::AddrinfoError,
    EventKind::User,
    EventKind::Internal,
];

const NAMES: [&str; 20] = [
    "ADDR_RESOLVED",
    "ADDR_ERROR",
    "ROUTE_RESOLVED",
    "ROUTE_ERROR",
    "CONNECT_REQUEST",
    "CONNECT_RESPONSE",
    "CONNECT_ERROR",
    "UNREACHABLE",
    "REJECTED",
    "ESTABLISHED",
    "DISCONNECTED",
    "DEVICE_REMOVAL",
    "MULTICAST_JOIN",
    "MULTICAST_ERROR",
    "ADDR_CHANGE",
    "TIMEWAIT_EXIT",
    "ADDRINFO_RESOLVED",
    "ADDRINFO_ERROR",
    "USER",
    "INTERNAL",
];

impl EventKind {
    /// The kind of C code `code`.
    #[must_use]
    #[inline]
    pub fn from_code(code: u32) -> Self {
        usize::try_from(code)
            .ok()
            .and_then(|i| KNOWN.get(i).copied())
            .unwrap_or(Self::Unknown(code))
    }

    /// The C code of this kind.
    #[must_use]
    pub fn code(self) -> u32 {
        match self {
            Self::Unknown(c) => c,
            known => {
                let i = KNOWN.iter().position(|k| *k == known).unwrap_or(0);
                u32::try_from(i).unwrap_or(u32::MAX)
            }
        }
    }

    /// The C name without its `RDMA_CM_EVENT_` prefix, e.g. `"ADDR_RESOLVED"`; `"UNKNOWN"` for
    /// an unknown code.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown(_) => "UNKNOWN",
            known => NAMES[known.code() as usize],
        }
    }

    /// Whether the status of this kind is a negative errno (the `*_ERROR` kinds and
    /// `UNREACHABLE`).
    #[must_use]
    pub fn is_error(self) -> bool {
        matches!(
            self,
            Self::AddrError
                | Self::RouteError
                | Self::ConnectError
                | Self::Unreachable
                | Self::MulticastError
                | Self::AddrinfoError
        )
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(c) => write!(f, "RDMA_CM_EVENT_UNKNOWN({c})"),
            k => write!(f, "RDMA_CM_EVENT_{}", k.name()),
        }
    }
}

/// An InfiniBand CM reject reason, the status of a [`EventKind::Rejected`] event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejectReason(pub i32);

impl RejectReason {
    /// 8, `IB_CM_REJ_INVALID_SERVICE_ID`: nobody listens on the port.
    pub const NO_LISTENER: Self = Self(8);
    /// 28, `IB_CM_REJ_CONSUMER_DEFINED`: the peer called `rdma_reject`.
    pub const CONSUMER: Self = Self(28);
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::NO_LISTENER => write!(f, "reject reason 8 (no listener)"),
            Self::CONSUMER => write!(f, "reject reason 28 (rejected by the peer)"),
            Self(r) => write!(f, "reject reason {r}"),
        }
    }
}

/// The status of an event, typed by its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// 0.
    Success,
    /// An error kind's negative errno, as the positive code (`ETIMEDOUT`, `ENODEV`, …).
    Errno(i32),
    /// A [`EventKind::Rejected`] event's reject reason.
    Rejected(RejectReason),
    /// Any other non-zero status, as it came: e.g. the positive SIDR status of an `UNREACHABLE`
    /// UDP connect (1, `IB_SIDR_UNSUPPORTED`: nobody listens on the port).
    Other(i32),
}

impl Status {
    /// Types `raw`, the status of an event of kind `kind`: 0 is [`Status::Success`]; a
    /// `REJECTED` event's status is its [`RejectReason`]; any other negative status is an errno
    /// (the kernel reports errors as `-errno`, whatever the kind); any other positive one is
    /// [`Status::Other`].
    #[must_use]
    pub fn new(kind: EventKind, raw: i32) -> Self {
        match (raw, kind) {
            (0, _) => Self::Success,
            (r, EventKind::Rejected) => Self::Rejected(RejectReason(r)),
            (r, _) if r < 0 => Self::Errno(r.saturating_abs()),
            (r, _) => Self::Other(r),
        }
    }

    /// Whether the status is 0.
    #[must_use]
    pub fn is_success(self) -> bool {
        self == Self::Success
    }

    /// The errno as an [`io::Error`], for [`Status::Errno`].
    #[must_use]
    pub fn io_error(self) -> Option<io::Error> {
        match self {
            Self::Errno(e) => Some(io::Error::from_raw_os_error(e)),
            _ => None,
        }
    }

    /// The reject reason, for [`Status::Rejected`].
    #[must_use]
    pub fn reject_reason(self) -> Option<RejectReason> {
        match self {
            Self::Rejected(r) => Some(r),
            _ => None,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Success => f.write_str("status 0"),
            Self::Errno(e) => write!(f, "status -{e}: {}", io::Error::from_raw_os_error(*e)),
            Self::Rejected(r) => r.fmt(f),
            Self::Other(r) => write!(f, "status {r}"),
        }
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    /// Kinds: every known code, the first unknown ones, and any `u32`.
    fn kind() -> impl Strategy<Value = EventKind> {
        prop_oneof![0u32..24, any::<u32>()].prop_map(EventKind::from_code)
    }

    proptest! {
        #[test]
        fn every_code_round_trips(code in any::<u32>()) {
            let k = EventKind::from_code(code);
            prop_assert_eq!(k.code(), code);
            prop_assert_eq!(matches!(k, EventKind::Unknown(_)), code >= 20);
            prop_assert_eq!(EventKind::from_code(k.code()), k);
            let shown = k.to_string();
            prop_assert!(shown.starts_with("RDMA_CM_EVENT_"));
            if code < 20 {
                prop_assert_eq!(shown, format!("RDMA_CM_EVENT_{}", k.name()));
            } else {
                prop_assert_eq!(shown, format!("RDMA_CM_EVENT_UNKNOWN({code})"));
            }
        }

        /// The status of every (kind, raw) pair, against the rule written out once more.
        #[test]
        fn every_status_is_typed_by_its_kind(
            kind in kind(),
            raw in prop_oneof![-200i32..200, Just(i32::MIN), Just(i32::MAX), any::<i32>()],
        ) {
            let s = Status::new(kind, raw);
            prop_assert_eq!(s.is_success(), raw == 0);
            match s {
                Status::Success => prop_assert_eq!(raw, 0),
                Status::Rejected(r) => {
                    prop_assert_eq!(kind, EventKind::Rejected);
                    prop_assert_eq!(r.0, raw);
                    prop_assert_eq!(s.reject_reason(), Some(r));
                }
                Status::Errno(e) => {
                    prop_assert!(kind != EventKind::Rejected && raw < 0);
                    prop_assert!(e > 0);
                    prop_assert_eq!(e, raw.saturating_abs());
                    prop_assert_eq!(s.io_error().unwrap().raw_os_error(), Some(e));
                }
                Status::Other(r) => {
                    prop_assert!(kind != EventKind::Rejected && raw > 0);
                    prop_assert_eq!(r, raw);
                    prop_assert!(s.io_error().is_none());
                }
            }
            prop_assert!(!s.to_string().is_empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_codes_round_trip() {
        for code in 0..20 {
            let k = EventKind::from_code(code);
            assert!(!matches!(k, EventKind::Unknown(_)), "{code}");
            assert_eq!(k.code(), code);
        }
        assert_eq!(EventKind::from_code(4), EventKind::ConnectRequest);
        assert_eq!(EventKind::from_code(15), EventKind::TimewaitExit);
        assert_eq!(EventKind::from_code(19), EventKind::Internal);
    }

    #[test]
    fn unknown_codes_are_values() {
        for code in [20, 99, u32::MAX] {
            let k = EventKind::from_code(code);
            assert_eq!(k, EventKind::Unknown(code));
            assert_eq!(k.code(), code);
            assert_eq!(k.name(), "UNKNOWN");
        }
        assert_eq!(
            EventKind::Unknown(42).to_string(),
            "RDMA_CM_EVENT_UNKNOWN(42)"
        );
    }

    #[test]
    fn names_match_the_c_names_of_the_installed_library() {
        for code in 0..16 {
            let k = EventKind::from_code(code);
            assert_eq!(k.to_string(), crate::ffi::cm::event_str(code), "{code}");
        }
    }

    #[test]
    fn statuses_are_typed_by_kind() {
        assert_eq!(Status::new(EventKind::AddrResolved, 0), Status::Success);
        assert_eq!(
            Status::new(EventKind::AddrError, -libc::ETIMEDOUT),
            Status::Errno(libc::ETIMEDOUT)
        );
        assert_eq!(
            Status::new(EventKind::Rejected, 8),
            Status::Rejected(RejectReason::NO_LISTENER)
        );
        assert_eq!(
            Status::new(EventKind::Rejected, 28).reject_reason(),
            Some(RejectReason::CONSUMER)
        );
        assert_eq!(Status::new(EventKind::Established, 3), Status::Other(3));
        assert_eq!(
            Status::new(EventKind::Established, -5),
            Status::Errno(5),
            "a negative status is an errno whatever the kind"
        );
        assert_eq!(
            Status::new(EventKind::Unreachable, i32::MIN),
            Status::Errno(i32::MAX)
        );
        assert_eq!(
            Status::Errno(libc::ENODEV)
                .io_error()
                .unwrap()
                .raw_os_error(),
            Some(libc::ENODEV)
        );
    }
}
