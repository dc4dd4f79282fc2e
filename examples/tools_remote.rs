//! One-sided operations over the async `evchan` API, the counterpart of perftest's
//! `ib_read_lat -R`, `ib_atomic_lat -R`, `ib_write_bw -R` and `ib_read_bw -R`.
//!
//! ```text
//! tools_remote --serve IP:PORT [--size BYTES]
//! tools_remote --connect IP:PORT --mode read-lat|atomic-lat|write-lat|read-bw|write-bw
//!              [--size BYTES] [--iters N] [--warmup N] [--window W] [--busy-poll-us N]
//! ```
//!
//! The server accepts one connection, exposes `--size` bytes (at least 8) for reads, writes
//! and atomics, sends the descriptor, and waits for the peer's close. The client connects
//! (retrying while nobody listens yet), then:
//!
//! - `read-lat`, `atomic-lat`, `write-lat`: `--warmup` untimed, then `--iters` timed
//!   operations one at a time (a READ of `--size` bytes, a fetch-and-add, a WRITE of `--size`
//!   bytes), each from its post to its completion, as `ib_read_lat` and `ib_atomic_lat` time
//!   theirs; the result line `@tools remote mode=M size=N stats=...` (µs);
//! - `read-bw`, `write-bw`: `--iters` operations of `--size` bytes with `--window` of them in
//!   flight at once (tasks on one connection), timed from the first post to the last
//!   completion; the result line `@tools remote mode=M size=N ops=K secs=S mb_per_s=B`
//!   (MB = 2^20 bytes, as perftest's `BW average[MB/sec]`).
//!
//! READs and WRITEs move their bytes from (into) registered buffers (`Connection::buffer`,
//! zero-copy, as perftest's do), one per operation in flight. Both sides run on a
//! current-thread tokio runtime. Without `--busy-poll-us` a waiting
//! operation sleeps on the connection's completion channel (event mode); with it, it polls
//! for that window first (`Config::busy_poll`; perftest's tools poll always).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use evchan::remote::{RemoteAtomic, RemoteBuf, RemoteReadWrite};
use evchan::{Buffer, Config, Connection, Error, Listener};

mod tools_support;
use tools_support::{emit, fail, us, Cli, Stats};

const PROGRAM: &str = "tools_remote";
const USAGE: &str = "usage: tools_remote --serve IP:PORT | --connect IP:PORT \
                     [--mode read-lat|atomic-lat|write-lat|read-bw|write-bw] [--size BYTES] \
                     [--iters N] [--warmup N] [--window W] [--busy-poll-us N]";
const CLI: Cli = Cli {
    program: PROGRAM,
    usage: USAGE,
};
const MODES: &[&str] = &["read-lat", "atomic-lat", "write-lat", "read-bw", "write-bw"];

struct Args {
    serve: Option<SocketAddr>,
    connect: Option<SocketAddr>,
    mode: String,
    size: usize,
    iters: usize,
    warmup: usize,
    window: usize,
    busy_poll: Option<Duration>,
}

fn parse_args() -> Args {
    let mut a = Args {
        serve: None,
        connect: None,
        mode: "read-lat".into(),
        size: 64,
        iters: 1000,
        warmup: 16,
        window: 16,
        busy_poll: None,
    };
    for (flag, value) in CLI.pairs() {
        let v = value.as_str();
        match flag.as_str() {
            "--serve" => a.serve = Some(CLI.addr(&flag, v)),
            "--connect" => a.connect = Some(CLI.peer(&flag, v)),
            "--mode" if MODES.contains(&v) => a.mode = value,
            "--mode" => CLI.error(format_args!("--mode: not one of {MODES:?}: `{v}`")),
            "--size" => a.size = CLI.number(&flag, v, 1..=1 << 20),
            "--iters" => a.iters = CLI.number(&flag, v, 1..=10_000_000),
            "--warmup" => a.warmup = CLI.number(&flag, v, 0..=10_000_000),
            "--window" => a.window = CLI.number(&flag, v, 1..=1024),
            "--busy-poll-us" => {
                a.busy_poll = Some(Duration::from_micros(CLI.number(&flag, v, 1..=u64::MAX)));
            }
            _ => CLI.error(format_args!("unknown argument `{flag}`")),
        }
    }
    if a.serve.is_some() == a.connect.is_some() {
        CLI.error("either --serve or --connect is needed, not both");
    }
    a
}

fn main() -> ExitCode {
    let a = parse_args();
    if !tools_support::device_present(PROGRAM) {
        return ExitCode::SUCCESS;
    }
    // A send queue entry (slot) per operation of the window; the bytes move from registered
    // buffers, so the messages keep their default size.
    let depth = u32::try_from(a.window.max(16)).expect("at most 1024");
    let config = Config::new().send_depth(depth).busy_poll(a.busy_poll);
    let rt = tokio::runtime::Builder::new_current_thread()
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

async fn serve(addr: SocketAddr, config: Config, a: &Args) -> Result<(), Error> {
    let listener = Listener::bind(addr, config).await?;
    let mut conn = listener.accept().await?.accept(&[]).await?;
    let exposed = conn.expose::<RemoteReadWrite>(a.size)?;
    let word = conn.expose::<RemoteAtomic>(8)?;
    conn.send(exposed.descriptor().to_bytes()).await?;
    conn.send(word.descriptor().to_bytes()).await?;
    while conn.recv().await?.is_some() {}
    drop((exposed, word));
    conn.close().await
}

/// The peer's exposed bytes and word.
struct There {
    bytes: RemoteBuf<RemoteReadWrite>,
    word: RemoteBuf<RemoteAtomic>,
}

/// One operation of `mode` on `there`, READs and WRITEs from the registered `buf` (zero-copy,
/// as perftest's), which comes back.
async fn op(conn: &Connection, mode: &str, there: &There, buf: Buffer) -> Result<Buffer, Error> {
    Ok(match mode {
        "read-lat" | "read-bw" => conn.read_buffer(&there.bytes, 0, buf).await?,
        "write-lat" | "write-bw" => conn.write_buffer(&there.bytes, 0, buf).await?,
        _ => {
            conn.fetch_add(&there.word, 0, 1).await?;
            buf
        }
    })
}

async fn client(addr: SocketAddr, config: Config, a: &Args) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut conn = tools_support::connect_when_listening(addr, &config, deadline).await?;
    let bytes = conn.recv().await?.ok_or(Error::PeerClosed)?;
    let word = conn.recv().await?.ok_or(Error::PeerClosed)?;
    let there = There {
        bytes: RemoteBuf::from_bytes(&bytes)?,
        word: RemoteBuf::from_bytes(&word)?,
    };
    let mut buf = conn.buffer(a.size)?;
    buf.fill(7);
    let mode = a.mode.as_str();
    let poll = if a.busy_poll.is_some() {
        "busy"
    } else {
        "event"
    };
    let mut fields = vec![
        ("mode", mode.to_owned()),
        ("poll", poll.to_owned()),
        ("size", a.size.to_string()),
    ];
    let conn = if mode.ends_with("-lat") {
        for _ in 0..a.warmup {
            buf = op(&conn, mode, &there, buf).await?;
        }
        let mut samples = Vec::with_capacity(a.iters);
        for _ in 0..a.iters {
            let t = Instant::now();
            buf = op(&conn, mode, &there, buf).await?;
            samples.push(us(t.elapsed()));
        }
        let stats = Stats::of(&samples).expect("at least one sample");
        fields.push(("stats", stats.fields()));
        conn
    } else {
        // A buffer per task, registered before the clock starts.
        let mut bufs = vec![buf];
        while bufs.len() < a.window {
            bufs.push(conn.buffer(a.size)?);
        }
        let (conn, there) = (Arc::new(conn), Arc::new(there));
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (w, mut buf) in bufs.into_iter().enumerate() {
            let n = a.iters / a.window + usize::from(w < a.iters % a.window);
            let (conn, there) = (Arc::clone(&conn), Arc::clone(&there));
            let mode = a.mode.clone();
            tasks.spawn(async move {
                for _ in 0..n {
                    buf = op(&conn, &mode, &there, buf).await?;
                }
                Ok::<_, Error>(())
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.map_err(|e| Error::Io(std::io::Error::other(e)))??;
        }
        let secs = start.elapsed().as_secs_f64();
        let mb = (a.iters * a.size) as f64 / f64::from(1 << 20);
        fields.push(("ops", a.iters.to_string()));
        fields.push(("secs", format!("{secs:.3}")));
        fields.push(("mb_per_s", format!("{:.2}", mb / secs)));
        Arc::try_unwrap(conn).map_err(|_| Error::Io(std::io::Error::other("still shared")))?
    };
    emit("remote", &fields);
    conn.close().await
}
