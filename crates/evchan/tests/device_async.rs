//! The async API against the kernel's rdma_cm and rxe (in the soft-RoCE VM).
#![forbid(unsafe_code)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use evchan::{Config, Connection, Error, Listener, Lost};
use support::{port, step, v4, v6};

/// An echo server on `addr` that serves until the listener is dropped (the task is aborted
/// with the runtime).
async fn echo_server(addr: std::net::SocketAddr, config: Config) -> std::net::SocketAddr {
    let listener = step("bind", Listener::bind(addr, config)).await.unwrap();
    let local = listener.local_addr();
    tokio::spawn(async move {
        while let Ok(incoming) = listener.accept().await {
            tokio::spawn(async move {
                let mut conn = incoming.accept(b"echo").await?;
                while let Some(msg) = conn.recv().await? {
                    conn.send(msg).await?;
                }
                conn.close().await?;
                Ok::<_, Error>(())
            });
        }
    });
    local
}

fn msg(i: u32, len: usize) -> Bytes {
    let mut v = vec![(i % 251) as u8; len.max(4)];
    v[..4].copy_from_slice(&i.to_be_bytes());
    Bytes::from(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_in_order_both_ways() {
    require_device!();
    let addr = echo_server(v4(port(1)), Config::new()).await;
    let conn = step(
        "connect",
        Connection::builder().private_data(&b"hi"[..]).connect(addr),
    )
    .await
    .unwrap();
    assert!(conn.is_evchan_peer());
    assert_eq!(conn.peer_private_data(), b"echo");
    assert_eq!(conn.peer_addr(), Some(addr));
    let (tx, mut rx) = conn.split();
    let sender = tokio::spawn(async move {
        for i in 0..300u32 {
            tx.send(msg(i, 1 + (i as usize * 13) % 4000)).await.unwrap();
        }
        tx
    });
    for i in 0..300u32 {
        let m = step("echo", rx.recv()).await.unwrap().expect("a message");
        assert_eq!(m, msg(i, 1 + (i as usize * 13) % 4000), "message {i}");
    }
    let tx = sender.await.unwrap();
    drop(tx); // FIN: the server's loop ends, it closes, we read None
    assert_eq!(step("end", rx.recv()).await.unwrap(), None);
}

/// Connections one after another to a server on two shards: requests are migrated to the
/// other shard every other time, and each connection works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_migrated_between_shards() {
    require_device!();
    let addr = echo_server(v4(port(13)), Config::new().shards(2)).await;
    for c in 0..12u32 {
        let mut conn = step(
            "connect",
            Connection::builder()
                .config(Config::new().shards(2))
                .connect(addr),
        )
        .await
        .unwrap();
        for i in 0..3 {
            conn.send(msg(c * 10 + i, 32)).await.unwrap();
            let m = step("echo", conn.recv()).await.unwrap().unwrap();
            assert_eq!(m, msg(c * 10 + i, 32), "connection {c} message {i}");
        }
        if c % 2 == 0 {
            step("close", conn.close()).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_link_local() {
    require_device!();
    let addr = echo_server(v6(port(2)), Config::new()).await;
    let mut conn = step("connect", Connection::connect(addr)).await.unwrap();
    conn.send("over IPv6").await.unwrap();
    assert_eq!(
        step("echo", conn.recv()).await.unwrap().as_deref(),
        Some(&b"over IPv6"[..])
    );
    step("close", conn.close()).await.unwrap();
}

/// Many connects at once on one shard: their events queue up on one channel (many per
/// wake-up), and each connect gets its own ESTABLISHED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connects_are_routed_by_id() {
    require_device!();
    let config = Config::new()
        .shards(1)
        .recv_depth(4)
        .send_depth(4)
        .max_message(256);
    let addr = echo_server(v4(port(3)), config.clone()).await;
    let mut tasks = Vec::new();
    for c in 0..48u32 {
        let config = config.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = Connection::builder()
                .config(config)
                .private_data(c.to_be_bytes().to_vec())
                .connect(addr)
                .await
                .unwrap();
            for i in 0..10u32 {
                conn.send(msg(c * 1000 + i, 16)).await.unwrap();
                let m = conn.recv().await.unwrap().unwrap();
                assert_eq!(m, msg(c * 1000 + i, 16));
            }
            conn.close().await.unwrap();
        }));
    }
    for t in tasks {
        step("48 connections", t).await.unwrap();
    }
}

/// The reader stops: the sender waits on credits — no error, no RNR — and when the reader
/// resumes everything arrives in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_makes_the_sender_wait() {
    require_device!();
    let config = Config::new().recv_depth(4).send_depth(4).max_message(1024);
    let listener = Listener::bind(v4(port(4)), config.clone()).await.unwrap();
    let addr = listener.local_addr();
    let rnr_before = (
        support::rxe_counter("rcvd_rnr_err"),
        support::rxe_counter("send_rnr_err"),
    );
    let client = tokio::spawn(async move {
        let conn = Connection::builder()
            .config(config)
            .connect(addr)
            .await
            .unwrap();
        let (tx, _rx) = conn.split();
        for i in 0..200u32 {
            tx.send(msg(i, 512)).await.unwrap();
        }
        drop(tx);
        _rx
    });
    let mut server = step("accept", async {
        listener.accept().await.unwrap().accept(b"").await.unwrap()
    })
    .await;
    // Nobody reads for a while: the client can have at most 4 in the peer's slots plus 4
    // queued, so it must still be sending.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!client.is_finished(), "the sender did not wait for credits");
    let mut held = Vec::new();
    for i in 0..200u32 {
        let m = step("read", server.recv()).await.unwrap().expect("message");
        assert_eq!(m, msg(i, 512), "message {i}");
        held.push(m);
        if held.len() == 4 {
            held.clear(); // consume in batches: credits follow consumption
        }
    }
    assert_eq!(step("FIN", server.recv()).await.unwrap(), None);
    let _rx = step("client", client).await.unwrap();
    let rnr_after = (
        support::rxe_counter("rcvd_rnr_err"),
        support::rxe_counter("send_rnr_err"),
    );
    eprintln!("rxe RNR counters before {rnr_before:?} after {rnr_after:?}");
    assert_eq!(rnr_before, rnr_after, "a receiver-not-ready happened");
}

/// `send`, `recv` and `accept` wrapped in short timeouts in a loop: nothing lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_futures_lose_nothing() {
    require_device!();
    let config = Config::new().recv_depth(2).send_depth(2).max_message(64);
    let listener = Listener::bind(v4(port(5)), config.clone()).await.unwrap();
    let addr = listener.local_addr();
    let connect = tokio::spawn(Connection::builder().config(config).connect(addr));
    let incoming = loop {
        match tokio::time::timeout(Duration::from_micros(200), listener.accept()).await {
            Ok(r) => break r.unwrap(),
            Err(_) => continue,
        }
    };
    let mut server = step("accept", incoming.accept(b"")).await.unwrap();
    let client = step("connect", connect).await.unwrap().unwrap();
    let n = 300u32;
    let sender = tokio::spawn(async move {
        let mut i = 0;
        while i < n {
            match tokio::time::timeout(Duration::from_micros(50), client.send(msg(i, 8))).await {
                Ok(r) => {
                    r.unwrap();
                    i += 1;
                }
                Err(_) => continue, // cancelled before queued: send it again
            }
        }
        client
    });
    let mut got = 0u32;
    while got < n {
        match tokio::time::timeout(Duration::from_micros(50), server.recv()).await {
            Ok(r) => {
                assert_eq!(r.unwrap().unwrap(), msg(got, 8), "message {got}");
                got += 1;
            }
            Err(_) => continue,
        }
    }
    let client = step("sender", sender).await.unwrap();
    client.close().await.unwrap();
    assert_eq!(step("end", server.recv()).await.unwrap(), None);
}

/// `close()` with messages still queued: the peer gets every one, then `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_delivers_everything_first() {
    require_device!();
    let config = Config::new().recv_depth(8).send_depth(64).max_message(128);
    let listener = Listener::bind(v4(port(6)), config.clone()).await.unwrap();
    let addr = listener.local_addr();
    let client = tokio::spawn(async move {
        let conn = Connection::builder()
            .config(config)
            .connect(addr)
            .await
            .unwrap();
        for i in 0..64u32 {
            conn.send(msg(i, 100)).await.unwrap();
        }
        // 64 queued, 8 credits: most are still queued here; all delivered when it returns.
        conn.close().await.unwrap();
    });
    let mut server = step("accept", async {
        listener.accept().await.unwrap().accept(b"").await.unwrap()
    })
    .await;
    for i in 0..64u32 {
        assert_eq!(
            step("read", server.recv()).await.unwrap().unwrap(),
            msg(i, 100)
        );
    }
    assert_eq!(step("end", server.recv()).await.unwrap(), None);
    step("client", client).await.unwrap();
    // The peer is gone: once its disconnect is seen, sending fails with a typed error (sends
    // before that are queued, as after a TCP peer's FIN), never hangs.
    let e = step("send after close", async {
        loop {
            if let Err(e) = server.send("late").await {
                break e;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        matches!(e, Error::PeerClosed | Error::ConnectionLost(_)),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_with_reason_and_private_data() {
    require_device!();
    let listener = Listener::bind(v4(port(7)), Config::new()).await.unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(async move {
        let incoming = listener.accept().await.unwrap();
        assert_eq!(incoming.private_data(), b"let me in");
        incoming.reject(b"go away").unwrap();
        let incoming = listener.accept().await.unwrap();
        drop(incoming); // dropping rejects too
        listener
    });
    let e = step(
        "connect",
        Connection::builder()
            .private_data(&b"let me in"[..])
            .connect(addr),
    )
    .await
    .unwrap_err();
    match e {
        Error::Rejected {
            reason,
            private_data,
            busy,
        } => {
            assert_eq!(reason.0, 28);
            assert_eq!(private_data, b"go away");
            assert_eq!(busy, None, "an application's reject is not a busy server");
        }
        e => panic!("expected a reject, got {e}"),
    }
    let e = step("connect", Connection::connect(addr))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Rejected { .. }), "{e}");
    drop(step("server", server).await.unwrap());
    // Nobody listens on this port: reason 8.
    let e = step("connect", Connection::connect(v4(port(8))))
        .await
        .unwrap_err();
    match e {
        Error::Rejected { reason, .. } => assert_eq!(reason.0, 8),
        e => panic!("expected reject reason 8, got {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_typed_errors() {
    require_device!();
    let addr = echo_server(v4(port(9)), Config::new().max_message(100)).await;
    let e = Connection::builder()
        .private_data(vec![1u8; evchan::MAX_CONNECT_PRIVATE_DATA + 1])
        .connect(addr)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::PrivateDataTooLong { len: 41, max: 40 }),
        "{e}"
    );
    let mut conn = step("connect", Connection::connect(addr)).await.unwrap();
    assert_eq!(conn.max_message_size(), 100, "the peer's maximum applies");
    let e = conn.send(vec![0u8; 101]).await.unwrap_err();
    assert!(
        matches!(e, Error::MessageTooLarge { len: 101, max: 100 }),
        "{e}"
    );
    conn.send(vec![7u8; 100]).await.unwrap();
    assert_eq!(step("echo", conn.recv()).await.unwrap().unwrap().len(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framed_protocol_over_the_stream_view() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_util::codec::{Framed, LengthDelimitedCodec};

    require_device!();
    let config = Config::new().max_message(512).recv_depth(4);
    let listener = Listener::bind(v4(port(10)), config.clone()).await.unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(async move {
        let conn = listener.accept().await.unwrap().accept(b"").await.unwrap();
        let mut framed = Framed::new(evchan::Stream::new(conn), LengthDelimitedCodec::new());
        while let Some(frame) = framed.next().await {
            let mut frame = frame.unwrap();
            frame.reverse();
            framed.send(frame.freeze()).await.unwrap();
        }
    });
    let conn = Connection::builder()
        .config(config)
        .connect(addr)
        .await
        .unwrap();
    let mut framed = Framed::new(evchan::Stream::new(conn), LengthDelimitedCodec::new());
    for len in [1usize, 100, 511, 512, 513, 5000] {
        let frame: Vec<u8> = (0..len).map(|i| (i % 256) as u8).collect();
        framed.send(Bytes::from(frame.clone())).await.unwrap();
        let back = step("frame", framed.next()).await.unwrap().unwrap();
        let mut want = frame;
        want.reverse();
        assert_eq!(&back[..], &want[..], "frame of {len} bytes");
    }
    SinkExt::<Bytes>::close(&mut framed).await.unwrap();
    step("server", server).await.unwrap();
}

/// A peer that sends a malformed handshake is rejected; the server keeps serving others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_handshake_is_rejected_and_others_are_served() {
    require_device!();
    let addr = echo_server(v4(port(11)), Config::new()).await;
    let status = tokio::task::spawn_blocking(move || raw_connect(addr, b"EVCH\x07garbage"))
        .await
        .unwrap();
    assert_eq!(
        status,
        evchan_core::cm::EventKind::Rejected,
        "bad handshake"
    );
    let mut conn = step("connect", Connection::connect(addr)).await.unwrap();
    conn.send("still here").await.unwrap();
    assert_eq!(
        step("echo", conn.recv()).await.unwrap().as_deref(),
        Some(&b"still here"[..])
    );
}

/// A core-level client that connects with `private_data` and returns the final event kind.
fn raw_connect(addr: std::net::SocketAddr, private_data: &[u8]) -> evchan_core::cm::EventKind {
    use evchan_core::cm::{ConnParam, PortSpace};
    use evchan_core::verbs::{CompChannel, Cq, Pd, QpInit};
    use evchan_core::{CmId, EventChannel};
    let t = Duration::from_secs(5);
    let channel = EventChannel::new().unwrap();
    let next = || {
        channel
            .get_event_timeout(support::STEP)
            .unwrap()
            .expect("an event")
    };
    let id = CmId::new(&channel, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, addr, t)
        .unwrap();
    let id = id.addr_resolved(&next()).unwrap();
    let ctx = id.context().unwrap();
    let (pd, comp) = (Pd::new(&ctx).unwrap(), CompChannel::new(&ctx).unwrap());
    let cq = Cq::new(&comp, 16).unwrap();
    let id = id.resolve_route(t).unwrap();
    let mut id = id.route_resolved(&next()).unwrap();
    id.create_qp_with(&pd, &cq, &cq, &QpInit::new()).unwrap();
    let id = id
        .connect(&ConnParam::new().private_data(private_data))
        .unwrap();
    let ev = next();
    let kind = ev.kind();
    drop(ev);
    drop(id);
    kind
}

/// Ends with a check that a connection's drop and an abandoned connect leave nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_mid_flight_hangs_nothing() {
    require_device!();
    let addr = echo_server(v4(port(12)), Config::new().recv_depth(2)).await;
    for _ in 0..5 {
        let conn = step("connect", Connection::connect(addr)).await.unwrap();
        let (tx, rx) = conn.split();
        for i in 0..8u32 {
            let _ = tokio::time::timeout(Duration::from_millis(5), tx.send(msg(i, 64))).await;
        }
        drop(rx);
        drop(tx);
        // An abandoned connect.
        let _ = tokio::time::timeout(Duration::from_micros(100), Connection::connect(addr)).await;
    }
    let mut conn = step("connect", Connection::connect(addr)).await.unwrap();
    conn.send("after the drops").await.unwrap();
    assert!(step("echo", conn.recv()).await.unwrap().is_some());
    let _ = Lost::Closed;
}

/// `Incoming::accept` and `Connection::close` cancelled: the accepted connection is closed in
/// the background (the peer reads the end), the close finishes in the background; nothing
/// hangs, and the listener goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_accept_and_close_finish_in_the_background() {
    require_device!();
    let listener = Listener::bind(v4(port(14)), Config::new()).await.unwrap();
    let addr = listener.local_addr();
    let client = tokio::spawn(Connection::connect(addr));
    let incoming = step("accept", listener.accept()).await.unwrap();
    // Cancelled at once: the request is accepted anyway, then closed when established.
    let cancelled = poll_once(incoming.accept(b"")).await;
    assert!(cancelled.is_none(), "the accept finished in its first poll");
    let mut conn = step("connect", client).await.unwrap().unwrap();
    let end = step("the end of a cancelled accept", conn.recv()).await;
    assert!(
        matches!(end, Ok(None) | Err(Error::ConnectionLost(_))),
        "{end:?}"
    );

    // A close can finish in its first poll (rxe may complete the FIN inside the post, and the
    // shard release the connection before the future looks at its answer): then it must have
    // succeeded, and the next connection tries again, until one is cancelled mid-way.
    for attempt in 1.. {
        let client = tokio::spawn(Connection::connect(addr));
        let mut server = step("accept", async {
            listener.accept().await.unwrap().accept(b"").await.unwrap()
        })
        .await;
        let conn = step("connect", client).await.unwrap().unwrap();
        conn.send("last words").await.unwrap();
        let closing = poll_once(conn.close()).await;
        assert_eq!(
            step("read", server.recv()).await.unwrap().as_deref(),
            Some(&b"last words"[..])
        );
        assert_eq!(step("end", server.recv()).await.unwrap(), None);
        match closing {
            None => break,
            Some(done) => {
                done.unwrap();
                assert!(attempt < 5, "five closes finished in their first poll");
            }
        }
    }
}

/// Polls `fut` once and drops it: a cancellation right after the first poll, whatever the
/// host's load (a short `timeout` lets a delayed timer see the future finish instead).
async fn poll_once<F: std::future::Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        std::task::Poll::Ready(out) => std::task::Poll::Ready(Some(out)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

/// The busy-poll window changes how the shards wait, not what arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_poll_echo() {
    require_device!();
    let config = Config::new().busy_poll(Some(Duration::from_micros(200)));
    let addr = echo_server(v4(port(15)), config.clone()).await;
    let mut conn = step(
        "connect",
        Connection::builder().config(config).connect(addr),
    )
    .await
    .unwrap();
    for i in 0..200u32 {
        conn.send(msg(i, 64)).await.unwrap();
        assert_eq!(
            step("echo", conn.recv()).await.unwrap().unwrap(),
            msg(i, 64)
        );
    }
    step("close", conn.close()).await.unwrap();
}

/// A `Listener::bind` future dropped before it completes leaves no listening id behind: the
/// same address binds again (repeatedly, so that some drops land after the bind happened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_bind_leaves_the_address_free() {
    require_device!();
    let addr = v4(port(16));
    let keep = Listener::bind(v4(port(17)), Config::new()).await.unwrap(); // the runtime stays
    for _ in 0..20 {
        let _ = tokio::time::timeout(
            Duration::from_micros(300),
            Listener::bind(addr, Config::new()),
        )
        .await;
    }
    // Retried for a while: a dropped bind's listener goes when its shard sees the drop; one
    // that stayed would keep the address busy past the step's bound.
    let again = step("bind again", async {
        loop {
            match Listener::bind(addr, Config::new()).await {
                Ok(l) => break l,
                Err(e) => {
                    eprintln!("bind: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
    .await;
    assert_eq!(again.local_addr(), addr);
    drop(keep);
}
