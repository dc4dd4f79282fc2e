//! The event guard.

use std::fmt;

use super::state::{self, State};
use super::{EventKind, Id, IdKey, Status};
use crate::ffi::cm::RawEvent;

/// One rdma_cm event read from an [`EventChannel`](crate::EventChannel), held until it is acked.
///
/// `rdma_get_cm_event` returns it; `rdma_ack_cm_event` releases it, either explicitly with
/// [`Event::ack`] or when the guard is dropped. Every event is acked exactly once: `ack` takes
/// the event by value, so a second ack does not compile. The private data and parameters are
/// borrowed from the event and so readable only until the ack.
///
/// The event borrows its channel (`'ch`): the channel cannot be dropped while the event lives.
///
/// While an event counted against an id (its own events; for a listener, its
/// `CONNECT_REQUEST`s) is unacked, dropping that id defers `rdma_destroy_id` to the ack, and
/// migrating it fails with [`Error::Busy`](crate::Error::Busy): neither can hang.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use evchan_core::{cm, CmId, EventChannel};
///
/// let channel = EventChannel::new()?;
/// let id = CmId::new(&channel, cm::PortSpace::Tcp)?;
/// let id = id.resolve_addr(None, ([169, 254, 77, 1], 7471).into(), Duration::from_secs(2))?;
/// let event = channel.get_event()?;
/// assert_eq!(event.kind(), cm::EventKind::AddrResolved);
/// assert!(event.status().is_success());
/// let id = id.addr_resolved(&event)?;
/// event.ack();
/// # drop(id);
/// # Ok::<(), evchan_core::Error>(())
/// ```
///
/// # References
/// `rdma_get_cm_event(3)`, `rdma_ack_cm_event(3)`.
#[doc(alias = "rdma_cm_event")]
#[doc(alias = "rdma_ack_cm_event")]
pub struct Event<'ch> {
    raw: RawEvent<'ch>,
}

impl fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("kind", &self.kind())
            .field("status", &self.status())
            .field("id", &self.id())
            .field("private_data_len", &self.private_data().len())
            .finish()
    }
}

/// The connection parameters of an event (`rdma_cm_event::param.conn`, without the private
/// data: see [`Event::private_data`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnInfo {
    /// RDMA reads/atomics the peer accepts as target.
    pub responder_resources: u8,
    /// RDMA reads/atomics the peer will issue.
    pub initiator_depth: u8,
    /// Whether the peer's hardware flow control is on.
    pub flow_control: u8,
    /// Retries on errors.
    pub retry_count: u8,
    /// Retries on receiver-not-ready.
    pub rnr_retry_count: u8,
    /// Whether the peer's QP uses an SRQ.
    pub srq: bool,
    /// The peer's QP number.
    pub qp_num: u32,
}

/// The UD parameters of an event (`rdma_cm_event::param.ud`, without the private data: see
/// [`Event::private_data`]): what a UD QP needs to send to the peer.
#[doc(alias = "rdma_ud_param")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UdInfo {
    /// The remote QP number.
    pub qp_num: u32,
    /// The remote QKey.
    pub qkey: u32,
    /// The address vector to reach the peer (for `ibv_create_ah`).
    pub ah_attr: AhAttr,
}

/// An address vector (`struct ibv_ah_attr`), as a UD event reports it.
#[doc(alias = "ibv_ah_attr")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AhAttr {
    /// The destination LID (0 on RoCE).
    pub dlid: u16,
    /// The service level.
    pub sl: u8,
    /// The source path bits.
    pub src_path_bits: u8,
    /// The static rate (`enum ibv_rate`).
    pub static_rate: u8,
    /// The local port number.
    pub port_num: u8,
    /// The global route header, when `is_global` is set (always on RoCE).
    pub global: Option<GlobalRoute>,
}

/// A global route (`struct ibv_global_route`): the GRH of an [`AhAttr`].
#[doc(alias = "ibv_global_route")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GlobalRoute {
    /// The destination GID (on RoCE v2, the peer's IP address as IPv6; IPv4 mapped).
    pub dgid: [u8; 16],
    /// The flow label.
    pub flow_label: u32,
    /// The index of the source GID in the port's GID table.
    pub sgid_index: u8,
    /// The hop limit.
    pub hop_limit: u8,
    /// The traffic class.
    pub traffic_class: u8,
}

impl GlobalRoute {
    /// The destination GID as an IPv6 address (`::ffff:a.b.c.d` for an IPv4 peer on RoCE v2).
    #[must_use]
    pub fn dgid_ip(&self) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::from(self.dgid)
    }
}

impl<'ch> Event<'ch> {
    #[inline]
    pub(crate) fn new(raw: RawEvent<'ch>) -> Self {
        Self { raw }
    }

    /// `rdma_cm_event::event`: the kind.
    #[doc(alias = "event")]
    #[must_use]
    #[inline]
    pub fn kind(&self) -> EventKind {
        EventKind::from_code(self.raw.code())
    }

    /// `rdma_cm_event::status`, typed by the kind: a negative errno for the error kinds, an IB
    /// reject reason for `REJECTED`.
    #[must_use]
    pub fn status(&self) -> Status {
        Status::new(self.kind(), self.raw.status())
    }

    /// `rdma_cm_event::status` as it came.
    #[must_use]
    #[inline]
    pub fn raw_status(&self) -> i32 {
        self.raw.status()
    }

    /// `rdma_cm_event::id`: the key of the id the event is for (for a `CONNECT_REQUEST`, the new
    /// id; see [`Event::listener`]).
    #[must_use]
    pub fn id(&self) -> IdKey {
        IdKey(self.raw.id_key())
    }

    /// `rdma_cm_event::listen_id`: for a `CONNECT_REQUEST`, the key of the listening id.
    #[must_use]
    pub fn listener(&self) -> Option<IdKey> {
        self.raw.listen_id_key().map(IdKey)
    }

    /// Whether the event belongs to `id`: it is the event's id or, for a `CONNECT_REQUEST`, its
    /// listener.
    #[must_use]
    pub fn is_for<S: State>(&self, id: &Id<'_, S>) -> bool {
        let key = id.key();
        self.id() == key || self.listener() == Some(key)
    }

    /// The private data the peer sent, borrowed from the event: `param.conn.private_data` (or
    /// `param.ud` for UDP ids), empty when there is none.
    ///
    /// Valid until the ack, which the borrow enforces. On RoCE/IB the length is what the
    /// message carries, which may be more than the peer wrote (padded with zeros).
    ///
    /// ```compile_fail
    /// # fn f(event: evchan_core::CmEvent<'_>) {
    /// let data = event.private_data();
    /// event.ack();
    /// println!("{data:?}"); // error: the data is gone with the ack
    /// # }
    /// ```
    #[must_use]
    pub fn private_data(&self) -> &[u8] {
        self.raw.private_data()
    }

    /// `param.conn` of a connected (TCP or IB port space) id's event.
    #[must_use]
    pub fn conn_info(&self) -> Option<ConnInfo> {
        self.raw.conn().map(|c| ConnInfo {
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            flow_control: c.flow_control,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
            srq: c.srq,
            qp_num: c.qp_num,
        })
    }

    /// `param.ud` of a UDP id's (or a multicast) event.
    #[must_use]
    pub fn ud_info(&self) -> Option<UdInfo> {
        self.raw.ud()
    }

    /// Takes the new id a `CONNECT_REQUEST` hands over, ready to [`accept`](Id::accept) or
    /// [`reject`](Id::reject); `None` for other kinds or when already taken.
    ///
    /// The id does not depend on this event: it may outlive the ack and be migrated at once. An
    /// id not taken is destroyed with the event (the peer sees a reject).
    #[must_use]
    pub fn take_request(&mut self) -> Option<Id<'ch, state::Requested>> {
        self.raw.take_new_id().map(Id::from_raw)
    }

    /// Whether a `CONNECT_REQUEST`'s new id is still in the event.
    #[must_use]
    pub fn has_request(&self) -> bool {
        self.raw.has_new_id()
    }

    /// `rdma_ack_cm_event`: releases the event. Dropping it does the same.
    ///
    /// ```compile_fail
    /// # fn f(event: evchan_core::CmEvent<'_>) {
    /// event.ack();
    /// event.ack(); // error: use of moved value
    /// # }
    /// ```
    #[doc(alias = "rdma_ack_cm_event")]
    #[inline]
    pub fn ack(self) {
        drop(self);
    }
}
