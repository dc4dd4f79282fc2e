//! Device test: 1,000 connect/accept/disconnect cycles leave the fd count and RSS flat.

mod support;

use std::net::SocketAddr;

use evchan_core::cm::{ConnParam, EventKind, PortSpace};
use evchan_core::verbs::QpInit;
use evchan_core::{CmId, EventChannel};
use support::*;

const CYCLES: usize = 1000;
const WARM_UP: usize = 50;
/// RSS may grow this much over the cycles (allocator noise), not per cycle.
const RSS_SLACK: u64 = 4 << 20;

/// One full cycle: resolve, connect, accept, establish, disconnect, destroy.
fn cycle(sch: &EventChannel, cch: &EventChannel, addr: SocketAddr) {
    let id = CmId::new(cch, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, addr, RESOLVE_TIMEOUT)
        .unwrap();
    let id = id
        .addr_resolved(&expect_event(cch, EventKind::AddrResolved))
        .unwrap()
        .resolve_route(RESOLVE_TIMEOUT)
        .unwrap();
    let mut client = id
        .route_resolved(&expect_event(cch, EventKind::RouteResolved))
        .unwrap();
    client.create_qp(&QpInit::new()).unwrap();
    let client = client
        .connect(&ConnParam::new().private_data(b"cycle"))
        .unwrap();

    let mut req = expect_event(sch, EventKind::ConnectRequest);
    let mut server = req.take_request().unwrap();
    req.ack();
    server.create_qp(&QpInit::new()).unwrap();
    let server = server.accept(&ConnParam::new()).unwrap();
    let client = client
        .established(&expect_event(cch, EventKind::Established))
        .unwrap();
    let server = server
        .established(&expect_event(sch, EventKind::Established))
        .unwrap();

    let client = client.disconnect().unwrap();
    expect_event(sch, EventKind::Disconnected).ack();
    let server = server.disconnect().unwrap();
    expect_event(cch, EventKind::Disconnected).ack();
    drop(client);
    drop(server);
}

#[test]
fn connect_accept_disconnect_cycles_do_not_leak() {
    require_device!();
    let addr = v4(port(1));
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let _listening = CmId::new(&sch, PortSpace::Tcp)
        .unwrap()
        .bind(addr)
        .unwrap()
        .listen(16)
        .unwrap();
    for _ in 0..WARM_UP {
        cycle(&sch, &cch, addr);
    }
    let (fds, rss) = (fd_count(), rss_bytes());
    let start = std::time::Instant::now();
    for _ in 0..CYCLES {
        cycle(&sch, &cch, addr);
    }
    let (fds_after, rss_after) = (fd_count(), rss_bytes());
    eprintln!(
        "{CYCLES} cycles in {:?}: fds {fds} -> {fds_after}, RSS {rss} -> {rss_after} bytes",
        start.elapsed()
    );
    assert_eq!(fds_after, fds, "file descriptors leaked");
    assert!(
        rss_after <= rss + RSS_SLACK,
        "RSS grew by {} bytes over {CYCLES} cycles",
        rss_after.saturating_sub(rss)
    );
}
