//! An RDMA echo client on the async `evchan` API: opens N connections one after another,
//! then runs M ping-pongs on each (all connections at once, one task each) and prints the
//! connection setup times, the round-trip latency percentiles and the message rate.
//!
//! ```text
//! echo_client [--addr IP:PORT] [--busy-poll-us N] [--current-thread] [--warm-up] [--connections N] [--messages M] [--size BYTES]
//! ```
//!
//! Defaults: 169.254.77.1:7471 (the soft-RoCE VM's address), 4 connections, 250 messages of
//! 64 bytes each. Start `echo_server` first (the first connect waits up to 10 s for it to
//! listen); `cargo xtask demo` runs both in the VM. `--warm-up` first makes one connection,
//! untimed, and closes it: it starts evchan's runtime (devices, shard threads), so that the
//! setup times are those of connections to a running library (the server then serves one more).
//!
//! The application's tasks run on tokio's multi-thread runtime; `--current-thread` runs them on
//! a current-thread runtime instead (to compare: docs/BENCHMARKS.md).

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use evchan::{Config, Connection, Error};
use hdrhistogram::Histogram;

struct Args {
    addr: SocketAddr,
    busy_poll_us: Option<u64>,
    current_thread: bool,
    warm_up: bool,
    connections: usize,
    messages: u64,
    size: usize,
}

const NAME: &str = "echo_client";

const USAGE: &str =
    "usage: echo_client [--addr IP:PORT] [--busy-poll-us N] [--current-thread] [--warm-up] [--connections N] [--messages M] [--size BYTES]";

/// At most this many connections: each takes a local port.
const MAX_CONNECTIONS: usize = 65_535;

/// `n`, the value of `flag`, if within `range`; else the error naming the flag.
fn within<T: PartialOrd + std::fmt::Display>(
    flag: &str,
    n: T,
    range: RangeInclusive<T>,
) -> Result<T, String> {
    if n < *range.start() {
        Err(format!(
            "{flag} must be at least {}, not {n}\n{USAGE}",
            range.start()
        ))
    } else if n > *range.end() {
        Err(format!(
            "{flag} must be at most {}, not {n}\n{USAGE}",
            range.end()
        ))
    } else {
        Ok(n)
    }
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        addr: SocketAddr::from(([169, 254, 77, 1], 7471)),
        busy_poll_us: None,
        current_thread: false,
        warm_up: false,
        connections: 4,
        messages: 250,
        size: 64,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        let bad = |e: &dyn std::fmt::Display| format!("{flag}: {e}\n{USAGE}");
        match flag.as_str() {
            "--addr" => args.addr = value()?.parse().map_err(|e| bad(&e))?,
            "--busy-poll-us" => args.busy_poll_us = Some(value()?.parse().map_err(|e| bad(&e))?),
            "--current-thread" => args.current_thread = true,
            "--warm-up" => args.warm_up = true,
            "--connections" => {
                let n = value()?.parse().map_err(|e| bad(&e))?;
                args.connections = within(&flag, n, 1..=MAX_CONNECTIONS)?;
            }
            "--messages" => {
                let n = value()?.parse().map_err(|e| bad(&e))?;
                args.messages = within(&flag, n, 1..=u64::MAX)?;
            }
            // The largest `max_message`.
            "--size" => {
                let n = value()?.parse().map_err(|e| bad(&e))?;
                args.size = within(&flag, n, 1..=u32::MAX as usize)?;
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    if args.addr.port() == 0 {
        return Err(format!("--addr: port 0 cannot be connected to\n{USAGE}"));
    }
    // The round trips in all.
    if args.messages.checked_mul(args.connections as u64).is_none() {
        return Err(format!("--messages × --connections is too large\n{USAGE}"));
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // A connection's messages are posted and reaped in the task that sends or receives them;
    // evchan's shard threads run only the rdma_cm control path (connect, accept, close).
    let rt = if args.current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build();
    match rt {
        Ok(rt) => rt.block_on(serve(args)),
        Err(e) => {
            eprintln!("{NAME}: no tokio runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> ExitCode {
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo_client: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<(), Error> {
    // Messages above 4 KiB need larger receive slots here, and on the server (--max-message).
    let config = Config::new()
        .max_message(u32::try_from(args.size.max(4096)).unwrap_or(u32::MAX))
        .busy_poll(args.busy_poll_us.map(std::time::Duration::from_micros));

    // Setup: one connection after another, each timed from its connect to its ESTABLISHED.
    let mut waited = 0;
    let mut warm = None;
    if args.warm_up {
        let (conn, took, rejected) = connect(args.addr, &config).await?;
        conn.close().await?;
        warm = Some(took);
        waited += rejected;
    }
    let mut conns = Vec::with_capacity(args.connections);
    let mut setup = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let (conn, took, rejected) = connect(args.addr, &config).await?;
        conns.push(conn);
        setup.push(took);
        waited += rejected;
    }
    let first = setup[0];
    setup.sort();
    println!(
        "echo_client: {} connections to {}, setup per connection: min {}, median {}, max {}",
        args.connections,
        args.addr,
        ms(setup[0]),
        ms(median(&setup)),
        ms(setup[setup.len() - 1]),
    );
    if let Some(took) = warm {
        println!(
            "echo_client: (a warm-up connection before them, {}, started evchan's runtime: \
             devices and shard threads; not counted)",
            ms(took),
        );
    } else if waited == 0 {
        println!(
            "echo_client: (the first connection, {}, also started evchan's runtime: devices \
             and shard threads)",
            ms(first),
        );
    } else {
        println!(
            "echo_client: (before the server listened, {waited} attempts were rejected with \
             reason 8; not counted)"
        );
    }

    // Ping-pong: on every connection at once, one message in flight per connection.
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for conn in conns {
        let (messages, size) = (args.messages, args.size);
        tasks.spawn(ping_pong(conn, messages, size));
    }
    let mut rtt = Histogram::<u64>::new(3).expect("3 significant figures are valid");
    while let Some(joined) = tasks.join_next().await {
        let h = joined.expect("a ping-pong task panicked")?;
        rtt.add(&h).expect("auto-resizing histograms add");
    }
    let elapsed = start.elapsed();
    let total = args.messages * args.connections as u64;
    println!(
        "echo_client: {total} round trips of {} bytes ({} × {}) in {:.2} s",
        args.size,
        args.connections,
        args.messages,
        elapsed.as_secs_f64(),
    );
    println!(
        "echo_client: round-trip latency p50 {}, p99 {}, p99.9 {} (min {}, max {})",
        us(rtt.value_at_quantile(0.5)),
        us(rtt.value_at_quantile(0.99)),
        us(rtt.value_at_quantile(0.999)),
        us(rtt.min()),
        us(rtt.max()),
    );
    println!(
        "echo_client: {:.0} messages/s echoed ({} connections, one message in flight each)",
        total as f64 / elapsed.as_secs_f64(),
        args.connections,
    );
    Ok(())
}

/// Connects and returns the time from the connect call to `ESTABLISHED`. While nobody listens
/// yet (the server is still starting: REJECTED, reason 8), it tries again for up to 10 s; only
/// the attempt that succeeds is timed. Also returns how many attempts were rejected.
async fn connect(addr: SocketAddr, config: &Config) -> Result<(Connection, Duration, u32), Error> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut rejected = 0;
    loop {
        let start = Instant::now();
        match Connection::builder()
            .config(config.clone())
            .connect(addr)
            .await
        {
            Ok(conn) => return Ok((conn, start.elapsed(), rejected)),
            Err(Error::Rejected { reason, .. }) if reason.0 == 8 && Instant::now() < deadline => {
                rejected += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `messages` round trips of `size` bytes, each checked; the round-trip times in ns.
async fn ping_pong(
    mut conn: Connection,
    messages: u64,
    size: usize,
) -> Result<Histogram<u64>, Error> {
    let mut rtt = Histogram::<u64>::new(3).expect("3 significant figures are valid");
    let mut buf = vec![0xa5u8; size];
    for i in 0..messages {
        // The sequence number in the first bytes: an echo out of order would not compare equal.
        let seq = i.to_be_bytes();
        let n = size.min(seq.len());
        buf[..n].copy_from_slice(&seq[..n]);
        let start = Instant::now();
        conn.send(&buf).await?; // copied into a registered send slot: the buffer stays ours
        let Some(back) = conn.recv().await? else {
            return Err(Error::PeerClosed);
        };
        let took = start.elapsed();
        assert_eq!(back, buf, "the echo of message {i} differs");
        drop(back); // its receive slot is posted again and its credit returned
        rtt.record(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX))
            .expect("auto-resizing histograms record any value");
    }
    conn.close().await?;
    Ok(rtt)
}

/// The median of sorted durations (the mean of the middle two for an even count).
fn median(sorted: &[Duration]) -> Duration {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn us(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1e3)
}
