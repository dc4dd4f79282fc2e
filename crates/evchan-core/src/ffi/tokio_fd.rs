//! Registration of a borrowed descriptor with tokio's reactor (feature `tokio`).
//!
//! tokio's `AsyncFd::register_with_interest` is `unsafe`: the descriptor must stay open, and
//! name the same open file, for as long as the registration lives. [`Registered`] borrows the
//! descriptor for its whole life (`BorrowedFd<'fd>`), so its owner (an `EventChannel`, a
//! `CompChannel`, a `Context`) cannot close it first.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The registered descriptor's number, inside tokio's `AsyncFd`; never handed out (tokio's
/// guards would turn it back into a `BorrowedFd`, and a channel's own descriptor must not leave
/// the crate: `ffi::cm`'s module docs).
#[derive(Debug)]
pub(crate) struct FdNumber(RawFd);

impl AsRawFd for FdNumber {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A descriptor registered with tokio's reactor for `interest`, borrowed for `'fd`.
#[derive(Debug)]
pub(crate) struct Registered<'fd> {
    pub(crate) fd: AsyncFd<FdNumber>,
    _borrow: PhantomData<BorrowedFd<'fd>>,
}

impl<'fd> Registered<'fd> {
    pub(crate) fn new(fd: BorrowedFd<'fd>, interest: Interest) -> io::Result<Self> {
        // SAFETY: the descriptor is borrowed for `'fd`, which the returned value carries: its
        // owner cannot close it (safe code cannot close a descriptor it only borrows) while the
        // registration lives, and `FdNumber::as_raw_fd` always returns the same number.
        let fd = unsafe { AsyncFd::register_with_interest(FdNumber(fd.as_raw_fd()), interest) }
            .map_err(io::Error::from)?;
        Ok(Self {
            fd,
            _borrow: PhantomData,
        })
    }
}
