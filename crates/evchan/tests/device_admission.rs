//! Admission control on the device: a listener at `Config::max_connections`, at its
//! `Config::memory_budget`, or out of descriptors refuses a new request with a typed busy
//! reject, and its listener and connections carry on.

#[macro_use]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use evchan::{Busy, Config, Connection, Error, Listener};
use support::{echo_server, port, step, v4};

async fn echo(conn: &mut Connection, text: &'static str) {
    step("send", conn.send(text)).await.unwrap();
    let back = step("recv", conn.recv()).await.unwrap().expect("a message");
    assert_eq!(&back[..], text.as_bytes());
}

/// `e` is a consumer reject (reason 28) of a busy server for `cause`, whose private data is
/// `wire` (what a plain librdmacm client reads in the REJECTED event).
fn assert_busy(e: &Error, cause: Busy, wire: &[u8]) {
    match e {
        Error::Rejected {
            reason,
            private_data,
            busy,
        } => {
            assert_eq!(reason.0, 28, "a consumer reject: {e}");
            assert_eq!(*busy, Some(cause), "{e}");
            assert_eq!(private_data, wire);
        }
        other => panic!("expected a busy reject, got {other:?}"),
    }
    assert!(e.to_string().contains("busy"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_rejects_typed_and_the_rest_carry_on() {
    require_device!();
    let config = Config::new().max_connections(2);
    two_admitted_then_busy(
        port(1),
        config,
        Busy::Connections,
        b"evchan-busy:connections",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_budget_rejects_typed_and_the_rest_carry_on() {
    require_device!();
    // Room for two connections' buffers and a half: the third does not fit.
    let config = Config::new();
    let budget = config.admission_bytes() * 5 / 2;
    let config = config.memory_budget(budget);
    two_admitted_then_busy(port(3), config, Busy::Memory, b"evchan-busy:memory").await;
}

/// The slots a connection's data path holds against its listener's memory budget, as its
/// probe says (`None` without a budget).
fn budget_held(conn: &Connection) -> Option<u32> {
    let state = conn.__probe().state(false);
    let tail = state.split("budget's slots held ").nth(1)?;
    tail.strip_prefix("Some(")?.split(')').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_at_a_full_memory_budget_keeps_moving() {
    require_device!();
    let config = Config::new();
    let slot = u64::from(config.max_message_size());
    let admitted = u32::try_from(config.admission_bytes() / slot).unwrap();
    // Room for one connection's admission and not a slot more: the server's connection takes
    // no slot beyond its admission's but for the floors (its first receives posted, a send
    // when none of its own is in flight).
    let tight = deep_echo(port(4), 1).await;
    // Room for four admissions: more than the connection takes when nothing stops it.
    let loose = deep_echo(port(5), 4).await;
    eprintln!(
        "slots the server's connection held at most: {tight} at a full budget, {loose} \
         with room (admitted for {admitted})"
    );
    assert!(
        tight < loose,
        "the budget bounded the connection: {tight} against {loose}"
    );
    // Beyond its admission, only the floors: its receives re-posted for the messages not yet
    // read or echoed (at most `recv_depth` 16 with the control receives' 4), a message and
    // the control messages (`ctrl_slots` 4) in flight.
    assert!(tight <= 16 + 4 + 1 + 4, "{tight} slots held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_full_memory_budget_a_reader_may_hold_messages() {
    require_device!();
    // The server's connection holds 12 received messages (more than its first receives, fewer
    // than its credits' window) before it echoes them, at a budget with room for its
    // admission only and with no keepalive (whose look would post the receives refused
    // before): its first receives stay posted, so the peer always has a credit, and nothing
    // waits for ever.
    const HELD: usize = 12;
    let config = Config::new().keepalive(None);
    let config = config.clone().memory_budget(config.admission_bytes());
    let addr = v4(port(6));
    let listener = step("bind", Listener::bind(addr, config)).await.unwrap();
    let server = tokio::spawn(async move {
        let incoming = listener.accept().await.unwrap();
        let mut conn = incoming.accept(b"").await.unwrap();
        loop {
            let mut held = Vec::with_capacity(HELD);
            while held.len() < HELD {
                match conn.recv().await.unwrap() {
                    Some(m) => held.push(m),
                    None => return,
                }
            }
            for m in held {
                conn.send(m).await.unwrap();
            }
        }
    });
    let mut conn = step("connect", Connection::connect(addr)).await.unwrap();
    for round in 0..3u8 {
        for i in 0..HELD as u8 {
            step("send", conn.send([round, i])).await.unwrap();
        }
        for i in 0..HELD as u8 {
            let m = step("echo", conn.recv()).await.unwrap().expect("an echo");
            assert_eq!(&m[..], [round, i]);
        }
    }
    step("close", conn.close()).await.unwrap();
    step("server", server).await.unwrap();
}

/// An echo server on `port` with a memory budget of `k` connections' admissions, whose first
/// connection carries 2,000 messages of 4 KiB both ways, the client's sender as far ahead as
/// its credits let it (a second connection is refused as over the budget when `k` is 1), then
/// closes. Once it is released, `k` connections at once are admitted, and one more is
/// refused: the count came back to where it was, every slot the first took beyond its
/// admission given back. The most slots the first held against the budget.
async fn deep_echo(port: u16, k: u64) -> u32 {
    const N: u32 = 2_000;
    let config = Config::new();
    let config = config.clone().memory_budget(k * config.admission_bytes());
    let addr = v4(port);
    let listener = step("bind", Listener::bind(addr, config)).await.unwrap();
    let (most_tx, most_rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(async move {
        let incoming = listener.accept().await.unwrap();
        let mut conn = incoming.accept(b"").await.unwrap();
        let mut most = 0;
        while let Some(m) = conn.recv().await.unwrap() {
            conn.send(m).await.unwrap();
            most = most.max(budget_held(&conn).expect("a listener's connection under a budget"));
        }
        conn.close().await.unwrap();
        let _ = most_tx.send(most);
        while let Ok(incoming) = listener.accept().await {
            tokio::spawn(async move {
                let mut conn = incoming.accept(b"").await?;
                while let Some(m) = conn.recv().await? {
                    conn.send(m).await?;
                }
                Ok::<_, Error>(())
            });
        }
    });
    let conn = step("connect", Connection::connect(addr)).await.unwrap();
    if k == 1 {
        let e = step("connect a second", Connection::connect(addr))
            .await
            .expect_err("no room for a second connection");
        assert_busy(&e, Busy::Memory, b"evchan-busy:memory");
    }
    let (tx, mut rx) = conn.split();
    let sender = tokio::spawn(async move {
        for i in 0..N {
            let mut m = vec![0u8; 4096];
            m[..4].copy_from_slice(&i.to_le_bytes());
            tx.send(m).await.unwrap();
        }
        tx
    });
    for i in 0..N {
        let m = step("echo", rx.recv()).await.unwrap().expect("an echo");
        assert_eq!(m.len(), 4096);
        assert_eq!(m[..4], i.to_le_bytes(), "echoes in order");
    }
    drop(step("sender", sender).await.unwrap());
    assert!(step("end", rx.recv()).await.unwrap().is_none());
    let most = step("the first's most", most_rx).await.unwrap();

    // The release ends on the server's shard after the disconnect: retried for a bounded
    // while.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut next = Vec::new();
    while next.len() < k as usize {
        next.push(admitted_after_release(addr, Busy::Memory, deadline).await);
    }
    for c in &mut next {
        echo(c, "admitted after the first's release").await;
    }
    let e = step("connect one more", Connection::connect(addr))
        .await
        .expect_err("the budget is full again");
    assert_busy(&e, Busy::Memory, b"evchan-busy:memory");
    for c in next {
        step("close", c.close()).await.unwrap();
    }
    server.abort();
    most
}

/// A listener on `port` with `config`, which admits two connections: a third and a fourth are
/// refused at once with `cause` (private data `wire`), the two admitted ones are not disturbed,
/// and once one is released a new one is admitted.
async fn two_admitted_then_busy(port: u16, config: Config, cause: Busy, wire: &[u8]) {
    let addr = v4(port);
    let server = echo_server(addr, config).await;
    let mut a = step("connect a", Connection::connect(addr)).await.unwrap();
    let mut b = step("connect b", Connection::connect(addr)).await.unwrap();

    for _ in 0..2 {
        let e = step("connect c", Connection::connect(addr))
            .await
            .expect_err("a third connection beyond the bound");
        assert_busy(&e, cause, wire);
    }

    // The two admitted connections were not disturbed.
    echo(&mut a, "a still echoes").await;
    echo(&mut b, "b still echoes").await;

    // Once one is released, a new one is admitted (the release ends on the server's shard
    // after the disconnect: retried for a bounded while).
    step("close a", a.close()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut c = admitted_after_release(addr, cause, deadline).await;
    echo(&mut c, "c is admitted after a's release").await;
    echo(&mut b, "b echoes on").await;
    step("close b", b.close()).await.unwrap();
    step("close c", c.close()).await.unwrap();
    server.abort();
}

/// A connection to `addr`, retried while the server refuses it as busy for `cause` until
/// `deadline` (a release ends on the server's shard after the disconnect).
async fn admitted_after_release(addr: SocketAddr, cause: Busy, deadline: Instant) -> Connection {
    loop {
        match Connection::connect(addr).await {
            Ok(c) => return c,
            Err(Error::Rejected { busy: Some(b), .. })
                if b == cause && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("a connection after a release: {e}"),
        }
    }
}

/// Set in the child process that plays the server of
/// [`out_of_descriptors_rejects_typed_and_the_server_carries_on`].
const SERVER_ROLE: &str = "EVCHAN_ADMISSION_EMFILE_SERVER";

/// The server's half, in a process of its own (its descriptors are what runs out): it
/// listens, takes every descriptor its lowered limit leaves, and says so; the first request's
/// accept must fail for want of descriptors; then it gives them back, and the next request is
/// accepted and echoed.
async fn emfile_server(addr: std::net::SocketAddr) {
    let listener = Listener::bind(addr, Config::new()).await.unwrap();
    evchan_sys::set_open_files_limit(256).unwrap();
    // The runtime's thread looks at sysfs every 50 ms, holding a descriptor or two for a
    // moment: one it held while this filled would come free after. So the filling goes on
    // until three looks in a row, 70 ms apart, find no descriptor left.
    let mut filler = Vec::new();
    let mut found_none = 0;
    while found_none < 3 {
        let before = filler.len();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => filler.push(f),
                Err(e) if e.raw_os_error() == Some(24) => break,
                Err(e) => panic!("opening /dev/null: {e}"),
            }
        }
        found_none = if filler.len() == before {
            found_none + 1
        } else {
            0
        };
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
    println!("@@emfile-server-full {} descriptors taken", filler.len());
    let first = step("the first request", listener.accept()).await.unwrap();
    let e = step("the first accept", first.accept(b""))
        .await
        .expect_err("an accept without a descriptor left");
    println!("@@emfile-server-refused {e}");
    drop(filler);
    println!("@@emfile-server-released");
    let second = step("the second request", listener.accept()).await.unwrap();
    let mut conn = step("the second accept", second.accept(b"")).await.unwrap();
    while let Some(msg) = step("recv", conn.recv()).await.unwrap() {
        step("send", conn.send(msg)).await.unwrap();
    }
    println!("@@emfile-server-done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_rejects_typed_and_the_server_carries_on() {
    require_device!();
    if let Ok(port) = std::env::var(SERVER_ROLE) {
        return emfile_server(v4(port.parse().unwrap())).await;
    }
    use std::io::BufRead as _;
    let port = port(2);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "out_of_descriptors_rejects_typed_and_the_server_carries_on",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SERVER_ROLE, port.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let out = child.stdout.take().unwrap();
    // Only the server's markers and panics are shown: its libtest lines, shown as they are,
    // would read as this binary's own to whoever counts its results.
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(at) = line.find("@@emfile").or_else(|| line.find("panicked")) {
                println!("[server] {}", &line[at..]);
            }
            let _ = tx.send(line);
        }
    });
    let mut wait_for = async |marker: &str| loop {
        let line = step(marker, rx.recv())
            .await
            .expect("the server's output ended");
        if line.contains(marker) {
            return line;
        }
    };
    wait_for("@@emfile-server-full").await;
    let addr = v4(port);
    let e = step(
        "connect while the server is out of descriptors",
        Connection::connect(addr),
    )
    .await
    .expect_err("a connection to a server out of descriptors");
    assert_busy(&e, Busy::Descriptors, b"evchan-busy:descriptors");
    let refused = wait_for("@@emfile-server-refused").await;
    assert!(refused.contains("Too many open files"), "{refused}");
    wait_for("@@emfile-server-released").await;
    // The server carries on: the same listener accepts the next request.
    let mut conn = step("connect after the release", Connection::connect(addr))
        .await
        .unwrap();
    echo(&mut conn, "served once descriptors were free again").await;
    step("close", conn.close()).await.unwrap();
    wait_for("@@emfile-server-done").await;
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "the server process: {status}");
}
