//! One shard: an event channel, per device a completion channel and CQ, and the connections
//! whose ids live on that channel, driven by a current-thread tokio runtime.

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use evchan_core::cm::state::Requested;
use evchan_core::cm::{ConnParam, EventKind, IdKey, PortSpace, Status};
use evchan_core::verbs::{
    CompChannel, Cq, Pd, PostedSlot, QpInit, Slot, SlotPool, WcStatus, WorkCompletion,
};
use evchan_core::{CmEvent, CmId, EventChannel, ReadyGuard};

use super::conn::{with_id, Conn, IdState, Path, Phase};
use super::half_open::{HalfOpen, HalfOpenLimit};
use super::{Cmd, ConnId, Delivery, Established, IntMap, Runtime, SendEnd, Shared};
use crate::config::Config;
use crate::error::{Error, Lost, Result, Step};
use crate::proto::{self, Credits, Handshake, Kind, Peer, ProtocolError};

mod keepalive;

/// How long a closing connection may take to drain before its id is destroyed anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// How many completions one poll takes.
const POLL_BATCH: usize = 64;

/// What a shard borrows from the runtime thread.
pub(super) struct Env<'s, 'c> {
    pub(super) index: usize,
    pub(super) channels: &'s [EventChannel],
    pub(super) names: &'s [String],
    pub(super) pds: &'s [Pd<'c>],
    pub(super) comps: &'s [CompChannel<'c>],
    pub(super) cqs: &'s [Cq<'c>],
    pub(super) cq_entries: u32,
    pub(super) busy_poll: Option<Duration>,
    /// The shard runs as a task on the application's runtime ([`Config::in_task`]): a busy
    /// poll gives the thread back after each piece of progress.
    pub(super) in_task: bool,
    pub(super) rt: Weak<Runtime>,
    pub(super) peers: Vec<mpsc::UnboundedSender<Migrated<'s>>>,
    pub(super) removal: &'s super::removal::Removal,
}

/// A request migrated here from the listener's shard.
pub(super) struct Migrated<'s> {
    id: CmId<'s, Requested>,
    conn: ConnId,
    config: Config,
    peer: Peer,
    accept_queue: mpsc::Sender<crate::Incoming>,
    ticket: HalfOpen,
}

struct Listening<'s> {
    id: CmId<'s, evchan_core::cm::state::Listening>,
    config: Config,
    accept_queue: mpsc::Sender<crate::Incoming>,
    half_open: HalfOpenLimit,
}

struct PostedWr {
    conn: ConnId,
    slot: PostedSlot,
    kind: WrKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WrKind {
    Recv,
    Data,
    Ctrl,
}

/// A received message's slot as the owner of its `Bytes`: dropping the last clone sends the
/// slot back to the shard, which posts it again and returns the credit.
struct RecvBuf {
    slot: Option<Slot>,
    conn: ConnId,
    back: mpsc::UnboundedSender<(ConnId, Slot)>,
}

impl AsRef<[u8]> for RecvBuf {
    fn as_ref(&self) -> &[u8] {
        self.slot.as_ref().map_or(&[], Slot::as_slice)
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            // The shard may be gone; the slot's memory is then freed with it.
            let _ = self.back.send((self.conn, slot));
        }
    }
}

struct Shard<'s, 'c> {
    env: Env<'s, 'c>,
    channel: &'s EventChannel,
    conns: IntMap<ConnId, Conn<'s>>,
    by_key: IntMap<IdKey, ConnId>,
    listeners: IntMap<ConnId, Listening<'s>>,
    listener_keys: IntMap<IdKey, ConnId>,
    posted: IntMap<u64, PostedWr>,
    cq_free: Vec<u32>,
    slots_back: mpsc::UnboundedSender<(ConnId, Slot)>,
    wcs: Vec<WorkCompletion>,
    /// Connections with something to send.
    dirty: Vec<ConnId>,
    closed_rx: bool,
    /// A device was removed: everything here has failed, and the shard ends.
    retired: bool,
    /// When the keepalive timer fires next (`None`: no open connection has a keepalive).
    keepalive_at: Option<Instant>,
    /// When it fired last.
    keepalive_tick: Option<Instant>,
    /// Per device: the CQ is armed. A busy-polling shard arms it only before it sleeps.
    armed: Vec<bool>,
    /// In a task: the last progress of a busy poll that paused since (see [`Shard::busy_poll`]).
    spin_last: Option<Instant>,
}

impl Drop for Shard<'_, '_> {
    /// A shard that ends normally has no connection left (or has failed them all, for a
    /// device removal). One dropped with connections is an in-task shard whose tokio runtime
    /// shut down: their `send`s, which could wait for a permit forever, fail now; their
    /// `recv`s and the listeners' `accept`s see their channels closed. Everything else goes
    /// with the fields (ids, QPs, memory regions).
    fn drop(&mut self) {
        for c in self.conns.values() {
            if let Some(shared) = &c.shared {
                shared.end(SendEnd::Lost(Lost::Shutdown));
            }
        }
    }
}

/// What woke a shard (see `drive`).
enum Wake<'f, 's> {
    Cm(io::Result<ReadyGuard<'f>>),
    Comp(usize, io::Result<ReadyGuard<'f>>),
    Cmd(Option<Cmd>),
    Migrated(Migrated<'s>),
    SlotBack(ConnId, Slot),
    Deadline,
    Keepalive,
    Spin,
}

/// How many kinds of [`Wake`] a shard looks at.
const WAKE_SOURCES: usize = 8;

/// How a busy poll ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spun {
    /// Nothing happened for the window (or the spin reached its limit): sleep.
    Idle,
    /// In a task: something happened; give the thread to the tasks it may have woken, then
    /// poll again.
    Progress,
}

/// Empty polls between two clock reads of a busy poll (each read is a system call in the VM).
const SPINS_PER_CLOCK_READ: u32 = 64;

pub(super) fn run<'s, 'c>(
    env: Env<'s, 'c>,
    rx: mpsc::UnboundedReceiver<Cmd>,
    peer_rx: mpsc::UnboundedReceiver<Migrated<'s>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return tracing::error!("evchan shard {}: no tokio runtime: {e}", env.index),
    };
    rt.block_on(serve(env, rx, peer_rx));
}

/// Drives the shard until it ends, on whatever runtime polls it (its own thread's, or the
/// application's with [`Config::in_task`]).
pub(super) async fn serve<'s, 'c>(
    env: Env<'s, 'c>,
    rx: mpsc::UnboundedReceiver<Cmd>,
    peer_rx: mpsc::UnboundedReceiver<Migrated<'s>>,
) {
    let span = tracing::debug_span!("evchan.shard", shard = env.index, in_task = env.in_task);
    if let Err(e) = tracing::Instrument::instrument(drive(env, rx, peer_rx), span).await {
        tracing::error!("evchan shard stopped: {e}");
    }
}

async fn drive<'s, 'c>(
    env: Env<'s, 'c>,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    mut peer_rx: mpsc::UnboundedReceiver<Migrated<'s>>,
) -> io::Result<()> {
    let channel = &env.channels[env.index];
    // Registered with this thread's reactor; they borrow the descriptors, which the runtime
    // thread closes only after this shard has returned.
    let cm_fd = channel.readable()?;
    let comp_fds = env
        .comps
        .iter()
        .map(CompChannel::readable)
        .collect::<io::Result<Vec<_>>>()?;
    let (slots_back, mut slots_rx) = mpsc::unbounded_channel();
    let env_cqs = env.cqs.len();
    let mut shard = Shard {
        cq_free: vec![env.cq_entries; env.cqs.len()],
        env,
        channel,
        conns: IntMap::default(),
        by_key: IntMap::default(),
        listeners: IntMap::default(),
        listener_keys: IntMap::default(),
        posted: IntMap::default(),
        slots_back,
        wcs: Vec::with_capacity(POLL_BATCH),
        dirty: Vec::new(),
        closed_rx: false,
        retired: false,
        keepalive_at: None,
        keepalive_tick: None,
        armed: vec![false; env_cqs],
        spin_last: None,
    };
    for d in 0..shard.env.cqs.len() {
        shard.arm_and_poll(d);
    }
    // Two timers, each reset only when its instant moves (not made again on every wake-up).
    let mut keepalive = std::pin::pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    let mut keepalive_armed: Option<Instant> = None;
    let mut deadline_sleep = std::pin::pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    let mut deadline_armed: Option<Instant> = None;
    let mut turn = 0usize;
    let multi_shard = shard.env.peers.len() > 1;
    loop {
        if shard.retired {
            while let Ok(cmd) = rx.try_recv() {
                refuse_removed(cmd);
            }
            break;
        }
        if shard.closed_rx && shard.conns.is_empty() && shard.listeners.is_empty() {
            break;
        }
        let mut spinning = false;
        if let Some(window) = shard.env.busy_poll {
            if shard.busy_poll(window, &mut rx, &mut slots_rx) == Spun::Progress {
                // Let the tasks this woke run, then poll again. (A yield that wakes the shard at
                // once would keep the run queue from emptying: a current-thread runtime polls
                // its `block_on` future only when it does, or every 61 polls.)
                tokio::task::yield_now().await;
                spinning = true;
            }
        }
        if !spinning {
            // Before sleeping, every CQ armed, then polled: nothing that came before is lost.
            for d in 0..shard.env.cqs.len() {
                if !shard.armed[d] {
                    shard.arm_and_poll(d);
                }
            }
            shard.flush_dirty();
        }
        let deadline = shard.next_deadline();
        if deadline != deadline_armed {
            if let Some(at) = deadline {
                deadline_sleep.as_mut().reset(at.into());
            }
            deadline_armed = deadline;
        }
        if shard.keepalive_at != keepalive_armed {
            if let Some(at) = shard.keepalive_at {
                keepalive.as_mut().reset(at.into());
            }
            keepalive_armed = shard.keepalive_at;
        }
        // What woke the shard: one source per turn, looked at from a different one each turn
        // so that none starves the others. Polled by hand rather than through `select!`,
        // which makes, registers and drops a future per source on every turn.
        turn = turn.wrapping_add(1);
        let woke = poll_fn(|cx| {
            for k in 0..WAKE_SOURCES {
                let ready = match (turn + k) % WAKE_SOURCES {
                    0 => cm_fd.poll_ready(cx).map(Wake::Cm),
                    1 => comp_fds
                        .iter()
                        .enumerate()
                        .find_map(|(d, fd)| match fd.poll_ready(cx) {
                            Poll::Ready(g) => Some(Wake::Comp(d, g)),
                            Poll::Pending => None,
                        })
                        .map_or(Poll::Pending, Poll::Ready),
                    2 if !shard.closed_rx => rx.poll_recv(cx).map(Wake::Cmd),
                    // Requests migrated from another shard (none with one shard).
                    3 if multi_shard => match peer_rx.poll_recv(cx) {
                        Poll::Ready(Some(m)) => Poll::Ready(Wake::Migrated(m)),
                        _ => Poll::Pending,
                    },
                    4 => match slots_rx.poll_recv(cx) {
                        Poll::Ready(Some((conn, slot))) => Poll::Ready(Wake::SlotBack(conn, slot)),
                        _ => Poll::Pending,
                    },
                    5 if deadline_armed.is_some() => {
                        deadline_sleep.as_mut().poll(cx).map(|()| Wake::Deadline)
                    }
                    6 if keepalive_armed.is_some() => {
                        keepalive.as_mut().poll(cx).map(|()| Wake::Keepalive)
                    }
                    // Busy-polling in a task: look at everything else without sleeping.
                    7 if spinning => Poll::Ready(Wake::Spin),
                    _ => Poll::Pending,
                };
                if ready.is_ready() {
                    return ready;
                }
            }
            Poll::Pending
        })
        .await;
        match woke {
            Wake::Cm(guard) => {
                let mut guard = guard?;
                // Drain every event, then clear readiness: an edge is never lost.
                shard.drain_cm();
                guard.clear_ready();
            }
            Wake::Comp(d, guard) => {
                let mut guard = guard?;
                shard.drain_cq_events(d);
                guard.clear_ready();
                // The notification is used up. The CQ is armed again only when the shard goes
                // to sleep (above): a completion that comes meanwhile (a send's, which rxe
                // completes inside the post) is polled then, without an event of its own.
                shard.armed[d] = false;
                shard.poll_cq(d);
            }
            Wake::Cmd(Some(cmd)) => {
                shard.on_cmd(cmd);
                while let Ok(cmd) = rx.try_recv() {
                    shard.on_cmd(cmd);
                }
            }
            Wake::Cmd(None) => shard.on_all_handles_gone(),
            Wake::Migrated(m) => shard.on_migrated(m),
            Wake::SlotBack(conn, slot) => {
                shard.on_slot_back(conn, slot);
                while let Ok((conn, slot)) = slots_rx.try_recv() {
                    shard.on_slot_back(conn, slot);
                }
            }
            Wake::Deadline => {
                deadline_armed = None;
                shard.on_deadlines();
            }
            Wake::Keepalive => {
                keepalive_armed = None;
                shard.on_keepalive();
            }
            Wake::Spin => {}
        }
        shard.flush_dirty();
    }
    drop(comp_fds);
    drop(cm_fd);
    Ok(())
}

fn status_error(step: Step, status: Status) -> Error {
    match status.io_error() {
        Some(e) if e.raw_os_error() == Some(libc_etimedout()) => Error::TimedOut(step),
        Some(source) => Error::Resolve { step, source },
        None => Error::Resolve {
            step,
            source: io::Error::other(status.to_string()),
        },
    }
}

/// An immediate failure of `rdma_resolve_addr` / `rdma_resolve_route` (e.g. `ENETUNREACH`).
fn resolve_failed(step: Step, e: evchan_core::Error) -> Error {
    match e {
        evchan_core::Error::Os { source, .. } => Error::Resolve { step, source },
        e => e.into(),
    }
}

fn libc_etimedout() -> i32 {
    io::Error::from(io::ErrorKind::TimedOut)
        .raw_os_error()
        .unwrap_or(110)
}

impl<'s, 'c> Shard<'s, 'c> {
    fn next_deadline(&self) -> Option<Instant> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    fn runtime(&self) -> Option<Arc<Runtime>> {
        self.env.rt.upgrade()
    }

    // ---------------------------------------------------------------------------------------
    // Commands from user handles
    // ---------------------------------------------------------------------------------------

    fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Connect {
                conn,
                addr,
                config,
                private_data,
                reply,
            } => self.connect(conn, addr, config, private_data, reply),
            Cmd::Listen {
                conn,
                addr,
                config,
                reply,
            } => {
                let listener = self.listen(conn, addr, config).and_then(|(local, queue)| {
                    let rt = self.runtime().ok_or(Error::ConnectionLost(Lost::Closed))?;
                    Ok(crate::Listener::new(
                        conn,
                        rt.shard(self.env.index),
                        queue,
                        local,
                    ))
                });
                // A bind future dropped meanwhile drops the listener with the reply: its drop
                // sends CloseListener.
                let _ = reply.send(listener);
            }
            Cmd::CloseListener(conn) => {
                if let Some(l) = self.listeners.remove(&conn) {
                    self.listener_keys.remove(&l.id.key());
                    tracing::debug!(?conn, "listener closed");
                }
            }
            Cmd::Accept {
                conn,
                private_data,
                reply,
            } => self.accept(conn, private_data, reply),
            Cmd::Reject { conn, private_data } => self.reject(conn, &private_data),
            Cmd::Send { conn, data } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    if c.phase == Phase::Open && !c.want_fin {
                        c.outbox.push_back(data);
                        self.dirty.push(conn);
                    }
                }
            }
            Cmd::Shutdown(conn) => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.want_fin = true;
                    self.dirty.push(conn);
                }
            }
            Cmd::RecvDropped(conn) => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.inbox = None;
                }
            }
            Cmd::Close { conn, reply } => self.close(conn, reply),
            Cmd::DeviceRemoved => self.retire(),
        }
    }

    fn on_all_handles_gone(&mut self) {
        self.closed_rx = true;
        self.listeners.clear();
        self.listener_keys.clear();
        let all: Vec<ConnId> = self.conns.keys().copied().collect();
        for conn in all {
            self.close(conn, None);
        }
    }

    fn connect(
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
        self.by_key.insert(key, conn);
        self.conns.insert(conn, c);
    }

    fn listen(
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
                config,
                accept_queue: tx,
            },
        );
        tracing::debug!(?conn, %local, "listening");
        Ok((local, rx))
    }

    fn accept(
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
            return self.fail_setup(conn, e);
        }
        let c = self.conns.get_mut(&conn).expect("present");
        let IdState::Requested(id) = std::mem::replace(&mut c.id, IdState::Gone) else {
            unreachable!("checked above")
        };
        let wire = handshake(c);
        match id.accept(&conn_param(&wire, c.config.retry_count)) {
            Ok(id) => c.id = IdState::Connecting(id),
            Err(e) => {
                c.id = IdState::Requested(e.id);
                self.fail_setup(conn, e.error.into());
            }
        }
    }

    fn reject(&mut self, conn: ConnId, private_data: &[u8]) {
        let Some(mut c) = self.remove(conn) else {
            return;
        };
        if let IdState::Requested(id) = std::mem::replace(&mut c.id, IdState::Gone) {
            if let Err(e) = id.reject(private_data) {
                tracing::debug!(?conn, "reject failed: {}", e.error);
            }
        }
        self.release(conn, c);
    }

    fn close(&mut self, conn: ConnId, reply: Option<oneshot::Sender<()>>) {
        let Some(c) = self.conns.get_mut(&conn) else {
            if let Some(r) = reply {
                let _ = r.send(());
            }
            return;
        };
        c.close_waiters.extend(reply);
        c.inbox = None;
        match c.phase {
            Phase::Open => {
                // No deadline while queued messages wait for the peer's credits: a live peer
                // that reads slowly gets everything. Once the FIN is posted, the transport's
                // retries bound the rest, and DRAIN_TIMEOUT after that.
                c.want_fin = true;
                c.closing = true;
                self.dirty.push(conn);
            }
            Phase::Draining => {}
            Phase::Setup(_) | Phase::Requested => {
                if let Some(r) = c.reply.take() {
                    let _ = r.send(Err(Error::ConnectionLost(Lost::Closed)));
                }
                if let Some(c) = self.remove(conn) {
                    self.release(conn, c);
                }
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // rdma_cm events
    // ---------------------------------------------------------------------------------------

    fn drain_cm(&mut self) {
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
            let request = event.take_request();
            event.ack();
            if let Some(id) = request {
                self.on_request(listener, id, &private_data);
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
            Some(Phase::Open | Phase::Draining) => match kind {
                EventKind::Disconnected | EventKind::DeviceRemoval => {
                    drop(event);
                    self.on_disconnected(conn, kind == EventKind::DeviceRemoval);
                }
                _ => {}
            },
            None => {}
        }
    }

    fn on_request(&mut self, listener: ConnId, id: CmId<'s, Requested>, private_data: &[u8]) {
        let Some(l) = self.listeners.get(&listener) else {
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
        let Some(ticket) = l.half_open.take().filter(|_| l.accept_queue.capacity() > 0) else {
            tracing::debug!("backlog of half-open connections full: request rejected");
            let _ = id.reject(&[]);
            return;
        };
        let Some(rt) = self.runtime() else {
            let _ = id.reject(&[]);
            return;
        };
        let conn = rt.conn_id();
        let target = usize::try_from(conn.0).unwrap_or(0) % self.env.peers.len();
        let m = Migrated {
            id,
            conn,
            config: l.config.clone(),
            peer,
            accept_queue: l.accept_queue.clone(),
            ticket,
        };
        if target == self.env.index {
            return self.on_migrated(m);
        }
        let Migrated {
            id,
            conn,
            config,
            peer,
            accept_queue,
            ticket,
        } = m;
        match id.migrate(&self.env.channels[target]) {
            Ok(id) => {
                let m = Migrated {
                    id,
                    conn,
                    config,
                    peer,
                    accept_queue,
                    ticket,
                };
                if let Err(back) = self.env.peers[target].send(m) {
                    let _ = back.0.id.reject(&[]);
                }
            }
            Err(e) => self.on_migrated(Migrated {
                id: e.id,
                conn,
                config,
                peer,
                accept_queue,
                ticket,
            }),
        }
    }

    fn on_migrated(&mut self, m: Migrated<'s>) {
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
        if m.accept_queue.try_send(incoming).is_err() {
            // Backlog full or the listener is gone. (The Incoming's drop sends a reject that
            // finds nothing: the id is rejected here.)
            let _ = m.id.reject(&[]);
            return;
        }
        let mut c = Conn::new(m.conn, IdState::Requested(m.id), Phase::Requested, m.config);
        tracing::debug!(parent: &c.span, peer = ?peer_addr, "request");
        half_open(&mut c, m.ticket);
        c.peer = Some(m.peer);
        c.peer_addr = peer_addr;
        c.local_addr = local_addr;
        self.by_key.insert(key, m.conn);
        self.conns.insert(m.conn, c);
    }

    fn on_setup_event(&mut self, conn: ConnId, event: &CmEvent<'s>) {
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
                        Err(e) => Err(resolve_failed(Step::Route, e.error)),
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
                Err(status_error(Step::Address, status))
            }
            (state, EventKind::RouteError) => {
                c.id = state;
                Err(status_error(Step::Route, status))
            }
            (state, EventKind::Rejected) => {
                c.id = state;
                let private_data = match proto::decode(event.private_data()) {
                    Ok(Peer::Evchan(_, user)) => user,
                    _ => trim_zeros(event.private_data()),
                };
                Err(Error::Rejected {
                    reason: status
                        .reject_reason()
                        .unwrap_or(evchan_core::cm::RejectReason(event.raw_status())),
                    private_data,
                })
            }
            (state, EventKind::Unreachable) => {
                c.id = state;
                Err(match status.io_error() {
                    Some(e) if e.raw_os_error() == Some(libc_etimedout()) => {
                        Error::TimedOut(Step::Connect)
                    }
                    _ => Error::Unreachable(status.to_string()),
                })
            }
            (state, EventKind::ConnectError) => {
                c.id = state;
                Err(Error::Connect(status.to_string()))
            }
            (state, EventKind::Disconnected | EventKind::DeviceRemoval) => {
                c.id = state;
                Err(Error::ConnectionLost(if kind == EventKind::DeviceRemoval {
                    Lost::DeviceRemoved
                } else {
                    Lost::Disconnected
                }))
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
        match id.connect(&conn_param(&wire, c.config.retry_count)) {
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

    fn on_disconnected(&mut self, conn: ConnId, removed: bool) {
        // Completions that came before the disconnect are delivered first.
        if let Some(d) = self
            .conns
            .get(&conn)
            .and_then(|c| c.path.as_ref())
            .map(|p| p.dev)
        {
            let _ = self.poll_cq(d);
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.disconnected = true;
        c.id.disconnect();
        // A peer in another retiring runtime of this process may disconnect before this
        // shard is told: the cause is still the removal.
        let lost = if removed || self.env.removal.is_retired() {
            Some(Lost::DeviceRemoved)
        } else if c.closing || c.credits.as_ref().is_none_or(Credits::fin_received) {
            None
        } else {
            Some(Lost::Disconnected)
        };
        if !c.ended {
            c.ended = true;
            if let Some(inbox) = &c.inbox {
                let _ = inbox.send(match &lost {
                    None => Delivery::Fin,
                    Some(l) => Delivery::Lost(l.clone()),
                });
            }
        }
        if let Some(shared) = &c.shared {
            shared.end(match lost {
                Some(l) => SendEnd::Lost(l),
                None if c.closing => SendEnd::Lost(Lost::Closed),
                None => SendEnd::PeerClosed,
            });
        }
        c.phase = Phase::Draining;
        c.deadline = Some(Instant::now() + DRAIN_TIMEOUT);
        self.try_finish(conn);
    }

    // ---------------------------------------------------------------------------------------
    // Setup helpers
    // ---------------------------------------------------------------------------------------

    /// Creates the QP, registers the slot pools and posts every receive, for an accepted
    /// request.
    fn setup_path(&mut self, conn: ConnId) -> Result<()> {
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
        let ctrl = u32::from(config.ctrl_slots);
        let init = QpInit::new()
            .max_send_wr(config.send_depth + ctrl)
            .max_recv_wr(config.recv_depth + ctrl)
            .max_sge(1);
        let pd = &self.env.pds[dev];
        let cq = &self.env.cqs[dev];
        target.create_qp(pd, cq, &init)?;
        let slot_size = config.max_message as usize;
        let (recv_pool, recv_slots) =
            SlotPool::new((config.recv_depth + ctrl) as usize, slot_size)?;
        let (send_pool, mut send_slots) =
            SlotPool::new((config.send_depth + ctrl) as usize, slot_size)?;
        let recv_mr = pd.reg_mr(recv_pool)?;
        let send_mr = pd.reg_mr(send_pool)?;
        let free_ctrl = send_slots.split_off(config.send_depth as usize);
        let mine = Handshake {
            data_slots: config.recv_depth,
            ctrl_slots: config.ctrl_slots,
            max_message: config.max_message,
        };
        self.cq_free[dev] -= cost;
        c.cq_reserved = cost;
        let path = Path {
            dev,
            recv_mr,
            send_mr,
            free_data: send_slots,
            free_ctrl,
            mine,
        };
        for slot in recv_slots {
            let posted = target
                .post_recv(&path, slot)
                .map_err(|e| Error::Verbs(e.error))?;
            c.outstanding += 1;
            self.posted.insert(
                posted.wr_id(),
                PostedWr {
                    conn,
                    slot: posted,
                    kind: WrKind::Recv,
                },
            );
        }
        c.path = Some(path);
        Ok(())
    }

    fn fail_setup(&mut self, conn: ConnId, error: Error) {
        if let Some(mut c) = self.remove(conn) {
            tracing::debug!(parent: &c.span, "setup failed: {error}");
            if let Some(reply) = c.reply.take() {
                let _ = reply.send(Err(error));
            }
            self.release(conn, c);
        }
    }

    fn remove(&mut self, conn: ConnId) -> Option<Conn<'s>> {
        let c = self.conns.remove(&conn)?;
        if let Some(key) = with_id!(&c.id, id => id.key()) {
            self.by_key.remove(&key);
        }
        Some(c)
    }

    /// Destroys a removed connection: the id (and its QP) first, then its memory regions;
    /// posted work requests of it are forgotten (their slots are never reused).
    fn release(&mut self, conn: ConnId, mut c: Conn<'s>) {
        c.id = IdState::Gone;
        if c.outstanding > 0 {
            // The QP is gone with the id: its posted work requests never complete. Their slots
            // are forgotten (never reused); the memory goes with the pool.
            self.posted.retain(|_, w| w.conn != conn);
        }
        if let Some(path) = c.path.take() {
            self.cq_free[path.dev] += c.cq_reserved;
            drop(path);
        }
        mark_if_undelivered(&c);
        if let Some(shared) = &c.shared {
            shared.end(SendEnd::Lost(Lost::Closed));
        }
        for w in c.close_waiters.drain(..) {
            let _ = w.send(());
        }
    }

    // ---------------------------------------------------------------------------------------
    // Completions
    // ---------------------------------------------------------------------------------------

    /// Reads the completion channel of device `d` until it is empty (`EAGAIN`), before its
    /// readiness is cleared: an edge is never lost. (Its one CQ notifies once per arm, so
    /// there is one event in the common case; the last read, which finds the channel empty,
    /// costs a `read` that returns `EAGAIN`, and is kept rather than trusting that count.)
    fn drain_cq_events(&mut self, d: usize) {
        let cq = &self.env.cqs[d];
        loop {
            match self.env.comps[d].try_get_cq_event(&[cq]) {
                Ok(Some(event)) => event.ack(), // counted; acked in batches by the CQ
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("ibv_get_cq_event: {e}");
                    break;
                }
            }
        }
    }

    /// Arm, then poll: a completion that came before the arm is not lost.
    fn arm_and_poll(&mut self, d: usize) {
        match self.env.cqs[d].req_notify(false) {
            Ok(()) => self.armed[d] = true,
            Err(e) => tracing::error!("ibv_req_notify_cq: {e}"),
        }
        let _ = self.poll_cq(d);
    }

    /// Polls the CQs, commands and returned slots without sleeping until nothing has happened
    /// for `window` (at most 16 windows in all, so that rdma_cm events wait no longer). A CQ
    /// whose notification came is not armed again while the shard spins (no notifications,
    /// no events to read while it polls anyway); it is armed, then polled, before the shard
    /// sleeps. In a task ([`Config::in_task`]) it returns at the first progress instead, so that the tasks
    /// it woke can run on this thread; the caller polls again after them.
    fn busy_poll(
        &mut self,
        window: Duration,
        rx: &mut mpsc::UnboundedReceiver<Cmd>,
        slots_rx: &mut mpsc::UnboundedReceiver<(ConnId, Slot)>,
    ) -> Spun {
        if self.conns.is_empty() {
            return Spun::Idle;
        }
        let start = Instant::now();
        let mut last = self.spin_last.take().unwrap_or(start);
        let mut busy_since_read = false;
        let mut spins = 0u32;
        loop {
            let mut busy = false;
            while let Ok(cmd) = rx.try_recv() {
                self.on_cmd(cmd);
                busy = true;
            }
            while let Ok((conn, slot)) = slots_rx.try_recv() {
                self.on_slot_back(conn, slot);
                busy = true;
            }
            for d in 0..self.env.cqs.len() {
                busy |= self.poll_cq(d) > 0;
            }
            if busy {
                self.flush_dirty();
                if self.env.in_task {
                    return Spun::Progress;
                }
                busy_since_read = true;
            } else {
                std::hint::spin_loop();
            }
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_CLOCK_READ) {
                // Progress is dated by the first clock read after it: the spin lasts at most
                // one read's worth of spins longer than `window` after the last progress.
                let now = Instant::now();
                if std::mem::take(&mut busy_since_read) {
                    last = now;
                }
                if now - last >= window || now - start >= window * 16 {
                    return Spun::Idle;
                }
                if self.env.in_task {
                    // A pause: the runtime polls its reactor (a system call, which also lets
                    // the kernel's deferred work on this CPU run), then the spin goes on.
                    self.spin_last = Some(last);
                    return Spun::Progress;
                }
            }
        }
    }

    /// Polls the CQ of device `d` until it is empty; how many completions it had.
    fn poll_cq(&mut self, d: usize) -> usize {
        let mut total = 0;
        loop {
            let mut wcs = std::mem::take(&mut self.wcs);
            let n = match self.env.cqs[d].poll(&mut wcs, POLL_BATCH) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!("ibv_poll_cq: {e}");
                    0
                }
            };
            for wc in wcs.drain(..) {
                self.on_wc(&wc);
            }
            self.wcs = wcs;
            total += n;
            if n < POLL_BATCH {
                break total;
            }
        }
    }

    fn on_wc(&mut self, wc: &WorkCompletion) {
        let Some(w) = self.posted.remove(&wc.wr_id()) else {
            return;
        };
        let conn = w.conn;
        let Ok(slot) = w.slot.complete(wc) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.outstanding = c.outstanding.saturating_sub(1);
        c.active = true;
        let ok = wc.is_success();
        let max = c.config.max_message;
        match w.kind {
            WrKind::Recv => match c.phase {
                Phase::Open if ok => self.on_recv(conn, slot, wc),
                Phase::Setup(_) if ok => c.early.push((slot, *wc)),
                _ => {}
            },
            WrKind::Data => {
                c.sends_in_flight = c.sends_in_flight.saturating_sub(1);
                if let Some(path) = c.path.as_mut() {
                    path.free_data.push(slot);
                }
                if let Some(shared) = &c.shared {
                    shared.permits.add_permits(1);
                    if !ok {
                        shared.mark_undelivered();
                    }
                }
                self.dirty.push(conn);
            }
            WrKind::Ctrl => {
                if c.fin_wr == Some(wc.wr_id()) {
                    c.fin_wr = None;
                }
                if let Some(path) = c.path.as_mut() {
                    path.free_ctrl.push(slot);
                }
                self.dirty.push(conn);
            }
        }
        if !ok && wc.status() != WcStatus::WrFlush {
            self.lose(conn, wc_failure(w.kind, wc.status(), max));
        }
        self.try_finish(conn);
    }

    fn on_recv(&mut self, conn: ConnId, slot: Slot, wc: &WorkCompletion) {
        let c = self.conns.get_mut(&conn).expect("present");
        let kind = match c.credits.as_mut() {
            None => Ok(Kind::Data),
            Some(credits) => credits.on_receive(wc.imm_data(), wc.byte_len()),
        };
        tracing::trace!(?conn, ?kind, imm = ?wc.imm_data(), credits = ?c.credits, "received");
        match kind {
            Err(e) => {
                tracing::debug!(?conn, "protocol violation: {e}");
                let _ = &e;
                self.lose(conn, Lost::Protocol(e));
            }
            Ok(Kind::Data) => {
                // Credits may have come back with it: what waits may go now.
                self.dirty.push(conn);
                let deliver = c.inbox.as_ref().filter(|i| !i.is_closed()).cloned();
                match deliver {
                    Some(inbox) => {
                        let buf = RecvBuf {
                            slot: Some(slot),
                            conn,
                            back: self.slots_back.clone(),
                        };
                        let _ = inbox.send(Delivery::Data(Bytes::from_owner(buf)));
                    }
                    // Nobody reads: the message is dropped and credited at once.
                    None => self.on_slot_back(conn, slot),
                }
            }
            Ok(kind) => {
                self.repost(conn, slot);
                if kind == Kind::Fin {
                    let c = self.conns.get_mut(&conn).expect("present");
                    c.ended = true;
                    if let Some(inbox) = &c.inbox {
                        let _ = inbox.send(Delivery::Fin);
                    }
                }
                self.dirty.push(conn);
            }
        }
    }

    /// A received slot came back from the application (its last `Bytes` dropped).
    fn on_slot_back(&mut self, conn: ConnId, slot: Slot) {
        let open = self
            .conns
            .get(&conn)
            .is_some_and(|c| c.phase == Phase::Open);
        if !open {
            return;
        }
        if self.repost(conn, slot) {
            let c = self.conns.get_mut(&conn).expect("present");
            if let Some(credits) = c.credits.as_mut() {
                credits.consumed();
            }
            tracing::trace!(?conn, credits = ?c.credits, "consumed");
            self.dirty.push(conn);
        }
    }

    fn repost(&mut self, conn: ConnId, slot: Slot) -> bool {
        let c = self.conns.get_mut(&conn).expect("present");
        let (Some(path), Some(id)) = (c.path.as_ref(), connected(&c.id)) else {
            return false;
        };
        match id.post_recv_slot(&path.recv_mr, slot) {
            Ok(posted) => {
                c.outstanding += 1;
                self.posted.insert(
                    posted.wr_id(),
                    PostedWr {
                        conn,
                        slot: posted,
                        kind: WrKind::Recv,
                    },
                );
                true
            }
            Err(e) => {
                let e = e.error.to_string();
                self.lose(conn, Lost::Verbs(e));
                false
            }
        }
    }

    /// Ends a connection abnormally: the receive half gets `why`, sends fail, the id is
    /// disconnected and goes once its work requests are flushed.
    fn lose(&mut self, conn: ConnId, why: Lost) {
        // Whatever ends a connection once the runtime retired (a peer of another retiring
        // runtime of this process that went first, the flushes of its QP), the cause is the
        // removal.
        let why = if self.env.removal.is_retired() {
            Lost::DeviceRemoved
        } else {
            why
        };
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        tracing::debug!(parent: &c.span, %why, "connection lost");
        tell_lost(c, &why);
        c.outbox.clear();
        if !c.disconnected {
            c.disconnected = true;
            c.id.disconnect();
        }
        c.phase = Phase::Draining;
        c.deadline = Some(Instant::now() + DRAIN_TIMEOUT);
    }

    /// Releases a disconnected connection whose work requests have all completed.
    fn try_finish(&mut self, conn: ConnId) {
        let done = self
            .conns
            .get(&conn)
            .is_some_and(|c| c.phase == Phase::Draining && c.outstanding == 0);
        if done {
            if let Some(c) = self.remove(conn) {
                tracing::debug!(parent: &c.span, "released");
                self.release(conn, c);
            }
        }
    }

    fn on_deadlines(&mut self) {
        let now = Instant::now();
        let due: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(k, _)| *k)
            .collect();
        for conn in due {
            let phase = self.conns[&conn].phase;
            match phase {
                Phase::Setup(step) => self.fail_setup(conn, Error::TimedOut(step)),
                // Unanswered for the connect timeout: a half-open connection goes.
                Phase::Requested => self.reject(conn, &[]),
                Phase::Open | Phase::Draining => {
                    // A close that did not finish: release everything now.
                    if let Some(c) = self.remove(conn) {
                        tracing::debug!(?conn, "drain timed out; released");
                        self.release(conn, c);
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Sending
    // ---------------------------------------------------------------------------------------

    fn flush_dirty(&mut self) {
        while let Some(conn) = self.dirty.pop() {
            self.flush(conn);
        }
    }

    fn flush(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.phase != Phase::Open {
            return;
        }
        let (Some(path), Some(id)) = (c.path.as_mut(), connected(&c.id)) else {
            return;
        };
        let mut failed = None;
        // Data, as credits and send slots allow.
        while let Some(data) = c.outbox.front() {
            if path.free_data.is_empty() {
                break;
            }
            let saved = c.credits.clone();
            let imm = match c.credits.as_mut() {
                Some(credits) => match credits.send_data() {
                    Some(imm) => Some(imm),
                    None => break,
                },
                None => None,
            };
            let mut slot = path.free_data.pop().expect("checked");
            let n = data.len();
            slot.as_mut_slice()[..n].copy_from_slice(data);
            if let Err(e) = slot.set_len(n) {
                failed = Some(Lost::Verbs(e.to_string()));
                break;
            }
            tracing::trace!(?conn, ?imm, "data sent");
            match id.post_send_slot(&path.send_mr, slot, imm) {
                Ok(posted) => {
                    c.outbox.pop_front();
                    c.outstanding += 1;
                    c.sends_in_flight += 1;
                    self.posted.insert(
                        posted.wr_id(),
                        PostedWr {
                            conn,
                            slot: posted,
                            kind: WrKind::Data,
                        },
                    );
                }
                Err(e) if e.is_queue_full() => {
                    // Backpressure: retried on the next completion.
                    c.credits = saved;
                    path.free_data.push(e.slot);
                    break;
                }
                Err(e) => {
                    failed = Some(Lost::Verbs(e.error.to_string()));
                    break;
                }
            }
        }
        // Credit updates and FIN, from their own slots and budget.
        if let Some(credits) = c.credits.as_mut() {
            loop {
                if path.free_ctrl.is_empty() {
                    break;
                }
                let saved = credits.clone();
                let (imm, fin) = if let Some(imm) = credits.credit_update() {
                    tracing::trace!(?conn, imm, "credit update");
                    (imm, false)
                } else if c.want_fin && c.outbox.is_empty() {
                    match credits.send_fin() {
                        Some(imm) => (imm, true),
                        None => break,
                    }
                } else {
                    break;
                };
                match post_ctrl(id, path, &mut self.posted, conn, imm) {
                    CtrlPost::Posted(wr_id) => {
                        c.outstanding += 1;
                        if fin {
                            c.fin_wr = Some(wr_id);
                            if c.closing {
                                c.deadline = Some(Instant::now() + DRAIN_TIMEOUT);
                            }
                        }
                    }
                    CtrlPost::QueueFull => {
                        *credits = saved;
                        break;
                    }
                    CtrlPost::Failed(why) => {
                        failed = Some(why);
                        break;
                    }
                }
            }
        }
        // Closing: disconnect once our FIN (or, with a plain peer, every send) completed.
        let sent_all = match &c.credits {
            Some(credits) => credits.fin_sent() && c.fin_wr.is_none(),
            None => c.outbox.is_empty() && c.sends_in_flight == 0,
        };
        if failed.is_none() && c.closing && sent_all && !c.disconnected {
            c.disconnected = true;
            c.id.disconnect();
            if let Some(shared) = &c.shared {
                shared.end(SendEnd::Lost(Lost::Closed));
            }
            c.phase = Phase::Draining;
            c.deadline = Some(Instant::now() + DRAIN_TIMEOUT);
        }
        if let Some(why) = failed {
            self.lose(conn, why);
        }
        self.try_finish(conn);
    }
}

/// Tells every part of `c` that waits that the connection is lost: its sends first (a `send`
/// after `recv` returned the loss is refused, never queued to nowhere), then a connect or
/// accept still waiting for `ESTABLISHED` (a peer's first message can come before it), then
/// its receive half, once.
fn tell_lost(c: &mut Conn<'_>, why: &Lost) {
    mark_if_undelivered(c);
    if let Some(shared) = &c.shared {
        shared.end(SendEnd::Lost(why.clone()));
    }
    if let Some(reply) = c.reply.take() {
        let _ = reply.send(Err(Error::ConnectionLost(why.clone())));
    }
    if !c.ended {
        c.ended = true;
        if let Some(inbox) = &c.inbox {
            let _ = inbox.send(Delivery::Lost(why.clone()));
        }
    }
}

/// Records on the connection's shared state that a message it was given was not delivered,
/// when one is still queued or in flight (its send not completed) as the connection ends.
fn mark_if_undelivered(c: &Conn<'_>) {
    if !c.outbox.is_empty() || c.sends_in_flight > 0 {
        if let Some(shared) = &c.shared {
            shared.mark_undelivered();
        }
    }
}

/// Gives a request its half-open ticket and its deadline: unanswered, or accepted and not
/// established, for `connect_timeout`, it goes (see [`super::half_open`]).
fn half_open(c: &mut Conn<'_>, ticket: HalfOpen) {
    c.half_open = Some(ticket);
    c.deadline = Some(Instant::now() + c.config.connect_timeout);
}

/// Why a failed work request ends its connection. A receive that fails with a local length
/// error held a message above this side's maximum, which an evchan peer never sends.
fn wc_failure(kind: WrKind, status: WcStatus, max: u32) -> Lost {
    match (kind, status) {
        (WrKind::Recv, WcStatus::LocalLength) => Lost::Protocol(ProtocolError::Overrun { max }),
        _ => Lost::WorkCompletion(status),
    }
}

/// How posting one control message (a credit update, a FIN, a keepalive) went.
enum CtrlPost {
    /// Posted, with this work request id, and recorded in the shard's posted table.
    Posted(u64),
    /// The send queue is full: the slot is back among the free ones; try again later.
    QueueFull,
    /// The post failed: the connection is lost.
    Failed(Lost),
}

/// Posts a zero-length control message with immediate data `imm` from one of `path`'s free
/// control slots (the caller checked there is one).
fn post_ctrl<'s>(
    id: &CmId<'s, evchan_core::cm::state::Connected>,
    path: &mut Path<'s>,
    posted: &mut IntMap<u64, PostedWr>,
    conn: ConnId,
    imm: u32,
) -> CtrlPost {
    let Some(mut slot) = path.free_ctrl.pop() else {
        return CtrlPost::QueueFull;
    };
    let _ = slot.set_len(0);
    match id.post_send_slot(&path.send_mr, slot, Some(imm)) {
        Ok(slot) => {
            let wr_id = slot.wr_id();
            posted.insert(
                wr_id,
                PostedWr {
                    conn,
                    slot,
                    kind: WrKind::Ctrl,
                },
            );
            CtrlPost::Posted(wr_id)
        }
        Err(e) if e.is_queue_full() => {
            path.free_ctrl.push(e.slot);
            CtrlPost::QueueFull
        }
        Err(e) => CtrlPost::Failed(Lost::Verbs(e.error.to_string())),
    }
}

/// The id of an open connection, for posting.
fn connected<'a, 's>(
    id: &'a IdState<'s>,
) -> Option<&'a CmId<'s, evchan_core::cm::state::Connected>> {
    match id {
        IdState::Connected(id) => Some(id),
        _ => None,
    }
}

/// This side's handshake and the user's private data, for `rdma_connect` / `rdma_accept`.
fn handshake(c: &Conn<'_>) -> Vec<u8> {
    c.path
        .as_ref()
        .map(|p| p.mine.encode(&c.private_data))
        .unwrap_or_default()
}

/// The connection parameters of both sides: `wire` as private data, RNR retried without
/// end, as plain librdmacm programs expect (evchan peers never cause an RNR: credits), and the
/// transport's retries (`Config::retry_count`; the IB CM takes the connecting side's for both).
fn conn_param(wire: &[u8], retry_count: u8) -> ConnParam<'_> {
    ConnParam::new()
        .private_data(wire)
        .rnr_retry_count(7)
        .retry_count(retry_count)
}

/// The padding RoCE adds to private data, taken off a plain peer's reject data.
fn trim_zeros(data: &[u8]) -> Vec<u8> {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    data[..end].to_vec()
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

// -------------------------------------------------------------------------------------------
// Device removal (see `super::removal`)
// -------------------------------------------------------------------------------------------

impl Shard<'_, '_> {
    /// `DEVICE_REMOVAL` on the id `key` (its event already acked): every runtime of the
    /// process retires, this shard at once.
    fn on_device_removal(&mut self, key: IdKey) {
        let device = self
            .by_key
            .get(&key)
            .and_then(|conn| self.conns.get(conn))
            .and_then(|c| c.path.as_ref())
            .map(|p| self.env.names[p.dev].clone());
        tracing::debug!(
            ?device,
            listener = self.listener_keys.contains_key(&key),
            "DEVICE_REMOVAL"
        );
        match self.runtime() {
            Some(rt) => rt.device_removed(device.as_deref()),
            None => {
                self.env.removal.retire(device.as_deref());
            }
        }
        self.retire();
    }

    /// Fails every listener and connection of the shard with [`Lost::DeviceRemoved`] and
    /// destroys their ids, QPs and memory regions now; the shard then ends.
    fn retire(&mut self) {
        if self.retired {
            return;
        }
        self.retired = true;
        // A listener's accept() returns ConnectionLost(DeviceRemoved) once its queue is
        // closed and empty.
        self.listener_keys.clear();
        let listeners = std::mem::take(&mut self.listeners);
        let n_listeners = listeners.len();
        drop(listeners);
        let all: Vec<ConnId> = self.conns.keys().copied().collect();
        let n_conns = all.len();
        for conn in all {
            let Some(mut c) = self.remove(conn) else {
                continue;
            };
            tell_lost(&mut c, &Lost::DeviceRemoved);
            self.release(conn, c);
        }
        self.dirty.clear();
        tracing::debug!(
            listeners = n_listeners,
            connections = n_conns,
            "shard retired after a device removal"
        );
    }
}

/// A command that reached a retired shard: what waits for an answer gets one.
fn refuse_removed(cmd: Cmd) {
    let removed = || Error::ConnectionLost(Lost::DeviceRemoved);
    match cmd {
        Cmd::Connect { reply, .. } | Cmd::Accept { reply, .. } => drop(reply.send(Err(removed()))),
        Cmd::Listen { reply, .. } => drop(reply.send(Err(removed()))),
        Cmd::Close {
            reply: Some(reply), ..
        } => drop(reply.send(())),
        _ => {}
    }
}
