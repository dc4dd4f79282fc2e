//! Device tests of what a hostile reading of evchan-core found (issue 7): waits that stay
//! bounded when safe code clears `O_NONBLOCK` on a channel's shared file through a dup of its
//! descriptor, a foreign PD's memory region refused by the owned posts, a listening id that
//! cannot be migrated away from a queued `CONNECT_REQUEST`, and a server that makes its PD and
//! CQs before it listens and accepts on them.
//!
//! Run in the soft-RoCE VM (`cargo xtask test`); skipped natively without a device, failed
//! without one when `EVCHAN_REQUIRE_DEVICE=1`.

mod support;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use evchan_core::cm::{EventKind, PortSpace};
use evchan_core::verbs::{CompChannel, Cq};
use evchan_core::{CmId, EventChannel};
use support::verbs::*;
use support::*;

/// How long a call that must not wait for a future event may take (TCG is slow, but not this).
const PROMPT: Duration = Duration::from_secs(5);

/// Clears `O_NONBLOCK` on the open file behind `fd` through a dup of it, as safe code can
/// (std's `UnixStream::set_nonblocking(false)` on the dup does the same).
fn clear_nonblocking_through_a_dup(fd: std::os::fd::BorrowedFd<'_>) {
    let dup = fd.try_clone_to_owned().expect("dup");
    evchan_sys::fd::set_nonblocking(dup.as_fd(), false).expect("fcntl on the dup");
    assert!(
        !evchan_sys::fd::is_nonblocking(fd).unwrap(),
        "the dup shares the file, so the original is blocking now"
    );
}

/// The sequence the issue reproduced: an event-loop thread in `get_event`, a control thread
/// dropping an old id, the channel's file made blocking through a dup. Before the fix the
/// reader waited inside `rdma_get_cm_event` holding the channel's gate, and the drop hung.
#[test]
fn id_drop_does_not_hang_while_a_reader_waits_on_a_channel_made_blocking() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    clear_nonblocking_through_a_dup(channel.as_fd());
    let empty = within(PROMPT, "try_get_event on a blocking file", || {
        channel.try_get_event().unwrap().is_none()
    });
    assert!(empty, "nothing was queued");
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let ev = channel.get_event().expect("get_event");
            let kind = ev.kind();
            ev.ack();
            kind
        });
        // Let the reader get into `get_event` (and, before the fix, into the read).
        std::thread::sleep(Duration::from_millis(500));
        let old = CmId::new(&channel, PortSpace::Tcp).unwrap();
        within(
            PROMPT,
            "drop(id) while another thread waits in get_event",
            || drop(old),
        );
        // Events still flow: the reader gets the next one.
        let id = CmId::new(&channel, PortSpace::Tcp)
            .unwrap()
            .resolve_addr(None, v4(port(1)), RESOLVE_TIMEOUT)
            .unwrap();
        let kind = within(EVENT_TIMEOUT, "the reader's ADDR_RESOLVED", || {
            reader.join().unwrap()
        });
        assert_eq!(kind, EventKind::AddrResolved);
        drop(id);
    });
}

#[test]
fn cm_timed_read_is_bounded_on_a_channel_made_blocking() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    clear_nonblocking_through_a_dup(channel.as_fd());
    let start = Instant::now();
    let got = within(PROMPT, "get_event_timeout(1 s) on an idle channel", || {
        channel
            .get_event_timeout(Duration::from_secs(1))
            .unwrap()
            .is_some()
    });
    assert!(!got);
    assert!(start.elapsed() >= Duration::from_secs(1));
}

#[test]
fn cq_event_reads_are_bounded_on_a_comp_channel_made_blocking() {
    require_device!();
    let ctx = open_device();
    let comp = CompChannel::new(&ctx).unwrap();
    let cq = Cq::new(&comp, 16).unwrap();
    clear_nonblocking_through_a_dup(comp.as_fd());
    let none = within(PROMPT, "try_get_cq_event on a blocking file", || {
        comp.try_get_cq_event(&[&cq]).unwrap().is_none()
    });
    assert!(none);
    let start = Instant::now();
    let none = within(
        PROMPT,
        "get_cq_event_timeout(1 s) on an idle channel",
        || {
            comp.get_cq_event_timeout(&[&cq], Duration::from_secs(1))
                .unwrap()
                .is_none()
        },
    );
    assert!(none);
    assert!(start.elapsed() >= Duration::from_secs(1));
    let n = within(PROMPT, "wait(200 ms) on an idle channel", || {
        comp.wait(&[&cq], Some(Duration::from_millis(200)), |_, _| {})
            .unwrap()
    });
    assert_eq!(n, 0);
}

#[test]
fn async_event_reads_are_bounded_on_a_context_made_blocking() {
    require_device!();
    let ctx = open_device();
    clear_nonblocking_through_a_dup(ctx.as_fd());
    let none = within(PROMPT, "try_get_async_event on a blocking file", || {
        ctx.try_get_async_event().unwrap().is_none()
    });
    assert!(none);
    let none = within(
        PROMPT,
        "get_async_event_timeout(1 s) on an idle context",
        || {
            ctx.get_async_event_timeout(Duration::from_secs(1))
                .unwrap()
                .is_none()
        },
    );
    assert!(none);
}
