//! Device tests of the rdma_cm event channel: address and route resolution.
//!
//! Run in the soft-RoCE VM (`cargo xtask test`); skipped natively without a device, failed
//! without one when `EVCHAN_REQUIRE_DEVICE=1`.
#![forbid(unsafe_code)]

mod support;

use evchan_core::cm::{EventKind, PortSpace};
use evchan_core::{CmId, EventChannel};
use support::*;

#[test]
fn resolve_addr_and_route_v4() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    let key = id.key();
    let id = id.resolve_addr(None, v4(port(1)), RESOLVE_TIMEOUT).unwrap();

    let ev = expect_event(&channel, EventKind::AddrResolved);
    assert_eq!(ev.id(), key);
    assert!(ev.status().is_success());
    let id = id.addr_resolved(&ev).unwrap();
    ev.ack();
    assert_eq!(id.peer_addr(), Some(v4(port(1))));
    assert!(!id.verbs().name().is_empty());
    assert!(id.port_num() >= 1);
    let pd = id
        .pd()
        .expect("librdmacm allocates a PD on address resolution");
    assert!(pd.belongs_to(&id.verbs()));

    let id = id.resolve_route(RESOLVE_TIMEOUT).unwrap();
    let ev = expect_event(&channel, EventKind::RouteResolved);
    assert!(ev.is_for(&id));
    let id = id.route_resolved(&ev).unwrap();
    ev.ack();
    assert_eq!(id.unacked_events(), 0);
}

#[test]
fn resolve_addr_and_route_v6_link_local() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    let dst = v6(port(2));
    let id = CmId::new(&channel, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, dst, RESOLVE_TIMEOUT)
        .unwrap();
    let ev = expect_event(&channel, EventKind::AddrResolved);
    let id = id.addr_resolved(&ev).unwrap();
    drop(ev);
    assert_eq!(id.peer_addr(), Some(dst));
    let id = id.resolve_route(RESOLVE_TIMEOUT).unwrap();
    let ev = expect_event(&channel, EventKind::RouteResolved);
    let _id = id.route_resolved(&ev).unwrap();
}

#[test]
fn non_blocking_channel_reports_eagain_as_none() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    channel.set_nonblocking(true).unwrap();
    assert!(channel.is_nonblocking());
    assert!(channel.try_get_event().unwrap().is_none());
    let start = std::time::Instant::now();
    let timeout = std::time::Duration::from_millis(50);
    assert!(channel.get_event_timeout(timeout).unwrap().is_none());
    assert!(start.elapsed() >= timeout, "timed read returned early");
    // The "blocking" read of a non-blocking channel says EAGAIN, as rdma_get_cm_event does.
    let err = channel.get_event().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EAGAIN), "{err}");
    channel.set_nonblocking(false).unwrap();
    assert!(!channel.is_nonblocking());

    // An event arrives: the non-blocking read finds it after a poll.
    let id = CmId::new(&channel, PortSpace::Udp)
        .unwrap()
        .resolve_addr(None, v4(port(3)), RESOLVE_TIMEOUT)
        .unwrap();
    let fd = std::os::fd::AsFd::as_fd(&channel);
    assert!(evchan_sys::fd::poll_readable(fd, Some(EVENT_TIMEOUT)).unwrap());
    let ev = channel
        .try_get_event()
        .unwrap()
        .expect("readable channel has an event");
    assert_eq!(ev.kind(), EventKind::AddrResolved);
    let _id = id.addr_resolved(&ev).unwrap();
    drop(ev);
    assert!(channel.try_get_event().unwrap().is_none());
    // In blocking mode the read waits for the next event instead.
    let id = CmId::new(&channel, PortSpace::Udp)
        .unwrap()
        .resolve_addr(None, v4(port(5)), RESOLVE_TIMEOUT)
        .unwrap();
    let ev = channel.get_event().unwrap();
    assert_eq!(ev.kind(), EventKind::AddrResolved);
    assert!(ev.is_for(&id));
}

#[test]
fn multicast_join_on_a_udp_id() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    let mut id = resolved(&channel, PortSpace::Udp, v4(port(4)));
    // The tests' network rule allows no address but the VM's own, so the "group" is
    // 169.254.77.1 itself: on RoCE v2 the kernel maps it to a multicast GID all the same, and
    // nothing leaves the VM (it has no network card).
    let group = v4(0);
    id.join_multicast(group).unwrap();
    let ev = expect_event(&channel, EventKind::MulticastJoin);
    assert!(ev.is_for(&id));
    assert!(ev.ud_info().is_some());
    assert!(ev.private_data().is_empty());
    // Leaving while the join event is unacked would wait for its ack forever in C.
    let err = id.leave_multicast(group).unwrap_err();
    assert!(
        matches!(err, evchan_core::Error::Busy { pending: 1, .. }),
        "{err}"
    );
    ev.ack();
    id.leave_multicast(group).unwrap();
    let err = id.leave_multicast(group).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EADDRNOTAVAIL));
    // Joined again, the group is left with the id.
    id.join_multicast(group).unwrap();
    expect_event(&channel, EventKind::MulticastJoin).ack();
}
