//! Scale and cleanup, in the VM (run with `--test-threads=1`: each test measures the whole
//! process).
//!
//! - [`many_connections_three_rounds_without_growth`]: 256 connections open at once through one
//!   [`Listener`], 100 messages each way on each, all intact and in order; three rounds, each
//!   in its own tokio runtime, and between rounds evchan's runtime must shut down (its threads
//!   end once the last handle is gone). After rounds 2 and 3 the process's file descriptors
//!   must be exactly those after round 1, and its RSS within [`RSS_TOLERANCE_KIB`] of it. A
//!   round fails as hung once nothing has moved on any connection for 30 s ([`watchdog`]),
//!   printing what the ends still exchanging were at.
//! - [`a_burst_costs_what_it_holds_and_its_memory_comes_back_as_the_runtime_ends`] and
//!   [`a_thousand_connections_need_no_descriptors_and_give_their_memory_back`]: 1,000
//!   connections open at once, what each costs, and the memory given back once they closed
//!   (as evchan's runtime ends, and while it runs on), without the test trimming the allocator.
//! - `dropped_*_leaves_no_rdma_resources`: a `Connection`, a half, or the `Listener` dropped
//!   mid-flight; once the runtime has shut down, `rdma resource show` lists no cm_id, QP, CQ
//!   or MR of this process and no PD but librdmacm's own one per device (see
//!   `librdmacm_keeps_its_device_pd`), and no wait is unbounded. `bound_listener_alone_*` and
//!   `clean_close_*` are the smallest cases of the same check.
//! - Entries are matched as user-space entries of the VM (see `support::user_rdma_resources`:
//!   the kernel records the creating *thread*, evchan creates everything on its runtime
//!   threads, so matching the process id finds nothing).
#![forbid(unsafe_code)]

mod support;

use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use evchan::{Config, Connection, Error, Listener, Probe};
use support::{
    bound_tcp_id, echo_server, fd_count, fd_targets, port, rss_kib, step, user_rdma_resources, v4,
    wait_runtime_gone, STEP,
};

const CONNS: u32 = 256;
const MSGS: u32 = 100;
/// The most one whole round may take (TCG).
const ROUND: Duration = Duration::from_secs(400);
/// RSS growth allowed after rounds 2 and 3 over round 1, after `malloc_trim(0)`, with
/// transparent huge pages off for the process ([`support::no_huge_pages`]; the runs below were
/// measured without it).
///
/// Measured in the VM (RSS after each round's shutdown, in KiB, over 11 runs of 3 rounds;
/// runs whose earlier tests panicked and loaded debug info for backtraces sat near 58,000):
/// after round 1 8,432–18,720, after rounds 2 and 3 8,528–19,280. The largest growth over
/// round 1 was +6,604 (before `malloc_trim` was added) and +6,276 (with it), once each;
/// otherwise at most +3,172; and as often a shrink (down to −8,028). The spread is glibc's:
/// every round starts new threads, whose stacks glibc caches (touched pages stay resident) and
/// whose malloc arenas keep free memory; it moves by several MiB either way and does not
/// accumulate. 10 MiB leaves 3.6 MiB above the largest growth seen and still catches, by
/// round 3 (1,024 connection ends after round 1), a leak of 10 KiB per connection end: a
/// leaked QP's queues, a leaked id's librdmacm state or a leaked slot pool with its registered
/// buffers are each of that order or more. File descriptors are held to exactly round 1's.
const RSS_TOLERANCE_KIB: u64 = 10240;
/// The kinds of `rdma resource show` that must be empty after the runtime shut down.
const KINDS: [&str; 5] = ["cm_id", "qp", "cq", "mr", "pd"];

fn scale_config() -> Config {
    Config::new()
        .shards(2)
        .max_message(256)
        .recv_depth(8)
        .send_depth(8)
        .backlog(2 * CONNS)
}

/// Message `i` of connection `c` in direction `dir` (0: to the server, 1: back): its own
/// numbers up front, a length and filler that differ per message.
fn msg(c: u32, i: u32, dir: u8) -> Bytes {
    let len = 9 + ((c * 7 + i * 13) % 240) as usize;
    let mut v = vec![(c as u8) ^ (i as u8) ^ dir; len];
    v[..4].copy_from_slice(&c.to_be_bytes());
    v[4..8].copy_from_slice(&i.to_be_bytes());
    v[8] = dir;
    Bytes::from(v)
}

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `fut` in a fresh tokio runtime, drops the runtime (and every handle its tasks held),
/// then waits until evchan's runtime threads are gone.
fn in_fresh_runtime<F: Future<Output = ()>>(fut: F) {
    let rt = tokio_rt();
    rt.block_on(fut);
    rt.shutdown_timeout(support::STEP);
    wait_runtime_gone();
}

/// One side of a connection's exchange: sends `MSGS` messages of direction `dir`, then its
/// FIN; receives `MSGS` of the other direction in order, then `None`. No wait of its own is
/// timed: the round's [`watchdog`] fails the round when nothing moves anywhere.
async fn exchange(conn: Connection, c: u32, dir: u8) {
    probes().insert((c, dir), conn.__probe());
    let (tx, mut rx) = conn.split();
    let sender = tokio::spawn(async move {
        for i in 0..MSGS {
            tx.send(msg(c, i, dir))
                .await
                .unwrap_or_else(|e| panic!("conn {c} send {i}: {e}"));
        }
        drop(tx); // FIN after all of them
    });
    for i in 0..MSGS {
        let m = rx
            .recv()
            .await
            .unwrap_or_else(|e| panic!("conn {c} dir {dir} recv {i}: {e}"))
            .unwrap_or_else(|| panic!("conn {c} dir {dir}: end after {i} messages"));
        MOVED.fetch_add(1, Ordering::Relaxed);
        assert_eq!(
            m,
            msg(c, i, 1 - dir),
            "conn {c}, message {i} of direction {}",
            1 - dir
        );
    }
    assert_eq!(rx.recv().await.unwrap(), None, "conn {c}: more than {MSGS}");
    MOVED.fetch_add(1, Ordering::Relaxed);
    sender.await.unwrap();
    MOVED.fetch_add(1, Ordering::Relaxed);
    probes().remove(&(c, dir));
}

/// Messages delivered, ends and senders finished, over all connections of the process.
static MOVED: AtomicU64 = AtomicU64::new(0);

/// Fails the round once nothing has moved on any connection (no message delivered, no end
/// nor sender finished) for [`STEP`]: a hang, with what the ends still exchanging were at.
///
/// Not a timeout per wait: with 256 connections, both ends and every task of them on two
/// worker threads in the emulated VM, the runtime is saturated (both workers busy most of
/// the round, hundreds of woken tasks in tokio's queues), and one connection's task
/// can wait its turn for over 30 s while the others move; that is scheduling, not a hang,
/// and a hang stops everything that depends on it within the round. It runs in the round's
/// `block_on`, on the test's own thread, not in the saturated workers' queues.
async fn watchdog() {
    let mut last = MOVED.load(Ordering::Relaxed);
    loop {
        tokio::time::sleep(STEP).await;
        let now = MOVED.load(Ordering::Relaxed);
        assert_ne!(
            now,
            last,
            "nothing moved on any connection for {STEP:?}\n{}",
            stalled()
        );
        last = now;
    }
}

/// The most a [`canary`] task woke up late in this round, in milliseconds.
static LATE_MS: AtomicU64 = AtomicU64::new(0);

/// A task of the round's runtime that sleeps 100 ms in a loop and notes how late it wakes up:
/// how long a woken task of that runtime waits its turn (no evchan in it).
async fn canary() {
    const NAP: Duration = Duration::from_millis(100);
    loop {
        let start = Instant::now();
        tokio::time::sleep(NAP).await;
        let late = start.elapsed().saturating_sub(NAP);
        LATE_MS.fetch_max(
            u64::try_from(late.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// The data paths of the connection ends still exchanging, by connection and direction: what
/// a hang prints.
fn probes() -> std::sync::MutexGuard<'static, std::collections::HashMap<(u32, u8), Probe>> {
    static PROBES: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<(u32, u8), Probe>>,
    > = std::sync::OnceLock::new();
    PROBES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the ends still exchanging are at (the first few, both ends of each connection, as
/// they are and after a reap of their CQs), the runtime's queues and the device's counters.
fn stalled() -> String {
    let all = probes().clone();
    let mut ends: Vec<_> = all.keys().copied().collect();
    ends.sort_unstable();
    let mut out = format!("{} ends still exchanging: {ends:?}\n", ends.len());
    for kick in [false, true] {
        for k in ends.iter().take(6) {
            out += &format!("  {k:?} (kick {kick}): {}\n", all[k].state(kick));
        }
    }
    let m = tokio::runtime::Handle::current().metrics();
    out += &format!(
        "runtime: a task woke up to {} ms late; {} tasks alive, {} in the global queue; \
         workers' busy time and parks: {:?}\n",
        LATE_MS.load(Ordering::Relaxed),
        m.num_alive_tasks(),
        m.global_queue_depth(),
        (0..m.num_workers())
            .map(|w| (m.worker_total_busy_duration(w), m.worker_park_count(w)))
            .collect::<Vec<_>>()
    );
    out + &support::device_counters()
}

/// One round; returns how long it took and the QPs `rdma resource show` listed with every
/// connection open.
fn round(k: u32) -> (Duration, usize) {
    let start = Instant::now();
    let mut qps = 0;
    in_fresh_runtime(async {
        let listener = step("bind", Listener::bind(v4(port(1)), scale_config()))
            .await
            .unwrap();
        let addr = listener.local_addr();
        // Everyone waits until all CONNS are open at once (both sides), then talks.
        let (go_tx, go_rx) = tokio::sync::watch::channel(false);
        let open = Arc::new(AtomicU32::new(0));
        let all_open = Arc::new(tokio::sync::Notify::new());
        let opened = {
            let (open, all_open) = (open.clone(), all_open.clone());
            move || {
                if open.fetch_add(1, Ordering::SeqCst) + 1 == 2 * CONNS {
                    all_open.notify_one();
                }
            }
        };
        let server = {
            let (opened, go_rx) = (opened.clone(), go_rx.clone());
            tokio::spawn(async move {
                let mut tasks = tokio::task::JoinSet::new();
                for _ in 0..CONNS {
                    let incoming = step("accept", listener.accept()).await.unwrap();
                    let c = u32::from_be_bytes(incoming.private_data()[..4].try_into().unwrap());
                    let (opened, mut go_rx) = (opened.clone(), go_rx.clone());
                    tasks.spawn(async move {
                        let conn = step("accept", incoming.accept(b"")).await.unwrap();
                        assert!(conn.is_evchan_peer());
                        opened();
                        step("go", go_rx.wait_for(|g| *g)).await.unwrap();
                        exchange(conn, c, 1).await;
                    });
                }
                while let Some(r) = tasks.join_next().await {
                    r.unwrap();
                }
                listener
            })
        };
        let mut clients = tokio::task::JoinSet::new();
        for c in 0..CONNS {
            let (opened, mut go_rx) = (opened.clone(), go_rx.clone());
            clients.spawn(async move {
                let conn = step(
                    "connect",
                    Connection::builder()
                        .config(scale_config())
                        .private_data(c.to_be_bytes().to_vec())
                        .connect(addr),
                )
                .await
                .unwrap_or_else(|e| panic!("round {k} connection {c}: {e}"));
                opened();
                step("go", go_rx.wait_for(|g| *g)).await.unwrap();
                exchange(conn, c, 0).await;
            });
        }
        let waited = tokio::time::timeout(ROUND, all_open.notified()).await;
        assert!(
            waited.is_ok(),
            "round {k}: only {} of {} sides open after {ROUND:?}",
            open.load(Ordering::SeqCst),
            2 * CONNS
        );
        qps = tokio::task::spawn_blocking(|| user_rdma_resources("qp").len())
            .await
            .unwrap();
        go_tx.send(true).unwrap();
        LATE_MS.store(0, Ordering::Relaxed);
        let canary = tokio::spawn(canary());
        let done = tokio::time::timeout(ROUND, async {
            while let Some(r) = clients.join_next().await {
                r.unwrap();
            }
            server.await.unwrap()
        });
        let done = tokio::select! {
            done = done => done,
            () = watchdog() => unreachable!("the watchdog returns only by failing"),
        };
        let listener = done.unwrap_or_else(|_| panic!("round {k} did not finish within {ROUND:?}"));
        canary.abort();
        eprintln!(
            "round {k}: a task of the same runtime woke up to {} ms late",
            LATE_MS.load(Ordering::Relaxed)
        );
        drop(listener);
    });
    (start.elapsed(), qps)
}

/// Polls (at most 10 s) until the fd count is `want`; `None` when it got there.
fn fds_settle_to(want: usize) -> Option<usize> {
    let start = Instant::now();
    loop {
        let n = fd_count();
        if n == want {
            return None;
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Some(n);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn many_connections_three_rounds_without_growth() {
    require_device!();
    support::init_log();
    support::no_huge_pages();
    // Two descriptors per connection end, both ends here.
    support::open_files_for(4 * u64::from(CONNS) + 256);
    wait_runtime_gone();
    support::malloc_trim();
    eprintln!("before: {} fds, RSS {} KiB", fd_count(), rss_kib());
    let mut after: Vec<(usize, u64, Vec<String>)> = Vec::new();
    for k in 1..=3u32 {
        let (took, qps) = round(k);
        // Each connection has a QP on both sides, all in this process.
        assert_eq!(
            qps,
            2 * CONNS as usize,
            "round {k}: QPs listed with all connections open"
        );
        let fds = match after.first() {
            // Let anything that closes late close before the baseline is taken.
            None => {
                std::thread::sleep(Duration::from_millis(500));
                fd_count()
            }
            Some((fds1, _, _)) => fds_settle_to(*fds1).unwrap_or_else(fd_count),
        };
        support::malloc_trim();
        let rss = rss_kib();
        eprintln!(
            "round {k}: {CONNS} connections x {MSGS} messages each way in {took:.1?}; \
             after shutdown {fds} fds, RSS {rss} KiB"
        );
        after.push((fds, rss, fd_targets()));
    }
    // All three rounds are measured first, then judged.
    let (fds1, rss1, targets1) = &after[0];
    for (k, (fds, rss, targets)) in after.iter().enumerate().skip(1) {
        let k = k + 1;
        assert_eq!(
            fds, fds1,
            "round {k}: {fds} fds after shutdown, {fds1} after round 1\nnow: {targets:#?}\nround 1: {targets1:#?}"
        );
        assert!(
            *rss <= rss1 + RSS_TOLERANCE_KIB,
            "round {k}: RSS {rss} KiB, round 1 {rss1} KiB: grew {} KiB, more than {RSS_TOLERANCE_KIB} KiB \
             (all rounds: {:?})",
            rss - rss1,
            after.iter().map(|a| a.1).collect::<Vec<_>>()
        );
    }
}

/// librdmacm's own PD. librdmacm allocates one PD per device when the first id binds to it;
/// it frees it when the last id goes, unless the device list was taken with
/// `rdma_get_devices` meanwhile (evchan's runtime holds it for its contexts): then it keeps the
/// PD for the rest of the process, through `rdma_free_devices` too (librdmacm 44; see
/// [`librdmacm_keeps_its_device_pd`]). It is one per device and process, not evchan's to free.
/// Made here on purpose, with no evchan runtime running, and returned as `rdma resource show
/// pd` lists it.
fn librdmacm_pd() -> Vec<String> {
    support::pin_librdmacm_pd();
    let pds = user_rdma_resources("pd");
    assert_eq!(
        pds.len(),
        1,
        "librdmacm's PD of the one device, and nothing else: {pds:#?}"
    );
    for k in ["cm_id", "qp", "cq", "mr"] {
        assert_eq!(
            user_rdma_resources(k),
            Vec::<String>::new(),
            "before the test: {k}"
        );
    }
    pds
}

/// Asserts that `rdma resource show` lists no cm_id, QP, CQ or MR of this process and no PD
/// but librdmacm's own (`librdmacm_pd`, the very same entry) — polled briefly, since the
/// kernel releases a destroyed id's entry asynchronously.
fn assert_no_rdma_resources(librdmacm_pd: &[String], what: &str) {
    let start = Instant::now();
    loop {
        let left: Vec<(&str, Vec<String>)> = KINDS
            .iter()
            .map(|k| {
                let mut l = user_rdma_resources(k);
                if *k == "pd" {
                    l.retain(|p| !librdmacm_pd.contains(p));
                }
                (*k, l)
            })
            .filter(|(_, l)| !l.is_empty())
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: the runtime shut down, but `rdma resource show` still lists: {left:#?} \
             (librdmacm's own PD, allowed: {librdmacm_pd:?})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What `rdma resource show` lists of this process now, kind by kind (counts).
async fn listed() -> Vec<(&'static str, usize)> {
    tokio::task::spawn_blocking(|| {
        KINDS
            .iter()
            .map(|k| (*k, user_rdma_resources(k).len()))
            .collect()
    })
    .await
    .unwrap()
}

fn small() -> Config {
    Config::new()
        .shards(2)
        .recv_depth(2)
        .send_depth(4)
        .max_message(1024)
}

#[test]
fn dropped_connection_mid_flight_leaves_no_rdma_resources() {
    require_device!();
    let base = librdmacm_pd();
    in_fresh_runtime(async {
        let addr = v4(port(2));
        let _server = echo_server(addr, small()).await;
        for round in 0..4u32 {
            let conn = step(
                "connect",
                Connection::builder().config(small()).connect(addr),
            )
            .await
            .unwrap();
            // Fill the queue without reading the echoes, then drop with all of it in flight.
            for i in 0..4 {
                let _ = tokio::time::timeout(Duration::from_millis(5), conn.send(msg(round, i, 0)))
                    .await;
            }
            if round == 0 {
                let now = listed().await;
                eprintln!("listed with one connection open: {now:?}");
                for (k, n) in &now {
                    assert!(
                        *n > 0,
                        "`rdma resource show {k}` lists nothing of ours mid-flight"
                    );
                }
            }
            drop(conn);
        }
    });
    assert_no_rdma_resources(&base, "connections dropped mid-flight");
}

#[test]
fn dropped_halves_mid_flight_leave_no_rdma_resources() {
    require_device!();
    let base = librdmacm_pd();
    in_fresh_runtime(async {
        let addr = v4(port(3));
        let _server = echo_server(addr, small()).await;
        // The receive half goes first while echoes are coming; the send half keeps sending.
        let conn = step(
            "connect",
            Connection::builder().config(small()).connect(addr),
        )
        .await
        .unwrap();
        let (tx, rx) = conn.split();
        for i in 0..3 {
            step("send", tx.send(msg(1, i, 0))).await.unwrap();
        }
        drop(rx);
        for i in 3..40 {
            // Echoes to a dropped receive half are consumed and credited: sends go on.
            step("send with the receive half gone", tx.send(msg(1, i, 0)))
                .await
                .unwrap();
        }
        drop(tx);
        // The send half goes first with messages queued; the receive half reads to the end.
        let conn = step(
            "connect",
            Connection::builder().config(small()).connect(addr),
        )
        .await
        .unwrap();
        let (tx, mut rx) = conn.split();
        for i in 0..4 {
            let _ = tokio::time::timeout(Duration::from_millis(5), tx.send(msg(2, i, 0))).await;
        }
        drop(tx);
        let mut n = 0;
        while let Some(_m) = step("echo after the send half went", rx.recv())
            .await
            .unwrap()
        {
            n += 1;
        }
        assert!(n <= 4, "{n} echoes for at most 4 messages");
        // And one whose receive half is dropped while unread echoes sit in its queue.
        let conn = step(
            "connect",
            Connection::builder().config(small()).connect(addr),
        )
        .await
        .unwrap();
        let (tx, rx) = conn.split();
        for i in 0..2 {
            step("send", tx.send(msg(3, i, 0))).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(rx);
        drop(tx);
    });
    assert_no_rdma_resources(&base, "halves dropped mid-flight");
}

#[test]
fn dropped_listener_mid_flight_leaves_no_rdma_resources() {
    require_device!();
    let base = librdmacm_pd();
    in_fresh_runtime(async {
        let addr = v4(port(4));
        let config = small().backlog(4);
        let server = echo_server(addr, config.clone()).await;
        let conn = step(
            "connect",
            Connection::builder().config(config.clone()).connect(addr),
        )
        .await
        .unwrap();
        // Connects in flight while the listener goes: each must end (either way) in bounded
        // time, none may hang.
        let mut pending = tokio::task::JoinSet::new();
        for _ in 0..12 {
            let config = config.clone();
            pending.spawn(async move {
                let r = Connection::builder().config(config).connect(addr).await;
                if let Ok(mut c) = r {
                    // Served, or ended, but never hanging.
                    let _ = c.send("x").await;
                    let _ = step("echo or end", c.recv()).await;
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        server.abort(); // drops the Listener with requests queued and connects under way
        let _ = server.await;
        while let Some(r) = step("a connect after the listener went", pending.join_next()).await {
            r.unwrap();
        }
        // The connection accepted before still works.
        let mut conn = conn;
        step("send", conn.send("still served")).await.unwrap();
        assert_eq!(
            step("echo", conn.recv()).await.unwrap().as_deref(),
            Some(&b"still served"[..])
        );
        // A new connect finds nobody listening.
        let e = step(
            "connect",
            Connection::builder().config(config).connect(addr),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, Error::Rejected { .. }), "{e}");
    });
    assert_no_rdma_resources(&base, "listener dropped mid-flight");
}

/// The smallest case of the same check: a listener bound and dropped, and one connection
/// opened and closed gracefully, nothing dropped mid-flight. Tells a leak of the drop paths
/// from one of every runtime.
#[test]
fn clean_close_leaves_no_rdma_resources() {
    require_device!();
    let base = librdmacm_pd();
    in_fresh_runtime(async {
        let listener = step("bind", Listener::bind(v4(port(5)), small()))
            .await
            .unwrap();
        let addr = listener.local_addr();
        let client = tokio::spawn(async move {
            let mut c = Connection::builder()
                .config(small())
                .connect(addr)
                .await
                .unwrap();
            c.send("one").await.unwrap();
            assert_eq!(c.recv().await.unwrap(), None);
            c.close().await.unwrap();
        });
        let mut s = step("accept", async {
            listener.accept().await.unwrap().accept(b"").await.unwrap()
        })
        .await;
        assert_eq!(
            step("recv", s.recv()).await.unwrap().as_deref(),
            Some(&b"one"[..])
        );
        step("close", s.close()).await.unwrap();
        step("client", client).await.unwrap();
        drop(listener);
    });
    assert_no_rdma_resources(&base, "a clean close");
}

/// Only a listener, bound and dropped: no connection at all.
#[test]
fn bound_listener_alone_leaves_no_rdma_resources() {
    require_device!();
    let base = librdmacm_pd();
    in_fresh_runtime(async {
        let listener = step("bind", Listener::bind(v4(port(6)), small()))
            .await
            .unwrap();
        drop(listener);
    });
    assert_no_rdma_resources(&base, "a listener bound and dropped");
}

/// Not evchan: librdmacm 44 allocates a PD per device when the first id binds to it. Without
/// `rdma_get_devices` it frees it when that id is destroyed; with the device list taken (as
/// evchan's runtime does, for its contexts) it keeps it, even after `rdma_free_devices`. The PD
/// the other tests allow is this one; if librdmacm changes, this test says so.
#[test]
fn librdmacm_keeps_its_device_pd() {
    use evchan_core::verbs::{Context, Pd};
    use evchan_core::EventChannel;
    require_device!();
    wait_runtime_gone();
    let pds = |what: &str| {
        let l = user_rdma_resources("pd");
        eprintln!("PDs after {what}: {l:?}");
        l
    };
    let before = pds("nothing");
    if !before.is_empty() {
        // Another test of this process pinned it already: nothing more to learn here.
        assert_eq!(before.len(), 1, "{before:?}");
        return;
    }
    {
        let ch = EventChannel::new().unwrap();
        let id = bound_tcp_id(&ch);
        assert_eq!(
            pds("binding an id, no device list taken").len(),
            1,
            "librdmacm's PD"
        );
        drop(id);
    }
    assert_eq!(pds("dropping that id"), before, "freed with its last id");
    let ctxs = Context::rdma_cm_devices().unwrap();
    assert_eq!(
        pds("rdma_get_devices"),
        before,
        "rdma_get_devices allocates no PD"
    );
    let pd = Pd::new(&ctxs[0]).unwrap();
    assert_eq!(pds("Pd::new").len(), 1);
    drop(pd);
    assert_eq!(pds("dropping the Pd"), before, "our own PD is freed");
    let ch = EventChannel::new().unwrap();
    let id = bound_tcp_id(&ch);
    let bound = pds("binding an id with the device list taken");
    assert_eq!(bound.len(), 1, "librdmacm's PD");
    drop(id);
    drop(ch);
    drop(ctxs);
    let after = pds("dropping the id, its channel and the device list");
    assert_eq!(
        after, bound,
        "librdmacm keeps its PD (if this fails, librdmacm frees it now)"
    );
}

/// Connections of [`a_thousand_connections_need_no_descriptors_and_give_their_memory_back`].
const BURST: usize = 1000;
/// Connects in flight at once in that test.
const IN_FLIGHT: usize = 64;

/// `n` connections to `addr` with `config`, at most [`IN_FLIGHT`] connects at once, each
/// echoing one message (its number) before it is kept.
async fn connect_all(addr: std::net::SocketAddr, config: &Config, n: usize) -> Vec<Connection> {
    let limit = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (limit, config) = (limit.clone(), config.clone());
        set.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            let mut conn = step(
                "connect",
                Connection::builder().config(config).connect(addr),
            )
            .await
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
            step("send", conn.send(i.to_be_bytes())).await.unwrap();
            let back = step("recv", conn.recv()).await.unwrap().unwrap();
            assert_eq!(&back[..], i.to_be_bytes());
            conn
        });
    }
    let mut conns = Vec::with_capacity(n);
    while let Some(c) = set.join_next().await {
        conns.push(c.unwrap());
    }
    conns
}

/// Closes every one of `conns` at once, each within [`STEP`].
async fn close_all(conns: Vec<Connection>) {
    let mut set = tokio::task::JoinSet::new();
    for c in conns {
        set.spawn(async move { step("close", c.close()).await.unwrap() });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
}

/// 1,000 connections to one listener in this process (2,000 connection ends, each echoing one
/// message), all open at once, then all closed:
/// - descriptors: the process holds at most `BURST / 100` more with all of them open than
///   before (a shard's completion channel per device is made with its first connection, in the
///   warm-up): no descriptor per connection;
/// - memory: within 30 s of the last close, RSS is back within 10 % plus 4 MiB of what it
///   was before the burst, without the test calling `malloc_trim`: the slot pools are unmapped
///   when freed, and evchan's runtime trims the allocator once the burst is over.
///
/// Measured in the VM: about 5.6 MiB before, 106 MiB open (51.5 KiB per connection end, 24
/// KiB of it buffers), 7.4–8.0 MiB after: 98 % of the burst given back, and 2 MiB (+40 %) kept,
/// which misses the 10 % that issue 42 asks. Before the pools were mappings and the runtime
/// trimmed, 15 MiB were kept; before either, most of the burst. The 4 MiB catch a regression
/// of 2 KiB per connection end.
#[test]
fn a_thousand_connections_need_no_descriptors_and_give_their_memory_back() {
    require_device!();
    support::no_huge_pages();
    let config = Config::new()
        .shards(2)
        .max_message(1024)
        .recv_depth(8)
        .send_depth(8)
        .backlog(2 * BURST as u32);
    in_fresh_runtime(async move {
        let addr = v4(port(7));
        let server = echo_server(addr, config.clone()).await;
        // Warm-up: every shard has met the device, and the allocator its threads.
        close_all(connect_all(addr, &config, 8).await).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (fds_before, rss_before) = (fd_count(), rss_kib());

        let start = Instant::now();
        let conns = connect_all(addr, &config, BURST).await;
        let setup = start.elapsed();
        let (fds_open, rss_open) = (fd_count(), rss_kib());
        close_all(conns).await;
        // The server's ends are released after the disconnect, on its shards; then the
        // runtime trims after a second without a release. Looked at until within the bound,
        // for 30 s at most.
        let bound = rss_before + rss_before / 10 + 4096;
        let closed = Instant::now();
        while rss_kib() > bound && closed.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let settled = closed.elapsed();
        let (fds_after, rss_after) = (fd_count(), rss_kib());
        println!(
            "{BURST} connections (both ends here) in {setup:.1?}: descriptors {fds_before} \
             before, {fds_open} open, {fds_after} after; RSS {rss_before} KiB before, \
             {rss_open} KiB open ({:.1} KiB per connection end), {rss_after} KiB {settled:.1?} \
             after the last close; buffers per end {} KiB",
            (rss_open.saturating_sub(rss_before)) as f64 / (2 * BURST) as f64,
            config.buffer_bytes() / 1024,
        );
        assert!(
            fds_open <= fds_before + BURST / 100,
            "descriptors: {fds_before} before, {fds_open} with {BURST} connections open"
        );
        assert!(
            fds_after <= fds_before,
            "descriptors after: {fds_after} > {fds_before}"
        );
        assert!(
            rss_after <= bound,
            "RSS {rss_after} KiB after the burst, {rss_before} KiB before"
        );
        server.abort();
    });
}

/// The most resident memory one connection end may add with the defaults (4 KiB messages),
/// after one echo, both ends in this process (with the server's echo task), in a debug build.
/// Measured in the VM: 69 or 70 KiB in 8 runs; before the shared pools and channels, a
/// connection end cost about 200 KiB.
const KIB_PER_END: u64 = 80;
/// The most resident memory the process may keep once a burst of [`BURST`] connections closed
/// and evchan's runtime ended, over what it had before evchan's runtime started. Measured in
/// the VM (KiB): 2,304 to 3,712 in 12 runs; with the runtime's trims off
/// (`EVCHAN_MALLOC_TRIM=0`: as before the runtime trimmed as it ends), 8,052 to 11,764 in 4.
const KEPT_KIB: u64 = 6144;

/// A client's shape: [`BURST`] connections with the default `Config`, [`IN_FLIGHT`] connects
/// at once, each echoing one message, all held open, then all closed, so that evchan's
/// runtime ends with its last connection (the listener is in this process too, and goes with
/// the test's tokio runtime). Checks the resident memory a connection end adds while they are
/// open ([`KIB_PER_END`]), and that the process gives the burst's memory back without calling
/// `malloc_trim` itself: once evchan's runtime has ended, its RSS is within [`KEPT_KIB`] of
/// what it was before (without huge pages: [`support::no_huge_pages`]). Descriptors are
/// [`a_thousand_connections_need_no_descriptors_and_give_their_memory_back`]'s part.
#[test]
fn a_burst_costs_what_it_holds_and_its_memory_comes_back_as_the_runtime_ends() {
    require_device!();
    support::init_log();
    support::no_huge_pages();
    wait_runtime_gone();
    let rss_before = rss_kib();
    let mut rss_open = 0;
    in_fresh_runtime(async {
        let addr = v4(port(8));
        let server = echo_server(addr, Config::new().backlog(BURST as u32)).await;
        let conns = connect_all(addr, &Config::new(), BURST).await;
        rss_open = rss_kib();
        close_all(conns).await;
        server.abort();
    });
    // `in_fresh_runtime` returned once evchan's runtime threads were gone: its last trim
    // is done.
    let rss_after = rss_kib();
    let per_end = rss_open.saturating_sub(rss_before) / (2 * BURST as u64);
    eprintln!(
        "RSS before {rss_before} KiB, {BURST} open {rss_open} KiB ({per_end} KiB per end), \
         after {rss_after} KiB"
    );
    assert!(
        per_end <= KIB_PER_END,
        "{per_end} KiB per connection end, more than {KIB_PER_END}"
    );
    assert!(
        rss_after <= rss_before + KEPT_KIB,
        "RSS {rss_after} KiB once the burst closed and the runtime ended, {rss_before} KiB \
         before: kept {} KiB, more than {KEPT_KIB}",
        rss_after - rss_before
    );
}

/// Connections of [`one_of_a_hundred_lost_mid_traffic_disturbs_no_other`].
const HUNDRED: usize = 100;
/// Round trips each of them makes.
const TRIPS: u32 = 100;
/// The one that is lost.
const VICTIM: usize = 37;

/// One of 100 connections on the same shards (and so the same shared completion channels) is
/// lost mid-traffic: its QP is forced into the error state (as a fatal error would put it)
/// once a quarter of all the round trips are done. It alone ends, with `Lost::QpError`, on its
/// next call; the 99 others complete every round trip, each message intact and in order, and
/// close cleanly (`close` returns `Ok`: nothing they sent was lost).
#[test]
fn one_of_a_hundred_lost_mid_traffic_disturbs_no_other() {
    require_device!();
    let config = Config::new().shards(2).max_message(256).backlog(256);
    in_fresh_runtime(async move {
        let addr = v4(port(4));
        let server = echo_server(addr, config.clone()).await;
        let trips = Arc::new(AtomicU32::new(0));
        let mut set = tokio::task::JoinSet::new();
        for i in 0..HUNDRED {
            let (config, trips) = (config.clone(), trips.clone());
            set.spawn(async move {
                let mut conn = step(
                    "connect",
                    Connection::builder().config(config).connect(addr),
                )
                .await
                .unwrap_or_else(|e| panic!("connection {i}: {e}"));
                for t in 0..TRIPS {
                    if i == VICTIM && trips.load(Ordering::Relaxed) >= (HUNDRED as u32 * TRIPS) / 4
                    {
                        conn.__force_qp_error().unwrap();
                        let r = match step("victim's send", conn.send("after")).await {
                            Err(e) => Err(e),
                            Ok(()) => step("victim's recv", conn.recv()).await.map(|_| ()),
                        };
                        assert!(
                            matches!(r, Err(Error::ConnectionLost(evchan::Lost::QpError { .. }))),
                            "the victim's end: {r:?}"
                        );
                        return false;
                    }
                    let m = msg(i as u32, t, 0);
                    step("send", conn.send(m.clone()))
                        .await
                        .unwrap_or_else(|e| panic!("connection {i}, trip {t}: {e}"));
                    let back = step("recv", conn.recv())
                        .await
                        .unwrap_or_else(|e| panic!("connection {i}, trip {t}: {e}"))
                        .unwrap_or_else(|| panic!("connection {i}: the end at trip {t}"));
                    assert_eq!(back, m, "connection {i}, trip {t}");
                    trips.fetch_add(1, Ordering::Relaxed);
                }
                assert!(
                    i != VICTIM,
                    "the victim finished before a quarter of the trips"
                );
                step("close", conn.close())
                    .await
                    .unwrap_or_else(|e| panic!("connection {i}'s close: {e}"));
                true
            });
        }
        let mut whole = 0;
        while let Some(r) = set.join_next().await {
            whole += usize::from(r.unwrap());
        }
        assert_eq!(whole, HUNDRED - 1, "connections that completed every trip");
        server.abort();
    });
}
