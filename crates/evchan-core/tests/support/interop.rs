//! Helpers of the interop tests (`device_interop.rs`): ids that talk to rdma-core's tools.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use evchan_core::cm::state::{Connecting, RouteResolved, State};
use evchan_core::cm::{ConnParam, EventKind, IdKey, PortSpace, RejectReason, Status};
use evchan_core::verbs::QpInit;
use evchan_core::{CmEvent, CmId, EventChannel};

use super::tool::{Output, Tool};
use super::{expect_event, next_event, RESOLVE_TIMEOUT};

/// A listener on `addr` in port space `ps`.
pub fn listener(channel: &EventChannel, ps: PortSpace, addr: SocketAddr) -> CmId<'_, impl State> {
    CmId::new(channel, ps)
        .unwrap()
        .bind(addr)
        .unwrap()
        // Not less: tools connect in bursts, and a request beyond the backlog is dropped
        // and sent again only after ~4 s (cmtime -c 100 against a backlog of 64: 6.4 s).
        .listen(1024)
        .unwrap()
}

/// An active id on `ch` with its route to `dst` resolved and its QP created.
pub fn routed(ch: &EventChannel, ps: PortSpace, dst: SocketAddr) -> CmId<'_, RouteResolved> {
    let id = CmId::new(ch, ps)
        .unwrap()
        .resolve_addr(None, dst, RESOLVE_TIMEOUT)
        .unwrap();
    let ev = expect_event(ch, EventKind::AddrResolved);
    let id = id.addr_resolved(&ev).unwrap();
    ev.ack();
    let id = id.resolve_route(RESOLVE_TIMEOUT).unwrap();
    let ev = expect_event(ch, EventKind::RouteResolved);
    let mut id = id.route_resolved(&ev).unwrap();
    ev.ack();
    id.create_qp(&QpInit::new()).unwrap();
    id
}

/// Connects to a tool's server that may not listen yet: a connect refused for want of a
/// listener (`REJECTED` reason 8; `UNREACHABLE` for UDP) is retried until it listens. Returns
/// the id, still connecting, and its completing event (ESTABLISHED).
pub fn connect_when_listening<'ch>(
    ch: &'ch EventChannel,
    ps: PortSpace,
    dst: SocketAddr,
    server: &mut Tool,
) -> (CmId<'ch, Connecting>, CmEvent<'ch>) {
    let start = Instant::now();
    loop {
        server.assert_running();
        let id = routed(ch, ps, dst).connect(&ConnParam::new()).unwrap();
        let ev = next_event(ch, "ESTABLISHED from the tool's server");
        assert!(ev.is_for(&id), "{ev:?}");
        let no_listener = match ev.kind() {
            EventKind::Established => return (id, ev),
            EventKind::Rejected => ev.status() == Status::Rejected(RejectReason::NO_LISTENER),
            EventKind::Unreachable => ps == PortSpace::Udp,
            _ => false,
        };
        assert!(no_listener, "connecting to the tool's server: {ev:?}");
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the tool's server never listened"
        );
        drop(ev);
        drop(id);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads one event for each of `ids`, in any order, and applies `f` to the id and its event.
pub fn gather<'ch, S: State, T>(
    ch: &'ch EventChannel,
    ids: Vec<CmId<'ch, S>>,
    what: &str,
    mut f: impl FnMut(CmId<'ch, S>, &CmEvent<'ch>) -> T,
) -> Vec<T> {
    let mut waiting: HashMap<IdKey, CmId<'ch, S>> =
        ids.into_iter().map(|id| (id.key(), id)).collect();
    let mut out = Vec::with_capacity(waiting.len());
    while !waiting.is_empty() {
        let ev = next_event(ch, what);
        let id = waiting
            .remove(&ev.id())
            .unwrap_or_else(|| panic!("{ev:?} is for none of the ids waiting for {what}"));
        out.push(f(id, &ev));
    }
    out
}

/// Starts `n` connects to `dst` on `ch` step by step for all ids at once (resolve all, route
/// all, then connect all), so that no step reads another id's event; returns the connecting ids.
pub fn connect_all<'ch>(
    ch: &'ch EventChannel,
    ps: PortSpace,
    dst: SocketAddr,
    n: usize,
    param: &ConnParam<'_>,
) -> Vec<CmId<'ch, Connecting>> {
    let ids: Vec<_> = (0..n)
        .map(|_| {
            CmId::new(ch, ps)
                .unwrap()
                .resolve_addr(None, dst, RESOLVE_TIMEOUT)
                .unwrap()
        })
        .collect();
    let ids = gather(ch, ids, "ADDR_RESOLVED", |id, ev| {
        id.addr_resolved(ev)
            .unwrap()
            .resolve_route(RESOLVE_TIMEOUT)
            .unwrap()
    });
    gather(ch, ids, "ROUTE_RESOLVED", |id, ev| {
        let mut id = id.route_resolved(ev).unwrap();
        id.create_qp(&QpInit::new()).unwrap();
        id.connect(param).unwrap()
    })
}

/// Asserts a tool's run went well: exit 0 and none of its failure lines.
pub fn assert_clean(out: &Output) {
    assert!(out.status.success(), "tool failed: {out}");
    for bad in ["error", "fail", "UNREACHABLE", "REJECTED"] {
        assert!(!out.stdout.contains(bad), "tool reported `{bad}`: {out}");
    }
}
