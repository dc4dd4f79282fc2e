//! `cargo xtask bench --tools [--quick]`: evchan against rdma-core's own tools, in one VM boot.
//!
//! Builds `examples/tools_cm.rs`, `tools_pingpong.rs`, `tools_stream.rs`, `tools_remote.rs`
//! and `tools_events.rs`
//! (release profile),
//! then runs in one soft-RoCE VM, server and client in the same VM as the tools do, in rounds
//! so that both sides of every ratio see the same conditions:
//!
//! - connection setup, 100 connections, step by step as `cmtime` (rdma-core 44) reports them:
//!   `cmtime -s ADDR -c 100` and `tools_cm` in each layer, all against one `cmtime -b ADDR`
//!   server; the figure is cmtime's `us / conn` (a step's wall time ÷ 100, all in flight);
//! - 64 B ping-pong: `ib_send_lat -R -e` (completion events) against `tools_pingpong` in event
//!   mode, `ib_send_lat -R` (busy polling) against it with `Config::busy_poll`; each mode with
//!   the async API on a current-thread runtime per side (`current`), on a multi-thread one of
//!   two workers with the loop in `block_on`'s future (`multi`) and in a spawned task
//!   (`multi-spawn`, what `#[tokio::main]` and a task per connection make); and, beside them,
//!   the layer under the async API, `evchan-core` alone with one thread per side (`core`,
//!   `tools_pingpong --layer core`), and the same with its waits done by a current-thread tokio
//!   runtime per side (`core-tokio`, `--layer core --tokio`); `ib_send_lat` reports half a
//!   round trip (`t_typical` is the median of the time between two posts of the client,
//!   divided by 2; `99% percentile` likewise), so its figures are doubled here;
//! - user-space instructions per round trip of the event-mode ping-pong (callgrind, the
//!   client's; the difference between 1,300 and 300 round trips ÷ 1,000): `current`,
//!   `multi-spawn` and `core-tokio`, the target's ratio `Connection` ÷ `core-tokio`;
//! - one-way throughput, the window full: `ib_send_bw -R [-e] -s SIZE [-q 4]` against
//!   `tools_stream` (a task per connection on a 2-worker runtime, default `Config`), 64 B,
//!   4 KiB and 64 KiB messages over one connection and 64 B over four, in event mode (`-e`)
//!   and busy-polling;
//! - one-sided operations: `tools_remote` (one `Connection`, current-thread runtime per
//!   side) against perftest's `ib_read_lat -R [-e] -s 64`, `ib_atomic_lat -R [-e]` (each
//!   operation's p50, post to completion), `ib_write_bw -R -s 65536` (which has no event
//!   mode) and `ib_read_bw -R [-e] -s 65536` (`BW average`), in event mode and busy-polling;
//! - CM events per second for 256 connections through 1, 2 and 4 event channels: the async
//!   API's shards, and evchan-core with one thread per channel, each generating and reading
//!   every event of whole connections; `drain`, the retrieval alone: 256 `ADDR_RESOLVED`
//!   events already queued, read by 1, 2 or 4 threads from a channel each; and `spin`, the
//!   yardstick: the same split of pure computation over 1, 2 or 4 threads, the parallelism the
//!   VM's vCPUs gave at the time. The baseline is the same layer's 1-channel figure of the same
//!   boot.
//!
//! Every figure is the median over the rounds; `spread` is (max − min) ÷ median of ours over
//! the rounds; `paired` is the median, least and largest of the rounds' own ratios (each value
//! is kept with its round, `@@tools round=N`, so a round that failed on one side drops out of
//! the pairs instead of shifting them). Under TCG only the ratios mean anything.
//!
//! This module holds the run's plan and the run itself; [`script`](mod@script) writes the guest's shell
//! script, [`parse`] reads its output into figures, [`report`] renders the markdown section.

pub(crate) mod parse;
pub(crate) mod readme;
pub(crate) mod report;
mod script;

use std::time::{Duration, Instant};

use crate::cargo::cargo;
use crate::{target_dir, vm, Result};

use parse::Results;
pub use report::{ToolRatio, ROW_PREFIX};
use script::script;

/// The VM's address on rxe0 (cmtime and perftest do not take the IPv6 link-local form).
const ADDR: &str = "169.254.77.1";
/// cmtime's step names (rdma-core 44, `show_perf`) and ours, in its order.
const STEPS: &[(&str, &str)] = &[
    ("create id", "create_id"),
    ("resolve addr", "resolve_addr"),
    ("resolve route", "resolve_route"),
    ("create qp", "create_qp"),
    ("connect", "connect"),
    ("disconnect", "disconnect"),
    ("destroy", "destroy"),
];
/// The `tools_cm` layers, the like-for-like one (with cmtime 44's shared CQs) first.
const LAYERS: &[&str] = &["core-shared", "raw", "core", "raw-percq"];
const CONNS: u32 = 100;
const EVENT_CONNS: u32 = 256;
const CHANNELS: &[u32] = &[1, 2, 4];
/// How many of the event run's connects are in flight at once (all 256 at once overran the
/// kernel CM's connect timeout on a loaded host: `UNREACHABLE` with `ETIMEDOUT`).
const IN_FLIGHT: u32 = 32;
/// The rounds inside one `tools_events --layer drain|spin` run (its `--rounds`).
const DRAIN_ROUNDS: u32 = 32;
/// The `tools_events` layers, in the order of their rows.
const EVENT_LAYERS: &[&str] = &["async", "core", "drain", "spin"];
/// The ping-pong's drivers: (`driver=` of its result line, with `-spawn` where its
/// `app=spawn`; `tools_pingpong` flags; label).
const DRIVERS: &[(&str, &str, &str)] = &[
    ("current", "", "current-thread runtime"),
    ("multi", " --multi-thread", "multi-thread runtime, block_on"),
    (
        "multi-spawn",
        " --multi-thread --spawn",
        "multi-thread runtime, spawned task",
    ),
    // Not the async API: evchan-core alone, one thread per side (what the layer under it costs).
    ("core", " --layer core", "core layer, no runtime"),
    // Neither: the same with tokio's waits (what an async API could reach).
    (
        "core-tokio",
        " --layer core --tokio",
        "core layer, tokio waits",
    ),
];
/// The ping-pong drivers whose client runs under callgrind too.
const CG_DRIVERS: &[&str] = &["current", "multi-spawn", "core-tokio"];
/// The short and the long callgrind run's round trips (after [`CG_WARMUP`] untimed ones):
/// their difference ÷ 1000 is the instructions per round trip.
const CG_ITERS: [u32; 2] = [300, 1300];
const CG_WARMUP: u32 = 50;
/// The throughput runs: (message size, messages per connection, connections).
const STREAMS: &[(u32, u32, u32)] = &[
    (64, 20_000, 1),
    (4096, 10_000, 1),
    (65536, 2000, 1),
    (64, 10_000, 4),
];
/// The zero-copy throughput runs (event mode): (size, count, registered buffers per
/// connection), `tools_stream --zero-copy` against `ib_send_bw -R -e`, which sends from
/// registered memory too.
const ZERO_COPY: &[(u32, u32, u32)] = &[(65536, 2000, 16)];
/// The one-sided runs: (figure: `tools_remote`'s `mode-poll`, its flags, the perftest tool
/// and its flags). `COUNT` stands for the operations of a run; `ib_write_bw` has no event
/// mode, so both of ours are against its polling.
const REMOTE: &[(&str, &str, &str)] = &[
    (
        "read-lat-event",
        "--mode read-lat --size 64",
        "ib_read_lat -e -s 64",
    ),
    (
        "read-lat-busy",
        "--mode read-lat --size 64 --busy-poll-us 1000",
        "ib_read_lat -s 64",
    ),
    ("atomic-lat-event", "--mode atomic-lat", "ib_atomic_lat -e"),
    (
        "atomic-lat-busy",
        "--mode atomic-lat --busy-poll-us 1000",
        "ib_atomic_lat",
    ),
    (
        "write-bw-event",
        "--mode write-bw --size 65536 --window 16",
        "ib_write_bw -s 65536",
    ),
    (
        "write-bw-busy",
        "--mode write-bw --size 65536 --window 16 --busy-poll-us 1000",
        "ib_write_bw -s 65536",
    ),
    (
        "read-bw-event",
        "--mode read-bw --size 65536 --window 16",
        "ib_read_bw -e -s 65536",
    ),
    (
        "read-bw-busy",
        "--mode read-bw --size 65536 --window 16 --busy-poll-us 1000",
        "ib_read_bw -s 65536",
    ),
];
/// The one-sided latency runs' operations, and the bandwidth runs' (before `stream_scale`).
const REMOTE_LAT_OPS: u32 = 1000;
const REMOTE_BW_OPS: u32 = 2000;

/// The busy-poll window of the async ping-pong (longer than a round trip in the VM, so the
/// shards never sleep between two messages, as `ib_send_lat -R` never does).
const BUSY_POLL_US: u32 = 1000;

/// The rounds and iterations of a run.
struct Plan {
    cm_rounds: u32,
    lat_rounds: u32,
    iters: u32,
    /// The throughput phase's rounds.
    stream_rounds: u32,
    /// The throughput runs' message counts are [`STREAMS`]' divided by this.
    stream_scale: u32,
    event_rounds: u32,
    /// The one-sided phase's rounds.
    remote_rounds: u32,
}

/// Builds the programs, runs them and the tools in one VM boot, prints the markdown section
/// and returns it, with the ratios of its rows that `--save` / `--compare` track.
pub fn run(quick: bool) -> Result<(String, Vec<ToolRatio>)> {
    let plan = if quick {
        // Still 9 interleaved rounds of the ping-pong and the throughput (the medians of
        // fewer swing too much under TCG), each shorter.
        Plan {
            cm_rounds: 2,
            lat_rounds: 9,
            iters: 300,
            stream_rounds: 9,
            stream_scale: 4,
            event_rounds: 1,
            remote_rounds: 5,
        }
    } else {
        Plan {
            cm_rounds: 5,
            lat_rounds: 9,
            iters: 1000,
            stream_rounds: 9,
            stream_scale: 1,
            event_rounds: 5,
            remote_rounds: 9,
        }
    };
    let ok = cargo(&[
        "build",
        "--release",
        "--quiet",
        "--example",
        "tools_cm",
        "--example",
        "tools_pingpong",
        "--example",
        "tools_stream",
        "--example",
        "tools_remote",
        "--example",
        "tools_events",
    ])
    .status()
    .is_ok_and(|s| s.success());
    if !ok {
        return Err(
            "building examples/tools_cm.rs, tools_pingpong.rs, tools_stream.rs, tools_remote.rs, \
             tools_events.rs failed"
                .into(),
        );
    }
    let examples = target_dir().join("release/examples");
    let load_before = loadavg();
    let started = Instant::now();
    let mut results = Results::default();
    let job = vm::Job {
        command: script(&examples, &plan),
        env: vec![("EVCHAN_REQUIRE_DEVICE".into(), "1".into())],
        // (A quick run's job took up to 20 min on our 2-core machines, and over 20 on a
        // slower host.)
        timeout: Duration::from_secs(if quick { 2400 } else { 3600 }),
        ..crate::job()
    };
    let outcome = vm::run(&job, &mut |line| {
        println!("{line}");
        results.add_line(line);
    })?;
    let section = results.section(&plan, started.elapsed(), &load_before, &loadavg());
    println!();
    print!("{}", section.text);
    if outcome.code != 0 {
        return Err(format!(
            "the tools run in the VM failed (status {}); see above",
            outcome.code
        ));
    }
    Ok((section.text, section.ratios))
}

/// The host's load averages (`/proc/loadavg`'s first three fields).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}
