//! tokio readiness of the channels' descriptors (feature `tokio`).

use std::io;
use std::os::fd::BorrowedFd;
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFdReadyGuard;
use tokio::io::Interest;

use crate::ffi::tokio_fd::{FdNumber, Registered};

/// A descriptor registered with the current tokio runtime for readable interest, borrowing the
/// descriptor so that its owner outlives the registration: any descriptor
/// ([`Readable::new`]), or a channel's own
/// ([`EventChannel::readable`](crate::EventChannel::readable),
/// [`CompChannel::readable`](crate::verbs::CompChannel::readable)), which gives no way back to
/// the descriptor (the guards expose nothing but [`ReadyGuard::clear_ready`]).
///
/// The descriptors are edge-like: after a wake-up, read until `EAGAIN` (`Ok(None)`), then
/// [`clear_ready`](ReadyGuard::clear_ready) the guard — readiness seen before the guard is all
/// it clears, so "drain, then clear" loses no wake-up.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let channel = evchan_core::EventChannel::new()?;
/// let readable = channel.readable()?;
/// let mut guard = readable.ready().await?;
/// while let Some(event) = channel.try_get_event()? {
///     println!("{}", event.kind());
/// }
/// guard.clear_ready();
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Readable<'fd> {
    inner: Registered<'fd>,
}

impl<'fd> Readable<'fd> {
    /// Registers `fd` with the current tokio runtime's reactor (readable interest only).
    ///
    /// # Errors
    /// The reactor's registration error.
    ///
    /// # Panics
    /// Outside a tokio runtime with I/O enabled (as tokio's `AsyncFd`).
    pub fn new(fd: BorrowedFd<'fd>) -> io::Result<Self> {
        Ok(Self {
            inner: Registered::new(fd, Interest::READABLE)?,
        })
    }

    /// Waits until the descriptor is readable.
    ///
    /// # Errors
    /// The reactor's error.
    pub async fn ready(&self) -> io::Result<ReadyGuard<'_>> {
        self.inner.fd.readable().await.map(ReadyGuard)
    }

    /// Polls for readability.
    ///
    /// # Errors
    /// The reactor's error.
    pub fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<ReadyGuard<'_>>> {
        self.inner.fd.poll_read_ready(cx).map_ok(ReadyGuard)
    }
}

/// The readiness a [`Readable`] saw (tokio's guard, sealed: it does not hand out the
/// descriptor). Dropping it keeps the readiness; [`clear_ready`](Self::clear_ready) clears it.
#[derive(Debug)]
#[must_use = "dropping the guard keeps the readiness; clear it once drained"]
pub struct ReadyGuard<'a>(AsyncFdReadyGuard<'a, FdNumber>);

impl ReadyGuard<'_> {
    /// Clears the readiness this guard saw (tokio's `clear_ready`): call it once the
    /// descriptor was read until `EAGAIN`. Readiness that came after the guard is kept.
    pub fn clear_ready(&mut self) {
        self.0.clear_ready();
    }
}
