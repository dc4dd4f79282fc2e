//! A connection's data path: its QP, CQ, memory and credits, shared by the connection's
//! halves, which post and reap from their own tasks, and its shard, which makes it, watches
//! the id's rdma_cm events, sends keepalives and releases it.
//!
//! Everything is behind one mutex, taken for a post or a poll and never held across an await.
//! Whoever polls the CQ — a `send` waiting for a credit, a `recv`, a `close`, the shard — turns
//! every completion into the shared state (received messages, free slots, credits), so a
//! completion of one direction is never lost to the other: a `SendHalf` waiting for a credit
//! and a `RecvHalf` waiting for a message on two tasks each find what they wait for, whoever
//! reaped it. Waiting goes through tokio's reactor on the connection's own completion channel
//! ([`CqWaiter`], registered with the runtime of the first task that waits): arm, poll, sleep;
//! a wake-up's completions come first, its events are read (until `EAGAIN`) and the CQ armed
//! again by the next wait that finds the CQ empty. The reactor keeps one waker per descriptor,
//! so the waits register a shared waker ([`Wakers`]) that wakes every task waiting on the
//! connection; each then looks at the state again. Whoever makes progress also wakes the
//! waiters it helped (a message for the reader, a slot or credit for the sender).
//!
//! The shard can take the verbs objects away at any time ([`Wire::release`]: the connection
//! closed, was lost, or its device was removed); the halves then see why the connection
//! ended, after the messages received before.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use evchan_core::verbs::{
    CqWaiter, Error as VerbsError, OwnedCq, OwnedMr, PostedSlot, QpHandle, Slot, SlotPool,
    WcStatus, WorkCompletion,
};

use crate::cm_map;
use crate::error::{Error, Lost, Result};
use crate::proto::{Credits, Kind};
use crate::runtime::removal::Removal;
use crate::runtime::ConnId;

/// How many completions one poll of the CQ takes.
const POLL_BATCH: usize = 32;
/// Busy poll: empty polls between two clock reads and yields to the runtime.
const SPINS_PER_YIELD: u32 = 64;

/// What a busy poll ended with.
enum Spun<'a> {
    /// Completions came: look again.
    Found(MutexGuard<'a, Path>),
    /// None came; the task yielded to the runtime (and will be polled again): `Pending`.
    Yielded,
    /// Busy polling is off, or its window spent: wait through the reactor.
    Over(MutexGuard<'a, Path>),
}

/// A yield to the runtime that hands the task to no other worker: tokio's `yield_now` wakes
/// it only after the worker has polled its reactor, where a wake of the task by itself while
/// it runs would put it in the run queue and unpark a sibling worker of a multi-thread runtime
/// to steal it (a context switch, on a small machine the CPU the peer needs, per yield). Only
/// the first poll of `yield_now`'s future is needed: it schedules the wake.
fn yield_to_runtime(cx: &mut Context<'_>) {
    let yielded = std::pin::pin!(tokio::task::yield_now());
    if std::future::Future::poll(yielded, cx).is_ready() {
        cx.waker().wake_by_ref();
    }
}

/// The waiters of a connection, one slot each.
const RECV: usize = 0;
const SEND: usize = 1;
const CLOSE: usize = 2;

/// The verbs objects of a connection: what [`Wire::release`] takes away.
pub(crate) struct Objects {
    pub(crate) qp: QpHandle,
    pub(crate) send_mr: OwnedMr<SlotPool>,
    pub(crate) recv_mr: OwnedMr<SlotPool>,
    pub(crate) cq: OwnedCq,
    /// The CQ's channel registered with tokio: made by the first wait, in its runtime.
    waiter: Option<CqWaiter>,
}

impl Objects {
    pub(crate) fn new(
        qp: QpHandle,
        send_mr: OwnedMr<SlotPool>,
        recv_mr: OwnedMr<SlotPool>,
        cq: OwnedCq,
    ) -> Self {
        Self {
            qp,
            send_mr,
            recv_mr,
            cq,
            waiter: None,
        }
    }
}

/// What a posted work request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wr {
    Recv,
    Data,
    Ctrl,
}

/// What the shard hears from a connection's data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// A half found the connection lost (a failed work request, a protocol violation): the
    /// shard disconnects and releases it.
    Lost,
    /// The close the shard waits for is ready (the `FIN` completed, or the connection ended).
    Closable,
    /// No send of ours is in flight any more (or the connection ended): a deferred disconnect
    /// may go.
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

/// The wakers of the tasks waiting on a connection, and the one waker the CQ's readiness is
/// polled with, which wakes them all (tokio keeps one waker per registration).
#[derive(Debug, Default)]
struct Wakers {
    slots: Mutex<[Option<Waker>; 3]>,
    /// Which slots hold a waker (bit `1 << who`), changed under `slots`' lock: a wake of
    /// slots that hold none takes no lock.
    held: AtomicU8,
}

impl Wakers {
    fn lock(&self) -> MutexGuard<'_, [Option<Waker>; 3]> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, who: usize, waker: &Waker) {
        let mut all = self.lock();
        if !all[who].as_ref().is_some_and(|w| w.will_wake(waker)) {
            all[who] = Some(waker.clone());
        }
        self.held.fetch_or(1 << who, Ordering::SeqCst);
    }

    /// Wakes the waiters of `mask` (bits `1 << who`), outside the lock.
    fn wake_some(&self, mask: u8) {
        if mask & self.held.load(Ordering::SeqCst) == 0 {
            return;
        }
        let taken: [Option<Waker>; 3] = {
            let mut all = self.lock();
            self.held.fetch_and(!mask, Ordering::SeqCst);
            std::array::from_fn(|k| {
                if mask & (1 << k) != 0 {
                    all[k].take()
                } else {
                    None
                }
            })
        };
        for w in taken.into_iter().flatten() {
            w.wake();
        }
    }
}

impl Wake for Wakers {
    fn wake(self: Arc<Self>) {
        self.wake_some(0b111);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_some(0b111);
    }
}

/// A connection's data path (see the module's docs).
pub(crate) struct Wire {
    path: Mutex<Path>,
    wakers: Arc<Wakers>,
    /// `wakers` as one waker, for the CQ's readiness.
    all: Waker,
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
    free_data: Vec<Slot>,
    free_ctrl: Vec<Slot>,
    /// Posted and not completed, in posting order (completions come in that order per queue).
    posted_send: VecDeque<(PostedSlot, Wr)>,
    posted_recv: VecDeque<PostedSlot>,
    /// Data received and not yet taken by `recv`.
    received: VecDeque<Slot>,
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
    /// The readiness failed once since the last wait that slept: the next failure is an error.
    registration_failed: bool,
    to_shard: ToShard,
    wcs: Vec<WorkCompletion>,
}

impl Wire {
    /// The data path of a new connection: its objects, its send slots, and its receives, all
    /// posted already. It is not open (no credits) until [`open`](Self::open).
    pub(crate) fn new(
        objects: Objects,
        free_data: Vec<Slot>,
        free_ctrl: Vec<Slot>,
        posted_recv: Vec<PostedSlot>,
        max_recv: u32,
        busy_poll: Option<Duration>,
        to_shard: ToShard,
    ) -> Arc<Self> {
        let wakers = Arc::new(Wakers::default());
        Arc::new(Wire {
            path: Mutex::new(Path {
                objects: Some(objects),
                credits: None,
                free_data,
                free_ctrl,
                posted_send: VecDeque::new(),
                posted_recv: posted_recv.into(),
                received: VecDeque::new(),
                sends_in_flight: 0,
                fin_wr: None,
                want_fin: false,
                reader: true,
                stop: None,
                undelivered: false,
                max_recv,
                registration_failed: false,
                to_shard,
                wcs: Vec::with_capacity(POLL_BATCH),
            }),
            all: Waker::from(Arc::clone(&wakers)),
            wakers,
            active: AtomicBool::new(false),
            busy_poll,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Path> {
        self.path.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reaps what the CQ has; wakes the waiters that it helped, but `me` (the caller's own
    /// slot, or none); how many completions there were.
    fn progress(&self, path: &mut Path, me: Option<usize>) -> usize {
        let n = path.progress();
        if n > 0 {
            self.active.store(true, Ordering::Relaxed);
            self.wake_helped(path, me);
        }
        n
    }

    fn wake_helped(&self, path: &Path, me: Option<usize>) {
        let mut mask = 0u8;
        if !path.received.is_empty() || path.recv_end().is_some() {
            mask |= 1 << RECV;
        }
        if path.can_send() || path.stop.is_some() {
            mask |= 1 << SEND;
        }
        if path.close_ready() {
            mask |= 1 << CLOSE;
        }
        if let Some(me) = me {
            mask &= !(1 << me);
        }
        self.wakers.wake_some(mask);
    }

    /// Makes progress, or sleeps: `Ready` once something was reaped (or the connection
    /// ended), `Pending` with `who`'s waker registered and the CQ armed.
    fn poll_progress(&self, path: &mut Path, who: usize, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.progress(path, Some(who)) > 0 {
            return Poll::Ready(Ok(()));
        }
        self.wakers.set(who, cx.waker());
        let mut all = Context::from_waker(&self.all);
        match path.poll_wait(&mut all) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.active.store(true, Ordering::Relaxed);
                    self.wake_helped(path, Some(who));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }

    // -----------------------------------------------------------------------------------
    // The halves
    // -----------------------------------------------------------------------------------

    /// Posts a copy of `data` as one message once a send slot and (toward an evchan peer) a
    /// credit are free; `Pending` until then, with nothing posted.
    /// `*spin` is the busy poll's start, as in [`poll_recv`](Self::poll_recv).
    pub(crate) fn poll_send(
        &self,
        cx: &mut Context<'_>,
        data: &[u8],
        spin: &mut Option<Instant>,
    ) -> Poll<Result<()>> {
        let mut path = self.lock();
        loop {
            if let Some(e) = path.send_error() {
                *spin = None;
                return Poll::Ready(Err(e));
            }
            if path.can_send() {
                match path.post_data(data) {
                    Posted::Yes => {
                        *spin = None;
                        return Poll::Ready(Ok(()));
                    }
                    Posted::Failed => continue,
                    Posted::QueueFull => {}
                }
            }
            match self.busy_poll(path, SEND, spin, cx) {
                Spun::Found(p) => {
                    path = p;
                    continue;
                }
                Spun::Yielded => return Poll::Pending,
                Spun::Over(p) => path = p,
            }
            std::task::ready!(self.poll_progress(&mut path, SEND, cx))?;
        }
    }

    /// Busy polling (when `Config::busy_poll` is on and its window, which began at `*spin`,
    /// or now, is not spent): up to [`SPINS_PER_YIELD`] polls of the CQ, then a yield. `who`:
    /// the waiter spinning (it is not woken for what it reaps itself).
    fn busy_poll<'a>(
        &'a self,
        mut path: MutexGuard<'a, Path>,
        who: usize,
        spin: &mut Option<Instant>,
        cx: &mut Context<'_>,
    ) -> Spun<'a> {
        let Some(window) = self.busy_poll else {
            return Spun::Over(path);
        };
        let start = *spin.get_or_insert_with(Instant::now);
        if start.elapsed() >= window {
            return Spun::Over(path);
        }
        for _ in 0..SPINS_PER_YIELD {
            if self.progress(&mut path, Some(who)) > 0 {
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

    /// The next message, `None` once the peer closed cleanly; waits (busy within the busy-poll
    /// window, which starts at `*spin` when set, then through the reactor).
    pub(crate) fn poll_recv(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        spin: &mut Option<Instant>,
    ) -> Poll<Result<Option<Bytes>>> {
        let mut path = self.lock();
        loop {
            if let Some(slot) = path.received.pop_front() {
                *spin = None;
                let buf = RecvBuf {
                    slot: Some(slot),
                    wire: Arc::clone(self),
                };
                return Poll::Ready(Ok(Some(Bytes::from_owner(buf))));
            }
            if let Some(end) = path.recv_end() {
                *spin = None;
                return Poll::Ready(end);
            }
            match self.busy_poll(path, RECV, spin, cx) {
                Spun::Found(p) => {
                    path = p;
                    continue;
                }
                Spun::Yielded => return Poll::Pending,
                Spun::Over(p) => path = p,
            }
            std::task::ready!(self.poll_progress(&mut path, RECV, cx))?;
        }
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
        while let Some(slot) = path.received.pop_front() {
            path.consumed(slot);
        }
        path.flush_ctrl();
    }

    /// A received message's slot back from the application (its last `Bytes` dropped).
    fn give_back(&self, slot: Slot) {
        let mut path = self.lock();
        path.consumed(slot);
        path.flush_ctrl();
    }

    /// Posts the `FIN` after everything sent (unless posted already) and waits for its
    /// completion (toward a plain peer: for every send's); `Ready` then, or once the
    /// connection ended. Used by `close` and by the shard's background close.
    pub(crate) fn poll_close(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut path = self.lock();
        if !path.want_fin {
            path.want_fin = true;
            path.flush_ctrl();
        }
        loop {
            if path.close_ready() {
                return Poll::Ready(Ok(()));
            }
            std::task::ready!(self.poll_progress(&mut path, CLOSE, cx))?;
        }
    }

    /// `Ready` once no send of ours (nor the `FIN`) is in flight, or the connection ended.
    pub(crate) fn poll_quiet(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut path = self.lock();
        loop {
            if !path.sending() || path.objects.is_none() {
                return Poll::Ready(Ok(()));
            }
            std::task::ready!(self.poll_progress(&mut path, CLOSE, cx))?;
        }
    }

    // -----------------------------------------------------------------------------------
    // The shard
    // -----------------------------------------------------------------------------------

    /// `ESTABLISHED`: the peer's handshake decided the credits (`None`: a plain peer).
    pub(crate) fn open(&self, credits: Option<Credits>) {
        self.lock().credits = credits;
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

    /// Whether sends of ours (or the `FIN`) are in flight. Reaps first.
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
        self.wake_helped(&path, None);
    }

    /// The shard destroyed the id (and with it the QP): the objects go now, and whoever waits
    /// learns why the connection ended (`why`, unless it ended already).
    pub(crate) fn release(&self, why: Lost) {
        let objects = {
            let mut path = self.lock();
            if path.sends_in_flight > 0 {
                path.undelivered = true;
            }
            path.stop.get_or_insert(Stop::Lost(why));
            path.posted_send.clear();
            path.posted_recv.clear();
            let objects = path.objects.take();
            self.wake_helped(&path, None);
            objects
        };
        // The registration, the regions and the CQ go outside the lock.
        drop(objects);
    }

    /// Whether a completion came since the last call.
    pub(crate) fn take_active(&self) -> bool {
        self.active.swap(false, Ordering::Relaxed)
    }

    /// Reaps, and posts a keepalive when `due` (a control message that returns nothing);
    /// `false` when the connection is lost.
    pub(crate) fn tick(&self, due: bool) -> bool {
        let mut path = self.lock();
        self.progress(&mut path, None);
        if due {
            path.keepalive();
        }
        path.stop.is_none()
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

/// How posting one message went.
enum Posted {
    Yes,
    /// The send queue is full: wait for a completion.
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
        !self.free_data.is_empty() && self.credits.as_ref().is_none_or(Credits::can_send_data)
    }

    fn sending(&self) -> bool {
        self.sends_in_flight > 0 || self.fin_wr.is_some()
    }

    fn close_ready(&self) -> bool {
        if self.stop.is_some() || self.objects.is_none() {
            return true;
        }
        match &self.credits {
            Some(c) => c.fin_sent() && self.fin_wr.is_none(),
            None => self.sends_in_flight == 0,
        }
    }

    fn lose(&mut self, why: Lost) {
        if self.stop.is_some() {
            return;
        }
        let why = if self.to_shard.removal.is_retired() {
            Lost::DeviceRemoved
        } else {
            why
        };
        tracing::debug!(conn = ?self.to_shard.conn, %why, "connection lost");
        self.stop = Some(Stop::Lost(why));
        if self.sends_in_flight > 0 {
            self.undelivered = true;
        }
        self.to_shard.tell(Heard::Lost);
    }

    /// Copies `data` into a free send slot and posts it (the caller checked [`can_send`]).
    fn post_data(&mut self, data: &[u8]) -> Posted {
        let Some(objects) = &self.objects else {
            return Posted::Failed;
        };
        let mut slot = self.free_data.pop().expect("checked by can_send");
        if let Err(e) = slot.copy_from(data) {
            self.free_data.push(slot);
            self.lose(Lost::Verbs(e.to_string()));
            return Posted::Failed;
        }
        let saved = self.credits.clone();
        let imm = self.credits.as_mut().and_then(Credits::send_data);
        match objects.qp.post_send_slot(objects.send_mr.mr(), slot, imm) {
            Ok(posted) => {
                self.sends_in_flight += 1;
                self.posted_send.push_back((posted, Wr::Data));
                Posted::Yes
            }
            Err(e) if e.is_queue_full() => {
                self.credits = saved;
                self.free_data.push(e.slot);
                Posted::QueueFull
            }
            Err(e) => {
                self.free_data.push(e.slot);
                self.lose(post_failed(&e.error));
                Posted::Failed
            }
        }
    }

    /// Posts a control message with immediate data `imm` from a free control slot: its work
    /// request id; `None` when there is no slot or the queue is full (the slot goes back), or
    /// the post failed (the connection is then lost).
    fn post_ctrl(&mut self, imm: u32) -> Option<u64> {
        let objects = self.objects.as_ref()?;
        let mut slot = self.free_ctrl.pop()?;
        let _ = slot.set_len(0);
        match objects
            .qp
            .post_send_slot(objects.send_mr.mr(), slot, Some(imm))
        {
            Ok(p) => {
                let wr_id = p.wr_id();
                self.posted_send.push_back((p, Wr::Ctrl));
                Some(wr_id)
            }
            Err(e) if e.is_queue_full() => {
                self.free_ctrl.push(e.slot);
                None
            }
            Err(e) => {
                self.free_ctrl.push(e.slot);
                self.lose(post_failed(&e.error));
                None
            }
        }
    }

    /// Credit updates that are due, and the `FIN` once wanted, from the control slots.
    fn flush_ctrl(&mut self) {
        while self.stop.is_none() && !self.free_ctrl.is_empty() {
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
        if self.stop.is_some() || self.free_ctrl.is_empty() {
            return;
        }
        let Some(credits) = self.credits.as_mut() else {
            return;
        };
        let saved = credits.clone();
        let Some(imm) = credits.keepalive() else {
            return;
        };
        if self.post_ctrl(imm).is_none() {
            self.credits = Some(saved);
        } else {
            tracing::trace!(conn = ?self.to_shard.conn, imm, "keepalive");
        }
    }

    /// Posts a receive again; `false` (and the connection lost) when that failed, or when the
    /// objects are gone.
    fn repost(&mut self, slot: Slot) -> bool {
        let Some(objects) = &self.objects else {
            return false;
        };
        if self.stop.is_some() {
            return false;
        }
        match objects.qp.post_recv_slot(objects.recv_mr.mr(), slot) {
            Ok(p) => {
                self.posted_recv.push_back(p);
                true
            }
            Err(e) => {
                self.lose(post_failed(&e.error));
                false
            }
        }
    }

    /// A data message's slot is free again: posted again, and its credit returned.
    fn consumed(&mut self, slot: Slot) {
        if self.repost(slot) {
            if let Some(credits) = self.credits.as_mut() {
                credits.consumed();
            }
        }
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
        self.flush_ctrl();
    }

    /// Arms the CQ and polls it once more, then sleeps on its channel's readiness with `cx`:
    /// `Ready` with the completions found (handled), `Pending` when none came.
    fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize>> {
        let Some(objects) = self.objects.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        if objects.waiter.is_none() {
            objects.waiter = Some(register(&objects.cq)?);
        }
        let (Some(waiter), wcs) = (objects.waiter.as_ref(), &mut self.wcs) else {
            unreachable!("registered above")
        };
        let cqs = [objects.cq.cq()];
        match waiter.waiter().poll_wait(&cqs, cx, |_, wc| wcs.push(wc)) {
            Poll::Pending => {
                self.registration_failed = false;
                Poll::Pending
            }
            Poll::Ready(Ok(n)) => {
                self.absorb();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(VerbsError::Io {
                call: "readiness",
                source,
            })) => {
                // The runtime the channel was registered with is gone (the connection moved
                // on): register it with this one, once.
                objects.waiter = None;
                if std::mem::replace(&mut self.registration_failed, true) {
                    return Poll::Ready(Err(Error::Io(source)));
                }
                Poll::Ready(Ok(0))
            }
            Poll::Ready(Err(e)) => {
                self.lose(Lost::Verbs(e.to_string()));
                Poll::Ready(Ok(0))
            }
        }
    }

    /// The posted work request `wc` completes, out of its queue: the queue's first (anywhere
    /// in it all the same, should a completion ever come out of order).
    fn take_posted(&mut self, wc: &WorkCompletion) -> Option<(PostedSlot, Wr)> {
        let wr_id = wc.wr_id();
        if self
            .posted_send
            .front()
            .is_some_and(|(p, _)| p.wr_id() == wr_id)
        {
            return self.posted_send.pop_front();
        }
        if self.posted_recv.front().is_some_and(|p| p.wr_id() == wr_id) {
            return self.posted_recv.pop_front().map(|p| (p, Wr::Recv));
        }
        if let Some(i) = self
            .posted_send
            .iter()
            .position(|(p, _)| p.wr_id() == wr_id)
        {
            return self.posted_send.remove(i);
        }
        let i = self.posted_recv.iter().position(|p| p.wr_id() == wr_id)?;
        self.posted_recv.remove(i).map(|p| (p, Wr::Recv))
    }

    fn on_wc(&mut self, wc: &WorkCompletion) {
        let Some((posted, kind)) = self.take_posted(wc) else {
            return;
        };
        let Ok(slot) = posted.complete(wc) else {
            return;
        };
        let ok = wc.is_success();
        match kind {
            Wr::Recv if ok => self.on_recv(slot, wc),
            Wr::Recv => {}
            Wr::Data => {
                self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
                self.free_data.push(slot);
                if !ok {
                    self.undelivered = true;
                }
            }
            Wr::Ctrl => {
                if self.fin_wr == Some(wc.wr_id()) {
                    self.fin_wr = None;
                }
                self.free_ctrl.push(slot);
            }
        }
        if !ok && wc.status() != WcStatus::WrFlush {
            self.lose(cm_map::wc_failure(
                kind == Wr::Recv,
                wc.status(),
                self.max_recv,
            ));
        }
    }

    fn on_recv(&mut self, slot: Slot, wc: &WorkCompletion) {
        let kind = match self.credits.as_mut() {
            None => Ok(Kind::Data),
            Some(credits) => credits.on_receive(wc.imm_data(), wc.byte_len()),
        };
        match kind {
            Err(e) => {
                tracing::debug!(conn = ?self.to_shard.conn, "protocol violation: {e}");
                self.lose(Lost::Protocol(e));
            }
            Ok(Kind::Data) if self.reader => self.received.push_back(slot),
            // Nobody reads: dropped and credited at once.
            Ok(Kind::Data) => self.consumed(slot),
            // Credit updates and FIN: their receive goes back at once.
            Ok(_) => {
                self.repost(slot);
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

/// The CQ's channel registered with the current tokio runtime.
fn register(cq: &OwnedCq) -> Result<CqWaiter> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::Config(
            "evchan connections send and receive within a tokio runtime".into(),
        ));
    }
    // tokio panics when the runtime has no I/O driver; that becomes a configuration error.
    let channel = cq.channel();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| channel.waiter())) {
        Ok(w) => Ok(w?),
        Err(_) => Err(Error::Config(
            "evchan connections need a tokio runtime with its I/O driver enabled \
             (Builder::enable_io or enable_all)"
                .into(),
        )),
    }
}

/// A received message's slot as the owner of its `Bytes`: dropping the last clone posts the
/// slot again and returns its credit, from the dropping thread.
struct RecvBuf {
    slot: Option<Slot>,
    wire: Arc<Wire>,
}

impl AsRef<[u8]> for RecvBuf {
    fn as_ref(&self) -> &[u8] {
        self.slot.as_ref().map_or(&[], Slot::as_slice)
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.wire.give_back(slot);
        }
    }
}
