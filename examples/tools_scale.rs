//! Many connections at once, for `cargo xtask bench --scale` (server in one VM, clients in the
//! other): what a connection costs in memory and descriptors on both sides, how fast they are
//! set up with many connects in flight, and what is left once they closed.
//!
//! ```text
//! tools_scale --serve IP:PORT [--memory-budget-mib M] [--settle-ms S]
//! tools_scale --connect IP:PORT --connections N [--in-flight K] [--rss-limit-mib R] [--settle-ms S]
//! tools_scale --connect IP:PORT --ask cmtime|quit
//! ```
//!
//! Both sides: a multi-thread tokio runtime of two workers and a default [`Config`] (4 KiB
//! messages, 16 + 16 slots), but for the server's `--memory-budget-mib`
//! ([`Config::memory_budget`]: beyond it, requests are rejected with a typed busy reject).
//!
//! - The server echoes each connection's messages until the peer closes. Every 200 ms it
//!   samples its resident memory (`VmRSS`) and open descriptors; once its connections have
//!   all gone for `--settle-ms` (default 3,000) after a burst of at least 100, it prints
//!   `@tools scale-server peak=N rss_before_kib= rss_peak_kib= rss_after_kib=
//!   anon_huge_after_kib= fds_before=
//!   fds_peak= fds_after=` (before: at the server's start, its listener bound). While connections
//!   are open, each sample whose count changed is a line `@tools scale-sample side=server
//!   open=N rss_kib=X`.
//! - The client opens `--connections` connections with at most `--in-flight` (default 64)
//!   connects at once, each echoing one 64-byte message, and holds them all; it starts no new
//!   connect once its own resident memory passes `--rss-limit-mib` (default: none). Then it
//!   closes them all at once and waits `--settle-ms` (default 3,000), with a line `@tools
//!   scale-after ms= rss_kib=` per sample (ms: since the close began). Then one line:
//!   `@tools scale-client asked=N opened=M busy=B failed=F stopped=0|1 setup_s= rate_per_s=
//!   close_s= rss_before_kib= rss_open_kib= rss_after_kib= heap_after_kib= anon_huge_after_kib=
//!   fds_before= fds_open= fds_after=`
//!   (before: after one connection opened and closed, which starts evchan's runtime, and that
//!   runtime's threads ended; `busy`: typed busy rejects, by cause in `busy_causes=`),
//!   and its own `scale-sample side=client` lines while opening.
//! - `--ask cmtime`: the server (re)starts `cmtime -b` on its address, and answers once that
//!   listens, so the client's next `cmtime -s` finds a fresh server (cmtime 44's server
//!   serves one client run well). `--ask quit`: the server stops its `cmtime` and exits 0.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use evchan::{Config, Connection, Error, Listener};

mod tools_support;
use tools_support::{connect_when_listening, emit, fail, Cli};

const PROGRAM: &str = "tools_scale";
const USAGE: &str = "usage: tools_scale --serve IP:PORT [--memory-budget-mib M] [--settle-ms S] \
                     | --connect IP:PORT (--connections N [--in-flight K] [--rss-limit-mib R] \
                     [--settle-ms S] | --ask cmtime|quit)";
const CLI: Cli = Cli {
    program: PROGRAM,
    usage: USAGE,
};
/// At most this many connections: each takes a local port.
const MAX_CONNECTIONS: usize = 65_535;
/// How often each side samples its memory and descriptors.
const SAMPLE: Duration = Duration::from_millis(200);
/// A burst the server reports has at least this many connections (the `--ask` ones do not).
const BURST: usize = 100;
/// The echoed message.
const MESSAGE: &[u8; 64] = &[0x5a; 64];

#[derive(Default)]
struct Args {
    serve: Option<SocketAddr>,
    connect: Option<SocketAddr>,
    connections: Option<usize>,
    in_flight: usize,
    rss_limit_kib: Option<u64>,
    memory_budget_mib: Option<u64>,
    settle: Duration,
    ask: Option<String>,
}

/// The command line, checked; a bad one exits with the usage (status 2).
fn parse_args() -> Args {
    let mut a = Args {
        in_flight: 64,
        settle: Duration::from_millis(3000),
        ..Args::default()
    };
    for (flag, value) in CLI.pairs() {
        let v = value.as_str();
        match flag.as_str() {
            "--serve" => a.serve = Some(CLI.addr(&flag, v)),
            "--connect" => a.connect = Some(CLI.peer(&flag, v)),
            "--connections" => a.connections = Some(CLI.number(&flag, v, 1..=MAX_CONNECTIONS)),
            "--in-flight" => a.in_flight = CLI.number(&flag, v, 1..=MAX_CONNECTIONS),
            "--rss-limit-mib" => a.rss_limit_kib = Some(CLI.number(&flag, v, 1..=1 << 30) << 10),
            "--memory-budget-mib" => a.memory_budget_mib = Some(CLI.number(&flag, v, 1..=1 << 30)),
            "--settle-ms" => a.settle = Duration::from_millis(CLI.number(&flag, v, 0..=600_000)),
            "--ask" if v == "cmtime" || v == "quit" => a.ask = Some(value),
            "--ask" => CLI.error(format_args!("--ask: cmtime or quit, not `{v}`")),
            _ => CLI.error(format_args!("unknown argument `{flag}`")),
        }
    }
    match (&a.serve, &a.connect) {
        (Some(_), None) if a.connections.is_some() || a.ask.is_some() => {
            CLI.error("--connections and --ask go with --connect")
        }
        (Some(_), None) => {}
        (None, Some(_)) if a.memory_budget_mib.is_some() => {
            CLI.error("--memory-budget-mib goes with --serve")
        }
        (None, Some(_)) if a.connections.is_some() == a.ask.is_some() => {
            CLI.error("--connect needs either --connections or --ask")
        }
        (None, Some(_)) => {}
        _ => CLI.error("either --serve or --connect is needed, not both"),
    }
    a
}

fn main() -> ExitCode {
    let a = parse_args();
    if !tools_support::device_present(PROGRAM) {
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(PROGRAM, format!("tokio: {e}")));
    let result = match (a.serve, a.connect, &a.ask) {
        (Some(addr), None, _) => rt.block_on(serve(addr, &a)),
        (None, Some(addr), Some(what)) => rt.block_on(ask(addr, what)),
        (None, Some(addr), None) => rt.block_on(client(addr, &a)),
        _ => fail(PROGRAM, USAGE),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(PROGRAM, e),
    }
}

/// This process's resident memory (`VmRSS`), in KiB.
fn rss_kib() -> u64 {
    proc_kib("/proc/self/status", "VmRSS:")
        .unwrap_or_else(|| fail(PROGRAM, "no VmRSS in /proc/self/status"))
}

/// This process's anonymous memory in transparent huge pages, in KiB (0 when unknown).
fn anon_huge_kib() -> u64 {
    proc_kib("/proc/self/smaps_rollup", "AnonHugePages:").unwrap_or(0)
}

/// The KiB figure of the line starting with `key` in `file`.
fn proc_kib(file: &str, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(file).ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// This process's open descriptors (but the one that lists them).
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1))
        .unwrap_or_else(|e| fail(PROGRAM, format!("/proc/self/fd: {e}")))
}

/// Waits (at most 10 s) until no thread of evchan's runtime is left: it ends once its last
/// connection is gone, and frees what it held as it does.
async fn runtime_gone() {
    let evchan_threads = || {
        std::fs::read_dir("/proc/self/task").map_or(0, |d| {
            d.filter_map(Result::ok)
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("evchan-"))
                })
                .count()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while evchan_threads() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Memory and descriptors over a burst, sampled.
#[derive(Debug, Clone, Copy, Default)]
struct Burst {
    peak: usize,
    rss_before: u64,
    rss_peak: u64,
    fds_before: usize,
    fds_peak: usize,
}

/// The server's sampler: a line per sample whose connection count changed, and a burst's
/// report once its connections have gone for `settle`.
fn sample_server(open: &AtomicUsize, settle: Duration) {
    let mut burst: Option<Burst> = None;
    // Every burst is measured from the server's start (its listener bound).
    let (rss_start, fds_start) = (rss_kib(), fds());
    let mut last = 0;
    let mut idle_since = Instant::now();
    loop {
        std::thread::sleep(SAMPLE);
        let n = open.load(Ordering::Relaxed);
        let (rss, fd) = (rss_kib(), fds());
        if n > 0 {
            let b = burst.get_or_insert(Burst {
                rss_before: rss_start,
                fds_before: fds_start,
                ..Burst::default()
            });
            b.peak = b.peak.max(n);
            b.rss_peak = b.rss_peak.max(rss);
            b.fds_peak = b.fds_peak.max(fd);
            idle_since = Instant::now();
            if n != last {
                emit(
                    "scale-sample",
                    &[
                        ("side", "server".into()),
                        ("open", n.to_string()),
                        ("rss_kib", rss.to_string()),
                    ],
                );
            }
        } else if idle_since.elapsed() >= settle {
            if let Some(b) = burst.take().filter(|b| b.peak >= BURST) {
                emit(
                    "scale-server",
                    &[
                        ("peak", b.peak.to_string()),
                        ("rss_before_kib", b.rss_before.to_string()),
                        ("rss_peak_kib", b.rss_peak.to_string()),
                        ("rss_after_kib", rss.to_string()),
                        ("anon_huge_after_kib", anon_huge_kib().to_string()),
                        ("fds_before", b.fds_before.to_string()),
                        ("fds_peak", b.fds_peak.to_string()),
                        ("fds_after", fd.to_string()),
                    ],
                );
            }
        }
        last = n;
    }
}

/// The server: an echo task per connection; `--ask`'s requests on their own connections.
async fn serve(addr: SocketAddr, a: &Args) -> Result<(), Error> {
    let mut config = Config::new();
    if let Some(mib) = a.memory_budget_mib {
        config = config.memory_budget(mib << 20);
    }
    let listener = Listener::bind(addr, config).await?;
    let open = Arc::new(AtomicUsize::new(0));
    let sampled = Arc::clone(&open);
    let settle = a.settle;
    std::thread::spawn(move || sample_server(&sampled, settle));
    let cmtime = Arc::new(Mutex::new(None::<std::process::Child>));
    let quit = Arc::new(AtomicBool::new(false));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let incoming = tokio::select! {
            i = listener.accept() => i?,
            _ = done_rx.recv() => break,
        };
        let (open, cmtime, quit, done) = (
            Arc::clone(&open),
            Arc::clone(&cmtime),
            Arc::clone(&quit),
            done_tx.clone(),
        );
        tokio::spawn(async move {
            open.fetch_add(1, Ordering::Relaxed);
            let served = async {
                let mut conn = incoming.accept(&[]).await?;
                while let Some(msg) = conn.recv().await? {
                    match &msg[..] {
                        b"cmtime" => {
                            let ready = restart_cmtime(&cmtime, addr.ip()).await;
                            conn.send(Bytes::from(ready)).await?;
                        }
                        b"quit" => {
                            stop_cmtime(&cmtime);
                            quit.store(true, Ordering::Relaxed);
                            conn.send(Bytes::from_static(b"bye")).await?;
                        }
                        _ => conn.send(msg).await?,
                    }
                }
                conn.close().await
            };
            let r: Result<(), Error> = served.await;
            open.fetch_sub(1, Ordering::Relaxed);
            if let Err(e) = r {
                eprintln!("{PROGRAM}: a connection: {e}");
            }
            if quit.load(Ordering::Relaxed) {
                let _ = done.send(()).await;
            }
        });
    }
    Ok(())
}

/// Stops the `cmtime -b` started last, if any.
fn stop_cmtime(cmtime: &Mutex<Option<std::process::Child>>) {
    if let Some(mut child) = cmtime.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A fresh `cmtime -b` on `ip`: `ready` once it listens (`rdma resource show cm_id` lists its
/// listening id), else what went wrong. (In this task, without a thread of its own: a new
/// thread would get a malloc arena of its own, and the server's memory between bursts would
/// grow with it.)
async fn restart_cmtime(
    cmtime: &Mutex<Option<std::process::Child>>,
    ip: std::net::IpAddr,
) -> String {
    stop_cmtime(cmtime);
    let bind = match ip {
        std::net::IpAddr::V6(v6) if v6.segments()[0] == 0xfe80 => {
            // cmtime takes the scope as `%eth0`-like or numeric: numeric it is.
            format!("{v6}%{}", scope_of(ip))
        }
        ip => ip.to_string(),
    };
    let child = std::process::Command::new("cmtime")
        .args(["-b", &bind])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => return format!("cmtime: {e}"),
    };
    *cmtime.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
    for _ in 0..100 {
        let listed = std::process::Command::new("rdma")
            .args(["resource", "show", "cm_id"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if listed
            .lines()
            .any(|l| l.contains("state LISTEN") && l.contains("comm cmtime"))
        {
            return "ready".into();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    "cmtime did not listen within 10 s".into()
}

/// The scope id the server's address came with (`--serve [fe80::…%N]:PORT`).
fn scope_of(ip: std::net::IpAddr) -> u32 {
    let arg = std::env::args()
        .skip_while(|a| a != "--serve")
        .nth(1)
        .unwrap_or_default();
    match (ip, arg.parse::<SocketAddr>()) {
        (std::net::IpAddr::V6(_), Ok(SocketAddr::V6(a))) => a.scope_id(),
        _ => 0,
    }
}

/// `--ask`: one request on a connection of its own, and the server's answer.
async fn ask(addr: SocketAddr, what: &str) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut conn = connect_when_listening(addr, &Config::new(), deadline).await?;
    conn.send(Bytes::copy_from_slice(what.as_bytes())).await?;
    let answer = conn.recv().await?.ok_or(Error::PeerClosed)?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    conn.close().await?;
    match (what, answer.as_str()) {
        ("cmtime", "ready") | ("quit", "bye") => Ok(()),
        _ => fail(PROGRAM, format!("--ask {what}: the server said `{answer}`")),
    }
}

/// One connection of the burst: connected, one message echoed.
async fn one(addr: SocketAddr, deadline: Instant) -> Result<Connection, Error> {
    let mut conn = connect_when_listening(addr, &Config::new(), deadline).await?;
    conn.send(Bytes::from_static(MESSAGE)).await?;
    match conn.recv().await? {
        Some(m) if m[..] == MESSAGE[..] => Ok(conn),
        Some(m) => fail(
            PROGRAM,
            format!("an echo of {} bytes came back wrong", m.len()),
        ),
        None => Err(Error::PeerClosed),
    }
}

/// The client: the burst, then its close.
async fn client(addr: SocketAddr, a: &Args) -> Result<(), Error> {
    let asked = a.connections.expect("checked by parse_args");
    let deadline = Instant::now() + Duration::from_secs(600);
    // One connection first, closed, and its runtime ended: what evchan leaves in a process
    // once its runtime ended is in the figures from before the burst, as it is in those
    // from after (the burst's runtime ends with its last connection).
    one(addr, deadline).await?.close().await?;
    runtime_gone().await;
    let (rss_before, fds_before) = (rss_kib(), fds());
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut conns = Vec::with_capacity(asked);
    let (mut busy, mut failed, mut stopped) = (Vec::new(), 0usize, false);
    let mut first_failure = None;
    let mut started = 0;
    let mut last_sample = Instant::now();
    let mut handle = |r: Result<Connection, Error>, conns: &mut Vec<Connection>| match r {
        Ok(c) => conns.push(c),
        Err(Error::Rejected {
            busy: Some(why), ..
        }) => busy.push(format!("{why:?}")),
        Err(e) => {
            failed += 1;
            first_failure.get_or_insert_with(|| e.to_string());
        }
    };
    loop {
        if last_sample.elapsed() >= SAMPLE {
            last_sample = Instant::now();
            let rss = rss_kib();
            emit(
                "scale-sample",
                &[
                    ("side", "client".into()),
                    ("open", conns.len().to_string()),
                    ("rss_kib", rss.to_string()),
                ],
            );
            if a.rss_limit_kib.is_some_and(|limit| rss > limit) {
                stopped = true;
            }
        }
        if started < asked && !stopped && tasks.len() < a.in_flight {
            started += 1;
            tasks.spawn(one(addr, deadline));
            continue;
        }
        match tasks.join_next().await {
            Some(r) => handle(r.unwrap_or_else(|e| fail(PROGRAM, e)), &mut conns),
            None => break,
        }
    }
    let setup = start.elapsed();
    let (rss_open, fds_open) = (rss_kib(), fds());
    let opened = conns.len();
    let closing = Instant::now();
    let mut closes = tokio::task::JoinSet::new();
    for conn in conns {
        closes.spawn(conn.close());
    }
    while let Some(r) = closes.join_next().await {
        if let Err(e) = r.unwrap_or_else(|e| fail(PROGRAM, e)) {
            eprintln!("{PROGRAM}: a close: {e}");
        }
    }
    let close = closing.elapsed();
    let settled = Instant::now() + a.settle;
    while Instant::now() < settled {
        tokio::time::sleep(SAMPLE.min(settled - Instant::now())).await;
        emit(
            "scale-after",
            &[
                ("ms", closing.elapsed().as_millis().to_string()),
                ("rss_kib", rss_kib().to_string()),
            ],
        );
    }
    let mut by_cause = std::collections::BTreeMap::<String, usize>::new();
    for why in busy.iter() {
        *by_cause.entry(why.clone()).or_default() += 1;
    }
    let causes: Vec<String> = by_cause.iter().map(|(k, n)| format!("{k}:{n}")).collect();
    if let Some(f) = &first_failure {
        eprintln!("{PROGRAM}: {failed} connection(s) failed; the first: {f}");
    }
    emit(
        "scale-client",
        &[
            ("asked", asked.to_string()),
            ("opened", opened.to_string()),
            ("busy", busy.len().to_string()),
            (
                "busy_causes",
                if causes.is_empty() {
                    "-".into()
                } else {
                    causes.join(",")
                },
            ),
            ("failed", failed.to_string()),
            ("stopped", u8::from(stopped).to_string()),
            ("setup_s", format!("{:.3}", setup.as_secs_f64())),
            (
                "rate_per_s",
                format!("{:.1}", opened as f64 / setup.as_secs_f64()),
            ),
            ("close_s", format!("{:.3}", close.as_secs_f64())),
            ("rss_before_kib", rss_before.to_string()),
            ("rss_open_kib", rss_open.to_string()),
            ("rss_after_kib", rss_kib().to_string()),
            // What the RSS after is made of: the allocator's bytes in use, and transparent
            // huge pages of anonymous memory.
            (
                "heap_after_kib",
                (evchan_sys::heap_in_use() / 1024).to_string(),
            ),
            ("anon_huge_after_kib", anon_huge_kib().to_string()),
            ("fds_before", fds_before.to_string()),
            ("fds_open", fds_open.to_string()),
            ("fds_after", fds().to_string()),
        ],
    );
    Ok(())
}
