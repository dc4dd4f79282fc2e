//! Shared helpers of the integration tests.
//!
//! Device tests start with [`require_device!`]: without a usable RDMA device the test prints
//! `skipping <test>: <reason>` to stderr and returns, unless `EVCHAN_REQUIRE_DEVICE=1`, in which
//! case it fails with the reason. Nothing real is ever skipped silently.
#![allow(dead_code, unused_macros)]

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

use evchan_core::{cm, CmEvent, EventChannel};

/// The soft-RoCE VM's IPv4 address (on `dummy0`).
pub const VM_V4: &str = "169.254.77.1";
/// The soft-RoCE VM's IPv6 link-local address (on `dummy0`).
pub const VM_V6: &str = "fe80::ff:fe00:1";
/// The interface that carries both.
pub const VM_IF: &str = "dummy0";

/// How long any one event may take to arrive before a test fails (TCG is slow).
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);
/// The timeout given to address and route resolution.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `EVCHAN_REQUIRE_DEVICE=1`.
pub fn device_required() -> bool {
    std::env::var("EVCHAN_REQUIRE_DEVICE").is_ok_and(|v| v == "1")
}

/// `Err(reason)` when there is no usable device (see [`require_device!`]).
pub fn probe() -> Result<Vec<String>, String> {
    evchan_core::device::probe().map_err(|e| e.to_string())
}

/// Skips (returns from) the calling test without a device, or fails it when
/// `EVCHAN_REQUIRE_DEVICE=1`.
#[macro_export]
macro_rules! require_device {
    () => {
        if let Err(reason) = $crate::support::probe() {
            let test = std::thread::current()
                .name()
                .unwrap_or("<unnamed test>")
                .to_owned();
            if $crate::support::device_required() {
                panic!("{test}: EVCHAN_REQUIRE_DEVICE=1 but {reason}");
            }
            eprintln!("skipping {test}: {reason}");
            return;
        }
    };
}

/// `169.254.77.1:port`.
pub fn v4(port: u16) -> SocketAddr {
    SocketAddr::new(VM_V4.parse().unwrap(), port)
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
pub fn expect_event<'ch>(channel: &'ch EventChannel, kind: cm::EventKind) -> CmEvent<'ch> {
    let ev = next_event(channel, kind.name());
    assert_eq!(ev.kind(), kind, "unexpected event {ev:?}");
    assert_eq!(ev.raw_status(), 0, "status of {ev:?}");
    ev
}

/// Runs `f` on a thread and fails if it has not finished within `deadline` (a hang would
/// otherwise stall the whole test binary).
pub fn within<T: Send + 'static>(
    deadline: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(deadline) {
        Ok(v) => v,
        Err(_) => panic!(
            "{what} did not finish within {deadline:?} (started {:?} ago)",
            start.elapsed()
        ),
    }
}

/// Open file descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Resident set size of this process, in bytes.
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}
