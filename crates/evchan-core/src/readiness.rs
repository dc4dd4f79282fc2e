//! tokio readiness of the channels' descriptors (feature `tokio`).

use std::io;
use std::os::fd::BorrowedFd;
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFdReadyGuard;
use tokio::io::Interest;

pub use crate::ffi::tokio_fd::FdNumber;
use crate::ffi::tokio_fd::Registered;

/// A descriptor of this crate ([`EventChannel`](crate::EventChannel),
/// [`CompChannel::fd`](crate::verbs::CompChannel::fd), a context's async fd) registered with
/// the current tokio runtime for readable interest, borrowing the descriptor so that its owner
/// outlives the registration.
///
/// The descriptors are edge-like: after a wake-up, read until `EAGAIN` (`Ok(None)`), then
/// [`clear_ready`](AsyncFdReadyGuard::clear_ready) the guard — readiness seen before the guard
/// is all it clears, so "drain, then clear" loses no wake-up.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::os::fd::AsFd;
/// let channel = evchan_core::EventChannel::new()?;
/// let readable = evchan_core::Readable::new(channel.as_fd())?;
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
    pub async fn ready(&self) -> io::Result<AsyncFdReadyGuard<'_, FdNumber>> {
        self.inner.fd.readable().await
    }

    /// Polls for readability.
    ///
    /// # Errors
    /// The reactor's error.
    pub fn poll_ready(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<AsyncFdReadyGuard<'_, FdNumber>>> {
        self.inner.fd.poll_read_ready(cx)
    }
}
