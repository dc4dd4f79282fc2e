//! The rdma_cm event channel.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use evchan_sys::fd as sysfd;

use crate::cm::Event;
use crate::error::{Error, Result};
use crate::ffi::cm::RawChannel;

/// An rdma_cm event channel (`struct rdma_event_channel`): the file descriptor on which the
/// events of its ids arrive.
///
/// `rdma_create_event_channel` opens it ([`EventChannel::new`]); dropping it calls
/// `rdma_destroy_event_channel`. Every [`CmId`](crate::CmId) created on the channel and every
/// [`CmEvent`](crate::CmEvent) read from it borrows it, so dropping the channel before them is a
/// compile error:
///
/// ```compile_fail
/// use evchan_core::{cm, CmId, EventChannel};
/// let channel = EventChannel::new().unwrap();
/// let id = CmId::new(&channel, cm::PortSpace::Tcp).unwrap();
/// drop(channel); // error: `channel` is borrowed by `id`
/// drop(id);
/// ```
///
/// Events are read blocking ([`get_event`](Self::get_event)), without blocking
/// ([`try_get_event`](Self::try_get_event)) or with a timeout
/// ([`get_event_timeout`](Self::get_event_timeout)). The descriptor that [`AsFd`] gives can be
/// polled with `poll`/`epoll` or registered with a reactor; readiness is edge-like in practice,
/// so after a wake-up read until `Ok(None)`. With tokio, `readable` (feature `tokio`) registers
/// the channel directly.
///
/// No read waits inside `rdma_get_cm_event` for an event to come; the waiting reads wait in
/// `poll`. (librdmacm modifies an id's QP inside that call, so an id's drop on another thread
/// waits for the readers inside it; that wait must be short.) This holds whatever is done with
/// the descriptor [`AsFd`] gives, because that descriptor is not the channel's own: it is a
/// readiness proxy (an epoll instance watching the channel's descriptor, readable exactly when
/// an event is queued). The channel's own descriptor is `O_NONBLOCK` from creation and never
/// leaves evchan, so a dup of the proxy can change only the proxy's flags, and cannot read
/// events (a read on it fails with `EINVAL`). Each read is therefore one `rdma_get_cm_event`
/// that returns an event or `EAGAIN`, as in C on a non-blocking channel.
///
/// The channel is `Send` and `Sync`: several threads may read one channel, each event going to
/// exactly one of them; a reader that loses an event to another reads `Ok(None)` or waits on.
/// The events of one id arrive in order, but two
/// readers may handle two of them at once (an `ESTABLISHED` and the `DISCONNECTED` right after
/// it): either send each id's events to one thread, or let a handler wait until the id has
/// reached the state the previous event leads to (see [`cm::AnyId`](crate::cm::AnyId)).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use evchan_core::EventChannel;
///
/// let channel = EventChannel::new()?; // `Error::NoDevice` without an RDMA device
/// channel.set_nonblocking(true)?;
/// assert!(channel.try_get_event()?.is_none());
/// assert!(channel.get_event_timeout(Duration::from_millis(10))?.is_none());
/// # Ok::<(), evchan_core::Error>(())
/// ```
///
/// # References
/// `rdma_create_event_channel(3)`, `rdma_destroy_event_channel(3)`, `rdma_get_cm_event(3)`.
#[doc(alias = "rdma_event_channel")]
#[doc(alias = "rdma_create_event_channel")]
#[doc(alias = "rdma_destroy_event_channel")]
pub struct EventChannel {
    raw: RawChannel,
    nonblocking: AtomicBool,
}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.as_raw_fd())
            .field("nonblocking", &self.is_nonblocking())
            .finish()
    }
}

impl EventChannel {
    /// `rdma_create_event_channel`: opens a channel (its descriptor `O_NONBLOCK`), and its
    /// readiness proxy (`epoll_create1` + `epoll_ctl`; see the type's docs).
    ///
    /// # Errors
    /// [`Error::NoDevice`] when the machine has no RDMA device (`ENODEV`); its message says how
    /// to get one. Other OS errors as [`Error::Os`].
    #[doc(alias = "rdma_create_event_channel")]
    pub fn new() -> Result<Self> {
        let raw = RawChannel::create().map_err(|e| Error::os("rdma_create_event_channel", e))?;
        Ok(Self {
            raw,
            nonblocking: AtomicBool::new(false),
        })
    }

    /// `rdma_destroy_event_channel`: the same as dropping the channel. Only possible once every
    /// id created on it and every event read from it is gone.
    #[doc(alias = "rdma_destroy_event_channel")]
    pub fn destroy(self) {
        drop(self);
    }

    pub(crate) fn raw(&self) -> &RawChannel {
        &self.raw
    }

    /// `fcntl(O_NONBLOCK)` as librdmacm's man page suggests, in effect: in non-blocking mode
    /// [`get_event`](Self::get_event) fails with `EAGAIN` ([`io::ErrorKind::WouldBlock`])
    /// instead of waiting when no event is ready, as `rdma_get_cm_event` does on a non-blocking
    /// descriptor. [`try_get_event`](Self::try_get_event) and
    /// [`get_event_timeout`](Self::get_event_timeout) behave the same in both modes.
    ///
    /// The channel's own descriptor stays `O_NONBLOCK` in both modes, and no read waits inside
    /// `rdma_get_cm_event` whatever is done with the descriptor [`AsFd`] gives (see the type's
    /// docs).
    ///
    /// # Errors
    /// None today; the signature keeps room for the `fcntl` it stands for.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        self.nonblocking.store(nonblocking, Ordering::Release);
        Ok(())
    }

    /// Whether the channel is in non-blocking mode (as set by [`Self::set_nonblocking`]).
    #[must_use]
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking.load(Ordering::Acquire)
    }

    /// One `rdma_get_cm_event` read; `EINTR` retried.
    #[inline]
    fn read(&self) -> Result<Option<Event<'_>>> {
        match sysfd::retry_eintr(|| self.raw.get_event()) {
            Ok(raw) => Ok(Some(Event::new(raw))),
            Err(e) => read_error(e),
        }
    }

    fn poll(&self, timeout: Option<Duration>) -> Result<bool> {
        sysfd::poll_readable(self.raw.fd(), timeout).map_err(|e| Error::os("poll", e))
    }

    /// `rdma_get_cm_event`: waits (in `poll`) for the next event; in non-blocking mode
    /// ([`set_nonblocking`](Self::set_nonblocking)) fails with `EAGAIN` instead of waiting.
    ///
    /// # Errors
    /// The OS error of the read; `EAGAIN` ([`io::ErrorKind::WouldBlock`]) in non-blocking mode
    /// when no event is ready.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn get_event(&self) -> Result<Event<'_>> {
        if self.is_nonblocking() {
            return match self.read()? {
                Some(ev) => Ok(ev),
                None => {
                    let eagain = io::Error::from_raw_os_error(libc::EAGAIN);
                    Err(Error::os("rdma_get_cm_event", eagain))
                }
            };
        }
        // Wait first: when the event is queued already this `poll` returns at once, and when it
        // is not, it saves the read's own readiness check that would only say so (one system
        // call less per waited-for event; see docs/BENCHMARKS.md).
        loop {
            self.poll(None)?;
            if let Some(ev) = self.read()? {
                return Ok(ev);
            }
        }
    }

    /// `rdma_get_cm_event` without waiting: `Ok(None)` when no event is ready (`EAGAIN`).
    ///
    /// # Errors
    /// The OS error of the read.
    #[doc(alias = "rdma_get_cm_event")]
    #[inline]
    pub fn try_get_event(&self) -> Result<Option<Event<'_>>> {
        self.read()
    }

    /// `rdma_get_cm_event`, waiting at most `timeout` (`poll`, then a read): `Ok(None)` when no
    /// event came in time.
    ///
    /// # Errors
    /// The OS error of the poll or the read.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn get_event_timeout(&self, timeout: Duration) -> Result<Option<Event<'_>>> {
        // No deadline (a timeout past what `Instant` represents, e.g. `Duration::MAX`): forever.
        let deadline = sysfd::deadline_after(timeout);
        loop {
            let left = sysfd::time_left(deadline);
            if !self.poll(left)? {
                return Ok(None);
            }
            if let Some(ev) = self.read()? {
                return Ok(Some(ev));
            }
            if left.is_some_and(|l| l.is_zero()) {
                return Ok(None);
            }
        }
    }
}

/// [`EventChannel::read`]'s error: `Ok(None)` for `EAGAIN` (no event queued), else the error.
/// Out of line, so that the read of an event stays small enough to inline.
#[inline(never)]
fn read_error<'ch>(e: io::Error) -> Result<Option<Event<'ch>>> {
    if e.kind() == io::ErrorKind::WouldBlock {
        Ok(None)
    } else {
        Err(Error::os("rdma_get_cm_event", e))
    }
}

/// The channel's readiness proxy (see the type's docs): readable exactly while an event is
/// queued; it cannot read events itself, and changing its flags changes nothing of the
/// channel's.
impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.raw.proxy()
    }
}

/// The number of the descriptor [`AsFd`] gives (the readiness proxy).
impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.raw.proxy().as_raw_fd()
    }
}

#[cfg(feature = "tokio")]
impl EventChannel {
    /// Registers the channel with the current tokio runtime's reactor (readable interest): the
    /// channel's own descriptor, not the proxy [`AsFd`] gives, so a wake-up goes through one
    /// epoll instance instead of two. After a wake-up, read until `Ok(None)`, then clear the
    /// guard's readiness (see [`Readable`](crate::Readable)).
    ///
    /// # Errors
    /// The reactor's registration error.
    ///
    /// # Panics
    /// Outside a tokio runtime with I/O enabled (as tokio's `AsyncFd`).
    pub fn readable(&self) -> std::io::Result<crate::Readable<'_>> {
        crate::Readable::new(self.raw.fd())
    }
}
