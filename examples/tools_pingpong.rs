//! 64-byte ping-pong over the async `evchan` API, the counterpart of perftest's
//! `ib_send_lat -R` (busy-poll) and `ib_send_lat -R -e` (completion events) in
//! `cargo xtask bench --tools`.
//!
//! ```text
//! tools_pingpong --serve IP:PORT [--busy-poll-us N] [--multi-thread] [--spawn]
//! tools_pingpong --connect IP:PORT [--iters N] [--size BYTES] [--busy-poll-us N] [--warmup N]
//!                [--multi-thread] [--spawn]
//! tools_pingpong --layer core --serve IP:PORT | --connect IP:PORT [--iters N] [--size BYTES]
//!                [--busy-poll-us N] [--warmup N] [--tokio]
//! ```
//!
//! The server accepts one connection, sends every message back until the peer closes, and exits.
//! The client connects (retrying while nobody listens yet), runs `--warmup` untimed round trips
//! (default 16), then `--iters` timed ones (default 1000): `send`, then `recv` of the echo,
//! checked; one message in flight, as `ib_send_lat`. It prints the full round trip's
//! percentiles (`ib_send_lat` prints half of it; `cargo xtask bench --tools` doubles those).
//! Without `--busy-poll-us` a waiting `recv` sleeps on the connection's completion channel
//! (event mode); with it, it polls for that window before sleeping (`Config::busy_poll`).
//! Each side runs on a current-thread tokio runtime (driver `current`), or with
//! `--multi-thread` on a multi-thread one of two workers, as `#[tokio::main]` makes (driver
//! `multi`). With `--spawn` each side's loop runs in a task of its own (`tokio::spawn`) rather
//! than in `block_on`'s future, as an application that spawns a task per connection does. The
//! result line `@tools pingpong mode=event|busy driver=current|multi app=block_on|spawn size=N
//! stats=...` says which. `--layer core` runs the same ping-pong through `evchan-core` alone, one thread
//! per side and no runtime (`tools_pingpong_core`; `driver=core`; busy-poll with any
//! `--busy-poll-us`); with `--tokio` the same through a current-thread tokio runtime per side,
//! whose waits are tokio's (`driver=core-tokio`: the reach of an async API).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use evchan::{Config, Connection, Error, Listener};

mod tools_pingpong_core;
mod tools_support;
use tools_support::{emit, fail, us, Cli, Stats};

pub(crate) const PROGRAM: &str = "tools_pingpong";
const USAGE: &str = "usage: tools_pingpong --serve IP:PORT | --connect IP:PORT [--iters N] \
                     [--size BYTES] [--busy-poll-us N] [--warmup N] [--multi-thread] [--spawn] \
                     [--layer async|core] [--tokio]";
const CLI: Cli = Cli {
    program: PROGRAM,
    usage: USAGE,
};
/// At most this many timed round trips (each one's time is kept), and untimed ones.
const MAX_ITERS: usize = 10_000_000;

#[derive(Clone)]
struct Args {
    serve: Option<SocketAddr>,
    connect: Option<SocketAddr>,
    iters: usize,
    size: usize,
    warmup: usize,
    busy_poll: Option<Duration>,
    multi_thread: bool,
    spawn: bool,
    core: bool,
    tokio: bool,
}

/// The command line, checked; a bad one exits with the usage (status 2).
fn parse_args() -> Args {
    let mut a = Args {
        serve: None,
        connect: None,
        iters: 1000,
        size: 64,
        warmup: 16,
        busy_poll: None,
        multi_thread: false,
        spawn: false,
        core: false,
        tokio: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        // The flags without a value.
        match flag.as_str() {
            "--multi-thread" => {
                a.multi_thread = true;
                continue;
            }
            "--spawn" => {
                a.spawn = true;
                continue;
            }
            "--tokio" => {
                a.tokio = true;
                continue;
            }
            _ => {}
        }
        let value = it
            .next()
            .unwrap_or_else(|| CLI.error(format_args!("{flag} needs a value")));
        let v = value.as_str();
        match flag.as_str() {
            "--serve" => a.serve = Some(CLI.addr(&flag, v)),
            "--connect" => a.connect = Some(CLI.peer(&flag, v)),
            "--iters" => a.iters = CLI.number(&flag, v, 1..=MAX_ITERS),
            // The largest `max_message`.
            "--size" => a.size = CLI.number(&flag, v, 1..=u32::MAX as usize),
            "--warmup" => a.warmup = CLI.number(&flag, v, 0..=MAX_ITERS),
            "--layer" => match v {
                "async" => a.core = false,
                "core" => a.core = true,
                _ => CLI.error(format_args!("--layer: async or core, not `{v}`")),
            },
            "--busy-poll-us" => {
                a.busy_poll = Some(Duration::from_micros(CLI.number(&flag, v, 0..=u64::MAX)));
            }
            _ => CLI.error(format_args!("unknown argument `{flag}`")),
        }
    }
    if a.serve.is_some() == a.connect.is_some() {
        CLI.error("either --serve or --connect is needed, not both");
    }
    if a.tokio && !a.core {
        CLI.error("--tokio is for --layer core");
    }
    if a.core && (a.multi_thread || a.spawn) {
        CLI.error("--multi-thread and --spawn are for --layer async");
    }
    a
}

fn main() -> ExitCode {
    let a = parse_args();
    if !tools_support::device_present(PROGRAM) {
        return ExitCode::SUCCESS;
    }
    if a.core {
        return core(&a);
    }
    let config = Config::new()
        .shards(1)
        .max_message(u32::try_from(a.size.max(64)).unwrap_or(u32::MAX))
        .busy_poll(a.busy_poll);
    let rt = if a.multi_thread {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .unwrap_or_else(|e| fail(PROGRAM, format!("tokio: {e}")));
    let result = match (a.serve, a.connect, a.spawn) {
        (Some(addr), None, false) => rt.block_on(serve(addr, config)),
        (None, Some(addr), false) => rt.block_on(client(addr, config, &a)),
        (Some(addr), None, true) => rt.block_on(spawned(serve(addr, config))),
        (None, Some(addr), true) => {
            let a = a.clone();
            rt.block_on(spawned(async move { client(addr, config, &a).await }))
        }
        _ => fail(PROGRAM, USAGE),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(PROGRAM, e),
    }
}

/// `--layer core`: the ping-pong through `evchan-core` alone.
fn core(a: &Args) -> ExitCode {
    let wait = if a.busy_poll.is_some() {
        tools_pingpong_core::Wait::Busy
    } else {
        tools_pingpong_core::Wait::Event
    };
    match (a.serve, a.connect) {
        (Some(addr), None) => tools_pingpong_core::serve(addr, a.size, wait, a.tokio),
        (None, Some(addr)) => {
            let rtt = tools_pingpong_core::client(addr, a.size, a.warmup, a.iters, wait, a.tokio);
            let driver = if a.tokio { "core-tokio" } else { "core" };
            report(a, driver, None, &rtt);
        }
        _ => fail(PROGRAM, USAGE),
    }
    ExitCode::SUCCESS
}

/// `side` in a task of its own (`--spawn`).
async fn spawned(
    side: impl std::future::Future<Output = Result<(), Error>> + Send + 'static,
) -> Result<(), Error> {
    tokio::spawn(side)
        .await
        .unwrap_or_else(|e| fail(PROGRAM, format!("the task failed: {e}")))
}

async fn serve(addr: SocketAddr, config: Config) -> Result<(), Error> {
    let listener = Listener::bind(addr, config).await?;
    let mut conn = listener.accept().await?.accept(&[]).await?;
    while let Some(msg) = conn.recv().await? {
        conn.send(msg).await?;
    }
    conn.close().await?;
    Ok(())
}

async fn client(addr: SocketAddr, config: Config, a: &Args) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut conn = tools_support::connect_when_listening(addr, &config, deadline).await?;
    let rtt = round_trips(a, &mut conn).await?;
    conn.close().await?;
    let driver = if a.multi_thread { "multi" } else { "current" };
    let app = if a.spawn { "spawn" } else { "block_on" };
    report(a, driver, Some(app), &rtt);
    Ok(())
}

/// `--warmup` untimed and `--iters` timed round trips of `--size` bytes on `conn` (the
/// message's send, then the receive of its echo, checked); the timed ones in µs.
/// The message is sent from the caller's buffer (`send` copies it into a registered slot);
/// its echo comes as a `Bytes`, checked after the clock stops.
async fn round_trips(a: &Args, conn: &mut Connection) -> Result<Vec<f64>, Error> {
    let mut msg = vec![0x5au8; a.size];
    let mut rtt = Vec::with_capacity(a.iters);
    for i in 0..a.warmup + a.iters {
        let seq = (i as u64).to_be_bytes();
        let k = a.size.min(seq.len());
        msg[..k].copy_from_slice(&seq[..k]);
        let t = Instant::now();
        conn.send(&msg).await?;
        let Some(back) = conn.recv().await? else {
            return Err(Error::PeerClosed);
        };
        let took = t.elapsed();
        if back[..] != msg[..] {
            fail(PROGRAM, format!("the echo of message {i} differs"));
        }
        if i >= a.warmup {
            rtt.push(us(took));
        }
    }
    Ok(rtt)
}

/// The result line: `@tools pingpong mode=… driver=… [app=…] size=… stats=…`.
fn report(a: &Args, driver: &str, app: Option<&str>, rtt: &[f64]) {
    let stats = Stats::of(rtt).expect("at least one round trip");
    let mode = if a.busy_poll.is_some() {
        "busy"
    } else {
        "event"
    };
    let mut fields = vec![("mode", mode.to_owned()), ("driver", driver.to_owned())];
    fields.extend(app.map(|app| ("app", app.to_owned())));
    fields.push(("size", a.size.to_string()));
    fields.push(("stats", stats.fields().replace(' ', ",")));
    emit("pingpong", &fields);
}
