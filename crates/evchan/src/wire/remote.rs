//! One-sided operations (RDMA WRITE, READ and atomics) on the data path: each takes a data
//! slot (the local bytes it moves), posts on the send queue after whatever was posted before,
//! and waits in the one-sided operations' line ([`Role::Remote`]) for its completion. The
//! slot belongs to the work request until its completion, whether or not the future is still
//! there: a dropped future's operation completes all the same, and its slot comes back to the
//! pool then, never earlier (the device may still be writing a READ's bytes into it).

use std::task::{Context, Poll};

use bytes::Bytes;
use evchan_core::verbs::{
    atomic_result, Error as VerbsError, Mr, MrPostError, OwnedMr, PostedMr, PostedSlot, QpHandle,
    Slot, SlotPool, SlotPostError, WcStatus, WorkCompletion,
};

use super::{post_failed, Path, Posted, Spun, Wait, Wire, Wr};
use crate::cm_map;
use crate::error::{Error, Lost, Result};
use crate::wait::Role;

/// Posts one one-sided operation from the slot it is given (filling it first for a WRITE).
pub(crate) type PostRemote<'a> = dyn Fn(&QpHandle, &Mr<'_, SlotPool>, Slot) -> std::result::Result<PostedSlot, SlotPostError>
    + Send
    + Sync
    + 'a;

/// Posts one operation (or message) from a registered buffer, zero-copy.
pub(crate) type PostBuffer<'a> = dyn Fn(&QpHandle, OwnedMr<Vec<u8>>) -> std::result::Result<PostedMr<Vec<u8>>, MrPostError<Vec<u8>>>
    + Send
    + Sync
    + 'a;

/// How an operation posts.
#[derive(Clone, Copy)]
pub(crate) enum Poster<'a> {
    /// Through a data slot, which holds its local bytes.
    Slot(&'a PostRemote<'a>),
    /// From the registered buffer in [`RemoteOp::buffer`] (a data slot is its send queue
    /// entry's token, its bytes unused).
    Buffer(&'a PostBuffer<'a>),
    /// Posted already (a message from a buffer, which waits for its completion here).
    Posted,
}

/// A work request from a registered buffer, posted and not completed, with the data slot that
/// stands for its send queue entry.
pub(crate) struct InFlight {
    posted: PostedMr<Vec<u8>>,
    /// A message (counted as a send), not a one-sided operation.
    message: bool,
}

impl InFlight {
    pub(super) fn new(posted: PostedMr<Vec<u8>>) -> Self {
        Self {
            posted,
            message: true,
        }
    }

    pub(super) fn is_completed_by(&self, wc: &WorkCompletion) -> bool {
        self.posted.is_completed_by(wc)
    }
}

/// What an operation's completion brings back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fetch {
    /// Nothing (a WRITE).
    Nothing,
    /// The bytes read (a READ).
    Bytes,
    /// The word's value before the operation (an atomic).
    Word,
}

/// What a completed operation brought back.
#[derive(Debug)]
pub(crate) enum Fetched {
    Nothing,
    Bytes(Bytes),
    Word(u64),
}

/// A posted operation, by its work request id in [`Path::remote`].
#[derive(Debug)]
pub(crate) struct Entry {
    fetch: Fetch,
    done: Option<Done>,
    /// A registered buffer's region, back from the device with the completion.
    buffer: Option<OwnedMr<Vec<u8>>>,
}

impl Entry {
    /// A posted work request's, waiting for its completion.
    pub(super) fn new(fetch: Fetch) -> Self {
        Self {
            fetch,
            done: None,
            buffer: None,
        }
    }
}

#[derive(Debug)]
pub(crate) enum Done {
    Ok(Fetched),
    Failed(Lost),
    /// Flushed: the QP is in the error state, for a cause the connection's end names.
    Flushed,
}

/// A one-sided operation's future's state.
pub(crate) struct RemoteOp<'a> {
    pub(crate) fetch: Fetch,
    pub(crate) post: Poster<'a>,
    /// The work request id, once posted and until its result is taken.
    pub(crate) posted: Option<u64>,
    /// A registered buffer: to post (with [`Poster::Buffer`]), then, after the completion,
    /// back. Not here while the device may use it.
    pub(crate) buffer: Option<OwnedMr<Vec<u8>>>,
}

impl Path {
    /// Posts `op` from a free data slot: its work request id; `None` when no slot is free or
    /// the send queue is full (wait for a completion).
    fn post_remote(&mut self, op: &mut RemoteOp<'_>) -> Result<Option<u64>> {
        if self.objects.is_none() {
            return Err(self.ended());
        }
        if op.fetch != Fetch::Nothing && self.reads == 0 {
            return Err(Error::NoReadResources);
        }
        if self.data_room == 0 {
            return Ok(None);
        }
        let post = match op.post {
            Poster::Slot(post) => post,
            Poster::Buffer(post) => return self.post_remote_buffer(op, post),
            Poster::Posted => unreachable!("a posted operation is not posted again"),
        };
        let (mr, slot) = match self.take_slot(Wr::Remote) {
            Ok(taken) => taken,
            // The memory budget's room: a completion of this connection's brings a slot back.
            Err(Posted::QueueFull) => return Ok(None),
            Err(_) => return Err(self.ended()),
        };
        let Some(objects) = &self.objects else {
            unreachable!("checked above, and only the shard's release takes them");
        };
        match post(&objects.qp, mr.mr(), slot) {
            Ok(posted) => {
                let id = posted.wr_id();
                self.data_room -= 1;
                self.posted_send.push_back((posted, Wr::Remote, mr));
                Ok(Some(self.track(id, op.fetch)))
            }
            Err(SlotPostError { slot, error }) => {
                self.put_slot(mr, slot);
                self.refused(error)
            }
        }
    }

    /// Posts `op` from its registered buffer, in a data work request's room.
    fn post_remote_buffer(
        &mut self,
        op: &mut RemoteOp<'_>,
        post: &PostBuffer<'_>,
    ) -> Result<Option<u64>> {
        let (Some(objects), Some(mr)) = (&self.objects, op.buffer.take()) else {
            return Err(self.ended());
        };
        match post(&objects.qp, mr) {
            Ok(posted) => {
                let id = posted.wr_id();
                self.data_room -= 1;
                self.posted_mr.push_back(InFlight {
                    posted,
                    message: false,
                });
                Ok(Some(self.track(id, op.fetch)))
            }
            Err(MrPostError { mr, error }) => {
                op.buffer = Some(mr);
                self.refused(error)
            }
        }
    }

    /// The posted operation `id` is in flight, its future waiting for what it `fetch`es.
    fn track(&mut self, id: u64, fetch: Fetch) -> u64 {
        self.remote_in_flight += 1;
        self.remote.insert(id, Entry::new(fetch));
        id
    }

    /// A post refused `error` (its slot, if any, back in the pool): a full send queue is
    /// waited out (`Ok(None)`), a range checked before posting is the caller's error (the
    /// connection goes on), anything else loses the connection.
    fn refused(&mut self, error: VerbsError) -> Result<Option<u64>> {
        match error {
            e if e.is_queue_full() => Ok(None),
            VerbsError::Remote(r) => Err(Error::Remote(r)),
            e => {
                self.lose(post_failed(&e));
                Err(self.ended())
            }
        }
    }

    /// A one-sided operation completed: what it brought goes to its future (if still there),
    /// its slot back to the pool.
    pub(super) fn on_remote(&mut self, mr: super::ChunkMr, slot: Slot, wc: &WorkCompletion) {
        self.remote_in_flight = self.remote_in_flight.saturating_sub(1);
        self.settle(wc, |fetch| match fetch {
            Fetch::Nothing => Fetched::Nothing,
            Fetch::Bytes => Fetched::Bytes(Bytes::copy_from_slice(slot.as_slice())),
            Fetch::Word => Fetched::Word(atomic_result(&slot).unwrap_or_default()),
        });
        self.put_slot(mr, slot);
        self.data_room += 1;
    }

    /// A work request from a registered buffer completed (a message, or a one-sided
    /// operation): its region goes to its future (if still there; else it is deregistered and
    /// freed now), its room back.
    pub(super) fn on_buffer(&mut self, done: InFlight, wc: &WorkCompletion) {
        let Ok(mr) = done.posted.complete(wc) else {
            unreachable!("found by its completion");
        };
        if done.message {
            self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
            if !wc.is_success() {
                self.undelivered = true;
            }
        } else {
            self.remote_in_flight = self.remote_in_flight.saturating_sub(1);
        }
        self.data_room += 1;
        self.settle(wc, |_| Fetched::Nothing);
        if let Some(entry) = self.remote.get_mut(&wc.wr_id()) {
            entry.buffer = Some(mr);
        }
    }

    /// `wc`'s result, for its future if still there (`ok`: what a success brought, from what
    /// the operation fetches).
    fn settle(&mut self, wc: &WorkCompletion, ok: impl FnOnce(Fetch) -> Fetched) {
        let failed = (!wc.is_success() && wc.status() != WcStatus::WrFlush)
            .then(|| self.removed_or(cm_map::wc_failure(false, wc.status(), self.max_recv)));
        let Some(entry) = self.remote.get_mut(&wc.wr_id()) else {
            // Its future was dropped.
            return;
        };
        entry.done = Some(if wc.is_success() {
            Done::Ok(ok(entry.fetch))
        } else if let Some(lost) = failed {
            Done::Failed(lost)
        } else {
            Done::Flushed
        });
    }

    /// Why the connection cannot carry an operation: it ended.
    fn ended(&self) -> Error {
        self.send_error()
            .unwrap_or(Error::ConnectionLost(Lost::QpError { event: None }))
    }

    /// The result of `id`'s operation, once it completed (taken out of the table).
    fn take_done(
        &mut self,
        id: u64,
        buffer: &mut Option<OwnedMr<Vec<u8>>>,
    ) -> Option<Result<Fetched>> {
        let done = self.remote.get_mut(&id)?.done.take()?;
        *buffer = self.remote.remove(&id).and_then(|e| e.buffer);
        Some(match done {
            Done::Ok(f) => Ok(f),
            Done::Failed(lost) => Err(Error::ConnectionLost(lost)),
            Done::Flushed => Err(self.ended()),
        })
    }
}

impl Wire {
    /// Posts `op` once a data slot is free (no credit: a one-sided operation consumes no
    /// receive of the peer's), then waits for its completion; `Ready` with what it brought, or
    /// why it failed (a range outside the descriptor: nothing posted, the connection goes on;
    /// a failed completion: the connection is lost, with its cause). `Ready` ends the wait.
    pub(crate) fn poll_remote(
        &self,
        cx: &mut Context<'_>,
        op: &mut RemoteOp<'_>,
        wait: &mut Wait,
    ) -> Poll<Result<Fetched>> {
        let mut path = self.lock();
        let done = loop {
            match op.posted {
                None => {
                    if let Some(e) = path.send_error() {
                        break Err(e);
                    }
                    // A wait needs the runtime's reactor: known before posting, not after.
                    if let Err(e) = path.watch_here() {
                        break Err(e);
                    }
                    match path.post_remote(op) {
                        Ok(Some(id)) => op.posted = Some(id),
                        Ok(None) => {}
                        Err(e) => break Err(e),
                    }
                }
                Some(id) => {
                    if let Some(r) = path.take_done(id, &mut op.buffer) {
                        op.posted = None;
                        break r;
                    }
                    if path.objects.is_none() {
                        // Released: the QP is gone, its completion never comes (nor its
                        // slot, which went with the pool).
                        path.remote.remove(&id);
                        op.posted = None;
                        break Err(path.ended());
                    }
                    // Until then it completes, if only as a flush: an operation that took
                    // effect is not reported failed because the connection is ending.
                }
            }
            match self.busy_poll(path, Role::Remote, wait, cx) {
                Spun::Found(p) => {
                    path = p;
                    continue;
                }
                Spun::Yielded => return Poll::Pending,
                Spun::Over(p) => path = p,
            }
            if let Err(e) = std::task::ready!(self.poll_progress(&mut path, Role::Remote, wait, cx))
            {
                break Err(e);
            }
        };
        drop(path);
        self.end_wait(Role::Remote, wait);
        Poll::Ready(done)
    }

    /// The future of the operation `id` was dropped before it took the result: the entry
    /// goes, and the slot comes back at the completion (or now, if it came).
    pub(crate) fn forget_remote(&self, id: u64) {
        self.lock().remote.remove(&id);
    }

    /// Whether `pd` is the connection's protection domain (a buffer registered there can be
    /// posted on it); `Err` once the connection's objects are released.
    pub(crate) fn is_pd(&self, pd: &evchan_core::verbs::OwnedPd) -> Result<bool> {
        let path = self.lock();
        match &path.objects {
            Some(o) => Ok(o.pd == *pd),
            None => Err(path.ended()),
        }
    }

    /// The connection's protection domain, while the connection holds its objects.
    pub(crate) fn pd(&self) -> Result<evchan_core::verbs::OwnedPd> {
        let path = self.lock();
        match &path.objects {
            Some(o) => Ok(o.pd.clone()),
            None => Err(path.ended()),
        }
    }
}
