//! `cargo xtask bench --tools [--quick]`: evchan against rdma-core's own tools, in one VM boot.
//!
//! Builds `examples/tools_cm.rs`, `tools_pingpong.rs` and `tools_events.rs` (release profile),
//! then runs in one soft-RoCE VM, server and client in the same VM as the tools do, in rounds
//! so that both sides of every ratio see the same conditions:
//!
//! - connection setup, 100 connections, step by step as `cmtime` (rdma-core 44) reports them:
//!   `cmtime -s ADDR -c 100` and `tools_cm` in each layer, all against one `cmtime -b ADDR`
//!   server; the figure is cmtime's `us / conn` (a step's wall time ÷ 100, all in flight);
//! - 64 B ping-pong: `ib_send_lat -R -e` (completion events) against `tools_pingpong` in event
//!   mode, `ib_send_lat -R` (busy polling) against it with `Config::busy_poll`; each mode with
//!   both drivers of the async API, in the same rounds: the shard on a thread of its own
//!   (`threads`, the default) and the shard as a task on the caller's current-thread runtime
//!   (`task`, `Config::in_task(true)`, `tools_pingpong --in-task`); `ib_send_lat` reports half
//!   a round trip (`t_typical` is the median of the time between two posts of the client,
//!   divided by 2; `99% percentile` likewise), so its figures are doubled here;
//! - CM events per second for 256 connections through 1, 2 and 4 event channels: the async
//!   API's shards, and evchan-core with one thread per channel, each generating and reading
//!   every event of whole connections; `drain`, the retrieval alone: 256 `ADDR_RESOLVED`
//!   events already queued, read by 1, 2 or 4 threads from a channel each; and `spin`, the
//!   yardstick: the same split of pure computation over 1, 2 or 4 threads, the parallelism the
//!   VM's vCPUs gave at the time. The baseline is the same layer's 1-channel figure of the same
//!   boot.
//!
//! Every figure is the median over the rounds; `spread` is (max − min) ÷ median of ours over
//! the rounds. Under TCG only the ratios mean anything.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cargo::cargo;
use crate::{target_dir, vm, Result};

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
/// The async ping-pong's drivers: (`driver=` of its result line, `tools_pingpong` flags, label).
const DRIVERS: &[(&str, &str, &str)] = &[
    ("threads", "", "threads"),
    ("task", " --in-task", "in-task"),
];
/// The busy-poll window of the async ping-pong (longer than a round trip in the VM, so the
/// shards never sleep between two messages, as `ib_send_lat -R` never does).
const BUSY_POLL_US: u32 = 1000;

/// The rounds and iterations of a run.
struct Plan {
    cm_rounds: u32,
    lat_rounds: u32,
    iters: u32,
    event_rounds: u32,
}

/// Builds the programs, runs them and the tools in one VM boot, prints the markdown section
/// and returns it.
pub fn run(quick: bool) -> Result<String> {
    let plan = if quick {
        Plan {
            cm_rounds: 3,
            lat_rounds: 3,
            iters: 300,
            event_rounds: 2,
        }
    } else {
        Plan {
            cm_rounds: 5,
            lat_rounds: 5,
            iters: 1000,
            event_rounds: 5,
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
        "tools_events",
    ])
    .status()
    .is_ok_and(|s| s.success());
    if !ok {
        return Err(
            "building examples/tools_cm.rs, tools_pingpong.rs, tools_events.rs failed".into(),
        );
    }
    let examples = target_dir().join("release/examples");
    let load_before = loadavg();
    let started = Instant::now();
    let mut results = Results::default();
    let job = vm::Job {
        command: script(&examples, &plan),
        env: vec![("EVCHAN_REQUIRE_DEVICE".into(), "1".into())],
        timeout: Duration::from_secs(if quick { 900 } else { 1800 }),
        ..vm::Job::default()
    };
    let outcome = vm::run(&job, &mut |line| {
        println!("{line}");
        results.add_line(line);
    })?;
    let section = results.section(&plan, started.elapsed(), &load_before, &loadavg());
    println!();
    print!("{section}");
    if outcome.code != 0 {
        return Err(format!(
            "the tools run in the VM failed (status {}); see above",
            outcome.code
        ));
    }
    Ok(section)
}

/// The host's load averages (`/proc/loadavg`'s first three fields).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The guest's shell script: every server under `timeout`, every client retried while its
/// server is not listening yet; marker lines (`@@tools ...`) say what the next lines are.
fn script(examples: &Path, plan: &Plan) -> String {
    let e = vm::shell_join(&[examples.display().to_string()]);
    let mut s = format!(
        "A={ADDR}\nE={e}\nstatus=0\n\
         fail() {{ echo \"@@tools failed: $*\"; status=1; }}\n\
         # ib_send_lat: server in the background, client retried while nobody listens yet.\n\
         isl() {{\n\
         \x20 mode=$1; shift\n\
         \x20 for try in 1 2 3 4 5 6 7 8 9 10; do\n\
         \x20   timeout 300 ib_send_lat -R \"$@\" -F >/dev/null 2>&1 & s=$!\n\
         \x20   sleep 1\n\
         \x20   out=$(timeout 300 ib_send_lat -R \"$@\" -F $A 2>&1); rc=$?\n\
         \x20   kill $s 2>/dev/null; wait $s 2>/dev/null\n\
         \x20   if [ $rc = 0 ]; then echo \"@@tools isl mode=$mode\"; echo \"$out\"; return; fi\n\
         \x20 done\n\
         \x20 echo \"$out\"; fail \"ib_send_lat $mode\"\n\
         }}\n\
         pp() {{\n\
         \x20 timeout 300 $E/tools_pingpong --serve $A:7490 \"$@\" & s=$!\n\
         \x20 timeout 300 $E/tools_pingpong --connect $A:7490 \"$@\" || {{ kill $s; fail tools_pingpong \"$@\"; }}\n\
         \x20 wait $s\n\
         }}\n\
         # A fresh `cmtime -b` for every client: cmtime 44's server shares the CQs of its first\n\
         # accepted id, freed with that id once no other QP holds them; a later request then\n\
         # fails (reject, reason 28). Each client starts once the server listens.\n\
         cmsrv() {{\n\
         \x20 timeout 300 cmtime -b $A >/dev/null 2>&1 & cs=$!\n\
         \x20 for i in $(seq 100); do\n\
         \x20   rdma resource show cm_id 2>/dev/null | grep -q 'state LISTEN.*comm cmtime' && return\n\
         \x20   sleep 0.1\n\
         \x20 done\n\
         }}\n\
         cmstop() {{ kill $cs 2>/dev/null; wait $cs 2>/dev/null; }}\n\
         echo '@@tools phase connection setup'\n"
    );
    for round in 1..=plan.cm_rounds {
        let _ = writeln!(
            s,
            "echo '@@tools cmtime round={round}'\n\
             cmsrv; timeout 300 cmtime -s $A -c {CONNS} || fail cmtime; cmstop"
        );
        for layer in LAYERS.iter().chain(&["async"]) {
            let _ = writeln!(
                s,
                "cmsrv; timeout 300 $E/tools_cm --layer {layer} --addr $A:7471 \
                 --connections {CONNS} || fail tools_cm {layer}; cmstop"
            );
        }
    }
    s.push_str("echo '@@tools phase ping-pong'\n");
    let n = plan.iters;
    for _ in 0..plan.lat_rounds {
        let _ = writeln!(s, "isl event -e -s 64 -n {n}");
        for (_, flags, _) in DRIVERS {
            let _ = writeln!(s, "pp --iters {n} --size 64{flags}");
        }
        let _ = writeln!(s, "isl busy -s 64 -n {n}");
        for (_, flags, _) in DRIVERS {
            let _ = writeln!(
                s,
                "pp --iters {n} --size 64 --busy-poll-us {BUSY_POLL_US}{flags}"
            );
        }
    }
    s.push_str("echo '@@tools phase events'\n");
    for _ in 0..plan.event_rounds {
        for layer in ["async", "core"] {
            for c in CHANNELS {
                let _ = writeln!(
                    s,
                    "timeout 240 $E/tools_events --layer {layer} --channels {c} \
                     --connections {EVENT_CONNS} --in-flight {IN_FLIGHT} --addr $A:7480 \
                     || fail tools_events {layer} {c}"
                );
            }
        }
        // Each drain run right after its yardstick, so both see the same load.
        for c in CHANNELS {
            for layer in ["spin", "drain"] {
                let _ = writeln!(
                    s,
                    "timeout 240 $E/tools_events --layer {layer} --channels {c} \
                     --connections {EVENT_CONNS} --rounds {DRAIN_ROUNDS} --addr $A:7480 \
                     || fail tools_events {layer} {c}"
                );
            }
        }
    }
    s.push_str("exit $status\n");
    s
}

/// What the run printed, by figure: every round's value.
#[derive(Debug, Default)]
struct Results {
    /// (layer, step) → per-connection µs of each round; `layer` is `cmtime` for the tool.
    cm: BTreeMap<(String, String), Vec<f64>>,
    /// (layer, step) → the per-connection p99 of each round (ours only).
    cm_p99: BTreeMap<(String, String), Vec<f64>>,
    /// ("event"|"busy", "tool"|"threads"|"task") → (round-trip p50, p99) of each round, µs:
    /// `ib_send_lat`'s, or ours with that driver.
    lat: BTreeMap<(String, String), Vec<(f64, f64)>>,
    /// (layer, channels) → events/s of each round.
    events: BTreeMap<(String, u32), Vec<f64>>,
    /// (layer) → the events counted in each run (`spin`: its units of work).
    event_counts: BTreeMap<String, Vec<u64>>,
    /// `drain`: the reads of each run that found no event queued and waited (`waits=`).
    drain_waits: Vec<u64>,
    /// The `mode` of the last `@@tools isl` marker: the next result line is its.
    isl_mode: Option<String>,
    failures: Vec<String>,
}

/// `key=value` fields of a result line, the `stats=` field's own fields flattened in.
fn fields(line: &str) -> BTreeMap<&str, &str> {
    line.split_whitespace()
        .flat_map(|f| f.split(','))
        .filter_map(|f| f.split_once('='))
        .filter(|(k, _)| *k != "stats")
        .chain(
            line.split_whitespace()
                .filter_map(|f| f.strip_prefix("stats="))
                .flat_map(|f| f.split(','))
                .filter_map(|f| f.split_once('=')),
        )
        .collect()
}

impl Results {
    fn add_line(&mut self, line: &str) {
        let line = line.trim();
        let num = |f: &BTreeMap<&str, &str>, k: &str| f.get(k).and_then(|v| v.parse::<f64>().ok());
        if let Some(rest) = line.strip_prefix("@@tools failed: ") {
            self.failures.push(rest.to_owned());
        } else if line.starts_with("event: ") || line.starts_with("RDMA_CM_EVENT_") {
            // cmtime 44 reports a failed connection this way and goes on with the others:
            // its figures of that run then cover fewer connections.
            self.failures.push(format!("cmtime: {line}"));
        } else if let Some(rest) = line.strip_prefix("@@tools isl mode=") {
            self.isl_mode = Some(rest.to_owned());
        } else if let Some(rest) = line.strip_prefix("@tools cm ") {
            let f = fields(rest);
            if let (Some(layer), Some(step), Some(per), Some(p99)) = (
                f.get("layer"),
                f.get("step"),
                num(&f, "per_conn_us"),
                num(&f, "p99_us"),
            ) {
                let key = ((*layer).to_owned(), (*step).to_owned());
                self.cm.entry(key.clone()).or_default().push(per);
                self.cm_p99.entry(key).or_default().push(p99);
            }
        } else if let Some(rest) = line.strip_prefix("@tools pingpong ") {
            let f = fields(rest);
            // Lines from before `driver=` existed came from the threads driver.
            let driver = f.get("driver").copied().unwrap_or("threads");
            if let (Some(mode), Some(p50), Some(p99)) =
                (f.get("mode"), num(&f, "p50_us"), num(&f, "p99_us"))
            {
                let key = ((*mode).to_owned(), driver.to_owned());
                self.lat.entry(key).or_default().push((p50, p99));
            }
        } else if let Some(rest) = line.strip_prefix("@tools events ") {
            let f = fields(rest);
            // `spin` counts units of work, not events.
            if let (Some(layer), Some(c), Some(count), Some(rate)) = (
                f.get("layer"),
                f.get("channels").and_then(|c| c.parse().ok()),
                f.get("events")
                    .or_else(|| f.get("units"))
                    .and_then(|c| c.parse().ok()),
                num(&f, "events_per_s").or_else(|| num(&f, "units_per_s")),
            ) {
                let layer = (*layer).to_owned();
                if layer == "drain" {
                    if let Some(w) = f.get("waits").and_then(|w| w.parse().ok()) {
                        self.drain_waits.push(w);
                    }
                }
                self.events
                    .entry((layer.clone(), c))
                    .or_default()
                    .push(rate);
                self.event_counts.entry(layer).or_default().push(count);
            }
        } else if let Some((name, values)) = line.split_once(':') {
            // cmtime 44: `%-13s: total_ms max_ms min_us us_per_conn`.
            let name = name.trim();
            if let Some((_, step)) = STEPS.iter().find(|(c, _)| *c == name) {
                let v: Vec<f64> = values
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect();
                if let [_, _, _, per] = v.as_slice() {
                    let key = ("cmtime".to_owned(), (*step).to_owned());
                    self.cm.entry(key).or_default().push(*per);
                }
            }
        } else if let Some(mode) = self.isl_mode.clone() {
            // perftest: `#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%`,
            // each time half a round trip.
            // (t_stdev may read `-nan`; only the size, t_typical and 99% are used.)
            let v: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| v.get(i).and_then(|t| t.parse::<f64>().ok());
            if let (9, Some(64.0), Some(typical), Some(p99)) = (v.len(), num(0), num(4), num(7)) {
                let key = (mode, "tool".to_owned());
                self.lat
                    .entry(key)
                    .or_default()
                    .push((2.0 * typical, 2.0 * p99));
                self.isl_mode = None;
            }
        }
    }

    /// The per-round sums of `steps` for `layer` (rounds where all were read).
    fn sum(&self, layer: &str, steps: &[&str]) -> Vec<f64> {
        let cols: Vec<&Vec<f64>> = steps
            .iter()
            .filter_map(|s| self.cm.get(&(layer.to_owned(), (*s).to_owned())))
            .collect();
        if cols.len() != steps.len() {
            return Vec::new();
        }
        let rounds = cols.iter().map(|c| c.len()).min().unwrap_or(0);
        (0..rounds)
            .map(|r| cols.iter().map(|c| c[r]).sum())
            .collect()
    }

    fn section(&self, plan: &Plan, took: Duration, load0: &str, load1: &str) -> String {
        let mut out = String::from("## Against rdma-core's tools\n\n");
        let _ = writeln!(
            out,
            "`cargo xtask bench --tools`: one soft-RoCE VM boot (TCG, {} vCPUs), server and client \
             in the same VM; each figure the median of the rounds (connection setup {} rounds, \
             ping-pong {} rounds of {} round trips, events {} rounds); ratio = ours ÷ baseline; \
             spread = (max − min) ÷ median of ours over the rounds. Host load average before / \
             after: {load0} / {load1}; the run took {:.0} s. Under TCG only ratios mean anything.\n",
            std::env::var("EVCHAN_VM_SMP").unwrap_or_else(|_| "2".into()),
            plan.cm_rounds,
            plan.lat_rounds,
            plan.iters,
            plan.event_rounds,
            took.as_secs_f64()
        );
        let header = "| figure | ours (median) | baseline (median) | ratio | p99 | spread | target | met? |\n\
                      |---|---:|---:|---:|---:|---:|---:|---|\n";

        out.push_str(
            "### Connection setup, 100 connections (µs per connection, cmtime's `us / conn`)\n\n\
             Baseline `cmtime -s` (rdma-core 44); each client, `cmtime -s` included, against a fresh \
             `cmtime -b` server of its own. `core-shared` is the like-for-like row: like cmtime 44 (whose \
             `rdma_create_qp` copies the first QP's CQs back into its shared attributes) all QPs \
             share one CQ; `raw` is the same in plain librdmacm; `core` and `raw-percq` give each \
             QP its own CQs. p99: of one connection's own time in the step (call to its event). \
             `total` sums the seven steps.\n\n",
        );
        out.push_str(header);
        let all: Vec<&str> = STEPS.iter().map(|(_, s)| *s).collect();
        let base_total = self.sum("cmtime", &all);
        for layer in LAYERS {
            let steps: &[&str] = if matches!(*layer, "core-shared" | "raw") {
                &all
            } else {
                &[]
            };
            for step in steps {
                let key = ((*layer).to_owned(), (*step).to_owned());
                let base = self.cm.get(&("cmtime".to_owned(), (*step).to_owned()));
                row(
                    &mut out,
                    &format!("{layer}: {step}"),
                    self.cm.get(&key).map(Vec::as_slice),
                    base.map(Vec::as_slice),
                    self.cm_p99.get(&key).map(Vec::as_slice),
                    None,
                );
            }
            let target = (*layer == "core-shared").then_some(Target::AtMost(1.10));
            row(
                &mut out,
                &format!("**{layer}: total**"),
                Some(&self.sum(layer, &all)),
                Some(&base_total),
                None,
                target,
            );
        }
        let setup = [
            "create_id",
            "resolve_addr",
            "resolve_route",
            "create_qp",
            "connect",
        ];
        let key = |s: &str| ("async".to_owned(), s.to_owned());
        row(
            &mut out,
            "async: full connect ÷ cmtime's create id … connect",
            self.cm.get(&key("full_connect")).map(Vec::as_slice),
            Some(&self.sum("cmtime", &setup)),
            self.cm_p99.get(&key("full_connect")).map(Vec::as_slice),
            None,
        );
        row(
            &mut out,
            "async: close ÷ cmtime's disconnect + destroy",
            self.cm.get(&key("close")).map(Vec::as_slice),
            Some(&self.sum("cmtime", &["disconnect", "destroy"])),
            self.cm_p99.get(&key("close")).map(Vec::as_slice),
            None,
        );

        let _ = write!(
            out,
            "\n### 64 B ping-pong round trip (µs)\n\n\
             Ours: `tools_pingpong` (async `Connection::send` then `recv`, one shard each side, \
             a current-thread tokio runtime per side), with each driver in the same rounds: \
             `threads` (the shard on a thread of its own, the default) and `in-task` \
             (`Config::in_task(true)`: the shard a task on that runtime); baseline: \
             `ib_send_lat -R [-e] -s 64 -n {}`, its half-round-trip figures doubled \
             (p50 from `t_typical`, p99 from `99% percentile`). Busy-poll: \
             `Config::busy_poll({BUSY_POLL_US} µs)`. The p99 column gives ours / the tool's. \
             The `in-task vs threads` rows compare the two drivers (baseline: threads; their p99 column \
             gives in-task / threads).\n\n",
            plan.iters
        );
        out.push_str(header);
        let p50 = |v: Option<&Vec<(f64, f64)>>| -> Vec<f64> {
            v.map(|v| v.iter().map(|x| x.0).collect())
                .unwrap_or_default()
        };
        let p99 = |v: Option<&Vec<(f64, f64)>>| -> Vec<f64> {
            v.map(|v| v.iter().map(|x| x.1).collect())
                .unwrap_or_default()
        };
        for (mode, label, tool) in [
            ("event", "event mode", "`ib_send_lat -R -e`"),
            ("busy", "busy-poll", "`ib_send_lat -R`"),
        ] {
            let get = |who: &str| self.lat.get(&(mode.to_owned(), who.to_owned()));
            let tool_v = get("tool");
            for (driver, _, driver_label) in DRIVERS {
                let ours = get(driver);
                let p99_text = format!(
                    "{} / {}",
                    fmt(median(&p99(ours))),
                    fmt(median(&p99(tool_v)))
                );
                row_text(
                    &mut out,
                    &format!("RTT p50, {label}, {driver_label} vs {tool}"),
                    &p50(ours),
                    &p50(tool_v),
                    &p99_text,
                    Some(Target::AtMost(1.15)),
                );
                row_text(
                    &mut out,
                    &format!("RTT p99, {label}, {driver_label} vs {tool}"),
                    &p99(ours),
                    &p99(tool_v),
                    "",
                    None,
                );
            }
            let (threads, task) = (get("threads"), get("task"));
            row_text(
                &mut out,
                &format!("RTT p50, {label}, in-task vs threads"),
                &p50(task),
                &p50(threads),
                &format!(
                    "{} / {}",
                    fmt(median(&p99(task))),
                    fmt(median(&p99(threads)))
                ),
                None,
            );
        }

        let _ = write!(
            out,
            "\n### CM events per second, {EVENT_CONNS} connections\n\n\
             `tools_events`, both sides in one process, at most {IN_FLIGHT} connects in flight \
             (all {EVENT_CONNS} at once overran the kernel CM's connect timeout on our loaded \
             host), then every close. `async`: a `Listener` and {EVENT_CONNS} connections to it \
             on `Config::shards(n)`, one event channel and thread per shard; events = 7 per \
             connection (ADDR_RESOLVED, ROUTE_RESOLVED, ESTABLISHED, DISCONNECTED on the \
             connecting id; CONNECT_REQUEST on the listener; ESTABLISHED, DISCONNECTED on the \
             accepted id). `core`: n threads, each draining its own channel with its own \
             listener and {EVENT_CONNS} ÷ n of the connections; events as read{}. events/s = \
             events ÷ wall time. These two time the generation of the events as well as their \
             retrieval, and the kernel's part of the generation runs one work item at a time on \
             one port however many channels there are (Linux 6.1, `drivers/infiniband/core`: \
             rdma_cm's `cma_wq` and ib_addr's `addr_wq` are ordered workqueues, \
             `alloc_ordered_workqueue` in `cma.c` and `addr.c`; ib_cm's runs one item at a time, \
             `alloc_workqueue(\"ib_cm\", 0, 1)` in `cm.c`; the CM's MADs are received on the \
             port's ordered `ib_mad%u`, `mad.c`): only the work done in the threads themselves, \
             in user space and in their own system calls, can spread over channels.\n\n\
             `drain` times the retrieval alone, not the generation: n threads, each with its \
             own channel and {EVENT_CONNS} ÷ n ids, {DRAIN_ROUNDS} rounds per run after an \
             untimed warm-up round. Untimed, each id calls `rdma_resolve_addr` toward the VM's \
             own address and each thread waits until all its `ADDR_RESOLVED` events are queued \
             (its witness, an id resolved last on a second channel, has its event: `addr_wq` \
             completes requests in the order queued, and one to a local address is queued at \
             once); then a barrier releases the threads, and a round's time runs until the last \
             thread has read (`try_get_event`), checked (`ADDR_RESOLVED`, status 0, one per id) \
             and acked its {EVENT_CONNS} ÷ n events; events/s = events ÷ the rounds' summed \
             times. Reads that found no event queued and waited in `poll`: {}. `spin` is \
             `drain`'s yardstick, no RDMA: {EVENT_CONNS} units of pure computation (no shared \
             data) split over n threads the same way, run just before each `drain` run; its n ÷ \
             1 ratio is the parallelism the VM's vCPUs gave at that time, the ceiling of \
             `drain`'s. Baseline of every row: the same layer with 1 channel, same boot. More \
             channels than the VM's vCPUs cannot run in parallel.\n\n",
            self.event_counts.get("core").map_or_else(String::new, |c| {
                let (lo, hi) = (c.iter().min(), c.iter().max());
                format!(
                    " ({} to {} per run here)",
                    lo.copied().unwrap_or(0),
                    hi.copied().unwrap_or(0)
                )
            }),
            if self.drain_waits.is_empty() {
                "no `drain` run was read".to_owned()
            } else {
                format!(
                    "{} in all, over {} `drain` runs",
                    self.drain_waits.iter().sum::<u64>(),
                    self.drain_waits.len()
                )
            }
        );
        out.push_str(header);
        for layer in EVENT_LAYERS {
            let get = |c: u32| {
                self.events
                    .get(&((*layer).to_owned(), c))
                    .cloned()
                    .unwrap_or_default()
            };
            let one = get(1);
            // `spin` is a yardstick, not a goal.
            let (what, goal) = if *layer == "spin" {
                ("units/s", None)
            } else {
                ("events/s", Some(Target::AtLeast(1.5)))
            };
            for c in CHANNELS {
                let target = goal.filter(|_| *c == 4);
                row_text(
                    &mut out,
                    &format!("{layer}: {what}, {c} ch ÷ 1 ch"),
                    &get(*c),
                    &one,
                    "",
                    target,
                );
            }
        }
        if !self.failures.is_empty() {
            let _ = writeln!(out, "\nFailed in the VM: {}.", self.failures.join("; "));
        }
        out
    }
}

#[derive(Debug, Clone, Copy)]
enum Target {
    AtMost(f64),
    AtLeast(f64),
}

/// A table row whose p99 column is the median of the rounds' p99s.
fn row(
    out: &mut String,
    name: &str,
    ours: Option<&[f64]>,
    base: Option<&[f64]>,
    p99: Option<&[f64]>,
    target: Option<Target>,
) {
    let p99 = p99.map_or_else(String::new, |p| fmt(median(p)));
    row_text(
        out,
        name,
        ours.unwrap_or_default(),
        base.unwrap_or_default(),
        &p99,
        target,
    );
}

fn row_text(
    out: &mut String,
    name: &str,
    ours: &[f64],
    base: &[f64],
    p99: &str,
    target: Option<Target>,
) {
    let (o, b) = (median(ours), median(base));
    let ratio = match (o, b) {
        (Some(o), Some(b)) if b > 0.0 => Some(o / b),
        _ => None,
    };
    let spread = o.filter(|m| *m > 0.0).map(|m| {
        let (lo, hi) = ours
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(*v), h.max(*v)));
        format!("{:.0} %", 100.0 * (hi - lo) / m)
    });
    let (t, met) = match (target, ratio) {
        (None, _) => (String::new(), String::new()),
        (Some(Target::AtMost(x)), r) => (
            format!("≤ {x:.2}"),
            r.map_or("no figure".into(), |r| yes(r <= x)),
        ),
        (Some(Target::AtLeast(x)), r) => (
            format!("≥ {x:.2}"),
            r.map_or("no figure".into(), |r| yes(r >= x)),
        ),
    };
    let _ = writeln!(
        out,
        "| {name} | {} | {} | {} | {p99} | {} | {t} | {met} |",
        fmt(o),
        fmt(b),
        ratio.map_or_else(|| "–".into(), |r| format!("{r:.2}")),
        spread.unwrap_or_else(|| "–".into()),
    );
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "**no**" }.into()
}

/// The median (the mean of the middle two for an even count); `None` when empty.
fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

fn fmt(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_tools_and_ours() {
        let mut r = Results::default();
        for line in [
            "step              total ms     max ms     min us  us / conn",
            "create id    :      185.62     140.57       7.00    1856.17",
            "connect      :     1442.82    1409.44  312014.00   14428.24",
            "@tools cm layer=raw step=connect conns=100 total_us=518900.5 per_conn_us=5189.01 \
             stats=n=100,p50_us=367375.67,p99_us=501083.99,min_us=35060.18,max_us=501203.53",
            "@@tools isl mode=event",
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]",
            " 64      500          113.80         325062.80      3866.81  \t       5739.29     \t-nan   \t\t55566.31 \t\t325062.80",
            "@tools pingpong mode=event size=64 stats=n=500,p50_us=900.00,p99_us=2000.00,min_us=1.00,max_us=3.00",
            "@tools events layer=async channels=4 conns=256 events=1792 connect_s=1 wall_s=2 events_per_s=896.0",
            "@@tools failed: tools_cm async",
        ] {
            r.add_line(line);
        }
        assert_eq!(r.cm[&("cmtime".into(), "create_id".into())], vec![1856.17]);
        assert_eq!(r.cm[&("cmtime".into(), "connect".into())], vec![14428.24]);
        assert_eq!(r.cm[&("raw".into(), "connect".into())], vec![5189.01]);
        assert_eq!(r.cm_p99[&("raw".into(), "connect".into())], vec![501083.99]);
        assert_eq!(
            r.lat[&("event".into(), "tool".into())],
            vec![(2.0 * 3866.81, 2.0 * 55566.31)]
        );
        // A line without `driver=` (from before it existed) is the threads driver's.
        assert_eq!(
            r.lat[&("event".into(), "threads".into())],
            vec![(900.0, 2000.0)]
        );
        assert_eq!(r.events[&("async".into(), 4)], vec![896.0]);
        assert_eq!(r.failures, vec!["tools_cm async".to_owned()]);
        let plan = Plan {
            cm_rounds: 1,
            lat_rounds: 1,
            iters: 500,
            event_rounds: 1,
        };
        let s = r.section(&plan, Duration::from_secs(1), "1", "1");
        assert!(
            s.contains("| raw: connect | 5189 | 14428 | 0.36 | 501084 | 0 % |"),
            "{s}"
        );
        assert!(s.contains("Failed in the VM: tools_cm async"), "{s}");
        assert!(
            s.contains(
                "| RTT p50, event mode, threads vs `ib_send_lat -R -e` | 900 | 7734 | 0.12 | \
                 2000 / 111133 | 0 % | ≤ 1.15 | yes |"
            ),
            "{s}"
        );
        // No in-task line was read: its rows say so instead of vanishing.
        assert!(
            s.contains(
                "| RTT p50, event mode, in-task vs `ib_send_lat -R -e` | – | 7734 | – | \
                 – / 111133 | – | ≤ 1.15 | no figure |"
            ),
            "{s}"
        );
    }

    #[test]
    fn parses_both_drivers_in_both_modes() {
        let mut r = Results::default();
        for line in [
            "@@tools isl mode=busy",
            " 64      300          10.00         20.00      12.50  \t       13.00     \t1.00   \t\t40.00 \t\t50.00",
            "@tools pingpong mode=busy driver=threads size=64 stats=n=300,p50_us=250.00,p99_us=1000.00,min_us=1.00,max_us=3.00",
            "@tools pingpong mode=busy driver=task size=64 stats=n=300,p50_us=50.00,p99_us=200.00,min_us=1.00,max_us=3.00",
            "@tools pingpong mode=event driver=task size=64 stats=n=300,p50_us=300.00,p99_us=600.00,min_us=1.00,max_us=3.00",
            "@tools pingpong mode=event driver=task size=64 stats=n=300,p50_us=500.00,p99_us=800.00,min_us=1.00,max_us=3.00",
        ] {
            r.add_line(line);
        }
        assert_eq!(r.lat[&("busy".into(), "tool".into())], vec![(25.0, 80.0)]);
        assert_eq!(
            r.lat[&("busy".into(), "threads".into())],
            vec![(250.0, 1000.0)]
        );
        assert_eq!(r.lat[&("busy".into(), "task".into())], vec![(50.0, 200.0)]);
        assert_eq!(
            r.lat[&("event".into(), "task".into())],
            vec![(300.0, 600.0), (500.0, 800.0)]
        );
        assert!(!r.lat.contains_key(&("event".into(), "threads".into())));
        let plan = Plan {
            cm_rounds: 1,
            lat_rounds: 2,
            iters: 300,
            event_rounds: 1,
        };
        let s = r.section(&plan, Duration::from_secs(1), "1", "1");
        for want in [
            "| RTT p50, busy-poll, threads vs `ib_send_lat -R` | 250 | 25.0 | 10.00 | 1000 / 80.0 | 0 % | ≤ 1.15 | **no** |",
            "| RTT p99, busy-poll, threads vs `ib_send_lat -R` | 1000 | 80.0 | 12.50 |  | 0 % |  |  |",
            "| RTT p50, busy-poll, in-task vs `ib_send_lat -R` | 50.0 | 25.0 | 2.00 | 200 / 80.0 | 0 % | ≤ 1.15 | **no** |",
            "| RTT p50, busy-poll, in-task vs threads | 50.0 | 250 | 0.20 | 200 / 1000 | 0 % |  |  |",
            "| RTT p50, event mode, in-task vs `ib_send_lat -R -e` | 400 | – | – | 700 / – | 50 % | ≤ 1.15 | no figure |",
            "| RTT p50, event mode, in-task vs threads | 400 | – | – | 700 / – | 50 % |  |  |",
        ] {
            assert!(s.contains(want), "{want}\n{s}");
        }
    }

    #[test]
    fn script_runs_both_drivers_in_every_ping_pong_round() {
        let plan = Plan {
            cm_rounds: 1,
            lat_rounds: 2,
            iters: 300,
            event_rounds: 1,
        };
        let s = script(Path::new("/x"), &plan);
        let pp: Vec<&str> = s.lines().filter(|l| l.starts_with("pp ")).collect();
        assert_eq!(pp.len(), 8, "{s}");
        for (i, want) in [
            "pp --iters 300 --size 64",
            "pp --iters 300 --size 64 --in-task",
            "pp --iters 300 --size 64 --busy-poll-us 1000",
            "pp --iters 300 --size 64 --busy-poll-us 1000 --in-task",
        ]
        .iter()
        .enumerate()
        {
            assert_eq!(pp[i], *want);
            assert_eq!(pp[i + 4], *want);
        }
        assert_eq!(s.lines().filter(|l| l.starts_with("isl ")).count(), 4);
    }

    #[test]
    fn parses_drain_and_its_yardstick() {
        let mut r = Results::default();
        for line in [
            "@tools events layer=drain channels=1 conns=256 rounds=8 events=2048 wall_s=0.0400 \
             round_min_s=0.0040 round_max_s=0.0060 events_per_s=50000.0 waits=0 cpu_s=0.0400 \
             runq_s=0.0010",
            "@tools events layer=drain channels=4 conns=256 rounds=8 events=2048 wall_s=0.0200 \
             round_min_s=0.0020 round_max_s=0.0030 events_per_s=80000.0 waits=3 cpu_s=0.0500 \
             runq_s=0.0200",
            "@tools events layer=spin channels=1 conns=256 rounds=8 units=2048 wall_s=0.0500 \
             units_per_s=40000.0 cpu_s=0.0500 runq_s=0.0000",
            "@tools events layer=spin channels=4 conns=256 rounds=8 units=2048 wall_s=0.0300 \
             units_per_s=70000.0 cpu_s=0.0600 runq_s=0.0300",
        ] {
            r.add_line(line);
        }
        assert_eq!(r.events[&("drain".into(), 4)], vec![80000.0]);
        assert_eq!(r.events[&("spin".into(), 4)], vec![70000.0]);
        assert_eq!(r.event_counts["spin"], vec![2048, 2048]);
        assert_eq!(r.drain_waits, vec![0, 3]);
        let plan = Plan {
            cm_rounds: 1,
            lat_rounds: 1,
            iters: 300,
            event_rounds: 1,
        };
        let s = r.section(&plan, Duration::from_secs(1), "1", "1");
        for want in [
            "| drain: events/s, 4 ch ÷ 1 ch | 80000 | 50000 | 1.60 |  | 0 % | ≥ 1.50 | yes |",
            "| drain: events/s, 2 ch ÷ 1 ch | – | 50000 | – |  | – |  |  |",
            "| spin: units/s, 4 ch ÷ 1 ch | 70000 | 40000 | 1.75 |  | 0 % |  |  |",
            "| async: events/s, 4 ch ÷ 1 ch | – | – | – |  | – | ≥ 1.50 | no figure |",
            "queued and waited in `poll`: 3 in all, over 2 `drain` runs.",
        ] {
            assert!(s.contains(want), "{want}\n{s}");
        }
    }

    #[test]
    fn script_runs_every_event_layer_in_every_events_round() {
        let plan = Plan {
            cm_rounds: 1,
            lat_rounds: 1,
            iters: 300,
            event_rounds: 2,
        };
        let s = script(Path::new("/x"), &plan);
        let runs: Vec<&str> = s.lines().filter(|l| l.contains("/tools_events ")).collect();
        assert_eq!(runs.len(), 2 * 4 * CHANNELS.len(), "{s}");
        for layer in EVENT_LAYERS {
            for c in CHANNELS {
                let want = format!("--layer {layer} --channels {c} ");
                assert_eq!(
                    runs.iter().filter(|l| l.contains(&want)).count(),
                    2,
                    "{want}"
                );
            }
        }
        for run in &runs {
            let rounds = run.contains(&format!("--rounds {DRAIN_ROUNDS}"));
            let in_flight = run.contains("--in-flight");
            if run.contains("--layer drain") || run.contains("--layer spin") {
                assert!(rounds && !in_flight, "{run}");
            } else {
                assert!(!rounds && in_flight, "{run}");
            }
        }
    }

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        let mut out = String::new();
        row_text(
            &mut out,
            "x",
            &[2.0, 2.2],
            &[2.0],
            "",
            Some(Target::AtMost(1.10)),
        );
        assert!(
            out.contains("| x | 2.1 | 2.0 | 1.05 |  | 10 % | ≤ 1.10 | yes |"),
            "{out}"
        );
        let mut out = String::new();
        row_text(
            &mut out,
            "y",
            &[1.0],
            &[1.0],
            "",
            Some(Target::AtLeast(1.5)),
        );
        assert!(out.contains("**no**"), "{out}");
    }
}
