//! One-sided access through [`Connection`] on rxe: WRITE, READ and atomics land where the
//! peer's descriptor says and nowhere else; bad ranges are refused before posting and leave
//! the connection working; a lying rkey loses the connection with the device's remote access
//! error; atomics from two connections count exactly; dropped futures lose no slot; a grant
//! per peer is revoked alone; registered buffers move bytes without a copy.

/// The workspace's example of one-sided access, run as a test.
#[allow(dead_code)]
#[path = "../../../examples/remote_write.rs"]
mod remote_write;
mod support;

use std::sync::Arc;
use std::time::Duration;

use evchan::remote::{
    RemoteAtomic, RemoteBuf, RemoteError, RemoteRead, RemoteReadWrite, RemoteWrite,
};
use evchan::{Config, Connection, Error, Listener, Lost};
use evchan_core::cm::{ConnParam, EventKind, PortSpace};
use evchan_core::verbs::WcStatus;
use evchan_core::{CmId, EventChannel};
use support::raw_cm::{event_for, routed, EVENT};
use support::{port, step, v4};

/// A listener on `port` and `n` clients connected to it, with the server ends.
async fn connected(port: u16, n: usize) -> (Vec<Connection>, Vec<Connection>) {
    connected_with(port, n, Config::new().max_message(1024)).await
}

async fn connected_with(port: u16, n: usize, config: Config) -> (Vec<Connection>, Vec<Connection>) {
    let addr = v4(port);
    let listener = Listener::bind(addr, config.clone()).await.unwrap();
    let server = tokio::spawn(async move {
        let mut ends = Vec::new();
        for _ in 0..n {
            ends.push(listener.accept().await?.accept(&[]).await?);
        }
        Ok::<_, Error>(ends)
    });
    let mut clients = Vec::new();
    for _ in 0..n {
        let c = Connection::builder().config(config.clone()).connect(addr);
        clients.push(step("connect", c).await.unwrap());
    }
    let servers = step("accepts", server).await.unwrap().unwrap();
    (clients, servers)
}

/// Sends the descriptor in a message and decodes it on the other end, as a peer would.
async fn hand_over<A: evchan::remote::Access>(
    from: &Connection,
    to: &mut Connection,
    d: RemoteBuf<A>,
) -> RemoteBuf<A> {
    step("send descriptor", from.send(d.to_bytes()))
        .await
        .unwrap();
    let msg = step("recv descriptor", to.recv()).await.unwrap().unwrap();
    RemoteBuf::from_bytes(&msg).unwrap()
}

#[tokio::test]
async fn write_read_and_atomics_land_where_the_descriptor_says() {
    require_device!();
    let (mut clients, servers) = connected(port(1), 1).await;
    let (mut client, server) = (clients.remove(0), servers.into_iter().next().unwrap());
    let rw = server.expose::<RemoteReadWrite>(8192).unwrap();
    let there = hand_over(&server, &mut client, rw.descriptor()).await;
    rw.write_at(4000, b"from the target").unwrap();

    step("write", client.write(&there, 100, b"hello, target"))
        .await
        .unwrap();
    let back = step("read", client.read(&there, 4000, 15)).await.unwrap();
    assert_eq!(&back[..], b"from the target");
    let back = step("read own write", client.read(&there, 98, 17))
        .await
        .unwrap();
    assert_eq!(&back[..], b"\0\0hello, target\0\0");
    // A write at the last byte, and a read of the whole message size.
    step("write at the end", client.write(&there, 8191, b"z"))
        .await
        .unwrap();
    let all = step("read 1 KiB", client.read(&there, 7168, 1024))
        .await
        .unwrap();
    assert_eq!(all.len(), 1024);
    assert_eq!(all[1023], b'z');
    assert!(all[..1023].iter().all(|b| *b == 0));

    let at = server.expose::<RemoteAtomic>(64).unwrap();
    at.atomic_u64(8)
        .unwrap()
        .store(40, std::sync::atomic::Ordering::Relaxed);
    let word = hand_over(&server, &mut client, at.descriptor()).await;
    assert_eq!(
        step("fetch_add", client.fetch_add(&word, 8, 2))
            .await
            .unwrap(),
        40
    );
    assert_eq!(
        step("cas miss", client.compare_swap(&word, 8, 41, 7))
            .await
            .unwrap(),
        42
    );
    assert_eq!(
        step("cas hit", client.compare_swap(&word, 8, 42, 7))
            .await
            .unwrap(),
        42
    );
    assert_eq!(
        at.atomic_u64(8)
            .unwrap()
            .load(std::sync::atomic::Ordering::Relaxed),
        7
    );
    assert_eq!(
        at.atomic_u64(0)
            .unwrap()
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );

    // Revoked, the bytes are plain: the client's write is there, and nothing else moved.
    let bytes = rw.revoke().unwrap();
    assert_eq!(&bytes[100..113], b"hello, target");
    assert_eq!(&bytes[4000..4015], b"from the target");
    assert_eq!(bytes[8191], b'z');
    let touched: usize = bytes.iter().filter(|b| **b != 0).count();
    assert_eq!(
        touched,
        13 + 15 + 1,
        "bytes outside the three writes changed"
    );
    drop(at);
    step("close", client.close()).await.unwrap();
    step("server close", server.close()).await.unwrap();
}

#[tokio::test]
async fn bad_ranges_are_refused_before_posting_and_the_connection_goes_on() {
    require_device!();
    let (mut clients, servers) = connected(port(2), 1).await;
    let (mut client, mut server) = (clients.remove(0), servers.into_iter().next().unwrap());
    let rw = server.expose::<RemoteReadWrite>(4096).unwrap();
    let there = hand_over(&server, &mut client, rw.descriptor()).await;
    let at = server.expose::<RemoteAtomic>(4096).unwrap();
    let word = hand_over(&server, &mut client, at.descriptor()).await;

    let remote = |r: Result<_, Error>| match r {
        Err(Error::Remote(e)) => e,
        other => panic!("not a range error: {other:?}"),
    };
    let oob = remote(client.write(&there, 4090, [1u8; 7]).await.map(|_| ()));
    assert!(matches!(oob, RemoteError::OutOfBounds { .. }), "{oob:?}");
    let oob = remote(client.read(&there, u64::MAX, 1).await.map(|_| ()));
    assert!(matches!(oob, RemoteError::OutOfBounds { .. }), "{oob:?}");
    assert_eq!(
        remote(client.read(&there, 0, 0).await.map(|_| ())),
        RemoteError::Empty
    );
    assert_eq!(
        remote(client.write(&there, 0, []).await),
        RemoteError::Empty
    );
    let mis = remote(client.fetch_add(&word, 4, 1).await.map(|_| ()));
    assert!(matches!(mis, RemoteError::Misaligned { .. }), "{mis:?}");
    let oob = remote(client.compare_swap(&word, 4096, 0, 1).await.map(|_| ()));
    assert!(matches!(oob, RemoteError::OutOfBounds { .. }), "{oob:?}");
    assert!(matches!(
        client.read(&there, 0, 1025).await,
        Err(Error::MessageTooLarge {
            len: 1025,
            max: 1024
        })
    ));

    // Nothing was posted: nothing moved, and the connection carries on both ways.
    step("write", client.write(&there, 0, b"ok")).await.unwrap();
    step("send", client.send("still here")).await.unwrap();
    let msg = step("recv", server.recv()).await.unwrap().unwrap();
    assert_eq!(&msg[..], b"still here");
    let bytes = rw.revoke().unwrap();
    assert_eq!(bytes.iter().filter(|b| **b != 0).count(), 2);
    drop(at);
    // After shutdown nothing more goes out, one-sided operations included.
    let (mut tx, rx) = client.split();
    tx.shutdown();
    assert!(matches!(
        tx.write(&there, 0, b"late").await,
        Err(Error::ConnectionLost(Lost::Closed))
    ));
    assert!(matches!(
        tx.fetch_add(&word, 0, 1).await,
        Err(Error::ConnectionLost(Lost::Closed))
    ));
    drop((tx, rx));
}

/// A plain peer whose request grants no responder resources: a READ or an atomic toward it
/// is refused with a typed error before posting (one it never answered would hold the send
/// queue for good).
#[tokio::test]
async fn reads_toward_a_peer_that_grants_none_are_refused() {
    require_device!();
    let addr = v4(port(6));
    let listener = Listener::bind(addr, Config::new()).await.unwrap();
    let (done, wait_done) = std::sync::mpsc::channel::<()>();
    let peer = tokio::task::spawn_blocking(move || {
        let ch = EventChannel::new().unwrap();
        let id = routed(&ch, addr);
        let param = ConnParam::new().responder_resources(0).initiator_depth(0);
        let id = id.connect(&param).map_err(|e| e.error).unwrap();
        let ev = event_for(&ch, &id);
        assert_eq!(ev.kind(), EventKind::ConnectResponse);
        let id = id.establish(&ev).map_err(|e| e.error).unwrap();
        ev.ack();
        // Connected until the server is done.
        let _ = wait_done.recv_timeout(EVENT);
        drop(id);
    });
    let incoming = step("request", listener.accept()).await.unwrap();
    let conn = step("accept", incoming.accept(&[])).await.unwrap();
    assert!(!conn.is_evchan_peer());
    assert_reads_refused(&conn).await;
    done.send(()).unwrap();
    step("peer", peer).await.unwrap();
    drop(conn);
}

#[tokio::test]
async fn a_lying_descriptor_loses_the_connection_with_a_remote_access_error() {
    require_device!();
    let (mut clients, servers) = connected(port(3), 1).await;
    let (mut client, server) = (clients.remove(0), servers.into_iter().next().unwrap());
    let rw = server.expose::<RemoteReadWrite>(4096).unwrap();
    let honest = hand_over(&server, &mut client, rw.descriptor()).await;
    // The same address and length with another key, as a hostile or confused peer may send.
    let mut wire = honest.to_bytes();
    wire[19] ^= 0x5a;
    let lie = RemoteBuf::<RemoteRead>::from_bytes(&wire).unwrap();
    let got = step("read with a bad key", client.read(&lie, 0, 64)).await;
    assert!(
        matches!(
            got,
            Err(Error::ConnectionLost(Lost::WorkCompletion(
                WcStatus::RemoteAccess
            )))
        ),
        "{got:?}"
    );
    // The connection is lost for what comes next too, with the same cause.
    let next = step("write after", client.write(&honest, 0, b"x")).await;
    assert!(matches!(next, Err(Error::ConnectionLost(_))), "{next:?}");
    // The target's bytes were not touched.
    let bytes = rw.revoke().unwrap();
    assert!(bytes.iter().all(|b| *b == 0));
    let _ = step("close", client.close()).await;
    drop(server);
}

/// Two connections (two peers of the target, in one process) run fetch-and-adds on one word
/// from several tasks each: the word ends at the exact count, and every value before was
/// returned once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomics_from_two_connections_count_exactly() {
    require_device!();
    const TASKS: u64 = 3;
    const ADDS: u64 = 40;
    let (clients, mut servers) = connected(port(4), 2).await;
    let at = servers[0].expose::<RemoteAtomic>(4096).unwrap();
    let d = at.descriptor();
    let mut clients: Vec<_> = clients.into_iter().map(Arc::new).collect();
    // The descriptor goes to each client through its own connection.
    for (s, c) in servers.iter_mut().zip(clients.iter_mut()) {
        step("send", s.send(d.to_bytes())).await.unwrap();
        let c = Arc::get_mut(c).unwrap();
        let m = step("recv", c.recv()).await.unwrap().unwrap();
        assert_eq!(RemoteBuf::<RemoteAtomic>::from_bytes(&m).unwrap(), d);
    }
    let mut tasks = Vec::new();
    for c in &clients {
        for _ in 0..TASKS {
            let c = Arc::clone(c);
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..ADDS {
                    seen.push(c.fetch_add(&d, 16, 1).await.unwrap());
                }
                seen
            }));
        }
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.extend(step("adds", t).await.unwrap());
    }
    seen.sort_unstable();
    let total = 2 * TASKS * ADDS;
    assert_eq!(seen, (0..total).collect::<Vec<_>>());
    assert_eq!(
        at.atomic_u64(16)
            .unwrap()
            .load(std::sync::atomic::Ordering::Relaxed),
        total
    );
    for c in clients {
        let c = Arc::try_unwrap(c).unwrap();
        step("close", c.close()).await.unwrap();
    }
}

/// Reads of 64 KiB and writes dropped right after their first poll, many more than the
/// connection has send slots: an operation dropped after its post keeps its slot until its
/// completion, and one dropped before posts nothing, so the reads, writes and sends after
/// still go through and the target's bytes are as the writes left them. (On rxe in one VM an
/// operation usually completes within its post, so the drop finds it done; the count of
/// those dropped in flight is printed.)
#[tokio::test]
async fn operations_dropped_at_their_first_poll_lose_nothing() {
    require_device!();
    const BIG: usize = 64 << 10;
    let config = Config::new().max_message(BIG as u32);
    let (mut clients, servers) = connected_with(port(5), 1, config).await;
    let (mut client, mut server) = (clients.remove(0), servers.into_iter().next().unwrap());
    let rw = server.expose::<RemoteReadWrite>(BIG).unwrap();
    let there = hand_over(&server, &mut client, rw.descriptor()).await;
    let mut dropped = 0;
    for i in 0..100u8 {
        // `timeout` polls the read once (it posts), then drops it at the zero deadline.
        if tokio::time::timeout(Duration::ZERO, client.read(&there, 0, BIG))
            .await
            .is_err()
        {
            dropped += 1;
        }
        let w = tokio::time::timeout(Duration::ZERO, client.write(&there, u64::from(i), [i + 1]));
        if w.await.is_err() {
            dropped += 1;
        }
    }
    for i in 0..100u8 {
        step("write", client.write(&there, 1000 + u64::from(i), [i]))
            .await
            .unwrap();
    }
    let back = step("read", client.read(&there, 1000, 100)).await.unwrap();
    assert_eq!(&back[..], &(0..100).collect::<Vec<u8>>()[..]);
    step("send", client.send("after")).await.unwrap();
    assert_eq!(
        &step("recv", server.recv()).await.unwrap().unwrap()[..],
        b"after"
    );
    // A dropped write landed whole or not at all (not posted: no slot was free at its one
    // poll), and every posted one completed before the close.
    step("close", client.close()).await.unwrap();
    let bytes = rw.revoke().unwrap();
    for (i, b) in bytes[..100].iter().enumerate() {
        assert!(*b == 0 || usize::from(*b) == i + 1, "byte {i} is {b}");
    }
    let landed = bytes[..100].iter().filter(|b| **b != 0).count();
    eprintln!("dropped in flight: {dropped} of 200; dropped writes that landed: {landed}");
}

/// The other side of [`reads_toward_a_peer_that_grants_none_are_refused`]: a plain listener
/// whose reply grants no responder resources; our connection to it refuses READ and atomics.
#[tokio::test]
async fn reads_toward_a_listener_that_grants_none_are_refused() {
    require_device!();
    let addr = v4(port(8));
    let (listening, is_listening) = tokio::sync::oneshot::channel::<()>();
    let (done, wait_done) = std::sync::mpsc::channel::<()>();
    let peer = tokio::task::spawn_blocking(move || {
        let ch = EventChannel::new().unwrap();
        let _listener = CmId::new(&ch, PortSpace::Tcp)
            .unwrap()
            .bind(addr)
            .unwrap()
            .listen(1)
            .unwrap();
        listening.send(()).unwrap();
        let mut ev = next_event(&ch, EventKind::ConnectRequest);
        let id = ev.take_request().expect("the request's id");
        ev.ack();
        let param = ConnParam::new().responder_resources(0).initiator_depth(0);
        let id = id.accept(&param).map_err(|e| e.error).unwrap();
        let ev = next_event(&ch, EventKind::Established);
        let id = id.established(&ev).map_err(|e| e.error).unwrap();
        ev.ack();
        let _ = wait_done.recv_timeout(EVENT);
        drop(id);
    });
    step("listening", is_listening).await.unwrap();
    let conn = step("connect", Connection::connect(addr)).await.unwrap();
    assert!(!conn.is_evchan_peer());
    assert_reads_refused(&conn).await;
    done.send(()).unwrap();
    step("peer", peer).await.unwrap();
    drop(conn);
}

/// READ, fetch-and-add and compare-and-swap on `conn` are refused before posting, with
/// [`Error::NoReadResources`] (the descriptor names nothing real: nothing may be posted).
async fn assert_reads_refused(conn: &Connection) {
    let d = RemoteBuf::<RemoteReadWrite>::from_parts(0x1000, 64, 1).unwrap();
    let a = RemoteBuf::<RemoteAtomic>::from_parts(0x1000, 64, 1).unwrap();
    let read = conn.read(&d, 0, 8).await;
    assert!(matches!(read, Err(Error::NoReadResources)), "{read:?}");
    let add = conn.fetch_add(&a, 0, 1).await;
    assert!(matches!(add, Err(Error::NoReadResources)), "{add:?}");
    let cas = conn.compare_swap(&a, 0, 0, 1).await;
    assert!(matches!(cas, Err(Error::NoReadResources)), "{cas:?}");
}

/// The next event of `kind` on `ch` (others are acked and dropped), within [`EVENT`].
fn next_event(ch: &EventChannel, kind: EventKind) -> evchan_core::CmEvent<'_> {
    let until = std::time::Instant::now() + EVENT;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        let ev = ch
            .get_event_timeout(left)
            .unwrap()
            .unwrap_or_else(|| panic!("no {kind:?} within {EVENT:?}"));
        if ev.kind() == kind {
            return ev;
        }
        ev.ack();
    }
}

/// `examples/remote_write.rs` runs: expose, hand over, write, add, revoke.
#[tokio::test]
async fn the_remote_write_example_runs() {
    require_device!();
    step("example", remote_write::run(v4(port(7))))
        .await
        .unwrap_or_else(|e| panic!("examples/remote_write.rs: {e}"));
}

/// Registered buffers: a WRITE and a READ larger than a message, a message sent from a
/// buffer in order with copied ones, refusals that give the buffer back, and operations
/// dropped at their first poll that lose no slot.
#[tokio::test]
async fn buffers_move_bytes_without_a_copy_and_come_back() {
    require_device!();
    const BIG: usize = 200_000;
    let (mut clients, servers) = connected(port(10), 1).await;
    let (mut client, mut server) = (clients.remove(0), servers.into_iter().next().unwrap());
    let rw = server.expose::<RemoteReadWrite>(256 << 10).unwrap();
    let there = hand_over(&server, &mut client, rw.descriptor()).await;

    // One WRITE of 200,000 bytes (the messages here are 1 KiB), and one READ of them back.
    let mut out = client.buffer(BIG).unwrap();
    for (i, b) in out.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let out = step("write_buffer", client.write_buffer(&there, 1000, out))
        .await
        .unwrap();
    assert_eq!((out.len(), out.capacity()), (BIG, BIG));
    let back = client.buffer(BIG).unwrap();
    let back = step("read_buffer", client.read_buffer(&there, 1000, back))
        .await
        .unwrap();
    assert!(back[..] == out[..], "the READ brought other bytes");

    // Refused before posting, each with its buffer back; the connection goes on.
    let e = client
        .write_buffer(&there, 256 << 10, back)
        .await
        .unwrap_err();
    assert!(
        matches!(e.error, Error::Remote(RemoteError::OutOfBounds { .. })),
        "{e:?}"
    );
    let mut big = e.buffer.expect("a refusal gives the buffer back");
    let e = client.send_buffer(big).await.unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::MessageTooLarge {
                len: BIG,
                max: 1024
            }
        ),
        "{e:?}"
    );
    big = e.buffer.unwrap();
    big.set_len(0).unwrap();
    let e = client.read_buffer(&there, 0, big).await.unwrap_err();
    assert!(
        matches!(e.error, Error::Remote(RemoteError::Empty)),
        "{e:?}"
    );
    assert!(e.buffer.unwrap().set_len(BIG + 1).is_err());

    // Messages from a buffer, in order with copied ones.
    let mut msg = client.buffer(1024).unwrap();
    for i in 0..20u8 {
        msg.set_len(usize::from(i) + 1).unwrap();
        msg.fill(i);
        msg = step("send_buffer", client.send_buffer(msg)).await.unwrap();
        step("send", client.send([i, i])).await.unwrap();
        let m = step("recv", server.recv()).await.unwrap().unwrap();
        assert_eq!(&m[..], &vec![i; usize::from(i) + 1][..]);
        let m = step("recv", server.recv()).await.unwrap().unwrap();
        assert_eq!(&m[..], &[i, i]);
    }

    // Dropped at their first poll (posted or not): every slot comes back.
    let mut dropped = 0;
    for i in 0..50u8 {
        let mut b = client.buffer(4096).unwrap();
        b.fill(i + 1);
        if tokio::time::timeout(Duration::ZERO, client.write_buffer(&there, 4096, b))
            .await
            .is_err()
        {
            dropped += 1;
        }
        let b = client.buffer(4096).unwrap();
        if tokio::time::timeout(Duration::ZERO, client.read_buffer(&there, 0, b))
            .await
            .is_err()
        {
            dropped += 1;
        }
    }
    for i in 0..40u8 {
        step("write", client.write(&there, u64::from(i), [i]))
            .await
            .unwrap();
    }
    let bytes = step("read", client.read(&there, 0, 40)).await.unwrap();
    assert_eq!(&bytes[..], &(0..40).collect::<Vec<u8>>()[..]);
    step("send", client.send("after")).await.unwrap();
    assert_eq!(
        &step("recv", server.recv()).await.unwrap().unwrap()[..],
        b"after"
    );
    step("close", client.close()).await.unwrap();
    let bytes = rw.revoke().unwrap();
    let w = &bytes[4096..8192];
    // The last WRITE posted landed whole (over the pattern of the first one).
    assert!(
        (1..=50).contains(&w[0]),
        "no WRITE dropped after its post landed"
    );
    assert!(
        w.iter().all(|b| *b == w[0]),
        "a dropped WRITE landed in part"
    );
    eprintln!("buffer operations dropped at their first poll: {dropped} of 100");
}

/// A grant per peer: the target gives each of two clients its own grant over the same bytes
/// and revokes one; that client's next write loses its connection with a remote access error,
/// the other client goes on writing, and the bytes hold both clients' writes from before.
#[tokio::test]
async fn a_grant_per_peer_is_revoked_alone() {
    require_device!();
    let (mut clients, mut servers) = connected(port(11), 2).await;
    let mut rw = servers[0].expose::<RemoteWrite>(4096).unwrap();
    let second = rw.grant().unwrap();
    let (a, b) = clients.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    let at_a = hand_over(&servers[0], a, rw.descriptor()).await;
    let at_b = hand_over(&servers[1], b, second).await;
    step("a writes", a.write(&at_a, 0, b"from a"))
        .await
        .unwrap();
    step("b writes", b.write(&at_b, 8, b"from b"))
        .await
        .unwrap();
    rw.revoke_grant(&second).unwrap();
    let got = step("b writes, revoked", b.write(&at_b, 16, b"stale!")).await;
    assert!(
        matches!(
            got,
            Err(Error::ConnectionLost(Lost::WorkCompletion(
                WcStatus::RemoteAccess
            )))
        ),
        "{got:?}"
    );
    step("a writes again", a.write(&at_a, 24, b"a again"))
        .await
        .unwrap();
    let bytes = rw.revoke().unwrap();
    assert_eq!(&bytes[..31], b"from a\0\0from b\0\0\0\0\0\0\0\0\0\0a again");
    for c in clients {
        let _ = step("close", c.close()).await;
    }
    servers.clear();
}
