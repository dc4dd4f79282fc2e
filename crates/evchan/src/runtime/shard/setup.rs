//! A connection's setup: the address, route and connect steps until `ESTABLISHED`, its
//! path (QP, slot pools, posted receives), the handshake in the private data, and the
//! setup's failure.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use evchan_core::cm::state::Requested;
use evchan_core::cm::EventKind;
use evchan_core::verbs::{Cq, Pd, PostedSlot, QpInit, Slot};
use evchan_core::{CmEvent, CmId};

use super::{record, Shard, WrKind};
use crate::cm_map;
use crate::error::{Error, Lost, Result, Step};
use crate::proto::{self, Credits, Peer};
use crate::runtime::conn::{Conn, IdState, Path, Phase};
use crate::runtime::{ConnId, Established, Shared};

impl<'s, 'c> Shard<'s, 'c> {
    pub(super) fn on_setup_event(&mut self, conn: ConnId, event: &CmEvent<'s>) {
        let c = self.conns.get_mut(&conn).expect("present");
        let kind = event.kind();
        let status = event.status();
        let state = std::mem::replace(&mut c.id, IdState::Gone);
        let result: Result<()> = match (state, kind) {
            (IdState::ResolvingAddr(id), EventKind::AddrResolved) => {
                match id.addr_resolved(event) {
                    Ok(id) => match id.resolve_route(c.config.route_timeout) {
                        Ok(id) => {
                            c.id = IdState::ResolvingRoute(id);
                            c.phase = Phase::Setup(Step::Route);
                            c.deadline = Some(
                                Instant::now() + c.config.route_timeout + Duration::from_secs(1),
                            );
                            Ok(())
                        }
                        Err(e) => Err(cm_map::resolve_failed(Step::Route, e.error)),
                    },
                    Err(e) => Err(e.error.into()),
                }
            }
            (IdState::ResolvingRoute(id), EventKind::RouteResolved) => {
                match id.route_resolved(event) {
                    Ok(id) => {
                        // The id borrows the CQ for the QP below; its state is RouteResolved.
                        return self.connect_routed(conn, id);
                    }
                    Err(e) => Err(e.error.into()),
                }
            }
            (IdState::Connecting(id), EventKind::Established) => match id.established(event) {
                Ok(id) => {
                    c.id = IdState::Connected(id);
                    let peer_data = event.private_data().to_vec();
                    return self.on_established(conn, &peer_data);
                }
                Err(e) => {
                    c.id = IdState::Connecting(e.id);
                    Err(e.error.into())
                }
            },
            (state, EventKind::AddrError) => {
                c.id = state;
                Err(cm_map::status_error(Step::Address, status))
            }
            (state, EventKind::RouteError) => {
                c.id = state;
                Err(cm_map::status_error(Step::Route, status))
            }
            (state, EventKind::Rejected) => {
                c.id = state;
                Err(cm_map::rejected(event))
            }
            (state, EventKind::Unreachable) => {
                c.id = state;
                Err(cm_map::unreachable(status))
            }
            (state, EventKind::ConnectError) => {
                c.id = state;
                Err(Error::Connect(status.to_string()))
            }
            (state, EventKind::Disconnected | EventKind::DeviceRemoval) => {
                c.id = state;
                // Once the runtime retired, whatever ended the setup, the cause is the removal
                // (as for established connections).
                Err(Error::ConnectionLost(
                    self.env
                        .removal_cause(kind == EventKind::DeviceRemoval)
                        .unwrap_or(Lost::Disconnected),
                ))
            }
            (state, _) => {
                c.id = state;
                tracing::debug!(?conn, %kind, "event ignored during setup");
                Ok(())
            }
        };
        if let Err(e) = result {
            self.fail_setup(conn, e);
        }
    }

    fn connect_routed(
        &mut self,
        conn: ConnId,
        id: CmId<'s, evchan_core::cm::state::RouteResolved>,
    ) {
        let c = self.conns.get_mut(&conn).expect("present");
        c.phase = Phase::Setup(Step::Connect);
        c.deadline = Some(Instant::now() + c.config.connect_timeout);
        let mut id = id;
        if let Err(e) = self.make_path(conn, &mut PathTarget::Routed(&mut id)) {
            drop(id);
            return self.fail_setup(conn, e);
        }
        let c = self.conns.get_mut(&conn).expect("present");
        let wire = handshake(c);
        match id.connect(&cm_map::conn_param(&wire, c.config.retry_count)) {
            Ok(id) => c.id = IdState::Connecting(id),
            Err(e) => {
                drop(e.id);
                self.fail_setup(conn, e.error.into());
            }
        }
    }

    fn on_established(&mut self, conn: ConnId, peer_data: &[u8]) {
        let Some(rt) = self.runtime() else {
            return self.fail_setup(conn, Error::ConnectionLost(Lost::Closed));
        };
        let c = self.conns.get_mut(&conn).expect("present");
        if c.peer.is_none() {
            match proto::decode(peer_data) {
                Ok(p) => c.peer = Some(p),
                Err(e) => return self.fail_setup(conn, e.into()),
            }
        }
        let path = c.path.as_ref().expect("a connected id has its path");
        let mut max_send = c.config.max_message as usize;
        c.credits = match c.peer.as_ref() {
            Some(Peer::Evchan(hs, _)) => {
                max_send = max_send.min(hs.max_message as usize);
                Some(Credits::new(path.mine, *hs))
            }
            _ => None,
        };
        let (tx, inbox) = mpsc::unbounded_channel();
        let shared = Shared::new(c.config.send_depth);
        c.inbox = Some(tx);
        c.shared = Some(shared.clone());
        c.phase = Phase::Open;
        c.deadline = None;
        c.half_open = None;
        if let IdState::Connected(id) = &c.id {
            c.local_addr = id.local_addr();
            c.peer_addr = id.peer_addr().or(c.peer_addr);
        }
        let peer = c.peer.clone().unwrap_or(Peer::Plain(Vec::new()));
        let established = Established {
            conn,
            shard: rt.shard(self.env.index),
            inbox,
            shared,
            local_addr: c.local_addr,
            peer_addr: c.peer_addr,
            peer,
            max_send,
        };
        tracing::debug!(parent: &c.span, peer = ?c.peer_addr, early = c.early.len(), "established");
        let early = std::mem::take(&mut c.early);
        if let Some(reply) = c.reply.take() {
            // A connect or accept future dropped meanwhile drops the connection with the
            // reply: its halves' drop closes it.
            let _ = reply.send(Ok(crate::Connection::from_established(established)));
        }
        for (slot, wc) in early {
            if self
                .conns
                .get(&conn)
                .is_some_and(|c| c.phase == Phase::Open)
            {
                self.on_recv(conn, slot, &wc);
            }
        }
        self.dirty.push(conn);
        self.keepalive_opened(conn);
    }

    // ---------------------------------------------------------------------------------------
    // Setup helpers
    // ---------------------------------------------------------------------------------------

    /// Creates the QP, registers the slot pools and posts every receive, for an accepted
    /// request.
    pub(super) fn setup_path(&mut self, conn: ConnId) -> Result<()> {
        let c = self.conns.get_mut(&conn).expect("present");
        let IdState::Requested(mut id) = std::mem::replace(&mut c.id, IdState::Gone) else {
            unreachable!("checked by the caller")
        };
        let r = self.make_path(conn, &mut PathTarget::Requested(&mut id));
        self.conns.get_mut(&conn).expect("present").id = IdState::Requested(id);
        r
    }

    fn make_path(&mut self, conn: ConnId, target: &mut PathTarget<'_, 's>) -> Result<()> {
        let name = target.device_name();
        let dev = self
            .env
            .names
            .iter()
            .position(|n| *n == name)
            .ok_or(Error::Exhausted(
                "the id's device was not open when the runtime started",
            ))?;
        let c = self.conns.get_mut(&conn).expect("present");
        let cost = c.config.cq_cost();
        if self.cq_free[dev] < cost {
            return Err(Error::Exhausted(
                "CQ entries of the shard (see Config::cq_entries)",
            ));
        }
        let config = &c.config;
        let pd = &self.env.pds[dev];
        let cq = &self.env.cqs[dev];
        target.create_qp(pd, cq, &config.qp_init())?;
        let cm_map::Pools {
            recv_mr,
            recv_slots,
            send_mr,
            free_data,
            free_ctrl,
        } = config.pools(pd)?;
        let mine = config.handshake();
        self.cq_free[dev] -= cost;
        c.cq_reserved = cost;
        let path = Path {
            dev,
            recv_mr,
            send_mr,
            free_data,
            free_ctrl,
            mine,
        };
        for slot in recv_slots {
            let posted = target
                .post_recv(&path, slot)
                .map_err(|e| Error::Verbs(e.error))?;
            c.outstanding += 1;
            record(&mut self.posted, conn, posted, WrKind::Recv);
        }
        c.path = Some(path);
        Ok(())
    }

    pub(super) fn fail_setup(&mut self, conn: ConnId, error: Error) {
        if let Some(mut c) = self.remove(conn) {
            tracing::debug!(parent: &c.span, "setup failed: {error}");
            if let Some(reply) = c.reply.take() {
                let _ = reply.send(Err(error));
            }
            self.release(conn, c);
        }
    }
}

/// This side's handshake and the user's private data, for `rdma_connect` / `rdma_accept`.
pub(super) fn handshake(c: &Conn<'_>) -> Vec<u8> {
    c.path
        .as_ref()
        .map(|p| p.mine.encode(&c.private_data))
        .unwrap_or_default()
}

/// The id a path is made for: routed (active side) or requested (passive side).
enum PathTarget<'a, 's> {
    Routed(&'a mut CmId<'s, evchan_core::cm::state::RouteResolved>),
    Requested(&'a mut CmId<'s, Requested>),
}

impl<'s> PathTarget<'_, 's> {
    fn device_name(&self) -> String {
        match self {
            PathTarget::Routed(id) => id.verbs().name(),
            PathTarget::Requested(id) => id.verbs().name(),
        }
    }

    fn create_qp(&mut self, pd: &'s Pd<'_>, cq: &'s Cq<'_>, init: &QpInit) -> Result<()> {
        match self {
            PathTarget::Routed(id) => id.create_qp_with(pd, cq, cq, init),
            PathTarget::Requested(id) => id.create_qp_with(pd, cq, cq, init),
        }
        .map_err(Error::from)
    }

    fn post_recv(
        &self,
        path: &Path<'s>,
        slot: Slot,
    ) -> std::result::Result<PostedSlot, evchan_core::verbs::SlotPostError> {
        match self {
            PathTarget::Routed(id) => id.post_recv_slot(&path.recv_mr, slot),
            PathTarget::Requested(id) => id.post_recv_slot(&path.recv_mr, slot),
        }
    }
}
