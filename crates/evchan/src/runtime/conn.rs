//! A connection's state inside its shard: the id, where it is in its life, what its setup
//! needs, and its data path once made.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use evchan_core::cm::state::{
    Connected, Connecting, Disconnected, Requested, ResolvingAddr, ResolvingRoute,
};
use evchan_core::CmId;

use crate::config::Config;
use crate::error::{Result, Step};
use crate::proto::Peer;
use crate::wire::Wire;

/// The id, in the state its type says.
pub(super) enum IdState<'s> {
    ResolvingAddr(CmId<'s, ResolvingAddr>),
    ResolvingRoute(CmId<'s, ResolvingRoute>),
    Requested(CmId<'s, Requested>),
    Connecting(CmId<'s, Connecting>),
    Connected(CmId<'s, Connected>),
    /// Held until the connection goes (its drop destroys the id).
    Disconnected(#[allow(dead_code)] CmId<'s, Disconnected>),
    Gone,
}

impl IdState<'_> {
    /// `rdma_disconnect` of a connecting or connected id (which is then `Disconnected`, or
    /// stays as it was if the call fails); an id in any other state is left as it is.
    pub(super) fn disconnect(&mut self) {
        *self = match std::mem::replace(self, IdState::Gone) {
            IdState::Connected(id) => match id.disconnect() {
                Ok(id) => IdState::Disconnected(id),
                Err(e) => IdState::Connected(e.id),
            },
            IdState::Connecting(id) => match id.disconnect() {
                Ok(id) => IdState::Disconnected(id),
                Err(e) => IdState::Connecting(e.id),
            },
            other => other,
        };
    }
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Resolving, connecting or accepting; the user waits on `reply`.
    Setup(Step),
    /// A request waiting for the application's accept or reject.
    Requested,
    /// Established.
    Open,
    /// Waiting before the disconnect: for the `FIN`'s completion (a close) or for the sends
    /// in flight when the peer disconnected (`disconnect_deferred`).
    Closing,
}

pub(super) struct Conn<'s> {
    /// The connection's lifecycle span (`evchan.conn`): its events are recorded in it.
    pub(super) span: tracing::Span,
    pub(super) id: IdState<'s>,
    /// The id's key in its shard's `by_key`, once there (kept when a failed step drops the
    /// id, so that its entry goes with the connection).
    pub(super) key: Option<evchan_core::cm::IdKey>,
    pub(super) phase: Phase,
    pub(super) deadline: Option<Instant>,
    pub(super) config: Config,
    pub(super) peer_addr: Option<SocketAddr>,
    pub(super) local_addr: Option<SocketAddr>,
    /// The user's private data for connect or accept.
    pub(super) private_data: Vec<u8>,
    /// The peer, once its private data is known.
    pub(super) peer: Option<Peer>,
    pub(super) reply: Option<oneshot::Sender<Result<crate::Connection>>>,
    /// The data path, made with the QP (before `connect` / `accept`).
    pub(super) wire: Option<Arc<Wire>>,
    /// The index of its device in the runtime's, once it has a QP.
    pub(super) device: Option<usize>,
    /// This side asked to close (`close`, or both halves gone).
    pub(super) closing: bool,
    pub(super) close_waiters: Vec<oneshot::Sender<()>>,
    /// The peer disconnected while sends of ours were in flight: our `rdma_disconnect` (which
    /// flushes them) waits until they complete or `ACK_GRACE` passes, so that a send whose
    /// acknowledgement is still on its way is not reported undelivered.
    pub(super) disconnect_deferred: bool,
    /// No later than the last completion of this connection (or keepalive sent), as of the
    /// last keepalive check: see `shard/keepalive.rs`.
    pub(super) last_activity: Instant,
    /// A listener's half-open ticket, until `ESTABLISHED` (or the connection goes).
    pub(super) half_open: Option<super::half_open::HalfOpen>,
    /// A listener's connection's admission tickets (`Config::max_connections`,
    /// `Config::memory_budget`), held from its request and given back when the connection is
    /// released.
    pub(super) live: Option<[super::half_open::HalfOpen; 2]>,
    /// The RDMA READs and atomics the peer takes as target at once, as its request or reply
    /// said (0: none; our side asks for `read_depth`).
    pub(super) reads: u8,
    /// A listener's connection: the READs and atomics the peer's request said it issues at
    /// once (its initiator depth), which bounds the responder resources the accept grants.
    pub(super) asked: u8,
    /// The READs and atomics this side takes and issues at once: [`crate::cm_map::READ_DEPTH`]
    /// within the device's limits (set with the QP).
    pub(super) read_depth: u8,
    /// This side connects (`Connection::connect`); a listener's connection otherwise.
    pub(super) active: bool,
}

impl Conn<'_> {
    pub(super) fn new(
        conn: super::ConnId,
        id: IdState<'_>,
        phase: Phase,
        config: Config,
    ) -> Conn<'_> {
        Conn {
            span: tracing::debug_span!(parent: None, "evchan.conn", conn = conn.0),
            id,
            key: None,
            phase,
            deadline: None,
            config,
            peer_addr: None,
            local_addr: None,
            private_data: Vec::new(),
            peer: None,
            reply: None,
            wire: None,
            device: None,
            closing: false,
            close_waiters: Vec::new(),
            disconnect_deferred: false,
            last_activity: Instant::now(),
            half_open: None,
            live: None,
            reads: 0,
            asked: 0,
            read_depth: 1,
            active: false,
        }
    }

    /// Whether the peer speaks evchan's protocol (credits, keepalives).
    pub(super) fn evchan_peer(&self) -> bool {
        matches!(self.peer, Some(Peer::Evchan(..)))
    }
}
