//! One shard: an event channel, per device a completion channel and CQ, and the connections
//! whose ids live on that channel, driven by a current-thread tokio runtime.
//!
//! The module holds the shard's types and its loop (`drive`), which dispatches commands;
//! the handlers live in submodules: `cm` (the rdma_cm ids of commands and events), `setup`
//! (a connection's way to `ESTABLISHED`), `cq` (completions), `flow` (sending and ending),
//! `retire` (device removal) and `keepalive`.

use std::future::{poll_fn, Future};
use std::io;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use evchan_core::cm::state::Requested;
use evchan_core::cm::IdKey;
use evchan_core::verbs::{CompChannel, Cq, Pd, PostedSlot, Slot, WorkCompletion};
use evchan_core::{CmId, EventChannel, ReadyGuard};

use super::conn::{Conn, IdState, Path, Phase};
use super::half_open::{HalfOpen, HalfOpenLimit};
use super::{Cmd, ConnId, ConnectCmd, IntMap, ListenCmd, Runtime, SendEnd};
use crate::config::Config;
use crate::error::{Error, Lost};
use crate::proto::Peer;

mod cm;
mod cq;
mod flow;
mod keepalive;
mod retire;
mod setup;
mod sources;

use self::retire::refuse_removed;

/// How long a closing connection may take to drain before its id is destroyed anyway.
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a peer's disconnect lets our sends in flight complete before our own disconnect
/// flushes them (see `Conn::disconnect_deferred`).
const ACK_GRACE: Duration = Duration::from_millis(250);
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

impl Env<'_, '_> {
    /// The one place that decides that a connection ended because its device was removed:
    /// [`Lost::DeviceRemoved`] when its event said so (`removed`) or, whatever ended it, once
    /// the runtime retired (`lose` and `on_disconnected` say why; a setup ended by a disconnect
    /// too); `None` otherwise.
    fn removal_cause(&self, removed: bool) -> Option<Lost> {
        (removed || self.removal.is_retired()).then_some(Lost::DeviceRemoved)
    }
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

/// Records a work request posted for `conn` under its `wr_id`, where its completion finds it.
fn record(posted: &mut IntMap<u64, PostedWr>, conn: ConnId, slot: PostedSlot, kind: WrKind) {
    posted.insert(slot.wr_id(), PostedWr { conn, slot, kind });
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WrKind {
    Recv,
    Data,
    Ctrl,
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
    /// Per device, in a task: a wake-up's completions were handed out and its events are not
    /// read yet (the channel's readiness is kept); the shard reads them after the tasks those
    /// completions woke have run, and arms the CQ only then.
    unread: Vec<bool>,
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
    /// Boxed: a [`Wake`] is moved on every turn, and a request is rare and large.
    Migrated(Box<Migrated<'s>>),
    SlotBack(ConnId, Slot),
    Deadline,
    Keepalive,
    Spin,
}

/// How many kinds of [`Wake`] a shard looks at.
const WAKE_SOURCES: usize = 8;
/// The one kind that is not a source with a waker of its own: a busy poll's next round.
const SPIN: usize = WAKE_SOURCES - 1;
/// The sources of the deadline and keepalive timers, marked due again when they are reset.
const DEADLINE: usize = 5;
const KEEPALIVE: usize = 6;

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
        unread: vec![false; env_cqs],
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
    let mut sources = sources::Sources::new(SPIN);
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
            // (A CQ whose events are unread is armed after their read: its channel is still
            // readable, so the shard does not sleep before it comes to that.)
            for d in 0..shard.env.cqs.len() {
                if !shard.armed[d] && !shard.unread[d] {
                    shard.arm_and_poll(d);
                }
            }
            shard.flush_dirty();
        }
        let deadline = shard.next_deadline();
        if deadline != deadline_armed {
            if let Some(at) = deadline {
                deadline_sleep.as_mut().reset(at.into());
                sources.keep(1 << DEADLINE);
            }
            deadline_armed = deadline;
        }
        if shard.keepalive_at != keepalive_armed {
            if let Some(at) = shard.keepalive_at {
                keepalive.as_mut().reset(at.into());
                sources.keep(1 << KEEPALIVE);
            }
            keepalive_armed = shard.keepalive_at;
        }
        // What woke the shard: one source per turn, looked at from a different one each turn
        // so that none starves the others. Polled by hand rather than through `select!`,
        // which makes, registers and drops a future per source on every turn; and only the
        // sources whose own waker fired since they last returned `Pending` (see `sources`).
        turn = turn.wrapping_add(1);
        let mut yield_first = false;
        let woke = poll_fn(|cx| {
            let due = sources.take(cx);
            // Due sources not polled yet, or not polled at all (their condition is off).
            let mut keep = due;
            for k in 0..WAKE_SOURCES {
                let source = (turn + k) % WAKE_SOURCES;
                if source == SPIN {
                    // Busy-polling in a task: look at everything else without sleeping.
                    if spinning {
                        sources.keep(keep);
                        return Poll::Ready(Wake::Spin);
                    }
                    continue;
                }
                let bit = 1 << source;
                if due & bit == 0 {
                    continue;
                }
                let mut cx = std::task::Context::from_waker(sources.waker(source));
                let cx = &mut cx;
                let ready = match source {
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
                        Poll::Ready(Some(m)) => Poll::Ready(Wake::Migrated(Box::new(m))),
                        _ => Poll::Pending,
                    },
                    4 => match slots_rx.poll_recv(cx) {
                        Poll::Ready(Some((conn, slot))) => Poll::Ready(Wake::SlotBack(conn, slot)),
                        _ => Poll::Pending,
                    },
                    DEADLINE if deadline_armed.is_some() => {
                        deadline_sleep.as_mut().poll(cx).map(|()| Wake::Deadline)
                    }
                    KEEPALIVE if keepalive_armed.is_some() => {
                        keepalive.as_mut().poll(cx).map(|()| Wake::Keepalive)
                    }
                    // Not polled: it stays due.
                    _ => continue,
                };
                if ready.is_ready() {
                    // Ready sources stay due: there may be more (the handlers drain what they
                    // can without waiting, and the next turn finds the source `Pending`).
                    sources.keep(keep);
                    return ready;
                }
                keep &= !bit;
            }
            sources.keep(keep);
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
                // The completions first: what they deliver reaches the application before the
                // events are read. The notification is used up: the CQ is armed again only
                // when the shard goes to sleep (above), and a completion that comes meanwhile
                // (a send's, which rxe completes inside the post) is polled then, without an
                // event of its own.
                shard.armed[d] = false;
                let n = shard.poll_cq(d);
                if n > 0 && shard.env.in_task && !shard.unread[d] {
                    // In a task the application runs only once the shard yields: the events'
                    // reads and the arm wait until it has (the reply it posts goes first). The
                    // readiness is kept, so the next turn comes back here, then reads them.
                    shard.unread[d] = true;
                    yield_first = true;
                } else {
                    // Drain every event, then clear readiness: an edge is never lost.
                    shard.drain_cq_events(d);
                    guard.clear_ready();
                    shard.unread[d] = false;
                }
            }
            Wake::Cmd(Some(cmd)) => {
                shard.on_cmd(cmd);
                while let Ok(cmd) = rx.try_recv() {
                    shard.on_cmd(cmd);
                }
            }
            Wake::Cmd(None) => shard.on_all_handles_gone(),
            Wake::Migrated(m) => shard.on_migrated(*m),
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
        if yield_first {
            tokio::task::yield_now().await;
            // What the woken tasks asked for goes first, before the events' read and the arm:
            // a reply posted while the CQ is unarmed raises no event (rxe completes a send
            // inside its post), so it costs no wake-up of its own.
            shard.take_queued(&mut rx, &mut slots_rx);
            shard.flush_dirty();
        }
    }
    drop(comp_fds);
    drop(cm_fd);
    Ok(())
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
            Cmd::Connect(c) => {
                let ConnectCmd {
                    conn,
                    addr,
                    config,
                    private_data,
                    reply,
                } = *c;
                self.connect(conn, addr, config, private_data, reply);
            }
            Cmd::Listen(l) => {
                let ListenCmd {
                    conn,
                    addr,
                    config,
                    reply,
                } = *l;
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
            record(posted, conn, slot, WrKind::Ctrl);
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
#[cfg(test)]
mod tests {
    /// A command is moved through the shard's channel and a wake-up out of its `poll_fn` on
    /// every message: the rare, large requests (connect, listen, a migrated request) are boxed
    /// so that neither grows past a `Send`'s size (48 bytes, 184 before the boxing).
    #[test]
    fn commands_and_wake_ups_stay_small() {
        assert!(std::mem::size_of::<super::Cmd>() <= 48);
        assert!(std::mem::size_of::<super::Wake<'_, '_>>() <= 64);
    }
}
