//! CM events per second for many connections through 1, 2 or 4 event channels, with the async
//! `evchan` API (`Config::shards(n)`: one rdma_cm event channel, and one thread, per shard) or
//! with `evchan-core` (`--layer core`: N threads, each draining its own channel); the retrieval
//! alone of already-queued events (`--layer drain`); and a pure-computation yardstick for it
//! (`--layer spin`). Run by `cargo xtask bench --tools` in the soft-RoCE VM.
//!
//! ```text
//! tools_events --channels N [--layer async|core|drain|spin] [--connections C] [--in-flight K]
//!              [--rounds R] [--addr IP:PORT]
//! ```
//!
//! `--in-flight` is for `async` and `core`, `--rounds` for `drain` and `spin`; each is refused
//! with another layer.
//!
//! `async`: one process holds both sides: a `Listener` and C connections to it (default 256), all on
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
//!
//! `core`: N threads, each with its own event channel, its own listener (port + 1 + its number)
//! and C ÷ N of the connections, driving both sides from its one blocking `get_event` loop: an
//! id is created and resolved (at most ⌈K ÷ N⌉ in flight per thread), on `ROUTE_RESOLVED` it
//! gets its QP (one send, one receive work request, CQs by librdmacm) and connects, each
//! `CONNECT_REQUEST` is accepted at once, the connecting side disconnects on its
//! `ESTABLISHED`, each side destroys its id on its `DISCONNECTED` (the accepted side after its
//! own `rdma_disconnect`). Here the events are counted as read, every kind; events/s = that
//! count ÷ the wall time from the threads' common start to the last one's end.
//!
//! `drain` and `spin`: see `tools_drain/mod.rs`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use evchan::{Config, Connection, Error, Listener};

mod tools_drain;
mod tools_support;
use tools_drain::{drain, spin};
use tools_support::{emit, fail, Cli};

const PROGRAM: &str = "tools_events";
const USAGE: &str =
    "usage: tools_events --channels N [--layer async|core|drain|spin] [--connections C] \
                     [--in-flight K] [--rounds R] [--addr IP:PORT]";
const CLI: Cli = Cli {
    program: PROGRAM,
    usage: USAGE,
};
/// At most this many channels: each has a thread of its own.
const MAX_CHANNELS: usize = 1024;
/// At most this many connections: each takes a local port.
const MAX_CONNECTIONS: usize = 65_535;
/// At most this many `drain` or `spin` rounds: each thread keeps every round's figures.
const MAX_ROUNDS: usize = 1_000_000;
/// CM events per connection, both sides (see the file's doc).
const EVENTS_PER_CONNECTION: usize = 7;

fn main() -> ExitCode {
    let mut channels = 0usize;
    let mut conns = 256usize;
    let mut in_flight = None;
    let mut rounds = None;
    let mut layer = "async".to_owned();
    let mut addr = SocketAddr::from(([169, 254, 77, 1], 7480));
    for (flag, value) in CLI.pairs() {
        let v = value.as_str();
        match flag.as_str() {
            "--channels" => channels = CLI.number(&flag, v, 1..=MAX_CHANNELS),
            "--connections" => conns = CLI.number(&flag, v, 1..=MAX_CONNECTIONS),
            "--layer" if matches!(v, "async" | "core" | "drain" | "spin") => layer = value,
            "--layer" => CLI.error(format_args!("--layer: unknown layer `{v}`")),
            "--in-flight" => in_flight = Some(CLI.number(&flag, v, 1..=MAX_CONNECTIONS)),
            "--rounds" => rounds = Some(CLI.number(&flag, v, 1..=MAX_ROUNDS)),
            "--addr" => addr = CLI.addr(&flag, v),
            _ => CLI.error(format_args!("unknown argument `{flag}`")),
        }
    }
    if channels == 0 {
        CLI.error("--channels is needed");
    }
    let rounds_layer = matches!(layer.as_str(), "drain" | "spin");
    if rounds_layer && in_flight.is_some() {
        CLI.error(format_args!("--in-flight is not for --layer {layer}"));
    }
    if !rounds_layer && rounds.is_some() {
        CLI.error("--rounds is only for --layer drain and spin");
    }
    let (in_flight, rounds) = (in_flight.unwrap_or(32usize), rounds.unwrap_or(32usize));
    if rounds_layer && conns < channels {
        CLI.error(format_args!(
            "--layer {layer} needs at least one connection per channel"
        ));
    }
    // `async` listens on `--addr` and connects to it; `core`'s thread t on its port + 1 + t.
    if layer == "async" && addr.port() == 0 {
        CLI.error("--addr: port 0 cannot be connected to (--layer async)");
    }
    if layer == "core" && usize::from(addr.port()) + channels > usize::from(u16::MAX) {
        CLI.error("--addr: its port + --channels must be at most 65535 (--layer core)");
    }
    if layer == "spin" {
        spin(channels, conns, rounds);
        return ExitCode::SUCCESS;
    }
    if !tools_support::device_present(PROGRAM) {
        return ExitCode::SUCCESS;
    }
    // Both sides' connections in one process: two descriptors each (completion channel and
    // its readiness proxy), more than the usual soft limit of 1,024 for 256 connections.
    if let Err(e) = evchan_sys::raise_open_files_limit() {
        fail(PROGRAM, format!("raising the open-files limit: {e}"));
    }
    if layer != "async" {
        let done = if layer == "core" {
            core(addr, channels, conns, in_flight)
        } else {
            drain(addr, channels, conns, rounds)
        };
        return match done {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(PROGRAM, e),
        };
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
        .connect_timeout(Duration::from_secs(60))
        .max_message(64)
        .recv_depth(4)
        .send_depth(4);
    let listener = Listener::bind(addr, config.clone()).await?;
    // Starts the runtime's shards before the timing, and checks the pair works.
    let (warm, served) = tokio::join!(
        Connection::builder().config(config.clone()).connect(addr),
        async { listener.accept().await?.accept(&[]).await },
    );
    let (warm, mut served) = (warm?, served?);
    warm.close().await?;
    while served.recv().await?.is_some() {}
    served.close().await?;

    let t0 = Instant::now();
    let server = tokio::spawn(async move {
        let mut ends = tokio::task::JoinSet::new();
        for _ in 0..n {
            let mut conn = listener.accept().await?.accept(&[]).await?;
            ends.spawn(async move {
                while conn.recv().await?.is_some() {}
                conn.close().await?;
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
        joined.unwrap_or_else(|e| fail(PROGRAM, e))?;
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

/// The `core` layer (see the file's doc).
fn core(addr: SocketAddr, channels: usize, n: usize, in_flight: usize) -> Result<(), String> {
    let barrier = std::sync::Barrier::new(channels + 1);
    let per_thread = in_flight.div_ceil(channels);
    let (wall, counted) = std::thread::scope(|s| {
        let threads: Vec<_> = (0..channels)
            .map(|t| {
                let share = n / channels + usize::from(t < n % channels);
                let port = addr.port() + 1 + u16::try_from(t).expect("few channels");
                let at = SocketAddr::new(addr.ip(), port);
                let barrier = &barrier;
                s.spawn(move || core_thread(at, share, per_thread, barrier))
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        let mut counted = Ok(0usize);
        for t in threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err("a thread panicked".to_owned()));
            counted = match (counted, r) {
                (Ok(a), Ok(b)) => Ok(a + b),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        (t0.elapsed(), counted)
    });
    let events = counted?;
    emit(
        "events",
        &[
            ("layer", "core".to_owned()),
            ("channels", channels.to_string()),
            ("conns", n.to_string()),
            ("in_flight", in_flight.to_string()),
            ("events", events.to_string()),
            ("wall_s", format!("{:.4}", wall.as_secs_f64())),
            (
                "events_per_s",
                format!("{:.1}", events as f64 / wall.as_secs_f64()),
            ),
        ],
    );
    Ok(())
}

/// One `core` thread: its channel, listener and `k` connections, both sides; the events read.
fn core_thread(
    addr: SocketAddr,
    k: usize,
    in_flight: usize,
    barrier: &std::sync::Barrier,
) -> Result<usize, String> {
    use std::collections::{HashMap, HashSet};

    use evchan_core::cm::state::{AddrResolved, Connected, RouteResolved};
    use evchan_core::cm::{AnyId, ConnParam, EventKind, IdKey, PortSpace};
    use evchan_core::verbs::QpInit;
    use evchan_core::{CmId, EventChannel};

    let t = Duration::from_secs(10);
    // Every thread reaches the barrier, even one that failed, so that none waits forever.
    let ch = match EventChannel::new() {
        Ok(ch) => ch,
        Err(e) => {
            barrier.wait();
            return Err(e.to_string());
        }
    };
    let ready = CmId::new(&ch, PortSpace::Tcp)
        .map_err(|e| e.to_string())
        .and_then(|id| {
            id.bind(addr)
                .map_err(|e| format!("rdma_bind_addr {addr}: {}", e.error))?
                .listen(1024)
                .map_err(|e| format!("rdma_listen: {}", e.error))
        });
    barrier.wait();
    let listener = ready?;
    let init = QpInit::new().max_send_wr(1).max_recv_wr(1);
    let param = ConnParam::new().responder_resources(1).initiator_depth(1);
    let mut ids: HashMap<IdKey, AnyId<'_>> = HashMap::new();
    let mut clients: HashSet<IdKey> = HashSet::new();
    let (mut started, mut clients_done, mut finished, mut events) = (0, 0, 0, 0usize);
    while finished < 2 * k {
        while started < k && started - clients_done < in_flight {
            let id = CmId::new(&ch, PortSpace::Tcp)
                .map_err(|e| e.to_string())?
                .resolve_addr(None, addr, t)
                .map_err(|e| format!("rdma_resolve_addr: {}", e.error))?;
            clients.insert(id.key());
            ids.insert(id.key(), id.erase());
            started += 1;
        }
        let mut ev = ch.get_event().map_err(|e| e.to_string())?;
        events += 1;
        let key = ev.id();
        let mut gone = None;
        match ev.kind() {
            EventKind::ConnectRequest => {
                let mut req = ev
                    .take_request()
                    .ok_or("a CONNECT_REQUEST without its id")?;
                req.create_qp(&init).map_err(|e| e.to_string())?;
                let id = req
                    .accept(&param)
                    .map_err(|e| format!("rdma_accept: {}", e.error))?;
                ids.insert(id.key(), id.erase());
            }
            EventKind::AddrResolved | EventKind::RouteResolved | EventKind::Established => {
                let id = ids.remove(&key).ok_or("an event of an unknown id")?;
                let id = id.complete(&ev).map_err(|e| e.error.to_string())?;
                let next = if id.is::<AddrResolved>() {
                    let id = id
                        .downcast::<AddrResolved>()
                        .map_err(|e| e.error.to_string())?;
                    id.resolve_route(t)
                        .map_err(|e| e.error.to_string())?
                        .erase()
                } else if id.is::<RouteResolved>() {
                    let mut id = id
                        .downcast::<RouteResolved>()
                        .map_err(|e| e.error.to_string())?;
                    id.create_qp(&init).map_err(|e| e.to_string())?;
                    id.connect(&param).map_err(|e| e.error.to_string())?.erase()
                } else if id.is::<Connected>() && clients.contains(&key) {
                    id.disconnect().map_err(|e| e.error.to_string())?
                } else {
                    id
                };
                ids.insert(key, next);
            }
            EventKind::Disconnected => {
                let id = ids.remove(&key).ok_or("DISCONNECTED of an unknown id")?;
                gone = Some(if clients.remove(&key) {
                    clients_done += 1;
                    id
                } else {
                    // The accepted side answers the peer's disconnect.
                    id.disconnect().unwrap_or_else(|e| e.id)
                });
                finished += 1;
            }
            EventKind::TimewaitExit => {}
            other => {
                return Err(format!(
                    "unexpected {} (status {})",
                    other.name(),
                    ev.raw_status()
                ));
            }
        }
        ev.ack();
        // Destroyed after the ack, which rdma_destroy_id waits for.
        drop(gone);
    }
    drop(listener);
    Ok(events)
}
