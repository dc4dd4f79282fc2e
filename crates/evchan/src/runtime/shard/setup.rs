//! A connection's setup: the address, route and connect steps until `ESTABLISHED`, its
//! path (QP, slot pools, posted receives), the handshake in the private data, and the
//! setup's failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hub::Hub;
use evchan_core::cm::state::Requested;
use evchan_core::cm::EventKind;
use evchan_core::verbs::{OwnedCompChannel, OwnedCq, OwnedPd, QpHandle, QpInit};

use evchan_core::{CmEvent, CmId};

use super::Shard;
use crate::cm_map;
use crate::error::{Error, Lost, Result, Step};
use crate::proto::{self, Credits, Peer};
use crate::runtime::conn::{Conn, IdState, Phase};
use crate::runtime::{ConnId, Established};
use crate::wire::{Objects, ToShard, Wire};

impl<'s> Shard<'s> {
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
                    // The reply's responder resources, as this side's initiator depth, for a
                    // connection this side made. (A listener's connection had the request's:
                    // the passive side's `ESTABLISHED` carries no parameters.)
                    if c.active {
                        c.reads = event.conn_info().map_or(0, |i| i.initiator_depth);
                    }
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
        match id.connect(&cm_map::conn_param(
            &wire,
            c.config.retry_count,
            c.read_depth,
        )) {
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
        let wire = Arc::clone(c.wire.as_ref().expect("a connected id has its path"));
        let mut max_send = c.config.max_message as usize;
        let credits = match c.peer.as_ref() {
            Some(Peer::Evchan(hs, _)) => {
                max_send = max_send.min(hs.max_message as usize);
                Some(Credits::new(c.config.handshake(), *hs))
            }
            _ => None,
        };
        // Our side asks for `read_depth` (`cm_map::conn_param`).
        wire.open(credits, c.config.plain_recvs(), c.reads.min(c.read_depth));
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
            wire,
            local_addr: c.local_addr,
            peer_addr: c.peer_addr,
            peer,
            max_send,
        };
        tracing::debug!(parent: &c.span, peer = ?c.peer_addr, "established");
        if let Some(reply) = c.reply.take() {
            // A connect or accept future dropped meanwhile drops the connection with the
            // reply: its halves' drop closes it.
            let _ = reply.send(Ok(crate::Connection::from_established(established)));
        }
        self.keepalive_opened(conn);
    }

    // ---------------------------------------------------------------------------------------
    // Setup helpers
    // ---------------------------------------------------------------------------------------

    /// Creates the QP and the data path (its CQ on the shard's completion channel, the slot
    /// pools, every receive posted), for an accepted request.
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
        let pd = &self.env.pds[dev];
        let to_shard = ToShard {
            conn,
            tx: self.heard.clone(),
            removal: Arc::clone(&self.env.removal),
        };
        if self.hubs.len() <= dev {
            self.hubs.resize(dev + 1, None);
        }
        let hub = match &self.hubs[dev] {
            Some(hub) => Arc::clone(hub),
            None => {
                let hub = Hub::new(OwnedCompChannel::new(Arc::clone(pd.context()))?);
                self.hubs[dev] = Some(Arc::clone(&hub));
                hub
            }
        };
        let c = self.conns.get_mut(&conn).expect("present");
        c.read_depth = cm_map::read_depth(pd.context());
        let config = &c.config;
        let (cq, route) = hub.cq(config.cq_cost())?;
        let qp = target.create_qp(pd, &cq, &config.qp_init())?;
        let size = config.max_message as usize;
        let pool = self
            .pools
            .entry((dev, size))
            .or_insert_with(|| crate::wire::SharedPool::new(pd.clone(), size))
            .user();
        // The slots first (given back should the pool fail), then the posts.
        let first = config.first_recvs() as usize;
        let mut slots = Vec::with_capacity(first);
        for _ in 0..first {
            match pool.pool().take() {
                Ok(taken) => slots.push(taken),
                Err(e) => {
                    for (_, slot) in slots {
                        pool.pool().give(slot);
                    }
                    return Err(e);
                }
            }
        }
        let mut posted = Vec::with_capacity(first);
        let mut slots = slots.into_iter();
        for (mr, slot) in slots.by_ref() {
            match qp.post_recv_slot(mr.mr(), slot) {
                Ok(p) => posted.push((p, mr)),
                Err(e) => {
                    // (The receives posted before stay with the QP, which the id destroys:
                    // their slots are lost, and their chunk stays registered.)
                    pool.pool().give(e.slot);
                    for (_, slot) in slots {
                        pool.pool().give(slot);
                    }
                    return Err(Error::Verbs(e.error));
                }
            }
        }
        let objects = Objects::new(qp, pd.clone(), pool, cq, route);
        let wire = Wire::new(
            objects,
            config.send_depth,
            u32::from(config.ctrl_slots),
            posted,
            config.max_message,
            config.busy_poll,
            to_shard,
        );
        // A listener's connection under a memory budget counts the slots it holds beyond its
        // admission ticket (the first receives are in it).
        if let (Some([_, memory]), true) = (&c.live, config.memory_budget != u64::MAX) {
            wire.set_budget(crate::wire::PathBudget::new(
                memory.budget(config.memory_budget),
                u64::from(config.max_message),
                config.first_recvs(),
                config.admission_slots(),
            ));
        }
        wire.route_qp_events(&name);
        c.wire = Some(wire);
        c.device = Some(dev);
        Ok(())
    }
}

/// This side's handshake and the user's private data, for `rdma_connect` / `rdma_accept`.
pub(super) fn handshake(c: &Conn<'_>) -> Vec<u8> {
    c.config.handshake().encode(&c.private_data)
}

/// The id a path is made for: routed (active side) or requested (passive side).
enum PathTarget<'a, 's> {
    Routed(&'a mut CmId<'s, evchan_core::cm::state::RouteResolved>),
    Requested(&'a mut CmId<'s, Requested>),
}

impl PathTarget<'_, '_> {
    fn device_name(&self) -> String {
        match self {
            PathTarget::Routed(id) => id.verbs().name(),
            PathTarget::Requested(id) => id.verbs().name(),
        }
    }

    fn create_qp(&mut self, pd: &OwnedPd, cq: &OwnedCq, init: &QpInit) -> Result<QpHandle> {
        match self {
            PathTarget::Routed(id) => id.create_qp_owned(pd, cq, cq, init),
            PathTarget::Requested(id) => id.create_qp_owned(pd, cq, cq, init),
        }
        .map_err(Error::from)
    }
}
