//! A connection's messages posted and reaped in the caller's tasks, on current-thread and
//! multi-thread tokio runtimes, against the kernel's rdma_cm and rxe (in the soft-RoCE VM):
//! echoes in order, bursts of several connections, halves on two tasks of a multi-thread
//! runtime (neither direction's completions lost to the other), idle connections that cost
//! no CPU, a connection that outlives the runtime it was made on, and a runtime without its
//! I/O driver. Run with `--test-threads 1` (CPU time and RDMA resources are counted
//! process-wide).
#![forbid(unsafe_code)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use evchan::{Config, Connection, Error, Listener};
use support::{port, qps_settle_to, step, thread_cpu_ticks, v4};

fn msg(i: u32, len: usize) -> Bytes {
    let mut v = vec![(i % 251) as u8; len.max(4)];
    v[..4].copy_from_slice(&i.to_be_bytes());
    Bytes::from(v)
}

/// Serves one connection: echoes until the peer's FIN, then closes.
async fn echo_one(listener: Listener) -> Result<(), Error> {
    let mut conn = listener.accept().await?.accept(b"echo").await?;
    while let Some(m) = conn.recv().await? {
        conn.send(m).await?;
    }
    conn.close().await?;
    Ok(())
}

/// One echo run of `n` messages of varied sizes on `config`, both ends in this runtime.
async fn echo_run(config: Config, port: u16, n: u32) {
    let listener = step("bind", Listener::bind(v4(port), config.clone()))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(echo_one(listener));
    let mut conn = step(
        "connect",
        Connection::builder().config(config).connect(addr),
    )
    .await
    .unwrap();
    assert_eq!(conn.peer_private_data(), b"echo");
    for i in 0..n {
        let m = msg(i, 1 + (i as usize * 37) % 4000);
        step("send", conn.send(m.clone())).await.unwrap();
        let back = step("echo", conn.recv()).await.unwrap().expect("an echo");
        assert_eq!(back, m, "message {i}");
    }
    step("close", conn.close()).await.unwrap();
    step("server", server).await.unwrap().unwrap();
}

/// Event-driven and busy-polling, on a current-thread runtime: every message comes back in
/// order.
#[tokio::test]
async fn echo_on_a_current_thread_runtime() {
    require_device!();
    echo_run(Config::new(), port(1), 300).await;
    let busy = Config::new().busy_poll(Some(Duration::from_micros(300)));
    echo_run(busy, port(2), 300).await;
}

/// The echo servers' ends of the connections [`bursts`] opened, and their clients' ends.
struct Bursts {
    conns: Vec<Connection>,
    echoes: Vec<tokio::task::JoinHandle<Result<(), Error>>>,
}

impl Bursts {
    async fn close(self) {
        for conn in self.conns {
            step("close", conn.close()).await.unwrap();
        }
        for echo in self.echoes {
            step("echo server", echo).await.unwrap().unwrap();
        }
    }
}

/// Event-driven, 4 connections (their echo servers' ends in this runtime too), each a task
/// sending 40 bursts of 8 messages and then receiving their 8 echoes: every echo comes back
/// in order on its connection. The connections are left open.
async fn bursts(port: u16) -> Bursts {
    const CONNS: usize = 4;
    const BURSTS: u32 = 40;
    const BURST: u32 = 8;
    let config = Config::new();
    let listener = step("bind", Listener::bind(v4(port), config.clone()))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(async move {
        let mut echoes = Vec::new();
        for _ in 0..CONNS {
            let mut conn = listener.accept().await?.accept(&[]).await?;
            echoes.push(tokio::spawn(async move {
                while let Some(m) = conn.recv().await? {
                    conn.send(m).await?;
                }
                conn.close().await
            }));
        }
        Ok::<_, Error>(echoes)
    });
    let mut clients = Vec::new();
    for c in 0..CONNS {
        let config = config.clone();
        clients.push(tokio::spawn(async move {
            let mut conn = step(
                "connect",
                Connection::builder().config(config).connect(addr),
            )
            .await
            .unwrap();
            for b in 0..BURSTS {
                let first = (c as u32 * BURSTS + b) * BURST;
                for i in first..first + BURST {
                    step("send", conn.send(msg(i, 1 + i as usize % 300)))
                        .await
                        .unwrap();
                }
                for i in first..first + BURST {
                    let back = step("echo", conn.recv()).await.unwrap().expect("an echo");
                    assert_eq!(
                        back,
                        msg(i, 1 + i as usize % 300),
                        "connection {c}, message {i}"
                    );
                }
            }
            conn
        }));
    }
    let mut conns = Vec::new();
    for client in clients {
        conns.push(step("client", client).await.unwrap());
    }
    let echoes = step("accepts", server).await.unwrap().unwrap();
    Bursts { conns, echoes }
}

/// [`bursts`] on a current-thread runtime. Then, the connections idle but open, with a
/// `recv` pending on each end, their tasks sleep: in windows of 300 ms, this thread (every
/// task's) costs under 15 clock ticks of its CPU in at least one of four (a wait that kept its
/// channel's readiness without reading the events would spin through all 30 of every window;
/// the first window may still see the bursts' tail, or a host that took the VM's CPU away).
#[tokio::test]
async fn bursts_then_idle_on_a_current_thread_runtime() {
    require_device!();
    let open = bursts(port(6)).await;
    // A recv pending on each client (the echo servers wait in theirs), until told to stop.
    let (conns, echoes) = (open.conns, open.echoes);
    let mut stops = Vec::new();
    let pending: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            stops.push(stop);
            tokio::spawn(async move {
                tokio::select! {
                    r = conn.recv() => panic!("nothing was sent: {r:?}"),
                    _ = stopped => conn,
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut windows = Vec::new();
    for _ in 0..4 {
        let before = thread_cpu_ticks();
        tokio::time::sleep(Duration::from_millis(300)).await;
        windows.push(thread_cpu_ticks() - before);
        if windows.last() < Some(&15) {
            break;
        }
    }
    eprintln!("idle: ticks of this thread's CPU in windows of 300 ms: {windows:?}");
    assert!(
        windows.last() < Some(&15),
        "an idle in-task shard used {windows:?} ticks of CPU in windows of 300 ms"
    );
    drop(stops);
    let mut conns = Vec::new();
    for p in pending {
        conns.push(p.await.unwrap());
    }
    Bursts { conns, echoes }.close().await;
}

/// [`bursts`] on a multi-thread runtime, where the connections' tasks run on either worker:
/// every echo still comes back in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_on_a_multi_thread_runtime() {
    require_device!();
    bursts(port(7)).await.close().await;
}

/// On a multi-thread runtime (the `#[tokio::main]` default) the same exchange works, also
/// busy-polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_on_a_multi_thread_runtime() {
    require_device!();
    echo_run(Config::new(), port(3), 200).await;
    echo_run(
        Config::new().busy_poll(Some(Duration::from_micros(300))),
        port(8),
        200,
    )
    .await;
}

/// Both ends split, each half a task of a multi-thread runtime, with small windows (4
/// credits, 4 send slots) so that the senders wait for credits while the receivers reap:
/// a credit that the receiving half reaps reaches the waiting sender, a message that the
/// waiting sender reaps reaches the receiver, and every message arrives once, in order, both
/// ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halves_on_two_tasks_lose_nothing_to_each_other() {
    require_device!();
    halves_on_two_tasks(Config::new(), port(9)).await;
}

/// The same, busy-polling: a sender without credits and a receiver without messages both
/// spin on the one CQ (and yield to the runtime) before they sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_polling_halves_on_two_tasks_lose_nothing_to_each_other() {
    require_device!();
    let busy = Config::new().busy_poll(Some(Duration::from_micros(300)));
    halves_on_two_tasks(busy, port(10)).await;
}

async fn halves_on_two_tasks(config: Config, port: u16) {
    const N: u32 = 2000;
    let config = config.recv_depth(4).send_depth(4);
    let listener = step("bind", Listener::bind(v4(port), config.clone()))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let accept = tokio::spawn(async move { listener.accept().await?.accept(&[]).await });
    let client = step(
        "connect",
        Connection::builder().config(config).connect(addr),
    )
    .await
    .unwrap();
    let server = step("accept", accept).await.unwrap().unwrap();
    let mut tasks = Vec::new();
    for (side, conn) in [("client", client), ("server", server)] {
        let (tx, mut rx) = conn.split();
        tasks.push(tokio::spawn(async move {
            for i in 0..N {
                step("send", tx.send(msg(i, 1 + i as usize % 200)))
                    .await
                    .unwrap();
            }
            drop(tx); // FIN after everything
            format!("{side} sent {N}")
        }));
        tasks.push(tokio::spawn(async move {
            for i in 0..N {
                let m = step("recv", rx.recv()).await.unwrap().expect("a message");
                assert_eq!(m, msg(i, 1 + i as usize % 200), "{side}: message {i}");
            }
            assert_eq!(step("fin", rx.recv()).await.unwrap(), None, "{side}");
            format!("{side} received {N}")
        }));
    }
    for t in tasks {
        step("halves", t).await.unwrap();
    }
    tokio::task::spawn_blocking(|| qps_settle_to(0, "both connections closed"))
        .await
        .unwrap();
}

/// A connection made on a tokio runtime that then shuts down lives on: on a new runtime its
/// completion channel is registered again, messages go both ways, and it closes cleanly.
/// A connection on a runtime without its I/O driver fails its waits with a configuration
/// error, and works again on one with it.
#[test]
fn connection_outlives_its_runtime() {
    require_device!();
    let config = Config::new();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let rt = runtime();
    let (listener, mut conn, mut served) = rt.block_on(async {
        let listener = step("bind", Listener::bind(v4(port(4)), config.clone()))
            .await
            .unwrap();
        let addr = listener.local_addr();
        let accept = tokio::spawn(async move {
            let c = listener.accept().await?.accept(&[]).await?;
            Ok::<_, Error>((listener, c))
        });
        let mut conn = step(
            "connect",
            Connection::builder().config(config.clone()).connect(addr),
        )
        .await
        .unwrap();
        let (listener, mut served) = step("accept", accept).await.unwrap().unwrap();
        // Both ends wait once, so that both register with this runtime.
        conn.send("before").await.unwrap();
        assert_eq!(served.recv().await.unwrap().unwrap(), "before");
        served.send("back").await.unwrap();
        assert_eq!(conn.recv().await.unwrap().unwrap(), "back");
        (listener, conn, served)
    });
    drop(rt);
    qps_settle_to(2, "the connection outlives its runtime");
    // No I/O driver: a wait is a configuration error (nothing lost).
    let bare = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let r = bare.block_on(async { served.recv().await });
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    drop(bare);
    runtime().block_on(async {
        conn.send("after").await.unwrap();
        assert_eq!(
            step("recv after", served.recv()).await.unwrap().unwrap(),
            "after"
        );
        served.send("again").await.unwrap();
        assert_eq!(
            step("recv again", conn.recv()).await.unwrap().unwrap(),
            "again"
        );
        step("close", conn.close()).await.unwrap();
        assert_eq!(step("fin", served.recv()).await.unwrap(), None);
        step("close served", served.close()).await.unwrap();
        drop(listener);
    });
    qps_settle_to(0, "after the close");
}
