//! Two hosts: an evchan server in VM a, an evchan client in VM b, over the virtual wire between
//! them (rxe0 on each VM's eth0, link-local addresses), messages both ways.
//!
//! Both tests run only when `EVCHAN_ROLE` names their role (`server` / `client`); otherwise
//! they print a skip line and return. Run them with:
//!
//! ```text
//! cargo test -p evchan --test device_two_host --no-run   # prints the binary's path
//! cargo xtask vm --hosts 2 --env EVCHAN_REQUIRE_DEVICE=1 \
//!     --server 'EVCHAN_ROLE=server target/debug/deps/device_two_host-HASH --exact two_host_server --nocapture' \
//!     -- env EVCHAN_ROLE=client target/debug/deps/device_two_host-HASH --exact two_host_client --nocapture
//! ```
//!
//! The server listens on `[$EVCHAN_SELF]:TWO_HOST_PORT` and serves `CLIENTS` connections; each
//! client connection sends `MSGS` messages that the server checks and echoes, then the server
//! sends `MSGS` of its own, then each side closes and the other reads `None`.
#![forbid(unsafe_code)]

mod support;
#[path = "support/two_host.rs"]
mod two_host;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use bytes::Bytes;
use evchan::{Config, Connection, Listener};
use support::step;
use two_host::{env_addr, role_is};

/// The server's port (fixed: the client must know it).
const TWO_HOST_PORT: u16 = 7479;
/// Connections the client opens at once.
const CLIENTS: u32 = 4;
/// Messages each way per connection.
const MSGS: u32 = 200;

fn msg(c: u32, i: u32, dir: u8) -> Bytes {
    let len = 9 + ((c * 31 + i * 17) % 2000) as usize;
    let mut v = vec![(i as u8).wrapping_mul(3) ^ dir; len];
    v[..4].copy_from_slice(&c.to_be_bytes());
    v[4..8].copy_from_slice(&i.to_be_bytes());
    v[8] = dir;
    Bytes::from(v)
}

fn config() -> Config {
    Config::new().recv_depth(8).send_depth(8)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_host_server() {
    require_device!();
    if !role_is("server") {
        return;
    }
    let me = env_addr("EVCHAN_SELF", TWO_HOST_PORT);
    let peer = env_addr("EVCHAN_PEER", 0);
    let listener = step("bind", Listener::bind(me, config())).await.unwrap();
    assert_eq!(listener.local_addr(), me);
    eprintln!("two_host_server: listening on {me}");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        // The client may need its boot and the runtime's start: a long first wait.
        let incoming = tokio::time::timeout(std::time::Duration::from_secs(120), listener.accept())
            .await
            .expect("a connection from VM b within 120 s")
            .unwrap();
        assert_eq!(
            incoming.peer_addr().map(|a| a.ip()),
            Some(peer.ip()),
            "a request from VM b"
        );
        let c = u32::from_be_bytes(incoming.private_data()[..4].try_into().unwrap());
        tasks.spawn(async move {
            let mut conn = step("accept", incoming.accept(b"from a")).await.unwrap();
            assert!(conn.is_evchan_peer());
            assert_eq!(conn.local_addr().map(|a| a.ip()), Some(me.ip()));
            for i in 0..MSGS {
                let m = step("recv", conn.recv()).await.unwrap().expect("a message");
                assert_eq!(m, msg(c, i, 0), "connection {c}, client message {i}");
                step("echo", conn.send(m)).await.unwrap();
            }
            for i in 0..MSGS {
                step("send", conn.send(msg(c, i, 1))).await.unwrap();
            }
            // The client closes after reading everything: our recv ends cleanly.
            assert_eq!(
                step("end", conn.recv()).await.unwrap(),
                None,
                "connection {c}"
            );
            step("close", conn.close()).await.unwrap();
            c
        });
    }
    let mut served = Vec::new();
    while let Some(r) = tasks.join_next().await {
        served.push(r.unwrap());
    }
    served.sort_unstable();
    assert_eq!(served, (0..CLIENTS).collect::<Vec<_>>());
    eprintln!("two_host_server: served {CLIENTS} connections x {MSGS} messages each way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_host_client() {
    require_device!();
    if !role_is("client") {
        return;
    }
    let server = env_addr("EVCHAN_PEER", TWO_HOST_PORT);
    let me = env_addr("EVCHAN_SELF", 0);
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        tasks.spawn(async move {
            let conn = step(
                "connect",
                Connection::builder()
                    .config(config())
                    .private_data(c.to_be_bytes().to_vec())
                    .connect(server),
            )
            .await
            .unwrap_or_else(|e| panic!("connection {c} to {server}: {e}"));
            assert!(conn.is_evchan_peer());
            assert_eq!(&conn.peer_private_data()[..6], b"from a");
            assert_eq!(
                conn.peer_addr().map(|a| a.ip()),
                Some(IpAddr::V6(*server_ip(&server)))
            );
            assert_eq!(conn.local_addr().map(|a| a.ip()), Some(me.ip()));
            let (tx, mut rx) = conn.split();
            let sender = tokio::spawn(async move {
                for i in 0..MSGS {
                    tx.send(msg(c, i, 0)).await.unwrap();
                }
                tx
            });
            for i in 0..MSGS {
                let m = step("echo", rx.recv()).await.unwrap().expect("an echo");
                assert_eq!(m, msg(c, i, 0), "connection {c}, echo {i}");
            }
            for i in 0..MSGS {
                let m = step("recv", rx.recv())
                    .await
                    .unwrap()
                    .expect("a server message");
                assert_eq!(m, msg(c, i, 1), "connection {c}, server message {i}");
            }
            let tx = step("sender", sender).await.unwrap();
            drop(tx); // FIN: the server's recv ends, it closes, ours ends
            assert_eq!(
                step("end", rx.recv()).await.unwrap(),
                None,
                "connection {c}"
            );
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    eprintln!("two_host_client: {CLIENTS} connections x {MSGS} messages each way, all in order");
}

fn server_ip(a: &SocketAddr) -> &Ipv6Addr {
    match a {
        SocketAddr::V6(a) => a.ip(),
        SocketAddr::V4(_) => unreachable!(),
    }
}
