//! An RDMA echo server on the async `evchan` API: every message comes back until the peer
//! closes. One task per connection; one line per connection when it ends.
//!
//! ```text
//! echo_server [--addr IP:PORT] [--busy-poll-us N] [--current-thread] [--exit-after N] [--max-message BYTES]
//! ```
//!
//! `--addr` must be an address of an RDMA port (default 169.254.77.1:7471, the soft-RoCE VM's);
//! `--exit-after N` accepts N connections, serves them to their end and exits (without it the
//! server runs until killed). `cargo xtask demo` runs it with `echo_client` in the VM.
//!
//! The application's tasks run on tokio's multi-thread runtime; `--current-thread` runs them on
//! a current-thread runtime instead (to compare: docs/BENCHMARKS.md).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Instant;

use evchan::{Config, Listener};

struct Args {
    addr: SocketAddr,
    busy_poll_us: Option<u64>,
    current_thread: bool,
    exit_after: Option<u64>,
    max_message: u32,
}

const NAME: &str = "echo_server";

const USAGE: &str =
    "usage: echo_server [--addr IP:PORT] [--busy-poll-us N] [--current-thread] [--exit-after N] [--max-message BYTES]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        addr: SocketAddr::from(([169, 254, 77, 1], 7471)),
        busy_poll_us: None,
        current_thread: false,
        exit_after: None,
        max_message: 4096,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        let bad = |e: &dyn std::fmt::Display| format!("{flag}: {e}\n{USAGE}");
        match flag.as_str() {
            "--addr" => args.addr = value()?.parse().map_err(|e| bad(&e))?,
            "--busy-poll-us" => args.busy_poll_us = Some(value()?.parse().map_err(|e| bad(&e))?),
            "--current-thread" => args.current_thread = true,
            "--exit-after" => match value()?.parse().map_err(|e| bad(&e))? {
                0 => return Err(format!("--exit-after must be at least 1, not 0\n{USAGE}")),
                n => args.exit_after = Some(n),
            },
            "--max-message" => match value()?.parse().map_err(|e| bad(&e))? {
                0 => return Err(format!("--max-message must be at least 1, not 0\n{USAGE}")),
                n => args.max_message = n,
            },
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
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
    let config = Config::new()
        .max_message(args.max_message)
        .busy_poll(args.busy_poll_us.map(std::time::Duration::from_micros));
    let listener = match Listener::bind(args.addr, config).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("echo_server: cannot listen on {}: {e}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    println!("echo_server: listening on {}", listener.local_addr());

    let mut tasks = tokio::task::JoinSet::new();
    let mut accepted = 0u64;
    while args.exit_after.is_none_or(|n| accepted < n) {
        let incoming = match listener.accept().await {
            Ok(i) => i,
            Err(e) => {
                eprintln!("echo_server: accept: {e}");
                return ExitCode::FAILURE;
            }
        };
        accepted += 1;
        let n = accepted;
        tasks.spawn(async move {
            let peer = incoming.peer_addr();
            let start = Instant::now();
            let (mut messages, mut bytes) = (0u64, 0u64);
            let result = async {
                let mut conn = incoming.accept(b"").await?;
                while let Some(msg) = conn.recv().await? {
                    messages += 1;
                    bytes += msg.len() as u64;
                    conn.send(msg).await?; // the Bytes point into a receive slot; zero copy
                }
                conn.close().await?;
                Ok::<_, evchan::Error>(())
            }
            .await;
            let peer = peer.map_or_else(|| "?".to_owned(), |p| p.to_string());
            let secs = start.elapsed().as_secs_f64();
            match &result {
                Ok(()) => println!(
                    "echo_server: connection {n} from {peer}: {messages} messages \
                     ({bytes} bytes) echoed, closed by the peer after {secs:.2} s"
                ),
                Err(e) => println!(
                    "echo_server: connection {n} from {peer}: {messages} messages echoed, \
                     then failed after {secs:.2} s: {e}"
                ),
            }
            result.is_ok()
        });
    }
    // --exit-after: the last connections are served to their end.
    drop(listener);
    let mut failed = 0;
    while let Some(ok) = tasks.join_next().await {
        if !matches!(ok, Ok(true)) {
            failed += 1;
        }
    }
    println!("echo_server: {accepted} connections served, {failed} failed; exiting");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
