//! The rdma_cm side: the commands that make, answer and close ids (connect, listen, accept,
//! reject) and the event channel's events (requests and their migration to a shard,
//! disconnection).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use evchan_core::cm::state::Requested;
use evchan_core::cm::{EventKind, PortSpace};
use evchan_core::{CmEvent, CmId};

use super::setup::handshake;
use super::{Listening, Migrated, Shard, ACK_GRACE};
use crate::cm_map::{conn_param, resolve_failed};
use crate::config::Config;
use crate::error::{Error, Lost, Result, Step};
use crate::proto::{self, Peer};
use crate::runtime::conn::{Conn, IdState, Phase};
use crate::runtime::half_open::{HalfOpen, HalfOpenLimit};
use crate::runtime::ConnId;
use crate::wire::{Heard, Wire};

impl<'s> Shard<'s> {
    pub(super) fn connect(
        &mut self,
        conn: ConnId,
        addr: SocketAddr,
        config: Config,
        private_data: Vec<u8>,
        reply: oneshot::Sender<Result<crate::Connection>>,
    ) {
        let id = match CmId::new(self.channel, PortSpace::Tcp) {
            Ok(id) => id,
            Err(e) => return drop(reply.send(Err(e.into()))),
        };
        let id = match id.resolve_addr(None, addr, config.addr_timeout) {
            Ok(id) => id,
            Err(e) => return drop(reply.send(Err(resolve_failed(Step::Address, e.error)))),
        };
        let key = id.key();
        let mut c = Conn::new(
            conn,
            IdState::ResolvingAddr(id),
            Phase::Setup(Step::Address),
            config,
        );
        c.deadline = Some(Instant::now() + c.config.addr_timeout + Duration::from_secs(1));
        tracing::debug!(parent: &c.span, %addr, "connecting");
        c.private_data = private_data;
        c.reply = Some(reply);
        c.peer_addr = Some(addr);
        c.active = true;
        c.key = Some(key);
        self.by_key.insert(key, conn);
        self.conns.insert(conn, Box::new(c));
    }

    pub(super) fn listen(
        &mut self,
        conn: ConnId,
        addr: SocketAddr,
        config: Config,
    ) -> Result<(SocketAddr, mpsc::Receiver<crate::Incoming>)> {
        let id = CmId::new(self.channel, PortSpace::Tcp)?;
        let id = id.bind(addr).map_err(|e| e.error)?;
        let backlog = i32::try_from(config.backlog).unwrap_or(i32::MAX);
        let id = id.listen(backlog).map_err(|e| e.error)?;
        let local = id.local_addr().unwrap_or(addr);
        let (tx, rx) = mpsc::channel(config.backlog as usize);
        self.listener_keys.insert(id.key(), conn);
        self.listeners.insert(
            conn,
            Listening {
                id,
                half_open: HalfOpenLimit::new(config.backlog),
                live: HalfOpenLimit::new(config.max_connections),
                memory: HalfOpenLimit::new(config.memory_budget),
                full: [false; 2],
                config,
                accept_queue: tx,
            },
        );
        tracing::debug!(?conn, %local, "listening");
        Ok((local, rx))
    }

    pub(super) fn accept(
        &mut self,
        conn: ConnId,
        private_data: Vec<u8>,
        reply: oneshot::Sender<Result<crate::Connection>>,
    ) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return drop(reply.send(Err(Error::ConnectionLost(Lost::Disconnected))));
        };
        let IdState::Requested(_) = &c.id else {
            return drop(reply.send(Err(Error::ConnectionLost(Lost::Closed))));
        };
        c.private_data = private_data;
        c.reply = Some(reply);
        c.phase = Phase::Setup(Step::Connect);
        c.deadline = Some(Instant::now() + c.config.connect_timeout);
        if let Err(e) = self.setup_path(conn) {
            if e.is_out_of_descriptors() {
                // Refused, and said so, rather than an opaque failure: the peer reads why.
                tracing::warn!(
                    "out of file descriptors for a connection: the request is rejected \
                     (evchan-busy:descriptors); raise the open-files limit \
                     (evchan_sys::raise_open_files_limit) or lower Config::max_connections: {e}"
                );
                if let Some(reply) = self.conns.get_mut(&conn).and_then(|c| c.reply.take()) {
                    let _ = reply.send(Err(e));
                }
                return self.reject(conn, &crate::Busy::Descriptors.private_data());
            }
            return self.fail_setup(conn, e);
        }
        let c = self.conns.get_mut(&conn).expect("present");
        let IdState::Requested(id) = std::mem::replace(&mut c.id, IdState::Gone) else {
            unreachable!("checked above")
        };
        let wire = handshake(c);
        // Our initiator depth within the responder resources the request granted (the IB CM's
        // rule for the reply); 0 where it granted none.
        // Within what the request granted (the requester's responder resources) and what it
        // asked (its initiator depth: no more responder resources than it issues, which a
        // plain peer's device may not take beyond).
        let param = conn_param(&wire, c.config.retry_count, c.read_depth)
            .initiator_depth(c.reads.min(c.read_depth))
            .responder_resources(c.asked.min(c.read_depth));
        match id.accept(&param) {
            Ok(id) => c.id = IdState::Connecting(id),
            Err(e) => {
                c.id = IdState::Requested(e.id);
                self.fail_setup(conn, e.error.into());
            }
        }
    }

    pub(super) fn reject(&mut self, conn: ConnId, private_data: &[u8]) {
        let Some(mut c) = self.remove(conn) else {
            return;
        };
        if let IdState::Requested(id) = std::mem::replace(&mut c.id, IdState::Gone) {
            if let Err(e) = id.reject(private_data) {
                tracing::debug!(?conn, "reject failed: {}", e.error);
            }
        }
        self.release(c, Lost::Closed);
    }

    // ---------------------------------------------------------------------------------------
    // rdma_cm events
    // ---------------------------------------------------------------------------------------

    pub(super) fn drain_cm(&mut self) {
        loop {
            match self.channel.try_get_event() {
                Ok(Some(event)) => self.on_cm_event(event),
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("rdma_get_cm_event: {e}");
                    break;
                }
            }
        }
    }

    fn on_cm_event(&mut self, mut event: CmEvent<'s>) {
        let kind = event.kind();
        if kind == EventKind::DeviceRemoval {
            let id = event.id();
            drop(event);
            return self.on_device_removal(id);
        }
        if kind == EventKind::ConnectRequest {
            let Some(listener) = event.listener().and_then(|k| self.listener_keys.get(&k)) else {
                return;
            };
            let listener = *listener;
            let private_data = event.private_data().to_vec();
            // The request's responder resources, as this side's initiator depth.
            // (The kernel gives a request's parameters from this side's view: its
            // `initiator_depth` is what the requester takes, its `responder_resources` what the
            // requester issues.)
            let reads = event
                .conn_info()
                .map_or((0, 0), |c| (c.initiator_depth, c.responder_resources));
            let request = event.take_request();
            event.ack();
            if let Some(id) = request {
                self.on_request(listener, id, &private_data, reads);
            }
            return;
        }
        if let Some(&l) = self.listener_keys.get(&event.id()) {
            if kind == EventKind::DeviceRemoval {
                tracing::debug!(listener = ?l, "device removed under the listener");
                if let Some(l) = self.listeners.remove(&l) {
                    self.listener_keys.remove(&l.id.key());
                }
            }
            return;
        }
        let Some(&conn) = self.by_key.get(&event.id()) else {
            return;
        };
        let phase = self.conns.get(&conn).map(|c| c.phase);
        if let Some(c) = self.conns.get(&conn) {
            tracing::debug!(parent: &c.span, %kind, status = %event.status(), ?phase, "cm event");
        }
        match phase {
            Some(Phase::Setup(_) | Phase::Requested) => self.on_setup_event(conn, &event),
            Some(Phase::Open | Phase::Closing) => match kind {
                EventKind::Disconnected | EventKind::DeviceRemoval => {
                    drop(event);
                    self.on_disconnected(conn, kind == EventKind::DeviceRemoval);
                }
                _ => {}
            },
            None => {}
        }
    }

    fn on_request(
        &mut self,
        listener: ConnId,
        id: CmId<'s, Requested>,
        private_data: &[u8],
        (reads, asked): (u8, u8),
    ) {
        let Some(l) = self.listeners.get_mut(&listener) else {
            return;
        };
        let peer = match proto::decode(private_data) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!("request with a bad handshake rejected: {e}");
                let _ = id.reject(b"evchan: bad handshake");
                return;
            }
        };
        let Some(live) = l.live.take() else {
            if !std::mem::replace(&mut l.full[0], true) {
                tracing::warn!(
                    max_connections = l.config.max_connections,
                    "the listener holds its maximum of connections: requests are rejected \
                     (evchan-busy:connections) until one is released"
                );
            }
            let _ = id.reject(&crate::Busy::Connections.private_data());
            return;
        };
        let Some(memory) = l.memory.take_weighted(l.config.admission_bytes()) else {
            if !std::mem::replace(&mut l.full[1], true) {
                tracing::warn!(
                    memory_budget = l.config.memory_budget,
                    admission_bytes = l.config.admission_bytes(),
                    "the listener's connections hold its memory budget: requests are rejected \
                     (evchan-busy:memory) until one is released"
                );
            }
            let _ = id.reject(&crate::Busy::Memory.private_data());
            return;
        };
        let Some(ticket) = l.half_open.take().filter(|_| l.accept_queue.capacity() > 0) else {
            tracing::debug!("backlog of half-open connections full: request rejected");
            let _ = id.reject(&crate::Busy::Backlog.private_data());
            return;
        };
        l.full = [false; 2];
        let (config, accept_queue) = (l.config.clone(), l.accept_queue.clone());
        let Some(rt) = self.runtime() else {
            let _ = id.reject(&[]);
            return;
        };
        let conn = rt.conn_id();
        let target = usize::try_from(conn.0).unwrap_or(0) % self.env.peers.len();
        let m = Migrated {
            id,
            conn,
            config,
            peer,
            accept_queue,
            ticket,
            live: [live, memory],
            reads,
            asked,
        };
        if target == self.env.index {
            return self.on_migrated(m);
        }
        // The id moves to the target's channel; the rest of the request goes with it.
        match m.id.migrate(&self.env.channels[target]) {
            Ok(id) => {
                if let Err(back) = self.env.peers[target].send(Migrated { id, ..m }) {
                    let _ = back.0.id.reject(&[]);
                }
            }
            Err(e) => self.on_migrated(Migrated { id: e.id, ..m }),
        }
    }

    pub(super) fn on_migrated(&mut self, m: Migrated<'s>) {
        let Some(rt) = self.runtime() else {
            let _ = m.id.reject(&[]);
            return;
        };
        let key = m.id.key();
        let peer_addr = m.id.peer_addr();
        let local_addr = m.id.local_addr();
        let private_data = match &m.peer {
            Peer::Evchan(_, user) | Peer::Plain(user) => user.clone(),
        };
        let incoming = crate::Incoming::new(
            rt.shard(self.env.index),
            m.conn,
            peer_addr,
            local_addr,
            private_data,
        );
        if let Err(e) = m.accept_queue.try_send(incoming) {
            // Backlog full or the listener is gone. (The Incoming's drop sends a reject that
            // finds nothing: the id is rejected here.)
            let busy = matches!(e, mpsc::error::TrySendError::Full(_))
                .then(|| crate::Busy::Backlog.private_data());
            let _ = m.id.reject(busy.as_deref().unwrap_or_default());
            return;
        }
        let mut c = Conn::new(m.conn, IdState::Requested(m.id), Phase::Requested, m.config);
        tracing::debug!(parent: &c.span, peer = ?peer_addr, "request");
        half_open(&mut c, m.ticket);
        c.live = Some(m.live);
        c.reads = m.reads;
        c.asked = m.asked;
        c.peer = Some(m.peer);
        c.peer_addr = peer_addr;
        c.local_addr = local_addr;
        c.key = Some(key);
        self.by_key.insert(key, m.conn);
        self.conns.insert(m.conn, Box::new(c));
    }

    fn on_disconnected(&mut self, conn: ConnId, removed: bool) {
        let cause = self.env.removal_cause(removed);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let Some(wire) = c.wire.clone() else {
            return;
        };
        // Completions that came before the disconnect are delivered first (the wire reaps
        // them before it records the end).
        wire.peer_disconnected(cause.clone(), c.closing);
        // The peer's disconnect can overtake the acknowledgement of a send it received (rxe
        // completes our send when that acknowledgement is processed): our own disconnect,
        // which flushes what is in flight, waits for those sends, at most `ACK_GRACE`.
        if cause.is_none() && !c.disconnect_deferred && wire.sending() {
            c.disconnect_deferred = true;
            c.phase = Phase::Closing;
            return self.wait_for(conn, wire, ACK_GRACE, Heard::Quiet, Wire::poll_quiet);
        }
        if !c.disconnect_deferred {
            self.finish(conn, Lost::Closed);
        }
    }
}

/// Gives a request its half-open ticket and its deadline: unanswered, or accepted and not
/// established, for `connect_timeout`, it goes (see [`crate::runtime::half_open`]).
fn half_open(c: &mut Conn<'_>, ticket: HalfOpen) {
    c.half_open = Some(ticket);
    c.deadline = Some(Instant::now() + c.config.connect_timeout);
}
