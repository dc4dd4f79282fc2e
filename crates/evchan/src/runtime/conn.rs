//! A connection's state inside its shard.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use evchan_core::cm::state::{
    Connected, Connecting, Disconnected, Requested, ResolvingAddr, ResolvingRoute,
};
use evchan_core::verbs::{Mr, Slot, SlotPool, WorkCompletion};
use evchan_core::CmId;

use super::{Delivery, Shared};
use crate::config::Config;
use crate::error::{Result, Step};
use crate::proto::{Credits, Handshake, Peer};

/// The id, in the state its type says.
pub(super) enum IdState<'s> {
    ResolvingAddr(CmId<'s, ResolvingAddr>),
    ResolvingRoute(CmId<'s, ResolvingRoute>),
    Requested(CmId<'s, Requested>),
    Connecting(CmId<'s, Connecting>),
    Connected(CmId<'s, Connected>),
    Disconnected(CmId<'s, Disconnected>),
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

/// `$body` with `$id` bound to the id in whatever state it is; `None` when gone.
macro_rules! with_id {
    ($state:expr, $id:ident => $body:expr) => {
        match $state {
            IdState::ResolvingAddr($id) => Some($body),
            IdState::ResolvingRoute($id) => Some($body),
            IdState::Requested($id) => Some($body),
            IdState::Connecting($id) => Some($body),
            IdState::Connected($id) => Some($body),
            IdState::Disconnected($id) => Some($body),
            IdState::Gone => None,
        }
    };
}
pub(super) use with_id;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Resolving, connecting or accepting; the user waits on `reply`.
    Setup(Step),
    /// A request waiting for the application's accept or reject.
    Requested,
    /// Established.
    Open,
    /// Disconnected; waiting for the QP's flushes before the id goes.
    Draining,
}

/// The data path of a connection with a QP.
pub(super) struct Path<'s> {
    pub(super) dev: usize,
    pub(super) recv_mr: Mr<'s, SlotPool>,
    pub(super) send_mr: Mr<'s, SlotPool>,
    pub(super) free_data: Vec<Slot>,
    pub(super) free_ctrl: Vec<Slot>,
    pub(super) mine: Handshake,
}

pub(super) struct Conn<'s> {
    /// The connection's lifecycle span (`evchan.conn`): its events are recorded in it.
    pub(super) span: tracing::Span,
    pub(super) id: IdState<'s>,
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
    pub(super) path: Option<Path<'s>>,
    /// `None` for a plain librdmacm peer (no flow control of ours).
    pub(super) credits: Option<Credits>,
    pub(super) outbox: VecDeque<Bytes>,
    /// Posted work requests not completed yet.
    pub(super) outstanding: u32,
    /// Data sends posted and not completed (plain peers: what close waits for).
    pub(super) sends_in_flight: u32,
    pub(super) inbox: Option<mpsc::UnboundedSender<Delivery>>,
    pub(super) shared: Option<Arc<Shared>>,
    /// FIN wanted (send half gone, shut down, or closing).
    pub(super) want_fin: bool,
    /// The wr_id of our posted FIN, until it completes.
    pub(super) fin_wr: Option<u64>,
    /// Disconnect once the FIN (or, with a plain peer, every send) has completed.
    pub(super) closing: bool,
    pub(super) close_waiters: Vec<oneshot::Sender<()>>,
    pub(super) disconnected: bool,
    /// The peer disconnected while sends of ours were in flight: our `rdma_disconnect` (which
    /// flushes them) waits until they complete or `ACK_GRACE` passes, so that a send whose
    /// acknowledgement is still on its way is not reported undelivered.
    pub(super) disconnect_deferred: bool,
    /// The end (FIN or loss) has been delivered to the receive half.
    pub(super) ended: bool,
    /// Receives that completed before `ESTABLISHED` was read (the peer may send as soon as its
    /// own side is established): delivered once this side is.
    pub(super) early: Vec<(Slot, WorkCompletion)>,
    /// CQ entries this connection reserved on its device's CQ.
    pub(super) cq_reserved: u32,
    /// No later than the last completion of this connection (or keepalive sent), as of the
    /// last keepalive check: see `shard/keepalive.rs`.
    pub(super) last_activity: Instant,
    /// A completion came since the last keepalive check.
    pub(super) active: bool,
    /// A listener's half-open ticket, until `ESTABLISHED` (or the connection goes).
    pub(super) half_open: Option<super::half_open::HalfOpen>,
}

impl Conn<'_> {
    /// Whether data sends or the `FIN` are still in flight.
    pub(super) fn sending(&self) -> bool {
        self.sends_in_flight > 0 || self.fin_wr.is_some()
    }

    /// The `rdma_disconnect` a peer's disconnect deferred, now (if it was), and the drain's
    /// deadline from here.
    pub(super) fn end_deferral(&mut self) {
        if std::mem::take(&mut self.disconnect_deferred) {
            self.id.disconnect();
            self.deadline = Some(Instant::now() + super::shard::DRAIN_TIMEOUT);
        }
    }

    /// A send or the `FIN` completed: once none is in flight, the deferred disconnect.
    pub(super) fn after_send(&mut self) {
        if self.disconnect_deferred && !self.sending() {
            self.end_deferral();
        }
    }

    pub(super) fn new(
        conn: super::ConnId,
        id: IdState<'_>,
        phase: Phase,
        config: Config,
    ) -> Conn<'_> {
        Conn {
            span: tracing::debug_span!(parent: None, "evchan.conn", conn = conn.0),
            id,
            phase,
            deadline: None,
            config,
            peer_addr: None,
            local_addr: None,
            private_data: Vec::new(),
            peer: None,
            reply: None,
            path: None,
            credits: None,
            outbox: VecDeque::new(),
            outstanding: 0,
            sends_in_flight: 0,
            inbox: None,
            shared: None,
            want_fin: false,
            fin_wr: None,
            closing: false,
            close_waiters: Vec::new(),
            disconnected: false,
            disconnect_deferred: false,
            ended: false,
            early: Vec::new(),
            cq_reserved: 0,
            last_activity: Instant::now(),
            active: false,
            half_open: None,
        }
    }
}
