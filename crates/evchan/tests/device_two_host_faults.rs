//! Two hosts, faults: the peer's VM killed, and the wire between the VMs cut and restored, on
//! the async API, and the cut wire on a core RC connection (issue 11; `docs/RELIABILITY.md`,
//! "Two hosts"). Each fault is a pair of tests, `NAME_server`
//! in VM a and `NAME_client` in VM b, in one two-VM boot of its own; the tests ask the VM runner
//! for the fault themselves (`evchan-vm-fault`, see `crates/cargo-rxe/src/vm/fault.sh`). Run them
//! with `cargo xtask test` (which runs and counts every pair), or one pair by hand:
//!
//! ```text
//! cargo test -p evchan --test device_two_host_faults --no-run   # prints the binary's path
//! cargo xtask vm --hosts 2 --env EVCHAN_REQUIRE_DEVICE=1 \
//!     --server 'EVCHAN_ROLE=server target/debug/deps/device_two_host_faults-HASH --exact peer_killed_server --nocapture' \
//!     -- env EVCHAN_ROLE=client target/debug/deps/device_two_host_faults-HASH --exact peer_killed_client --nocapture
//! ```
//!
//! Both sides use [`config`]: a keepalive after [`KEEPALIVE`] idle and [`RETRIES`] transport
//! retries, so that each fault ends within [`BOUND`] of its injection.
#![forbid(unsafe_code)]

mod support;
#[path = "support/two_host.rs"]
mod two_host;

use std::time::{Duration, Instant};

use bytes::Bytes;
use evchan::core::cm::{ConnParam, EventKind, PortSpace};
use evchan::core::verbs::{CompChannel, Cq, Pd, QpInit, WcStatus, WorkCompletion};
use evchan::core::{CmEvent, CmId, EventChannel};
use evchan::{Config, Connection, Error, Listener, Lost};
use support::{step, user_rdma_resources};
use two_host::{carrier, env_addr, fault, role_is, wait_for};

const PEER_KILLED_PORT: u16 = 7480;
const WIRE_CUT_PORT: u16 = 7481;
const CORE_PORT: u16 = 7482;
/// The keepalive interval of both sides.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// The transport's retries (the connecting side's value counts for both QPs).
const RETRIES: u8 = 2;
/// The reliable connection's local ACK timeout as rdma_cm sets it over RoCE on the VMs'
/// kernel (Debian 6.1): the path's packet lifetime `CMA_IBOE_PACKET_LIFETIME` (18) plus one,
/// 4.096 µs × 2^19 = 2.147 s. `wire_cut_client` measures it: a send over the cut wire fails
/// after at most `RETRIES + 1` of them (rxe's timer is not reset by ACKs, so the first may be
/// shorter).
const ACK_TIMEOUT: Duration = Duration::from_nanos(4096 << 19);
/// From a fault to the error of every pending operation: the keepalive's wait, then the first
/// send and its retries, each after the ACK timeout, plus 2 s for TCG's slow timers.
const BOUND: Duration = Duration::from_nanos(
    KEEPALIVE.as_nanos() as u64 + (RETRIES as u64 + 1) * (4096 << 19) + 2_000_000_000,
);
/// How long VM b may take to boot and connect.
const BOOT: Duration = Duration::from_secs(120);

fn config() -> Config {
    Config::new()
        .recv_depth(4)
        .send_depth(4)
        .keepalive(Some(KEEPALIVE))
        .retry_count(RETRIES)
}

/// The error of an operation that was pending when the peer went away: the failed send of a
/// keepalive (or of data), retried `RETRIES` times.
#[track_caller]
fn assert_lost(what: &str, e: &Error) {
    assert!(
        matches!(
            e,
            Error::ConnectionLost(Lost::WorkCompletion(WcStatus::RetryExceeded))
        ),
        "{what}: {e:?}, not ConnectionLost(WorkCompletion(RetryExceeded))"
    );
}

/// Waits until this process has no QP left (the lost connections released theirs).
async fn qps_released(what: &str) -> Instant {
    wait_for(what, Duration::from_secs(30), || {
        user_rdma_resources("qp").is_empty()
    })
    .await
}

/// A new connection from this VM to its own listener (rxe loops its own GID back): one message
/// each way, then a clean close.
async fn new_local_peer(listener: &Listener, me: std::net::SocketAddr) {
    let client = tokio::spawn(async move {
        let mut c = Connection::builder()
            .config(config())
            .private_data(vec![9])
            .connect(me)
            .await
            .unwrap_or_else(|e| panic!("a new peer connecting to {me}: {e}"));
        c.send(Bytes::from_static(b"new peer")).await.unwrap();
        assert_eq!(c.recv().await.unwrap().as_deref(), Some(&b"welcome"[..]));
        c.close().await.unwrap();
    });
    let incoming = step("accept the new peer", listener.accept())
        .await
        .unwrap();
    assert_eq!(incoming.private_data()[0], 9);
    let mut s = step("accept", incoming.accept(b"")).await.unwrap();
    assert_eq!(
        step("recv", s.recv()).await.unwrap().as_deref(),
        Some(&b"new peer"[..])
    );
    step("send", s.send(Bytes::from_static(b"welcome")))
        .await
        .unwrap();
    assert_eq!(step("end", s.recv()).await.unwrap(), None);
    step("close", s.close()).await.unwrap();
    step("client", client).await.unwrap();
}

/// VM a survives: three connections from VM b, one with a pending `recv`, one with a pending
/// `send` (VM b never reads it: no credits come back), one with a pending `close`; VM b is
/// stopped, the close begins, then VM b is killed. Each returns within [`BOUND`] of the stop,
/// `recv` and `send` with `ConnectionLost(WorkCompletion(RetryExceeded))`, every QP is
/// released, and the listener accepts a new peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_killed_server() {
    require_device!();
    if !role_is("server") {
        return;
    }
    let me = env_addr("EVCHAN_SELF", PEER_KILLED_PORT);
    let listener = step("bind", Listener::bind(me, config())).await.unwrap();
    let mut conns: [Option<Connection>; 3] = [None, None, None];
    for _ in 0..3 {
        let incoming = tokio::time::timeout(BOOT, listener.accept())
            .await
            .expect("a connection from VM b")
            .unwrap();
        let tag = usize::from(incoming.private_data()[0]);
        conns[tag] = Some(step("accept", incoming.accept(b"")).await.unwrap());
    }
    let [Some(mut idle), Some(blocked), Some(closing)] = conns else {
        panic!("connections 0, 1 and 2 from VM b");
    };
    let receiver = tokio::spawn(async move {
        let r = idle.recv().await;
        (r, Instant::now())
    });
    let sender = tokio::spawn(async move {
        let mut sent = 0u32;
        loop {
            match blocked.send(Bytes::from(vec![7u8; 1024])).await {
                Ok(()) => sent += 1,
                Err(e) => return (sent, e, Instant::now()),
            }
        }
    });
    // VM b's 4 data receives fill (one credit each, `recv_depth(4)`); then `send` waits for a
    // credit.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!receiver.is_finished() && !sender.is_finished());
    assert_eq!(user_rdma_resources("qp").len(), 3, "one QP per connection");

    let stopped = fault("stop b");
    let closer = tokio::spawn(async move {
        let r = closing.close().await;
        (r, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !receiver.is_finished() && !sender.is_finished() && !closer.is_finished(),
        "recv, send and close pending while VM b is stopped"
    );
    let killed = fault("kill b");
    eprintln!(
        "peer_killed_server: VM b stopped, then killed {} ms later",
        (killed - stopped).as_millis()
    );

    let (r, recv_at) = tokio::time::timeout(BOUND, receiver)
        .await
        .expect("the pending recv within the bound")
        .unwrap();
    assert_lost("recv", &r.expect_err("recv of a dead peer"));
    let (sent, e, send_at) = tokio::time::timeout(BOUND, sender)
        .await
        .expect("the pending send within the bound")
        .unwrap();
    assert_lost("send", &e);
    assert_eq!(sent, 4, "the sends before the blocked one: one per credit");
    let (r, close_at) = tokio::time::timeout(BOUND, closer)
        .await
        .expect("the pending close within the bound")
        .unwrap();
    // Its FIN went to a stopped peer: the close reports the loss.
    assert_lost("close", &r.expect_err("close to a dead peer"));
    let released = qps_released("the dead peer's QPs released").await;
    for (what, at) in [
        ("recv", recv_at),
        ("send", send_at),
        ("close", close_at),
        ("QPs released", released),
    ] {
        let since = at - stopped;
        eprintln!(
            "peer_killed_server: {what} ended {} ms after VM b stopped (bound {} ms)",
            since.as_millis(),
            BOUND.as_millis()
        );
        assert!(since <= BOUND, "{what} after {since:?}");
    }
    new_local_peer(&listener, me).await;
    assert!(user_rdma_resources("qp").is_empty());
    eprintln!("peer_killed_server: the listener accepted a new peer after the kill");
}

/// VM b: three connections to VM a (see [`peer_killed_server`]), never read; then waits to be
/// killed. Counted as passed when its VM was killed on request after it printed
/// `@@evchan-victim peer_killed_client`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_killed_client() {
    require_device!();
    if !role_is("client") {
        return;
    }
    let server = env_addr("EVCHAN_PEER", PEER_KILLED_PORT);
    let mut held = Vec::new();
    for tag in 0..3u8 {
        let c = step(
            "connect",
            Connection::builder()
                .config(config())
                .private_data(vec![tag])
                .connect(server),
        )
        .await
        .unwrap_or_else(|e| panic!("connection {tag} to {server}: {e}"));
        held.push(c);
    }
    eprintln!("@@evchan-victim peer_killed_client");
    tokio::time::sleep(Duration::from_secs(240)).await;
    panic!("VM b was not killed within 240 s (VM a's test failed?)");
}

/// VM a: one connection from VM b; after a message each way, a pending `recv`; VM b cuts the
/// wire (both ends); this side sees its carrier go and its `recv` end within [`BOUND`] with
/// `ConnectionLost(WorkCompletion(RetryExceeded))` (its keepalive failed), the QP released;
/// after VM b restores the wire, it accepts VM b's new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_cut_server() {
    require_device!();
    if !role_is("server") {
        return;
    }
    let me = env_addr("EVCHAN_SELF", WIRE_CUT_PORT);
    let listener = step("bind", Listener::bind(me, config())).await.unwrap();
    let incoming = tokio::time::timeout(BOOT, listener.accept())
        .await
        .expect("a connection from VM b")
        .unwrap();
    let mut conn = step("accept", incoming.accept(b"")).await.unwrap();
    assert_eq!(
        step("recv", conn.recv()).await.unwrap().as_deref(),
        Some(&b"hello"[..])
    );
    step("send", conn.send(Bytes::from_static(b"go")))
        .await
        .unwrap();
    let receiver = tokio::spawn(async move {
        let r = conn.recv().await;
        (r, Instant::now())
    });
    let cut = wait_for("eth0's carrier gone (VM b cuts the wire)", BOOT, || {
        !carrier("eth0")
    })
    .await;
    let (r, at) = tokio::time::timeout(BOUND, receiver)
        .await
        .expect("the pending recv within the bound")
        .unwrap();
    assert_lost("recv", &r.expect_err("recv over a cut wire"));
    let released = qps_released("the QP of the cut connection released").await;
    for (what, at) in [("recv", at), ("QP released", released)] {
        let since = at - cut;
        eprintln!(
            "wire_cut_server: {what} ended {} ms after the carrier went (bound {} ms)",
            since.as_millis(),
            BOUND.as_millis()
        );
        assert!(since <= BOUND, "{what} after {since:?}");
    }
    // VM b restores the wire and connects again.
    let incoming = tokio::time::timeout(Duration::from_secs(90), listener.accept())
        .await
        .expect("VM b's new connection after the restore")
        .unwrap();
    let mut conn = step("accept", incoming.accept(b"")).await.unwrap();
    assert_eq!(
        step("recv", conn.recv()).await.unwrap().as_deref(),
        Some(&b"again"[..])
    );
    step("send", conn.send(Bytes::from_static(b"welcome back")))
        .await
        .unwrap();
    assert_eq!(step("end", conn.recv()).await.unwrap(), None);
    step("close", conn.close()).await.unwrap();
    eprintln!("wire_cut_server: a new connection after the wire came back");
}

/// VM b: one connection to VM a, without a keepalive of its own; after a message each way it
/// cuts the wire (both ends) and sends a message that cannot arrive: that send's retries end
/// the connection, so its pending `recv` ends within `(RETRIES + 1)` ACK timeouts of the send
/// (plus TCG's slack) with `ConnectionLost(WorkCompletion(RetryExceeded))`, and so does a later
/// `send`. Then it restores the wire and connects again, exchanging a message each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_cut_client() {
    require_device!();
    if !role_is("client") {
        return;
    }
    let server = env_addr("EVCHAN_PEER", WIRE_CUT_PORT);
    let conn = step(
        "connect",
        Connection::builder()
            .config(config().keepalive(None))
            .connect(server),
    )
    .await
    .unwrap();
    let (tx, mut rx) = conn.split();
    step("send", tx.send(Bytes::from_static(b"hello")))
        .await
        .unwrap();
    assert_eq!(
        step("recv", rx.recv()).await.unwrap().as_deref(),
        Some(&b"go"[..])
    );
    let receiver = tokio::spawn(async move {
        let r = rx.recv().await;
        (r, Instant::now())
    });
    let cut = fault("link off");
    // In flight over the cut wire: nothing else can end this side's connection.
    let sent = Instant::now();
    step(
        "send over the cut wire",
        tx.send(Bytes::from_static(b"lost")),
    )
    .await
    .unwrap();
    let retries = ACK_TIMEOUT * (u32::from(RETRIES) + 1) + Duration::from_secs(2);
    let (r, at) = tokio::time::timeout(retries, receiver)
        .await
        .expect("the pending recv within the send's retries")
        .unwrap();
    assert_lost("recv", &r.expect_err("recv over a cut wire"));
    let e = tx
        .send(Bytes::from_static(b"after"))
        .await
        .expect_err("send after the loss");
    assert_lost("send", &e);
    drop(tx);
    let released = qps_released("the QP of the cut connection released").await;
    eprintln!(
        "wire_cut_client: recv ended {} ms after the send in flight ({} tries of the ACK \
         timeout: bound {} ms); QP released {} ms after the cut",
        (at - sent).as_millis(),
        RETRIES + 1,
        retries.as_millis(),
        (released - cut).as_millis(),
    );
    assert!(at - sent <= retries && released - cut <= BOUND);

    let restored = fault("link on");
    wait_for("eth0's carrier back", Duration::from_secs(30), || {
        carrier("eth0")
    })
    .await;
    // A new connection after the restore (the first attempt may race the link's return).
    let mut attempts = 0;
    let mut conn = loop {
        attempts += 1;
        match Connection::builder()
            .config(config().connect_timeout(Duration::from_secs(10)))
            .connect(server)
            .await
        {
            Ok(c) => break c,
            Err(e) if restored.elapsed() < Duration::from_secs(60) => {
                eprintln!("wire_cut_client: connect attempt {attempts} after the restore: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("no new connection within 60 s of the restore: {e}"),
        }
    };
    eprintln!(
        "wire_cut_client: connected again {} ms after the restore, attempt {attempts}",
        restored.elapsed().as_millis()
    );
    step("send", conn.send(Bytes::from_static(b"again")))
        .await
        .unwrap();
    assert_eq!(
        step("recv", conn.recv()).await.unwrap().as_deref(),
        Some(&b"welcome back"[..])
    );
    step("close", conn.close()).await.unwrap();
}

/// The core's own view of a cut wire: a connected RC QP of `evchan_core` (caller's PD and CQ),
/// with `retry_count` [`RETRIES`]; see [`core_wire_cut_client`].
fn core_event<'ch>(ch: &'ch EventChannel, kind: EventKind, within: Duration) -> CmEvent<'ch> {
    let ev = ch
        .get_event_timeout(within)
        .unwrap()
        .unwrap_or_else(|| panic!("no {kind:?} within {within:?}"));
    assert_eq!(ev.kind(), kind, "{ev:?}");
    ev
}

/// The one completion of `cq` within `within`.
fn core_completion(cq: &Cq<'_>, within: Duration) -> WorkCompletion {
    let mut got = Vec::new();
    let n = cq.wait(Some(within), |wc| got.push(wc)).unwrap();
    assert_eq!(n, 1, "one completion within {within:?}: {got:?}");
    got[0]
}

/// VM a: a core listener; accepts VM b's connection with one receive posted, takes VM b's
/// first message, then waits until the wire was cut and restored (see
/// [`core_wire_cut_client`]).
#[test]
fn core_wire_cut_server() {
    require_device!();
    if !role_is("server") {
        return;
    }
    let me = env_addr("EVCHAN_SELF", CORE_PORT);
    let ch = EventChannel::new().unwrap();
    let _listening = CmId::new(&ch, PortSpace::Tcp)
        .unwrap()
        .bind(me)
        .unwrap()
        .listen(8)
        .unwrap();
    let mut ev = core_event(&ch, EventKind::ConnectRequest, BOOT);
    let id = ev.take_request().expect("the request's id");
    ev.ack();
    let ctx = id.context().unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let comp = CompChannel::new(&ctx).unwrap();
    let cq = Cq::new(&comp, 16).unwrap();
    let mut id = id;
    id.create_qp_with(&pd, &cq, &cq, &QpInit::new()).unwrap();
    let rx = id
        .post_recv(pd.reg_mr(vec![0u8; 64]).unwrap(), 0..64)
        .unwrap();
    let id = id.accept(&ConnParam::new()).unwrap();
    let ev = core_event(&ch, EventKind::Established, Duration::from_secs(30));
    let _id = id.established(&ev).unwrap();
    ev.ack();
    let wc = core_completion(&cq, Duration::from_secs(30));
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    assert_eq!(wc.byte_len(), 64);
    drop(rx.complete(&wc).expect("the receive's completion"));
    let until = Instant::now() + BOOT;
    while carrier("eth0") {
        assert!(Instant::now() < until, "VM b did not cut the wire");
        std::thread::sleep(Duration::from_millis(10));
    }
    while !carrier("eth0") {
        assert!(Instant::now() < until, "VM b did not restore the wire");
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("core_wire_cut_server: the wire was cut and restored");
}

/// VM b: a core RC connection to VM a with `retry_count` [`RETRIES`], on its own PD and CQ;
/// one send completes with success; then the wire is cut (both ends) and the next send
/// completes with `RetryExceeded` within `(RETRIES + 1)` ACK timeouts (plus 2 s for TCG).
#[test]
fn core_wire_cut_client() {
    require_device!();
    if !role_is("client") {
        return;
    }
    let server = env_addr("EVCHAN_PEER", CORE_PORT);
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, server, Duration::from_secs(5))
        .unwrap();
    let ev = core_event(&ch, EventKind::AddrResolved, Duration::from_secs(30));
    let id = id.addr_resolved(&ev).unwrap();
    ev.ack();
    let ctx = id.context().unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let comp = CompChannel::new(&ctx).unwrap();
    let cq = Cq::new(&comp, 16).unwrap();
    let id = id.resolve_route(Duration::from_secs(5)).unwrap();
    let ev = core_event(&ch, EventKind::RouteResolved, Duration::from_secs(30));
    let mut id = id.route_resolved(&ev).unwrap();
    ev.ack();
    id.create_qp_with(&pd, &cq, &cq, &QpInit::new()).unwrap();
    let id = id.connect(&ConnParam::new().retry_count(RETRIES)).unwrap();
    let ev = core_event(&ch, EventKind::Established, Duration::from_secs(30));
    let id = id.established(&ev).unwrap();
    ev.ack();

    let tx = id
        .post_send(pd.reg_mr(vec![1u8; 64]).unwrap(), 0..64, None)
        .unwrap();
    let wc = core_completion(&cq, Duration::from_secs(30));
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    let mr = tx.complete(&wc).expect("the send's completion");

    fault("link off");
    let tx = id.post_send(mr, 0..64, None).unwrap();
    let sent = Instant::now();
    let bound = ACK_TIMEOUT * (u32::from(RETRIES) + 1) + Duration::from_secs(2);
    let wc = core_completion(&cq, bound);
    let took = sent.elapsed();
    assert_eq!(wc.status(), WcStatus::RetryExceeded, "{wc:?}");
    drop(tx.complete(&wc));
    eprintln!(
        "core_wire_cut_client: the send over the cut wire completed with {:?} after {} ms \
         (bound {} ms)",
        wc.status(),
        took.as_millis(),
        bound.as_millis()
    );
    assert!(took <= bound);
    fault("link on");
}
