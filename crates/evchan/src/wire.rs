//! A connection's data path: its QP, CQ, memory and credits, shared by the connection's
//! halves, which post and reap from their own tasks, and its shard, which makes it, watches
//! the id's rdma_cm events, sends keepalives and releases it.
//!
//! Everything is behind one mutex, taken for a post or a poll and never held across an await.
//! Whoever polls the CQ — a `send` waiting for a credit, a `recv`, a `close`, the shard — turns
//! every completion into the shared state (received messages, free slots, credits), so a
//! completion of one direction is never lost to the other: a `SendHalf` waiting for a credit
//! and a `RecvHalf` waiting for a message on two tasks each find what they wait for, whoever
//! reaped it. Waiting goes through the completion channel the connection's shard shares among
//! its connections on the device ([`crate::hub`], registered with every runtime whose tasks
//! wait on one of them, so that a wait never depends on the reactor of another runtime, which
//! may be idle): arm, poll, sleep. The hub reads each event as it comes and wakes the
//! connection's [`Waiters`], one waker for all the futures that wait on the connection, which
//! wakes those a completion may concern; each then looks at the state again. Whoever makes
//! progress also wakes the waiters it helped (a message for the reader, a slot or credit for
//! the first sender in line). Any number of futures may wait (senders in a FIFO line, see
//! [`crate::wait`]); each leaves its line when it completes or is dropped ([`Waiting`]).
//! One-sided operations ([`remote`]) take a send slot, post on the same send queue and wait
//! for their completion in a line of their own. Send and receive slots come from a pool the
//! shard's connections on the device share ([`pool`]), taken at the post and kept as spares
//! after the completion (or, for a received message, once the application is done with it)
//! until the keepalive's next look ([`Wire::tick`]) or the release; the connection's own
//! bounds (`send_depth` data and `ctrl_slots` control work requests in flight, the receives
//! its credits ask for) are counts on its path.
//!
//! The shard can take the verbs objects away at any time ([`Wire::release`]: the connection
//! closed, was lost, or its device was removed); the halves then see why the connection
//! ended, after the messages received before.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use evchan_core::verbs::{
    Error as VerbsError, OwnedCq, OwnedMr, OwnedPd, PostedSlot, QpHandle, Slot, SlotPool, WcStatus,
    WorkCompletion,
};

use crate::cm_map;
use crate::error::{Error, Lost, Result};
use crate::hub::Route;
use crate::proto::{Credits, Kind};
use crate::runtime::removal::Removal;
use crate::runtime::ConnId;
use crate::wait::{Place, Role, Taken, Waiters};

mod budget;
mod pool;
mod remote;
pub(crate) use budget::{Budget, PathBudget};
pub(crate) use pool::{trim_all as trim_pools, PoolUser, SharedPool};
pub(crate) use remote::{Fetch, Fetched, PostBuffer, PostRemote, Poster, RemoteOp};

/// How many completions one poll of the CQ takes.
const POLL_BATCH: usize = 32;
/// Busy poll: empty polls between two clock reads and yields to the runtime.
const SPINS_PER_YIELD: u32 = 64;

/// What a busy poll ended with.
enum Spun<'a> {
    /// Completions came: look again.
    Found(Locked<'a>),
    /// None came; the task yielded to the runtime (and will be polled again): `Pending`.
    Yielded,
    /// Busy polling is off, or its window spent: wait through the reactor.
    Over(Locked<'a>),
}

/// A yield to the runtime that hands the task to no other worker: tokio's `yield_now` wakes
/// it only after the worker has polled its reactor, where a wake of the task by itself while
/// it runs would put it in the run queue and unpark a sibling worker of a multi-thread runtime
/// to steal it (a context switch, on a small machine the CPU the peer needs, per yield). Only
/// the first poll of `yield_now`'s future is needed: it schedules the wake.
///
/// That deferred wake comes only once the scheduler of this thread gets control back, which
/// a future polled by another executor (`futures::executor::block_on` on a tokio worker)
/// never gives it: such a future is woken at once instead. Which wakers are tokio's own is
/// learnt from the shards, which are tokio runtimes ([`note_tokio_waker`]).
fn yield_to_runtime(cx: &mut Context<'_>) {
    if !is_tokio_waker(cx.waker()) {
        cx.waker().wake_by_ref();
        return;
    }
    let yielded = std::pin::pin!(tokio::task::yield_now());
    if std::future::Future::poll(yielded, cx).is_ready() {
        cx.waker().wake_by_ref();
    }
}

/// The vtables of tokio's wakers: a current-thread runtime's `block_on`'s, and a task's.
static TOKIO_WAKERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Notes `waker`, which tokio handed to a task (`task`) or to a current-thread runtime's
/// `block_on`, as tokio's.
pub(crate) fn note_tokio_waker(waker: &Waker, task: bool) {
    let vtable = std::ptr::from_ref(waker.vtable()) as usize;
    TOKIO_WAKERS[usize::from(task)].store(vtable, Ordering::Relaxed);
}

fn is_tokio_waker(waker: &Waker) -> bool {
    let vtable = std::ptr::from_ref(waker.vtable()) as usize;
    TOKIO_WAKERS
        .iter()
        .any(|v| v.load(Ordering::Relaxed) == vtable)
}

/// One future's wait on a connection: its place in its role's line and its busy-poll window.
/// [`Waiting`] leaves the line when the future is done or dropped.
#[derive(Debug, Default)]
pub(crate) struct Wait {
    place: Place,
    /// When the busy poll began.
    spin: Option<Instant>,
    /// The shard's own wait, which looks again on a timer of its own: it does not register
    /// the shard's runtime with the hub (whose reactor would then wake on every event of the
    /// shard's connections for the shard's life).
    pub(crate) timed: bool,
}

impl Wait {
    /// The busy-poll window starts again (a byte stream's wait that was not polled for longer
    /// than the window: the read or write that started it was abandoned, or slept).
    pub(crate) fn restart_spin_if_idle(&mut self, window: Option<Duration>, last: Instant) {
        if window.is_some_and(|w| last.elapsed() > w) {
            self.spin = None;
        }
    }
}

/// A [`Wait`] that leaves its line when dropped: a future's.
#[derive(Debug)]
pub(crate) struct Waiting<'a> {
    wire: &'a Wire,
    role: Role,
    pub(crate) wait: Wait,
}

impl<'a> Waiting<'a> {
    pub(crate) fn new(wire: &'a Wire, role: Role) -> Self {
        Waiting {
            wire,
            role,
            wait: Wait::default(),
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.wire.end_wait(self.role, &mut self.wait);
    }
}

/// The verbs objects of a connection: what [`Wire::release`] takes away.
pub(crate) struct Objects {
    pub(crate) qp: QpHandle,
    /// The protection domain of the QP and the regions (what [`crate::Connection::expose`]
    /// registers on).
    pub(crate) pd: OwnedPd,
    /// The shard's slots of this connection's size on its device, for its sends and its
    /// receives.
    pub(crate) pool: PoolUser,
    /// The CQ's route in its shard's hub: goes before the CQ.
    route: Route,
    pub(crate) cq: OwnedCq,
}

impl Objects {
    pub(crate) fn new(
        qp: QpHandle,
        pd: OwnedPd,
        pool: PoolUser,
        cq: OwnedCq,
        route: Route,
    ) -> Self {
        Self {
            qp,
            pd,
            pool,
            route,
            cq,
        }
    }
}

/// The data path's lock. Letting it go wakes the wakers owed by what was done under it,
/// after the lock: a waker may run code that takes it (see [`crate::wait::Waiters`]). The
/// fields drop in order: the guard (the lock goes), then the wakers taken out of the path by
/// `Drop::drop`, which wake as they go.
struct Locked<'a> {
    guard: MutexGuard<'a, Path>,
    owed: Owed,
}

/// Wakers to wake when dropped (boxed: a lock taken and let go with none, the usual case,
/// moves and drops one word).
#[derive(Default)]
struct Owed(Option<Box<Taken>>);

impl Drop for Owed {
    fn drop(&mut self) {
        if let Some(owed) = self.0.take() {
            owed.wake();
        }
    }
}

impl Deref for Locked<'_> {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.guard
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Path {
        &mut self.guard
    }
}

impl Drop for Locked<'_> {
    #[inline]
    fn drop(&mut self) {
        if !self.guard.owed.is_empty() {
            self.owed.0 = Some(Box::new(std::mem::take(&mut self.guard.owed)));
        }
    }
}

/// A slot's chunk: its registered region, for the post.
type ChunkMr = Arc<OwnedMr<SlotPool>>;

/// The chunk of a received message's slot, not kept registered by the message: its pool
/// keeps the chunk while one of its slots is out, unless the pool itself went (its device
/// removed), and then the message keeps only its bytes.
type WeakMr = std::sync::Weak<OwnedMr<SlotPool>>;

/// What a posted work request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wr {
    Recv,
    Data,
    Ctrl,
    /// A one-sided operation (RDMA WRITE, READ or atomic), from a data slot.
    Remote,
}

/// What the shard hears from a connection's data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// A half found the connection lost (a failed work request, a protocol violation): the
    /// shard disconnects and releases it.
    Lost,
    /// The close the shard waits for is ready (the `FIN` completed, or the connection ended).
    Closable,
    /// No send of ours (nor one-sided operation) is in flight any more (or the connection
    /// ended): a deferred disconnect may go.
    Quiet,
}

/// Where the data path tells its shard.
#[derive(Debug, Clone)]
pub(crate) struct ToShard {
    pub(crate) conn: ConnId,
    pub(crate) tx: mpsc::UnboundedSender<(ConnId, Heard)>,
    /// The runtime's removal state: whatever ends a connection once it retired, the cause is
    /// the removal.
    pub(crate) removal: Arc<Removal>,
}

impl ToShard {
    pub(crate) fn tell(&self, heard: Heard) {
        let _ = self.tx.send((self.conn, heard));
    }
}

/// Why sends (and, after what was received, the reader) stop.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stop {
    /// The peer disconnected cleanly.
    PeerClosed,
    Lost(Lost),
}

/// A connection's data path (see the module's docs).
pub(crate) struct Wire {
    path: Mutex<Path>,
    wakers: Arc<Waiters>,
    /// A completion came since the shard's last keepalive check.
    active: AtomicBool,
    busy_poll: Option<Duration>,
}

impl std::fmt::Debug for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wire").finish_non_exhaustive()
    }
}

struct Path {
    objects: Option<Objects>,
    /// `None` for a plain librdmacm peer (no flow control of ours), and before `ESTABLISHED`.
    credits: Option<Credits>,
    /// Data work requests (messages and one-sided operations) that may still be posted:
    /// `send_depth` less those in flight.
    data_room: u32,
    /// Control messages that may still be posted: `ctrl_slots` less those in flight.
    ctrl_room: u32,
    /// Posted and not completed, in posting order (completions come in that order per queue).
    posted_send: VecDeque<(PostedSlot, Wr, ChunkMr)>,
    /// Slots this connection took from its shard's pool and keeps for its next posts, sends or
    /// receives (with those posted and those unread, never more than `send_depth + recv_depth
    /// + 2 × ctrl_slots`: the rooms and the credits bound what it takes): the pool's lock is
    /// not on every message's path. They go back to the pool at the keepalive's look
    /// ([`Wire::tick`]) and at the release.
    spare: Vec<(ChunkMr, Slot)>,
    /// Work requests from registered buffers (messages and one-sided operations), posted and
    /// not completed, in posting order.
    posted_mr: VecDeque<remote::InFlight>,
    /// Receives posted, in posting order, with their chunks.
    posted_recv: VecDeque<(PostedSlot, ChunkMr)>,
    /// Data received and not yet taken by `recv`.
    received: VecDeque<(WeakMr, Slot)>,
    /// Toward a plain librdmacm peer once open: the receive slots kept posted or unread
    /// (`recv_depth + ctrl_slots`: it has no credits of ours), and how many of them are
    /// unread (received, not yet consumed by the application). Toward an evchan peer its
    /// credits say.
    plain_recvs: Option<(u32, u32)>,
    /// The shard's pool, where slots go back once the objects are gone (the slots of
    /// messages the application still holds); not kept alive by the connection (the shard
    /// drops its pools when its device is removed).
    pool: std::sync::Weak<SharedPool>,
    sends_in_flight: u32,
    /// The wr_id of our posted `FIN`, until it completes.
    fin_wr: Option<u64>,
    /// `FIN` wanted (the send half is gone or shut down, or the connection closes).
    want_fin: bool,
    /// The receive half is alive: what arrives is kept for it (else dropped and credited).
    reader: bool,
    stop: Option<Stop>,
    /// A message sent was not delivered: still in flight when the connection ended, or its
    /// send failed (`close`'s result).
    undelivered: bool,
    /// The largest message this side receives (a local length error names it).
    max_recv: u32,
    /// The runtime the last wait made sure the hub is registered with, and its hold on that
    /// registration.
    watched: Option<(tokio::runtime::Id, crate::hub::Watch)>,
    /// The shard disconnects (which moves the QP to the error state): flushes are expected.
    ending: bool,
    /// A work request was flushed in the batch being handled.
    flushed: bool,
    /// The device name and QP number its async events are routed by, while registered.
    qp_key: Option<(String, u32)>,
    /// Wakers owed, woken when the lock is let go ([`Locked`]).
    owed: Taken,
    to_shard: ToShard,
    wcs: Vec<WorkCompletion>,
    /// One-sided operations posted, by work request id, whose futures wait: `None` until the
    /// completion, then what it brought. A dropped future's entry goes (its slot comes back at
    /// the completion all the same).
    remote: crate::runtime::IntMap<u64, remote::Entry>,
    /// A one-sided operation completed, or a data slot came back, since the last wake of the
    /// one-sided operations' line.
    remote_news: bool,
    /// One-sided operations posted and not completed (whether or not their futures wait).
    remote_in_flight: u32,
    /// The RDMA READs and atomics the peer takes at once, as the connection's setup said: 0
    /// refuses them (a READ the peer never answers would hold the send queue).
    reads: u8,
    /// A listener's connection under `Config::memory_budget`: the slots it holds, counted
    /// ([`budget`]); until the release.
    budget: Option<PathBudget>,
    /// The budget refused a receive the credits asked for: asked again after the next
    /// completions.
    recv_starved: bool,
}

impl Wire {
    /// The data path of a new connection: its objects, its send slots, and its receives, all
    /// posted already. It is not open (no credits) until [`open`](Self::open).
    pub(crate) fn new(
        objects: Objects,
        data_room: u32,
        ctrl_room: u32,
        posted_recv: Vec<(PostedSlot, ChunkMr)>,
        max_recv: u32,
        busy_poll: Option<Duration>,
        to_shard: ToShard,
    ) -> Arc<Self> {
        let wakers = Arc::clone(objects.route.waiters());
        let pool = Arc::downgrade(&objects.pool.shared());
        Arc::new(Wire {
            path: Mutex::new(Path {
                objects: Some(objects),
                credits: None,
                data_room,
                ctrl_room,
                posted_send: VecDeque::new(),
                spare: Vec::new(),
                posted_mr: VecDeque::new(),
                posted_recv: posted_recv.into(),
                received: VecDeque::new(),
                plain_recvs: None,
                pool,
                sends_in_flight: 0,
                fin_wr: None,
                want_fin: false,
                reader: true,
                stop: None,
                undelivered: false,
                max_recv,
                watched: None,
                ending: false,
                flushed: false,
                qp_key: None,
                owed: Taken::default(),
                to_shard,
                wcs: Vec::with_capacity(POLL_BATCH),
                remote: crate::runtime::IntMap::default(),
                remote_news: false,
                remote_in_flight: 0,
                reads: 0,
                budget: None,
                recv_starved: false,
            }),
            wakers,
            active: AtomicBool::new(false),
            busy_poll,
        })
    }

    fn lock(&self) -> Locked<'_> {
        Locked {
            guard: self.path.lock().unwrap_or_else(PoisonError::into_inner),
            owed: Owed::default(),
        }
    }

    /// Reaps what the CQ has; wakes the waiters that it helped, but `me` (the caller's role and
    /// place, or none); how many completions there were.
    fn progress(&self, path: &mut Path, me: Option<(Role, Place)>) -> usize {
        let n = path.progress();
        if n > 0 {
            self.active.store(true, Ordering::Relaxed);
            self.wake_helped(path, me);
        }
        n
    }

    /// Owes the waiters that `path`'s state concerns a wake (woken when the lock goes).
    fn wake_helped(&self, path: &mut Path, me: Option<(Role, Place)>) {
        let mut mask = 0u8;
        if !path.received.is_empty() || path.recv_end().is_some() {
            mask |= Role::Recv.bit();
        }
        if path.can_send() || path.stop.is_some() {
            mask |= Role::Send.bit();
        }
        // The closers: `close` waits to be ready, the shard's deferred disconnect for quiet.
        if path.close_ready() || !path.sending() {
            mask |= Role::Close.bit();
        }
        if std::mem::take(&mut path.remote_news) || path.stop.is_some() {
            mask |= Role::Remote.bit();
        }
        self.wakers.wake_lines(mask, me, &mut path.owed);
    }

    /// Makes progress, or sleeps: `Ready` once something was reaped (or the connection
    /// ended), `Pending` with the waker registered at `wait`'s place in `role`'s line and the
    /// CQ armed.
    fn poll_progress(
        &self,
        path: &mut Path,
        role: Role,
        wait: &mut Wait,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        if self.progress(path, Some((role, wait.place))) > 0 {
            return Poll::Ready(Ok(()));
        }
        self.wakers.wait(role, &mut wait.place, cx.waker());
        match path.poll_wait(!wait.timed) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.active.store(true, Ordering::Relaxed);
                    self.wake_helped(path, Some((role, wait.place)));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }

    /// The future of `wait` is done (or dropped): it leaves `role`'s line, and the next in
    /// line is woken when it was first.
    pub(crate) fn end_wait(&self, role: Role, wait: &mut Wait) {
        wait.spin = None;
        self.wakers.leave(role, &mut wait.place);
    }

    // -----------------------------------------------------------------------------------
    // The halves
    // -----------------------------------------------------------------------------------

    /// Posts a copy of `data` as one message once it is `wait`'s turn among the senders and a
    /// send slot and (toward an evchan peer) a credit are free; `Pending` until then, with
    /// nothing posted. Senders go in the order they began to wait; `Ready` ends the wait
    /// (the next sender in line is woken).
    pub(crate) fn poll_send(
        &self,
        cx: &mut Context<'_>,
        data: &[u8],
        wait: &mut Wait,
    ) -> Poll<Result<()>> {
        self.poll_send_with(cx, wait, &mut |path| path.post_data(data))
    }

    /// [`poll_send`](Self::poll_send) of the first `len` bytes of the registered buffer in
    /// `mr`, zero-copy: `Ready(Ok(id))` once posted (the buffer is then with the device until
    /// the completion of the work request `id`, which [`poll_remote`](Self::poll_remote) with
    /// [`Poster::Posted`] waits for); on an error the buffer stays in `mr`.
    pub(crate) fn poll_send_buffer(
        &self,
        cx: &mut Context<'_>,
        mr: &mut Option<OwnedMr<Vec<u8>>>,
        len: usize,
        wait: &mut Wait,
    ) -> Poll<Result<u64>> {
        // The wait for the completion needs the runtime's reactor: known before posting, so
        // that the buffer comes back with the error rather than staying with the device.
        if let Err(e) = self.lock().watch_here() {
            return Poll::Ready(Err(e));
        }
        let mut id = None;
        let r = std::task::ready!(self.poll_send_with(cx, wait, &mut |path| {
            path.post_data_buffer(mr, len, &mut id)
        }));
        Poll::Ready(r.map(|()| id.expect("posted")))
    }

    fn poll_send_with(
        &self,
        cx: &mut Context<'_>,
        wait: &mut Wait,
        post: &mut dyn FnMut(&mut Path) -> Posted,
    ) -> Poll<Result<()>> {
        let mut path = self.lock();
        let done = loop {
            if let Some(e) = path.send_error() {
                break Err(e);
            }
            if !self
                .wakers
                .turn_or_wait(Role::Send, &mut wait.place, cx.waker())
            {
                // Another sender is first: it drives the CQ, and hands the turn on.
                return Poll::Pending;
            }
            if path.can_send() {
                match post(&mut path) {
                    Posted::Yes => break Ok(()),
                    Posted::Failed => continue,
                    Posted::QueueFull => {}
                }
            }
            match self.busy_poll(path, Role::Send, wait, cx) {
                Spun::Found(p) => {
                    path = p;
                    continue;
                }
                Spun::Yielded => return Poll::Pending,
                Spun::Over(p) => path = p,
            }
            if let Err(e) = std::task::ready!(self.poll_progress(&mut path, Role::Send, wait, cx)) {
                break Err(e);
            }
        };
        drop(path);
        self.end_wait(Role::Send, wait);
        Poll::Ready(done)
    }

    /// Busy polling (when `Config::busy_poll` is on and `wait`'s window, which began at its
    /// first spin, is not spent): up to [`SPINS_PER_YIELD`] polls of the CQ, then a yield.
    /// `role`: the waiter spinning (it is not woken for what it reaps itself).
    fn busy_poll<'a>(
        &'a self,
        mut path: Locked<'a>,
        role: Role,
        wait: &mut Wait,
        cx: &mut Context<'_>,
    ) -> Spun<'a> {
        let Some(window) = self.busy_poll else {
            return Spun::Over(path);
        };
        let start = *wait.spin.get_or_insert_with(Instant::now);
        if start.elapsed() >= window {
            return Spun::Over(path);
        }
        for _ in 0..SPINS_PER_YIELD {
            if self.progress(&mut path, Some((role, wait.place))) > 0 {
                return Spun::Found(path);
            }
            drop(path);
            std::hint::spin_loop();
            path = self.lock();
        }
        drop(path);
        yield_to_runtime(cx);
        Spun::Yielded
    }

    /// The next message, `None` once the peer closed cleanly; waits (busy within `wait`'s
    /// busy-poll window, then through the reactor). `Ready` ends the wait.
    pub(crate) fn poll_recv(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        wait: &mut Wait,
    ) -> Poll<Result<Option<Bytes>>> {
        let mut path = self.lock();
        let done = loop {
            if let Some((mr, slot)) = path.received.pop_front() {
                let buf = RecvBuf {
                    slot: Some((mr, slot)),
                    wire: Arc::clone(self),
                };
                break Ok(Some(Bytes::from_owner(buf)));
            }
            if let Some(end) = path.recv_end() {
                break end;
            }
            match self.busy_poll(path, Role::Recv, wait, cx) {
                Spun::Found(p) => {
                    path = p;
                    continue;
                }
                Spun::Yielded => return Poll::Pending,
                Spun::Over(p) => path = p,
            }
            if let Err(e) = std::task::ready!(self.poll_progress(&mut path, Role::Recv, wait, cx)) {
                break Err(e);
            }
        };
        drop(path);
        self.end_wait(Role::Recv, wait);
        Poll::Ready(done)
    }

    /// The send half is gone or shut down: `FIN` after what was sent, now or when a control
    /// credit comes.
    pub(crate) fn shutdown(&self) {
        let mut path = self.lock();
        path.want_fin = true;
        path.flush_ctrl();
    }

    /// The receive half is gone: what it did not take, and what comes, is dropped and
    /// credited at once.
    pub(crate) fn recv_dropped(&self) {
        let mut path = self.lock();
        path.reader = false;
        while let Some((mr, slot)) = path.received.pop_front() {
            path.consumed(mr, slot);
        }
        path.flush_ctrl();
    }

    /// A received message's slot back from the application (its last `Bytes` dropped).
    fn give_back(&self, mr: WeakMr, slot: Slot) {
        let mut path = self.lock();
        path.consumed(mr, slot);
        path.flush_ctrl();
    }

    /// Posts the `FIN` after everything sent (unless posted already) and waits for its
    /// completion (toward a plain peer: for every send's); `Ready` then, or once the
    /// connection ended. Used by `close` and by the shard's background close, each with its
    /// own `wait` in the closers' line.
    pub(crate) fn poll_close(&self, cx: &mut Context<'_>, wait: &mut Wait) -> Poll<Result<()>> {
        let mut path = self.lock();
        if !path.want_fin {
            path.want_fin = true;
            path.flush_ctrl();
        }
        self.poll_closer(path, cx, wait, Path::close_ready)
    }

    /// `Ready` once no send of ours (nor the `FIN`, nor a one-sided operation) is in flight, or
    /// the connection ended.
    pub(crate) fn poll_quiet(&self, cx: &mut Context<'_>, wait: &mut Wait) -> Poll<Result<()>> {
        let path = self.lock();
        self.poll_closer(path, cx, wait, |p| !p.sending() || p.objects.is_none())
    }

    /// A closer's wait (in the closers' line) until `done`.
    fn poll_closer(
        &self,
        mut path: Locked<'_>,
        cx: &mut Context<'_>,
        wait: &mut Wait,
        done: impl Fn(&Path) -> bool,
    ) -> Poll<Result<()>> {
        let result = loop {
            if done(&path) {
                break Ok(());
            }
            if let Err(e) = std::task::ready!(self.poll_progress(&mut path, Role::Close, wait, cx))
            {
                break Err(e);
            }
        };
        drop(path);
        self.end_wait(Role::Close, wait);
        Poll::Ready(result)
    }

    // -----------------------------------------------------------------------------------
    // The shard
    // -----------------------------------------------------------------------------------

    /// The connection's slots count in its listener's memory budget from now on (set before
    /// it opens).
    pub(crate) fn set_budget(&self, budget: PathBudget) {
        self.lock().budget = Some(budget);
    }

    /// `ESTABLISHED`: the peer's handshake decided the credits (`None`: a plain peer, whose
    /// receives are then posted up to `plain_recvs`). `reads`: the RDMA READs and atomics the
    /// peer takes at once (0: none).
    pub(crate) fn open(&self, credits: Option<Credits>, plain_recvs: u32, reads: u8) {
        let mut path = self.lock();
        if credits.is_none() {
            path.plain_recvs = Some((plain_recvs, 0));
        }
        path.credits = credits;
        path.reads = reads;
        path.top_up();
    }

    /// Whether the close can go on: the `FIN` (or, toward a plain peer, every send) completed,
    /// or the connection ended. Reaps first.
    pub(crate) fn close_ready(&self) -> bool {
        let mut path = self.lock();
        if !path.want_fin {
            path.want_fin = true;
            path.flush_ctrl();
        }
        self.progress(&mut path, None);
        path.close_ready()
    }

    /// Whether sends of ours (or the `FIN`, or one-sided operations) are in flight. Reaps
    /// first.
    pub(crate) fn sending(&self) -> bool {
        let mut path = self.lock();
        self.progress(&mut path, None);
        path.objects.is_some() && path.sending()
    }

    /// The peer disconnected. `removed`: the cause was (or is now) a device removal; `closing`:
    /// this side asked to close. What the CQ has is reaped first, so that messages that came
    /// before are delivered.
    pub(crate) fn peer_disconnected(&self, removed: Option<Lost>, closing: bool) {
        let mut path = self.lock();
        path.progress();
        let lost = removed.or_else(|| {
            let fin = path.credits.as_ref().is_none_or(Credits::fin_received);
            (!closing && !fin).then_some(Lost::Disconnected)
        });
        let stop = match lost {
            Some(l) => Stop::Lost(l),
            None if closing => Stop::Lost(Lost::Closed),
            None => Stop::PeerClosed,
        };
        path.stop.get_or_insert(stop);
        self.wake_helped(&mut path, None);
    }

    /// The shard destroyed the id (and with it the QP): the objects go now, and whoever waits
    /// learns why the connection ended (`why`, unless it ended already).
    pub(crate) fn release(&self, why: Lost) {
        let objects = {
            let mut path = self.lock();
            // What completed before goes to its owner first (a one-sided operation that took
            // effect is then not reported failed); the QP's end is expected, its flushes are
            // no loss.
            path.ending = true;
            path.progress();
            if path.sends_in_flight > 0 {
                path.undelivered = true;
            }
            if why == Lost::DeviceRemoved
                && path.stop == Some(Stop::Lost(Lost::QpError { event: None }))
            {
                // The removal flushed the QP: it is the cause.
                path.stop = Some(Stop::Lost(Lost::DeviceRemoved));
            }
            path.stop.get_or_insert(Stop::Lost(why));
            // The QP is destroyed: the slots of its sends and receives come back to the
            // shard's pool (those a failed destroy keeps are lost, and their chunk stays).
            let p = &mut *path;
            if let Some(objects) = &p.objects {
                let sends = p.posted_send.drain(..).map(|(posted, _, _)| posted);
                let recvs = p.posted_recv.drain(..).map(|(posted, _)| posted);
                for posted in sends.chain(recvs) {
                    if let Ok(slot) = objects.qp.reclaim(posted) {
                        objects.pool.pool().give(slot);
                    }
                }
            }
            path.posted_send.clear();
            path.return_spare();
            // The QP is destroyed: the device is done with these buffers (each is
            // deregistered, then freed; a future still waiting learns that the connection
            // ended, without its buffer).
            path.posted_mr.clear();
            path.posted_recv.clear();
            path.remote_in_flight = 0;
            // What the connection still holds no longer counts (what the application holds is
            // its own).
            path.budget = None;
            if let Some((device, qp_num)) = path.qp_key.take() {
                crate::runtime::qp_events::unregister(&device, qp_num, self);
            }
            let objects = path.objects.take();
            self.wake_helped(&mut path, None);
            objects
        };
        // The registration, the regions and the CQ go outside the lock.
        drop(objects);
    }

    /// `Config::busy_poll`'s window.
    pub(crate) fn busy_poll_window(&self) -> Option<Duration> {
        self.busy_poll
    }

    /// The QP's async events, read on `device`, come to this connection (see
    /// [`qp_events`](crate::runtime::qp_events)).
    pub(crate) fn route_qp_events(self: &Arc<Self>, device: &str) {
        let mut path = self.lock();
        if let Some(objects) = &path.objects {
            let qp_num = objects.qp.qp_num();
            crate::runtime::qp_events::register(device, qp_num, self);
            path.qp_key = Some((device.to_owned(), qp_num));
        }
    }

    /// A fatal async event of the QP: what came before is reaped (and delivered), then the
    /// connection is lost.
    pub(crate) fn on_qp_event(&self, kind: evchan_core::verbs::AsyncEventKind) {
        let mut path = self.lock();
        if path.ending {
            // The shard disconnects it already: a provider's event of the teardown.
            return;
        }
        path.progress();
        path.lose(Lost::QpError { event: Some(kind) });
        self.wake_helped(&mut path, None);
    }

    /// Routes an event of `kind` to this connection's QP as the runtime routes the devices'
    /// events (a test door); `false` when its QP is not registered.
    pub(crate) fn route_qp_event(&self, kind: evchan_core::verbs::AsyncEventKind) -> bool {
        let key = self.lock().qp_key.clone();
        match key {
            Some((device, qp_num)) => crate::runtime::qp_events::route(&device, qp_num, kind),
            None => false,
        }
    }

    /// The shard is about to disconnect: the flushes that follow are no loss.
    pub(crate) fn ending(&self) {
        self.lock().ending = true;
    }

    /// Moves the QP to the error state (a test door: see
    /// [`Connection::__force_qp_error`](crate::Connection::__force_qp_error)).
    pub(crate) fn force_qp_error(&self) -> Result<()> {
        let path = self.lock();
        match &path.objects {
            Some(objects) => objects.qp.modify_to_error().map_err(Error::Verbs),
            None => Ok(()),
        }
    }

    /// Whether a completion came since the last call.
    pub(crate) fn take_active(&self) -> bool {
        self.active.swap(false, Ordering::Relaxed)
    }

    /// Reaps, posts the receives the credits ask for, and posts a keepalive when `due` (a
    /// control message that returns nothing); `false` when the connection is lost.
    pub(crate) fn tick(&self, due: bool) -> bool {
        let mut path = self.lock();
        self.progress(&mut path, None);
        if due {
            // Idle: the credits' window back to its start (the receives posted stay).
            if let Some(credits) = path.credits.as_mut() {
                credits.quiet();
            }
            path.keepalive();
        }
        // Receives a pool out of memory could not give before, and grants not told yet.
        path.top_up();
        path.flush_ctrl();
        path.tell_grants();
        path.return_spare();
        path.stop.is_none()
    }

    /// The data path's state in one line, for a test that waited too long (a test door: see
    /// [`Connection::__probe`](crate::Connection::__probe)). `kick`: reap the CQ first, and
    /// say how many completions were there (so a missed wake-up shows as completions found).
    pub(crate) fn probe(&self, kick: bool) -> String {
        // Never blocks: a probe of a connection whose lock is held for good (a deadlock) says
        // so instead of hanging the test that asks.
        let guard = (0..100).find_map(|_| match self.path.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(Duration::from_millis(10));
                None
            }
        });
        let Some(guard) = guard else {
            return "the data path's lock is held (for over a second)".into();
        };
        let mut path = Locked {
            guard,
            owed: Owed::default(),
        };
        let reaped = if kick {
            format!("reaped {}; ", self.progress(&mut path, None))
        } else {
            String::new()
        };
        let p = &*path;
        let sends: Vec<Wr> = p.posted_send.iter().map(|(_, w, _)| *w).collect();
        let lines: Vec<(Role, (usize, usize))> = crate::wait::Role::ALL
            .iter()
            .map(|r| (*r, self.wakers.line_state(*r)))
            .collect();
        format!(
            "{reaped}waiting (futures, not woken) {lines:?}, objects {}, stop {:?}, credits {:?}, plain {:?}, data_room {}, \
             ctrl_room {}, sends_in_flight {}, posted_send {sends:?}, posted_recv {}, \
             received {}, spare {}, fin_wr {:?}, want_fin {}, reader {}, ending {}, \
             watched {:?}, remote_in_flight {}, budget's slots held {:?}, recv_starved {}",
            p.objects.is_some(),
            p.stop,
            p.credits,
            p.plain_recvs,
            p.data_room,
            p.ctrl_room,
            p.sends_in_flight,
            p.posted_recv.len(),
            p.received.len(),
            p.spare.len(),
            p.fin_wr,
            p.want_fin,
            p.reader,
            p.ending,
            p.watched.as_ref().map(|(id, w)| (id, w.is_dead())),
            p.remote_in_flight,
            p.budget.as_ref().map(PathBudget::held),
            p.recv_starved,
        )
    }

    /// What [`Connection::close`](crate::Connection::close) returns once the shard has
    /// released the connection (`released`), or once the shard is gone (`gone`: why).
    pub(crate) fn close_result(&self, released: bool, gone: Lost) -> Result<()> {
        let path = self.lock();
        match &path.stop {
            Some(Stop::Lost(why)) if *why != Lost::Closed => {
                Err(Error::ConnectionLost(why.clone()))
            }
            _ if !released => Err(Error::ConnectionLost(gone)),
            // Ended without a loss of its own, but something sent did not arrive: the peer
            // disconnected during the close, before what was sent went out.
            _ if path.undelivered => Err(Error::ConnectionLost(Lost::Disconnected)),
            _ => Ok(()),
        }
    }
}

/// What [`Path::try_take_slot`] found.
enum Take {
    Got((ChunkMr, Slot)),
    /// The memory budget has no room for another slot ([`PathBudget::take`]).
    Refused,
    /// The pool could not make one.
    Failed(Error),
}

/// How posting one message went.
enum Posted {
    Yes,
    /// The send queue is full, or the memory budget has no room for a slot: wait for a
    /// completion.
    QueueFull,
    /// The post failed: the connection is lost (the caller sees why).
    Failed,
}

impl Path {
    fn recv_end(&self) -> Option<Result<Option<Bytes>>> {
        if self.credits.as_ref().is_some_and(Credits::fin_received) {
            return Some(Ok(None));
        }
        match &self.stop {
            None => None,
            Some(Stop::PeerClosed) => Some(Ok(None)),
            Some(Stop::Lost(l)) => Some(Err(Error::ConnectionLost(l.clone()))),
        }
    }

    fn send_error(&self) -> Option<Error> {
        match &self.stop {
            None => None,
            Some(Stop::PeerClosed) => Some(Error::PeerClosed),
            Some(Stop::Lost(l)) => Some(Error::ConnectionLost(l.clone())),
        }
    }

    fn can_send(&self) -> bool {
        self.data_room > 0 && self.credits.as_ref().is_none_or(Credits::can_send_data)
    }

    fn sending(&self) -> bool {
        self.sends_in_flight > 0 || self.fin_wr.is_some() || self.remote_in_flight > 0
    }

    fn close_ready(&self) -> bool {
        if self.stop.is_some() || self.objects.is_none() {
            return true;
        }
        match &self.credits {
            Some(c) => c.fin_sent() && self.fin_wr.is_none(),
            None => self.sends_in_flight == 0 && self.remote_in_flight == 0,
        }
    }

    fn lose(&mut self, why: Lost) {
        if let Some(Stop::Lost(Lost::QpError { event })) = &self.stop {
            // Flushes, or an async event, said only that the QP failed: a more specific cause
            // that follows is the cause — the failed work request (a device may report the
            // event before it writes the error completion), or, after flushes, the event or
            // the device's removal.
            let more_specific = match why {
                Lost::WorkCompletion(_) => true,
                Lost::QpError { event: Some(_) } | Lost::DeviceRemoved => event.is_none(),
                _ => false,
            };
            if more_specific {
                self.stop = Some(Stop::Lost(self.removed_or(why)));
            }
            return;
        }
        if self.stop.is_some() {
            return;
        }
        let why = self.removed_or(why);
        tracing::debug!(conn = ?self.to_shard.conn, %why, "connection lost");
        self.stop = Some(Stop::Lost(why));
        if self.sends_in_flight > 0 {
            self.undelivered = true;
        }
        self.to_shard.tell(Heard::Lost);
    }

    /// `why`, or the device removal once the runtime retired for one.
    fn removed_or(&self, why: Lost) -> Lost {
        if self.to_shard.removal.is_retired() {
            Lost::DeviceRemoved
        } else {
            why
        }
    }

    /// Copies `data` into a free send slot and posts it (the caller checked [`can_send`]).
    fn post_data(&mut self, data: &[u8]) -> Posted {
        debug_assert!(self.data_room > 0, "checked by can_send");
        // (Without objects, no slot: the connection has stopped.)
        let (mr, mut slot) = match self.take_slot(Wr::Data) {
            Ok(taken) => taken,
            Err(wait_or_failed) => return wait_or_failed,
        };
        if let Err(e) = slot.copy_from(data) {
            self.put_slot(mr, slot);
            self.lose(Lost::Verbs(e.to_string()));
            return Posted::Failed;
        }
        let saved = self.credits.clone();
        let imm = self.credits.as_mut().and_then(Credits::send_data);
        let Some(objects) = &self.objects else {
            unreachable!("checked above, and only the shard's release takes them");
        };
        match objects.qp.post_send_slot(mr.mr(), slot, imm) {
            Ok(posted) => {
                self.data_room -= 1;
                self.sends_in_flight += 1;
                self.posted_send.push_back((posted, Wr::Data, mr));
                Posted::Yes
            }
            Err(e) if e.is_queue_full() => {
                self.credits = saved;
                self.put_slot(mr, e.slot);
                Posted::QueueFull
            }
            Err(e) => {
                self.put_slot(mr, e.slot);
                self.lose(post_failed(&e.error));
                Posted::Failed
            }
        }
    }

    /// Posts the first `len` bytes of the registered buffer `mr` as a message, zero-copy, in a
    /// data work request's room (the caller checked [`can_send`]);
    /// `id`: its work request id, whose entry in [`Path::remote`] waits for the completion.
    fn post_data_buffer(
        &mut self,
        mr: &mut Option<OwnedMr<Vec<u8>>>,
        len: usize,
        id: &mut Option<u64>,
    ) -> Posted {
        // (`send_error` was checked first: without objects the connection has stopped.)
        let Some(objects) = &self.objects else {
            return Posted::Failed;
        };
        let Some(buffer) = mr.take() else {
            unreachable!("a buffer is posted once");
        };
        debug_assert!(self.data_room > 0, "checked by can_send");
        let saved = self.credits.clone();
        let imm = self.credits.as_mut().and_then(Credits::send_data);
        match objects.qp.post_send_mr(buffer, len, imm) {
            Ok(posted) => {
                let wr_id = posted.wr_id();
                self.data_room -= 1;
                self.sends_in_flight += 1;
                self.posted_mr.push_back(remote::InFlight::new(posted));
                self.remote
                    .insert(wr_id, remote::Entry::new(Fetch::Nothing));
                *id = Some(wr_id);
                Posted::Yes
            }
            Err(e) => {
                self.credits = saved;
                let queue_full = e.is_queue_full();
                *mr = Some(e.mr);
                if queue_full {
                    return Posted::QueueFull;
                }
                self.lose(post_failed(&e.error));
                Posted::Failed
            }
        }
    }

    /// Posts a control message with immediate data `imm` (no payload) in a control work
    /// request's room: its work request id; `None` when there is no room or the queue is full,
    /// or the post failed (the connection is then lost).
    fn post_ctrl(&mut self, imm: u32) -> Option<u64> {
        if self.objects.is_none() || self.ctrl_room == 0 {
            return None;
        }
        let (mr, slot) = self.take_slot(Wr::Ctrl).ok()?;
        let objects = self.objects.as_ref()?;
        match objects.qp.post_send_slot(mr.mr(), slot, Some(imm)) {
            Ok(p) => {
                let wr_id = p.wr_id();
                self.ctrl_room -= 1;
                self.posted_send.push_back((p, Wr::Ctrl, mr));
                Some(wr_id)
            }
            Err(e) if e.is_queue_full() => {
                self.put_slot(mr, e.slot);
                None
            }
            Err(e) => {
                self.put_slot(mr, e.slot);
                self.lose(post_failed(&e.error));
                None
            }
        }
    }

    /// Credit updates that are due, and the `FIN` once wanted, from the control slots.
    fn flush_ctrl(&mut self) {
        while self.stop.is_none() && self.ctrl_room > 0 {
            let Some(credits) = self.credits.as_mut() else {
                return;
            };
            let saved = credits.clone();
            let (imm, fin) = if let Some(imm) = credits.credit_update() {
                (imm, false)
            } else if self.want_fin {
                match credits.send_fin() {
                    Some(imm) => (imm, true),
                    None => return,
                }
            } else {
                return;
            };
            match self.post_ctrl(imm) {
                Some(wr_id) if fin => self.fin_wr = Some(wr_id),
                Some(_) => {}
                None => {
                    self.credits = Some(saved);
                    return;
                }
            }
        }
    }

    /// A keepalive: a control message that returns nothing new, when a control credit is free
    /// (else the confirmations it waits for say the same soon).
    fn keepalive(&mut self) {
        if self.post_credit(Credits::keepalive) {
            tracing::trace!(conn = ?self.to_shard.conn, "keepalive");
        }
    }

    /// A credit update with the grants the peer has not been told yet, if any (the keepalive's
    /// look: a grant below [`Credits::credit_update`]'s thresholds waits no longer than that).
    fn tell_grants(&mut self) {
        self.post_credit(Credits::grant_update);
    }

    /// Posts the control message `make` decides on, if any, in a control work request's room
    /// (the credits as they were when it cannot go); whether it went.
    fn post_credit(&mut self, make: impl FnOnce(&mut Credits) -> Option<u32>) -> bool {
        if self.stop.is_some() || self.ctrl_room == 0 {
            return false;
        }
        let Some(credits) = self.credits.as_mut() else {
            return false;
        };
        let saved = credits.clone();
        let Some(imm) = make(credits) else {
            return false;
        };
        if self.post_ctrl(imm).is_none() {
            self.credits = Some(saved);
            return false;
        }
        true
    }

    /// Posts a receive; `false` (the slot kept as a spare) when the connection has stopped,
    /// or the post failed (the connection is then lost).
    fn post_recv(&mut self, mr: ChunkMr, slot: Slot) -> bool {
        let Some(objects) = &self.objects else {
            self.put_slot(mr, slot);
            return false;
        };
        if self.stop.is_some() {
            self.put_slot(mr, slot);
            return false;
        }
        match objects.qp.post_recv_slot(mr.mr(), slot) {
            Ok(p) => {
                self.posted_recv.push_back((p, mr));
                true
            }
            Err(e) => {
                self.put_slot(mr, e.slot);
                self.lose(post_failed(&e.error));
                false
            }
        }
    }

    /// Posts the receives the credits ask for (toward a plain peer: up to its count), each
    /// granted once posted; as many as the pool gives.
    fn top_up(&mut self) {
        let wanted = match (&self.credits, self.plain_recvs) {
            (Some(credits), _) => credits.receives_wanted(),
            (None, Some((n, unread))) => {
                let posted = u32::try_from(self.posted_recv.len()).unwrap_or(u32::MAX);
                n.saturating_sub(posted.saturating_add(unread))
            }
            (None, None) => 0,
        };
        self.recv_starved = false;
        for _ in 0..wanted {
            // Below the first receives posted, a slot is taken beyond the memory budget (else
            // a peer could be left without a grant, and this side without a message to wake
            // it); each arrival tops up again. Toward a plain peer (no credits: it sends when
            // it likes), always.
            let floor = self.credits.is_none()
                || self
                    .budget
                    .as_ref()
                    .is_some_and(|b| self.posted_recv.len() < b.first_recvs() as usize);
            // A pool that cannot grow (the memory lock limit, say) grants nothing more for now
            // (safe: the peer waits), and the keepalive's look tries again; a budget without
            // room, the next completions.
            let (mr, slot) = match self.try_take_slot(floor) {
                Some(Take::Got(taken)) => taken,
                Some(Take::Refused) => {
                    self.recv_starved = true;
                    return;
                }
                Some(Take::Failed(e)) => {
                    tracing::debug!("no receive slot for now: {e}");
                    return;
                }
                None => return,
            };
            if !self.post_recv(mr, slot) {
                return;
            }
            if let Some(credits) = self.credits.as_mut() {
                credits.granted(1);
            }
        }
    }

    /// A data message's slot is free again: kept as a spare (given back to the pool when its
    /// chunk is gone from it, or dropped with the pool), and the receives topped up.
    fn consumed(&mut self, mr: WeakMr, slot: Slot) {
        if let Some(credits) = self.credits.as_mut() {
            credits.consumed();
        }
        if let Some((_, unread)) = self.plain_recvs.as_mut() {
            *unread = unread.saturating_sub(1);
        }
        match mr.upgrade() {
            Some(mr) => self.put_slot(mr, slot),
            None => self.give_to_pool(slot),
        }
        self.top_up();
    }

    /// Polls the CQ until it is empty (at most a few batches), then handles what came; how
    /// many completions.
    fn progress(&mut self) -> usize {
        let mut total = 0;
        for _ in 0..4 {
            let (Some(objects), wcs) = (&self.objects, &mut self.wcs) else {
                return total;
            };
            let n = match objects.cq.cq().poll(wcs, POLL_BATCH) {
                Ok(n) => n,
                Err(e) => {
                    self.lose(Lost::Verbs(e.to_string()));
                    0
                }
            };
            total += n;
            self.absorb();
            if n < POLL_BATCH {
                break;
            }
        }
        total
    }

    /// The completions in `wcs`, handled.
    fn absorb(&mut self) {
        let mut wcs = std::mem::take(&mut self.wcs);
        for wc in wcs.drain(..) {
            self.on_wc(&wc);
        }
        self.wcs = wcs;
        // A flush while the connection is not ending: the QP entered the error state with no
        // failed work request of ours to say why (a failed one in the same batch said it).
        if std::mem::take(&mut self.flushed) && !self.ending {
            self.lose(Lost::QpError { event: None });
        }
        if self.recv_starved {
            self.top_up();
        }
        self.flush_ctrl();
    }

    /// Makes sure the hub is registered with the current runtime's reactor, and finishes a
    /// drain left to this runtime's next wait ([`crate::hub::Watch`]); the wakers that drain
    /// found are owed (woken once the lock goes: a waker may take it).
    ///
    /// # Errors
    /// [`Error::Config`] outside a tokio runtime, on one without its I/O driver, or on one
    /// that is shutting down.
    fn watch_here(&mut self) -> Result<()> {
        let Some(objects) = self.objects.as_ref() else {
            return Ok(());
        };
        let runtime = current_runtime()?;
        let live = self
            .watched
            .as_ref()
            .is_some_and(|(id, w)| *id == runtime && !w.is_dead());
        let mut found = Vec::new();
        if !live {
            let (w, first) = objects.route.hub().watch(runtime)?;
            found = first;
            self.watched = Some((runtime, w));
        }
        let (_, w) = self.watched.as_ref().expect("set above");
        w.resume(objects.route.cq(), &mut found);
        let dead = w.is_dead();
        for w in found {
            self.owed.push(w);
        }
        if dead {
            // The runtime shut down under the drain.
            self.watched = None;
            return Err(Error::Config(
                "the tokio runtime of this wait is shutting down".into(),
            ));
        }
        Ok(())
    }

    /// Arms the CQ and polls it once more: `Ready` with the completions found (handled),
    /// `Pending` when none came — then the CQ's next completion raises an event on the shard's
    /// hub, which wakes the waiters (registered before this call), and the hub is registered
    /// with the current runtime's reactor (see [`crate::hub`]) unless `watch` is false.
    /// `watch`: make sure of the registration (all but the shard's own timed waits).
    fn poll_wait(&mut self, watch: bool) -> Poll<Result<usize>> {
        if self.objects.is_none() {
            return Poll::Ready(Ok(0));
        }
        if watch {
            self.watch_here()?;
        }
        let objects = self.objects.as_ref().expect("checked above");
        if let Err(e) = objects.cq.cq().req_notify(false) {
            self.lose(Lost::Verbs(e.to_string()));
            return Poll::Ready(Ok(0));
        }
        match self.progress() {
            0 => Poll::Pending,
            n => Poll::Ready(Ok(n)),
        }
    }

    /// The posted work request `wc` completes, out of its queue: the queue's first (anywhere
    /// in it all the same, should a completion ever come out of order), with its slot's chunk.
    fn take_posted(&mut self, wc: &WorkCompletion) -> Option<(PostedSlot, Wr, ChunkMr)> {
        let wr_id = wc.wr_id();
        if self
            .posted_send
            .front()
            .is_some_and(|(p, _, _)| p.wr_id() == wr_id)
        {
            return self.posted_send.pop_front();
        }
        let recv = |(p, mr)| (p, Wr::Recv, mr);
        if self
            .posted_recv
            .front()
            .is_some_and(|(p, _)| p.wr_id() == wr_id)
        {
            return self.posted_recv.pop_front().map(recv);
        }
        if let Some(i) = self
            .posted_send
            .iter()
            .position(|(p, _, _)| p.wr_id() == wr_id)
        {
            return self.posted_send.remove(i);
        }
        let i = self
            .posted_recv
            .iter()
            .position(|(p, _)| p.wr_id() == wr_id)?;
        self.posted_recv.remove(i).map(recv)
    }

    fn on_wc(&mut self, wc: &WorkCompletion) {
        if !self.posted_mr.is_empty() {
            if let Some(i) = self.posted_mr.iter().position(|f| f.is_completed_by(wc)) {
                let done = self.posted_mr.remove(i).expect("found");
                self.remote_news = true;
                self.on_buffer(done, wc);
                self.on_status(false, wc);
                return;
            }
        }
        let Some((posted, kind, mr)) = self.take_posted(wc) else {
            // Not seen: every work request of the QP is in a posted queue until it completes.
            tracing::warn!(conn = ?self.to_shard.conn, wr_id = wc.wr_id(), status = ?wc.status(),
                "evchan: a completion of no posted work request, dropped");
            return;
        };
        let Ok(slot) = posted.complete(wc) else {
            // Not seen: the CQ is this QP's alone.
            tracing::warn!(conn = ?self.to_shard.conn, qp_num = wc.qp_num(),
                "evchan: a completion of another QP, dropped");
            return;
        };
        let ok = wc.is_success();
        if kind != Wr::Recv {
            // A send slot or a send queue entry is free: a one-sided operation may post.
            self.remote_news = true;
        }
        match kind {
            Wr::Recv if ok => self.on_recv(mr, slot, wc),
            Wr::Recv => self.put_slot(mr, slot),
            Wr::Data => {
                self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
                self.put_slot(mr, slot);
                self.data_room += 1;
                if !ok {
                    self.undelivered = true;
                }
            }
            Wr::Remote => self.on_remote(mr, slot, wc),
            Wr::Ctrl => {
                if self.fin_wr == Some(wc.wr_id()) {
                    self.fin_wr = None;
                }
                self.put_slot(mr, slot);
                self.ctrl_room += 1;
            }
        }
        self.on_status(kind == Wr::Recv, wc);
    }

    /// A slot for a post of `kind` (a message, a one-sided operation, a control message): a
    /// spare one, else one from the shard's pool; [`Posted::QueueFull`] when the memory
    /// budget has no room for a message's or one-sided operation's and one of the
    /// connection's is in flight from a slot (its completion brings the slot back),
    /// [`Posted::Failed`] (and the connection lost) when the pool could not make one, or
    /// without objects. A control message's is taken beyond the budget if need be (a few, in
    /// `ctrl_slots`: a credit update refused could keep the peer waiting until somebody reaps).
    fn take_slot(&mut self, kind: Wr) -> std::result::Result<(ChunkMr, Slot), Posted> {
        // With no data slot in flight nothing would bring one back: taken beyond the budget.
        let floor = kind == Wr::Ctrl
            || (self.budget.is_some()
                && !self
                    .posted_send
                    .iter()
                    .any(|(_, w, _)| matches!(w, Wr::Data | Wr::Remote)));
        match self.try_take_slot(floor) {
            Some(Take::Got(t)) => Ok(t),
            Some(Take::Refused) => Err(Posted::QueueFull),
            Some(Take::Failed(e)) => {
                self.lose(Lost::Verbs(format!("no slot: {e}")));
                Err(Posted::Failed)
            }
            None => Err(Posted::Failed),
        }
    }

    /// A spare slot, else one from the shard's pool when the memory budget allows (or
    /// `floor`: [`PathBudget::take`]); `None` without objects.
    fn try_take_slot(&mut self, floor: bool) -> Option<Take> {
        if let Some(spare) = self.spare.pop() {
            return Some(Take::Got(spare));
        }
        let objects = self.objects.as_ref()?;
        if let Some(budget) = self.budget.as_mut() {
            if !budget.take(floor) {
                return Some(Take::Refused);
            }
        }
        Some(match objects.pool.pool().take() {
            Ok(taken) => Take::Got(taken),
            Err(e) => {
                if let Some(budget) = self.budget.as_mut() {
                    budget.give();
                }
                Take::Failed(e)
            }
        })
    }

    /// A slot back, kept as a spare (given back to the pool once the objects are gone: the
    /// release gave the spares back already; or while the memory budget is spent beyond what
    /// it has room for and this connection holds more than its admission).
    fn put_slot(&mut self, mr: ChunkMr, mut slot: Slot) {
        if self.objects.is_some() && !self.budget.as_ref().is_some_and(PathBudget::overdrawn) {
            let _ = slot.set_len(0);
            self.spare.push((mr, slot));
        } else {
            self.give_to_pool(slot);
        }
    }

    /// A slot back to the shard's pool (dropped, its bytes with it, when the pool is gone).
    fn give_to_pool(&mut self, slot: Slot) {
        if let Some(budget) = self.budget.as_mut() {
            budget.give();
        }
        if let Some(pool) = self.pool.upgrade() {
            pool.give(slot);
        }
    }

    /// The spare slots back to the shard's pool.
    fn return_spare(&mut self) {
        for (_, slot) in std::mem::take(&mut self.spare) {
            self.give_to_pool(slot);
        }
    }

    /// A failed completion (`recv`: of a receive) loses the connection; a flush is noted.
    fn on_status(&mut self, recv: bool, wc: &WorkCompletion) {
        if wc.is_success() {
            return;
        }
        if wc.status() == WcStatus::WrFlush {
            self.flushed = true;
        } else {
            self.lose(cm_map::wc_failure(recv, wc.status(), self.max_recv));
        }
    }

    fn on_recv(&mut self, mr: ChunkMr, slot: Slot, wc: &WorkCompletion) {
        let kind = match self.credits.as_mut() {
            None => Ok(Kind::Data),
            Some(credits) => credits.on_receive(wc.imm_data(), wc.byte_len()),
        };
        match kind {
            Err(e) => {
                tracing::debug!(conn = ?self.to_shard.conn, "protocol violation: {e}");
                self.put_slot(mr, slot);
                self.lose(Lost::Protocol(e));
            }
            Ok(Kind::Data) => {
                if let Some((_, unread)) = self.plain_recvs.as_mut() {
                    *unread += 1;
                }
                if self.reader {
                    self.received.push_back((Arc::downgrade(&mr), slot));
                    // Credits go out ahead of consumption, within the window.
                    self.top_up();
                } else {
                    // Nobody reads: dropped at once.
                    self.consumed(Arc::downgrade(&mr), slot);
                }
            }
            // Credit updates and FIN: their receive goes back at once.
            Ok(_) => {
                self.post_recv(mr, slot);
            }
        }
    }
}

/// Why a failed post ends the connection: the QP is gone (the shard destroyed it, the
/// connection is over) or the post failed.
fn post_failed(e: &VerbsError) -> Lost {
    match e {
        VerbsError::QpDestroyed => Lost::Closed,
        e => Lost::Verbs(e.to_string()),
    }
}

/// The current tokio runtime's id; a configuration error outside a runtime.
fn current_runtime() -> Result<tokio::runtime::Id> {
    match tokio::runtime::Handle::try_current() {
        Ok(h) => Ok(h.id()),
        Err(_) => Err(Error::Config(
            "evchan connections send and receive within a tokio runtime".into(),
        )),
    }
}

/// A received message's slot as the owner of its `Bytes`: dropping the last clone gives the
/// slot back to the connection, which posts the receives its credits ask for, from the
/// dropping thread.
struct RecvBuf {
    slot: Option<(WeakMr, Slot)>,
    wire: Arc<Wire>,
}

impl AsRef<[u8]> for RecvBuf {
    fn as_ref(&self) -> &[u8] {
        self.slot.as_ref().map_or(&[], |(_, s)| s.as_slice())
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        if let Some((mr, slot)) = self.slot.take() {
            self.wire.give_back(mr, slot);
        }
    }
}

impl Drop for Path {
    /// The slots of messages nobody took, and the spares, back to the shard's pool (so that
    /// their chunk can go).
    fn drop(&mut self) {
        for (_, slot) in std::mem::take(&mut self.received) {
            self.give_to_pool(slot);
        }
        self.return_spare();
    }
}
