//! evchan against rdma-core's unmodified example programs, in the VM: our [`Listener`] serves
//! `rdma_client`, our [`Connection`] talks to `rdma_server` (rdmacm-utils), over IPv4
//! (169.254.77.1) and IPv6 link-local (`fe80::ff:fe00:1%dummy0`, which both tools take: they
//! resolve `-s` with `rdma_getaddrinfo`).
//!
//! Their protocol (librdmacm/examples/rdma_{client,server}.c): one RC connection made with no
//! private data; the client posts a 16-byte receive, connects, sends 16 bytes from a static
//! buffer (zeros), waits for the 16-byte reply, then disconnects; the server receives the 16
//! bytes, sends its own 16 (zeros), waits for the send's completion and disconnects. Both
//! print `<name>: end 0` and exit 0 on success. Neither speaks evchan's handshake, so our side
//! must see a plain librdmacm peer (`is_evchan_peer() == false`) and still exchange raw
//! messages with it; the tool's disconnect must end our receive side cleanly (`None`).
//!
//! And `rping` (rdmacm-utils), whose protocol is one-sided: its server RDMA READs the client's
//! start buffer and RDMA WRITEs it into the client's sink buffer, each advertised in a 16-byte
//! `struct rping_rdma_info` (`examples/rping.rs`, whose both sides these tests run): our
//! client against `rping -s`, and `rping -c -V` (which checks every ping's data) against our
//! server.
//!
//! Every tool runs under a deadline and is killed if it outlives the test.
#![forbid(unsafe_code)]

/// The workspace's rping example, both sides.
#[allow(dead_code)]
#[path = "../../../examples/rping.rs"]
mod rping;
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use evchan::{Config, Connection, Error, Listener};
use support::tool::{Output, Tool};
use support::{port, step, v4, v6, STEP};

/// The most a whole exchange with a tool may take.
const TOOL_DEADLINE: Duration = Duration::from_secs(90);
/// rdma_client's and rdma_server's message size.
const EXAMPLE_MSG: usize = 16;

/// The tool's `-s` argument for `addr`: `169.254.77.1` or `fe80::ff:fe00:1%dummy0`.
fn tool_addr(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => {
            assert_eq!(a.scope_id(), evchan_core::if_index("dummy0").unwrap());
            format!("{}%dummy0", a.ip())
        }
    }
}

fn assert_clean(out: &Output, name: &str) {
    assert!(out.status.success(), "{name} failed: {out}");
    for bad in ["error", "fail", "UNREACHABLE", "REJECTED"] {
        assert!(!out.stdout.contains(bad), "{name} reported `{bad}`: {out}");
    }
    assert!(
        out.stdout.contains(&format!("{name}: end 0")),
        "{name} did not end with 0: {out}"
    );
}

/// `attempt` (a connect to `server`, a tool) again every 50 ms while it is rejected with
/// reason 8: the tool does not listen yet (for at most [`STEP`], and only while it runs).
async fn while_not_listening<R, F: std::future::Future<Output = Result<R, Error>>>(
    server: &mut Tool,
    mut attempt: impl FnMut() -> F,
) -> Result<R, Error> {
    let start = Instant::now();
    loop {
        match step("connect", attempt()).await {
            Err(Error::Rejected { reason, .. }) if reason.0 == 8 => {
                server.assert_running();
                assert!(
                    start.elapsed() < STEP,
                    "the tool did not listen within {STEP:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            r => return r,
        }
    }
}

/// Our listener serves one unmodified `rdma_client`: accept, receive its 16 bytes, echo them,
/// then its disconnect ends our receive side with `None`; the client exits 0.
async fn rdma_client_against_our_listener(addr: SocketAddr) {
    let tool = require_tool!("rdma_client", "rdmacm-utils");
    let listener = step("bind", Listener::bind(addr, Config::new()))
        .await
        .unwrap();
    let bound = listener.local_addr();
    assert_eq!(bound, addr);
    let client = Tool::spawn(
        &tool,
        &["-s", &tool_addr(addr), "-p", &addr.port().to_string()],
    );

    let incoming = step("accept", listener.accept()).await.unwrap();
    // rdma_connect(id, NULL): no private data at all, only RoCE's zero padding.
    assert!(
        incoming.private_data().iter().all(|&b| b == 0),
        "rdma_client sent private data {:?}",
        incoming.private_data()
    );
    assert_eq!(
        incoming.peer_addr().map(|a| a.ip()),
        Some(addr.ip()),
        "same host, same address"
    );
    let mut conn = step("accept", incoming.accept(b"")).await.unwrap();
    assert!(
        !conn.is_evchan_peer(),
        "rdma_client was taken for an evchan peer"
    );
    assert!(conn.peer_private_data().iter().all(|&b| b == 0));
    // IP and port only: on the passive side of an IPv6 link-local connection the kernel
    // reports the local address with scope id 0 (`[fe80::ff:fe00:1]`, not `%dummy0`), as it
    // rebuilds it from the request's GIDs; the listener's own address keeps its scope.
    let local = conn.local_addr().expect("a local address");
    assert_eq!((local.ip(), local.port()), (addr.ip(), addr.port()));

    let msg = step("rdma_client's message", conn.recv())
        .await
        .expect("receiving rdma_client's message")
        .expect("a message, not the end");
    assert_eq!(
        &msg[..],
        &[0u8; EXAMPLE_MSG][..],
        "rdma_client's 16 zero bytes"
    );
    // Its receive buffer is 16 bytes: echo exactly what came.
    step("echo", conn.send(msg)).await.unwrap();
    // With our reply in, it disconnects: a plain peer's disconnect is its end of stream.
    assert_eq!(step("end", conn.recv()).await.unwrap(), None);
    let e = step("send after the end", async {
        loop {
            if let Err(e) = conn.send(vec![1u8; EXAMPLE_MSG]).await {
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
    let out = tokio::task::spawn_blocking(move || client.wait(TOOL_DEADLINE))
        .await
        .unwrap();
    assert_clean(&out, "rdma_client");
    step("close", conn.close()).await.unwrap();
}

/// Our connection against one unmodified `rdma_server`: connect (retried while the server is
/// not yet listening: reject reason 8), send 16 bytes, receive its 16 zero bytes, then its
/// disconnect ends our receive side with `None`; the server exits 0.
async fn our_client_against_rdma_server(addr: SocketAddr) {
    let tool = require_tool!("rdma_server", "rdmacm-utils");
    let mut server = Tool::spawn(
        &tool,
        &["-s", &tool_addr(addr), "-p", &addr.port().to_string()],
    );
    let mut conn = while_not_listening(&mut server, || Connection::connect(addr))
        .await
        .unwrap_or_else(|e| panic!("connecting to rdma_server: {e}"));
    assert!(
        !conn.is_evchan_peer(),
        "rdma_server was taken for an evchan peer"
    );
    // rdma_accept(id, NULL): no private data in the reply.
    assert!(
        conn.peer_private_data().iter().all(|&b| b == 0),
        "{:?}",
        conn.peer_private_data()
    );
    assert_eq!(conn.peer_addr(), Some(addr));

    let msg = *b"evchan to server";
    assert_eq!(msg.len(), EXAMPLE_MSG);
    step("send", conn.send(msg.to_vec())).await.unwrap();
    let reply = step("rdma_server's reply", conn.recv())
        .await
        .expect("receiving rdma_server's reply")
        .expect("a message, not the end");
    assert_eq!(
        &reply[..],
        &[0u8; EXAMPLE_MSG][..],
        "rdma_server's 16 zero bytes"
    );
    drop(reply);
    // Its send completed: it disconnects, which ends our stream cleanly.
    assert_eq!(step("end", conn.recv()).await.unwrap(), None);
    let out = tokio::task::spawn_blocking(move || server.wait(TOOL_DEADLINE))
        .await
        .unwrap();
    assert_clean(&out, "rdma_server");
    step("close", conn.close()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_client_against_our_listener_ipv4() {
    require_device!();
    rdma_client_against_our_listener(v4(port(1))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_client_against_our_listener_ipv6_link_local() {
    require_device!();
    rdma_client_against_our_listener(v6(port(2))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_rdma_server_ipv4() {
    require_device!();
    our_client_against_rdma_server(v4(port(3))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_rdma_server_ipv6_link_local() {
    require_device!();
    our_client_against_rdma_server(v6(port(4))).await;
}

/// Both directions at once: our listener serves `rdma_client` while our connection talks to
/// `rdma_server`, in one runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_directions_at_once() {
    require_device!();
    let a = tokio::spawn(rdma_client_against_our_listener(v4(port(5))));
    let b = tokio::spawn(our_client_against_rdma_server(v6(port(6))));
    step("rdma_client side", a).await.unwrap();
    step("rdma_server side", b).await.unwrap();
}

/// `rping -s -S 1000` serves our client (`examples/rping.rs`): 20 pings of 1,000 bytes, each READ from
/// our start buffer and WRITten into our sink by the C server, each sink checked against its
/// ping's data; our disconnect then ends the server with status 0.
#[tokio::test]
async fn our_rping_client_against_rping_server() {
    require_device!();
    let tool = require_tool!("rping", "rdmacm-utils");
    let addr = v4(port(7));
    let mut server = Tool::spawn(
        &tool,
        // Its buffer is `-S` bytes (64 without): as large as our pings.
        &[
            "-s",
            "-S",
            "1000",
            "-a",
            &tool_addr(addr),
            "-p",
            &addr.port().to_string(),
        ],
    );
    let connect = || Connection::builder().config(rping::config()).connect(addr);
    let mut conn = while_not_listening(&mut server, connect)
        .await
        .unwrap_or_else(|e| panic!("connecting to rping -s: {e}"));
    assert!(!conn.is_evchan_peer());
    step("20 pings", rping::client(&mut conn, 20, 1000, true))
        .await
        .unwrap_or_else(|e| panic!("pinging rping -s: {e}"));
    step("close", conn.close()).await.unwrap();
    let out = tokio::task::spawn_blocking(move || server.wait(TOOL_DEADLINE))
        .await
        .unwrap();
    assert!(out.status.success(), "rping -s failed: {out}");
    assert!(!out.stderr.contains("cq completion failed"), "{out}");
}

/// Our server (`examples/rping.rs`) serves `rping -c -V`: 20 pings of 1,000 bytes, each READ
/// from the C client's start buffer and WRITten back into its sink, which it checks (`-V`: a
/// mismatch fails it); it exits 0 and its disconnect ends our side cleanly.
#[tokio::test]
async fn rping_client_against_our_rping_server() {
    require_device!();
    let tool = require_tool!("rping", "rdmacm-utils");
    let addr = v4(port(8));
    let listener = Listener::bind(addr, rping::config()).await.unwrap();
    let client = Tool::spawn(
        &tool,
        &[
            "-c",
            "-V",
            "-C",
            "20",
            "-S",
            "1000",
            "-a",
            &tool_addr(addr),
            "-p",
            &addr.port().to_string(),
        ],
    );
    let incoming = step("rping's connect", listener.accept()).await.unwrap();
    let mut conn = step("accept", incoming.accept(&[])).await.unwrap();
    assert!(!conn.is_evchan_peer());
    let pings = step("serve", rping::serve(&mut conn))
        .await
        .unwrap_or_else(|e| panic!("serving rping -c: {e}"));
    assert_eq!(pings, 20);
    let out = tokio::task::spawn_blocking(move || client.wait(TOOL_DEADLINE))
        .await
        .unwrap();
    assert!(out.status.success(), "rping -c -V failed: {out}");
    assert!(!out.stderr.contains("mismatch"), "{out}");
    step("close", conn.close()).await.unwrap();
}
