//! Device test: 1,000 connect/accept/disconnect cycles leave the fd count and RSS flat.

mod support;

use std::net::SocketAddr;

use evchan_core::cm::PortSpace;
use evchan_core::EventChannel;
use support::*;

const CYCLES: usize = 1000;
const WARM_UP: usize = 50;
/// RSS may grow this much over the cycles (allocator noise), not per cycle.
const RSS_SLACK: u64 = 4 << 20;

/// One full cycle: resolve, connect, accept, establish, disconnect, destroy.
fn cycle(sch: &EventChannel, cch: &EventChannel, addr: SocketAddr) {
    let (server, client) = connected_pair(sch, cch, addr, b"cycle", b"");
    let (server, client) = disconnect_pair(sch, cch, server, client);
    drop(client);
    drop(server);
}

#[test]
fn connect_accept_disconnect_cycles_do_not_leak() {
    require_device!();
    let addr = v4(port(1));
    let (sch, cch) = channels();
    let _listening = listener(&sch, PortSpace::Tcp, addr);
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
