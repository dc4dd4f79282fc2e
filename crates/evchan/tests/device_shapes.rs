//! The shapes real programs give a connection, against the kernel's rdma_cm and rxe (in the
//! soft-RoCE VM): many tasks sending on one connection with the window full, many `send`s of
//! one task in a `FuturesUnordered`, senders cancelled at random, a request/reply protocol
//! over `Stream` with a window of one message, a connection used from two runtimes in turn
//! (the first idle), and a foreign executor's `block_on` on a tokio worker. Each shape hung
//! before the waiter lines of `wait.rs`; every wait here has a bound, so a hang is a failure.
//! Run with `--test-threads 1`.
#![forbid(unsafe_code)]

mod support;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use evchan::{Config, Connection, Error, Listener, Stream};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::SinkExt;
use support::{port, step, v4};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// A message of sender `who`, number `seq`, padded to `len` bytes.
fn tagged(who: u32, seq: u32, len: usize) -> Bytes {
    let mut v = vec![(seq % 251) as u8; len.max(8)];
    v[..4].copy_from_slice(&who.to_be_bytes());
    v[4..8].copy_from_slice(&seq.to_be_bytes());
    Bytes::from(v)
}

fn untag(m: &[u8]) -> (u32, u32) {
    let who = u32::from_be_bytes(m[..4].try_into().unwrap());
    let seq = u32::from_be_bytes(m[4..8].try_into().unwrap());
    (who, seq)
}

/// Accepts one connection and reads until the peer's FIN: each sender's messages must come
/// in order, once each, numbered from 0 without a gap. Returns how many came per sender.
async fn sink(listener: Listener) -> Result<HashMap<u32, u32>, Error> {
    let mut conn = listener.accept().await?.accept(b"").await?;
    let mut next: HashMap<u32, u32> = HashMap::new();
    while let Some(m) = conn.recv().await? {
        let (who, seq) = untag(&m);
        let want = next.entry(who).or_default();
        assert_eq!(
            seq, *want,
            "sender {who}: message {seq} came when {want} was due"
        );
        *want += 1;
    }
    conn.close().await?;
    Ok(next)
}

/// A listener and a connection to it, with `sink` serving it.
async fn to_sink(
    config: Config,
    port: u16,
) -> (
    Connection,
    tokio::task::JoinHandle<Result<HashMap<u32, u32>, Error>>,
) {
    let listener = step("bind", Listener::bind(v4(port), config.clone()))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(sink(listener));
    let conn = step(
        "connect",
        Connection::builder().config(config).connect(addr),
    )
    .await
    .unwrap();
    (conn, server)
}

/// `tasks` tasks share one connection, each sending `n` messages; all arrive, each sender's
/// in order.
async fn many_senders(tasks: u32, n: u32, port: u16) {
    let (conn, server) = to_sink(Config::new(), port).await;
    let conn = Arc::new(conn);
    let started = Instant::now();
    let senders: Vec<_> = (0..tasks)
        .map(|who| {
            let conn = Arc::clone(&conn);
            tokio::spawn(async move {
                for seq in 0..n {
                    conn.send(tagged(who, seq, 64)).await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    // All of them, within a bound that grows with the messages (a debug build under TCG).
    let bound = Duration::from_secs(30 + u64::from(tasks * n) / 1_000);
    let all = futures_util::future::join_all(senders);
    match tokio::time::timeout(bound, all).await {
        Ok(done) => done.into_iter().for_each(|r| r.unwrap().unwrap()),
        Err(_) => panic!("{tasks} senders x {n} messages not done within {bound:?}"),
    }
    let conn = Arc::into_inner(conn).expect("every sender is done");
    step("close", conn.close()).await.unwrap();
    let got = step("sink", server).await.unwrap().unwrap();
    for who in 0..tasks {
        assert_eq!(got.get(&who), Some(&n), "sender {who}");
    }
    eprintln!(
        "{tasks} tasks x {n} messages on one connection: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn many_tasks_send_on_one_connection_current_thread() {
    require_device!();
    for (k, tasks) in [1, 2, 4, 16].into_iter().enumerate() {
        many_senders(tasks, 5_000, port(k as u16)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_send_on_one_connection_multi_thread() {
    require_device!();
    for (k, tasks) in [2, 4, 16].into_iter().enumerate() {
        many_senders(tasks, 5_000, port(12 + k as u16)).await;
    }
}

/// 64 sends of one task in a `FuturesUnordered` (each future its own waker), 20 rounds: all
/// complete, and the peer gets all.
#[tokio::test]
async fn futures_unordered_of_sends_in_one_task() {
    require_device!();
    let (conn, server) = to_sink(Config::new(), port(6)).await;
    for round in 0..20u32 {
        let mut sends: FuturesUnordered<_> = (0..64u32)
            .map(|k| conn.send(tagged(round * 64 + k, 0, 32)))
            .collect();
        while let Some(r) = step("a send of the set", sends.next()).await {
            r.unwrap();
        }
    }
    step("close", conn.close()).await.unwrap();
    let got = step("sink", server).await.unwrap().unwrap();
    assert_eq!(got.len(), 20 * 64);
    assert!(got.values().all(|&n| n == 1));
}

/// Senders whose `send`s time out at random (a cancelled send posts nothing): every message
/// that `send` returned `Ok` for arrives once, each sender's in order, and no sender is left
/// waiting behind a cancelled one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn senders_cancelled_at_random_lose_and_duplicate_nothing() {
    require_device!();
    let (conn, server) = to_sink(Config::new().recv_depth(4), port(7)).await;
    let conn = Arc::new(conn);
    let senders: Vec<_> = (0..6u32)
        .map(|who| {
            let conn = Arc::clone(&conn);
            tokio::spawn(async move {
                // A small xorshift, seeded per sender: reproducible.
                let mut x = 0x9e37_79b9_u32 ^ (who + 1);
                let (mut sent, mut cancelled) = (0u32, 0u32);
                while sent < 1_500 {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let limit = Duration::from_micros(u64::from(x % 400));
                    match tokio::time::timeout(limit, conn.send(tagged(who, sent, 48))).await {
                        Ok(r) => {
                            r?;
                            sent += 1;
                        }
                        Err(_) => cancelled += 1,
                    }
                }
                Ok::<_, Error>((sent, cancelled))
            })
        })
        .collect();
    let mut cancelled = 0;
    for s in senders {
        let (sent, c) = step("a sender", s).await.unwrap().unwrap();
        assert_eq!(sent, 1_500);
        cancelled += c;
    }
    let conn = Arc::into_inner(conn).expect("every sender is done");
    step("close", conn.close()).await.unwrap();
    let got = step("sink", server).await.unwrap().unwrap();
    assert_eq!(got.len(), 6);
    assert!(got.values().all(|&n| n == 1_500), "{got:?}");
    eprintln!("{cancelled} sends cancelled by their timeouts");
    assert!(
        cancelled > 0,
        "no send was cancelled: the test did not test cancellation"
    );
}

/// A `recv` dropped while it waits loses nothing: the next `recv` gets the message that
/// came after. A `send` dropped while it waits for a credit posts nothing.
#[tokio::test]
async fn a_dropped_recv_or_send_loses_and_sends_nothing() {
    require_device!();
    let config = Config::new().recv_depth(1);
    let listener = step("bind", Listener::bind(v4(port(8)), config.clone()))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let (go, went) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let mut conn = listener.accept().await?.accept(b"").await?;
        // Holds the first message until told: the client's window (one) stays full.
        let first = conn.recv().await?.expect("first");
        went.await.unwrap();
        drop(first);
        conn.send("reply").await?;
        let mut rest = Vec::new();
        while let Some(m) = conn.recv().await? {
            rest.push(untag(&m).1);
        }
        conn.close().await?;
        Ok::<_, Error>(rest)
    });
    let mut conn = step(
        "connect",
        Connection::builder().config(config).connect(addr),
    )
    .await
    .unwrap();
    step("send 0", conn.send(tagged(0, 0, 8))).await.unwrap();
    // No credit: this send waits, and is dropped while it waits.
    let waited = tokio::time::timeout(Duration::from_millis(200), conn.send(tagged(0, 99, 8)));
    assert!(waited.await.is_err(), "a send with no credit completed");
    // A recv dropped while waiting: nothing has come.
    let waited = tokio::time::timeout(Duration::from_millis(100), conn.recv());
    assert!(waited.await.is_err(), "a recv completed with nothing sent");
    go.send(()).unwrap();
    let reply = step("reply", conn.recv()).await.unwrap();
    assert_eq!(reply.as_deref(), Some(&b"reply"[..]));
    step("send 1", conn.send(tagged(0, 1, 8))).await.unwrap();
    step("close", conn.close()).await.unwrap();
    let rest = step("server", server).await.unwrap().unwrap();
    assert_eq!(rest, [1], "the cancelled send went out");
}

/// Request/reply through `Framed<Stream, LengthDelimitedCodec>` with one receive slot on each
/// side: a message read to its last byte gives its slot and credit back at once, so the next
/// request and reply go.
#[tokio::test]
async fn stream_request_reply_with_a_window_of_one() {
    require_device!();
    let config = Config::new().recv_depth(1);
    let listener = step("bind", Listener::bind(v4(port(9)), config.clone()))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(async move {
        let conn = listener.accept().await?.accept(b"").await?;
        let mut framed = Framed::new(Stream::new(conn), LengthDelimitedCodec::new());
        let mut served = 0u32;
        while let Some(req) = framed.next().await {
            let mut reply = req?.to_vec();
            reply.reverse();
            framed.send(Bytes::from(reply)).await?;
            served += 1;
        }
        Ok::<_, std::io::Error>(served)
    });
    let conn = step(
        "connect",
        Connection::builder().config(config).connect(addr),
    )
    .await
    .unwrap();
    let mut framed = Framed::new(Stream::new(conn), LengthDelimitedCodec::new());
    for i in 0..200u32 {
        let req = Bytes::from(format!("request {i} {}", "x".repeat(i as usize % 90)));
        step("request", framed.send(req.clone())).await.unwrap();
        let reply = step("reply", framed.next()).await.unwrap().unwrap();
        let mut want = req.to_vec();
        want.reverse();
        assert_eq!(&reply[..], &want[..], "reply {i}");
    }
    step("shutdown", SinkExt::<Bytes>::close(&mut framed))
        .await
        .unwrap();
    drop(framed);
    assert_eq!(step("server", server).await.unwrap().unwrap(), 200);
}

/// An echo server on its own thread and runtime, for the tests that run several runtimes of
/// their own (or block a worker of theirs): each echo after `delay`.
fn echo_server(
    config: Config,
    port: u16,
    delay: Duration,
) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = Listener::bind(v4(port), config).await.unwrap();
            tx.send(listener.local_addr()).unwrap();
            let mut conn = listener.accept().await.unwrap().accept(b"").await.unwrap();
            while let Some(m) = conn.recv().await.unwrap() {
                tokio::time::sleep(delay).await;
                conn.send(m).await.unwrap();
            }
            conn.close().await.unwrap();
        });
    });
    (rx.recv_timeout(support::STEP).unwrap(), handle)
}

async fn ping(conn: &mut Connection, i: u32) {
    let m = tagged(0, i, 16);
    step("ping", conn.send(m.clone())).await.unwrap();
    let back = step("pong", conn.recv()).await.unwrap().expect("an echo");
    assert_eq!(back, m);
}

/// A connection made, and first awaited, on runtime A, which then sits idle (nobody drives
/// its reactor), then used from runtime B on another thread: its waits register with B.
/// Then back on A, and on a third runtime after B is dropped.
#[test]
fn a_connection_used_from_two_runtimes_in_turn() {
    require_device!();
    let (addr, server) = echo_server(Config::new(), port(10), Duration::ZERO);
    let rt = |()| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let a = rt(());
    let mut conn = a.block_on(async {
        let mut conn = step("connect", Connection::connect(addr)).await.unwrap();
        for i in 0..10 {
            ping(&mut conn, i).await;
        }
        conn
    });
    // A is idle from here on (not dropped): B's waits must not depend on A's reactor.
    let mut conn = std::thread::scope(|s| {
        s.spawn(|| {
            let b = rt(());
            b.block_on(async {
                for i in 10..110 {
                    ping(&mut conn, i).await;
                }
            });
            conn
        })
        .join()
        .unwrap()
    });
    a.block_on(async {
        for i in 110..120 {
            ping(&mut conn, i).await;
        }
    });
    let c = rt(());
    c.block_on(async {
        for i in 120..130 {
            ping(&mut conn, i).await;
        }
        step("close", conn.close()).await.unwrap();
    });
    server.join().unwrap();
}

/// A minimal foreign executor: polls on the calling thread, parks between polls; panics when
/// nothing woke it for `limit` (a silent park is the failure this looks for).
fn foreign_block_on<F: Future>(fut: F, limit: Duration) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    let deadline = Instant::now() + limit;
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let now = Instant::now();
        assert!(
            now < deadline,
            "the future parked for {limit:?} without a wake-up"
        );
        std::thread::park_timeout(deadline - now);
    }
}

/// A `recv` with busy polling, run by a foreign executor on a tokio worker: its yields must
/// wake it (tokio's deferred wake would come only once the worker gets control back, which
/// the foreign `block_on` never gives it). Event-driven waits work there too, past tokio's
/// budget for one task poll. The echo server runs on a runtime of its own: a task of the
/// blocked worker's (its LIFO slot) would wait as long as the block lasts, which is tokio's
/// rule for any blocking call on a worker, not evchan's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_block_on_on_a_tokio_worker() {
    require_device!();
    for (k, busy) in [Some(Duration::from_millis(50)), None]
        .into_iter()
        .enumerate()
    {
        let config = Config::new().busy_poll(busy);
        // Late enough that the client's recv yields many times first.
        let (addr, server) = echo_server(
            config.clone(),
            port(20 + k as u16),
            Duration::from_millis(2),
        );
        let conn = step(
            "connect",
            Connection::builder().config(config).connect(addr),
        )
        .await
        .unwrap();
        let client = tokio::spawn(async move {
            let mut conn = conn;
            // More round trips than tokio's budget for one task poll (128): the sends complete
            // at once, so the task never yields and its budget is never renewed.
            for i in 0..200u32 {
                let m = tagged(0, i, 16);
                conn.send(m.clone()).await?;
                let back = foreign_block_on(conn.recv(), Duration::from_secs(20))?;
                assert_eq!(back.as_ref(), Some(&m), "echo {i}");
            }
            conn.close().await
        });
        step("client", client).await.unwrap().unwrap();
        tokio::task::spawn_blocking(move || server.join().unwrap())
            .await
            .unwrap();
    }
}

fn is_qp_error(r: &Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(r, Err(Error::ConnectionLost(evchan::Lost::QpError { .. })))
}

/// A live connection's QP moved to the error state (the test door, as a fatal device error
/// would, with no failed work request of ours): a `recv` waiting on another task, then `send`,
/// return `Lost::QpError` within a second; on a whole connection, `recv`, `send` and `close`
/// do. Nothing is silently dropped: the flushes are the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qp_in_the_error_state_ends_the_connection_for_every_method() {
    require_device!();
    for (k, split) in [true, false].into_iter().enumerate() {
        let listener = step(
            "bind",
            Listener::bind(v4(port(22 + k as u16)), Config::new()),
        )
        .await
        .unwrap();
        let addr = listener.local_addr();
        // The peer echoes until its connection fails (our QP no longer answers it).
        let server = tokio::spawn(async move {
            let mut conn = listener.accept().await?.accept(b"").await?;
            while let Some(m) = conn.recv().await? {
                conn.send(m).await?;
            }
            Ok::<_, Error>(())
        });
        let mut conn = step("connect", Connection::connect(addr)).await.unwrap();
        ping(&mut conn, 0).await;
        let bound = Duration::from_secs(1);
        if split {
            let (send, mut recv) = conn.split();
            let waiting = tokio::spawn(async move { recv.recv().await });
            tokio::time::sleep(Duration::from_millis(50)).await;
            send.__force_qp_error().unwrap();
            let r = tokio::time::timeout(bound, waiting).await;
            let r = r.expect("the waiting recv did not end within 1 s").unwrap();
            assert!(is_qp_error(&r), "recv: {r:?}");
            let r = tokio::time::timeout(bound, send.send("x"))
                .await
                .expect("send");
            assert!(is_qp_error(&r), "send: {r:?}");
        } else {
            conn.__force_qp_error().unwrap();
            let r = tokio::time::timeout(bound, conn.recv())
                .await
                .expect("recv");
            assert!(is_qp_error(&r), "recv: {r:?}");
            let r = tokio::time::timeout(bound, conn.send("x"))
                .await
                .expect("send");
            assert!(is_qp_error(&r), "send: {r:?}");
            let r = tokio::time::timeout(bound, conn.close())
                .await
                .expect("close");
            assert!(is_qp_error(&r), "close: {r:?}");
        }
        // The peer learns of it by its transport's retries; it ends either way.
        let _ = step("server", server).await.unwrap();
    }
}

fn fatal<T>(r: &Result<T, Error>) -> bool {
    matches!(
        r,
        Err(Error::ConnectionLost(evchan::Lost::QpError {
            event: Some(evchan::core::verbs::AsyncEventKind::QpFatal)
        }))
    )
}

/// A fatal QP async event, handed to the connection through the table the runtime routes the
/// devices' events by (rxe raises none when a QP fails; the door stands in for the read):
/// `recv`, `send` and `close` return `Lost::QpError` with the event.
#[tokio::test]
async fn a_fatal_qp_event_ends_the_connection_with_its_kind() {
    require_device!();
    use evchan::core::verbs::AsyncEventKind;
    let (conn, server) = to_sink(Config::new(), port(24)).await;
    let mut conn = conn;
    step("send", conn.send(tagged(0, 0, 8))).await.unwrap();
    assert!(
        conn.__route_qp_event(AsyncEventKind::QpFatal),
        "the QP is not in the table"
    );
    let bound = Duration::from_secs(1);
    let r = tokio::time::timeout(bound, conn.recv())
        .await
        .expect("recv");
    assert!(fatal(&r), "recv: {r:?}");
    let r = tokio::time::timeout(bound, conn.send("x"))
        .await
        .expect("send");
    assert!(fatal(&r), "send: {r:?}");
    let r = tokio::time::timeout(bound, conn.close())
        .await
        .expect("close");
    assert!(fatal(&r), "close: {r:?}");
    let _ = step("sink", server).await.unwrap();
}

/// A small xorshift generator, seeded: the soak's draws are reproducible.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Self {
        Rng((seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// One record of the soak: sender, number, and a check of both (16 bytes, so that a byte
/// stream that splits or joins messages still parses).
fn record(who: u32, seq: u32) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..4].copy_from_slice(&who.to_be_bytes());
    r[4..8].copy_from_slice(&seq.to_be_bytes());
    r[8..16].copy_from_slice(
        &(u64::from(who) << 32 | u64::from(seq))
            .wrapping_mul(31)
            .to_be_bytes(),
    );
    r
}

fn parse(r: &[u8]) -> (u32, u32) {
    let (who, seq) = untag(r);
    let check = u64::from_be_bytes(r[8..16].try_into().unwrap());
    assert_eq!(
        check,
        (u64::from(who) << 32 | u64::from(seq)).wrapping_mul(31),
        "a torn record"
    );
    (who, seq)
}

/// The soak's server for one connection: echoes every record back, either message by message
/// (`send`s whose timeouts cancel them, sent again until posted) or through `Stream` (reads of
/// random sizes, cancelled by timeouts at random), until the peer's FIN; then closes.
async fn soak_server(listener: Listener, stream: bool, seed: u64) -> Result<(), Error> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = listener.accept().await?.accept(b"").await?;
    let mut rng = Rng::new(seed, 0x5e);
    if stream {
        let mut s = Stream::new(conn);
        let mut buf = vec![0u8; 256];
        loop {
            let want = 1 + rng.below(256) as usize;
            let limit = Duration::from_micros(rng.below(500));
            let n = match tokio::time::timeout(limit, s.read(&mut buf[..want])).await {
                Err(_) => continue, // cancelled: nothing was read
                Ok(r) => r?,
            };
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).await?;
        }
        s.shutdown().await?;
        return Ok(());
    }
    loop {
        let limit = Duration::from_micros(rng.below(500));
        let m = match tokio::time::timeout(limit, conn.recv()).await {
            Err(_) => continue,
            Ok(m) => m?,
        };
        let Some(m) = m else { break };
        loop {
            let limit = Duration::from_micros(rng.below(300));
            match tokio::time::timeout(limit, conn.send(&m)).await {
                Err(_) => continue, // not posted: again
                Ok(r) => break r?,
            }
        }
    }
    conn.close().await
}

/// One connection of the soak: `senders` tasks share its send half, each sending records
/// until `until`, each `send` under a random timeout (a cancelled one is not sent, so the
/// record is not counted); one task reads the echoes under random timeouts and checks that
/// each sender's records come back once each, in order, all of them.
async fn soak_connection(addr: std::net::SocketAddr, senders: u32, until: Instant, seed: u64) {
    let conn = step("connect", Connection::connect(addr)).await.unwrap();
    let (send, mut recv) = conn.split();
    let send = Arc::new(send);
    let tasks: Vec<_> = (0..senders)
        .map(|who| {
            let send = Arc::clone(&send);
            tokio::spawn(async move {
                let mut rng = Rng::new(seed, u64::from(who) + 1);
                let (mut sent, mut cancelled) = (0u32, 0u32);
                while Instant::now() < until {
                    let limit = Duration::from_micros(rng.below(400));
                    match tokio::time::timeout(limit, send.send(record(who, sent))).await {
                        Err(_) => cancelled += 1,
                        Ok(r) => {
                            r?;
                            sent += 1;
                        }
                    }
                }
                Ok::<_, Error>((sent, cancelled))
            })
        })
        .collect();
    let reader = tokio::spawn(async move {
        let mut rng = Rng::new(seed, 0x7ead);
        let mut next = vec![0u32; senders as usize];
        let mut bytes: Vec<u8> = Vec::new();
        loop {
            let limit = Duration::from_micros(rng.below(600));
            let m = match tokio::time::timeout(limit, recv.recv()).await {
                Err(_) => continue,
                Ok(m) => m?,
            };
            let Some(m) = m else { break };
            bytes.extend_from_slice(&m);
            let whole = bytes.len() / 16 * 16;
            for r in bytes[..whole].chunks(16) {
                let (who, seq) = parse(r);
                let want = &mut next[who as usize];
                assert_eq!(seq, *want, "sender {who}: record {seq} when {want} was due");
                *want += 1;
            }
            bytes.drain(..whole);
        }
        assert!(bytes.is_empty(), "a record cut short");
        Ok::<_, Error>(next)
    });
    let bound = until.saturating_duration_since(Instant::now()) + Duration::from_secs(60);
    let mut sent = Vec::new();
    let mut cancelled = 0;
    for t in tasks {
        let (s, c) = tokio::time::timeout(bound, t)
            .await
            .expect("a sender hung")
            .unwrap()
            .unwrap();
        sent.push(s);
        cancelled += c;
    }
    // Every sender is done: the FIN goes after their records.
    drop(Arc::into_inner(send).expect("no sender left"));
    let got = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("the reader hung")
        .unwrap()
        .unwrap();
    assert_eq!(got, sent, "records echoed per sender");
    eprintln!(
        "  {} records echoed, {cancelled} sends cancelled",
        sent.iter().sum::<u32>()
    );
}

/// The soak: for `secs`, three connections (echoed message by message, through `Stream`, and
/// by messages again), each with four senders and a reader, every operation under a random
/// timeout on both sides. Nothing hangs, nothing is lost or duplicated, counts are exact.
async fn soak(secs: u64, seed: u64, first_port: u16) {
    let until = Instant::now() + Duration::from_secs(secs);
    let mut runs = Vec::new();
    for j in 0..3u16 {
        let listener = step(
            "bind",
            Listener::bind(v4(port(first_port + j)), Config::new()),
        )
        .await
        .unwrap();
        let addr = listener.local_addr();
        let seed = seed ^ u64::from(j);
        let server = tokio::spawn(soak_server(listener, j == 1, seed));
        runs.push(tokio::spawn(async move {
            soak_connection(addr, 4, until, seed).await;
            server.await.unwrap().unwrap();
        }));
    }
    for r in runs {
        r.await.unwrap();
    }
}

fn soak_seed() -> (u64, u64) {
    let secs = std::env::var("EVCHAN_SHAPES_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let seed = std::env::var("EVCHAN_SHAPES_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x0e5c_4a11);
    eprintln!("soak: {secs} s, seed {seed} (EVCHAN_SHAPES_SOAK_SECS, EVCHAN_SHAPES_SOAK_SEED)");
    (secs, seed)
}

/// The seeded soak on a current-thread runtime (15 s by default).
#[tokio::test]
async fn a_seeded_soak_of_concurrent_cancelled_operations_current_thread() {
    require_device!();
    let (secs, seed) = soak_seed();
    soak(secs, seed, 15).await;
}

/// The seeded soak on a multi-thread runtime (15 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_soak_of_concurrent_cancelled_operations_multi_thread() {
    require_device!();
    let (secs, seed) = soak_seed();
    soak(secs, seed ^ 0xff, 18).await;
}
