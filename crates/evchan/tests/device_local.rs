//! `evchan::local`: connections scoped to one future, against the kernel's rdma_cm and rxe (in
//! the soft-RoCE VM), with regular `Listener`/`Connection` peers and with each other. Run with
//! `--test-threads 1` (RDMA resources are counted process-wide).
#![forbid(unsafe_code)]

mod support;

use std::cell::Cell;
use std::future::Future as _;
use std::time::Duration;

use evchan::local::{self, LocalConnection};
use evchan::{Config, Connection, Error, Listener, Lost};
use support::{port, qps_settle_to, step, user_rdma_resources, v4};

/// The kinds of `rdma resource show` a test must leave as it found them.
const KINDS: [&str; 5] = ["cm_id", "qp", "cq", "mr", "pd"];

fn resources(kinds: &[&str]) -> Vec<usize> {
    kinds.iter().map(|k| user_rdma_resources(k).len()).collect()
}

/// Waits (at most 20 s) until `kinds` list as many entries as `before`.
fn settle_to(kinds: &[&str], before: &[usize], what: &str) {
    let start = std::time::Instant::now();
    loop {
        let now = resources(kinds);
        if now == before {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}: {kinds:?} list {now:?}, {before:?} expected; listed: {:#?}",
            kinds
                .iter()
                .flat_map(|k| user_rdma_resources(k))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn msg(i: u32, len: usize) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; len.max(4)];
    v[..4].copy_from_slice(&i.to_be_bytes());
    v
}

/// The size of message `i` of `n`: 1..=max, the last one `max`.
fn size(i: u32, n: u32, max: usize) -> usize {
    if i + 1 == n {
        max
    } else {
        1 + (i as usize * 37) % max
    }
}

/// Sends `n` messages of 1..=max bytes and checks each echo.
async fn ping(conn: &mut LocalConnection<'_>, n: u32) -> Result<(), Error> {
    let max = conn.max_message_size();
    for i in 0..n {
        let m = msg(i, size(i, n, max));
        conn.send(&m).await?;
        let back = conn.recv().await?.expect("an echo");
        assert_eq!(&back[..], &m[..], "message {i}");
    }
    Ok(())
}

/// Echoes until the peer's FIN.
async fn echo(conn: &mut LocalConnection<'_>) -> Result<u32, Error> {
    let mut n = 0;
    while let Some(m) = conn.recv().await? {
        conn.send(&m).await?;
        n += 1;
    }
    Ok(n)
}

/// `attempt` (a connect) again every 20 ms while it is rejected with reason 8 (nobody
/// listens yet: the server side starts in the same task).
async fn until_listening<R>(
    mut attempt: impl AsyncFnMut() -> Result<R, Error>,
) -> Result<R, Error> {
    loop {
        match attempt().await {
            Err(Error::Rejected { reason, .. }) if reason.0 == 8 => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            r => return r,
        }
    }
}

/// A regular `Listener` on the VM's address at `port`, and the address it is bound to.
async fn bind(port: u16, config: Config) -> (Listener, std::net::SocketAddr) {
    let listener = step("bind", Listener::bind(v4(port), config))
        .await
        .unwrap();
    let addr = listener.local_addr();
    (listener, addr)
}

fn configs() -> [Config; 2] {
    [
        Config::new(),
        Config::new().busy_poll(Some(Duration::from_micros(300))),
    ]
}

/// A local client, a regular `Listener` server that echoes: 300 messages of 1..=4096 bytes
/// come back in order, in event and busy-poll mode; the server sees the client's FIN.
#[tokio::test(flavor = "current_thread")]
async fn local_client_regular_server() {
    require_device!();
    let before = resources(&["cm_id", "qp"]);
    for (k, config) in configs().into_iter().enumerate() {
        let (listener, addr) = bind(port(1 + k as u16), Config::new()).await;
        let server = tokio::spawn(async move {
            let mut conn = listener.accept().await?.accept(b"echo").await?;
            let mut n = 0u32;
            while let Some(m) = conn.recv().await? {
                conn.send(m).await?;
                n += 1;
            }
            conn.close().await?;
            Ok::<_, Error>(n)
        });
        let r = step(
            "client",
            local::connect(addr, config, b"hi", async |conn| {
                assert_eq!(conn.peer_private_data(), b"echo");
                assert!(conn.is_evchan_peer());
                assert_eq!(conn.max_message_size(), 4096);
                ping(conn, 300).await
            }),
        )
        .await;
        r.unwrap().unwrap();
        assert_eq!(step("server", server).await.unwrap().unwrap(), 300);
    }
    settle_to(&["cm_id", "qp"], &before, "after the local clients");
}

/// A regular client, a local listener that echoes two connections in turn.
#[tokio::test(flavor = "current_thread")]
async fn regular_client_local_listener() {
    require_device!();
    let before = resources(&["cm_id", "qp"]);
    let addr = v4(port(3));
    let server = local::listen(addr, Config::new(), async |l| {
        let mut counts = Vec::new();
        for _ in 0..2 {
            counts.push(l.accept(b"local", async |c| echo(c).await).await??);
        }
        Ok::<_, Error>(counts)
    });
    let client = async {
        for _ in 0..2 {
            let mut conn = until_listening(async || Connection::connect(addr).await)
                .await
                .unwrap_or_else(|e| panic!("connect: {e}"));
            assert_eq!(conn.peer_private_data(), b"local");
            for i in 0..300u32 {
                let m = bytes::Bytes::from(msg(i, size(i, 300, 4096)));
                conn.send(m.clone()).await.unwrap();
                assert_eq!(conn.recv().await.unwrap().unwrap(), m, "message {i}");
            }
            conn.close().await.unwrap();
        }
    };
    let (counts, ()) = step("both", async { tokio::join!(server, client) }).await;
    assert_eq!(counts.unwrap().unwrap(), vec![300, 300]);
    settle_to(&["cm_id", "qp"], &before, "after the local listener");
}

/// Local to local, event and busy-poll mode, in one task; every resource is gone after.
#[tokio::test(flavor = "current_thread")]
async fn local_to_local() {
    require_device!();
    let before = resources(&KINDS);
    for (k, config) in configs().into_iter().enumerate() {
        let addr = v4(port(4 + k as u16));
        let server = local::listen(addr, config.clone(), async |l| {
            assert_eq!(l.local_addr(), Some(addr));
            l.accept(b"", async |c| echo(c).await).await
        });
        let client = until_listening(async || {
            local::connect(addr, config.clone(), b"", async |c| ping(c, 300).await).await
        });
        let (s, c) = step("both", async { tokio::join!(server, client) }).await;
        c.unwrap().unwrap();
        assert_eq!(s.unwrap().unwrap().unwrap(), 300);
    }
    settle_to(&KINDS, &before, "after local to local");
}

/// A local sender to a regular peer that does not read for 500 ms: it posts exactly the
/// peer's 4 data credits and waits (the connection does not fail: no RNR), then every one of
/// 100 messages arrives, in order, once the peer reads.
#[tokio::test(flavor = "current_thread")]
async fn credits_hold_a_sender_back() {
    require_device!();
    let before = resources(&["cm_id", "qp"]);
    let (listener, addr) = bind(port(6), Config::new().recv_depth(4)).await;
    let sent = Cell::new(0u32);
    let server = async {
        let mut conn = listener.accept().await?.accept(b"").await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(sent.get(), 4, "sends posted while the peer did not read");
        let mut i = 0u32;
        while let Some(m) = conn.recv().await? {
            assert_eq!(&m[..], &msg(i, 64)[..], "message {i}");
            i += 1;
        }
        conn.close().await?;
        Ok::<_, Error>(i)
    };
    let client = local::connect(addr, Config::new(), b"", async |c| {
        for i in 0..100 {
            c.send(&msg(i, 64)).await?;
            sent.set(i + 1);
        }
        Ok::<_, Error>(())
    });
    let (s, c) = step("both", async { tokio::join!(server, client) }).await;
    c.unwrap().unwrap();
    assert_eq!(s.unwrap(), 100);
    drop(listener);
    settle_to(&["cm_id", "qp"], &before, "after the credits test");
}

/// The peer closes cleanly after 3 messages: `recv` returns them, then `None`; `send` above the
/// peer's maximum is `MessageTooLarge` and sends nothing.
#[tokio::test(flavor = "current_thread")]
async fn peer_close_and_too_large() {
    require_device!();
    let before = resources(&["cm_id", "qp"]);
    let (listener, addr) = bind(port(7), Config::new().max_message(256)).await;
    let server = tokio::spawn(async move {
        let mut conn = listener.accept().await?.accept(b"").await?;
        for i in 0..3 {
            conn.send(bytes::Bytes::from(msg(i, 100))).await?;
        }
        let got = conn.recv().await?;
        conn.close().await?;
        Ok::<_, Error>(got)
    });
    let r = local::connect(addr, Config::new(), b"", async |c| {
        assert_eq!(c.max_message_size(), 256);
        let e = c.send(&[0; 257]).await.unwrap_err();
        assert!(
            matches!(e, Error::MessageTooLarge { len: 257, max: 256 }),
            "{e:?}"
        );
        c.send(&[7; 256]).await?;
        for i in 0..3 {
            assert_eq!(&c.recv().await?.unwrap()[..], &msg(i, 100)[..]);
        }
        assert_eq!(c.recv().await?, None);
        assert_eq!(c.recv().await?, None);
        Ok::<_, Error>(())
    });
    step("client", r).await.unwrap().unwrap();
    let got = step("server", server).await.unwrap().unwrap();
    assert_eq!(got.as_deref(), Some(&[7u8; 256][..]));
    settle_to(&["cm_id", "qp"], &before, "after the close test");
}

/// The peer vanishes mid-stream (its runtime, with its shard, is dropped: its id is destroyed
/// and the kernel disconnects): `recv` returns the message before, then an error, and does not
/// hang; `send` after it fails too.
#[tokio::test(flavor = "current_thread")]
async fn peer_vanishes() {
    require_device!();
    let before = resources(&["cm_id", "qp"]);
    let addr = v4(port(8));
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let peer = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let conn = rt.block_on(async {
            let listener = Listener::bind(addr, Config::new()).await?;
            ready_tx.send(()).unwrap();
            let mut conn = listener.accept().await?.accept(b"").await?;
            conn.send(bytes::Bytes::from_static(b"one")).await?;
            assert_eq!(conn.recv().await?.as_deref(), Some(&b"go"[..]));
            Ok::<_, Error>(conn)
        });
        drop(rt);
        drop(conn);
    });
    ready_rx.await.unwrap();
    let r = local::connect(addr, Config::new(), b"", async |c| {
        assert_eq!(c.recv().await?.as_deref(), Some(&b"one"[..]));
        c.send(b"go").await?;
        let e = step("recv after the peer vanished", c.recv())
            .await
            .unwrap_err();
        assert!(matches!(e, Error::ConnectionLost(_)), "{e:?}");
        let e = c.send(b"x").await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::ConnectionLost(Lost::Disconnected | Lost::WorkCompletion(_))
            ),
            "{e:?}"
        );
        Ok::<_, Error>(())
    });
    step("client", r).await.unwrap().unwrap();
    peer.join().unwrap();
    settle_to(&["cm_id", "qp"], &before, "after the vanished peer");
}

/// Nobody listens: `Rejected` with reason 8, as `Connection::connect`; nothing is left.
#[tokio::test(flavor = "current_thread")]
async fn no_listener_is_rejected() {
    require_device!();
    let before = resources(&KINDS);
    let r = local::connect(v4(port(9)), Config::new(), b"", async |_| ()).await;
    match r {
        Err(Error::Rejected { reason, .. }) => assert_eq!(reason.0, 8),
        r => panic!("expected Rejected, got {r:?}"),
    }
    settle_to(&KINDS, &before, "after the rejected connect");
    qps_settle_to(before[1], "after the rejected connect");
}

/// A request with a malformed handshake (version 9) is rejected by a local listener as a
/// `Listener` rejects it (reason 28, `evchan: bad handshake`), and the listener accepts the
/// next, valid one.
#[tokio::test(flavor = "current_thread")]
async fn local_listener_rejects_a_bad_handshake() {
    require_device!();
    let before = resources(&["cm_id", "qp"]);
    let addr = v4(port(10));
    let mut bad = evchan::proto::Handshake {
        data_slots: 4,
        ctrl_slots: 4,
        max_message: 64,
    }
    .encode(b"");
    bad[4] = 9;
    let server = local::listen(addr, Config::new(), async |l| {
        l.accept(b"", async |c| echo(c).await).await
    });
    let clients = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (kind, status, reply) = step(
            "the bad request",
            tokio::task::spawn_blocking(move || support::raw_cm::connect_only(addr, &bad)),
        )
        .await
        .unwrap();
        assert_eq!((kind, status), (evchan_core::cm::EventKind::Rejected, 28));
        assert!(reply.starts_with(b"evchan: bad handshake"), "{reply:?}");
        local::connect(addr, Config::new(), b"", async |c| ping(c, 10).await).await
    };
    let (s, c) = step("both", async { tokio::join!(server, clients) }).await;
    c.unwrap().unwrap();
    assert_eq!(s.unwrap().unwrap().unwrap(), 10);
    settle_to(&["cm_id", "qp"], &before, "after the bad handshake");
}

/// `send` and `recv` under timeouts of 20–200 µs, each retried until it returns: a cancelled
/// `recv` loses no message (the docs' cancel safety), in event and busy-poll mode; the regular
/// server records what it got: exactly 0..200, in order. (`send` waits, and so can be
/// cancelled, only without a credit or a send slot, which this echo never lacks: the next test
/// cancels it.)
#[tokio::test(flavor = "current_thread")]
async fn send_and_recv_cancelled_lose_nothing() {
    require_device!();
    const N: u32 = 200;
    for (k, config) in configs().into_iter().enumerate() {
        let (listener, addr) = bind(port(11 + k as u16), Config::new()).await;
        let server = tokio::spawn(async move {
            let mut conn = listener.accept().await?.accept(b"").await?;
            let mut got = Vec::new();
            while let Some(m) = conn.recv().await? {
                got.push(u32::from_be_bytes(m[..4].try_into().unwrap()));
                conn.send(m).await?;
            }
            conn.close().await?;
            Ok::<_, Error>(got)
        });
        let (sends_cancelled, recvs_cancelled) = step(
            "client",
            local::connect(addr, config, b"", async |conn| {
                let (mut sends, mut recvs) = (0u32, 0u32);
                for i in 0..N {
                    let t = || Duration::from_micros(20 + u64::from(i * 37 % 181));
                    let m = msg(i, 64);
                    loop {
                        match tokio::time::timeout(t(), conn.send(&m)).await {
                            Ok(r) => break r.unwrap(),
                            Err(_) => sends += 1,
                        }
                    }
                    let back = loop {
                        match tokio::time::timeout(t(), conn.recv()).await {
                            Ok(r) => break r.unwrap().expect("an echo"),
                            Err(_) => recvs += 1,
                        }
                    };
                    assert_eq!(&back[..], &m[..], "message {i}");
                }
                (sends, recvs)
            }),
        )
        .await
        .unwrap();
        let got = step("server", server).await.unwrap().unwrap();
        assert_eq!(got, (0..N).collect::<Vec<_>>(), "config {k}");
        eprintln!(
            "config {k}: {sends_cancelled} sends and {recvs_cancelled} receives cancelled by \
             their timeout"
        );
        assert!(
            recvs_cancelled > 0,
            "no receive was ever cancelled: the test tested nothing"
        );
    }
}

/// `send` cancelled while it waits for the peer's credits (a server with 2 receives that reads
/// a message every 2 ms): each message is sent again until its `send` returns, and the server
/// gets every one exactly once, in order — a cancelled `send` sent nothing.
#[tokio::test(flavor = "current_thread")]
async fn send_cancelled_while_waiting_for_credits_sends_nothing() {
    require_device!();
    const N: u32 = 100;
    let (listener, addr) = bind(port(13), Config::new().recv_depth(2)).await;
    let server = tokio::spawn(async move {
        let mut conn = listener.accept().await?.accept(b"").await?;
        let mut got = Vec::new();
        loop {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let Some(m) = conn.recv().await? else { break };
            got.push(u32::from_be_bytes(m[..4].try_into().unwrap()));
        }
        conn.close().await?;
        Ok::<_, Error>(got)
    });
    let cancelled = step(
        "client",
        local::connect(addr, Config::new(), b"", async |conn| {
            let mut cancelled = 0u32;
            for i in 0..N {
                let m = msg(i, 64);
                loop {
                    let t = Duration::from_micros(50 + u64::from(i * 37 % 151));
                    match tokio::time::timeout(t, conn.send(&m)).await {
                        Ok(r) => break r.unwrap(),
                        Err(_) => cancelled += 1,
                    }
                }
            }
            cancelled
        }),
    )
    .await
    .unwrap();
    let got = step("server", server).await.unwrap().unwrap();
    assert_eq!(got, (0..N).collect::<Vec<_>>());
    eprintln!("{cancelled} sends cancelled by their timeout");
    assert!(
        cancelled > 0,
        "no send was ever cancelled: the test tested nothing"
    );
}

/// `LocalListener::accept` dropped while it waits for a request (a timeout) loses nothing: the
/// request that comes later is taken by the next `accept`.
#[tokio::test(flavor = "current_thread")]
async fn accept_cancelled_while_waiting_loses_no_request() {
    require_device!();
    let addr = v4(port(14));
    let r = step(
        "listen",
        local::listen(addr, Config::new(), async |l| {
            let early =
                tokio::time::timeout(Duration::from_millis(100), l.accept(b"", async |_| ())).await;
            assert!(early.is_err(), "no request yet, yet {early:?}");
            let client = tokio::spawn(async move {
                let conn = Connection::connect(addr).await?;
                conn.send(&b"after the cancel"[..]).await?;
                conn.close().await
            });
            let got = l
                .accept(b"", async |c| c.recv().await)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got.as_deref(), Some(&b"after the cancel"[..]));
            client.await.unwrap()
        }),
    )
    .await;
    r.unwrap().unwrap();
}

/// `recv_with` lends each message where it lies: a local echo server that copies every message
/// into one reused buffer (the docs' example) and a client that checks each echo in place, in
/// event and busy-poll mode. A closure that panics loses nothing: the client's first
/// `recv_with` panics, and the next receive returns that same message.
#[tokio::test(flavor = "current_thread")]
async fn recv_with_lends_the_message_and_survives_a_panic() {
    require_device!();
    const N: u32 = 100;
    let before = resources(&KINDS);
    for (k, config) in configs().into_iter().enumerate() {
        let addr = v4(port(15 + k as u16));
        let server = local::listen(addr, config.clone(), async |l| {
            l.accept(b"", async |conn| {
                let mut buf = Vec::new();
                let mut n = 0u32;
                while let Some(()) = conn
                    .recv_with(|m| {
                        buf.clear();
                        buf.extend_from_slice(m);
                    })
                    .await?
                {
                    conn.send(&buf).await?;
                    n += 1;
                }
                Ok::<_, Error>(n)
            })
            .await
        });
        let client = until_listening(async || {
            local::connect(addr, config.clone(), b"", async |conn| {
                let first = msg(0, 64);
                conn.send(&first).await?;
                let panicked = {
                    let mut fut = std::pin::pin!(conn.recv_with(|_| -> () {
                        panic!("a closure of recv_with panics (expected by this test)")
                    }));
                    std::future::poll_fn(|cx| {
                        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            fut.as_mut().poll(cx)
                        })) {
                            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
                            Ok(std::task::Poll::Ready(_)) => std::task::Poll::Ready(false),
                            Err(_) => std::task::Poll::Ready(true),
                        }
                    })
                    .await
                };
                assert!(panicked, "the closure was not run");
                let back = conn.recv().await?.expect("the first echo, again");
                assert_eq!(&back[..], &first[..], "the message the panic left");
                for i in 1..N {
                    let m = msg(i, size(i, N, conn.max_message_size()));
                    conn.send(&m).await?;
                    let same = conn.recv_with(|back| back == &m[..]).await?;
                    assert_eq!(same, Some(true), "message {i}");
                }
                Ok::<_, Error>(())
            })
            .await
        });
        let (s, c) = step("both", async { tokio::join!(server, client) }).await;
        c.unwrap().unwrap();
        assert_eq!(s.unwrap().unwrap().unwrap(), N, "config {k}");
    }
    settle_to(&KINDS, &before, "after recv_with");
}

/// `connect` and `listen` dropped while they wait leave nothing behind (the docs' cancel
/// safety): a connect to a local listener that never accepts, cancelled by a timeout while it
/// waits for `ESTABLISHED`, and the listener dropped with it, the request still in its backlog;
/// then no cm_id, QP, CQ, MR or PD is left (but librdmacm's own PD, pinned first) and nobody
/// listens on the port (reason 8).
#[tokio::test(flavor = "current_thread")]
async fn connect_and_listen_cancelled_leave_nothing() {
    require_device!();
    // Without this, librdmacm's PD was listed after the test whenever the listener's id went
    // before the connect's device list (`[0, 0, 0, 0, 1]` against `[0, 0, 0, 0, 0]`, a PD with
    // no users): in 2 of 8 runs of the whole binary, 8 of 36 runs of this test after
    // `accept_cancelled_while_waiting_loses_no_request`, and 12 of 12 runs of it alone.
    support::pin_librdmacm_pd();
    let before = resources(&KINDS);
    let addr = v4(port(17));
    let listening = Cell::new(false);
    let server = local::listen(addr, Config::new(), async |_| {
        listening.set(true);
        std::future::pending::<()>().await;
    });
    let client = tokio::time::timeout(
        Duration::from_millis(500),
        local::connect(addr, Config::new(), b"", async |_| ()),
    );
    let timed_out = tokio::select! {
        biased;
        _ = server => unreachable!("the listener's closure never returns"),
        r = client => r.is_err(),
    };
    assert!(listening.get(), "the listener never ran its closure");
    assert!(timed_out, "the connect did not wait for an accept");
    settle_to(&KINDS, &before, "after the cancelled connect and listen");
    let r = local::connect(addr, Config::new(), b"", async |_| ()).await;
    assert!(
        matches!(&r, Err(Error::Rejected { reason, .. }) if reason.0 == 8),
        "a connect after the listener was dropped: {r:?}"
    );
}
