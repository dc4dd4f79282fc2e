//! Shared helpers of the integration tests, for every test binary.
//!
//! Device tests start with [`require_device!`]: without a usable RDMA device the test prints
//! `skipping <test>: <reason>` to stderr and returns, unless `EVCHAN_REQUIRE_DEVICE=1` (the VM
//! runner and CI), where it fails with the reason. Nothing real is ever skipped silently.
//!
//! - this module: the VM's addresses, ports, events, deadlines, and the rdma_cm steps every
//!   connection test repeats (a listener, a resolved or routed id, a connect/accept handshake);
//! - [`verbs`]: the device context, loopback QP pairs and event-driven completion waits;
//! - [`owned`]: connections over owned-style objects (`QpHandle`, slot pools);
//! - [`tool`] and [`interop`]: rdma-core's programs as subprocesses, for the interop tests.
#![allow(dead_code, unused_macros)]

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use evchan_core::cm::state::{
    AddrResolved, Connected, Connecting, Listening, Requested, RouteResolved,
};
use evchan_core::cm::{ConnParam, EventKind, PortSpace};
use evchan_core::verbs::QpInit;
use evchan_core::{CmEvent, CmId, EventChannel};

pub mod interop;
#[cfg(feature = "tokio")]
pub mod owned;
pub mod tool;
pub mod verbs;

/// The soft-RoCE VM's IPv4 address (on `dummy0`).
pub const VM_V4: &str = "169.254.77.1";
/// [`VM_V4`] as an address.
pub const VM_IPV4: Ipv4Addr = Ipv4Addr::new(169, 254, 77, 1);
/// The soft-RoCE VM's IPv6 link-local address (on `dummy0`).
pub const VM_V6: &str = "fe80::ff:fe00:1";
/// The interface that carries both.
pub const VM_IF: &str = "dummy0";

/// `RDMA_UDP_QKEY`, the QKey rdma_cm gives UD QPs of the UDP port space.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// How long any one event may take to arrive before a test fails (TCG is slow).
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);
/// The timeout given to address and route resolution.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `EVCHAN_REQUIRE_DEVICE=1`: a missing device (or tool) fails the test.
pub fn device_required() -> bool {
    std::env::var("EVCHAN_REQUIRE_DEVICE").is_ok_and(|v| v == "1")
}

/// `Err(reason)` when there is no usable device (see [`require_device!`]).
pub fn probe() -> Result<Vec<String>, String> {
    evchan_core::device::probe().map_err(|e| e.to_string())
}

/// The one skip rule: prints `skipping <test>: <reason>`, or fails the test with `reason` when
/// `EVCHAN_REQUIRE_DEVICE=1`. The caller returns from the test after it.
#[track_caller]
pub fn skip(reason: &str) {
    let current = std::thread::current();
    let test = current.name().unwrap_or("<unnamed test>");
    assert!(
        !device_required(),
        "{test}: EVCHAN_REQUIRE_DEVICE=1 but {reason}"
    );
    eprintln!("skipping {test}: {reason}");
}

/// Skips (returns from) the calling test without a device, or fails it when
/// `EVCHAN_REQUIRE_DEVICE=1`.
#[macro_export]
macro_rules! require_device {
    () => {
        if let Err(reason) = $crate::support::probe() {
            $crate::support::skip(&reason);
            return;
        }
    };
}

/// `169.254.77.1:port`.
pub fn v4(port: u16) -> SocketAddr {
    SocketAddr::new(VM_IPV4.into(), port)
}

/// `[fe80::ff:fe00:1%dummy0]:port`.
pub fn v6(port: u16) -> SocketAddr {
    let scope = evchan_core::if_index(VM_IF).expect("the VM's dummy0 interface");
    let ip: Ipv6Addr = VM_V6.parse().unwrap();
    SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope))
}

/// A port for one test, distinct per test binary and call so that tests do not collide.
pub fn port(n: u16) -> u16 {
    20000 + (std::process::id() % 1000) as u16 * 20 + n
}

/// The next event within [`EVENT_TIMEOUT`], or a panic that says what was awaited.
pub fn next_event<'ch>(channel: &'ch EventChannel, what: &str) -> CmEvent<'ch> {
    match channel.get_event_timeout(EVENT_TIMEOUT) {
        Ok(Some(ev)) => ev,
        Ok(None) => panic!("no event within {EVENT_TIMEOUT:?} while waiting for {what}"),
        Err(e) => panic!("rdma_get_cm_event failed while waiting for {what}: {e}"),
    }
}

/// The next event, asserted to be `kind` with status 0.
pub fn expect_event<'ch>(channel: &'ch EventChannel, kind: EventKind) -> CmEvent<'ch> {
    let ev = next_event(channel, kind.name());
    assert_eq!(ev.kind(), kind, "unexpected event {ev:?}");
    assert_eq!(ev.raw_status(), 0, "status of {ev:?}");
    ev
}

/// Aborts the process with `what` if `f` has not returned within `limit`: a test that would
/// hang (in C, a destroy waiting for an ack forever) fails instead of stalling the binary.
pub fn within<T>(limit: Duration, what: &str, f: impl FnOnce() -> T) -> T {
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let what = what.to_owned();
    let start = Instant::now();
    std::thread::spawn(move || {
        while start.elapsed() < limit {
            if flag.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("HANG: {what} did not return within {limit:?}");
        std::process::abort();
    });
    let out = f();
    done.store(true, Ordering::Release);
    out
}

/// Open file descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

mod cpu;
#[allow(unused_imports)]
pub use cpu::thread_cpu_ticks;

/// How many objects of `kind` (`cm_id`, `qp`, `cq`, `pd`, `mr`, `ctx`) `rdma resource show`
/// lists for this process; `None` without the `rdma` tool.
pub fn rdma_objects_of_process(kind: &str) -> Option<usize> {
    // The kernel reports the id of the creating *thread* (the test's, not the process's).
    let tids: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .map(|t| format!(" pid {} ", t.file_name().to_string_lossy()))
        .collect();
    let o = std::process::Command::new("rdma")
        .args(["resource", "show", kind])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&o.stdout);
    Some(
        text.lines()
            .filter(|l| tids.iter().any(|t| l.contains(t.as_str())))
            .count(),
    )
}

/// Resident set size of this process, in bytes.
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Two event channels: the server's and the client's.
pub fn channels() -> (EventChannel, EventChannel) {
    (EventChannel::new().unwrap(), EventChannel::new().unwrap())
}

/// A listener on `addr` in port space `ps`.
pub fn listener(channel: &EventChannel, ps: PortSpace, addr: SocketAddr) -> CmId<'_, Listening> {
    CmId::new(channel, ps)
        .unwrap()
        .bind(addr)
        .unwrap()
        // Not less: tools connect in bursts, and a request beyond the backlog is dropped
        // and sent again only after ~4 s (cmtime -c 100 against a backlog of 64: 6.4 s).
        .listen(1024)
        .unwrap()
}

/// An active id on `ch` with its address `dst` resolved (its `ADDR_RESOLVED` acked).
pub fn resolved(ch: &EventChannel, ps: PortSpace, dst: SocketAddr) -> CmId<'_, AddrResolved> {
    let id = CmId::new(ch, ps)
        .unwrap()
        .resolve_addr(None, dst, RESOLVE_TIMEOUT)
        .unwrap();
    let ev = expect_event(ch, EventKind::AddrResolved);
    let id = id.addr_resolved(&ev).unwrap();
    ev.ack();
    id
}

/// An active id on `ch` with its route to `dst` resolved (both events acked), no QP yet.
pub fn routed(ch: &EventChannel, ps: PortSpace, dst: SocketAddr) -> CmId<'_, RouteResolved> {
    let id = resolved(ch, ps, dst)
        .resolve_route(RESOLVE_TIMEOUT)
        .unwrap();
    let ev = expect_event(ch, EventKind::RouteResolved);
    let id = id.route_resolved(&ev).unwrap();
    ev.ack();
    id
}

/// A client on `ch` in port space `ps` with librdmacm's QP, connecting to `dst` with `param`
/// (on the UDP port space: resolving the service ID, SIDR).
pub fn connecting<'ch>(
    ch: &'ch EventChannel,
    ps: PortSpace,
    dst: SocketAddr,
    param: &ConnParam<'_>,
) -> CmId<'ch, Connecting> {
    let mut id = routed(ch, ps, dst);
    id.create_qp(&QpInit::new()).unwrap();
    assert!(id.qp_num().is_some());
    id.connect(param).unwrap()
}

/// The next event on `ch`, a `CONNECT_REQUEST` (acked): its new id and its private data.
pub fn request(ch: &EventChannel) -> (CmId<'_, Requested>, Vec<u8>) {
    let mut ev = expect_event(ch, EventKind::ConnectRequest);
    let data = ev.private_data().to_vec();
    let id = ev
        .take_request()
        .expect("CONNECT_REQUEST hands over the new id");
    ev.ack();
    (id, data)
}

/// The next request on `ch`, given librdmacm's QP and accepted with `param`; with the
/// request's private data.
pub fn accept_request<'ch>(
    ch: &'ch EventChannel,
    param: &ConnParam<'_>,
) -> (CmId<'ch, Connecting>, Vec<u8>) {
    let (mut id, data) = request(ch);
    id.create_qp(&QpInit::new()).unwrap();
    (id.accept(param).unwrap(), data)
}

/// `id`'s `ESTABLISHED` on `ch`, asserted to be its own, acked: the connected id and the
/// peer's private data.
pub fn established<'ch>(
    ch: &EventChannel,
    id: CmId<'ch, Connecting>,
) -> (CmId<'ch, Connected>, Vec<u8>) {
    let ev = expect_event(ch, EventKind::Established);
    assert!(ev.is_for(&id), "{ev:?}");
    let data = ev.private_data().to_vec();
    let id = id.established(&ev).unwrap();
    ev.ack();
    (id, data)
}

/// A client on `cch` connected to the listener on `sch` at `addr`, with private data both
/// ways (asserted): `(server, client)`.
pub fn connected_pair<'s, 'c>(
    sch: &'s EventChannel,
    cch: &'c EventChannel,
    addr: SocketAddr,
    hello: &[u8],
    welcome: &[u8],
) -> (CmId<'s, Connected>, CmId<'c, Connected>) {
    let client = connecting(
        cch,
        PortSpace::Tcp,
        addr,
        &ConnParam::new().private_data(hello),
    );
    let (server, data) = accept_request(sch, &ConnParam::new().private_data(welcome));
    assert!(
        data.starts_with(hello),
        "CONNECT_REQUEST private data: {data:?}"
    );
    let (client, data) = established(cch, client);
    assert!(
        data.starts_with(welcome),
        "ESTABLISHED private data: {data:?}"
    );
    let (server, _) = established(sch, server);
    (server, client)
}

/// The client disconnects (a DREQ): the server sees `DISCONNECTED` and answers with its own
/// `rdma_disconnect` (the DREP), upon which the client sees `DISCONNECTED` too. Events acked.
pub fn disconnect_pair<'s, 'c>(
    sch: &'s EventChannel,
    cch: &'c EventChannel,
    server: CmId<'s, Connected>,
    client: CmId<'c, Connected>,
) -> (
    CmId<'s, evchan_core::cm::state::Disconnected>,
    CmId<'c, evchan_core::cm::state::Disconnected>,
) {
    let client = client.disconnect().unwrap();
    let ev = expect_event(sch, EventKind::Disconnected);
    assert!(ev.is_for(&server), "{ev:?}");
    ev.ack();
    let server = server.disconnect().unwrap();
    let ev = expect_event(cch, EventKind::Disconnected);
    assert!(ev.is_for(&client), "{ev:?}");
    ev.ack();
    (server, client)
}
