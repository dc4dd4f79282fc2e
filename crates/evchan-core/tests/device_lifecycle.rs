//! Device tests of the id life cycle around unacked events: no hang from destroying or
//! migrating an id while its event is held in the same thread (each under a deadline), migrate
//! across channels, events of two ids split over two channels, readiness via poll and epoll.
#![forbid(unsafe_code)]

mod support;

use std::os::fd::AsFd;
use std::time::Duration;

use evchan_core::cm::{ConnParam, EventKind, PortSpace};
use evchan_core::verbs::QpInit;
use evchan_core::{CmId, Error, EventChannel};
use support::*;

const DEADLINE: Duration = Duration::from_secs(30);

#[test]
fn dropping_an_id_with_its_event_unacked_does_not_hang() {
    require_device!();
    within(DEADLINE, "destroy with an unacked event", || {
        let channel = EventChannel::new().unwrap();
        let id = CmId::new(&channel, PortSpace::Tcp)
            .unwrap()
            .resolve_addr(None, v4(port(1)), RESOLVE_TIMEOUT)
            .unwrap();
        let ev = expect_event(&channel, EventKind::AddrResolved);
        assert_eq!(id.unacked_events(), 1);
        drop(id); // rdma_destroy_id would wait for the ack below, forever, in C
        assert_eq!(ev.kind(), EventKind::AddrResolved);
        ev.ack(); // the deferred destroy runs here
        assert!(channel.try_get_event().unwrap().is_none());
    });
}

#[test]
fn dropping_a_listener_with_a_connect_request_unacked_does_not_hang() {
    require_device!();
    within(
        DEADLINE,
        "listener destroy with an unacked CONNECT_REQUEST",
        || {
            let addr = v4(port(2));
            let (sch, cch) = channels();
            let listening = listener(&sch, PortSpace::Tcp, addr);
            let client = connecting(&cch, PortSpace::Tcp, addr, &ConnParam::new());

            let mut req = expect_event(&sch, EventKind::ConnectRequest);
            assert_eq!(listening.unacked_events(), 1);
            drop(listening); // deferred: the request counts against the listener
            let mut server = req.take_request().unwrap();
            // The new id may be migrated at once, while the request is unacked.
            let other = EventChannel::new().unwrap();
            server.create_qp(&QpInit::new()).unwrap();
            let server = server.migrate(&other).unwrap();
            req.ack();
            let server = server.accept(&ConnParam::new()).unwrap();
            let ev = expect_event(&cch, EventKind::Established);
            let _client = client.established(&ev).unwrap();
            drop(ev);
            let ev = expect_event(&other, EventKind::Established);
            let _server = server.established(&ev).unwrap();
            assert!(sch.try_get_event().unwrap().is_none());
        },
    );
}

#[test]
fn migrate_with_an_unacked_event_is_refused_then_works_after_the_ack() {
    require_device!();
    within(DEADLINE, "migrate with an unacked event", || {
        let ch1 = EventChannel::new().unwrap();
        let ch2 = EventChannel::new().unwrap();
        let id = CmId::new(&ch1, PortSpace::Tcp)
            .unwrap()
            .resolve_addr(None, v4(port(3)), RESOLVE_TIMEOUT)
            .unwrap();
        let ev = expect_event(&ch1, EventKind::AddrResolved);
        let id = id.addr_resolved(&ev).unwrap();
        let err = id.migrate(&ch2).unwrap_err();
        assert!(matches!(err.error, Error::Busy { pending: 1, .. }), "{err}");
        let id = err.into_id();
        ev.ack();
        let id = id.migrate(&ch2).unwrap();

        // Its events now arrive on the new channel only.
        let id = id.resolve_route(RESOLVE_TIMEOUT).unwrap();
        let ev = expect_event(&ch2, EventKind::RouteResolved);
        assert!(ev.is_for(&id));
        assert!(ch1.try_get_event().unwrap().is_none());
        drop(ev);
        // The old channel can go; the id lives on with the new one.
        drop(ch1);
        drop(id);
    });
}

#[test]
fn events_of_two_ids_split_over_two_channels() {
    require_device!();
    let ch_a = EventChannel::new().unwrap();
    let ch_b = EventChannel::new().unwrap();
    let a = CmId::new(&ch_a, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, v4(port(4)), RESOLVE_TIMEOUT)
        .unwrap();
    let b = CmId::new(&ch_b, PortSpace::Udp)
        .unwrap()
        .resolve_addr(None, v6(port(5)), RESOLVE_TIMEOUT)
        .unwrap();
    let ev_b = expect_event(&ch_b, EventKind::AddrResolved);
    let ev_a = expect_event(&ch_a, EventKind::AddrResolved);
    assert!(ev_a.is_for(&a) && !ev_a.is_for(&b));
    assert!(ev_b.is_for(&b) && !ev_b.is_for(&a));
    // A transition refuses another id's event and gives the id back.
    let err = a.addr_resolved(&ev_b).unwrap_err();
    let Error::UnexpectedEvent(u) = &err.error else {
        panic!("{err:?}")
    };
    assert!(!u.same_id);
    let _a = err.into_id().addr_resolved(&ev_a).unwrap();
    let _b = b.addr_resolved(&ev_b).unwrap();
    assert!(ch_a.try_get_event().unwrap().is_none());
    assert!(ch_b.try_get_event().unwrap().is_none());
}

#[test]
fn readiness_through_poll_and_epoll() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    channel.set_nonblocking(true).unwrap();
    let ep = evchan_sys::fd::epoll_create().unwrap();
    evchan_sys::fd::epoll_add_readable_with_token(ep.as_fd(), channel.as_fd(), 7).unwrap();
    let wait = |timeout| evchan_sys::fd::epoll_wait_one(ep.as_fd(), Some(timeout)).unwrap();
    assert_eq!(
        wait(Duration::ZERO),
        None,
        "an idle channel is not readable"
    );
    assert!(!evchan_sys::fd::poll_readable(channel.as_fd(), Some(Duration::ZERO)).unwrap());

    let id = CmId::new(&channel, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, v4(port(6)), RESOLVE_TIMEOUT)
        .unwrap();
    let ready = wait(Duration::from_secs(20)).expect("epoll reports the event");
    assert_eq!(ready.token, 7, "{ready:?}");
    assert_ne!(ready.events & libc::EPOLLIN as u32, 0, "{ready:?}");
    assert!(evchan_sys::fd::poll_readable(channel.as_fd(), Some(Duration::ZERO)).unwrap());
    // Drain until EAGAIN.
    let ev = channel.try_get_event().unwrap().expect("readable");
    let _id = id.addr_resolved(&ev).unwrap();
    assert!(channel.try_get_event().unwrap().is_none());
    drop(ev);
    assert_eq!(wait(Duration::ZERO), None, "drained");
}

#[test]
fn several_threads_read_one_channel() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    // Non-blocking, as documented for several readers: a poll-then-read never blocks on an event
    // another reader took.
    channel.set_nonblocking(true).unwrap();
    let ids: Vec<_> = (0..4)
        .map(|i| {
            CmId::new(&channel, PortSpace::Tcp)
                .unwrap()
                .resolve_addr(None, v4(port(7 + i)), RESOLVE_TIMEOUT)
                .unwrap()
        })
        .collect();
    let keys: Vec<_> = std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut got = Vec::new();
                    while let Some(ev) = channel
                        .get_event_timeout(Duration::from_millis(500))
                        .unwrap()
                    {
                        assert_eq!(ev.kind(), EventKind::AddrResolved);
                        got.push(ev.id());
                    }
                    got
                })
            })
            .collect();
        readers
            .into_iter()
            .flat_map(|r| r.join().unwrap())
            .collect()
    });
    let mut keys = keys;
    keys.sort();
    let mut want: Vec<_> = ids.iter().map(|id| id.key()).collect();
    want.sort();
    assert_eq!(keys, want, "each event went to exactly one reader");
}
