//! Completion queues and completion events.

use std::fmt;
use std::time::Duration;

use crate::ffi::verbs as ffi;

use super::{CompChannel, Error, Result, WorkCompletion};

/// Pending CQ event acks are flushed with one `ibv_ack_cq_events` call once this many have
/// accumulated for a CQ (and always before the CQ is destroyed, or on [`Cq::flush_acks`]).
pub const ACK_BATCH: u32 = ffi::ACK_BATCH;

/// Identity of a [`Cq`], unique in the process: what its completion events carry
/// (`cq_context`), so that events on a shared channel can be routed to the right CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub(crate) u64);

impl CqId {
    /// The number behind the id.
    #[must_use]
    pub fn get(self) -> u64 {
        self.0
    }
}

/// A completion queue (`ibv_create_cq` / `ibv_destroy_cq`) attached to a [`CompChannel`].
///
/// The CQ borrows its channel, so the channel cannot be dropped first (which is what makes
/// `ibv_destroy_comp_channel`'s `EBUSY` unreachable). Many CQs may share one channel; events are
/// routed to the right CQ by its [`CqId`].
///
/// Dropping the CQ first acks every event counted for it (`ibv_ack_cq_events`), then calls
/// `ibv_destroy_cq`, which therefore never waits for an ack: a [`CqEvent`] borrows its CQ and
/// so cannot be alive at that point, and the event of one leaked with [`std::mem::forget`] is
/// acked by the CQ.
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
/// let cq = Cq::new(&channel, 128)?;
///
/// // By hand: arm, poll, then wait for an event, ack it, poll again.
/// cq.req_notify(false)?;
/// let mut wcs = Vec::new();
/// if cq.poll(&mut wcs, 16)? == 0 {
///     if let Some(event) = channel.get_cq_event_timeout(&[&cq], Duration::from_secs(1))? {
///         event.ack();
///         cq.poll(&mut wcs, 16)?;
///     }
/// }
/// // Or all of that in one call that loses nothing:
/// cq.wait(Some(Duration::from_secs(1)), |wc| println!("{wc:?}"))?;
/// # Ok(())
/// # }
/// ```
///
/// # References
///
/// [`ibv_create_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq.3.html),
/// [`ibv_req_notify_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_req_notify_cq.3.html),
/// [`ibv_poll_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_poll_cq.3.html),
/// [`ibv_get_cq_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_cq_event.3.html)
#[doc(alias = "ibv_cq")]
#[doc(alias = "ibv_create_cq")]
#[doc(alias = "ibv_destroy_cq")]
pub struct Cq<'ch> {
    pub(crate) raw: ffi::Cq<'ch>,
    channel: &'ch CompChannel<'ch>,
}

impl<'ch> Cq<'ch> {
    /// `ibv_create_cq`: a CQ with room for at least `min_entries` completions, on `channel`
    /// (completion vector 0).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or more than `i32::MAX` entries; [`Error::Io`] with the
    /// `ibv_create_cq` error (e.g. `EINVAL` past the device's `max_cqe`).
    #[doc(alias = "ibv_create_cq")]
    pub fn new(channel: &'ch CompChannel<'_>, min_entries: u32) -> Result<Self> {
        let cqe = i32::try_from(min_entries)
            .ok()
            .filter(|&n| n > 0)
            .ok_or(Error::InvalidArgument("a CQ needs 1..=i32::MAX entries"))?;
        let raw = ffi::Cq::new(&channel.raw, cqe).map_err(Error::io("ibv_create_cq"))?;
        Ok(Cq { raw, channel })
    }

    /// The CQ's identity, as its events carry it.
    #[must_use]
    pub fn id(&self) -> CqId {
        CqId(self.raw.token())
    }

    /// The channel the CQ reports to.
    #[must_use]
    pub fn channel(&self) -> &'ch CompChannel<'ch> {
        self.channel
    }

    /// The number of entries the CQ actually has (`ibv_cq::cqe`, at least what was asked).
    #[must_use]
    pub fn capacity(&self) -> u32 {
        u32::try_from(self.raw.capacity()).unwrap_or(0)
    }

    /// `ibv_req_notify_cq`: arms the CQ, so that the next completion (with `solicited_only`,
    /// the next solicited or error completion) writes one event to the channel.
    ///
    /// Arming is one-shot: re-arm after each event, then poll once more before sleeping, or a
    /// completion that arrived in between is never announced. [`Cq::wait`] does this.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_req_notify_cq` error.
    #[doc(alias = "ibv_req_notify_cq")]
    #[inline]
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.raw
            .req_notify(solicited_only)
            .map_err(Error::io("ibv_req_notify_cq"))
    }

    /// `ibv_poll_cq`: appends up to `max` completions to `out`; returns how many.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_poll_cq` error.
    #[doc(alias = "ibv_poll_cq")]
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        let mut total = 0;
        while total < max {
            let want = (max - total).min(ffi::POLL_BATCH);
            let n = self
                .raw
                .poll_each(want, |raw| out.push(WorkCompletion { raw }))
                .map_err(Error::io("ibv_poll_cq"))?;
            total += n;
            if n < want {
                break;
            }
        }
        Ok(total)
    }

    /// `ibv_poll_cq` for one completion.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_poll_cq` error.
    #[doc(alias = "ibv_poll_cq")]
    #[inline]
    pub fn poll_one(&self) -> Result<Option<WorkCompletion>> {
        match self.raw.poll_one() {
            Ok(wc) => Ok(wc.map(|raw| WorkCompletion { raw })),
            Err(e) => Err(Error::io("ibv_poll_cq")(e)),
        }
    }

    /// The event-driven wait loop for this CQ alone: [`CompChannel::wait`] with `[self]`.
    ///
    /// Calls `on_wc` for each completion and returns how many there were, at least one unless
    /// `timeout` (`None`: forever) expired first.
    ///
    /// # Errors
    /// As [`CompChannel::wait`].
    pub fn wait(
        &self,
        timeout: Option<Duration>,
        mut on_wc: impl FnMut(WorkCompletion),
    ) -> Result<usize> {
        self.channel.wait(&[self], timeout, |_, wc| on_wc(wc))
    }

    /// `ibv_ack_cq_events` for the pending acks, then `ibv_destroy_cq`, reporting its result
    /// (dropping the CQ does the same and ignores it).
    ///
    /// Never waits: every event read for this CQ is acked by then (a [`CqEvent`] borrows the CQ,
    /// so none is alive).
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_destroy_cq` error.
    #[doc(alias = "ibv_destroy_cq")]
    pub fn destroy(self) -> Result<()> {
        self.raw.destroy().map_err(Error::io("ibv_destroy_cq"))
    }

    /// How many events were read for this CQ and are counted, but not yet acked.
    #[must_use]
    pub fn pending_acks(&self) -> u32 {
        self.raw.pending_acks()
    }

    /// `ibv_ack_cq_events` with the pending count, now, instead of at the next [`ACK_BATCH`]
    /// or at drop.
    #[doc(alias = "ibv_ack_cq_events")]
    pub fn flush_acks(&self) {
        self.raw.flush_acks();
    }
}

impl fmt::Debug for Cq<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cq")
            .field("id", &self.id())
            .field("capacity", &self.capacity())
            .field("pending_acks", &self.pending_acks())
            .finish()
    }
}

/// One completion event (`ibv_get_cq_event`) for the CQ it borrows; acked once, on
/// [`ack`](Self::ack) or drop.
///
/// The ack is counted into the CQ's batch (`ibv_ack_cq_events` with a count at [`ACK_BATCH`])
/// and flushed before the CQ is destroyed. The event cannot outlive its CQ, and cannot be
/// acked twice (`ack` takes `self`). Leaking it ([`std::mem::forget`]) does not make the CQ's
/// destroy hang: the CQ acks it then.
///
/// An event only says the CQ had a completion after it was armed: poll the CQ, and re-arm it
/// before waiting again.
///
/// # Example
///
/// ```no_run
/// use evchan_core::verbs::{CompChannel, Context, Cq};
///
/// # fn main() -> Result<(), evchan_core::verbs::Error> {
/// let ctx = Context::open_first()?;
/// let channel = CompChannel::new(&ctx)?;
/// let (a, b) = (Cq::new(&channel, 16)?, Cq::new(&channel, 16)?);
/// a.req_notify(false)?;
/// b.req_notify(false)?;
/// let event = channel.get_cq_event(&[&a, &b])?;
/// println!("CQ #{} ({:?}) has completions", event.index(), event.cq().id());
/// event.ack();
/// # Ok(())
/// # }
/// ```
///
/// # References
///
/// [`ibv_get_cq_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_cq_event.3.html)
#[doc(alias = "ibv_get_cq_event")]
#[doc(alias = "ibv_ack_cq_events")]
#[must_use = "an event says the CQ has completions to poll"]
pub struct CqEvent<'cq> {
    cq: &'cq Cq<'cq>,
    index: usize,
    /// Always `Some` until drop.
    ack: Option<ffi::CqEventAck>,
}

impl<'cq> CqEvent<'cq> {
    #[inline]
    pub(super) fn new(cq: &'cq Cq<'_>, index: usize, ack: ffi::CqEventAck) -> Self {
        // Counted as held until the drop, so that the CQ acks it itself should this guard be
        // leaked (`mem::forget`): `ibv_destroy_cq` would otherwise wait for that ack forever.
        cq.raw.hold();
        CqEvent {
            cq,
            index,
            ack: Some(ack),
        }
    }

    /// The CQ the event is for.
    #[must_use]
    pub fn cq(&self) -> &'cq Cq<'cq> {
        self.cq
    }

    /// The position of that CQ in the list given to
    /// [`get_cq_event`](CompChannel::get_cq_event).
    #[must_use]
    pub fn index(&self) -> usize {
        self.index
    }

    /// Acks the event (counted into the CQ's batch; see [`ACK_BATCH`]).
    #[doc(alias = "ibv_ack_cq_events")]
    #[inline]
    pub fn ack(self) {}
}

impl Drop for CqEvent<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(ack) = self.ack.take() {
            // `new` paired the event with the CQ whose token it carries and held it there; a
            // different CQ would ack it at once.
            ack.defer_held(&self.cq.raw);
        }
    }
}

impl fmt::Debug for CqEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqEvent")
            .field("cq", &self.cq.id())
            .field("index", &self.index)
            .finish()
    }
}
