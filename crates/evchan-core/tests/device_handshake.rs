//! Device tests of the handshakes besides RC with a QP: a connect without a QP
//! (`CONNECT_RESPONSE`, then `rdma_establish`), UD service ID resolution on the UDP port space
//! (SIDR: `ESTABLISHED` with UD parameters on the active side, no event on the passive side),
//! and ids of mixed states in one map through [`AnyId`].
#![forbid(unsafe_code)]

mod support;

use std::net::Ipv4Addr;

use evchan_core::cm::state::{
    AddrResolved, Connected, Datagram, Disconnected, Listening, RouteResolved,
};
use evchan_core::cm::{AnyId, ConnParam, EventKind, PortSpace, Status};
use evchan_core::verbs::QpInit;
use evchan_core::{CmId, Error, EventChannel};
use support::*;

#[test]
fn connect_without_qp_gets_connect_response_then_establish() {
    require_device!();
    let addr = v4(port(1));
    let (sch, cch) = channels();
    let _listening = listener(&sch, PortSpace::Tcp, addr);

    // No `create_qp`: the QP is "ours to manage"; announce a QP number by hand.
    let client = routed(&cch, PortSpace::Tcp, addr)
        .connect(&ConnParam::new().qp_num(0xabcd).private_data(b"no qp"))
        .unwrap();
    assert_eq!(client.qp_num(), None);

    let mut req = expect_event(&sch, EventKind::ConnectRequest);
    assert_eq!(req.conn_info().unwrap().qp_num, 0xabcd, "{req:?}");
    assert!(req.private_data().starts_with(b"no qp"));
    let mut server = req.take_request().unwrap();
    req.ack();
    server.create_qp(&QpInit::new()).unwrap();
    let server_qp = server.qp_num().unwrap();
    let server = server
        .accept(&ConnParam::new().private_data(b"reply"))
        .unwrap();

    // The active side gets CONNECT_RESPONSE, not ESTABLISHED, and `established` says so.
    let ev = next_event(&cch, "CONNECT_RESPONSE");
    assert_eq!(ev.kind(), EventKind::ConnectResponse, "{ev:?}");
    assert!(ev.is_for(&client));
    assert_eq!(ev.conn_info().unwrap().qp_num, server_qp);
    assert!(ev.private_data().starts_with(b"reply"), "{ev:?}");
    let err = client.established(&ev).unwrap_err();
    assert!(
        matches!(&err.error, Error::UnexpectedEvent(u) if u.got == EventKind::ConnectResponse),
        "{err}"
    );
    let client = err.into_id().establish(&ev).unwrap();
    ev.ack();
    // Nothing more on the active side; the RTU gives the passive side its ESTABLISHED.
    let ev = expect_event(&sch, EventKind::Established);
    let server = server.established(&ev).unwrap();
    ev.ack();
    assert!(cch.try_get_event().unwrap().is_none());

    let client = client.disconnect().unwrap();
    let ev = expect_event(&sch, EventKind::Disconnected);
    assert!(ev.is_for(&server));
    ev.ack();
    let _server = server.disconnect().unwrap();
    let ev = expect_event(&cch, EventKind::Disconnected);
    assert!(ev.is_for(&client));
}

#[test]
fn establish_refuses_established() {
    require_device!();
    let addr = v4(port(2));
    let (sch, cch) = channels();
    let _listening = listener(&sch, PortSpace::Tcp, addr);
    let client = connecting(&cch, PortSpace::Tcp, addr, &ConnParam::new());
    let (_server, _) = accept_request(&sch, &ConnParam::new());
    let ev = expect_event(&cch, EventKind::Established);
    let err = client.establish(&ev).unwrap_err();
    assert!(matches!(err.error, Error::UnexpectedEvent(_)), "{err}");
    let _client = err.into_id().established(&ev).unwrap();
}

#[test]
fn sidr_udp_connect_accept_with_ud_parameters_and_private_data() {
    require_device!();
    let addr = v4(port(3));
    let (sch, cch) = channels();
    let _listening = listener(&sch, PortSpace::Udp, addr);
    let mut client = routed(&cch, PortSpace::Udp, addr);
    client.create_qp(&QpInit::new()).unwrap();
    let client_qp = client.qp_num().unwrap();
    // UDP connect carries up to 180 bytes.
    let hello = [0x5a_u8; 180];
    let client = client
        .connect(&ConnParam::new().private_data(&hello))
        .unwrap();

    let mut req = expect_event(&sch, EventKind::ConnectRequest);
    assert!(req.private_data().starts_with(&hello), "{req:?}");
    let ud = req.ud_info().expect("a UDP request has UD parameters");
    eprintln!("SIDR REQ ud params: {ud:?}");
    assert!(req.conn_info().is_none());
    let mut server = req.take_request().unwrap();
    req.ack();
    server.create_qp(&QpInit::new()).unwrap();
    let server_qp = server.qp_num().unwrap();
    assert_ne!(server_qp, client_qp);

    // `accept` would leave the id waiting for an event that never comes: refused, id back.
    let err = server.accept(&ConnParam::new()).unwrap_err();
    assert!(
        matches!(
            err.error,
            Error::WrongPortSpace {
                port_space: PortSpace::Udp,
                ..
            }
        ),
        "{err}"
    );
    let reply = [0xa5_u8; 136];
    let too_long = [0u8; 137];
    let err = err
        .into_id()
        .accept_datagram(&ConnParam::new().private_data(&too_long))
        .unwrap_err();
    assert!(matches!(err.error, Error::PrivateDataTooLong(_)), "{err}");
    let server: CmId<'_, Datagram> = err
        .into_id()
        .accept_datagram(&ConnParam::new().private_data(&reply))
        .unwrap();

    let ev = next_event(&cch, "ESTABLISHED (SIDR REP)");
    assert_eq!(ev.kind(), EventKind::Established, "{ev:?}");
    assert!(ev.is_for(&client));
    assert!(ev.private_data().starts_with(&reply), "{ev:?}");
    // `established` is for connected ids; a UDP id is refused with its id back.
    let err = client.established(&ev).unwrap_err();
    assert!(matches!(err.error, Error::WrongPortSpace { .. }), "{err}");
    let (client, info) = err.into_id().established_datagram(&ev).unwrap();
    ev.ack();
    eprintln!("SIDR REP ud params: {info:?}");
    assert_eq!(info.qp_num, server_qp);
    assert_eq!(info.qkey, RDMA_UDP_QKEY);
    let grh = info
        .ah_attr
        .global
        .expect("RoCE address vectors are global");
    assert_eq!(
        grh.dgid_ip().to_ipv4_mapped(),
        Some(Ipv4Addr::new(169, 254, 77, 1)),
        "RoCE v2 GID of the server: {grh:?}"
    );
    assert_eq!(info.ah_attr.port_num, client.port_num());

    // Neither side gets another event; both ids just go.
    assert!(sch.try_get_event().unwrap().is_none());
    assert!(cch.try_get_event().unwrap().is_none());
    drop((client, server));
}

#[test]
fn sidr_without_listener_is_unreachable_with_a_sidr_status() {
    require_device!();
    let cch = EventChannel::new().unwrap();
    let client = connecting(&cch, PortSpace::Udp, v4(port(4)), &ConnParam::new());
    let ev = next_event(&cch, "UNREACHABLE");
    eprintln!("SIDR to nobody: {ev:?}");
    assert_eq!(ev.kind(), EventKind::Unreachable, "{ev:?}");
    assert!(ev.is_for(&client));
    // A positive SIDR status (1, IB_SIDR_UNSUPPORTED), not an errno.
    assert_eq!(ev.status(), Status::Other(ev.raw_status()), "{ev:?}");
    assert!(ev.raw_status() > 0);
    let err = client.established_datagram(&ev).unwrap_err();
    assert!(matches!(err.error, Error::UnexpectedEvent(_)), "{err}");
}

#[test]
fn any_id_holds_mixed_states_and_checks_them_at_run_time() {
    require_device!();
    let addr = v4(port(5));
    let ch = EventChannel::new().unwrap();
    let listening = listener(&ch, PortSpace::Tcp, addr);
    let mut ids: std::collections::HashMap<_, AnyId<'_>> = std::collections::HashMap::new();
    let lkey = listening.key();
    ids.insert(lkey, listening.erase());
    let client = CmId::new(&ch, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, addr, RESOLVE_TIMEOUT)
        .unwrap();
    let ckey = client.key();
    ids.insert(ckey, client.into());

    // A wrong downcast gives the id back.
    let err = ids
        .remove(&ckey)
        .unwrap()
        .downcast::<Connected>()
        .unwrap_err();
    assert!(
        matches!(
            err.error,
            Error::WrongState {
                expected: "Connected",
                actual: "ResolvingAddr"
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "the id is in state `ResolvingAddr`, not Connected"
    );
    ids.insert(ckey, err.into_id());
    // A listener waits for no event of its own.
    assert!(ids[&lkey].is::<Listening>());

    // Drive both sides from one loop, one channel, one map.
    let mut server_key = None;
    let mut established = 0;
    while established < 2 {
        let mut ev = next_event(&ch, "the next step");
        assert!(ev.status().is_success(), "{ev:?}");
        let key = ev.id();
        match ev.kind() {
            EventKind::ConnectRequest => {
                let mut id = ev.take_request().unwrap();
                id.create_qp(&QpInit::new()).unwrap();
                server_key = Some(key);
                ids.insert(key, id.accept(&ConnParam::new()).unwrap().erase());
            }
            _ => {
                let id = ids.remove(&key).unwrap().complete(&ev).unwrap();
                let id = if id.is::<AddrResolved>() {
                    let id = id.downcast::<AddrResolved>().unwrap();
                    id.resolve_route(RESOLVE_TIMEOUT).unwrap().erase()
                } else if id.is::<RouteResolved>() {
                    let mut id = id.downcast::<RouteResolved>().unwrap();
                    id.create_qp(&QpInit::new()).unwrap();
                    id.connect(&ConnParam::new()).unwrap().erase()
                } else {
                    assert!(id.is::<Connected>(), "unexpected state {}", id.state());
                    established += 1;
                    id
                };
                ids.insert(key, id);
            }
        }
    }
    let server = ids.remove(&server_key.unwrap()).unwrap();
    assert_eq!(server.state(), "Connected");
    let server = server.disconnect().unwrap();
    assert!(server.is::<Disconnected>());
    let err = server.disconnect().unwrap_err();
    assert!(
        matches!(
            err.error,
            Error::WrongState {
                actual: "Disconnected",
                ..
            }
        ),
        "{err}"
    );

    // The client's DISCONNECTED completes nothing: a connected id waits for no event.
    let ev = expect_event(&ch, EventKind::Disconnected);
    assert_eq!(ev.id(), ckey);
    let err = ids.remove(&ckey).unwrap().complete(&ev).unwrap_err();
    assert!(
        matches!(
            err.error,
            Error::WrongState {
                actual: "Connected",
                ..
            }
        ),
        "{err}"
    );
    let client = err.into_id().downcast::<Connected>().unwrap();
    drop(ev);
    let _client = client.disconnect().unwrap();
}

#[test]
fn sidr_reject_is_unreachable_with_the_rejecters_private_data() {
    require_device!();
    let addr = v4(port(6));
    let (sch, cch) = channels();
    let _listening = listener(&sch, PortSpace::Udp, addr);
    let client = connecting(&cch, PortSpace::Udp, addr, &ConnParam::new());
    let (server, _) = request(&sch);
    // A UDP reject is a SIDR REP too: 136 bytes at most.
    let err = server.reject(&[0; 137]).unwrap_err();
    assert!(matches!(err.error, Error::PrivateDataTooLong(_)), "{err}");
    err.into_id().reject(b"not you").unwrap();

    let ev = next_event(&cch, "UNREACHABLE (SIDR reject)");
    eprintln!("SIDR reject: {ev:?}");
    assert_eq!(ev.kind(), EventKind::Unreachable, "{ev:?}");
    assert!(ev.is_for(&client));
    // IB_SIDR_REJECT (2): a positive SIDR status, typed as such, not as an errno.
    assert_eq!(ev.status(), Status::Other(2), "{ev:?}");
    assert!(ev.private_data().starts_with(b"not you"), "{ev:?}");
}
