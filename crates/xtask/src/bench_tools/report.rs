//! Rendering the tools run's markdown section from [`Results`]: the tables, their rows,
//! ratios, targets and medians; and the ratios it tracks (`--save` / `--compare`).

use std::fmt::{self, Write as _};
use std::time::Duration;

use super::parse::{Results, Rounds};
use super::{
    Plan, BUSY_POLL_US, CG_DRIVERS, CG_ITERS, CG_WARMUP, CHANNELS, DRAIN_ROUNDS, DRIVERS,
    EVENT_CONNS, EVENT_LAYERS, IN_FLIGHT, LAYERS, REMOTE, REMOTE_BW_OPS, REMOTE_LAT_OPS, STEPS,
    STREAMS, ZERO_COPY,
};

/// What begins the name of every tracked ratio of the tools run (and of no criterion row).
pub const ROW_PREFIX: &str = "tools: ";

/// One tracked ratio of the tools run: its row's name (prefixed `tools: `, without markdown
/// emphasis), its value (ours ÷ baseline, of the medians), and whether a larger value is better
/// (the events/s rows). The paired column is not tracked itself (between two runs of one library
/// it moved as much as the ratio of the medians: BENCHMARKS.md, "Pairing the tools' rounds");
/// its least and largest are the ratio's spread, which `--compare` sets beside the saved one's.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRatio {
    pub name: String,
    pub ratio: f64,
    pub higher_is_better: bool,
    /// The least and the largest of the rounds' own ratios (each round ÷ the baseline of the
    /// same round), where any round has both.
    pub spread: Option<(f64, f64)>,
}

/// The tools run's markdown section, and the ratios of its rows that `--save` / `--compare`
/// track.
#[derive(Debug, Default)]
pub(super) struct Section {
    pub(super) text: String,
    pub(super) ratios: Vec<ToolRatio>,
}

impl Section {
    fn push_str(&mut self, s: &str) {
        self.text.push_str(s);
    }
}

impl fmt::Write for Section {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.text.push_str(s);
        Ok(())
    }
}

/// Whether a row's ratio is tracked, and which way is worse.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Track {
    /// Not tracked: a yardstick of the VM, or a row whose ratio is 1 by construction.
    No,
    /// A time: larger is worse.
    Time,
    /// A rate: smaller is worse.
    Rate,
}

impl Results {
    pub(super) fn section(&self, plan: &Plan, took: Duration, load0: &str, load1: &str) -> Section {
        let mut out = Section::default();
        out.push_str("## Against rdma-core's tools\n\n");
        let _ = writeln!(
            out,
            "`cargo xtask bench --tools`: one soft-RoCE VM boot (TCG, {} vCPUs), server and client \
             in the same VM; each figure the median of the rounds (connection setup {} rounds, \
             ping-pong {} rounds of {} round trips, events {} rounds); ratio = ours ÷ baseline, \
             of the medians; paired = the median, and in brackets the least and the largest, of \
             the rounds' own ratios (ours ÷ the baseline of the same round, minutes apart at \
             most: a drift of the host's speed between rounds moves both sides of each); \
             spread = (max − min) ÷ median of ours over the rounds. Host load average before / \
             after: {load0} / {load1}; the run took {:.0} s. Under TCG only ratios mean anything.\n",
            std::env::var("EVCHAN_VM_SMP").unwrap_or_else(|_| "2".into()),
            plan.cm_rounds,
            plan.lat_rounds,
            plan.iters,
            plan.event_rounds,
            took.as_secs_f64()
        );
        let header = "| figure | ours (median) | baseline (median) | ratio | paired | p99 | spread | target | met? |\n\
                      |---|---:|---:|---:|---:|---:|---:|---:|---|\n";

        out.push_str(
            "### Connection setup, 100 connections (µs per connection, cmtime's `us / conn`)\n\n\
             Baseline `cmtime -s` (rdma-core 44); each client, `cmtime -s` included, against a fresh \
             `cmtime -b` server of its own. `core-shared` is the like-for-like row: like cmtime 44 (whose \
             `rdma_create_qp` copies the first QP's CQs back into its shared attributes) all QPs \
             share one CQ; `raw` is the same in plain librdmacm; `core` and `raw-percq` give each \
             QP its own CQs. Every layer destroys its QPs in the disconnect step, after \
             `rdma_disconnect`, as cmtime does (evchan-core: `Id::destroy_qp`), and its ids in the \
             destroy step. p99: of one connection's own time in the step (call to its event). \
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
                    self.cm.get(&key),
                    base,
                    self.cm_p99.get(&key),
                    None,
                    Track::Time,
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
                Track::Time,
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
            self.cm.get(&key("full_connect")),
            Some(&self.sum("cmtime", &setup)),
            self.cm_p99.get(&key("full_connect")),
            None,
            Track::Time,
        );
        row(
            &mut out,
            "async: close ÷ cmtime's disconnect + destroy",
            self.cm.get(&key("close")),
            Some(&self.sum("cmtime", &["disconnect", "destroy"])),
            self.cm_p99.get(&key("close")),
            None,
            Track::Time,
        );

        let _ = write!(
            out,
            "\n### 64 B ping-pong round trip (µs)\n\n\
             Ours: `tools_pingpong` (`Connection::send` then `recv`, default `Config` but for \
             `shards(1)`, the messages posted and reaped in the caller's task), on a \
             current-thread tokio runtime per side with the loop in `block_on`'s future, and on a \
             multi-thread runtime of two workers per side with the loop in `block_on`'s future \
             (each wake-up then moves from a worker to the thread in `block_on`) and in a \
             spawned task (`#[tokio::main]` with a task per connection). `core layer, no \
             runtime` is the same ping-pong through `evchan-core` alone (`--layer core`: one \
             thread per side, a signaled SEND of a registered slot per message, `Cq::poll_one` \
             spinning, or `Cq::wait` in event mode), and `core layer, tokio waits` the same in \
             one `block_on` of a current-thread runtime per side whose waits are tokio's \
             (`--tokio`: busy-poll yields every 64 empty polls, event mode waits through \
             `AsyncWaiter`): the layer under the async API, so without the target. Baseline: \
             `ib_send_lat -R [-e] -s 64 -n {}`, its half-round-trip figures doubled \
             (p50 from `t_typical`, p99 from `99% percentile`). Busy-poll: \
             `Config::busy_poll({BUSY_POLL_US} µs)`. The p99 column gives ours / the tool's.\n\n",
            plan.iters
        );
        out.push_str(header);
        let p50 = |v: Option<&Rounds<(f64, f64)>>| -> Rounds {
            v.map(|v| v.iter().map(|(r, x)| (*r, x.0)).collect())
                .unwrap_or_default()
        };
        let p99 = |v: Option<&Rounds<(f64, f64)>>| -> Rounds {
            v.map(|v| v.iter().map(|(r, x)| (*r, x.1)).collect())
                .unwrap_or_default()
        };
        for (mode, label, tool, goal) in [
            ("event", "event mode", "`ib_send_lat -R -e`", 1.15),
            ("busy", "busy-poll", "`ib_send_lat -R`", 1.20),
        ] {
            let get = |who: &str| self.lat.get(&(mode.to_owned(), who.to_owned()));
            let tool_v = get("tool");
            for (driver, _, driver_label) in DRIVERS {
                let ours = get(driver);
                let p99_text = format!(
                    "{} / {}",
                    fmt(median(&values(&p99(ours)))),
                    fmt(median(&values(&p99(tool_v))))
                );
                row_text(
                    &mut out,
                    &format!("RTT p50, {label}, {driver_label} vs {tool}"),
                    &p50(ours),
                    &p50(tool_v),
                    &p99_text,
                    // The target is the async API's; the core rows show the layer under it.
                    (!driver.starts_with("core")).then_some(Target::AtMost(goal)),
                    Track::Time,
                );
                row_text(
                    &mut out,
                    &format!("RTT p99, {label}, {driver_label} vs {tool}"),
                    &p99(ours),
                    &p99(tool_v),
                    "",
                    None,
                    Track::Time,
                );
            }
        }
        self.instructions(&mut out);
        self.throughput(&mut out, plan, header);
        self.one_sided(&mut out, plan, header);

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
            let (what, goal, track) = if *layer == "spin" {
                ("units/s", None, Track::No)
            } else {
                ("events/s", Some(Target::AtLeast(1.5)), Track::Rate)
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
                    if *c == 1 { Track::No } else { track },
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

impl Results {
    /// Instructions per round trip of the callgrind runs, and `Connection` ÷ the core's.
    fn per_round_trip(&self, flags: &str) -> Option<f64> {
        let runs = self.cg.get(flags.trim())?;
        let (short, long) = (runs.get(&CG_ITERS[0])?, runs.get(&CG_ITERS[1])?);
        Some((*long as f64 - *short as f64) / f64::from(CG_ITERS[1] - CG_ITERS[0]))
    }

    fn instructions(&self, out: &mut Section) {
        let _ = write!(
            out,
            "\n### User-space instructions per 64 B round trip (callgrind)\n\n\
             The ping-pong's client in event mode under `valgrind --tool=callgrind`, its server \
             outside it: (the total of {} round trips − the total of {}) ÷ {}, after {CG_WARMUP} \
             untimed ones, so that start-up cancels out; the kernel's instructions are not \
             counted. A wait that finds its completion already there costs fewer instructions \
             than one that sleeps, so the count moves a little with timing. Baseline: the core \
             layer with tokio's waits, same boot.\n\n\
             | figure | ours | baseline | ratio | target | met? |\n|---|---:|---:|---:|---:|---|\n",
            CG_ITERS[1],
            CG_ITERS[0],
            CG_ITERS[1] - CG_ITERS[0]
        );
        let flags_of = |d: &str| DRIVERS.iter().find(|x| x.0 == d).map_or("", |x| x.1);
        let base = self.per_round_trip(flags_of("core-tokio"));
        for (driver, flags, label) in DRIVERS.iter().filter(|d| CG_DRIVERS.contains(&d.0)) {
            let ours = self.per_round_trip(flags);
            let ratio = ours.zip(base).map(|(o, b)| o / b);
            let (t, met) = if *driver == "core-tokio" {
                (String::new(), String::new())
            } else {
                (
                    "≤ 1.50".to_owned(),
                    ratio.map_or("no figure".into(), |r| yes(r <= 1.5)),
                )
            };
            let _ = writeln!(
                out,
                "| instructions per round trip, {label} vs core layer, tokio waits | {} | {} | {} | {t} | {met} |",
                fmt(ours),
                fmt(base),
                ratio.map_or_else(|| "–".into(), |r| format!("{r:.2}")),
            );
            if let Some(r) = ratio.filter(|_| *driver != "core-tokio") {
                out.ratios.push(ToolRatio {
                    name: format!("{ROW_PREFIX}instructions per round trip, {label}"),
                    ratio: r,
                    higher_is_better: false,
                    spread: None,
                });
            }
        }
    }

    /// The throughput table: `tools_stream` against `ib_send_bw`, each mode against the tool in
    /// the same mode.
    fn throughput(&self, out: &mut Section, plan: &Plan, header: &str) {
        let _ = write!(
            out,
            "\n### One-way throughput, the window full\n\n\
             Ours: `tools_stream` (default `Config` but for `max_message`, raised to the size; \
             a multi-thread runtime of two workers per side, a task per connection), each task \
             sending as fast as the peer's credits let it; the server's tasks receive and drop \
             the messages, then reply with one byte; the clock runs from the first send to the \
             last reply. Baseline: `ib_send_bw -R [-e] -s SIZE -n COUNT [-q 4]` (its `MsgRate` \
             and `BW average`), right before ours in each round; {} rounds. Event mode: ours \
             sleeping on the completion channel when it waits, against `ib_send_bw -R -e`; \
             busy-poll: `Config::busy_poll({BUSY_POLL_US} µs)` against `ib_send_bw -R`, which \
             polls always. Zero-copy: `tools_stream --zero-copy B`, the messages sent from B \
             registered buffers (`Connection::send_buffer`), B in flight at once, against \
             `ib_send_bw -R -e`, right before ours in each round. MB = 2^20 bytes.\n\n",
            plan.stream_rounds
        );
        out.push_str(header);
        for (mode, label, tool) in [
            ("event", "event mode", "`ib_send_bw -R -e`"),
            ("busy", "busy-poll", "`ib_send_bw -R`"),
        ] {
            for (size, _, conns) in STREAMS {
                let get = |who: &str, mb: bool| -> Rounds {
                    self.bw
                        .get(&(mode.to_owned(), *size, *conns, who.to_owned()))
                        .map(|v| {
                            v.iter()
                                .map(|(r, x)| (*r, if mb { x.1 } else { x.0 }))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let mb = *size >= 65536;
                let (what, target) = if mb {
                    ("MB/s", Target::AtLeast(0.95))
                } else {
                    ("messages/s", Target::AtLeast(0.80))
                };
                let size_label = if *size >= 1024 {
                    format!("{} KiB", size / 1024)
                } else {
                    format!("{size} B")
                };
                let conns_label = if *conns == 1 {
                    "1 connection".to_owned()
                } else {
                    format!("{conns} connections")
                };
                row_text(
                    out,
                    &format!("{what}, {size_label}, {conns_label}, {label} vs {tool}"),
                    &get("ours", mb),
                    &get("tool", mb),
                    "",
                    Some(target),
                    Track::Rate,
                );
            }
        }
        for (size, _, buffers) in ZERO_COPY {
            let get = |who: &str| -> Rounds {
                self.bw
                    .get(&("event-zc".to_owned(), *size, 1, who.to_owned()))
                    .map(|v| v.iter().map(|(r, x)| (*r, x.1)).collect())
                    .unwrap_or_default()
            };
            row_text(
                out,
                &format!(
                    "MB/s, {} KiB, 1 connection, zero-copy from {buffers} registered buffers, \
                     event mode vs `ib_send_bw -R -e`",
                    size / 1024
                ),
                &get("ours"),
                &get("tool"),
                "",
                Some(Target::AtLeast(0.95)),
                Track::Rate,
            );
        }
    }
}

impl Results {
    /// The one-sided table: `tools_remote` against perftest's READ, atomic and WRITE tools.
    fn one_sided(&self, out: &mut Section, plan: &Plan, header: &str) {
        let _ = write!(
            out,
            "\n### One-sided operations\n\n\
             Ours: `tools_remote` (one `Connection`, default `Config` but for `max_message`, \
             raised to the size, and `send_depth` 16; a current-thread runtime per side): \
             latency is one operation at a time, {REMOTE_LAT_OPS} of them, each timed from its \
             call to its completion (the p50, µs): a READ of 64 B or a fetch-and-add; \
             bandwidth is {} READs or WRITEs of 64 KiB by 16 tasks on the connection, each \
             copied through a send slot (MB/s, 2^20 bytes). Baseline: `ib_read_lat -R [-e] -s \
             64` and `ib_atomic_lat -R [-e]` (`t_typical`: a READ's or an atomic's whole time, \
             not halved), `ib_write_bw -R -s 65536` (no event mode: both of ours against its \
             polling) and `ib_read_bw -R [-e] -s 65536` (`BW average`), each right before ours; \
             {} rounds. Busy-poll: `Config::busy_poll({BUSY_POLL_US} µs)`.\n\n",
            (REMOTE_BW_OPS / plan.stream_scale).max(1),
            plan.remote_rounds
        );
        out.push_str(header);
        for (fig, _, tool) in REMOTE {
            let get = |who: &str| {
                self.remote
                    .get(&((*fig).to_owned(), who.to_owned()))
                    .cloned()
                    .unwrap_or_default()
            };
            let busy = fig.ends_with("-busy");
            let mode = if busy { "busy-poll" } else { "event mode" };
            let (bin, args) = tool.split_once(' ').unwrap_or((tool, ""));
            let tool = format!(
                "`{bin} -R{}{}`",
                if args.is_empty() { "" } else { " " },
                args
            );
            let (name, target, track) = match &fig[..fig.find('-').unwrap_or(0)] {
                "read" if fig.contains("-lat-") => {
                    ("READ 64 B latency p50", Target::AtMost(1.15), Track::Time)
                }
                "atomic" => (
                    "fetch-and-add latency p50",
                    Target::AtMost(1.15),
                    Track::Time,
                ),
                "write" => ("MB/s, WRITE 64 KiB", Target::AtLeast(0.95), Track::Rate),
                _ => ("MB/s, READ 64 KiB", Target::AtLeast(0.95), Track::Rate),
            };
            row_text(
                out,
                &format!("{name}, {mode} vs {tool}"),
                &get("ours"),
                &get("tool"),
                "",
                Some(target),
                track,
            );
        }
    }
}

/// A table row whose p99 column is the median of the rounds' p99s.
fn row(
    out: &mut Section,
    name: &str,
    ours: Option<&Rounds>,
    base: Option<&Rounds>,
    p99: Option<&Rounds>,
    target: Option<Target>,
    track: Track,
) {
    let none = Rounds::new();
    let p99 = p99.map_or_else(String::new, |p| fmt(median(&values(p))));
    row_text(
        out,
        name,
        ours.unwrap_or(&none),
        base.unwrap_or(&none),
        &p99,
        target,
        track,
    );
}

/// A table row, and its ratio among the tracked ones (where it has one and `track` says so).
fn row_text(
    out: &mut Section,
    name: &str,
    ours: &Rounds,
    base: &Rounds,
    p99: &str,
    target: Option<Target>,
    track: Track,
) {
    let ours_v = values(ours);
    let (o, b) = (median(&ours_v), median(&values(base)));
    let ratio = match (o, b) {
        (Some(o), Some(b)) if b > 0.0 => Some(o / b),
        _ => None,
    };
    let paired = paired(ours, base);
    let spread = o.filter(|m| *m > 0.0).map(|m| {
        let (lo, hi) = ours_v
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
        "| {name} | {} | {} | {} | {} | {p99} | {} | {t} | {met} |",
        fmt(o),
        fmt(b),
        ratio.map_or_else(|| "–".into(), |r| format!("{r:.2}")),
        paired.map_or_else(
            || "–".into(),
            |p| format!("{:.2} ({:.2}–{:.2})", p.median, p.min, p.max)
        ),
        spread.unwrap_or_else(|| "–".into()),
    );
    if let Some(r) = ratio.filter(|r| r.is_finite() && track != Track::No) {
        out.ratios.push(ToolRatio {
            name: format!("{ROW_PREFIX}{}", name.replace("**", "")),
            ratio: r,
            higher_is_better: track == Track::Rate,
            spread: paired.map(|p| (p.min, p.max)),
        });
    }
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "**no**" }.into()
}

/// The rounds' values, in round order.
fn values(r: &Rounds) -> Vec<f64> {
    r.values().copied().collect()
}

/// The rounds' own ratios, ours ÷ the baseline of the same round, summed up.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Paired {
    median: f64,
    min: f64,
    max: f64,
}

/// [`Paired`] over the rounds that read both sides (a baseline of 0 left out); `None` where
/// there is no such round.
fn paired(ours: &Rounds, base: &Rounds) -> Option<Paired> {
    let ratios: Vec<f64> = ours
        .iter()
        .filter_map(|(r, o)| base.get(r).filter(|b| **b > 0.0).map(|b| o / b))
        .collect();
    Some(Paired {
        median: median(&ratios)?,
        min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    })
}

/// The median (the mean of the middle two for an even count); `None` when empty.
pub(crate) fn median(v: &[f64]) -> Option<f64> {
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

    /// `v` as rounds 1, 2, ….
    fn rounds(v: &[f64]) -> Rounds {
        (1..).zip(v.iter().copied()).collect()
    }

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        let mut out = Section::default();
        row_text(
            &mut out,
            "**x**",
            &rounds(&[2.0, 2.2]),
            &rounds(&[2.0]),
            "",
            Some(Target::AtMost(1.10)),
            Track::Time,
        );
        assert!(
            out.text.contains(
                "| **x** | 2.1 | 2.0 | 1.05 | 1.00 (1.00–1.00) |  | 10 % | ≤ 1.10 | yes |"
            ),
            "{}",
            out.text
        );
        let mut out = Section::default();
        row_text(
            &mut out,
            "y",
            &rounds(&[1.0]),
            &rounds(&[1.0]),
            "",
            Some(Target::AtLeast(1.5)),
            Track::Rate,
        );
        assert!(out.text.contains("**no**"), "{}", out.text);
    }

    #[test]
    fn tracked_ratios() {
        let mut out = Section::default();
        for (name, ours, base, track) in [
            ("**t**", &[3.0][..], &[2.0][..], Track::Time),
            ("r", &[1.0, 3.0], &[1.0], Track::Rate),
            ("spin", &[2.0], &[1.0], Track::No),
            ("none", &[], &[1.0], Track::Time),
            ("zero", &[1.0], &[0.0], Track::Time),
        ] {
            row_text(
                &mut out,
                name,
                &rounds(ours),
                &rounds(base),
                "",
                None,
                track,
            );
        }
        assert_eq!(
            out.ratios,
            vec![
                ToolRatio {
                    name: "tools: t".into(),
                    ratio: 1.5,
                    higher_is_better: false,
                    spread: Some((1.5, 1.5)),
                },
                ToolRatio {
                    name: "tools: r".into(),
                    ratio: 2.0,
                    higher_is_better: true,
                    spread: Some((1.0, 1.0)),
                },
            ]
        );
    }
}
