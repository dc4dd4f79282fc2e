//! Helpers of the two-host tests (`tests/device_two_host*.rs`), run by `cargo xtask vm --hosts 2`.
#![allow(dead_code)]

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

/// `fe80::…%eth0` from `$var` as a socket address on `port`.
pub fn env_addr(var: &str, port: u16) -> SocketAddr {
    let s = std::env::var(var)
        .unwrap_or_else(|_| panic!("${var} is not set (run under cargo xtask vm --hosts 2)"));
    let (ip, ifname) = s
        .split_once('%')
        .unwrap_or_else(|| panic!("${var}={s}: no %interface"));
    let ip: Ipv6Addr = ip.parse().unwrap_or_else(|e| panic!("${var}={s}: {e}"));
    let scope = evchan_core::if_index(ifname)
        .unwrap_or_else(|| panic!("${var}={s}: no interface {ifname}"));
    SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope))
}

/// Whether `EVCHAN_ROLE` is `role`; prints the skip line when not.
pub fn role_is(role: &str) -> bool {
    match std::env::var("EVCHAN_ROLE") {
        Ok(r) if r == role => true,
        r => {
            let current = std::thread::current();
            eprintln!(
                "skipping {}: EVCHAN_ROLE={r:?}, not {role:?} (a two-host test: run it with \
                 `cargo xtask vm --hosts 2`, see this file's docs)",
                current.name().unwrap_or("<unnamed test>")
            );
            false
        }
    }
}

/// Asks the VM runner for a fault (`evchan-vm-fault ARGS`, see `crates/cargo-rxe/src/vm/fault.sh`)
/// and waits for it to be done; the instant it was done (as this VM's clock saw the answer).
#[track_caller]
pub fn fault(request: &str) -> Instant {
    let helper = std::env::var("EVCHAN_VM_FAULT")
        .expect("$EVCHAN_VM_FAULT: the VM runner's fault hook (run under cargo xtask vm)");
    let asked = Instant::now();
    let st = std::process::Command::new("sh")
        .arg(&helper)
        .args(request.split_whitespace())
        .status()
        .unwrap_or_else(|e| panic!("cannot run {helper}: {e}"));
    assert!(
        st.success(),
        "the runner refused or failed `{request}`: {st}"
    );
    let done = Instant::now();
    eprintln!(
        "fault `{request}`: asked and answered in {} ms",
        (done - asked).as_millis()
    );
    done
}

/// Whether `iface` has a carrier (`/sys/class/net/IFACE/carrier`).
pub fn carrier(iface: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/carrier"))
        .is_ok_and(|s| s.trim() == "1")
}

/// Polls `cond` every 10 ms until it holds; the instant it was seen, or a panic after `within`.
pub async fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) -> Instant {
    let start = Instant::now();
    loop {
        if cond() {
            return Instant::now();
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
