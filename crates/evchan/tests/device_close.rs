//! `Connection::close`'s result, and a `send` waiting for credits when the peer closes,
//! against the kernel's rdma_cm and rxe (in the soft-RoCE VM).
//!
//! The setup of each case: the server offers `SLOTS` receive slots (the client's data
//! credits); the client sends `SLOTS` messages, which the server receives and keeps (credits
//! follow consumption: a kept message returns no credit) or, in the last case, leaves unread
//! in its receive half; then a task of the client sends `MORE` more, one at a time, and its
//! first `send` waits for a credit. What the server does then decides what the waiting `send`
//! and the two closes return.
//!
//! Run with `--test-threads 1`: the cases count the QPs left on the device.
#![forbid(unsafe_code)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use evchan::{Config, Connection, Error, Listener, Lost};
use support::{port, step, v4};
use tokio::task::JoinHandle;

/// The server's receive slots: the client's data credits.
const SLOTS: u32 = 2;
/// Messages the client sends beyond its credits.
const MORE: u32 = 32;

fn msg(i: u32) -> Bytes {
    let mut v = vec![(i % 251) as u8; 64];
    v[..4].copy_from_slice(&i.to_be_bytes());
    Bytes::from(v)
}

/// A connection whose client has a `send` waiting for a credit: the server holds the first
/// `SLOTS` messages (or left them unread).
struct Waiting {
    /// Kept so that the runtime's listener outlives the case.
    _listener: Listener,
    server: Connection,
    /// The messages the server received and has not consumed (dropping them returns their
    /// credits).
    held: Vec<Bytes>,
    /// The client's sends of messages `SLOTS..SLOTS + MORE`, then its close: how many sends
    /// returned `Ok`, the first error, and the close's result.
    client: JoinHandle<(u32, Option<Error>, evchan::Result<()>)>,
}

async fn waiting_for_credits(port: u16, server_reads: bool) -> Waiting {
    let server_config = Config::new()
        .recv_depth(SLOTS)
        .send_depth(4)
        .max_message(256);
    let client_config = Config::new()
        .recv_depth(4)
        .send_depth(SLOTS + MORE)
        .max_message(256);
    let listener = step("bind", Listener::bind(v4(port), server_config))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let connect = tokio::spawn(Connection::builder().config(client_config).connect(addr));
    let mut server = step("accept", async {
        listener.accept().await.unwrap().accept(b"").await.unwrap()
    })
    .await;
    let client = step("connect", connect).await.unwrap().unwrap();
    for i in 0..SLOTS {
        step("send", client.send(msg(i))).await.unwrap();
    }
    let mut held = Vec::new();
    for i in (0..SLOTS).filter(|_| server_reads) {
        let m = step("read", server.recv())
            .await
            .unwrap()
            .expect("a message");
        assert_eq!(m, msg(i), "message {i}");
        held.push(m);
    }
    // Every credit is used and none comes back while `held` lives: the next send waits.
    let client = tokio::spawn(async move {
        let mut sent = 0;
        let mut failed = None;
        for i in SLOTS..SLOTS + MORE {
            match step("send", client.send(msg(i))).await {
                Ok(()) => sent += 1,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        (sent, failed, step("client close", client.close()).await)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !client.is_finished(),
        "a send without a credit returned: {:?}",
        client.await
    );
    Waiting {
        _listener: listener,
        server,
        held,
        client,
    }
}

/// Waits (at most 20 s) until the device lists `n` user-space QPs, off the runtime's threads.
async fn qps_settle_to(n: usize, what: &'static str) {
    tokio::task::spawn_blocking(move || support::qps_settle_to(n, what))
        .await
        .unwrap();
}

/// The peer closes (its own close done, it disconnects) while a `send` of this side waits
/// for a credit: that `send` returns `PeerClosed` (nothing more can go), having posted
/// nothing, and this side's close then returns `Ok(())`: every message `send` returned `Ok`
/// for was delivered. The peer, which sent nothing, gets `Ok(())` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_send_fails_when_the_peer_closes_first() {
    require_device!();
    let Waiting {
        _listener,
        server,
        held,
        client,
    } = waiting_for_credits(port(1), true).await;
    // The server closes without consuming what it holds: no credit ever goes back.
    let server_result = step("server close", server.close()).await;
    let (sent, failed, client_result) = step("client", client).await.unwrap();
    drop(held);
    assert!(matches!(server_result, Ok(())), "server: {server_result:?}");
    assert_eq!(sent, 0, "no credit came back");
    assert!(matches!(failed, Some(Error::PeerClosed)), "{failed:?}");
    assert!(matches!(client_result, Ok(())), "client: {client_result:?}");
    qps_settle_to(0, "both sides closed").await;
}

/// The same connection, but the server consumes everything (the held messages, then every
/// later one, in order, then the end) before it closes: every `send` and both closes return
/// `Ok(())`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_is_ok_when_the_peer_reads_everything_first() {
    require_device!();
    let Waiting {
        _listener,
        mut server,
        held,
        client,
    } = waiting_for_credits(port(2), true).await;
    drop(held); // consumed: the credits go back, the waiting send goes
    for i in SLOTS..SLOTS + MORE {
        let m = step("read", server.recv())
            .await
            .unwrap()
            .expect("a message");
        assert_eq!(m, msg(i), "message {i}");
    }
    assert_eq!(step("end", server.recv()).await.unwrap(), None);
    let (sent, failed, client_result) = step("client", client).await.unwrap();
    assert_eq!((sent, failed.is_none()), (MORE, true), "{failed:?}");
    assert!(matches!(client_result, Ok(())), "client: {client_result:?}");
    let server_result = step("server close", server.close()).await;
    assert!(matches!(server_result, Ok(())), "server: {server_result:?}");
    qps_settle_to(0, "both sides closed").await;
}

/// The peer never reads: its `SLOTS` messages are still in its receive half when it closes.
/// Closing drops them, which returns their credits while its close is under way: the
/// waiting `send` may post a few more (what arrives after the peer's close is dropped and
/// credited at once, until it disconnects), then fails with `PeerClosed` or, when the
/// disconnect comes before the peer's `FIN` is read, `ConnectionLost(Disconnected)`. Every
/// message posted before was received by the peer's evchan: this side's close returns
/// `Ok(())`, or `ConnectionLost(Disconnected)` when a send was still in flight at the
/// disconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_send_fails_when_the_peer_closes_unread() {
    require_device!();
    let Waiting {
        _listener,
        server,
        held,
        client,
    } = waiting_for_credits(port(3), false).await;
    assert!(held.is_empty());
    let server_result = step("server close", server.close()).await;
    let (sent, failed, client_result) = step("client", client).await.unwrap();
    assert!(matches!(server_result, Ok(())), "server: {server_result:?}");
    assert!(sent < MORE, "{sent} sent after the peer's close");
    assert!(
        matches!(
            failed,
            Some(Error::PeerClosed | Error::ConnectionLost(Lost::Disconnected))
        ),
        "{failed:?}"
    );
    assert!(
        matches!(
            client_result,
            Ok(()) | Err(Error::ConnectionLost(Lost::Disconnected))
        ),
        "client: {client_result:?}"
    );
    qps_settle_to(0, "both sides closed").await;
}
