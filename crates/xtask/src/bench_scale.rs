//! `cargo xtask bench --scale [--quick]`: many connections to one server, across two VMs (the
//! server, `examples/tools_scale.rs --serve`, in VM a; the clients in VM b), each burst after a
//! `cmtime -c N` of the same size in the same boot. Per burst: the setup rate with 64 connects
//! in flight against cmtime's (its steps from a new id to `ESTABLISHED`), memory and
//! descriptors per connection on both sides, and each side's memory a few seconds after the
//! burst closed; the generated section goes into docs/BENCHMARKS.md, and the memory of the
//! largest burst against its open connections into docs/bench-scale.svg.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cargo::cargo;
use crate::{target_dir, vm, Result};

/// The bursts: connections asked for at once.
const STEPS: &[usize] = &[1_000, 2_000, 5_000, 10_000];
const QUICK_STEPS: &[usize] = &[1_000, 2_000];
const PORT: u16 = 7495;
/// Connects in flight at once.
const IN_FLIGHT: usize = 64;
/// The server's `Config::memory_budget`: so that a burst beyond it meets typed rejects, not
/// the OOM killer, in the 1 GiB VM. It counts the connections' slots (each at least its
/// admission, 40 KiB with the defaults: 11,264 connections at most), not their QP's and CQ's
/// queues (about 35 KiB more each), so the process stays within twice the budget.
const SERVER_BUDGET_MIB: u64 = 440;
/// The client starts no new connect past this much resident memory (its VM has 1 GiB).
const CLIENT_RSS_LIMIT_MIB: u64 = 700;
/// cmtime 44's steps from a new id to `ESTABLISHED`, as it names them.
const CM_STEPS: &[&str] = &[
    "create id",
    "resolve addr",
    "resolve route",
    "create qp",
    "connect",
];
/// Targets of the issue "Ten thousand connections on one small server".
const TARGET_KIB: f64 = 16.0;
const TARGET_FDS: f64 = 0.01;
const TARGET_AFTER: f64 = 0.10;
const TARGET_RATE: f64 = 1.0;

/// The server's shell line (VM a): its address with the interface's index as the scope.
fn server_line(examples: &Path) -> String {
    let e = vm::shell_join(&[examples.display().to_string()]);
    format!(
        "ulimit -l unlimited; ulimit -n 65536; idx=$(cat /sys/class/net/eth0/ifindex); \
         ip=${{EVCHAN_SELF%\\%*}}; exec timeout 3000 {e}/tools_scale --serve \"[$ip%$idx]:{PORT}\" \
         --memory-budget-mib {SERVER_BUDGET_MIB}"
    )
}

/// The client's script (VM b): per burst, a fresh `cmtime -b` in VM a, `cmtime -s -c N`, then
/// the evchan burst, then 5 s for the server's report of it (its connections gone for 3 s); at
/// the end the server is told to quit.
fn client_script(examples: &Path, steps: &[usize]) -> String {
    let e = vm::shell_join(&[examples.display().to_string()]);
    let mut s = format!(
        "ulimit -l unlimited; ulimit -n 65536\n\
         idx=$(cat /sys/class/net/eth0/ifindex); ip=${{EVCHAN_PEER%\\%*}}\n\
         S=\"[$ip%$idx]:{PORT}\"; E={e}; status=0\n\
         fail() {{ echo \"@@scale failed: $*\"; status=1; }}\n"
    );
    for n in steps {
        let _ = writeln!(
            s,
            "echo '@@scale step={n}'\n\
             $E/tools_scale --connect \"$S\" --ask cmtime || fail cmtime server {n}\n\
             timeout 900 cmtime -s \"$EVCHAN_PEER\" -c {n} || fail cmtime {n}\n\
             timeout 1200 $E/tools_scale --connect \"$S\" --connections {n} --in-flight {IN_FLIGHT} \
             --rss-limit-mib {CLIENT_RSS_LIMIT_MIB} --settle-ms 3000 || fail tools_scale {n}\n\
             sleep 5"
        );
    }
    s.push_str("$E/tools_scale --connect \"$S\" --ask quit || fail quit\nexit $status\n");
    s
}

/// `key=value` fields of a result line.
fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A number field; NaN when missing.
fn num(f: &BTreeMap<String, String>, key: &str) -> f64 {
    f.get(key).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// A result line's fields.
type Fields = BTreeMap<String, String>;
/// Samples: (open connections, resident KiB).
type Samples = Vec<(f64, f64)>;

/// One burst: what each side said.
#[derive(Debug, Default)]
struct Step {
    asked: usize,
    /// cmtime's steps from a new id to `ESTABLISHED`: total ms each, by name.
    cmtime_ms: BTreeMap<String, f64>,
    client: Option<Fields>,
    server: Option<Fields>,
    client_samples: Samples,
    server_samples: Samples,
}

impl Step {
    /// cmtime's rate (connections/s), from its steps' total times.
    fn cmtime_rate(&self) -> Option<f64> {
        (self.cmtime_ms.len() == CM_STEPS.len())
            .then(|| self.asked as f64 / (self.cmtime_ms.values().sum::<f64>() / 1e3))
    }
}

/// The run's output, read line by line.
#[derive(Debug, Default)]
struct Results {
    steps: Vec<Step>,
    /// The server's bursts in order, with their samples.
    bursts: Vec<(Fields, Samples)>,
    server_samples: Samples,
    failures: Vec<String>,
}

impl Results {
    fn add_line(&mut self, line: &str) {
        if let Some(l) = line.strip_prefix("[a] ") {
            if let Some(rest) = l.strip_prefix("@tools scale-sample ") {
                let f = fields(rest);
                self.server_samples
                    .push((num(&f, "open"), num(&f, "rss_kib")));
            } else if let Some(rest) = l.strip_prefix("@tools scale-server ") {
                let samples = std::mem::take(&mut self.server_samples);
                self.bursts.push((fields(rest), samples));
            }
            return;
        }
        let Some(l) = line.strip_prefix("[b] ") else {
            return;
        };
        if let Some(n) = l.strip_prefix("@@scale step=") {
            self.steps.push(Step {
                asked: n.trim().parse().unwrap_or(0),
                ..Step::default()
            });
        } else if let Some(what) = l.strip_prefix("@@scale failed: ") {
            self.failures.push(what.to_owned());
        } else if let Some(step) = self.steps.last_mut() {
            if let Some(rest) = l.strip_prefix("@tools scale-sample ") {
                let f = fields(rest);
                step.client_samples
                    .push((num(&f, "open"), num(&f, "rss_kib")));
            } else if let Some(rest) = l.strip_prefix("@tools scale-client ") {
                step.client = Some(fields(rest));
            } else if let Some((name, values)) = l.split_once(':') {
                // cmtime 44: `%-13s: total_ms max_ms min_us us_per_conn`.
                let name = name.trim();
                let total = values
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok());
                if let (true, Some(total)) = (CM_STEPS.contains(&name), total) {
                    step.cmtime_ms.insert(name.to_owned(), total);
                }
            }
        }
    }

    /// The server's bursts, each to its step (in order; a step whose client opened no
    /// connection has none).
    fn pair(&mut self) {
        let mut bursts = std::mem::take(&mut self.bursts).into_iter();
        for step in &mut self.steps {
            let opened = step.client.as_ref().map_or(0.0, |c| num(c, "opened"));
            if opened >= 100.0 {
                if let Some((f, samples)) = bursts.next() {
                    step.server = Some(f);
                    step.server_samples = samples;
                }
            }
        }
    }
}

/// `x` with `d` decimals, or `–` when it is not a number.
fn fmt(x: f64, d: usize) -> String {
    if x.is_finite() {
        format!("{x:.d$}")
    } else {
        "–".into()
    }
}

/// Met or missed, or not measured.
fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "missed",
        None => "not measured",
    }
}

/// A side's cost per connection: (KiB of memory, descriptors), and its memory before and
/// after the burst (KiB).
struct Cost {
    kib: f64,
    fds: f64,
    before: f64,
    after: f64,
    /// KiB of `after` in transparent huge pages (`NaN` when the line does not say).
    huge: f64,
}

/// A side's [`Cost`] from its result line: `n` connections, and its fields of memory and
/// descriptors with them (`rss_open_kib` and `fds_open` for the client, the peaks for the
/// server).
fn cost(f: &Fields, n: &str, rss: &str, fds: &str) -> Cost {
    let n = num(f, n);
    Cost {
        kib: (num(f, rss) - num(f, "rss_before_kib")) / n,
        fds: (num(f, fds) - num(f, "fds_before")) / n,
        before: num(f, "rss_before_kib"),
        after: num(f, "rss_after_kib"),
        huge: num(f, "anon_huge_after_kib"),
    }
}

fn client_cost(c: &Fields) -> Cost {
    cost(c, "opened", "rss_open_kib", "fds_open")
}

fn server_cost(s: &Fields) -> Cost {
    cost(s, "peak", "rss_peak_kib", "fds_peak")
}

/// `before → after MiB (+x %)`, and `; y MiB huge pages` when some of `after` is.
fn after(c: &Cost) -> String {
    let huge = if c.huge > 0.0 {
        format!("; {} MiB huge pages", fmt(c.huge / 1024.0, 1))
    } else {
        String::new()
    };
    format!(
        "{} → {} MiB ({:+.0} %{huge})",
        fmt(c.before / 1024.0, 1),
        fmt(c.after / 1024.0, 1),
        (c.after / c.before - 1.0) * 100.0
    )
}

/// The markdown section.
fn section(r: &Results, took: Duration) -> String {
    let mut s = String::from(
        "### Many connections\n\n\
         `cargo xtask bench --scale`: one server process (`examples/tools_scale.rs --serve`, a \
         default `Config` with a `memory_budget`) in one VM, the client in another (1 GiB and \
         one vCPU each, on the virtual wire); per burst, N connections with 64 connects in \
         flight, each echoing one 64-byte message, all held open, then closed at once. The \
         baseline is rdma-core's `cmtime -c N` in the same boot: its rate is N over its steps \
         from a new id to `ESTABLISHED` (create id, resolve addr, resolve route, create qp, \
         connect); evchan's is the connections opened over the time from the first connect to the \
         last echo (rejected requests take their part of that time). Memory is resident memory \
         (`VmRSS`): the client's with all its connections open, the server's highest while they \
         were, less its memory before: the client's after one connection opened and closed \
         and evchan's runtime ended (a client's runtime ends with its last connection), the \
         server's at its start (its listener bound); \"after\" is 3 s after the last \
         connection closed, with the part of it in transparent huge pages. The VMs run Debian's \
         kernel, whose huge pages are `always`: khugepaged may fold a range of a malloc arena \
         that was given back but still has a page in use into one huge page again, up to 2 MiB \
         each, at any time, so a process's \"after\" moves by megabytes from run to run.\n\n",
    );
    let _ = writeln!(
        s,
        "The server's budget is {SERVER_BUDGET_MIB} MiB of connection buffers (beyond it, typed \
         busy rejects); the client starts no connect once it holds {CLIENT_RSS_LIMIT_MIB} MiB.\n"
    );
    s.push_str(
        "| N asked | opened | busy rejects | setup/s, evchan | setup/s, cmtime | ratio | \
         KiB per connection, client / server | descriptors per connection, client / server | \
         client memory, before → after | server memory, before → after |\n\
         |---:|---:|---:|---:|---:|---:|---|---|---|---|\n",
    );
    let (mut kib_ok, mut fds_ok, mut after_ok, mut rate_ok) =
        (None::<bool>, None::<bool>, None::<bool>, None::<bool>);
    let and = |v: &mut Option<bool>, ok: bool| *v = Some(v.unwrap_or(true) && ok);
    for st in &r.steps {
        let Some(c) = &st.client else {
            let _ = writeln!(s, "| {} | (no result) | | | | | | | | |", st.asked);
            continue;
        };
        let cc = client_cost(c);
        let rate = num(c, "rate_per_s");
        let base = st.cmtime_rate().unwrap_or(f64::NAN);
        let ratio = rate / base;
        if ratio.is_finite() {
            and(&mut rate_ok, ratio >= TARGET_RATE);
        }
        let busy = match c.get("busy_causes").map(String::as_str) {
            Some("-") | None => c.get("busy").cloned().unwrap_or_default(),
            Some(causes) => format!("{} ({causes})", c.get("busy").cloned().unwrap_or_default()),
        };
        let stopped = if c.get("stopped").is_some_and(|v| v == "1") {
            " (client memory limit)"
        } else {
            ""
        };
        let (skib, sfds, safter) = match &st.server {
            Some(sv) => {
                let sc = server_cost(sv);
                and(&mut kib_ok, sc.kib <= TARGET_KIB);
                and(&mut fds_ok, sc.fds <= TARGET_FDS);
                and(&mut after_ok, sc.after <= sc.before * (1.0 + TARGET_AFTER));
                (fmt(sc.kib, 1), fmt(sc.fds, 4), after(&sc))
            }
            None => ("–".into(), "–".into(), "–".into()),
        };
        and(&mut kib_ok, cc.kib <= TARGET_KIB);
        and(&mut fds_ok, cc.fds <= TARGET_FDS);
        and(&mut after_ok, cc.after <= cc.before * (1.0 + TARGET_AFTER));
        let _ = writeln!(
            s,
            "| {} | {}{stopped} | {busy} | {} | {} | {} | {} / {skib} | {} / {sfds} | {} | {safter} |",
            st.asked,
            c.get("opened").cloned().unwrap_or_default(),
            fmt(rate, 0),
            fmt(base, 0),
            fmt(ratio, 2),
            fmt(cc.kib, 1),
            fmt(cc.fds, 4),
            after(&cc),
        );
    }
    let _ = writeln!(
        s,
        "\nTargets (both sides, every burst): ≤ {TARGET_KIB} KiB per connection: {}; ≤ \
         {TARGET_FDS} descriptors per connection: {}; memory within {:.0} % of its value before \
         the burst, 3 s after: {}; setup rate ≥ {TARGET_RATE}× cmtime's: {}.",
        verdict(kib_ok),
        verdict(fds_ok),
        TARGET_AFTER * 100.0,
        verdict(after_ok),
        verdict(rate_ok)
    );
    if !r.failures.is_empty() {
        let _ = writeln!(s, "\nFailed in this run: {}.", r.failures.join("; "));
    }
    let _ = writeln!(
        s,
        "\n![resident memory against open connections, largest burst](bench-scale.svg)\n\n\
         The run took {:.0} s.",
        took.as_secs_f64()
    );
    s
}

/// The SVG: resident memory (MiB) against open connections, both sides, the burst that
/// opened the most.
fn svg(r: &Results) -> Option<String> {
    let st = r
        .steps
        .iter()
        .max_by_key(|st| st.client.as_ref().map_or(0, |c| num(c, "opened") as usize))?;
    let series = [
        ("client", "#1f77b4", &st.client_samples),
        ("server", "#d62728", &st.server_samples),
    ];
    let max_x = series
        .iter()
        .flat_map(|(_, _, v)| v.iter().map(|p| p.0))
        .fold(1.0_f64, f64::max);
    let max_y = series
        .iter()
        .flat_map(|(_, _, v)| v.iter().map(|p| p.1 / 1024.0))
        .fold(1.0_f64, f64::max);
    let (w, h, left, bottom, top, right) = (720.0, 420.0, 70.0, 50.0, 40.0, 30.0);
    let x = |v: f64| left + v / max_x * (w - left - right);
    let y = |v: f64| h - bottom - v / max_y * (h - top - bottom);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"20\" font-size=\"14\">resident memory (MiB) against open \
         connections, a burst of {} asked</text>\n",
        st.asked
    );
    let _ = writeln!(
        s,
        "<line x1=\"{left}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"black\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{0}\" stroke=\"black\"/>\n\
         <text x=\"{left}\" y=\"{2}\">0</text><text x=\"{1}\" y=\"{2}\" text-anchor=\"end\">{3:.0} connections</text>\n\
         <text x=\"{4}\" y=\"{top}\" text-anchor=\"end\">{5:.0}</text><text x=\"{4}\" y=\"{0}\" text-anchor=\"end\">0</text>",
        h - bottom,
        w - right,
        h - bottom + 18.0,
        max_x,
        left - 6.0,
        max_y
    );
    for (i, (name, colour, points)) in series.iter().enumerate() {
        let pts: Vec<String> = points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(n, kib)| format!("{:.1},{:.1}", x(n), y(kib / 1024.0)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>\n\
             <text x=\"{}\" y=\"{}\" fill=\"{colour}\">{name}</text>",
            pts.join(" "),
            left + 10.0,
            top + 16.0 * (i as f64 + 1.0)
        );
    }
    s.push_str("</svg>\n");
    Some(s)
}

/// Builds `tools_scale`, runs the bursts across two VMs, writes the section into
/// docs/BENCHMARKS.md and the plot into docs/bench-scale.svg; the run's exit status.
pub fn run(quick: bool) -> Result<i32> {
    let ok = cargo(&["build", "--release", "--quiet", "--example", "tools_scale"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Err("building examples/tools_scale.rs failed".into());
    }
    crate::setup::ensure()?;
    let examples = target_dir().join("release/examples");
    let steps = if quick { QUICK_STEPS } else { STEPS };
    let started = Instant::now();
    let job = vm::Job {
        server: Some(server_line(&examples)),
        command: client_script(&examples, steps),
        env: vec![("EVCHAN_REQUIRE_DEVICE".into(), "1".into())],
        timeout: Duration::from_secs(3600),
        ..crate::job()
    };
    let mut results = Results::default();
    let outcome = vm::run(&job, &mut |line| {
        if !line.contains("@tools scale-sample") {
            println!("{line}");
        }
        results.add_line(line);
    })?;
    results.pair();
    let text = section(&results, started.elapsed());
    println!("\n{text}");
    let docs = crate::root().join("docs");
    crate::bench::write_scale(&docs.join("BENCHMARKS.md"), &text)?;
    if let Some(plot) = svg(&results) {
        let path = docs.join("bench-scale.svg");
        std::fs::write(&path, plot).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    println!(
        "wrote the many-connections section into docs/BENCHMARKS.md, and docs/bench-scale.svg"
    );
    if outcome.code != 0 || !results.failures.is_empty() {
        eprintln!(
            "xtask: the scale run failed (status {}): {}",
            outcome.code,
            results.failures.join("; ")
        );
        return Ok(1);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_sides_and_pairs_each_burst_with_its_step() {
        let mut r = Results::default();
        for line in [
            "[b] @@scale step=1000",
            "[b] create id    :      100.00       7.33      10.00     100.00",
            "[b] resolve addr :      100.00      63.07   17726.00     100.00",
            "[b] resolve route:      100.00      22.52    1544.00     100.00",
            "[b] create qp    :      100.00       7.28     234.00     100.00",
            "[b] connect      :      600.00    1395.77  107889.00     600.00",
            "[b] disconnect   :      799.95     326.39    2481.00    2666.50",
            "[a] @tools scale-sample side=server open=10 rss_kib=5000",
            "[b] @tools scale-sample side=client open=20 rss_kib=6000",
            "[b] @tools scale-client asked=1000 opened=1000 busy=0 busy_causes=- failed=0 \
             stopped=0 setup_s=2 rate_per_s=500.0 close_s=1 rss_before_kib=2000 \
             rss_open_kib=202000 rss_after_kib=2100 fds_before=8 fds_open=18 fds_after=8",
            "[a] @tools scale-server peak=1000 rss_before_kib=3000 rss_peak_kib=103000 \
             rss_after_kib=6000 anon_huge_after_kib=2048 fds_before=15 fds_peak=16 fds_after=15",
            "[b] @@scale step=2000",
            "[b] @@scale failed: tools_scale 2000",
        ] {
            r.add_line(line);
        }
        r.pair();
        assert_eq!(r.steps.len(), 2);
        let st = &r.steps[0];
        assert_eq!(st.cmtime_rate(), Some(1000.0));
        assert_eq!(st.server_samples, vec![(10.0, 5000.0)]);
        assert_eq!(st.client_samples, vec![(20.0, 6000.0)]);
        let c = client_cost(st.client.as_ref().unwrap());
        assert_eq!((c.kib, c.fds), (200.0, 0.01));
        let s = server_cost(st.server.as_ref().unwrap());
        assert_eq!((s.kib, s.fds), (100.0, 0.001));
        assert_eq!(after(&s), "2.9 → 5.9 MiB (+100 %; 2.0 MiB huge pages)");
        assert_eq!(after(&c), "2.0 → 2.1 MiB (+5 %)");
        assert!(r.steps[1].server.is_none());
        let text = section(&r, Duration::from_secs(60));
        assert!(
            text.contains("| 1000 | 1000 | 0 | 500 | 1000 | 0.50 | 200.0 / 100.0 |"),
            "{text}"
        );
        assert!(text.contains("≤ 16 KiB per connection: missed"), "{text}");
        assert!(
            text.contains("≤ 0.01 descriptors per connection: met"),
            "{text}"
        );
        assert!(text.contains("3 s after: missed"), "{text}");
        assert!(
            text.contains("Failed in this run: tools_scale 2000."),
            "{text}"
        );
        assert!(svg(&r).unwrap().contains("<polyline"));
    }
}
