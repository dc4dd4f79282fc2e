//! What `cargo xtask bench` makes of a run: medians from criterion's samples, instructions from
//! callgrind, the ratios (saved and compared), `docs/BENCHMARKS.md` and the SVG plot.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{BASELINE, WORSE};
use crate::Result;

/// The targets of issue 9 (ours ÷ baseline, medians): `(figure, variant, at most)`.
const TARGETS: &[(&str, &str, f64)] = &[
    ("cm_event/resolve_addr", "evchan", 1.05),
    ("cm_event/queued_ack", "evchan", 1.05),
    ("cq_event/send_completion", "evchan", 1.05),
    ("cq_event/poll_empty", "evchan", 1.05),
    ("cm_event/resolve_addr", "async", 1.25),
    ("cq_event/send_completion", "async", 1.25),
];

/// Where the generated part of BENCHMARKS.md begins and ends; what lies outside is kept.
const BEGIN: &str = "<!-- cargo xtask bench: generated part, begin -->";
const END: &str = "<!-- cargo xtask bench: generated part, end -->";

/// One benchmark's samples: nanoseconds per iteration of each of criterion's samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub variant: String,
    pub per_iter: Vec<f64>,
}

impl Series {
    pub fn median(&self) -> f64 {
        quantile(&self.per_iter, 0.5)
    }

    /// The interquartile range as a fraction of the median.
    pub fn spread(&self) -> f64 {
        (quantile(&self.per_iter, 0.75) - quantile(&self.per_iter, 0.25)) / self.median()
    }
}

/// One figure (criterion group): its variants, the baseline among them.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub group: String,
    pub series: Vec<Series>,
}

impl Figure {
    pub fn baseline(&self) -> Option<&Series> {
        self.series.iter().find(|s| s.variant == BASELINE)
    }

    /// The variants other than the baseline.
    pub fn ours(&self) -> impl Iterator<Item = &Series> {
        self.series.iter().filter(|s| s.variant != BASELINE)
    }

    /// `cm_event/resolve_addr` → `resolve_addr`, the name the callgrind counts use.
    fn short(&self) -> &str {
        self.group.rsplit_once('/').map_or(&self.group, |(_, f)| f)
    }
}

/// The `q` quantile (linear between the closest ranks) of `v`; NaN when empty.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let pos = q * (s.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
}

/// Every benchmark under `home` (criterion's directory) with samples of this run
/// (`<dir>/<fn>/new/{benchmark,sample}.json`), grouped into figures, sorted by name.
pub fn figures(home: &Path) -> Result<Vec<Figure>> {
    let mut found: Vec<(String, String, Vec<f64>)> = Vec::new();
    for new in new_dirs(home) {
        let read = |f: &str| std::fs::read_to_string(new.join(f)).ok();
        let (Some(bench), Some(sample)) = (read("benchmark.json"), read("sample.json")) else {
            continue;
        };
        let (Some(group), Some(function)) = (
            json_string(&bench, "group_id"),
            json_string(&bench, "function_id"),
        ) else {
            continue;
        };
        let (Some(iters), Some(times)) = (
            json_numbers(&sample, "iters"),
            json_numbers(&sample, "times"),
        ) else {
            continue;
        };
        let per_iter = iters
            .iter()
            .zip(&times)
            .filter(|(i, _)| **i > 0.0)
            .map(|(i, t)| t / i)
            .collect();
        found.push((group, function, per_iter));
    }
    found.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let mut out: Vec<Figure> = Vec::new();
    for (group, variant, per_iter) in found {
        let series = Series { variant, per_iter };
        match out.last_mut() {
            Some(f) if f.group == group => f.series.push(series),
            _ => out.push(Figure {
                group,
                series: vec![series],
            }),
        }
    }
    // Within a figure: evchan, async, other variants, then the baseline.
    let rank = |v: &str| match v {
        "evchan" => 0,
        "async" => 1,
        BASELINE => 3,
        _ => 2,
    };
    for f in &mut out {
        f.series.sort_by_key(|s| rank(&s.variant));
    }
    Ok(out)
}

/// The `new` directories two levels below `home` (`<group dir>/<function>/new`).
fn new_dirs(home: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let subdirs = |p: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    };
    for group in subdirs(home) {
        for function in subdirs(&group) {
            let new = function.join("new");
            if new.is_dir() {
                out.push(new);
            }
        }
    }
    out
}

/// The string value of `"key":"…"` in criterion's compact JSON.
fn json_string(json: &str, key: &str) -> Option<String> {
    let start = json.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let len = json[start..].find('"')?;
    Some(json[start..start + len].to_owned())
}

/// The array of numbers `"key":[…]` in criterion's compact JSON.
fn json_numbers(json: &str, key: &str) -> Option<Vec<f64>> {
    let start = json.find(&format!("\"{key}\":["))? + key.len() + 4;
    let len = json[start..].find(']')?;
    json[start..start + len]
        .split(',')
        .map(|n| n.trim().parse().ok())
        .collect()
}

/// Whether every figure has a baseline and another variant.
pub fn complete(figures: &[Figure]) -> bool {
    !figures.is_empty()
        && figures
            .iter()
            .all(|f| f.baseline().is_some() && f.ours().next().is_some())
}

/// Callgrind's counts: instructions of `n` operations per `figure/variant`; and the paired
/// ratios of the same run (`@paired` lines).
#[derive(Debug, Default)]
pub struct Instructions {
    /// (figure short name, variant, operations, instructions; `None` until read).
    found: Vec<(String, String, u64, Option<u64>)>,
    /// (figure short name, variant, (median, first quartile, third quartile)).
    paired: Vec<(String, String, (f64, f64, f64))>,
}

impl Instructions {
    /// One line of the run: `@@callgrind FIGURE/VARIANT N` opens a count, callgrind's
    /// `==PID== Collected : COUNT` gives it. A process that forks prints one such line per
    /// process (a child that never enters the measured function: 0): the largest is the count.
    pub fn add_line(&mut self, line: &str) {
        if let Some(rest) = line.trim().strip_prefix("@paired ") {
            let field = |k: &str| {
                rest.split_whitespace()
                    .find_map(|f| f.strip_prefix(k)?.strip_prefix('='))
            };
            let num = |k: &str| field(k).and_then(|v| v.parse::<f64>().ok());
            if let (Some(fig), Some(var), Some(m), Some(q1), Some(q3)) = (
                field("figure"),
                field("variant"),
                num("median"),
                num("q1"),
                num("q3"),
            ) {
                self.paired
                    .push((fig.to_owned(), var.to_owned(), (m, q1, q3)));
            }
        } else if let Some(rest) = line.strip_prefix("@@callgrind ") {
            let mut w = rest.split_whitespace();
            if let (Some(name), Some(n)) = (w.next(), w.next().and_then(|n| n.parse().ok())) {
                if let Some((fig, var)) = name.split_once('/') {
                    self.found.push((fig.to_owned(), var.to_owned(), n, None));
                }
            }
        } else if let Some((_, count)) = line.split_once("Collected :") {
            if let (Some(last), Ok(c)) = (self.found.last_mut(), count.trim().parse::<u64>()) {
                last.3 = Some(last.3.map_or(c, |old| old.max(c)));
            }
        }
    }

    /// The paired ratio of `figure/variant`: (median, first quartile, third quartile).
    pub fn paired(&self, figure: &str, variant: &str) -> Option<(f64, f64, f64)> {
        self.paired
            .iter()
            .rev()
            .find(|(f, v, _)| f == figure && v == variant)
            .map(|p| p.2)
    }

    /// Instructions per operation of `figure/variant`.
    pub fn per_op(&self, figure: &str, variant: &str) -> Option<f64> {
        self.found
            .iter()
            .rev()
            .find(|(f, v, _, _)| f == figure && v == variant)
            .and_then(|(_, _, n, c)| Some(c.as_ref().copied()? as f64 / *n as f64))
    }
}

/// One row: a variant of a figure against the figure's baseline.
struct Row<'a> {
    figure: &'a Figure,
    ours: &'a Series,
    raw: &'a Series,
    instr: Option<(f64, f64)>,
    paired: Option<(f64, f64, f64)>,
}

impl Row<'_> {
    fn name(&self) -> String {
        format!("{} ({})", self.figure.group, self.ours.variant)
    }
    fn ratio(&self) -> f64 {
        self.ours.median() / self.raw.median()
    }
    fn instr_ratio(&self) -> Option<f64> {
        self.instr.map(|(o, r)| o / r)
    }
    fn paired_text(&self) -> String {
        self.paired
            .map_or("-".into(), |(m, a, b)| format!("{m:.3} ({a:.2}–{b:.2})"))
    }
    fn target(&self) -> Option<f64> {
        TARGETS
            .iter()
            .find(|(g, v, _)| *g == self.figure.group && *v == self.ours.variant)
            .map(|t| t.2)
    }
}

fn rows<'a>(figures: &'a [Figure], counts: &Instructions) -> Vec<Row<'a>> {
    let mut out = Vec::new();
    for f in figures {
        let Some(raw) = f.baseline() else { continue };
        for ours in f.ours() {
            let instr = counts
                .per_op(f.short(), &ours.variant)
                .zip(counts.per_op(f.short(), BASELINE));
            out.push(Row {
                figure: f,
                ours,
                raw,
                instr,
                paired: counts.paired(f.short(), &ours.variant),
            });
        }
    }
    out
}

/// The console table.
pub fn table(figures: &[Figure], counts: &Instructions) -> String {
    let mut out = format!(
        "{:<36} {:>11} {:>11} {:>7} {:>13} {:>8} {:>18} {:>7}\n",
        "benchmark (variant)",
        "median",
        "raw median",
        "ratio",
        "spread (IQR)",
        "instr.",
        "paired (IQR)",
        "target"
    );
    for r in rows(figures, counts) {
        let _ = writeln!(
            out,
            "{:<36} {:>11} {:>11} {:>7.3} {:>6.1}%/{:>4.1}% {:>8} {:>18} {:>7}",
            r.name(),
            time(r.ours.median()),
            time(r.raw.median()),
            r.ratio(),
            r.ours.spread() * 100.0,
            r.raw.spread() * 100.0,
            r.instr_ratio().map_or("-".into(), |x| format!("{x:.3}")),
            r.paired_text(),
            target_text(&r),
        );
    }
    out
}

fn target_text(r: &Row<'_>) -> String {
    match r.target() {
        Some(t) if r.ratio() <= t => format!("≤{t:.2} ok"),
        Some(t) => format!("≤{t:.2} MISSED"),
        None => "-".into(),
    }
}

/// The ratios of a run (time and, where counted, instructions), by row name.
#[derive(Debug, Default, PartialEq)]
pub struct Ratios(Vec<(String, f64, Option<f64>)>);

impl Ratios {
    pub fn of(figures: &[Figure], counts: &Instructions) -> Self {
        Ratios(
            rows(figures, counts)
                .iter()
                .map(|r| (r.name(), r.ratio(), r.instr_ratio()))
                .collect(),
        )
    }

    fn path(home: &Path, name: &str) -> PathBuf {
        home.join(format!("evchan-ratios-{name}.json"))
    }

    /// Writes `evchan-ratios-NAME.json` beside criterion's data; its path.
    pub fn save(&self, home: &Path, name: &str) -> Result<PathBuf> {
        let mut lines = Vec::new();
        for (row, t, ins) in &self.0 {
            // JSON has no NaN: a count that is missing or not finite is `null`, a row without a
            // finite time is left out.
            let ins = ins
                .filter(|x| x.is_finite())
                .map_or("null".into(), |x| format!("{x}"));
            if t.is_finite() {
                lines.push(format!(
                    "  \"{row}\": {{\"time\": {t}, \"instructions\": {ins}}}"
                ));
            }
        }
        let s = format!("{{\n{}\n}}\n", lines.join(",\n"));
        let path = Self::path(home, name);
        std::fs::create_dir_all(home).map_err(|e| format!("{}: {e}", home.display()))?;
        std::fs::write(&path, s).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// Reads what [`Self::save`] wrote.
    pub fn load(home: &Path, name: &str) -> Result<Self> {
        let path = Self::path(home, name);
        let s = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "no saved ratios {name} ({}: {e}); save them with `cargo xtask bench --save {name}`",
                path.display()
            )
        })?;
        let mut out = Vec::new();
        for line in s.lines() {
            let Some((row, rest)) = line
                .trim()
                .strip_prefix('"')
                .and_then(|l| l.split_once("\": "))
            else {
                continue;
            };
            let num = |key: &str| {
                let start = rest.find(&format!("\"{key}\": "))? + key.len() + 4;
                let end = rest[start..]
                    .find([',', '}'])
                    .map_or(rest.len(), |e| start + e);
                rest[start..end].trim().parse::<f64>().ok()
            };
            if let Some(t) = num("time") {
                out.push((row.to_owned(), t, num("instructions")));
            }
        }
        Ok(Ratios(out))
    }

    /// This run's ratios against `saved`: the text, and the rows more than 5 % worse (time or
    /// instructions).
    pub fn compare(&self, saved: &Ratios, name: &str) -> (String, Vec<String>) {
        let mut text = format!("ratios against saved run {name} (flagged: more than 5 % worse):\n");
        let mut worse = Vec::new();
        for (row, t, ins) in &self.0 {
            let Some((_, st, sins)) = saved.0.iter().find(|(r, _, _)| r == row) else {
                let _ = writeln!(text, "  {row:<36} {t:.3} (not in {name})");
                continue;
            };
            let mut flag = t / st > WORSE;
            let mut line = format!(
                "  {row:<36} time {st:.3} -> {t:.3} ({:+.1} %)",
                (t / st - 1.0) * 100.0
            );
            if let (Some(i), Some(si)) = (ins, sins) {
                flag |= i / si > WORSE;
                let _ = write!(
                    line,
                    ", instructions {si:.3} -> {i:.3} ({:+.1} %)",
                    (i / si - 1.0) * 100.0
                );
            }
            if flag {
                line.push_str("  WORSE");
                worse.push(row.clone());
            }
            text.push_str(&line);
            text.push('\n');
        }
        (text, worse)
    }
}

/// How and where the run ran.
#[derive(Debug)]
pub struct Run {
    pub where_: String,
    pub criterion: String,
    pub took: Duration,
    pub warnings: Vec<String>,
    pub compared: Option<(String, Vec<String>)>,
}

/// Nanoseconds, printed in a unit that suits them.
fn time(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.1} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

/// A command's first line of output, or `?`.
fn first_line(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// The generated part of BENCHMARKS.md.
fn generated(run: &Run, figures: &[Figure], counts: &Instructions) -> String {
    let mut s = String::new();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let _ = writeln!(s, "{BEGIN}\n");
    let _ = writeln!(s, "## The last run\n");
    let _ = writeln!(
        s,
        "Run {} (UTC) at commit {} {}, {}, on a host with {cpu}; criterion `{}`; \
         `cargo xtask bench` took {:.0} s.\n",
        first_line("date", &["-u", "+%Y-%m-%d %H:%M"]),
        first_line("git", &["rev-parse", "--short", "HEAD"]),
        if first_line("git", &["status", "--porcelain", "--untracked-files=no"]) == "?" {
            "(clean)"
        } else {
            "(with uncommitted changes)"
        },
        run.where_,
        run.criterion,
        run.took.as_secs_f64()
    );
    for w in &run.warnings {
        let _ = writeln!(s, "**Warning:** {w}.\n");
    }
    s.push_str(
        "Median: of criterion's per-sample times per iteration. Ratio: ours ÷ the raw-FFI \
         baseline's median, same run. Spread: the interquartile range as a share of the median \
         (ours / baseline's). Instructions: callgrind's count of user-space instructions per \
         operation, ours ÷ raw (the kernel's are not counted). Paired: ours ÷ raw over pairs of \
         blocks of operations timed right after each other (`EVCHAN_BENCH_PAIRED`, same boot, \
         after criterion), the median and, in brackets, the quartiles of the pairs' ratios: a \
         drift of the machine's speed during the run moves both sides of each pair. The target \
         column judges criterion's ratio.\n\n",
    );
    s.push_str(
        "| figure (variant) | median | baseline median | ratio | spread | instructions/op (ours / raw) | instr. ratio | paired ratio | target (time ratio) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows(figures, counts) {
        let instr = r
            .instr
            .map_or("-".into(), |(o, b)| format!("{o:.0} / {b:.0}"));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.3} | {:.1} % / {:.1} % | {instr} | {} | {} | {} |",
            r.name(),
            time(r.ours.median()),
            time(r.raw.median()),
            r.ratio(),
            r.ours.spread() * 100.0,
            r.raw.spread() * 100.0,
            r.instr_ratio().map_or("-".into(), |x| format!("{x:.3}")),
            r.paired_text(),
            target_text(&r),
        );
    }
    if let Some((name, worse)) = &run.compared {
        let _ = writeln!(
            s,
            "\nCompared with saved run `{name}`: {}.",
            if worse.is_empty() {
                "no ratio more than 5 % worse".to_owned()
            } else {
                format!("more than 5 % worse: {}", worse.join(", "))
            }
        );
    }
    s.push_str(
        "\n![latency distributions against their baselines](bench-latency.svg)\n\n\
         Each dot is one of criterion's samples (time per iteration), divided by the median of \
         its figure's raw baseline; grey: the baseline, the bar: each median.\n\n",
    );
    let _ = writeln!(s, "{END}");
    s
}

/// Writes the generated part of `path`, keeping whatever lies outside its markers (a new file
/// gets a title).
pub fn write_markdown(
    path: &Path,
    run: &Run,
    figures: &[Figure],
    counts: &Instructions,
) -> Result<()> {
    replace_part(path, BEGIN, END, &generated(run, figures, counts))
}

/// Writes the C-tool comparisons (`bench_tools::run`'s section) into their own generated part of
/// `path`, after the core figures' part, keeping everything else.
pub fn write_tools(path: &Path, section: &str) -> Result<()> {
    replace_part(
        path,
        TOOLS_BEGIN,
        TOOLS_END,
        &format!("{TOOLS_BEGIN}\n{}\n{TOOLS_END}\n", section.trim_end()),
    )
}

/// Where the C-tool comparisons' generated part begins and ends.
const TOOLS_BEGIN: &str = "<!-- cargo xtask bench --tools: generated part, begin -->";
const TOOLS_END: &str = "<!-- cargo xtask bench --tools: generated part, end -->";

/// Puts `part` (which starts with `begin` and ends with `end`) where the old part between the
/// markers was, or at the end of the file.
fn replace_part(path: &Path, begin: &str, end: &str, part: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let text = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if b < e => {
            format!(
                "{}{part}{}",
                &old[..b],
                &old[e + end.len()..].trim_start_matches('\n')
            )
        }
        _ if old.is_empty() => format!("# Benchmarks\n\n{part}"),
        _ => format!("{}\n\n{part}", old.trim_end()),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The SVG: one row per figure, each variant's samples as dots on an axis of "times the
/// baseline's median" (logarithmic), the baseline in grey, each median a bar.
pub fn write_svg(path: &Path, figures: &[Figure]) -> Result<()> {
    const W: f64 = 900.0;
    const LEFT: f64 = 260.0;
    const RIGHT: f64 = 30.0;
    const LANE: f64 = 16.0;
    const GAP: f64 = 14.0;
    let (lo, hi) = (0.5_f64, 4.0_f64);
    let x =
        |r: f64| LEFT + (r.clamp(lo, hi).ln() - lo.ln()) / (hi.ln() - lo.ln()) * (W - LEFT - RIGHT);
    let colour = |v: &str| match v {
        BASELINE => "#888888",
        "evchan" => "#1f77b4",
        "async" => "#d62728",
        _ => "#2ca02c",
    };
    let lanes: usize = figures.iter().map(|f| f.series.len()).sum();
    let height = 50.0 + lanes as f64 * LANE + figures.len() as f64 * GAP + 40.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height:.0}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"20\" font-size=\"14\">time per iteration ÷ the raw baseline's median \
         (log scale; clamped to {lo}–{hi})</text>\n"
    );
    let mut y = 40.0;
    for f in figures {
        let Some(base) = f.baseline().map(Series::median) else {
            continue;
        };
        let top = y;
        for series in &f.series {
            let c = colour(&series.variant);
            let _ = writeln!(
                s,
                "<text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\">{} {}</text>",
                LEFT - 8.0,
                y + LANE * 0.7,
                if series.variant == f.series[0].variant {
                    f.group.as_str()
                } else {
                    ""
                },
                series.variant
            );
            for (i, v) in series.per_iter.iter().enumerate() {
                // Spread the dots over the lane, deterministically.
                let jitter = ((i * 7919) % 11) as f64 / 10.0 * (LANE - 6.0) + 3.0;
                let _ = writeln!(
                    s,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{c}\" fill-opacity=\"0.5\"/>",
                    x(v / base),
                    y + jitter
                );
            }
            let m = x(series.median() / base);
            let _ = writeln!(
                s,
                "<line x1=\"{m:.1}\" x2=\"{m:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\" stroke-width=\"2\"/>",
                y + 1.0,
                y + LANE - 1.0
            );
            y += LANE;
        }
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" x2=\"{:.0}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#dddddd\"/>",
            W - RIGHT,
            y + GAP / 2.0,
            y + GAP / 2.0
        );
        let _ = top;
        y += GAP;
    }
    for tick in [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0] {
        let tx = x(tick);
        let _ = writeln!(
            s,
            "<line x1=\"{tx:.1}\" x2=\"{tx:.1}\" y1=\"34\" y2=\"{y:.0}\" stroke=\"{}\" stroke-dasharray=\"3,3\"/>\n\
             <text x=\"{tx:.1}\" y=\"{:.0}\" text-anchor=\"middle\">{tick}×</text>",
            if tick == 1.0 { "#444444" } else { "#cccccc" },
            y + 16.0
        );
    }
    s.push_str("</svg>\n");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, s).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_criterion_json() {
        let bench = r#"{"group_id":"cm_event/empty_read","function_id":"raw","value_str":null,"throughput":null,"full_id":"cm_event/empty_read/raw"}"#;
        assert_eq!(
            json_string(bench, "group_id").as_deref(),
            Some("cm_event/empty_read")
        );
        assert_eq!(json_string(bench, "function_id").as_deref(), Some("raw"));
        let sample = r#"{"sampling_mode":"Linear","iters":[1.0,2.0,3.0],"times":[10.0,40.0,30.0]}"#;
        assert_eq!(json_numbers(sample, "iters"), Some(vec![1.0, 2.0, 3.0]));
        assert_eq!(json_numbers(sample, "times"), Some(vec![10.0, 40.0, 30.0]));
    }

    #[test]
    fn medians_spread_and_ratios() {
        let s = Series {
            variant: "evchan".into(),
            per_iter: vec![4.0, 1.0, 3.0, 2.0, 5.0],
        };
        assert_eq!(s.median(), 3.0);
        assert!((s.spread() - 2.0 / 3.0).abs() < 1e-12);
        let f = Figure {
            group: "g/x".into(),
            series: vec![
                s,
                Series {
                    variant: "raw".into(),
                    per_iter: vec![2.0, 2.0, 2.0],
                },
            ],
        };
        let mut counts = Instructions::default();
        for l in [
            "@@callgrind x/evchan 10",
            "==12== Collected : 1500",
            "@@callgrind x/raw 10",
            "==14== Collected : 0",
            "==13== Collected : 1000",
        ] {
            counts.add_line(l);
        }
        assert_eq!(counts.per_op("x", "evchan"), Some(150.0));
        counts
            .add_line("@paired figure=x variant=evchan block=9 pairs=3 median=1.25 q1=1.1 q3=1.5");
        counts.add_line("@paired figure=x variant=async block=9 pairs=3 median=oops q1=1 q3=2");
        assert_eq!(counts.paired("x", "evchan"), Some((1.25, 1.1, 1.5)));
        assert_eq!(
            counts.paired("x", "async"),
            None,
            "an unreadable line is left out"
        );
        assert!(table(std::slice::from_ref(&f), &counts).contains("1.250 (1.10–1.50)"));
        let r = Ratios::of(&[f], &counts);
        assert_eq!(r.0, vec![("g/x (evchan)".into(), 1.5, Some(1.5))]);
    }

    #[test]
    fn ratios_round_trip_and_compare() {
        let dir = std::env::temp_dir().join(format!("evchan-ratios-test-{}", std::process::id()));
        let saved = Ratios(vec![
            ("a (evchan)".into(), 1.0, Some(1.0)),
            ("b (evchan)".into(), 2.0, None),
        ]);
        saved.save(&dir, "t").unwrap();
        assert_eq!(Ratios::load(&dir, "t").unwrap(), saved);
        let now = Ratios(vec![
            ("a (evchan)".into(), 1.04, Some(1.06)),
            ("b (evchan)".into(), 2.0, None),
        ]);
        let (text, worse) = now.compare(&saved, "t");
        assert_eq!(worse, vec!["a (evchan)".to_owned()], "{text}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn markdown_keeps_what_lies_outside_the_markers() {
        let dir = std::env::temp_dir().join(format!("evchan-md-test-{}", std::process::id()));
        let path = dir.join("B.md");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            &path,
            format!("# T\n\nnotes\n\n{BEGIN}\nold\n{END}\n\nafter\n"),
        )
        .unwrap();
        let run = Run {
            where_: "here".into(),
            criterion: "--bench".into(),
            took: Duration::from_secs(1),
            warnings: vec![],
            compared: None,
        };
        write_markdown(&path, &run, &[], &Instructions::default()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# T\n\nnotes\n\n") && text.ends_with("after\n"),
            "{text}"
        );
        assert!(
            !text.contains("old") && text.contains("The last run"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
