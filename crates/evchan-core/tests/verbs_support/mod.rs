//! Shared helpers of the verbs device tests.
//!
//! [`require_device!`] opens the first RDMA device, or skips the test with a line on stderr —
//! unless `EVCHAN_REQUIRE_DEVICE=1` (the VM runner and CI), where a missing device fails it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use evchan_core::verbs::{Context, DeviceList, Gid, GidType, Qp, RtrAttr, RtsAttr};

/// The address the VM gives `dummy0`, under soft-RoCE device rxe0.
pub const VM_IPV4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(169, 254, 77, 1);

/// Opens the device, or says why not: `Err(reason)`.
pub fn open_device() -> Result<Context, String> {
    let list = DeviceList::new().map_err(|e| e.to_string())?;
    if list.is_empty() {
        return Err(evchan_core::verbs::Error::NoDevice.to_string());
    }
    let dev = list
        .find("rxe0")
        .or_else(|| list.iter().next())
        .expect("non-empty");
    dev.open().map_err(|e| e.to_string())
}

/// Whether a missing device must fail the test.
pub fn device_required() -> bool {
    std::env::var("EVCHAN_REQUIRE_DEVICE").is_ok_and(|v| v == "1")
}

/// Opens the device or returns from the test (skip), or panics when a device is required.
#[macro_export]
macro_rules! require_device {
    ($test:expr) => {
        match $crate::verbs_support::open_device() {
            Ok(ctx) => ctx,
            Err(reason) if $crate::verbs_support::device_required() => {
                panic!("{}: EVCHAN_REQUIRE_DEVICE=1 but {reason}", $test)
            }
            Err(reason) => {
                eprintln!("skipping {}: {reason}", $test);
                return;
            }
        }
    };
}

/// The RoCE v2 GID of 169.254.77.1 on port 1, or else any RoCE v2 GID, or else the last GID.
pub fn loopback_gid(ctx: &Context) -> Gid {
    let gids = ctx.gids(1).expect("ibv_query_gid_ex on port 1");
    let v2 = |g: &&Gid| g.gid_type == GidType::RoceV2;
    gids.iter()
        .filter(v2)
        .find(|g| g.ipv4() == Some(VM_IPV4))
        .or_else(|| gids.iter().find(v2))
        .or(gids.last())
        .copied()
        .expect("port 1 has a GID")
}

/// Connects two RC QPs of one device to each other (RESET → INIT → RTR → RTS), over `gid`:
/// rxe loops the traffic back internally.
pub fn connect_pair(a: &Qp<'_>, b: &Qp<'_>, gid: &Gid, rts: RtsAttr) {
    for (qp, peer) in [(a, b), (b, a)] {
        qp.modify_to_init(1).expect("RESET -> INIT");
        qp.modify_to_rtr(&RtrAttr::new(1, peer.qp_num(), gid, gid.raw))
            .expect("INIT -> RTR");
        qp.modify_to_rts(&rts).expect("RTR -> RTS");
    }
}

/// Aborts the process with `what` if `f` has not returned within `limit`: a test that would
/// hang fails instead.
pub fn within<T>(limit: Duration, what: &str, f: impl FnOnce() -> T) -> T {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    let what = what.to_owned();
    let start = Instant::now();
    std::thread::spawn(move || {
        while start.elapsed() < limit {
            if flag.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("HANG: {what} did not return within {limit:?}");
        std::process::abort();
    });
    let out = f();
    done.store(true, std::sync::atomic::Ordering::Release);
    out
}
