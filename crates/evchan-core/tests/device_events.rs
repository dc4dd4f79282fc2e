//! Device tests: rdma_cm events the other tests never see, produced for real on soft-RoCE.
//!
//! - `CONNECT_ERROR`: the active side's QP leaves INIT (`rdma_disconnect` moves it to ERROR)
//!   after the peer's REP arrived and before its `CONNECT_RESPONSE` is read; librdmacm then
//!   fails to move the QP to RTR while it turns the response into `ESTABLISHED`, and reports
//!   `CONNECT_ERROR` (rdma-core `librdmacm/cma.c`, `rdma_get_cm_event`, case
//!   `RDMA_CM_EVENT_CONNECT_RESPONSE` → `ucma_process_conn_resp`). Its status is librdmacm's
//!   return value, -1, not a negative errno.
//! - `MULTICAST_ERROR`: a UDP id joins while its source address's GID is gone from the
//!   device's GID table (the address was deleted after resolution): the kernel's
//!   `cma_iboe_join_multicast` → `cma_make_mc_event` → `ib_init_ah_from_mcmember` finds no
//!   source GID (Linux 6.1, `drivers/infiniband/core/cma.c`, `multicast.c`). Status 0.
//! - `ADDR_CHANGE`: rxe on an active-backup bond with `fail_over_mac active`; the bond fails
//!   over to its other slave and takes that slave's MAC address: `cma_netdev_callback` on
//!   `NETDEV_BONDING_FAILOVER` → `cma_netdev_change` (the id's bound device's address
//!   changed). The bond's rxe device is held open by librdmacm until the process exits, so
//!   the id's part runs in a child process (this test binary, this test,
//!   `EVCHAN_TEST_CHILD`) and the parent removes the device afterwards.
//!
//! `ROUTE_ERROR` cannot be produced on RoCE: see `docs/RELIABILITY.md`.
//!
//! These tests change the VM's network (an address on `dummy0`, a bond and two dummies) and
//! put it back, whatever happens.
#![forbid(unsafe_code)]

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use evchan_core::cm::{ConnParam, EventKind, PortSpace, Status};
use evchan_core::{CmId, EventChannel};
use support::*;

/// A second address on `dummy0` (in the VM's own 169.254.77.0/24), added and deleted here.
const EXTRA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 77, 9);
/// The bond's address (likewise the VM's own, on interfaces made here).
const BOND_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 77, 2);
const BOND: &str = "evbond";
const SLAVES: [(&str, &str); 2] = [
    ("evslave0", "02:00:00:00:00:10"),
    ("evslave1", "02:00:00:00:00:11"),
];
const BOND_RXE: &str = "rxe_evbond";
const STEP: Duration = Duration::from_secs(60);

/// Runs `args` to completion (at most [`STEP`]); whether it succeeded.
fn run(args: &[&str]) -> bool {
    let Ok(mut child) = Command::new(args[0]).args(&args[1..]).spawn() else {
        eprintln!("cannot run {}", args[0]);
        return false;
    };
    let status = tool::wait_for(&mut child, STEP, &args.join(" "));
    if !status.success() {
        eprintln!("{}: {status}", args.join(" "));
    }
    status.success()
}

/// Whether `/sys/class/infiniband/rxe0/ports/1/gids/*` lists the IPv4-mapped GID of `ip`.
fn has_gid(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    let want = format!(
        "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        o[0], o[1], o[2], o[3]
    );
    std::fs::read_dir("/sys/class/infiniband/rxe0/ports/1/gids")
        .map(|d| {
            d.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                .any(|g| g.trim() == want)
        })
        .unwrap_or(false)
}

/// Polls `cond` (at most [`STEP`]).
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < STEP, "{what} not within {STEP:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn connect_error_when_the_qp_left_init_before_the_response() {
    require_device!();
    let (sch, cch) = channels();
    let listening = listener(&sch, PortSpace::Tcp, v4(port(1)));
    let client = connecting(&cch, PortSpace::Tcp, v4(port(1)), &ConnParam::new());
    let (server, _) = accept_request(&sch, &ConnParam::new());
    // The REP is in: the client's channel holds its CONNECT_RESPONSE, not yet read (librdmacm
    // processes it inside rdma_get_cm_event).
    assert!(
        evchan_sys::fd::poll_readable(std::os::fd::AsFd::as_fd(&cch), Some(EVENT_TIMEOUT)).unwrap()
    );
    // rdma_disconnect moves the QP to ERROR (librdmacm's ucma_shutdown); the kernel's
    // disconnect finds the IB CM id still in REP_RCVD and sends nothing.
    let client = client.disconnect().map_err(|e| e.error).unwrap();
    let ev = next_event(&cch, "CONNECT_ERROR");
    assert_eq!(ev.kind(), EventKind::ConnectError, "{ev:?}");
    assert!(ev.is_for(&client), "{ev:?}");
    assert_eq!(ev.raw_status(), -1, "librdmacm's -1: {ev:?}");
    assert!(matches!(ev.status(), Status::Errno(1)), "{ev:?}");
    eprintln!("CONNECT_ERROR: {ev:?}");
    ev.ack();
    // The client's id goes: the IB CM rejects the connection (REJ), the server learns it.
    drop(client);
    let ev = next_event(&sch, "the server's end of the failed connection");
    assert!(ev.is_for(&server), "{ev:?}");
    assert!(
        matches!(
            ev.kind(),
            EventKind::Rejected | EventKind::Unreachable | EventKind::ConnectError
        ),
        "{ev:?}"
    );
    eprintln!("the server's event: {ev:?}");
    ev.ack();
    drop(server);
    drop(listening);
}

/// Deletes [`EXTRA_V4`] from `dummy0` if it is there.
struct DelExtra;

impl Drop for DelExtra {
    fn drop(&mut self) {
        let cidr = format!("{EXTRA_V4}/32");
        let _ = Command::new("ip")
            .args(["addr", "del", &cidr, "dev", VM_IF])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[test]
fn multicast_error_when_the_source_gid_is_gone() {
    require_device!();
    let cidr = format!("{EXTRA_V4}/32");
    let _del = DelExtra;
    assert!(run(&["ip", "addr", "add", &cidr, "dev", VM_IF]));
    wait_until("the GID of the extra address", || has_gid(EXTRA_V4));

    let channel = EventChannel::new().unwrap();
    let src = SocketAddr::new(IpAddr::V4(EXTRA_V4), 0);
    let id = CmId::new(&channel, PortSpace::Udp)
        .unwrap()
        .resolve_addr(Some(src), v4(port(2)), RESOLVE_TIMEOUT)
        .unwrap();
    let ev = expect_event(&channel, EventKind::AddrResolved);
    let mut id = id.addr_resolved(&ev).unwrap();
    ev.ack();
    assert_eq!(id.local_addr().map(|a| a.ip()), Some(IpAddr::V4(EXTRA_V4)));

    assert!(run(&["ip", "addr", "del", &cidr, "dev", VM_IF]));
    wait_until("the GID of the extra address gone", || !has_gid(EXTRA_V4));
    // The group, as in device_cm's join test: the VM's own address (nothing leaves the VM).
    let group = v4(0);
    id.join_multicast(group).unwrap();
    let ev = next_event(&channel, "MULTICAST_ERROR");
    assert_eq!(ev.kind(), EventKind::MulticastError, "{ev:?}");
    assert!(ev.is_for(&id), "{ev:?}");
    assert_eq!(ev.raw_status(), 0, "{ev:?}");
    eprintln!("MULTICAST_ERROR: {ev:?}");
    ev.ack();
    drop(id);
}

/// The parent's cleanup of the bond test: the bond's rxe device, the bond, its slaves.
struct DelBond;

impl Drop for DelBond {
    fn drop(&mut self) {
        if Path::new("/sys/class/infiniband").join(BOND_RXE).exists() {
            run(&["rdma", "link", "delete", BOND_RXE]);
        }
        if evchan_core::if_index(BOND).is_some() {
            run(&["ip", "link", "del", BOND]);
        }
        for (slave, _) in SLAVES {
            if evchan_core::if_index(slave).is_some() {
                run(&["ip", "link", "del", slave]);
            }
        }
    }
}

#[test]
fn addr_change_on_bonding_failover() {
    if tool::is_child("addr_change_on_bonding_failover") {
        return addr_change_child();
    }
    require_device!();
    if !Path::new("/sys/class/net/bonding_masters").exists() {
        skip("no bonding driver (the VM loads the bonding module)");
        return;
    }
    let _del = DelBond;
    let bond_cidr = format!("{BOND_V4}/32");
    let mut setup: Vec<Vec<&str>> = vec![vec![
        "ip",
        "link",
        "add",
        BOND,
        "type",
        "bond",
        "mode",
        "active-backup",
        "fail_over_mac",
        "active",
    ]];
    for (slave, mac) in SLAVES {
        setup.push(vec!["ip", "link", "add", slave, "type", "dummy"]);
        setup.push(vec!["ip", "link", "set", slave, "address", mac]);
        setup.push(vec!["ip", "link", "set", slave, "master", BOND]);
    }
    setup.push(vec!["ip", "link", "set", BOND, "up"]);
    setup.push(vec!["ip", "addr", "add", &bond_cidr, "dev", BOND]);
    setup.push(vec![
        "rdma", "link", "add", BOND_RXE, "type", "rxe", "netdev", BOND,
    ]);
    for args in &setup {
        assert!(run(args), "{}", args.join(" "));
    }
    tool::run_in_child("addr_change_on_bonding_failover", Duration::from_secs(180));
}

/// The bond's active slave, from sysfs.
fn active_slave() -> String {
    std::fs::read_to_string(format!("/sys/class/net/{BOND}/bonding/active_slave"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn addr_change_child() {
    let channel = EventChannel::new().unwrap();
    let dst = SocketAddr::new(IpAddr::V4(BOND_V4), port(3));
    let id = CmId::new(&channel, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, dst, RESOLVE_TIMEOUT)
        .unwrap();
    let ev = expect_event(&channel, EventKind::AddrResolved);
    let id = id.addr_resolved(&ev).unwrap();
    ev.ack();
    assert_eq!(
        id.verbs().name(),
        BOND_RXE,
        "the id is on the bond's device"
    );

    let before = active_slave();
    let other = SLAVES
        .iter()
        .map(|(s, _)| *s)
        .find(|s| *s != before)
        .expect("two slaves");
    assert!(run(&[
        "ip",
        "link",
        "set",
        BOND,
        "type",
        "bond",
        "active_slave",
        other
    ]));
    assert_eq!(active_slave(), other);
    let ev = next_event(&channel, "ADDR_CHANGE");
    assert_eq!(ev.kind(), EventKind::AddrChange, "{ev:?}");
    assert!(ev.is_for(&id), "{ev:?}");
    assert_eq!(ev.raw_status(), 0, "{ev:?}");
    eprintln!("ADDR_CHANGE after failover {before} -> {other}: {ev:?}");
    ev.ack();
    drop(id);
}
