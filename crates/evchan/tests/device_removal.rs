//! Device tests: the RDMA device is removed (`rdma link delete rxe0`) under live listeners and
//! connections of the async API.
//!
//! `device_removed_under_live_connections`: pending `accept`, `recv` and `send` return
//! `ConnectionLost(DeviceRemoved)`; `rdma link delete` completes (within [`DELETE_DEADLINE`]:
//! soft-RoCE cannot disassociate user contexts, so it waits until evchan has destroyed every id
//! and closed the device, and a hang fails the test); no cm_id, QP, CQ, MR or PD of the process
//! is left; after `rdma link add rxe0 type rxe netdev dummy0` a new listener and connection
//! carry messages.
//!
//! It needs a second process and a second device:
//! - librdmacm closes its context of a removed device only when it lists the devices and
//!   finds that one gone (`sync_devices_list` in rdma-core's `librdmacm/cma.c`), and that
//!   listing fails with `ENODEV` before it compares anything when no device is left. So the
//!   test adds `rxe1` on `dummy1` for the duration: with it, the removal of `rxe0` completes.
//! - librdmacm then still holds `rxe1` open until the process exits, so the device work runs
//!   in a child process (this same test binary, this same test, `EVCHAN_TEST_CHILD`); the
//!   parent never opens a device, and removes `rxe1` and `dummy1` after the child ended.
//!
//! `last_device_removed_waits_for_the_process`: with `rxe0` the only device, the same removal
//! still fails everything pending with `DeviceRemoved` at once, but `rdma link delete` stays
//! blocked while the process lives (librdmacm keeps its context of the last device, see
//! above); it completes once the process has exited. The test asserts both, so that a
//! librdmacm that changes this is noticed.
//!
//! The parent restores `rxe0` whatever happens (like evchan-core's `device_removal` test). The
//! tests take turns (they take the device away); this binary holds nothing else.
#![forbid(unsafe_code)]

mod support;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use evchan::{Config, Connection, Error, Listener, Lost};
use support::{port, step, tool, user_rdma_resources, v4, wait_runtime_gone};

const DEVICE: &str = "rxe0";
const NETDEV: &str = "dummy0";
const SPARE: &str = "rxe1";
const SPARE_NETDEV: &str = "dummy1";
/// How long `rdma link delete` of the last device is watched to stay blocked.
const BLOCKED_FOR: Duration = Duration::from_secs(3);

/// The tests take the device away in turn.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// How long `rdma link delete` may take before the test fails.
const DELETE_DEADLINE: Duration = Duration::from_secs(60);
/// How long the child may take in all.
const CHILD_DEADLINE: Duration = Duration::from_secs(300);
const KINDS: [&str; 5] = ["cm_id", "qp", "cq", "mr", "pd"];

fn exists(dev: &str) -> bool {
    Path::new("/sys/class/infiniband").join(dev).exists()
}

/// Runs a command to completion within [`DELETE_DEADLINE`]; whether it succeeded.
fn run(args: &[&str]) -> bool {
    let mut child = Command::new(args[0]).args(&args[1..]).spawn().unwrap();
    let status = tool::wait_for(&mut child, DELETE_DEADLINE, &args.join(" "));
    if !status.success() {
        eprintln!("{}: {status}", args.join(" "));
    }
    status.success()
}

/// `rdma link add rxe0 type rxe netdev dummy0` unless it exists; waits until its port is
/// ACTIVE.
fn restore_rxe0() {
    if !exists(DEVICE) {
        let ok = run(&[
            "rdma", "link", "add", DEVICE, "type", "rxe", "netdev", NETDEV,
        ]);
        eprintln!("restored {DEVICE}: {ok}");
    }
    let state = Path::new("/sys/class/infiniband")
        .join(DEVICE)
        .join("ports/1/state");
    let start = Instant::now();
    while !std::fs::read_to_string(&state).is_ok_and(|s| s.contains("ACTIVE")) {
        assert!(start.elapsed() < step_time(), "{DEVICE} not ACTIVE");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn step_time() -> Duration {
    support::STEP
}

/// The parent's cleanup, whatever happened: `rxe0` back, `rxe1` and `dummy1` gone.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        restore_rxe0();
        if exists(SPARE) {
            run(&["rdma", "link", "delete", SPARE]);
        }
        if evchan_core::if_index(SPARE_NETDEV).is_some() {
            run(&["ip", "link", "del", SPARE_NETDEV]);
        }
    }
}

/// Runs `body` on a tokio runtime of two workers (in the child process).
fn block_on(body: impl std::future::Future<Output = ()>) {
    support::init_log();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(body);
}

/// Whether this process is the child of `test`.
/// `false` after a skip line when the VM's rxe link is not there.
fn have_rxe0() -> bool {
    if !exists(DEVICE) || evchan_core::if_index(NETDEV).is_none() {
        support::skip(&format!(
            "no {DEVICE} on {NETDEV} (this test deletes and restores the VM's rxe link)"
        ));
        return false;
    }
    true
}

#[test]
fn device_removed_under_live_connections() {
    with_spare_in_child("device_removed_under_live_connections", child);
}

/// A test whose device work (`work`) runs in a child process while `rxe1` exists beside
/// `rxe0`: in the parent, sets that up, runs the child and cleans up; in the child, the work.
fn with_spare_in_child<F: std::future::Future<Output = ()>>(test: &str, work: fn() -> F) {
    if tool::is_child(test) {
        return block_on(work());
    }
    if !have_rxe0() {
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _cleanup = Cleanup;
    add_spare();
    tool::run_in_child(test, CHILD_DEADLINE);
}

/// Adds `rxe1` on `dummy1` (the parent's [`Cleanup`] removes them): with a second device,
/// librdmacm lets go of a removed one (the module docs).
fn add_spare() {
    assert!(
        !exists(SPARE) && evchan_core::if_index(SPARE_NETDEV).is_none(),
        "{SPARE} or {SPARE_NETDEV} exists already"
    );
    for args in [
        &["ip", "link", "add", SPARE_NETDEV, "type", "dummy"][..],
        &[
            "ip",
            "link",
            "set",
            SPARE_NETDEV,
            "address",
            "02:00:00:00:00:02",
        ],
        &["ip", "link", "set", SPARE_NETDEV, "up"],
        &[
            "rdma",
            "link",
            "add",
            SPARE,
            "type",
            "rxe",
            "netdev",
            SPARE_NETDEV,
        ],
    ] {
        assert!(run(args), "{}", args.join(" "));
    }
}

#[test]
fn last_device_removed_waits_for_the_process() {
    const TEST: &str = "last_device_removed_waits_for_the_process";
    if tool::is_child(TEST) {
        return block_on(last_device_child());
    }
    if !have_rxe0() {
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _cleanup = Cleanup;
    let devices: Vec<_> = std::fs::read_dir("/sys/class/infiniband")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(devices, [DEVICE], "rxe0 is the only RDMA device");
    tool::run_in_child(TEST, CHILD_DEADLINE);
    // The child has exited: its `rdma link delete` (orphaned) completes now.
    let exited = Instant::now();
    while exists(DEVICE) {
        assert!(
            exited.elapsed() < DELETE_DEADLINE,
            "{DEVICE} still there {DELETE_DEADLINE:?} after the process exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "{DEVICE} gone {:?} after the process exited",
        exited.elapsed()
    );
}

/// A listener on `port` with `config`, and a connection to it (server side, client side) that
/// carried one message.
async fn connected(config: Config, port: u16) -> (Listener, Connection, Connection) {
    let listener = step("bind", Listener::bind(v4(port), config.clone()))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let connect = tokio::spawn(Connection::builder().config(config).connect(addr));
    let incoming = step("accept", listener.accept()).await.unwrap();
    let mut server = step("accept", incoming.accept(&[])).await.unwrap();
    let client = step("connect", connect).await.unwrap().unwrap();
    client.send("first").await.unwrap();
    assert_eq!(
        step("recv first", server.recv()).await.unwrap().unwrap(),
        "first"
    );
    (listener, server, client)
}

/// `rdma link delete rxe0`, to completion within [`DELETE_DEADLINE`]: its status and when it
/// ended.
fn delete_rxe0() -> (std::process::ExitStatus, Instant) {
    let mut c = Command::new("rdma")
        .args(["link", "delete", DEVICE])
        .spawn()
        .unwrap();
    let status = tool::wait_for(&mut c, DELETE_DEADLINE, "rdma link delete rxe0");
    (status, Instant::now())
}

/// After a removal: the client's `recv` and `send` and the listener's `accept` fail with it.
async fn assert_removed(client: &mut Connection, listener: &Listener) {
    // The client's end may be on another shard, which retires on its own: its recv says when.
    let r = step("client recv", client.recv()).await;
    assert!(removed(&r), "client recv: {r:?}");
    let r = client.send("after").await;
    assert!(removed(&r), "client send: {r:?}");
    let r = listener.accept().await.map(|_| ());
    assert!(removed(&r), "accept: {r:?}");
}

async fn last_device_child() {
    let (listener, mut server, mut client) = connected(Config::new(), port(5)).await;
    let receiving = tokio::spawn(async move {
        let r = server.recv().await;
        (r, server)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let start = Instant::now();
    let mut delete = Command::new("rdma")
        .args(["link", "delete", DEVICE])
        .spawn()
        .unwrap();
    let (r, server) = step("pending recv", receiving).await.unwrap();
    assert!(removed(&r), "recv: {r:?}");
    let answered = start.elapsed();
    assert_removed(&mut client, &listener).await;
    drop((server, client, listener));
    tokio::task::spawn_blocking(wait_runtime_gone)
        .await
        .unwrap();
    // No new runtime: the device is not listed any more (librdmacm lists no device at all).
    let r = Listener::bind(v4(port(6)), Config::new()).await;
    assert!(
        matches!(&r, Err(e) if e.is_no_device()),
        "bind after the removal: {:?}",
        r.map(|l| l.local_addr())
    );
    tokio::time::sleep(BLOCKED_FOR).await;
    assert!(
        delete.try_wait().unwrap().is_none(),
        "rdma link delete of the last device completed while the process lives: librdmacm \
         now closes the last device's context (update docs/RELIABILITY.md and this test)"
    );
    eprintln!(
        "last device: pending operations answered after {answered:?}; rdma link delete still \
         blocked {:?} after it started, as librdmacm keeps the context",
        start.elapsed()
    );
}

/// User-space entries of `rdma resource show KIND` for each kind that has any.
fn left_over(allow_pd: usize) -> Vec<(&'static str, Vec<String>)> {
    KINDS
        .iter()
        .map(|k| (*k, user_rdma_resources(k)))
        .filter(|(k, l)| l.len() > if *k == "pd" { allow_pd } else { 0 })
        .collect()
}

/// Polls (at most a step) until no resource of this process is left but `allow_pd` PDs.
fn assert_nothing_left(allow_pd: usize, what: &str) {
    let start = Instant::now();
    loop {
        let left = left_over(allow_pd);
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < step_time(),
            "{what}: left over: {left:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn removed<T: std::fmt::Debug>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(Error::ConnectionLost(Lost::DeviceRemoved)))
}

async fn child() {
    assert!(
        exists(DEVICE) && exists(SPARE),
        "the parent sets up both devices"
    );
    assert_nothing_left(0, "before the test");

    // Phase 1: a listener, three connections (both ends in this process), one echo each way.
    let server_config = Config::new().recv_depth(4);
    let listener = Arc::new(
        step("bind", Listener::bind(v4(port(1)), server_config))
            .await
            .unwrap(),
    );
    let addr = listener.local_addr();
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    for i in 0..3u8 {
        let connect = tokio::spawn(Connection::connect(addr));
        let incoming = step("accept", listener.accept()).await.unwrap();
        let mut server = step("accept", incoming.accept(&[i])).await.unwrap();
        let mut client = step("connect", connect).await.unwrap().unwrap();
        client.send(vec![i]).await.unwrap();
        assert_eq!(step("recv", server.recv()).await.unwrap().unwrap(), vec![i]);
        server.send(vec![i + 10]).await.unwrap();
        assert_eq!(
            step("recv", client.recv()).await.unwrap().unwrap(),
            vec![i + 10]
        );
        clients.push(client);
        servers.push(server);
    }
    let (c0, c1, c2) = {
        let mut it = clients.into_iter();
        (it.next().unwrap(), it.next().unwrap(), it.next().unwrap())
    };
    let (s0, mut s1, s2) = {
        let mut it = servers.into_iter();
        (it.next().unwrap(), it.next().unwrap(), it.next().unwrap())
    };
    // Pending operations: an accept, two receives, and sends blocked on credits (the server
    // side of c0 never reads: 4 credits, then 16 send permits).
    let accepting = {
        let l = listener.clone();
        tokio::spawn(async move { l.accept().await.map(|_| ()) })
    };
    let receiving_server = tokio::spawn(async move {
        let r = s1.recv().await;
        (r, s1)
    });
    let (c2_tx, mut c2_rx) = c2.split();
    let receiving_client = tokio::spawn(async move {
        let r = c2_rx.recv().await;
        (r, c2_rx)
    });
    let (c0_tx, c0_rx) = c0.split();
    let sending = tokio::spawn(async move {
        let mut sent = 0u32;
        loop {
            match c0_tx.send(Bytes::from_static(b"blocked")).await {
                Ok(()) => sent += 1,
                Err(e) => return (sent, e, c0_tx),
            }
        }
    });
    // A listener and connection of a second runtime (one shard, where the first has one per
    // CPU): the removal that either runtime sees first retires the other too.
    let (t_listener, t_server, mut t_client) = connected(Config::new().shards(1), port(3)).await;
    let receiving_other = tokio::spawn(async move {
        let r = t_client.recv().await;
        (r, t_client)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!sending.is_finished(), "the sender is blocked on credits");
    assert!(!accepting.is_finished() && !receiving_server.is_finished());

    // The removal.
    let start = Instant::now();
    let deleted = tokio::task::spawn_blocking(delete_rxe0);

    let r = step("pending accept", accepting).await.unwrap();
    assert!(removed(&r), "accept: {r:?}");
    let (r, s1) = step("pending server recv", receiving_server).await.unwrap();
    assert!(removed(&r), "server recv: {r:?}");
    let (r, c2_rx) = step("pending client recv", receiving_client).await.unwrap();
    assert!(removed(&r), "client recv: {r:?}");
    let (sent, e, c0_tx) = step("pending send", sending).await.unwrap();
    assert!(
        matches!(e, Error::ConnectionLost(Lost::DeviceRemoved)),
        "send after {sent} messages: {e:?}"
    );
    let (r, t_client) = step("pending recv of the second runtime", receiving_other)
        .await
        .unwrap();
    assert!(removed(&r), "the second runtime's recv: {r:?}");
    let answered = start.elapsed();
    let (status, done) = step("rdma link delete", deleted).await.unwrap();
    assert!(status.success(), "rdma link delete {DEVICE}: {status}");
    let delete_took = done - start;
    assert!(!exists(DEVICE));
    eprintln!(
        "rdma link delete {DEVICE} with 2 listeners and 4 connections (10 ids; one listener \
         and one connection of a second runtime): pending operations answered after {answered:?}, the \
         command completed after {delete_took:?}"
    );
    let r = t_server.send("after").await;
    assert!(removed(&r), "send on the second runtime's server: {r:?}");
    let r = t_listener.accept().await.map(|_| ());
    assert!(removed(&r), "the second runtime's accept again: {r:?}");
    drop((t_client, t_server, t_listener));

    // Everything else of the old runtime fails with the same cause, and closes at once.
    let r = c1.send("after").await;
    assert!(removed(&r), "send on c1: {r:?}");
    // What reached s0 (c0's messages, unread) before the removal comes first, then the cause.
    let mut s0 = s0;
    let mut delivered = 0;
    let r = loop {
        match s0.recv().await {
            Ok(Some(m)) => {
                assert_eq!(m, "blocked");
                delivered += 1;
            }
            r => break r,
        }
    };
    assert!(removed(&r), "recv on s0 after {delivered} messages: {r:?}");
    assert!(delivered <= sent, "{delivered} delivered, {sent} sent");
    eprintln!("c0 sent {sent} messages before its send blocked; s0 had {delivered} of them");
    let r = listener.accept().await.map(|_| ());
    assert!(removed(&r), "accept again: {r:?}");
    // Lost before their close: each close reports the removal.
    for (what, conn) in [("c1", c1), ("s0", s0), ("s2", s2)] {
        let r = step("close", conn.close()).await;
        assert!(removed(&r), "close of {what}: {r:?}");
    }
    drop((s1, c2_rx, c2_tx, c0_rx, c0_tx, listener));
    tokio::task::spawn_blocking(|| {
        wait_runtime_gone();
        assert_nothing_left(0, "after the removal");
    })
    .await
    .unwrap();

    // Phase 2: the device comes back; a new runtime opens it.
    tokio::task::spawn_blocking(restore_rxe0).await.unwrap();
    let listener = step("bind again", Listener::bind(v4(port(2)), Config::new()))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let connect = tokio::spawn(Connection::connect(addr));
    let incoming = step("accept again", listener.accept()).await.unwrap();
    let mut server = step("accept again", incoming.accept(b"")).await.unwrap();
    let mut client = step("connect again", connect).await.unwrap().unwrap();
    client.send("again").await.unwrap();
    assert_eq!(
        step("recv again", server.recv()).await.unwrap().unwrap(),
        "again"
    );
    server.send("back").await.unwrap();
    assert_eq!(
        step("recv again", client.recv()).await.unwrap().unwrap(),
        "back"
    );
    step("close again", client.close()).await.unwrap();
    assert_eq!(step("fin", server.recv()).await.unwrap(), None);
    step("close again", server.close()).await.unwrap();
    drop(listener);
    tokio::task::spawn_blocking(|| {
        wait_runtime_gone();
        // librdmacm keeps its PD of rxe0 once the runtime's device list went after the ids
        // (see device_scale's librdmacm_keeps_its_device_pd).
        assert_nothing_left(1, "after the device came back");
    })
    .await
    .unwrap();
}
