//! Raw file-descriptor helpers: `O_NONBLOCK`, `poll(2)` with a timeout, `EINTR` retry, a
//! readiness proxy (an epoll instance that watches one descriptor), and the few epoll calls
//! around it (create, register for `EPOLLIN`, wait).
//!
//! Both event channels are plain file descriptors (`rdma_event_channel::fd`,
//! `ibv_comp_channel::fd`). These helpers work on any [`BorrowedFd`] and are safe: the borrow
//! guarantees the descriptor is open for the duration of the call.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::cvt;

/// Reads the `O_NONBLOCK` flag of `fd` (`fcntl(F_GETFL)`).
///
/// # Errors
/// The `fcntl` error, e.g. `EBADF`.
pub fn is_nonblocking(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: F_GETFL takes no argument; `fd` is open for the borrow's lifetime.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    Ok(flags & libc::O_NONBLOCK != 0)
}

/// Sets (`true`) or clears (`false`) `O_NONBLOCK` on `fd` (`fcntl(F_GETFL/F_SETFL)`).
///
/// Other status flags are kept. Idempotent.
///
/// # Errors
/// The `fcntl` error, e.g. `EBADF`.
pub fn set_nonblocking(fd: BorrowedFd<'_>, nonblocking: bool) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: F_GETFL takes no argument; `fd` is open for the borrow's lifetime.
    let flags = cvt(unsafe { libc::fcntl(raw, libc::F_GETFL) })?;
    let new = if nonblocking {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    if new != flags {
        // SAFETY: F_SETFL takes an int of status flags; `fd` is open for the borrow's lifetime.
        cvt(unsafe { libc::fcntl(raw, libc::F_SETFL, new) })?;
    }
    Ok(())
}

/// A readiness proxy for `fd`: a new epoll instance (`epoll_create1(EPOLL_CLOEXEC)`, then
/// `O_NONBLOCK` on it) with `fd` registered for `EPOLLIN`, level-triggered.
///
/// The proxy is readable (`poll`, `epoll`, an async reactor) exactly while `fd` is, but it is
/// a different open file: a dup of the proxy shares only the proxy's flags, and reading or
/// writing it fails (`EINVAL`), so whoever holds only the proxy can wait for `fd` but can
/// neither read it nor change its flags. The registration ends by itself when `fd`'s file is
/// closed.
///
/// # Errors
/// The `epoll_create1`, `fcntl` or `epoll_ctl` error (e.g. `EPERM` for a descriptor that
/// cannot be polled).
pub fn readiness_proxy(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let ep = epoll_create()?;
    set_nonblocking(ep.as_fd(), true)?;
    epoll_add_readable(ep.as_fd(), fd)?;
    Ok(ep)
}

/// A new epoll instance, close-on-exec (`epoll_create1(EPOLL_CLOEXEC)`), owned by the caller.
///
/// # Errors
/// The `epoll_create1` error (e.g. `EMFILE`).
pub fn epoll_create() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the flag is valid.
    let ep = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    // SAFETY: `ep` is a descriptor we just opened and own; nothing else closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(ep) })
}

/// Registers `fd` for `EPOLLIN`, level-triggered, with the epoll instance `ep`
/// (`epoll_ctl(EPOLL_CTL_ADD)`), with token 0; `ep` may be any descriptor of an epoll
/// instance, a dup included.
///
/// # Errors
/// The `epoll_ctl` error (e.g. `EEXIST` when `fd` is registered already, `EPERM` for a
/// descriptor that cannot be polled, `EINVAL` when `ep` is no epoll instance).
pub fn epoll_add_readable(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> io::Result<()> {
    epoll_add_readable_with_token(ep, fd, 0)
}

/// As [`epoll_add_readable`], with `token` as the registration's `epoll_data`: what
/// [`epoll_wait_one`] reports for `fd` in [`EpollReady::token`].
///
/// # Errors
/// As [`epoll_add_readable`].
pub fn epoll_add_readable_with_token(
    ep: BorrowedFd<'_>,
    fd: BorrowedFd<'_>,
    token: u64,
) -> io::Result<()> {
    let mut interest = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: both descriptors are open for the call (borrowed) and `interest` is a valid,
    // initialised event.
    cvt(unsafe {
        libc::epoll_ctl(
            ep.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd.as_raw_fd(),
            &mut interest,
        )
    })?;
    Ok(())
}

/// One ready registration of an epoll instance, as [`epoll_wait_one`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpollReady {
    /// The ready events (`EPOLLIN`, `EPOLLERR`, `EPOLLHUP`, …) of the registration.
    pub events: u32,
    /// The registration's token (its `epoll_data`, see [`epoll_add_readable_with_token`]).
    pub token: u64,
}

/// Waits until a registration of the epoll instance `ep` is ready, or the timeout passes
/// (`epoll_wait(2)` for one event): the ready registration, `None` on timeout.
///
/// `None` waits forever, and `EINTR` is retried with the time that is left, as in
/// [`poll_readable`]. With several registrations ready, one is reported per call.
///
/// # Errors
/// The `epoll_wait` error other than `EINTR` (e.g. `EINVAL` when `ep` is no epoll instance).
pub fn epoll_wait_one(
    ep: BorrowedFd<'_>,
    timeout: Option<Duration>,
) -> io::Result<Option<EpollReady>> {
    let deadline = timeout.and_then(deadline_after);
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => millis_until(d),
        };
        let mut out = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: `out` has room for the one event asked for, and `ep` is open for the call
        // (borrowed).
        let n = unsafe { libc::epoll_wait(ep.as_raw_fd(), &mut out, 1, ms) };
        match n {
            n if n > 0 => {
                return Ok(Some(EpollReady {
                    events: out.events,
                    token: out.u64,
                }))
            }
            0 => return Ok(None),
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
}

/// Waits until `fd` is readable, or the timeout passes (`poll(2)` on `POLLIN`).
///
/// `None` waits forever, and so does a timeout too long for [`Instant`] to represent (e.g.
/// [`Duration::MAX`]). Returns `Ok(true)` when readable (or in error/hang-up state, so that the
/// following read reports the error), `Ok(false)` on timeout. `EINTR` is retried with the time
/// that is left, so a signal never shortens nor lengthens the wait.
///
/// # Errors
/// The `poll` error other than `EINTR`.
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let deadline = timeout.and_then(deadline_after);
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => millis_until(d),
        };
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid, initialised pollfd and we pass a count of 1.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        match n {
            n if n > 0 => return Ok(true),
            0 => return Ok(false),
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
}

/// The instant `timeout` from now, or `None` when that lies beyond what [`Instant`] can
/// represent (`Instant + Duration` would panic): a wait that long is a wait forever.
#[must_use]
pub fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// The time left until `deadline` (zero once it has passed); `None` (wait forever) for no
/// deadline, as [`deadline_after`] returns for a timeout too long to represent.
#[must_use]
pub fn time_left(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

/// Milliseconds from now until `deadline`, rounded up so that a wait never ends early, capped to
/// `c_int::MAX`.
fn millis_until(deadline: Instant) -> libc::c_int {
    let left = deadline.saturating_duration_since(Instant::now());
    let ms = left.as_nanos().div_ceil(1_000_000);
    libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
}

/// Runs `f` until it returns something other than an `EINTR` error.
///
/// # Errors
/// Whatever `f` returns, except `EINTR`.
#[inline]
pub fn retry_eintr<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn nonblocking_round_trip() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(!is_nonblocking(a.as_fd()).unwrap());
        set_nonblocking(a.as_fd(), true).unwrap();
        assert!(is_nonblocking(a.as_fd()).unwrap());
        set_nonblocking(a.as_fd(), true).unwrap();
        assert!(is_nonblocking(a.as_fd()).unwrap());
        set_nonblocking(a.as_fd(), false).unwrap();
        assert!(!is_nonblocking(a.as_fd()).unwrap());
    }

    #[test]
    fn poll_times_out_then_sees_data() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let start = Instant::now();
        assert!(!poll_readable(a.as_fd(), Some(Duration::from_millis(30))).unwrap());
        assert!(
            start.elapsed() >= Duration::from_millis(30),
            "poll returned early"
        );
        b.write_all(b"x").unwrap();
        assert!(poll_readable(a.as_fd(), Some(Duration::ZERO)).unwrap());
        assert!(poll_readable(a.as_fd(), None).unwrap());
    }

    #[test]
    fn poll_reports_hangup_as_readable() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        assert!(poll_readable(a.as_fd(), Some(Duration::from_millis(10))).unwrap());
    }

    #[test]
    fn proxy_follows_readiness_and_shields_the_file() {
        let (a, mut b) = UnixStream::pair().unwrap();
        set_nonblocking(a.as_fd(), true).unwrap();
        let proxy = readiness_proxy(a.as_fd()).unwrap();
        assert!(is_nonblocking(proxy.as_fd()).unwrap());
        assert!(!poll_readable(proxy.as_fd(), Some(Duration::ZERO)).unwrap());
        b.write_all(b"x").unwrap();
        assert!(poll_readable(proxy.as_fd(), Some(Duration::ZERO)).unwrap());
        // A dup of the proxy changes the proxy's flags, never those of `a`'s file.
        let dup = proxy.try_clone().unwrap();
        set_nonblocking(dup.as_fd(), false).unwrap();
        assert!(!is_nonblocking(proxy.as_fd()).unwrap());
        assert!(is_nonblocking(a.as_fd()).unwrap());
        // The proxy cannot read `a`'s data.
        let err = std::fs::File::from(dup).read(&mut [0u8; 1]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        let mut got = [0u8; 1];
        (&a).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x");
        assert!(!poll_readable(proxy.as_fd(), Some(Duration::ZERO)).unwrap());
    }

    #[test]
    fn epoll_reports_the_token_of_a_ready_registration() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let ep = epoll_create().unwrap();
        epoll_add_readable_with_token(ep.as_fd(), a.as_fd(), 7).unwrap();
        let err = epoll_add_readable(ep.as_fd(), a.as_fd()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
        let start = Instant::now();
        assert_eq!(
            epoll_wait_one(ep.as_fd(), Some(Duration::from_millis(30))).unwrap(),
            None
        );
        assert!(
            start.elapsed() >= Duration::from_millis(30),
            "epoll_wait returned early"
        );
        b.write_all(b"x").unwrap();
        let ready = EpollReady {
            events: libc::EPOLLIN as u32,
            token: 7,
        };
        assert_eq!(epoll_wait_one(ep.as_fd(), None).unwrap(), Some(ready));
        // Level-triggered: still ready until read.
        assert_eq!(
            epoll_wait_one(ep.as_fd(), Some(Duration::ZERO)).unwrap(),
            Some(ready)
        );
        (&a).read_exact(&mut [0u8; 1]).unwrap();
        assert_eq!(
            epoll_wait_one(ep.as_fd(), Some(Duration::ZERO)).unwrap(),
            None
        );
        // Not an epoll instance.
        let err = epoll_wait_one(a.as_fd(), Some(Duration::ZERO)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn huge_timeouts_wait_forever_instead_of_panicking() {
        // `Instant::now() + Duration::MAX` panics; such a timeout must mean "forever".
        assert_eq!(deadline_after(Duration::MAX), None);
        assert_eq!(time_left(None), None);
        assert!(deadline_after(Duration::from_secs(1)).is_some());
        assert_eq!(
            time_left(Some(Instant::now() - Duration::from_millis(1))),
            Some(Duration::ZERO)
        );
        let (a, mut b) = UnixStream::pair().unwrap();
        b.write_all(b"x").unwrap();
        assert!(poll_readable(a.as_fd(), Some(Duration::MAX)).unwrap());
    }

    #[test]
    fn millis_round_up_and_cap() {
        let past = Instant::now();
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(millis_until(past), 0);
        assert!(millis_until(Instant::now() + Duration::from_micros(10)) >= 1);
        let far = Instant::now() + Duration::from_secs(u64::from(u32::MAX));
        assert_eq!(millis_until(far), libc::c_int::MAX);
    }

    #[test]
    fn retry_eintr_retries_only_eintr() {
        let mut n = 0;
        let r = retry_eintr(|| {
            n += 1;
            if n < 3 {
                Err(io::Error::from_raw_os_error(libc::EINTR))
            } else {
                Ok(n)
            }
        });
        assert_eq!(r.unwrap(), 3);
        let e = retry_eintr::<()>(|| Err(io::Error::from_raw_os_error(libc::EAGAIN))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
    }
}
