//! One-way message throughput over the async `evchan` API, the counterpart of perftest's
//! `ib_send_bw -R -s SIZE [-q CONNS]` in `cargo xtask bench --tools`.
//!
//! ```text
//! tools_stream --serve IP:PORT [--conns K] [--size BYTES] [--count M] [--busy-poll-us N] [--depth D] [--workers W]
//! tools_stream --connect IP:PORT [--conns K] [--size BYTES] [--count M] [--busy-poll-us N] [--depth D] [--workers W] [--zero-copy B]
//! ```
//!
//! Both sides run on a multi-thread tokio runtime of two workers (what `#[tokio::main]` makes
//! on our 2-core machines; `--workers W` for W, 1 for a current-thread runtime; `--depth D`
//! sets `recv_depth` and `send_depth`) with a default [`Config`] (but for `max_message`, raised to the
//! size), a task per connection. The client makes `--conns` connections (default 1), then each
//! task sends `--count` messages of `--size` bytes (defaults 20,000 and 64) as fast as the
//! peer's credits let it: the window is always full, as `ib_send_bw`'s is. The server's task
//! receives and drops each message and, after the `--count`th, sends one byte back; the
//! client's clock runs from its first send to the last connection's reply. Without
//! `--busy-poll-us` a waiting `send` or `recv` sleeps on the connection's completion channel
//! (event mode, as `ib_send_bw -R -e`); with it, it polls for that window first
//! (`Config::busy_poll`; `ib_send_bw -R` polls always). With `--zero-copy B` each
//! connection's messages go from B registered buffers (`Connection::send_buffer`, no copy),
//! B sends in flight at once in the connection's task, each buffer back at its completion.
//! The result line: `@tools stream
//! mode=event|busy[-zc] conns=K size=N msgs=TOTAL secs=S msgs_per_s=R mb_per_s=B` (MB = 2^20
//! bytes, as perftest's `BW average[MB/sec]`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use evchan::{Buffer, Config, Connection, Error, Listener};

mod tools_support;
use tools_support::{emit, fail, Cli};

const PROGRAM: &str = "tools_stream";
const USAGE: &str = "usage: tools_stream --serve IP:PORT | --connect IP:PORT [--conns K] \
                     [--size BYTES] [--count M] [--busy-poll-us N] [--depth D] [--workers W] \
                     [--zero-copy B]";
const CLI: Cli = Cli {
    program: PROGRAM,
    usage: USAGE,
};
/// At most this many connections: each takes a local port.
const MAX_CONNS: usize = 65_535;
/// `Config`'s bound on `recv_depth` and `send_depth`.
const MAX_DEPTH: u32 = 8192;
/// At most this many runtime workers (threads).
const MAX_WORKERS: usize = 1024;

struct Args {
    serve: Option<SocketAddr>,
    connect: Option<SocketAddr>,
    conns: usize,
    size: usize,
    count: u64,
    busy_poll: Option<Duration>,
    depth: Option<u32>,
    workers: usize,
    /// Registered buffers per connection, for zero-copy sends.
    zero_copy: Option<usize>,
}

/// The command line, checked; a bad one exits with the usage (status 2).
fn parse_args() -> Args {
    let mut a = Args {
        serve: None,
        connect: None,
        conns: 1,
        size: 64,
        count: 20_000,
        busy_poll: None,
        depth: None,
        workers: 2,
        zero_copy: None,
    };
    for (flag, value) in CLI.pairs() {
        let v = value.as_str();
        match flag.as_str() {
            "--serve" => a.serve = Some(CLI.addr(&flag, v)),
            "--connect" => a.connect = Some(CLI.peer(&flag, v)),
            "--conns" => a.conns = CLI.number(&flag, v, 1..=MAX_CONNS),
            // The largest `max_message`.
            "--size" => a.size = CLI.number(&flag, v, 1..=u32::MAX as usize),
            "--count" => a.count = CLI.number(&flag, v, 1..=u64::MAX),
            "--depth" => a.depth = Some(CLI.number(&flag, v, 1..=MAX_DEPTH)),
            "--workers" => a.workers = CLI.number(&flag, v, 1..=MAX_WORKERS),
            "--zero-copy" => a.zero_copy = Some(CLI.number(&flag, v, 1..=MAX_DEPTH as usize)),
            "--busy-poll-us" => {
                a.busy_poll = Some(Duration::from_micros(CLI.number(&flag, v, 1..=u64::MAX)));
            }
            _ => CLI.error(format_args!("unknown argument `{flag}`")),
        }
    }
    if a.serve.is_some() == a.connect.is_some() {
        CLI.error("either --serve or --connect is needed, not both");
    }
    // The result line's totals: messages, and their bytes.
    let total = a.count.checked_mul(a.conns as u64);
    if total.and_then(|m| m.checked_mul(a.size as u64)).is_none() {
        CLI.error("--count × --conns × --size is too large");
    }
    a
}

fn main() -> ExitCode {
    let a = parse_args();
    if !tools_support::device_present(PROGRAM) {
        return ExitCode::SUCCESS;
    }
    let max = u32::try_from(a.size).unwrap_or_else(|_| fail(PROGRAM, "--size: too large"));
    let config = Config::new()
        .max_message(max.max(64))
        .busy_poll(a.busy_poll);
    let config = match a.depth {
        Some(d) => config.recv_depth(d).send_depth(d),
        None => config,
    };
    let mut rt = if a.workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(a.workers);
        b
    };
    let rt = rt
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(PROGRAM, format!("tokio: {e}")));
    let result = match (a.serve, a.connect) {
        (Some(addr), None) => rt.block_on(serve(addr, config, &a)),
        (None, Some(addr)) => rt.block_on(client(addr, config, &a)),
        _ => fail(PROGRAM, USAGE),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(PROGRAM, e),
    }
}

/// Accepts `--conns` connections; each task receives `--count` messages, checks their size,
/// replies with one byte, then waits for the peer's close.
async fn serve(addr: SocketAddr, config: Config, a: &Args) -> Result<(), Error> {
    let listener = Listener::bind(addr, config).await?;
    let mut tasks = Vec::new();
    for _ in 0..a.conns {
        let mut conn = listener.accept().await?.accept(&[]).await?;
        let (count, size) = (a.count, a.size);
        tasks.push(tokio::spawn(async move {
            for i in 0..count {
                match conn.recv().await? {
                    Some(m) if m.len() == size => {}
                    Some(m) => fail(PROGRAM, format!("message {i}: {} bytes", m.len())),
                    None => return Err(Error::PeerClosed),
                }
            }
            conn.send(Bytes::from_static(b"!")).await?;
            while conn.recv().await?.is_some() {}
            conn.close().await
        }));
    }
    for t in tasks {
        t.await
            .unwrap_or_else(|e| fail(PROGRAM, format!("a task failed: {e}")))?;
    }
    Ok(())
}

/// One buffer's loop of sends.
type SendLoop<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>>;

/// `count` messages from `bufs` on `conn`, each buffer's sends one after the other, the
/// buffers' at once, all in this task (a completion wakes the task that waits, not another
/// thread).
async fn send_from_buffers(conn: &Connection, bufs: Vec<Buffer>, count: u64) -> Result<(), Error> {
    let n = bufs.len() as u64;
    let mut sends: Vec<SendLoop<'_>> = bufs
        .into_iter()
        .enumerate()
        .map(|(i, mut buf)| {
            Box::pin(async move {
                for _ in 0..count / n + u64::from((i as u64) < count % n) {
                    buf = conn.send_buffer(buf).await?;
                }
                Ok(())
            }) as SendLoop<'_>
        })
        .collect();
    // Every send loop, polled when the task wakes, until all are done (or one failed).
    std::future::poll_fn(|cx| {
        let mut failed = None;
        sends.retain_mut(|f| match f.as_mut().poll(cx) {
            Poll::Ready(r) => {
                failed = failed.take().or(r.err());
                false
            }
            Poll::Pending => true,
        });
        match failed {
            Some(e) => Poll::Ready(Err(e)),
            None if sends.is_empty() => Poll::Ready(Ok(())),
            None => Poll::Pending,
        }
    })
    .await
}

/// Connects `--conns` times (again while nobody listens yet), then times the tasks' sends up to
/// the last reply.
async fn client(addr: SocketAddr, config: Config, a: &Args) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut conns = Vec::new();
    while conns.len() < a.conns {
        conns.push(tools_support::connect_when_listening(addr, &config, deadline).await?);
    }
    let msg = Bytes::from(vec![0x5au8; a.size]);
    // Zero-copy: the buffers, registered before the clock starts.
    let mut buffers = Vec::new();
    for conn in &conns {
        let mut bufs = Vec::new();
        for _ in 0..a.zero_copy.unwrap_or(0) {
            let mut b = conn.buffer(a.size)?;
            b.fill(0x5a);
            bufs.push(b);
        }
        buffers.push(bufs);
    }
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .zip(buffers)
        .map(|(mut conn, bufs)| {
            let (msg, count) = (msg.clone(), a.count);
            tokio::spawn(async move {
                if bufs.is_empty() {
                    for _ in 0..count {
                        conn.send(msg.clone()).await?;
                    }
                } else {
                    send_from_buffers(&conn, bufs, count).await?;
                }
                match conn.recv().await? {
                    Some(reply) if reply[..] == b"!"[..] => {}
                    _ => return Err(Error::PeerClosed),
                }
                let took = start.elapsed();
                conn.close().await?;
                Ok::<_, Error>(took)
            })
        })
        .collect();
    let mut took = Duration::ZERO;
    for t in tasks {
        let t = t
            .await
            .unwrap_or_else(|e| fail(PROGRAM, format!("a task failed: {e}")))?;
        took = took.max(t);
    }
    let msgs = a.count * a.conns as u64;
    let secs = took.as_secs_f64();
    emit(
        "stream",
        &[
            (
                "mode",
                format!(
                    "{}{}",
                    if a.busy_poll.is_some() {
                        "busy"
                    } else {
                        "event"
                    },
                    if a.zero_copy.is_some() { "-zc" } else { "" }
                ),
            ),
            ("conns", a.conns.to_string()),
            ("size", a.size.to_string()),
            ("msgs", msgs.to_string()),
            ("secs", format!("{secs:.4}")),
            ("msgs_per_s", format!("{:.0}", msgs as f64 / secs)),
            (
                "mb_per_s",
                format!(
                    "{:.2}",
                    (msgs * a.size as u64) as f64 / secs / f64::from(1 << 20)
                ),
            ),
        ],
    );
    Ok(())
}
