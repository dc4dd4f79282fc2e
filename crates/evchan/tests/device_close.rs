//! `Connection::close`'s result against the kernel's rdma_cm and rxe (in the soft-RoCE VM):
//! `Err(ConnectionLost(Disconnected))` when the peer closes and disconnects while messages of
//! this side are still queued behind its credits, `Ok(())` when the peer reads them first.
//!
//! The setup of each case: the server offers `SLOTS` receive slots (the client's data
//! credits); the client sends `SLOTS` messages, which the server receives and keeps (credits
//! follow consumption: a kept message returns no credit) or, in the last case, leaves unread
//! in its receive half; then the client queues `QUEUED` more, which stay in its outbox, and
//! starts its close. The close waits for credits; what ends the wait decides the result.
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
/// Messages the client queues beyond its credits.
const QUEUED: u32 = 32;

fn msg(i: u32) -> Bytes {
    let mut v = vec![(i % 251) as u8; 64];
    v[..4].copy_from_slice(&i.to_be_bytes());
    Bytes::from(v)
}

/// A connection whose client side is closing with `QUEUED` messages queued for want of
/// credits: the server holds the first `SLOTS` messages.
struct Closing {
    /// Kept so that the runtime's listener outlives the case.
    _listener: Listener,
    server: Connection,
    /// The messages the server received and has not consumed (dropping them returns their
    /// credits).
    held: Vec<Bytes>,
    /// The client's `close()`.
    close: JoinHandle<evchan::Result<()>>,
}

async fn closing_with_queued(port: u16, server_reads: bool) -> Closing {
    let server_config = Config::new()
        .recv_depth(SLOTS)
        .send_depth(4)
        .max_message(256);
    // Every message of the client fits its send depth at once: `send` returns once queued.
    let client_config = Config::new()
        .recv_depth(4)
        .send_depth(SLOTS + QUEUED)
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
    // Every credit is used and none comes back while `held` lives: these stay queued.
    for i in SLOTS..SLOTS + QUEUED {
        step("queue", client.send(msg(i))).await.unwrap();
    }
    let close = tokio::spawn(client.close());
    // The close waits for credits; it must not return while its messages are queued.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !close.is_finished(),
        "close returned with {QUEUED} messages queued and no credit: {:?}",
        close.await
    );
    Closing {
        _listener: listener,
        server,
        held,
        close,
    }
}

/// Waits (at most 20 s) until the device lists `n` user-space QPs, off the runtime's threads.
async fn qps_settle_to(n: usize, what: &'static str) {
    tokio::task::spawn_blocking(move || support::qps_settle_to(n, what))
        .await
        .unwrap();
}

/// The two closes' results, then no QP left: the server's `Ok(())` (it sent nothing); the
/// client's `ConnectionLost(Disconnected)` when `queued_lost` (messages still queued when the
/// peer disconnected), `Ok(())` otherwise.
async fn expect_closes(server: evchan::Result<()>, client: evchan::Result<()>, queued_lost: bool) {
    assert!(
        matches!(server, Ok(())),
        "the server's close (it sent nothing): {server:?}"
    );
    if queued_lost {
        assert!(
            matches!(client, Err(Error::ConnectionLost(Lost::Disconnected))),
            "the client's close ({QUEUED} messages queued when the peer disconnected): \
             {client:?}"
        );
    } else {
        assert!(
            matches!(client, Ok(())),
            "the client's close (everything read): {client:?}"
        );
    }
    qps_settle_to(0, "both sides closed").await;
}

/// The peer closes (its own close done, it disconnects) while this side's close still has
/// messages queued: this side's close returns `ConnectionLost(Disconnected)` — the connection
/// itself was not lost, but what was queued never went out. The peer, which sent nothing and
/// closed first, gets `Ok(())`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_reports_disconnected_when_the_peer_closes_first() {
    require_device!();
    let Closing {
        _listener,
        server,
        held,
        close,
    } = closing_with_queued(port(1), true).await;
    // The server closes without consuming what it holds: no credit ever goes back.
    let server_result = step("server close", server.close()).await;
    let client_result = step("client close", close).await.unwrap();
    drop(held);
    expect_closes(server_result, client_result, true).await;
}

/// The companion: the same connection, but the server consumes everything (the held
/// messages, then every queued one, in order, then the end) before it closes: `Ok(())` on
/// both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_is_ok_when_the_peer_reads_everything_first() {
    require_device!();
    let Closing {
        _listener,
        mut server,
        held,
        close,
    } = closing_with_queued(port(2), true).await;
    drop(held); // consumed: the credits go back, the queued messages follow
    for i in SLOTS..SLOTS + QUEUED {
        let m = step("read", server.recv())
            .await
            .unwrap()
            .expect("a message");
        assert_eq!(m, msg(i), "message {i}");
    }
    assert_eq!(step("end", server.recv()).await.unwrap(), None);
    let client_result = step("client close", close).await.unwrap();
    let server_result = step("server close", server.close()).await;
    expect_closes(server_result, client_result, false).await;
}

/// The peer never reads: its `SLOTS` messages are still in its receive half when it closes.
/// Closing drops them, which returns their credits while the peer's close is under way (a
/// traced run: the peer's `FIN`, then a credit update of 2, then 2 more data messages from
/// this side, then the peer's disconnect); what arrives after its close is dropped and
/// credited at once, until it disconnects, which it does once its `FIN` is acknowledged.
/// Delivering all `QUEUED` would take 16 such rounds (`SLOTS` credits each) before that;
/// what is still queued at the disconnect makes this side's close
/// `ConnectionLost(Disconnected)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_reports_disconnected_when_the_peer_closes_unread() {
    require_device!();
    let Closing {
        _listener,
        server,
        held,
        close,
    } = closing_with_queued(port(3), false).await;
    assert!(held.is_empty());
    let server_result = step("server close", server.close()).await;
    let client_result = step("client close", close).await.unwrap();
    expect_closes(server_result, client_result, true).await;
}
