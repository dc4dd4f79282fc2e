//! Device tests of connections: CONNECT_REQUEST with private data, ESTABLISHED on both sides,
//! REJECTED (consumer reject, 28, with the rejecter's private data; no listener, 8),
//! DISCONNECTED and TIMEWAIT_EXIT, over IPv4 and IPv6 link-local.
//!
//! Both sides run in one thread on two channels: each step waits on the channel it expects an
//! event on.

mod support;

use std::net::SocketAddr;

use evchan_core::cm::{
    state::{Connected, Listening, RouteResolved},
    ConnParam, EventKind, PortSpace, RejectReason, Status,
};
use evchan_core::verbs::QpInit;
use evchan_core::{CmId, EventChannel};
use support::*;

/// A listener on `addr`.
fn listener(channel: &EventChannel, addr: SocketAddr) -> CmId<'_, Listening> {
    CmId::new(channel, PortSpace::Tcp)
        .unwrap()
        .bind(addr)
        .unwrap()
        .listen(8)
        .unwrap()
}

/// An active id with its route to `dst` resolved.
fn routed(channel: &EventChannel, dst: SocketAddr) -> CmId<'_, RouteResolved> {
    let id = CmId::new(channel, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, dst, RESOLVE_TIMEOUT)
        .unwrap();
    let ev = expect_event(channel, EventKind::AddrResolved);
    let id = id.addr_resolved(&ev).unwrap();
    ev.ack();
    let id = id.resolve_route(RESOLVE_TIMEOUT).unwrap();
    let ev = expect_event(channel, EventKind::RouteResolved);
    id.route_resolved(&ev).unwrap()
}

/// Connects a client on `cch` to a listener on `sch` at `addr`, with private data both ways, and
/// returns both connected ids.
fn connect_pair<'s, 'c>(
    sch: &'s EventChannel,
    cch: &'c EventChannel,
    listening: &CmId<'s, Listening>,
    addr: SocketAddr,
) -> (CmId<'s, Connected>, CmId<'c, Connected>) {
    let mut client = routed(cch, addr);
    client.create_qp(&QpInit::new()).unwrap();
    assert!(client.qp_num().is_some());
    let client = client
        .connect(&ConnParam::new().private_data(b"hello from client"))
        .unwrap();

    let mut req = expect_event(sch, EventKind::ConnectRequest);
    assert!(req.is_for(listening));
    assert_eq!(req.listener(), Some(listening.key()));
    assert!(
        req.private_data().starts_with(b"hello from client"),
        "CONNECT_REQUEST private data: {:?}",
        req.private_data()
    );
    assert!(req.conn_info().is_some());
    assert_eq!(
        listening.unacked_events(),
        1,
        "the request counts against the listener"
    );
    let mut server = req
        .take_request()
        .expect("CONNECT_REQUEST hands over the new id");
    assert!(
        req.take_request().is_none(),
        "the new id is handed over once"
    );
    assert_eq!(req.id(), server.key());
    req.ack();
    assert_eq!(listening.unacked_events(), 0);

    server.create_qp(&QpInit::new()).unwrap();
    let server = server
        .accept(&ConnParam::new().private_data(b"welcome"))
        .unwrap();

    let ev = expect_event(cch, EventKind::Established);
    assert!(ev.is_for(&client));
    assert!(
        ev.private_data().starts_with(b"welcome"),
        "ESTABLISHED private data: {:?}",
        ev.private_data()
    );
    let client = client.established(&ev).unwrap();
    ev.ack();

    let ev = expect_event(sch, EventKind::Established);
    assert!(ev.is_for(&server));
    let server = server.established(&ev).unwrap();
    ev.ack();
    (server, client)
}

/// The whole life of a connection at `addr`.
fn connection_life(addr: SocketAddr) {
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let listening = listener(&sch, addr);
    let (server, client) = connect_pair(&sch, &cch, &listening, addr);
    assert_eq!(client.peer_addr(), Some(addr));

    // The client disconnects (a DREQ): the server sees DISCONNECTED and answers with its own
    // `rdma_disconnect` (the DREP), upon which the client sees DISCONNECTED too.
    let client = client.disconnect().unwrap();
    let ev = expect_event(&sch, EventKind::Disconnected);
    assert!(ev.is_for(&server));
    ev.ack();
    let server = server.disconnect().unwrap();
    let ev = expect_event(&cch, EventKind::Disconnected);
    assert!(ev.is_for(&client));
    ev.ack();

    // Then each QP leaves timewait.
    let ev = expect_event(&cch, EventKind::TimewaitExit);
    assert!(ev.is_for(&client));
    ev.ack();
    let ev = expect_event(&sch, EventKind::TimewaitExit);
    assert!(ev.is_for(&server));
    ev.ack();
}

#[test]
fn connect_accept_disconnect_timewait_v4() {
    require_device!();
    connection_life(v4(port(1)));
}

#[test]
fn connect_accept_disconnect_timewait_v6_link_local() {
    require_device!();
    connection_life(v6(port(2)));
}

#[test]
fn consumer_reject_carries_reason_28_and_private_data() {
    require_device!();
    let addr = v4(port(3));
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let _listening = listener(&sch, addr);
    let mut client = routed(&cch, addr);
    client.create_qp(&QpInit::new()).unwrap();
    let client = client
        .connect(&ConnParam::new().private_data(b"let me in"))
        .unwrap();

    let mut req = expect_event(&sch, EventKind::ConnectRequest);
    assert!(req.private_data().starts_with(b"let me in"));
    let server = req.take_request().unwrap();
    req.ack();
    server.reject(b"go away").unwrap();

    let ev = next_event(&cch, "REJECTED");
    assert_eq!(ev.kind(), EventKind::Rejected, "{ev:?}");
    assert_eq!(ev.status(), Status::Rejected(RejectReason::CONSUMER));
    assert_eq!(ev.raw_status(), 28);
    assert!(
        ev.private_data().starts_with(b"go away"),
        "REJECTED private data: {:?}",
        ev.private_data()
    );
    // The transition says why it failed and gives the id back.
    let err = client.established(&ev).unwrap_err();
    let evchan_core::Error::UnexpectedEvent(u) = &err.error else {
        panic!("{err:?}")
    };
    assert_eq!(u.got, EventKind::Rejected);
    assert!(u.same_id);
    assert_eq!(err.id.unacked_events(), 1);
    ev.ack();
    assert_eq!(err.id.unacked_events(), 0);
}

#[test]
fn connect_without_listener_is_rejected_with_reason_8() {
    require_device!();
    let cch = EventChannel::new().unwrap();
    let mut client = routed(&cch, v4(port(4)));
    client.create_qp(&QpInit::new()).unwrap();
    let client = client.connect(&ConnParam::new()).unwrap();
    let ev = next_event(&cch, "REJECTED");
    assert_eq!(ev.kind(), EventKind::Rejected, "{ev:?}");
    assert!(ev.is_for(&client));
    assert_eq!(ev.status(), Status::Rejected(RejectReason::NO_LISTENER));
    assert_eq!(ev.raw_status(), 8);
}

#[test]
fn unaccepted_request_dropped_with_its_event_rejects_the_peer() {
    require_device!();
    let addr = v4(port(5));
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let _listening = listener(&sch, addr);
    let mut client = routed(&cch, addr);
    client.create_qp(&QpInit::new()).unwrap();
    let _client = client.connect(&ConnParam::new()).unwrap();
    let req = expect_event(&sch, EventKind::ConnectRequest);
    assert!(req.has_request());
    drop(req); // the new id goes with the event
    let ev = next_event(&cch, "a rejection");
    assert!(
        matches!(ev.kind(), EventKind::Rejected | EventKind::Unreachable),
        "{ev:?}"
    );
}

#[test]
fn private_data_over_the_limit_fails_before_the_call() {
    require_device!();
    let cch = EventChannel::new().unwrap();
    let client = routed(&cch, v4(port(6)));
    let data = [7u8; 57];
    let err = client
        .connect(&ConnParam::new().private_data(&data))
        .unwrap_err();
    let evchan_core::Error::PrivateDataTooLong(e) = &err.error else {
        panic!("{err:?}")
    };
    assert_eq!((e.len, e.max), (57, 56));
    // The id came back unchanged and can still connect with 56 bytes (to nobody: REJECTED 8).
    let mut client = err.into_id();
    client.create_qp(&QpInit::new()).unwrap();
    let _client = client
        .connect(&ConnParam::new().private_data(&data[..56]))
        .unwrap();
    let ev = next_event(&cch, "REJECTED");
    assert_eq!(ev.kind(), EventKind::Rejected);
}
