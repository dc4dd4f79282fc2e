//! [`Config::in_task`]: the shard as a task on the caller's tokio runtime, against the kernel's
//! rdma_cm and rxe (in the soft-RoCE VM). Run with `--test-threads 1` (threads and RDMA
//! resources are counted process-wide).
#![forbid(unsafe_code)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use evchan::{Config, Connection, Error, Listener, Lost};
use support::{evchan_threads, port, qps_settle_to, step, thread_cpu_ticks, v4};

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
/// order, and no runtime thread of evchan's was started (the shard is a task of this runtime).
#[tokio::test]
async fn echo_on_a_current_thread_runtime() {
    require_device!();
    echo_run(Config::new().in_task(true), port(1), 300).await;
    let busy = Config::new()
        .in_task(true)
        .busy_poll(Some(Duration::from_micros(300)));
    echo_run(busy, port(2), 300).await;
    assert_eq!(evchan_threads(), Vec::<String>::new());
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

/// Event-driven, 4 connections of one in-task shard (their echo servers' ends on it too),
/// each a task sending 40 bursts of 8 messages and then receiving their 8 echoes: every echo
/// comes back in order on its connection. The connections are left open.
async fn bursts(port: u16) -> Bursts {
    const CONNS: usize = 4;
    const BURSTS: u32 = 40;
    const BURST: u32 = 8;
    let config = Config::new().in_task(true);
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

/// [`bursts`] on a current-thread runtime: a wake-up's completions are handed out before its
/// events are read, and those reads wait for the tasks the completions woke. Then, the
/// connections idle but open, the shard sleeps: 300 ms of this thread (the shard's and every
/// task's) cost under 15 clock ticks of its CPU (a shard that kept its channel's readiness
/// without reading the events would spin through all 30).
#[tokio::test]
async fn bursts_then_idle_on_a_current_thread_runtime() {
    require_device!();
    let open = bursts(port(6)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = thread_cpu_ticks();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spent = thread_cpu_ticks() - before;
    assert!(
        spent < 15,
        "an idle in-task shard used {spent} ticks of CPU in 300 ms"
    );
    open.close().await;
    assert_eq!(evchan_threads(), Vec::<String>::new());
}

/// [`bursts`] on a multi-thread runtime, where the shard's task and the connections' tasks
/// run on either worker and a yield of the shard may find the replies' commands already
/// sent: every echo still comes back in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_on_a_multi_thread_runtime() {
    require_device!();
    bursts(port(7)).await.close().await;
    assert_eq!(evchan_threads(), Vec::<String>::new());
}

/// On a multi-thread runtime the shard task and the application's tasks may run on different
/// workers: the same exchange works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_on_a_multi_thread_runtime() {
    require_device!();
    echo_run(Config::new().in_task(true), port(3), 200).await;
    assert_eq!(evchan_threads(), Vec::<String>::new());
}

/// The application's runtime shuts down while a connection lives: its handles then fail
/// with `Lost::Shutdown` at once (nothing hangs), its QPs are gone, and a new runtime on the
/// same thread gets a fresh shard whose connections work.
#[test]
fn runtime_shutdown_fails_the_handles_and_frees_everything() {
    require_device!();
    let config = Config::new().in_task(true);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (listener, mut conn) = rt.block_on(async {
        let listener = step("bind", Listener::bind(v4(port(4)), config.clone()))
            .await
            .unwrap();
        let addr = listener.local_addr();
        let accept = tokio::spawn(async move {
            let c = listener.accept().await?.accept(&[]).await?;
            Ok::<_, Error>((listener, c))
        });
        let conn = step(
            "connect",
            Connection::builder().config(config.clone()).connect(addr),
        )
        .await
        .unwrap();
        let (listener, mut served) = step("accept", accept).await.unwrap().unwrap();
        conn.send("before").await.unwrap();
        assert_eq!(served.recv().await.unwrap().unwrap(), "before");
        drop(served);
        (listener, conn)
    });
    qps_settle_to(2, "connected");
    drop(rt);
    // The shard task was dropped with its runtime: everything it owned is destroyed.
    qps_settle_to(0, "after the runtime's shutdown");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        assert!(matches!(
            step("recv after shutdown", conn.recv()).await,
            Err(Error::ConnectionLost(Lost::Shutdown))
        ));
        assert!(matches!(
            step("send after shutdown", conn.send("after")).await,
            Err(Error::ConnectionLost(Lost::Shutdown))
        ));
        assert!(matches!(
            step("accept after shutdown", listener.accept()).await,
            Err(Error::ConnectionLost(Lost::Shutdown))
        ));
        assert!(matches!(
            step("close after shutdown", conn.close()).await,
            Err(Error::ConnectionLost(Lost::Shutdown))
        ));
        drop(listener);
        // A fresh shard on this thread, on the new runtime.
        echo_run(config.clone(), port(5), 20).await;
    });
    drop(rt);
    qps_settle_to(0, "after the second runtime");
}
