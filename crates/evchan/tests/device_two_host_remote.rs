//! One-sided access across two VMs, where a request takes a real wire's time:
//!
//! - rping's protocol (`examples/rping.rs`, both sides) against the C `rping` of rdmacm-utils:
//!   the C server in VM a serving our client in VM b, then our server in VM a serving the C
//!   client in VM b with `-V` (which checks every ping's data);
//! - operations dropped in flight: VM b's READs and WRITEs dropped (or forgotten) right after
//!   their first poll, while the request is on the wire, lose no slot, and each dropped
//!   one-byte WRITE landed or not in VM a's exposed memory (every completed one did);
//! - a connection torn down under operations in flight: VM a revokes its memory and drops
//!   the connection while VM b's tasks keep 64 KiB READs and WRITEs (from slots and from
//!   registered buffers) in flight; the bytes given back do not change after the revocation
//!   returned, every operation ends, done or with the connection's loss, none hangs, and both
//!   runtimes serve a new connection after.
//!
//! Each pair (`NAME_server` in VM a, `NAME_client` in VM b) runs under
//! `cargo xtask test --two-hosts`; see `device_two_host.rs` for how to run one by hand.
#![forbid(unsafe_code)]

/// The workspace's rping example, both sides.
#[allow(dead_code)]
#[path = "../../../examples/rping.rs"]
mod rping;
mod support;
#[path = "support/two_host.rs"]
mod two_host;

use std::net::SocketAddr;
use std::time::Duration;

use evchan::remote::{Exposed, RemoteBuf, RemoteReadWrite};
use evchan::{Config, Connection, Error, Listener};
use support::step;
use support::tool::Tool;
use two_host::{env_addr, role_is};

/// The ports of the two pairs (fixed: the client must know them).
const C_SERVER_PORT: u16 = 7481;
const OUR_SERVER_PORT: u16 = 7482;
const DROPPED_PORT: u16 = 7483;
const TORN_DOWN_PORT: u16 = 7484;
/// The dropped READs' size: 64 packets on the wire.
const BIG: usize = 64 << 10;
/// Pings per pair, and their size.
const PINGS: u32 = 20;
const SIZE: usize = 1000;
/// The most a C half may take, the other VM's boot included.
const TOOL_DEADLINE: Duration = Duration::from_secs(180);

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("${var} is not set"))
}

#[tokio::test]
async fn c_rping_server_our_client_server() {
    require_device!();
    if !role_is("server") {
        return;
    }
    let tool = require_tool!("rping", "rdmacm-utils");
    let port = C_SERVER_PORT.to_string();
    let size = SIZE.to_string();
    let server = Tool::spawn(
        &tool,
        &["-s", "-S", &size, "-a", &env("EVCHAN_SELF"), "-p", &port],
    );
    let out = tokio::task::spawn_blocking(move || server.wait(TOOL_DEADLINE))
        .await
        .unwrap();
    assert!(out.status.success(), "rping -s failed: {out}");
}

#[tokio::test]
async fn c_rping_server_our_client_client() {
    require_device!();
    if !role_is("client") {
        return;
    }
    let addr = env_addr("EVCHAN_PEER", C_SERVER_PORT);
    let connect = Connection::builder().config(rping::config()).connect(addr);
    let mut conn = step("connect", connect).await.unwrap();
    assert!(!conn.is_evchan_peer());
    step("pings", rping::client(&mut conn, PINGS, SIZE, true))
        .await
        .unwrap_or_else(|e| panic!("pinging rping -s in VM a: {e}"));
    step("close", conn.close()).await.unwrap();
    eprintln!("c_rping_server_our_client_client: {PINGS} pings of {SIZE} bytes checked");
}

#[tokio::test]
async fn our_rping_server_c_client_server() {
    require_device!();
    if !role_is("server") {
        return;
    }
    let me = env_addr("EVCHAN_SELF", OUR_SERVER_PORT);
    let listener = step("bind", Listener::bind(me, rping::config()))
        .await
        .unwrap();
    let incoming = tokio::time::timeout(TOOL_DEADLINE, listener.accept())
        .await
        .expect("rping -c from VM b")
        .unwrap();
    let mut conn = step("accept", incoming.accept(&[])).await.unwrap();
    assert!(!conn.is_evchan_peer());
    let pings = step("serve", rping::serve(&mut conn))
        .await
        .unwrap_or_else(|e| panic!("serving rping -c: {e}"));
    assert_eq!(pings, PINGS);
    step("close", conn.close()).await.unwrap();
}

#[tokio::test]
async fn our_rping_server_c_client_client() {
    require_device!();
    if !role_is("client") {
        return;
    }
    let tool = require_tool!("rping", "rdmacm-utils");
    let (port, size, count) = (
        OUR_SERVER_PORT.to_string(),
        SIZE.to_string(),
        PINGS.to_string(),
    );
    let peer = env("EVCHAN_PEER");
    let client = Tool::spawn(
        &tool,
        &[
            "-c", "-V", "-C", &count, "-S", &size, "-a", &peer, "-p", &port,
        ],
    );
    let out = tokio::task::spawn_blocking(move || client.wait(TOOL_DEADLINE))
        .await
        .unwrap();
    assert!(out.status.success(), "rping -c -V failed: {out}");
    assert!(!out.stderr.contains("mismatch"), "{out}");
}

/// VM a's side of the one-sided pairs: a listener on `port`, the connection from VM b, and
/// `BIG` bytes exposed to it, whose descriptor it was sent.
async fn exposing_server(port: u16) -> (Listener, Connection, Exposed<RemoteReadWrite>) {
    let me = env_addr("EVCHAN_SELF", port);
    let listener = step("bind", Listener::bind(me, big_config()))
        .await
        .unwrap();
    let incoming = tokio::time::timeout(TOOL_DEADLINE, listener.accept())
        .await
        .expect("a connection from VM b")
        .unwrap();
    let conn = step("accept", incoming.accept(&[])).await.unwrap();
    let exposed = conn.expose::<RemoteReadWrite>(BIG).unwrap();
    step("send", conn.send(exposed.descriptor().to_bytes()))
        .await
        .unwrap();
    (listener, conn, exposed)
}

/// VM b's side: the peer's address on `port`, the connection to it, and the descriptor of the
/// memory it exposed.
async fn exposure_client(port: u16) -> (SocketAddr, Connection, RemoteBuf<RemoteReadWrite>) {
    let addr = env_addr("EVCHAN_PEER", port);
    let connect = Connection::builder().config(big_config()).connect(addr);
    let mut conn = step("connect", connect).await.unwrap();
    let msg = step("descriptor", conn.recv()).await.unwrap().unwrap();
    let there = RemoteBuf::<RemoteReadWrite>::from_bytes(&msg).unwrap();
    (addr, conn, there)
}

/// Messages of `BIG` bytes.
fn big_config() -> Config {
    Config::new().max_message(BIG as u32)
}

#[tokio::test]
async fn dropped_in_flight_server() {
    require_device!();
    if !role_is("server") {
        return;
    }
    let (_listener, mut conn, exposed) = exposing_server(DROPPED_PORT).await;
    // `done` and, for each of the first 100 WRITEs, 1 if its future was dropped before it
    // completed.
    let done = step("done", conn.recv()).await.unwrap().expect("done");
    assert_eq!(&done[..4], b"done");
    let dropped = &done[4..];
    assert_eq!(dropped.len(), 100);
    let bytes = exposed.revoke().unwrap();
    // A WRITE that completed landed; a dropped one landed whole (its one byte) or, dropped
    // before it was posted, not at all.
    let mut landed_after_drop = 0;
    for (i, b) in bytes[..100].iter().enumerate() {
        if dropped[i] == 0 {
            assert_eq!(
                usize::from(*b),
                i + 1,
                "write {i} completed, its byte is {b}"
            );
        } else {
            assert!(*b == 0 || usize::from(*b) == i + 1, "byte {i} is {b}");
            landed_after_drop += u32::from(*b != 0);
        }
    }
    eprintln!(
        "dropped_in_flight_server: {} writes dropped, {landed_after_drop} of them landed",
        dropped.iter().filter(|d| **d == 1).count()
    );
    // Dropped after its post, before its completion: the path under test was taken.
    assert!(landed_after_drop > 0, "no write was dropped in flight");
    assert_eq!(&bytes[1000..1100], &(0..100).collect::<Vec<u8>>()[..]);
    step("end", conn.recv()).await.unwrap();
    step("close", conn.close()).await.unwrap();
}

#[tokio::test]
async fn dropped_in_flight_client() {
    require_device!();
    if !role_is("client") {
        return;
    }
    let (_, conn, there) = exposure_client(DROPPED_PORT).await;
    let mut dropped = Vec::new();
    for i in 0..100u8 {
        // `timeout` polls once (the operation posts, a slot being free) and gives up at the
        // zero deadline: across the wire its completion has not come yet. Then the future is
        // dropped, or, every other time, forgotten (`mem::forget`: its drop never runs).
        let mut read = Box::pin(conn.read(&there, 0, BIG));
        let _ = tokio::time::timeout(Duration::ZERO, &mut read).await;
        let mut write = Box::pin(conn.write(&there, u64::from(i), [i + 1]));
        let polled = tokio::time::timeout(Duration::ZERO, &mut write).await;
        dropped.push(u8::from(polled.is_err()));
        // And a READ into a registered buffer, which stays with the connection until its
        // completion.
        let buf = conn.buffer(BIG / 2).unwrap();
        let mut into = Box::pin(conn.read_buffer(&there, 0, buf));
        let _ = tokio::time::timeout(Duration::ZERO, &mut into).await;
        if i % 2 == 1 {
            std::mem::forget(read);
            std::mem::forget(write);
            std::mem::forget(into);
        }
        // Their completions come meanwhile; the next operation's poll reaps them.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Every slot came back: 100 more writes (more than the connection's send slots) and a
    // read go through.
    for i in 0..100u8 {
        step("write", conn.write(&there, 1000 + u64::from(i), [i]))
            .await
            .unwrap();
    }
    let back = step("read", conn.read(&there, 1000, 100)).await.unwrap();
    assert_eq!(&back[..], &(0..100).collect::<Vec<u8>>()[..]);
    let done = [&b"done"[..], &dropped].concat();
    step("done", conn.send(done)).await.unwrap();
    step("close", conn.close()).await.unwrap();
}

#[tokio::test]
async fn torn_down_in_flight_server() {
    require_device!();
    if !role_is("server") {
        return;
    }
    let (listener, mut conn, exposed) = exposing_server(TORN_DOWN_PORT).await;
    let go = step("go", conn.recv()).await.unwrap().expect("go");
    assert_eq!(&go[..], b"go");
    // Let the peer's operations fill the wire, then take everything away under them: the
    // grant first (what is on the wire now meets an unknown rkey), then the connection.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let revoked = exposed.revoke().unwrap();
    // The revocation races 64 KiB WRITEs on the wire (64 packets each, some of nonzero
    // bytes): once it returned, no packet places data, so the bytes given back stay as they
    // are while the peer's requests still arrive and are refused.
    let snapshot = revoked.to_vec();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        revoked[..] == snapshot[..],
        "bytes changed after the revocation returned"
    );
    drop(conn);
    // The listener and its runtime carry on.
    let mut again = step("accept again", async {
        listener.accept().await?.accept(&[]).await
    })
    .await
    .unwrap();
    let msg = step("recv again", again.recv())
        .await
        .unwrap()
        .expect("again");
    assert_eq!(&msg[..], b"again");
    step("send ok", again.send("ok")).await.unwrap();
    step("end", again.recv()).await.unwrap();
    step("close", again.close()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_down_in_flight_client() {
    require_device!();
    if !role_is("client") {
        return;
    }
    let (addr, conn, there) = exposure_client(TORN_DOWN_PORT).await;
    // The buffers first: once the connection is lost, it registers none.
    let bufs: Vec<_> = (0..16).map(|_| conn.buffer(BIG).unwrap()).collect();
    step("go", conn.send("go")).await.unwrap();
    let conn = std::sync::Arc::new(conn);
    let mut tasks = tokio::task::JoinSet::new();
    for (t, buf) in bufs.into_iter().enumerate() {
        let conn = std::sync::Arc::clone(&conn);
        tasks.spawn(async move {
            // Operations until one fails: (completed, the error, whether a buffer came back).
            let mut buf = Some(buf);
            let mut done = 0u32;
            loop {
                let r = match (t % 4, buf.take()) {
                    (0, Some(b)) => conn.write_buffer(&there, 0, b).await.map(Some),
                    (1, Some(b)) => conn.read_buffer(&there, 0, b).await.map(Some),
                    (2, b) => {
                        buf = b;
                        conn.write(&there, 0, vec![t as u8; BIG])
                            .await
                            .map(|()| None)
                            .map_err(|e| evchan::BufferError {
                                error: e,
                                buffer: None,
                            })
                    }
                    (_, b) => {
                        buf = b;
                        conn.read(&there, 0, BIG).await.map(|_| None).map_err(|e| {
                            evchan::BufferError {
                                error: e,
                                buffer: None,
                            }
                        })
                    }
                };
                match r {
                    Ok(b) => {
                        done += 1;
                        if b.is_some() {
                            buf = b;
                        }
                    }
                    Err(e) => return (done, e.error, e.buffer.is_some()),
                }
            }
        });
    }
    let ended = step("every operation ends", async {
        let mut ended = Vec::new();
        while let Some(r) = tasks.join_next().await {
            ended.push(r.unwrap());
        }
        ended
    })
    .await;
    let mut returned = 0;
    for (done, error, back) in &ended {
        assert!(
            matches!(error, Error::ConnectionLost(_) | Error::PeerClosed),
            "after {done} operations: {error:?}"
        );
        returned += u32::from(*back);
    }
    let total: u32 = ended.iter().map(|e| e.0).sum();
    eprintln!(
        "torn_down_in_flight_client: {total} operations completed, then all 16 tasks ended \
         ({returned} with their buffer back): {:?}",
        ended.iter().map(|e| e.1.to_string()).collect::<Vec<_>>()
    );
    drop(conn);
    // This side's runtime carries on too.
    let connect = Connection::builder().config(big_config()).connect(addr);
    let mut again = step("connect again", connect).await.unwrap();
    step("again", again.send("again")).await.unwrap();
    let ok = step("ok", again.recv()).await.unwrap().expect("ok");
    assert_eq!(&ok[..], b"ok");
    step("close", again.close()).await.unwrap();
}
