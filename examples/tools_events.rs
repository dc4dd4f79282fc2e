//! CM events per second for many connections through 1, 2 or 4 event channels, with the async
//! `evchan` API (`Config::shards(n)`: one rdma_cm event channel, and one thread, per shard).
//! Run by `cargo xtask bench --tools` in the soft-RoCE VM.
//!
//! ```text
//! tools_events --channels N [--connections C] [--in-flight K] [--addr IP:PORT]
//! ```
//!
//! One process holds both sides: a `Listener` and C connections to it (default 256), all on
//! the same N shards. Timed from the first `connect` until every connection is closed on both
//! sides: C connects, at most K in flight at once (default 32; all 256 at once overran the
//! kernel CM's connect timeout on a loaded 2-core host), each accepted by the server as it
//! comes, then C closes at once, each server side ending when its `recv` sees the close.
//!
//! The events counted are the rdma_cm events this work delivers, 7 per connection: on the
//! connecting id `ADDR_RESOLVED`, `ROUTE_RESOLVED`, `ESTABLISHED`, `DISCONNECTED`; on the
//! listener `CONNECT_REQUEST`, then on the accepted id `ESTABLISHED`, `DISCONNECTED`. (The
//! count is the protocol's, not read from evchan's internals; a `TIMEWAIT_EXIT`, which the
//! kernel may deliver after a `DISCONNECTED`, is not counted.) events/s = 7 × C ÷ the wall time;
//! the phases' wall times are printed too.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use evchan::{Config, Connection, Error, Listener};

mod tools_support;
use tools_support::{emit, fail};

const PROGRAM: &str = "tools_events";
const USAGE: &str =
    "usage: tools_events --channels N [--connections C] [--in-flight K] [--addr IP:PORT]";
/// CM events per connection, both sides (see the file's doc).
const EVENTS_PER_CONNECTION: usize = 7;

fn main() -> ExitCode {
    let mut channels = 0usize;
    let mut conns = 256usize;
    let mut in_flight = 32usize;
    let mut addr = SocketAddr::from(([169, 254, 77, 1], 7480));
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| fail(PROGRAM, format!("{flag} needs a value\n{USAGE}")));
        let bad =
            |e: &dyn std::fmt::Display| -> ! { fail(PROGRAM, format!("{flag}: {e}\n{USAGE}")) };
        match flag.as_str() {
            "--channels" => channels = value.parse().unwrap_or_else(|e| bad(&e)),
            "--connections" => conns = value.parse().unwrap_or_else(|e| bad(&e)),
            "--in-flight" => in_flight = value.parse().unwrap_or_else(|e| bad(&e)),
            "--addr" => addr = value.parse().unwrap_or_else(|e| bad(&e)),
            _ => fail(PROGRAM, format!("unknown argument `{flag}`\n{USAGE}")),
        }
    }
    if channels == 0 || conns == 0 || in_flight == 0 {
        fail(
            PROGRAM,
            format!("--channels, --connections and --in-flight must be at least 1\n{USAGE}"),
        );
    }
    if !tools_support::device_present(PROGRAM) {
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(PROGRAM, format!("tokio: {e}")));
    match rt.block_on(run(addr, channels, conns, in_flight)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(PROGRAM, e),
    }
}

async fn run(addr: SocketAddr, channels: usize, n: usize, in_flight: usize) -> Result<(), Error> {
    let config = Config::new()
        .shards(channels)
        .backlog(u32::try_from(n).unwrap_or(u32::MAX).max(128))
        .connect_timeout(Duration::from_secs(120))
        .max_message(64)
        .recv_depth(4)
        .send_depth(4);
    let listener = Listener::bind(addr, config.clone()).await?;
    // Starts the runtime's shards before the timing, and checks the pair works.
    let warm = Connection::builder()
        .config(config.clone())
        .connect(addr)
        .await?;
    let mut served = listener.accept().await?.accept(&[]).await?;
    warm.close().await;
    while served.recv().await?.is_some() {}
    served.close().await;

    let t0 = Instant::now();
    let server = tokio::spawn(async move {
        let mut ends = tokio::task::JoinSet::new();
        for _ in 0..n {
            let mut conn = listener.accept().await?.accept(&[]).await?;
            ends.spawn(async move {
                while conn.recv().await?.is_some() {}
                conn.close().await;
                Ok::<_, Error>(())
            });
        }
        while let Some(end) = ends.join_next().await {
            end.unwrap_or_else(|e| fail(PROGRAM, e))?;
        }
        Ok::<_, Error>(())
    });
    let mut connects = tokio::task::JoinSet::new();
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        if connects.len() >= in_flight {
            if let Some(joined) = connects.join_next().await {
                conns.push(joined.unwrap_or_else(|e| fail(PROGRAM, e))?);
            }
        }
        let c = config.clone();
        connects.spawn(async move { Connection::builder().config(c).connect(addr).await });
    }
    while let Some(joined) = connects.join_next().await {
        conns.push(joined.unwrap_or_else(|e| fail(PROGRAM, e))?);
    }
    let connected = t0.elapsed();
    let mut closes = tokio::task::JoinSet::new();
    for conn in conns {
        closes.spawn(conn.close());
    }
    while let Some(joined) = closes.join_next().await {
        joined.unwrap_or_else(|e| fail(PROGRAM, e));
    }
    server.await.unwrap_or_else(|e| fail(PROGRAM, e))?;
    let wall = t0.elapsed();
    let events = EVENTS_PER_CONNECTION * n;
    emit(
        "events",
        &[
            ("layer", "async".to_owned()),
            ("channels", channels.to_string()),
            ("conns", n.to_string()),
            ("in_flight", in_flight.to_string()),
            ("events", events.to_string()),
            ("connect_s", format!("{:.4}", connected.as_secs_f64())),
            ("wall_s", format!("{:.4}", wall.as_secs_f64())),
            (
                "events_per_s",
                format!("{:.1}", events as f64 / wall.as_secs_f64()),
            ),
        ],
    );
    Ok(())
}
