//! One shard: an event channel and the connections whose ids live on it, driven by a
//! current-thread tokio runtime on a thread of its own.
//!
//! The module holds the shard's types and its loop (`drive`), which dispatches commands and
//! rdma_cm events; the handlers live in submodules: `cm` (the rdma_cm ids of commands and
//! events), `setup` (a connection's way to `ESTABLISHED`, its data path made on the way), `flow`
//! (closing, loss and release, the deadlines), `retire` (device removal) and `keepalive`. A
//! connection's messages never come here: its halves post and reap through its data path
//! ([`crate::wire`]); the shard hears from it only when it ends ([`Heard`]).

use std::future::{poll_fn, Future};
use std::io;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use evchan_core::cm::state::Requested;
use evchan_core::cm::IdKey;
use evchan_core::verbs::OwnedPd;
use evchan_core::{CmId, EventChannel, ReadyGuard};

use super::conn::Conn;
use super::half_open::{HalfOpen, HalfOpenLimit};
use super::{Cmd, ConnId, ConnectCmd, IntMap, ListenCmd, Runtime};
use crate::config::Config;
use crate::error::{Error, Lost};
use crate::proto::Peer;
use crate::wire::Heard;

mod cm;
mod flow;
mod keepalive;
mod retire;
mod setup;
mod sources;

use self::retire::refuse_removed;

/// How long a closing connection may wait for its `FIN`'s completion before it disconnects
/// anyway.
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a peer's disconnect lets our sends in flight complete before our own disconnect
/// flushes them (see `Conn::disconnect_deferred`).
const ACK_GRACE: Duration = Duration::from_millis(250);

/// What a shard borrows from the runtime thread.
pub(super) struct Env<'s> {
    pub(super) index: usize,
    pub(super) channels: &'s [EventChannel],
    pub(super) names: &'s [String],
    /// Per device (as `names`), librdmacm's context with a PD on it.
    pub(super) pds: &'s [OwnedPd],
    pub(super) rt: Weak<Runtime>,
    pub(super) peers: Vec<mpsc::UnboundedSender<Migrated<'s>>>,
    pub(super) removal: Arc<super::removal::Removal>,
}

impl Env<'_> {
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
    /// The listener's admission tickets (connections, memory), held for the connection's life.
    live: [HalfOpen; 2],
    /// The RDMA READs and atomics the peer takes as target at once (its request's).
    reads: u8,
    /// The RDMA READs and atomics the peer issues at once (its request's initiator depth).
    asked: u8,
}

struct Listening<'s> {
    id: CmId<'s, evchan_core::cm::state::Listening>,
    config: Config,
    accept_queue: mpsc::Sender<crate::Incoming>,
    half_open: HalfOpenLimit,
    /// `Config::max_connections`: one ticket per connection, from its request to its release.
    live: HalfOpenLimit,
    /// `Config::memory_budget`: a ticket of its buffer bytes per connection, as `live`.
    memory: HalfOpenLimit,
    /// A request was refused for want of a ticket (of `live`, of `memory`) and no request was
    /// admitted since: the warning was said.
    full: [bool; 2],
}

struct Shard<'s> {
    env: Env<'s>,
    channel: &'s EventChannel,
    /// Boxed: the table holds a pointer per connection. A table of the connections themselves
    /// grows to megabytes at thousands of connections; glibc serves such a table with a
    /// mapping of its own, and freeing it (as it grows or shrinks) raises glibc's trim
    /// threshold to twice its size for good, below which a thread's arena keeps a free top
    /// (see `evchan_sys::free_arena_top`).
    conns: IntMap<ConnId, Box<Conn<'s>>>,
    by_key: IntMap<IdKey, ConnId>,
    listeners: IntMap<ConnId, Listening<'s>>,
    listener_keys: IntMap<IdKey, ConnId>,
    /// Where the connections' data paths (and the shard's own waits on them) tell it things.
    heard: mpsc::UnboundedSender<(ConnId, Heard)>,
    closed_rx: bool,
    /// A device was removed: everything here has failed, and the shard ends.
    retired: bool,
    /// When the keepalive timer fires next (`None`: no open connection has a keepalive).
    keepalive_at: Option<Instant>,
    /// When it fired last.
    keepalive_tick: Option<Instant>,
    /// Per device (as `env.names`), the completion channel of this shard's connections on it,
    /// made with the first.
    hubs: Vec<Option<Arc<crate::hub::Hub>>>,
    /// By device (index in `env.names`) and slot size, the send slots this shard's
    /// connections share, made with the first.
    pools: std::collections::HashMap<(usize, usize), Arc<crate::wire::SharedPool>>,
}

impl Drop for Shard<'_> {
    /// A shard that ends normally has no connection left (or has failed them all, for a
    /// device removal). One that stops on an error fails what it still has: their halves see
    /// [`Lost::Shutdown`] (after what they received), and their objects go with the ids.
    fn drop(&mut self) {
        for (_, c) in self.conns.drain() {
            if let Some(reply) = c.reply {
                let _ = reply.send(Err(Error::ConnectionLost(Lost::Shutdown)));
            }
            drop(c.id);
            if let Some(wire) = &c.wire {
                wire.release(Lost::Shutdown);
            }
        }
    }
}

/// What woke a shard (see `drive`).
enum Wake<'f, 's> {
    Cm(io::Result<ReadyGuard<'f>>),
    Cmd(Option<Cmd>),
    /// Boxed: a [`Wake`] is moved on every turn, and a request is rare and large.
    Migrated(Box<Migrated<'s>>),
    Heard(ConnId, Heard),
    Deadline,
    Keepalive,
}

/// How many kinds of [`Wake`] a shard looks at.
const WAKE_SOURCES: usize = 6;
/// The sources of the deadline and keepalive timers, marked due again when they are reset.
const DEADLINE: usize = 4;
const KEEPALIVE: usize = 5;

pub(super) fn run<'s>(
    env: Env<'s>,
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
    let span = tracing::debug_span!("evchan.shard", shard = env.index);
    if let Err(e) = rt.block_on(tracing::Instrument::instrument(
        drive(env, rx, peer_rx),
        span,
    )) {
        tracing::error!("evchan shard stopped: {e}");
    }
}

async fn drive<'s>(
    env: Env<'s>,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    mut peer_rx: mpsc::UnboundedReceiver<Migrated<'s>>,
) -> io::Result<()> {
    // tokio's wakers, for the data path's yields (`wire::yield_to_runtime`): this
    // `block_on`'s, and a task's.
    poll_fn(|cx| {
        crate::wire::note_tokio_waker(cx.waker(), false);
        Poll::Ready(())
    })
    .await;
    tokio::spawn(poll_fn(|cx| {
        crate::wire::note_tokio_waker(cx.waker(), true);
        Poll::Ready(())
    }));
    let channel = &env.channels[env.index];
    // Registered with this thread's reactor; it borrows the descriptor, which the runtime
    // thread closes only after this shard has returned.
    let cm_fd = channel.readable()?;
    let (heard, mut heard_rx) = mpsc::unbounded_channel();
    let mut shard = Shard {
        env,
        channel,
        conns: IntMap::default(),
        by_key: IntMap::default(),
        listeners: IntMap::default(),
        listener_keys: IntMap::default(),
        heard,
        closed_rx: false,
        retired: false,
        keepalive_at: None,
        keepalive_tick: None,
        hubs: Vec::new(),
        pools: std::collections::HashMap::new(),
    };
    // Two timers, each reset only when its instant moves (not made again on every wake-up).
    let mut keepalive = std::pin::pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    let mut keepalive_armed: Option<Instant> = None;
    let mut deadline_sleep = std::pin::pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    let mut deadline_armed: Option<Instant> = None;
    let mut turn = 0usize;
    let mut sources = sources::Sources::new(WAKE_SOURCES);
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
        // so that none starves the others; polled by hand rather than through `select!`, and
        // only the sources whose own waker fired since they last returned `Pending` (see
        // `sources`).
        turn = turn.wrapping_add(1);
        let woke = poll_fn(|cx| {
            let due = sources.take(cx);
            // Due sources not polled yet, or not polled at all (their condition is off).
            let mut keep = due;
            for k in 0..WAKE_SOURCES {
                let source = (turn + k) % WAKE_SOURCES;
                let bit = 1 << source;
                if due & bit == 0 {
                    continue;
                }
                let mut cx = std::task::Context::from_waker(sources.waker(source));
                let cx = &mut cx;
                let ready = match source {
                    0 => cm_fd.poll_ready(cx).map(Wake::Cm),
                    1 if !shard.closed_rx => rx.poll_recv(cx).map(Wake::Cmd),
                    // Requests migrated from another shard (none with one shard).
                    2 if multi_shard => match peer_rx.poll_recv(cx) {
                        Poll::Ready(Some(m)) => Poll::Ready(Wake::Migrated(Box::new(m))),
                        _ => Poll::Pending,
                    },
                    3 => match heard_rx.poll_recv(cx) {
                        Poll::Ready(Some((conn, h))) => Poll::Ready(Wake::Heard(conn, h)),
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
            Wake::Cmd(Some(cmd)) => {
                shard.on_cmd(cmd);
                while let Ok(cmd) = rx.try_recv() {
                    shard.on_cmd(cmd);
                }
            }
            Wake::Cmd(None) => shard.on_all_handles_gone(),
            Wake::Migrated(m) => shard.on_migrated(*m),
            Wake::Heard(conn, h) => {
                shard.on_heard(conn, h);
                while let Ok((conn, h)) = heard_rx.try_recv() {
                    shard.on_heard(conn, h);
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
        }
    }
    drop(cm_fd);
    Ok(())
}

impl<'s> Shard<'s> {
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
            Cmd::Close { conn, reply } => self.close(conn, reply),
            Cmd::DeviceRemoved => self.retire(),
            Cmd::NudgeArena => super::trim::nudge_arena(),
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

#[cfg(test)]
mod tests {
    /// Commands and wake-ups are moved through channels and out of the shard's `poll_fn`: the
    /// rare, large requests (connect, listen, a migrated request) are boxed so that neither
    /// grows past a close's size.
    #[test]
    fn commands_and_wake_ups_stay_small() {
        assert!(std::mem::size_of::<super::Cmd>() <= 48);
        assert!(std::mem::size_of::<super::Wake<'_, '_>>() <= 64);
    }
}
