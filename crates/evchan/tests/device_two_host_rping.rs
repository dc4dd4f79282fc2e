//! rping's one-sided protocol across two VMs (`examples/rping.rs`, both sides), against the C
//! `rping` of rdmacm-utils: the C server in VM a serving our client in VM b, then our server
//! in VM a serving the C client in VM b with `-V` (which checks every ping's data). Each pair
//! (`NAME_server` in VM a, `NAME_client` in VM b) runs under `cargo xtask test --two-hosts`;
//! see `device_two_host.rs` for how to run one by hand.
#![forbid(unsafe_code)]

/// The workspace's rping example, both sides.
#[allow(dead_code)]
#[path = "../../../examples/rping.rs"]
mod rping;
mod support;
#[path = "support/two_host.rs"]
mod two_host;

use std::time::Duration;

use evchan::{Connection, Listener};
use support::step;
use support::tool::Tool;
use two_host::{env_addr, role_is};

/// The ports of the two pairs (fixed: the client must know them).
const C_SERVER_PORT: u16 = 7481;
const OUR_SERVER_PORT: u16 = 7482;
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
