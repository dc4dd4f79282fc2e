//! A hostile peer against evchan's [`Listener`], in the VM (issue 11). The peer is a raw
//! evchan-core program: its own event channel, ids, QP and immediate data, none of evchan's
//! checks. Each test keeps a well-behaved client (the *bystander*) exchanging messages with the
//! same listener throughout, and asserts both what the server does to the attacker (a typed
//! error on that connection, or a reject the application never sees) and that the bystander
//! and a fresh client are served on.
//!
//! - malformed handshakes (wrong version, the magic with nothing after it, bad limits, a user
//!   length past the data) are rejected with reason 28 and `evchan: bad handshake`; no magic
//!   or no private data at all is a plain peer, not an error;
//! - oversized private data: evchan-core refuses more than 56 bytes before `rdma_connect`;
//!   56 bytes arrive whole;
//! - a message above the advertised maximum, a message without immediate data, kind 3, data
//!   without a credit, credits returned that were never granted or counted backwards, data
//!   after `FIN`: the server's connection ends with a typed [`Lost`] and is released (its QP
//!   leaves `rdma resource show`);
//! - a flood of 500 connection requests that never establish: the server's half-open
//!   connections stay within [`Config::backlog`], the rest are rejected, and each is destroyed
//!   after [`Config::connect_timeout`].
//!
//! Run with `--test-threads 1` (QPs are counted process-wide).
#![forbid(unsafe_code)]

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use evchan::proto::{self, Handshake, Peer, ProtocolError};
use evchan::{Config, Connection, Error, Incoming, Listener, Lost};
use evchan_core::cm::state::Connected;
use evchan_core::cm::{ConnParam, EventKind};
use evchan_core::verbs::{
    CompChannel, Context, Cq, Pd, Posted, QpInit, WcOpcode, WcStatus, WorkCompletion,
};
use evchan_core::{CmId, EventChannel};
use support::raw_cm::{connect_only, event_for, routed};
use support::{port, step, user_rdma_resources, v4, STEP};
use tokio::sync::mpsc;

/// What a well-behaved client's private data starts with.
const GOOD: &[u8] = b"good";
/// How long the hostile peer waits for one event or completion (TCG).
const EVENT: Duration = Duration::from_secs(30);
/// The server's largest message, and its data receives.
const SERVER_MAX: u32 = 256;
const SERVER_SLOTS: u32 = 4;
/// The hostile peer's own receives, of this size each.
const RAW_RECVS: usize = 32;
const RAW_MAX: usize = 4096;

fn server_config() -> Config {
    Config::new()
        .shards(2)
        .max_message(SERVER_MAX)
        .recv_depth(SERVER_SLOTS)
        .send_depth(4)
}

/// The immediate data of evchan's credit protocol: kind, cumulative data grants and control
/// returns.
fn imm(kind: u32, data_cum: u32, ctrl_cum: u32) -> u32 {
    (kind << 30) | ((data_cum & 0x7fff) << 15) | (ctrl_cum & 0x7fff)
}
const DATA: u32 = 0;
const CREDIT: u32 = 1;
const FIN: u32 = 2;

/// A valid handshake of the hostile peer, with `user` after it.
fn raw_handshake(user: &[u8]) -> Vec<u8> {
    Handshake {
        initial: 8,
        data_slots: 8,
        ctrl_slots: 4,
        max_message: RAW_MAX as u32,
    }
    .encode(user)
}

// -------------------------------------------------------------------------------------------
// The server and the bystander
// -------------------------------------------------------------------------------------------

/// The listener's application: well-behaved clients (private data starting with [`GOOD`]) are
/// accepted and echoed; every other request goes to `hostile` for the test to answer, or, with
/// `accept_all`, is accepted at once (an application that cannot tell) and counted.
struct Server {
    addr: SocketAddr,
    hostile: mpsc::UnboundedReceiver<Incoming>,
    accepted_hostile: Arc<AtomicU64>,
    /// With `accept_all`: the most accepts of such requests in progress at once (each is a
    /// half-open connection with its QP).
    max_accepting: Arc<AtomicU64>,
    /// With `accept_all`: how the accepts of requests that are not a good client's ended.
    outcomes: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u32>>>,
    task: tokio::task::JoinHandle<()>,
}

async fn server(addr: SocketAddr, config: Config, accept_all: bool) -> Server {
    let listener = step("bind", Listener::bind(addr, config)).await.unwrap();
    let (tx, hostile) = mpsc::unbounded_channel();
    let accepted_hostile = Arc::new(AtomicU64::new(0));
    let counter = accepted_hostile.clone();
    let outcomes = Arc::<std::sync::Mutex<std::collections::BTreeMap<String, u32>>>::default();
    let tally = outcomes.clone();
    let accepting = Arc::new(AtomicU64::new(0));
    let max_accepting = Arc::new(AtomicU64::new(0));
    let (now, max) = (accepting.clone(), max_accepting.clone());
    let task = tokio::spawn(async move {
        while let Ok(incoming) = listener.accept().await {
            if incoming.private_data().starts_with(GOOD) {
                tokio::spawn(async move {
                    let mut conn = incoming.accept(b"").await?;
                    while let Some(m) = conn.recv().await? {
                        conn.send(m).await?;
                    }
                    Ok::<_, Error>(())
                });
            } else if accept_all {
                let (counter, tally) = (counter.clone(), tally.clone());
                let (now, max) = (now.clone(), max.clone());
                tokio::spawn(async move {
                    max.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    let accepted = incoming.accept(b"").await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    let outcome = match accepted {
                        Ok(conn) => {
                            counter.fetch_add(1, Ordering::SeqCst);
                            drop(conn);
                            "established".to_owned()
                        }
                        Err(e) => e.to_string(),
                    };
                    *tally.lock().unwrap().entry(outcome).or_default() += 1;
                });
            } else {
                let _ = tx.send(incoming);
            }
        }
    });
    Server {
        addr,
        hostile,
        accepted_hostile,
        max_accepting,
        outcomes,
        task,
    }
}

impl Server {
    /// The next request that is not a well-behaved client's.
    async fn hostile(&mut self) -> Incoming {
        step("the hostile request", self.hostile.recv())
            .await
            .expect("the server runs")
    }

    /// No request reached the application since the last [`hostile`](Self::hostile).
    fn assert_no_hostile_request(&mut self) {
        if let Ok(i) = self.hostile.try_recv() {
            panic!("a request reached the application: {:?}", i.private_data());
        }
    }
}

/// A well-behaved client that exchanges numbered messages with the echo server until stopped.
struct Bystander {
    exchanged: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

fn good_msg(i: u64) -> Bytes {
    let len = 8 + (i % 200) as usize;
    let mut v = vec![i as u8; len];
    v[..8].copy_from_slice(&i.to_be_bytes());
    Bytes::from(v)
}

async fn good_client(addr: SocketAddr) -> Connection {
    good_connect(addr)
        .await
        .unwrap_or_else(|e| panic!("a well-behaved client could not connect: {e}"))
}

/// A well-behaved client's connect, as it ended.
async fn good_connect(addr: SocketAddr) -> Result<Connection, Error> {
    step(
        "a good client's connect",
        Connection::builder()
            .config(Config::new().shards(2))
            .private_data(GOOD.to_vec())
            .connect(addr),
    )
    .await
}

async fn bystander(addr: SocketAddr) -> Bystander {
    let mut conn = good_client(addr).await;
    let exchanged = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (n, s) = (exchanged.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let mut i = 0;
        while !s.load(Ordering::SeqCst) {
            step("bystander send", conn.send(good_msg(i)))
                .await
                .unwrap_or_else(|e| panic!("bystander send {i}: {e}"));
            let m = step("bystander recv", conn.recv())
                .await
                .unwrap_or_else(|e| panic!("bystander recv {i}: {e}"))
                .unwrap_or_else(|| panic!("bystander: the server ended after {i}"));
            assert_eq!(m, good_msg(i), "bystander message {i}");
            i += 1;
            n.store(i, Ordering::SeqCst);
        }
        step("bystander close", conn.close()).await.unwrap();
    });
    Bystander {
        exchanged,
        stop,
        task,
    }
}

impl Bystander {
    /// The bystander exchanges 20 more messages (within [`STEP`]).
    async fn still_exchanging(&self, when: &str) {
        let from = self.exchanged.load(Ordering::SeqCst);
        let start = Instant::now();
        while self.exchanged.load(Ordering::SeqCst) < from + 20 {
            assert!(
                start.elapsed() < STEP && !self.task.is_finished(),
                "{when}: the bystander stalled at message {}",
                self.exchanged.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        step("bystander", self.task).await.unwrap();
        self.exchanged.load(Ordering::SeqCst)
    }
}

/// The end of an attack on one connection, whose hostile side is gone: the bystander still
/// exchanges, the hostile connection's QP is released (the bystander's two remain), a fresh
/// client is served; then the bystander finishes and the server stops.
async fn served_on(server: Server, bystander: Bystander, addr: SocketAddr) {
    bystander.still_exchanging("after the attack").await;
    qps_settle_to(2, "the hostile connection released").await;
    fresh_client_served(addr).await;
    bystander.finish().await;
    server.task.abort();
}

/// A fresh well-behaved client connects and exchanges 3 messages.
async fn fresh_client_served(addr: SocketAddr) {
    fresh_client_served_within(addr, Duration::ZERO).await;
}

/// [`fresh_client_served`], its connect tried again while the listener rejects it with the
/// typed busy reject of a full backlog, for up to `patience`.
async fn fresh_client_served_within(addr: SocketAddr, patience: Duration) {
    let deadline = Instant::now() + patience;
    let mut conn = loop {
        match good_connect(addr).await {
            Ok(conn) => break conn,
            Err(Error::Rejected {
                busy: Some(evchan::Busy::Backlog),
                ..
            }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("a well-behaved client could not connect: {e}"),
        }
    };
    for i in 0..3 {
        step("send", conn.send(good_msg(i))).await.unwrap();
        let m = step("recv", conn.recv()).await.unwrap().unwrap();
        assert_eq!(m, good_msg(i));
    }
    step("close", conn.close()).await.unwrap();
}

/// [`support::qps_settle_to`], off the runtime's threads.
async fn qps_settle_to(n: usize, what: &str) {
    let what = what.to_owned();
    tokio::task::spawn_blocking(move || support::qps_settle_to(n, &what))
        .await
        .unwrap();
}

// -------------------------------------------------------------------------------------------
// The hostile peer (blocking; run it in `spawn_blocking`)
// -------------------------------------------------------------------------------------------

/// The hostile peer's established connection.
struct Raw<'a, 'ch> {
    id: &'a CmId<'ch, Connected>,
    pd: &'a Pd<'ch>,
    cq: &'a Cq<'ch>,
    /// The server's handshake, from `ESTABLISHED`.
    server: Handshake,
    sent: Vec<Posted<'a, Vec<u8>>>,
}

impl Raw<'_, '_> {
    /// Posts a SEND of `len` bytes with `imm` (kept until the end).
    fn send(&mut self, len: usize, imm: Option<u32>) {
        let mr = self.pd.reg_mr(vec![0x5a; len.max(1)]).unwrap();
        let posted = self
            .id
            .post_send(mr, 0..len, imm)
            .map_err(|e| e.source)
            .unwrap();
        self.sent.push(posted);
    }

    /// Completions until none comes for `quiet`.
    fn completions(&self, quiet: Duration) -> Vec<WorkCompletion> {
        let mut wcs = Vec::new();
        while self.cq.wait(Some(quiet), |wc| wcs.push(wc)).unwrap() > 0 {}
        wcs
    }

    /// Waits until `n` receives have completed successfully; returns their immediate data.
    fn receive(&self, n: usize) -> Vec<Option<u32>> {
        let mut imms = Vec::new();
        let start = Instant::now();
        while imms.len() < n {
            assert!(start.elapsed() < EVENT, "the server's {n} messages");
            self.cq
                .wait(Some(EVENT), |wc| {
                    if wc.status() == WcStatus::Success && wc.opcode() == Some(WcOpcode::Recv) {
                        imms.push(wc.imm_data());
                    }
                })
                .unwrap();
        }
        imms
    }
}

/// Connects to `addr` with `private_data`, posts [`RAW_RECVS`] receives, and runs `attack`
/// on the established connection; returns what it returns. Everything is destroyed after.
fn raw_connection<R>(
    addr: SocketAddr,
    private_data: &[u8],
    attack: impl FnOnce(&mut Raw<'_, '_>) -> R,
) -> R {
    let ctxs = Context::rdma_cm_devices().unwrap();
    let ctx = &ctxs[0];
    let pd = Pd::new(ctx).unwrap();
    let comp = CompChannel::new(ctx).unwrap();
    let cq = Cq::new(&comp, 256).unwrap();
    let ch = EventChannel::new().unwrap();
    let mut id = routed(&ch, addr);
    id.create_qp_with(
        &pd,
        &cq,
        &cq,
        &QpInit::new()
            .max_send_wr(128)
            .max_recv_wr(RAW_RECVS as u32)
            .max_sge(1),
    )
    .unwrap();
    let _recvs: Vec<_> = (0..RAW_RECVS)
        .map(|_| {
            id.post_recv(pd.reg_mr(vec![0u8; RAW_MAX]).unwrap(), 0..RAW_MAX)
                .map_err(|e| e.source)
                .unwrap()
        })
        .collect();
    let id = id
        .connect(&ConnParam::new().private_data(private_data))
        .map_err(|e| e.error)
        .unwrap();
    let ev = event_for(&ch, &id);
    assert_eq!(ev.kind(), EventKind::Established, "the hostile connect");
    let server = match proto::decode(ev.private_data()) {
        Ok(Peer::Evchan(hs, _)) => hs,
        other => panic!("the server's handshake: {other:?}"),
    };
    let id = id.established(&ev).map_err(|e| e.error).unwrap();
    ev.ack();
    let mut raw = Raw {
        id: &id,
        pd: &pd,
        cq: &cq,
        server,
        sent: Vec::new(),
    };
    let r = attack(&mut raw);
    let sent = std::mem::take(&mut raw.sent);
    drop(raw);
    drop(sent);
    r
}

/// Runs the hostile connection in a blocking task while the application accepts its request;
/// returns what the accept came to (the peer's first message can end the connection before
/// the server has seen `ESTABLISHED`: the accept then fails with the loss) and the task.
async fn hostile_connection<R: Send + 'static>(
    server: &mut Server,
    attack: impl FnOnce(&mut Raw<'_, '_>) -> R + Send + 'static,
) -> (Result<Connection, Error>, tokio::task::JoinHandle<R>) {
    let addr = server.addr;
    let peer =
        tokio::task::spawn_blocking(move || raw_connection(addr, &raw_handshake(b"evil"), attack));
    let incoming = server.hostile().await;
    assert_eq!(incoming.private_data(), b"evil");
    let conn = step("accept the hostile peer", incoming.accept(b"")).await;
    if let Ok(conn) = &conn {
        assert!(conn.is_evchan_peer());
    }
    (conn, peer)
}

/// Reads the server's connection to its end: the data messages, then the error.
async fn read_to_error(conn: &mut Connection) -> (usize, Error) {
    let mut n = 0;
    loop {
        match step("the server's receive", conn.recv()).await {
            Ok(Some(_)) => n += 1,
            Ok(None) => panic!("a clean end after {n} messages, not an error"),
            Err(e) => return (n, e),
        }
    }
}

/// The protocol error the server's connection ended with.
fn protocol_error(e: &Error) -> &ProtocolError {
    match e {
        Error::ConnectionLost(Lost::Protocol(p)) => p,
        e => panic!("not a protocol violation: {e:?}"),
    }
}

/// One protocol attack: `attack` on an established hostile connection; the server's
/// connection must end with an error that `check` accepts (from `recv`, or from the accept
/// itself when the attack came before the server saw `ESTABLISHED`), sends must fail with the
/// same loss, the connection must be released (its QP gone), and the bystander and a fresh
/// client must be served throughout.
async fn protocol_attack(
    n: u16,
    read_after_attack: bool,
    attack: impl FnOnce(&mut Raw<'_, '_>) -> Vec<WorkCompletion> + Send + 'static,
    check: impl FnOnce(usize, &Error),
) {
    let addr = v4(port(n));
    let mut server = server(addr, server_config(), false).await;
    let bystander = bystander(addr).await;
    qps_settle_to(2, "the bystander's connection").await;
    let (accepted, mut peer) = hostile_connection(&mut server, attack).await;
    // The application reads nothing until the attack is over, or reads as it comes.
    let mut wcs = None;
    if read_after_attack {
        wcs = Some(step("the hostile peer", &mut peer).await.unwrap());
    }
    let conn = match accepted {
        Ok(mut conn) => {
            let (received, e) = read_to_error(&mut conn).await;
            eprintln!("server side: {received} messages, then: {e}");
            check(received, &e);
            // Sends fail as well, with the same loss.
            let send = step("send after the loss", conn.send(vec![1u8; 8])).await;
            match (&send, &e) {
                (Err(Error::ConnectionLost(a)), Error::ConnectionLost(b)) if a == b => {}
                _ => panic!("send after the loss: {send:?}"),
            }
            Some(conn)
        }
        Err(e) => {
            eprintln!("server side: the accept failed: {e}");
            check(0, &e);
            None
        }
    };
    bystander.still_exchanging("after the attack").await;
    let wcs = match wcs {
        Some(wcs) => wcs,
        None => step("the hostile peer", peer).await.unwrap(),
    };
    let statuses: Vec<WcStatus> = wcs.iter().map(WorkCompletion::status).collect();
    eprintln!("hostile peer's completions: {statuses:?}");
    drop(conn);
    // The hostile peer's QP is gone with it; the server released its end too.
    qps_settle_to(2, "the hostile connection released").await;
    fresh_client_served(addr).await;
    let total = bystander.finish().await;
    eprintln!("bystander: {total} messages exchanged");
    server.assert_no_hostile_request();
    server.task.abort();
}

// -------------------------------------------------------------------------------------------
// Handshakes and private data
// -------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_handshakes_are_rejected_and_the_listener_serves_on() {
    require_device!();
    let addr = v4(port(1));
    let mut server = server(addr, server_config(), false).await;
    let bystander = bystander(addr).await;
    let valid = raw_handshake(b"");
    let mut version = valid.clone();
    version[4] = 9;
    let mut no_ctrl = valid.clone();
    no_ctrl[6..8].copy_from_slice(&2u16.to_be_bytes());
    let mut too_many_slots = valid.clone();
    too_many_slots[8..12].copy_from_slice(&9000u32.to_be_bytes());
    let mut zero_max = valid.clone();
    zero_max[12..16].copy_from_slice(&0u32.to_be_bytes());
    let mut user_len = raw_handshake(&[7; 40]);
    user_len[5] = 41; // one more than the 40 the 56 bytes hold after the header
    let cases: [(&str, Vec<u8>); 6] = [
        ("version 9", version),
        // RoCE pads private data to 56 bytes: a "truncated" handshake arrives as the magic
        // and the version followed by zeros, whose limits are zero.
        ("the magic and version only", b"EVCH\x01".to_vec()),
        ("2 control slots", no_ctrl),
        ("9000 data slots", too_many_slots),
        ("a zero maximum message", zero_max),
        ("user length 41 of 40", user_len),
    ];
    for (what, data) in cases {
        let (kind, status, reply) = step(
            what,
            tokio::task::spawn_blocking(move || connect_only(addr, &data)),
        )
        .await
        .unwrap();
        assert_eq!(kind, EventKind::Rejected, "{what}");
        assert_eq!(status, 28, "{what}: a consumer reject");
        assert!(
            reply.starts_with(b"evchan: bad handshake"),
            "{what}: reject data {reply:?}"
        );
        server.assert_no_hostile_request();
        bystander.still_exchanging(what).await;
    }
    // No magic, or no private data at all: a plain librdmacm peer, handed to the application
    // with its data as it arrived (RoCE's zero padding to 56 bytes included).
    for (what, data, expect) in [
        ("no private data", Vec::new(), vec![0u8; 56]),
        ("a wrong magic", b"EVCX\x01".to_vec(), {
            let mut v = b"EVCX\x01".to_vec();
            v.resize(56, 0);
            v
        }),
    ] {
        let peer = tokio::task::spawn_blocking(move || connect_only(addr, &data));
        let incoming = server.hostile().await;
        assert_eq!(incoming.private_data(), &expect[..], "{what}");
        incoming.reject(b"not you").unwrap();
        let (kind, status, reply) = step(what, peer).await.unwrap();
        assert_eq!((kind, status), (EventKind::Rejected, 28), "{what}");
        assert!(reply.starts_with(b"not you"), "{what}: {reply:?}");
        bystander.still_exchanging(what).await;
    }
    fresh_client_served(addr).await;
    bystander.finish().await;
    server.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_private_data() {
    require_device!();
    let addr = v4(port(2));
    let mut server = server(addr, server_config(), false).await;
    // evchan-core refuses more than RoCE's 56 bytes before `rdma_connect` (the kernel's
    // ib_send_cm_req would fail with EINVAL): nothing is sent.
    let refused = tokio::task::spawn_blocking(move || {
        let ch = EventChannel::new().unwrap();
        let id = routed(&ch, addr);
        id.connect(&ConnParam::new().private_data(&raw_handshake(&[1; 41])))
            .map(drop)
            .map_err(|e| e.error.to_string())
    })
    .await
    .unwrap();
    let e = refused.expect_err("57 bytes of private data");
    assert!(e.contains("57"), "{e}");
    // 56 bytes arrive whole: a 16-byte handshake and 40 bytes of user data.
    let data = raw_handshake(&[9; 40]);
    assert_eq!(data.len(), 56);
    let peer = tokio::task::spawn_blocking(move || connect_only(addr, &data));
    let incoming = server.hostile().await;
    assert_eq!(incoming.private_data(), &[9; 40][..]);
    drop(incoming); // rejects
    let (kind, status, _) = step("the reject", peer).await.unwrap();
    assert_eq!((kind, status), (EventKind::Rejected, 28));
    fresh_client_served(addr).await;
    server.task.abort();
}

// -------------------------------------------------------------------------------------------
// Messages that break the protocol
// -------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_above_the_advertised_maximum() {
    require_device!();
    protocol_attack(
        3,
        false,
        |raw| {
            assert_eq!(raw.server.max_message, SERVER_MAX);
            raw.send(SERVER_MAX as usize + 1, Some(imm(DATA, 0, 0)));
            raw.completions(Duration::from_secs(3))
        },
        |received, e| {
            assert_eq!(received, 0);
            // IBV_WC_LOC_LEN_ERR on the receive is an overrun by definition; rxe (kernel 6.1)
            // reports IBV_WC_LOC_QP_OP_ERR for it (the copy into the receive fails), which
            // evchan reports as the failed work request it is.
            assert!(
                matches!(
                    e,
                    Error::ConnectionLost(Lost::WorkCompletion(WcStatus::LocalQpOperation))
                ) || protocol_error(e) == &ProtocolError::Overrun { max: SERVER_MAX },
                "{e:?}"
            );
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_without_immediate_data() {
    require_device!();
    protocol_attack(
        4,
        false,
        |raw| {
            raw.send(8, None);
            raw.completions(Duration::from_secs(3))
        },
        |_, e| assert_eq!(protocol_error(e), &ProtocolError::NoImmediate),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_of_kind_3() {
    require_device!();
    protocol_attack(
        5,
        false,
        |raw| {
            raw.send(8, Some(3 << 30));
            raw.completions(Duration::from_secs(3))
        },
        |_, e| assert_eq!(protocol_error(e), &ProtocolError::BadKind),
    )
    .await;
}

/// The peer ignores its credits and sends more data messages than the server's data slots,
/// and then more than all of its receives, while the server's application reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_beyond_the_granted_credits() {
    require_device!();
    protocol_attack(
        6,
        true,
        |raw| {
            let slots = raw.server.data_slots + u32::from(raw.server.ctrl_slots);
            assert_eq!(raw.server.data_slots, SERVER_SLOTS);
            for _ in 0..slots + 4 {
                raw.send(16, Some(imm(DATA, 0, 0)));
            }
            raw.completions(Duration::from_secs(3))
        },
        |received, e| {
            // The messages within the credits arrive; the first beyond them ends it.
            assert_eq!(received, SERVER_SLOTS as usize);
            assert!(
                matches!(
                    protocol_error(e),
                    ProtocolError::NoCredit { held, slots } if *held == SERVER_SLOTS && *slots == SERVER_SLOTS
                ),
                "{e:?}"
            );
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credits_returned_that_were_never_granted() {
    require_device!();
    protocol_attack(
        7,
        false,
        |raw| {
            raw.send(0, Some(imm(CREDIT, 5, 0)));
            raw.completions(Duration::from_secs(3))
        },
        |_, e| {
            assert_eq!(
                protocol_error(e),
                &ProtocolError::OverReturn {
                    returned: 5,
                    outstanding: 0
                }
            );
        },
    )
    .await;
}

/// The server sends 2 messages; the peer returns both, then counts back to 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credit_counts_going_backwards() {
    require_device!();
    let addr = v4(port(8));
    let mut server = server(addr, server_config(), false).await;
    let bystander = bystander(addr).await;
    let (conn, peer) = hostile_connection(&mut server, |raw| {
        let imms = raw.receive(2);
        assert_eq!(imms, vec![Some(imm(DATA, 0, 0)); 2], "the server's data");
        raw.send(0, Some(imm(CREDIT, 2, 0)));
        raw.send(0, Some(imm(CREDIT, 1, 0)));
        raw.completions(Duration::from_secs(3))
    })
    .await;
    let mut conn = conn.unwrap();
    step("send", conn.send(vec![1u8; 8])).await.unwrap();
    step("send", conn.send(vec![2u8; 8])).await.unwrap();
    let (received, e) = read_to_error(&mut conn).await;
    assert_eq!(received, 0);
    // 1 - 2 modulo 2^15: 32767 returned, none outstanding after the first update.
    assert_eq!(
        protocol_error(&e),
        &ProtocolError::OverReturn {
            returned: 32767,
            outstanding: 0
        }
    );
    step("the hostile peer", peer).await.unwrap();
    drop(conn);
    served_on(server, bystander, addr).await;
}

/// `FIN`, then data: the receive half has already ended cleanly (`None`), so the violation
/// reaches the application through `send`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_after_fin() {
    require_device!();
    let addr = v4(port(9));
    let mut server = server(addr, server_config(), false).await;
    let bystander = bystander(addr).await;
    let (conn, peer) = hostile_connection(&mut server, |raw| {
        raw.send(0, Some(imm(FIN, 0, 0)));
        raw.send(8, Some(imm(DATA, 0, 0)));
        raw.completions(Duration::from_secs(3))
    })
    .await;
    let mut conn = conn.unwrap();
    assert_eq!(step("recv", conn.recv()).await.unwrap(), None);
    step("the hostile peer", peer).await.unwrap();
    let e = step("send after the violation", async {
        loop {
            match conn.send(vec![1u8; 8]).await {
                Ok(()) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => break e,
            }
        }
    })
    .await;
    assert_eq!(protocol_error(&e), &ProtocolError::AfterFin);
    drop(conn);
    served_on(server, bystander, addr).await;
}

// -------------------------------------------------------------------------------------------
// A flood of connection requests
// -------------------------------------------------------------------------------------------

const FLOOD: usize = 500;
const FLOOD_BACKLOG: u32 = 16;
const FLOOD_TIMEOUT: Duration = Duration::from_secs(3);

/// 500 requests with a valid handshake from ids without a QP (each naming its own QP number)
/// that never read their events: a
/// request the server accepts gets `CONNECT_RESPONSE`, which such an id answers only when its
/// program reads it (librdmacm sends the RTU then), so the server's side never becomes
/// `ESTABLISHED`. The application accepts every request (it cannot tell). The server's QPs —
/// one per accepted half-open connection; the flood's ids have none — must stay within the
/// backlog, every half-open one must go after the connect timeout, and the bystander and a
/// fresh client must be served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_of_requests_that_never_establish() {
    require_device!();
    let addr = v4(port(10));
    let config = server_config()
        .backlog(FLOOD_BACKLOG)
        .connect_timeout(FLOOD_TIMEOUT);
    let server = server(addr, config, true).await;
    let bystander = bystander(addr).await;
    qps_settle_to(2, "the bystander's connection").await;
    let flooding = Arc::new(AtomicBool::new(true));
    // Samples the QPs listed while the flood runs.
    let sampler = {
        let flooding = flooding.clone();
        tokio::task::spawn_blocking(move || {
            let mut max = 0;
            let mut samples = 0;
            while flooding.load(Ordering::SeqCst) {
                max = max.max(user_rdma_resources("qp").len());
                samples += 1;
            }
            (max, samples)
        })
    };
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel::<Duration>();
    let flood = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let ch = EventChannel::new().unwrap();
        let wire = raw_handshake(b"flood");
        let mut ids = Vec::with_capacity(FLOOD);
        for i in 0..FLOOD as u32 {
            let id = routed(&ch, addr);
            // A distinct QP number in each request (there is no QP): the IB CM rejects a
            // request whose QP number and device match a connection it has already (stale).
            let id = id
                .connect(&ConnParam::new().private_data(&wire).qp_num(0x80_0000 + i))
                .map_err(|e| e.error)
                .unwrap();
            ids.push(id);
        }
        let _ = sent_tx.send(start.elapsed());
        // The ids stay until the test is done with the server; their events are never read.
        let _ = release_rx.recv();
        drop(ids);
    });
    let took = step_long("the flood", sent_rx).await.unwrap();
    bystander.still_exchanging("right after the flood").await;
    // Every half-open connection goes within the connect timeout (and the drain after it).
    qps_settle_to(2, "the half-open connections destroyed").await;
    flooding.store(false, Ordering::SeqCst);
    let (max_qps, samples) = step("sampler", sampler).await.unwrap();
    let accepted = server.accepted_hostile.load(Ordering::SeqCst);
    eprintln!(
        "flood: {FLOOD} requests in {took:.1?}; at most {max_qps} QPs listed in {samples} samples \
         (2 are the bystander's); {accepted} flood connections established"
    );
    let max_accepting = server.max_accepting.load(Ordering::SeqCst);
    eprintln!(
        "flood: the application's accepts: {:?}, at most {max_accepting} in progress at once",
        server.outcomes.lock().unwrap()
    );
    assert!(
        max_accepting <= u64::from(FLOOD_BACKLOG),
        "{max_accepting} accepts in progress at once: more half-open connections than the backlog of {FLOOD_BACKLOG}"
    );
    assert!(
        max_qps <= 2 + FLOOD_BACKLOG as usize,
        "{max_qps} QPs at once: more half-open connections than the backlog of {FLOOD_BACKLOG}"
    );
    assert_eq!(accepted, 0, "a flood id without RTU was established");
    // Requests waiting for the application's answer hold the backlog without a QP: the QPs
    // settled, the last of them may still hold it for up to the connect timeout (a typed busy
    // reject until then).
    fresh_client_served_within(addr, 2 * FLOOD_TIMEOUT).await;
    bystander.still_exchanging("after the flood").await;
    release_tx.send(()).unwrap();
    step("the flood's ids", flood).await.unwrap();
    bystander.finish().await;
    server.task.abort();
}

/// [`step`] with 4 × [`STEP`] (500 connects under TCG).
async fn step_long<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(STEP * 4, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {:?}", STEP * 4),
    }
}
