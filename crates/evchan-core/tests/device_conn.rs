//! Device tests of connections: CONNECT_REQUEST with private data, ESTABLISHED on both sides,
//! REJECTED (consumer reject, 28, with the rejecter's private data; no listener, 8),
//! DISCONNECTED and TIMEWAIT_EXIT, over IPv4 and IPv6 link-local.
//!
//! Both sides run in one thread on two channels: each step waits on the channel it expects an
//! event on.
#![forbid(unsafe_code)]

mod support;

use std::net::SocketAddr;

use evchan_core::cm::{
    state::{Connected, Listening},
    ConnParam, EventKind, PortSpace, RejectReason, Status,
};
use evchan_core::verbs::QpInit;
use evchan_core::{CmId, EventChannel};
use support::*;

/// Connects a client on `cch` to a listener on `sch` at `addr`, with private data both ways, and
/// returns both connected ids.
fn connect_pair<'s, 'c>(
    sch: &'s EventChannel,
    cch: &'c EventChannel,
    listening: &CmId<'s, Listening>,
    addr: SocketAddr,
) -> (CmId<'s, Connected>, CmId<'c, Connected>) {
    let client = connecting(
        cch,
        PortSpace::Tcp,
        addr,
        &ConnParam::new().private_data(b"hello from client"),
    );

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

    let (client, data) = established(cch, client);
    assert!(
        data.starts_with(b"welcome"),
        "ESTABLISHED private data: {data:?}"
    );
    let (server, _) = established(sch, server);
    (server, client)
}

/// The whole life of a connection at `addr`.
fn connection_life(addr: SocketAddr) {
    let (sch, cch) = channels();
    let listening = listener(&sch, PortSpace::Tcp, addr);
    let (server, client) = connect_pair(&sch, &cch, &listening, addr);
    assert_eq!(client.peer_addr(), Some(addr));
    let (server, client) = disconnect_pair(&sch, &cch, server, client);

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
    let (sch, cch) = channels();
    let _listening = listener(&sch, PortSpace::Tcp, addr);
    let client = connecting(
        &cch,
        PortSpace::Tcp,
        addr,
        &ConnParam::new().private_data(b"let me in"),
    );
    let (server, data) = request(&sch);
    assert!(data.starts_with(b"let me in"));
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
    let client = connecting(&cch, PortSpace::Tcp, v4(port(4)), &ConnParam::new());
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
    let (sch, cch) = channels();
    let _listening = listener(&sch, PortSpace::Tcp, addr);
    let _client = connecting(&cch, PortSpace::Tcp, addr, &ConnParam::new());
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
    let client = routed(&cch, PortSpace::Tcp, v4(port(6)));
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
