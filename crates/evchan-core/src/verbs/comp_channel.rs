//! The completion channel and the wait loop.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use evchan_sys::fd::{deadline_after, poll_readable, time_left};

use crate::ffi::verbs as ffi;

use super::{Context, Cq, CqEvent, CqId, Error, Result, WorkCompletion};

/// A completion event channel (`ibv_create_comp_channel` / `ibv_destroy_comp_channel`): the
/// file descriptor through which armed [`Cq`]s announce completions.
///
/// The channel borrows its [`Context`]; every [`Cq`] created on it borrows the channel, so the
/// channel is destroyed only after all of its CQs, and `ibv_destroy_comp_channel` never fails
/// with `EBUSY`.
///
/// The fd is non-blocking from creation: [`try_get_cq_event`](Self::try_get_cq_event) returns
/// `Ok(None)` when no event is there, while [`get_cq_event`](Self::get_cq_event) and
/// [`get_cq_event_timeout`](Self::get_cq_event_timeout) wait with `poll(2)`. It may also be
/// registered with epoll or an async runtime through [`AsFd`]; after a wake-up, read events
/// until `Ok(None)`.
///
/// The channel is `Send` and `Sync`: several threads may read it (each event goes to one).
///
/// No read waits inside `ibv_get_cq_event` for an event to come, whatever is done with the
/// descriptor [`fd`](Self::fd) and [`AsFd`] give: that descriptor is not the channel's own but
/// a readiness proxy (an epoll instance watching it, readable exactly while an event is
/// queued). The channel's own descriptor is `O_NONBLOCK` from creation and never leaves evchan,
/// so a dup of the proxy changes only the proxy's flags and cannot read events (`EINVAL`).
/// With tokio, `readable` (feature `tokio`) registers the channel's own descriptor directly.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use evchan_core::verbs::{CompChannel, Context, Cq};
///
/// # fn main() -> Result<(), evchan_core::verbs::Error> {
/// let ctx = Context::open_first()?;
/// let channel = CompChannel::new(&ctx)?;
/// let cqs: Vec<Cq<'_>> = (0..4).map(|_| Cq::new(&channel, 64)).collect::<Result<_, _>>()?;
/// let refs: Vec<&Cq<'_>> = cqs.iter().collect();
/// // ... post work on QPs of those CQs ...
/// channel.wait(&refs, Some(Duration::from_secs(1)), |cq_index, wc| {
///     println!("CQ {cq_index}: wr {} {:?}", wc.wr_id(), wc.status());
/// })?;
/// # Ok(())
/// # }
/// ```
///
/// # References
///
/// [`ibv_create_comp_channel(3)`](https://man7.org/linux/man-pages/man3/ibv_create_comp_channel.3.html),
/// [`ibv_get_cq_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_cq_event.3.html)
#[doc(alias = "ibv_comp_channel")]
#[doc(alias = "ibv_create_comp_channel")]
#[doc(alias = "ibv_destroy_comp_channel")]
pub struct CompChannel<'ctx> {
    pub(crate) raw: ffi::CompChannel<'ctx>,
    /// [`wait`](Self::wait) woke on the descriptor and has not read the events since: the
    /// next wait that finds the CQs empty reads them before it arms. A hint only: `poll(2)`
    /// is level-triggered, so a wait never sleeps while an event is queued, whatever it says.
    woken: AtomicBool,
}

impl<'ctx> CompChannel<'ctx> {
    /// `ibv_create_comp_channel`, then `O_NONBLOCK` on its fd and the fd's readiness proxy
    /// (`epoll_create1` + `epoll_ctl`; see the type's docs).
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_create_comp_channel` (or `fcntl`, `epoll`) error.
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn new(ctx: &'ctx Context) -> Result<Self> {
        Ok(CompChannel {
            raw: ffi::CompChannel::new(&ctx.raw).map_err(Error::io("ibv_create_comp_channel"))?,
            woken: AtomicBool::new(false),
        })
    }

    /// `ibv_get_cq_event`, non-blocking: the next event, routed to the CQ of `cqs` it is for,
    /// or `Ok(None)` when there is none (`EAGAIN`).
    ///
    /// # Errors
    /// [`Error::UnlistedCq`] when the event is for a CQ that is not in `cqs` (the event is then
    /// acked already); [`Error::Io`] with the `ibv_get_cq_event` error.
    #[doc(alias = "ibv_get_cq_event")]
    #[inline]
    pub fn try_get_cq_event<'cq>(&self, cqs: &[&'cq Cq<'_>]) -> Result<Option<CqEvent<'cq>>> {
        let Some(ack) = self
            .raw
            .get_cq_event()
            .map_err(Error::io("ibv_get_cq_event"))?
        else {
            return Ok(None);
        };
        match cqs.iter().position(|cq| cq.raw.token() == ack.token()) {
            Some(i) => Ok(Some(CqEvent::new(cqs[i], i, ack))),
            None => {
                let id = CqId(ack.token());
                drop(ack); // acks it
                Err(Error::UnlistedCq(id))
            }
        }
    }

    /// `ibv_get_cq_event`, non-blocking, for a channel whose CQs are polled elsewhere (by the
    /// tasks that own them): which CQ the next event is for, its event acked at once
    /// (`ibv_ack_cq_events`), or `Ok(None)` when there is none (`EAGAIN`).
    ///
    /// Acked at once, the event holds nothing up: the CQ can be destroyed right after, on any
    /// thread (its destroy waits for the ack of an event read but not yet acked, which is
    /// only the call's own moment). The id is then only a name, never reused in the process: an
    /// event read just before its CQ's destroy names a CQ that is gone. Route it as a hint
    /// ("look at this CQ"), as [`Cq::req_notify`]'s events are anyway.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_get_cq_event` error.
    #[doc(alias = "ibv_get_cq_event")]
    #[doc(alias = "ibv_ack_cq_events")]
    pub fn try_next_cq(&self) -> Result<Option<CqId>> {
        let ack = self
            .raw
            .get_cq_event()
            .map_err(Error::io("ibv_get_cq_event"))?;
        Ok(ack.map(|ack| {
            let id = CqId(ack.token());
            drop(ack); // acks it
            id
        }))
    }

    /// `ibv_get_cq_event`, blocking until an event arrives (see
    /// [`try_get_cq_event`](Self::try_get_cq_event)). `EINTR` is retried.
    ///
    /// # Errors
    /// As [`try_get_cq_event`](Self::try_get_cq_event), plus [`Error::Io`] from `poll`.
    #[doc(alias = "ibv_get_cq_event")]
    #[inline]
    pub fn get_cq_event<'cq>(&self, cqs: &[&'cq Cq<'_>]) -> Result<CqEvent<'cq>> {
        loop {
            if let Some(ev) = self.try_get_cq_event(cqs)? {
                return Ok(ev);
            }
            poll_readable(self.raw.fd(), None).map_err(Error::io("poll"))?;
        }
    }

    /// `ibv_get_cq_event`, waiting at most `timeout`: `Ok(None)` when it expires.
    ///
    /// # Errors
    /// As [`get_cq_event`](Self::get_cq_event).
    #[doc(alias = "ibv_get_cq_event")]
    pub fn get_cq_event_timeout<'cq>(
        &self,
        cqs: &[&'cq Cq<'_>],
        timeout: Duration,
    ) -> Result<Option<CqEvent<'cq>>> {
        // No deadline (a timeout past what `Instant` represents, e.g. `Duration::MAX`): forever.
        let deadline = deadline_after(timeout);
        loop {
            if let Some(ev) = self.try_get_cq_event(cqs)? {
                return Ok(Some(ev));
            }
            let left = time_left(deadline);
            if !poll_readable(self.raw.fd(), left).map_err(Error::io("poll"))? {
                return Ok(None);
            }
        }
    }

    /// The event-driven wait loop, done right, for the CQs `cqs` of this channel.
    ///
    /// Calls `on_wc(index_in_cqs, completion)` for every completion found, and returns their
    /// number once there is at least one, or `Ok(0)` when `timeout` (`None`: forever) expires.
    ///
    /// The loop, which loses no completion and never sleeps on one that is already there:
    /// 1. poll every CQ until it is empty (at most one CQ's capacity per call); return if
    ///    anything was found;
    /// 2. if an earlier turn woke on the channel's fd, read every event until `EAGAIN`,
    ///    counting each one's ack into its CQ's batch (events of CQs not in `cqs` are acked at
    ///    once);
    /// 3. arm every CQ (`ibv_req_notify_cq`);
    /// 4. poll every CQ again: a completion that arrived before the arm took effect raises no
    ///    event, so it is picked up here; return if anything was found;
    /// 5. wait for the channel's fd to become readable;
    /// 6. go to 1.
    ///
    /// After a wake-up the completions come first: the events that announced them are read in
    /// step 2 of the next turn that finds the CQs empty, before the CQs are armed again and
    /// before any sleep (a CQ raises at most one event per arm, so at most one per CQ waits
    /// there). The calls between a completion's arrival and its handing to `on_wc` are then
    /// only the polls; the event's read and the arm follow, off that path (where C's
    /// `ibv_get_cq_event` idiom reads the event, and usually arms, first).
    ///
    /// Pass every CQ of the channel, and wait on one channel from one place at a time: an event
    /// read here for a CQ not in `cqs` is acked and gone, so a thread waiting for that CQ
    /// elsewhere would not be woken by it. CQs waited for by different threads belong on
    /// different channels (which is what several channels per context are for).
    ///
    /// # Errors
    /// [`Error::Io`] from `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_get_cq_event` or `poll`.
    pub fn wait(
        &self,
        cqs: &[&Cq<'_>],
        timeout: Option<Duration>,
        mut on_wc: impl FnMut(usize, WorkCompletion),
    ) -> Result<usize> {
        // A timeout past what `Instant` represents (e.g. `Duration::MAX`) waits forever.
        let deadline = timeout.and_then(deadline_after);
        loop {
            // Step 1.
            let n = drain(cqs, &mut on_wc)?;
            if n > 0 {
                return Ok(n);
            }
            // Step 2.
            if self.woken.swap(false, Ordering::Relaxed) {
                self.read_events(cqs)?;
            }
            // Steps 3-4.
            let n = arm_and_drain(cqs, &mut on_wc)?;
            if n > 0 {
                return Ok(n);
            }
            // Step 5.
            let left = time_left(deadline);
            if !poll_readable(self.raw.fd(), left).map_err(Error::io("poll"))? {
                return Ok(0);
            }
            self.woken.store(true, Ordering::Relaxed);
        }
    }

    /// Step 2 of [`wait`](Self::wait): reads every event until `EAGAIN`, each one's ack counted
    /// into its CQ's batch (events of CQs not in `cqs` are acked at once).
    fn read_events(&self, cqs: &[&Cq<'_>]) -> Result<()> {
        while let Some(ack) = self
            .raw
            .get_cq_event()
            .map_err(Error::io("ibv_get_cq_event"))?
        {
            if let Some(cq) = cqs.iter().find(|cq| cq.raw.token() == ack.token()) {
                // Counted into the CQ's batch; a mismatch cannot happen (same token), and
                // would ack at once.
                let _ = ack.defer(&cq.raw);
            }
            // else: dropped, which acks it at once.
        }
        Ok(())
    }

    /// `ibv_destroy_comp_channel`, reporting its result (dropping the channel does the same
    /// and ignores it).
    ///
    /// Every CQ on the channel borrows it, so none is alive here and the C call's `EBUSY`
    /// ("CQs still attached") cannot happen.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_destroy_comp_channel` error.
    #[doc(alias = "ibv_destroy_comp_channel")]
    pub fn destroy(self) -> Result<()> {
        self.raw
            .destroy()
            .map_err(Error::io("ibv_destroy_comp_channel"))
    }

    /// How many completion events have been read from this channel so far (a diagnostic: in
    /// [`wait`](Self::wait), the number of times it had to sleep is about this).
    #[must_use]
    pub fn events_read(&self) -> u64 {
        self.raw.events_read()
    }

    /// The channel's readiness proxy (see the type's docs): readable exactly while an event is
    /// queued; the same descriptor as [`AsFd`] gives. (Not `ibv_comp_channel::fd` itself.)
    #[must_use]
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.raw.proxy()
    }

    /// Registers the channel with the current tokio runtime's reactor (readable interest): the
    /// channel's own descriptor, not the proxy [`fd`](Self::fd) gives, so a wake-up goes through
    /// one epoll instance instead of two. After a wake-up, read until `Ok(None)`, then clear
    /// the guard's readiness (see [`Readable`](crate::Readable)).
    ///
    /// # Errors
    /// The reactor's registration error.
    ///
    /// # Panics
    /// Outside a tokio runtime with I/O enabled (as tokio's `AsyncFd`).
    #[cfg(feature = "tokio")]
    pub fn readable(&self) -> std::io::Result<crate::Readable<'_>> {
        crate::Readable::new(self.raw.fd())
    }

    /// [`wait`](Self::wait)'s loop on tokio (feature `tokio`): the channel registered with the
    /// current runtime's reactor, for [`AsyncWaiter::wait`].
    ///
    /// # Errors
    /// The reactor's registration error.
    ///
    /// # Panics
    /// Outside a tokio runtime with I/O enabled (as tokio's `AsyncFd`).
    #[cfg(feature = "tokio")]
    pub fn async_waiter(&self) -> std::io::Result<AsyncWaiter<'_, 'ctx>> {
        Ok(AsyncWaiter {
            channel: self,
            readable: self.readable()?,
        })
    }
}

/// A [`CompChannel`] registered with tokio's reactor (feature `tokio`), from
/// [`CompChannel::async_waiter`]: [`CompChannel::wait`]'s loop with the sleep done by the
/// runtime instead of `poll(2)`.
///
/// # Example
///
/// ```no_run
/// use evchan_core::verbs::{CompChannel, Context, Cq};
///
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::open_first()?;
/// let channel = CompChannel::new(&ctx)?;
/// let cq = Cq::new(&channel, 64)?;
/// let waiter = channel.async_waiter()?;
/// // ... post work on a QP of that CQ ...
/// let cqs = [&cq];
/// let wait = waiter.wait(&cqs, |_, wc| println!("wr {} {:?}", wc.wr_id(), wc.status()));
/// // A timeout is the runtime's: the wait is cancel-safe.
/// match tokio::time::timeout(std::time::Duration::from_secs(1), wait).await {
///     Ok(n) => println!("{} completions", n?),
///     Err(_) => println!("none within 1 s"),
/// }
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub struct AsyncWaiter<'ch, 'ctx> {
    channel: &'ch CompChannel<'ctx>,
    readable: crate::Readable<'ch>,
}

#[cfg(feature = "tokio")]
impl AsyncWaiter<'_, '_> {
    /// [`CompChannel::wait`] without a timeout, the wait for an event done by the runtime:
    /// calls `on_wc(index_in_cqs, completion)` for every completion found and returns their
    /// number once there is at least one.
    ///
    /// The loop is [`CompChannel::wait`]'s (poll; if the channel is readable, read every event
    /// until `EAGAIN` with its ack counted and clear the readiness; arm, poll, wait for the
    /// readiness, poll again). A wake-up's completions are handed out first, its events read
    /// by the next turn that finds the CQs empty, before they are armed again; the readiness
    /// is cleared only after a read until `EAGAIN`, so no wake-up is lost. The same rules
    /// hold: pass every CQ of the channel, and wait on one channel from one place at a time.
    ///
    /// Cancel-safe: the future awaits only the channel's readiness, after arming and after
    /// handing every completion found to `on_wc`; dropped there (a timeout, a `select!`), it
    /// loses nothing: the CQs stay armed, and the events still queued are read, and acked, by
    /// the next wait.
    ///
    /// # Errors
    /// [`Error::Io`] from `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_get_cq_event` or the
    /// reactor (call `"readiness"`).
    pub async fn wait(
        &self,
        cqs: &[&Cq<'_>],
        mut on_wc: impl FnMut(usize, WorkCompletion),
    ) -> Result<usize> {
        use std::future::poll_fn;
        use std::task::Poll;

        let readable = &self.readable;
        loop {
            // One turn without awaiting.
            let n = poll_fn(|cx| Poll::Ready(self.turn(cqs, cx, &mut on_wc))).await?;
            if n > 0 {
                return Ok(n);
            }
            // Kept, not cleared: the events are read by the next turn that finds the CQs empty.
            let _seen = readable.ready().await.map_err(Error::io("readiness"))?;
        }
    }

    /// [`wait`](Self::wait) as a poll function, for futures written by hand: hands every
    /// completion found to `on_wc` and returns `Ready(Ok(n))` with their number (at least one),
    /// or `Pending` once the CQs are armed and polled again and `cx`'s waker is registered
    /// for the channel's readiness. The same turn as `wait`'s: a wake-up's completions come
    /// first, its events are read (and their acks counted) by the next call that finds the
    /// CQs empty, before they are armed again.
    ///
    /// The waker registered is `cx`'s alone (tokio keeps the last one per readiness): tasks
    /// that share a channel must share one waker that wakes them all.
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    pub fn poll_wait(
        &self,
        cqs: &[&Cq<'_>],
        cx: &mut std::task::Context<'_>,
        mut on_wc: impl FnMut(usize, WorkCompletion),
    ) -> std::task::Poll<Result<usize>> {
        use std::task::Poll;
        loop {
            let n = self.turn(cqs, cx, &mut on_wc)?;
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            // Armed and empty: sleep unless the readiness came meanwhile (kept, not cleared:
            // the next turn reads the events after it found the CQs empty).
            match self.readable.poll_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Error::io("readiness")(e))),
                Poll::Ready(Ok(_seen)) => {}
            }
        }
    }

    /// The channel's readiness alone, for a channel whose CQs are polled elsewhere (see
    /// [`CompChannel::try_next_cq`]): `Ready` with a guard once the reactor saw the channel
    /// readable; then read until `Ok(None)` and [`clear_ready`](crate::ReadyGuard::clear_ready)
    /// the guard. `Pending` registers `cx`'s waker (tokio keeps the last one).
    ///
    /// # Errors
    /// The reactor's error (call `"readiness"`), e.g. once its runtime shut down.
    pub fn poll_readable(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<crate::ReadyGuard<'_>>> {
        self.readable
            .poll_ready(cx)
            .map_err(|e| Error::io("readiness")(e))
    }

    /// One turn of [`wait`](Self::wait) up to its sleep: poll; if the reactor saw the channel
    /// readable, read every event until `EAGAIN` and clear the readiness; arm, poll.
    fn turn(
        &self,
        cqs: &[&Cq<'_>],
        cx: &mut std::task::Context<'_>,
        on_wc: &mut impl FnMut(usize, WorkCompletion),
    ) -> Result<usize> {
        let n = drain(cqs, on_wc)?;
        if n > 0 {
            return Ok(n);
        }
        if let std::task::Poll::Ready(ready) = self.readable.poll_ready(cx) {
            let mut guard = ready.map_err(Error::io("readiness"))?;
            self.channel.read_events(cqs)?;
            guard.clear_ready();
        }
        arm_and_drain(cqs, on_wc)
    }
}

/// Steps 3-4 of [`CompChannel::wait`]: arms every CQ and polls them again. How many
/// completions were handed to `on_wc`.
fn arm_and_drain(cqs: &[&Cq<'_>], on_wc: &mut impl FnMut(usize, WorkCompletion)) -> Result<usize> {
    for cq in cqs {
        cq.req_notify(false)?;
    }
    drain(cqs, on_wc)
}

/// Polls every CQ until empty; returns how many completions were handed to `on_wc`. Each
/// completion goes to `on_wc` straight from the provider's batch (`poll_each`'s uninitialised
/// buffer: nothing is zeroed, or copied twice, for a turn's poll).
fn drain(cqs: &[&Cq<'_>], on_wc: &mut impl FnMut(usize, WorkCompletion)) -> Result<usize> {
    let mut total = 0;
    for (i, cq) in cqs.iter().enumerate() {
        // At most one CQ's worth per call, so a busy CQ cannot starve the caller (or the other
        // CQs); what is left is found by the next poll, before any sleep.
        let mut budget = cq.capacity() as usize + ffi::POLL_BATCH;
        while budget > 0 {
            let n = cq
                .raw
                .poll_each(ffi::POLL_BATCH, |raw| on_wc(i, WorkCompletion { raw }))
                .map_err(Error::io("ibv_poll_cq"))?;
            total += n;
            budget = budget.saturating_sub(ffi::POLL_BATCH);
            if n < ffi::POLL_BATCH {
                break;
            }
        }
    }
    Ok(total)
}

/// The channel's readiness proxy, as [`CompChannel::fd`].
impl AsFd for CompChannel<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.raw.proxy()
    }
}

/// The number of the readiness proxy.
impl AsRawFd for CompChannel<'_> {
    fn as_raw_fd(&self) -> RawFd {
        self.raw.proxy().as_raw_fd()
    }
}

impl fmt::Debug for CompChannel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}
