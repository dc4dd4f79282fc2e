//! Ours ÷ baseline: the rows of a run's table against their targets, and the ratios saved
//! per run and compared with a saved one.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::super::{BASELINE, WORSE};
use super::samples::{Figure, Instructions, Series};
use crate::bench_tools::ROW_PREFIX;
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

/// One row: a variant of a figure against the figure's baseline.
pub(super) struct Row<'a> {
    figure: &'a Figure,
    pub(super) ours: &'a Series,
    pub(super) raw: &'a Series,
    pub(super) instr: Option<(f64, f64)>,
    paired: Option<(f64, f64, f64)>,
}

impl Row<'_> {
    pub(super) fn name(&self) -> String {
        format!("{} ({})", self.figure.group, self.ours.variant)
    }
    pub(super) fn ratio(&self) -> f64 {
        self.ours.median() / self.raw.median()
    }
    pub(super) fn instr_ratio(&self) -> Option<f64> {
        self.instr.map(|(o, r)| o / r)
    }
    pub(super) fn paired_text(&self) -> String {
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

pub(super) fn rows<'a>(figures: &'a [Figure], counts: &Instructions) -> Vec<Row<'a>> {
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

pub(super) fn target_text(r: &Row<'_>) -> String {
    match r.target() {
        Some(t) if r.ratio() <= t => format!("≤{t:.2} ok"),
        Some(t) => format!("≤{t:.2} MISSED"),
        None => "-".into(),
    }
}

/// Nanoseconds, printed in a unit that suits them.
pub(super) fn time(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.1} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

/// What a tracked ratio measures, and so which way is worse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Criterion's time ratio (medians of the samples), ours ÷ raw.
    Time,
    /// Callgrind's instructions per operation, ours ÷ raw.
    Instructions,
    /// The paired time ratio (median of the pairs), ours ÷ raw.
    Paired,
    /// A ratio of times from the tools run (ours ÷ the tool's, or one driver ÷ another).
    Tools,
    /// A ratio of rates from the tools run (n channels ÷ 1): the one kind where smaller is
    /// worse.
    Rate,
}

impl Measure {
    const ALL: [Measure; 5] = [
        Measure::Time,
        Measure::Instructions,
        Measure::Paired,
        Measure::Tools,
        Measure::Rate,
    ];

    /// Its key in the saved file.
    fn key(self) -> &'static str {
        match self {
            Measure::Time => "time",
            Measure::Instructions => "instructions",
            Measure::Paired => "paired",
            Measure::Tools => "ratio",
            Measure::Rate => "rate",
        }
    }

    /// How much worse `now` is than `saved`, as a factor (above 1: worse).
    fn worse_by(self, now: f64, saved: f64) -> f64 {
        match self {
            Measure::Rate => saved / now,
            _ => now / saved,
        }
    }

    /// Whether spread `now` lies wholly on the worse side of spread `saved` (no overlap).
    fn beyond(self, now: Spread, saved: Spread) -> bool {
        match self {
            Measure::Rate => now.1 < saved.0,
            _ => now.0 > saved.1,
        }
    }
}

/// The spread of a tracked ratio, `(least, largest)`: for a paired ratio the quartiles of its
/// pairs' ratios, for a tools ratio the least and the largest of its rounds' own ratios.
pub type Spread = (f64, f64);

/// One tracked ratio: its measure, its value and, where measured, its spread.
type Value = (Measure, f64, Option<Spread>);

/// The tracked ratios of a run, by row name: for each row, the measures it has.
#[derive(Debug, Default, PartialEq)]
pub struct Ratios(Vec<(String, Vec<Value>)>);

/// The words after the measure of a flagged ratio whose spread lies wholly on the worse side of
/// the saved one's.
pub const BEYOND: &str = ", beyond both runs' spread";

/// How a flagged ratio's spread sits against the saved one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Both spreads known, and this run's lies wholly on the worse side of the saved one.
    Beyond,
    /// Both spreads known, and they overlap.
    Within,
    /// One or both not measured (instructions, criterion's time ratio, an older file).
    NoSpread,
}

impl Verdict {
    fn of(m: Measure, now: Option<Spread>, saved: Option<Spread>) -> Self {
        match (now, saved) {
            (Some(n), Some(s)) if m.beyond(n, s) => Verdict::Beyond,
            (Some(_), Some(_)) => Verdict::Within,
            _ => Verdict::NoSpread,
        }
    }

    /// Its words after the measure in a flagged `ROW (MEASURE…)`.
    fn tag(self) -> &'static str {
        match self {
            Verdict::Beyond => BEYOND,
            Verdict::Within => ", within the spread",
            Verdict::NoSpread => "",
        }
    }
}

impl Ratios {
    /// The criterion rows' ratios: time, and, where counted, instructions and the paired ratio.
    pub fn of(figures: &[Figure], counts: &Instructions) -> Self {
        let mut out = Ratios::default();
        for r in rows(figures, counts) {
            let name = r.name();
            out.push(&name, Measure::Time, r.ratio());
            if let Some(i) = r.instr_ratio() {
                out.push(&name, Measure::Instructions, i);
            }
            if let Some((m, q1, q3)) = r.paired {
                out.push_spread(&name, Measure::Paired, m, Some((q1, q3)));
            }
        }
        out
    }

    /// Adds one ratio to row `row` (made if new). A value that is not finite and positive is
    /// left out (JSON has no NaN, and no ratio can be compared with it); `"` and `\` in the
    /// name become `'` and `/`, so that the saved file needs no escapes.
    pub fn push(&mut self, row: &str, measure: Measure, value: f64) {
        self.push_spread(row, measure, value, None);
    }

    /// As [`Self::push`], with the ratio's spread; a spread that is not two finite, positive,
    /// ordered numbers is left out (the ratio is kept).
    pub fn push_spread(&mut self, row: &str, measure: Measure, value: f64, spread: Option<Spread>) {
        if !(value.is_finite() && value > 0.0) {
            return;
        }
        let spread =
            spread.filter(|(lo, hi)| lo.is_finite() && hi.is_finite() && *lo > 0.0 && lo <= hi);
        let row = row.replace('"', "'").replace('\\', "/");
        match self.0.iter_mut().find(|(r, _)| *r == row) {
            Some((_, ms)) => {
                ms.retain(|(m, _, _)| *m != measure);
                ms.push((measure, value, spread));
            }
            None => self.0.push((row, vec![(measure, value, spread)])),
        }
    }

    fn path(home: &Path, name: &str) -> PathBuf {
        home.join(format!("evchan-ratios-{name}.json"))
    }

    /// Writes `evchan-ratios-NAME.json` beside criterion's data; its path.
    pub fn save(&self, home: &Path, name: &str) -> Result<PathBuf> {
        let lines: Vec<String> = self
            .0
            .iter()
            .map(|(row, ms)| {
                let fields: Vec<String> = ms
                    .iter()
                    .map(|(m, v, spread)| {
                        let k = m.key();
                        match spread {
                            Some((lo, hi)) => {
                                format!("\"{k}\": {v}, \"{k}_lo\": {lo}, \"{k}_hi\": {hi}")
                            }
                            None => format!("\"{k}\": {v}"),
                        }
                    })
                    .collect();
                format!("  \"{row}\": {{{}}}", fields.join(", "))
            })
            .collect();
        let s = format!("{{\n{}\n}}\n", lines.join(",\n"));
        let path = Self::path(home, name);
        std::fs::create_dir_all(home).map_err(|e| format!("{}: {e}", home.display()))?;
        std::fs::write(&path, s).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// Reads what [`Self::save`] wrote (also the files of earlier versions, whose rows had
    /// `time` and `instructions`, the latter possibly `null`, and no spreads).
    pub fn load(home: &Path, name: &str) -> Result<Self> {
        let path = Self::path(home, name);
        let s = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "no saved ratios {name} ({}: {e}); save them with `cargo xtask bench --save {name}`",
                path.display()
            )
        })?;
        let mut out = Ratios::default();
        for line in s.lines() {
            let Some((row, rest)) = line
                .trim()
                .strip_prefix('"')
                .and_then(|l| l.split_once("\": "))
            else {
                continue;
            };
            // The number after `"KEY": `, where there is one.
            let field = |key: &str| {
                let key = format!("\"{key}\": ");
                let start = rest.find(&key)? + key.len();
                let end = rest[start..]
                    .find([',', '}'])
                    .map_or(rest.len(), |e| start + e);
                rest[start..end].trim().parse::<f64>().ok()
            };
            for m in Measure::ALL {
                let k = m.key();
                if let Some(v) = field(k) {
                    let spread = field(&format!("{k}_lo")).zip(field(&format!("{k}_hi")));
                    out.push_spread(row, m, v, spread);
                }
            }
        }
        Ok(out)
    }

    /// Whether any row is criterion's (not the tools run's): a run saved by `--tools` alone
    /// has none, and no criterion baseline either.
    pub fn has_criterion_rows(&self) -> bool {
        self.0.iter().any(|(r, _)| !r.starts_with(ROW_PREFIX))
    }

    /// This run's ratios against `saved`: the text, and the measures more than 5 % worse, as
    /// `ROW (MEASURE)` (worse: a larger ratio, or for a [`Measure::Rate`] a smaller one), with
    /// `, beyond both runs' spread` or `, within the spread` after the measure where both runs
    /// measured its spread.
    pub fn compare(&self, saved: &Ratios, name: &str) -> (String, Vec<String>) {
        let mut text = format!("ratios against saved run {name} (flagged: more than 5 % worse):\n");
        let mut worse = Vec::new();
        // Per measure: (compared, flagged, of them beyond both spreads, within them).
        let mut tally = [(0_u32, 0_u32, 0_u32, 0_u32); Measure::ALL.len()];
        let w = self
            .0
            .iter()
            .chain(&saved.0)
            .map(|(r, _)| r.chars().count())
            .max()
            .unwrap_or(0);
        for (row, ms) in &self.0 {
            let Some((_, sms)) = saved.0.iter().find(|(r, _)| r == row) else {
                let _ = writeln!(text, "  {row:<w$} (not in {name})");
                continue;
            };
            let mut parts = Vec::new();
            for (m, v, spread) in ms {
                let Some((_, sv, sspread)) = sms.iter().find(|(sm, _, _)| sm == m) else {
                    parts.push(format!("{} {v:.3} (not in {name})", m.key()));
                    continue;
                };
                let by = m.worse_by(*v, *sv);
                let t = &mut tally[Measure::ALL.iter().position(|x| x == m).unwrap_or(0)];
                t.0 += 1;
                let mut part = format!(
                    "{} {sv:.3} -> {v:.3} ({:+.1} %)",
                    m.key(),
                    (v / sv - 1.0) * 100.0
                );
                if let (Some(n), Some(s)) = (spread, sspread) {
                    let _ = write!(part, " [{:.2}–{:.2} -> {:.2}–{:.2}]", s.0, s.1, n.0, n.1);
                }
                if by > WORSE {
                    let verdict = Verdict::of(*m, *spread, *sspread);
                    t.1 += 1;
                    t.2 += u32::from(verdict == Verdict::Beyond);
                    t.3 += u32::from(verdict == Verdict::Within);
                    part.push_str(match verdict {
                        Verdict::Beyond => " WORSE, beyond both runs' spread",
                        Verdict::Within => " WORSE, within the spread",
                        Verdict::NoSpread => " WORSE",
                    });
                    worse.push(format!("{row} ({}{})", m.key(), verdict.tag()));
                }
                parts.push(part);
            }
            let _ = writeln!(text, "  {row:<w$} {}", parts.join(", "));
        }
        for (row, _) in &saved.0 {
            if !self.0.iter().any(|(r, _)| r == row) {
                let _ = writeln!(text, "  {row:<w$} (in {name}, not measured in this run)");
            }
        }
        let per: Vec<String> = Measure::ALL
            .iter()
            .zip(tally)
            .filter(|(_, (n, ..))| *n > 0)
            .map(|(m, (n, f, beyond, within))| {
                let mut s = format!("{} {f} of {n}", m.key());
                if beyond + within > 0 {
                    let _ = write!(
                        s,
                        " ({beyond} beyond both runs' spread, {within} within it)"
                    );
                }
                s
            })
            .collect();
        let _ = writeln!(text, "flagged, per measure: {}", per.join(", "));
        (text, worse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            r.0,
            vec![(
                "g/x (evchan)".into(),
                vec![
                    (Measure::Time, 1.5, None),
                    (Measure::Instructions, 1.5, None),
                    (Measure::Paired, 1.25, Some((1.1, 1.5)))
                ]
            )]
        );
    }

    #[test]
    fn ratios_round_trip_and_compare() {
        let dir = std::env::temp_dir().join(format!("evchan-ratios-test-{}", std::process::id()));
        let mut saved = Ratios::default();
        saved.push("a (evchan)", Measure::Time, 1.0);
        saved.push("a (evchan)", Measure::Instructions, 1.0);
        saved.push_spread("a (evchan)", Measure::Paired, 1.0, Some((0.98, 1.02)));
        saved.push("b (evchan)", Measure::Time, 2.0);
        saved.push("b (evchan)", Measure::Instructions, f64::NAN);
        saved.push_spread("tools: \"q\" \\ x", Measure::Tools, 1.2, Some((1.0, 1.4)));
        saved.push_spread("tools: rate", Measure::Rate, 1.5, Some((1.4, 1.6)));
        saved.push("gone", Measure::Time, 1.0);
        saved.save(&dir, "t").unwrap();
        assert_eq!(Ratios::load(&dir, "t").unwrap(), saved);
        assert_eq!(saved.0[2].0, "tools: 'q' / x");
        assert_eq!(
            saved.0[1].1,
            vec![(Measure::Time, 2.0, None)],
            "NaN is left out"
        );
        let mut odd = Ratios::default();
        odd.push_spread("x", Measure::Paired, 1.0, Some((1.2, 1.1)));
        odd.push_spread("y", Measure::Paired, 1.0, Some((f64::NAN, 1.1)));
        assert_eq!(
            odd.0,
            vec![
                ("x".into(), vec![(Measure::Paired, 1.0, None)]),
                ("y".into(), vec![(Measure::Paired, 1.0, None)]),
            ],
            "a spread out of order or not finite is left out, the ratio kept"
        );
        assert!(saved.has_criterion_rows());
        let mut tools_only = Ratios::default();
        tools_only.push("tools: x", Measure::Tools, 1.0);
        assert!(!tools_only.has_criterion_rows());

        let mut now = Ratios::default();
        now.push("a (evchan)", Measure::Time, 1.04);
        now.push("a (evchan)", Measure::Instructions, 1.06);
        // Flagged, and its pairs' quartiles lie wholly above the saved ones.
        now.push_spread("a (evchan)", Measure::Paired, 1.06, Some((1.03, 1.09)));
        now.push("b (evchan)", Measure::Time, 1.0);
        // Flagged, and its rounds overlap the saved ones'.
        now.push_spread("tools: 'q' / x", Measure::Tools, 1.3, Some((1.1, 1.5)));
        // A rate is worse when it falls: 1.5 -> 1.45 is 3.4 % worse, 1.5 -> 1.4 is 7.1 %.
        now.push_spread("tools: rate", Measure::Rate, 1.45, Some((1.3, 1.6)));
        now.push("new", Measure::Time, 1.0);
        let (text, worse) = now.compare(&saved, "t");
        assert_eq!(
            worse,
            vec![
                "a (evchan) (instructions)".to_owned(),
                "a (evchan) (paired, beyond both runs' spread)".to_owned(),
                "tools: 'q' / x (ratio, within the spread)".to_owned(),
            ],
            "{text}"
        );
        assert!(
            text.contains("[0.98–1.02 -> 1.03–1.09] WORSE, beyond"),
            "{text}"
        );
        assert!(text.contains("(not in t)"), "{text}");
        assert!(text.contains("gone"), "{text}");
        assert!(text.contains("not measured in this run"), "{text}");
        assert!(
            text.contains(
                "flagged, per measure: time 0 of 2, instructions 1 of 1, paired 1 of 1 (1 beyond \
                 both runs' spread, 0 within it), ratio 1 of 1 (0 beyond both runs' spread, 1 \
                 within it), rate 0 of 1"
            ),
            "{text}"
        );
        // A rate's spread is beyond when it lies wholly below the saved one.
        now.push_spread("tools: rate", Measure::Rate, 1.4, Some((1.2, 1.35)));
        let (_, worse) = now.compare(&saved, "t");
        assert!(
            worse.contains(&"tools: rate (rate, beyond both runs' spread)".to_owned()),
            "{worse:?}"
        );
        now.push("tools: rate", Measure::Rate, 1.4);
        let (_, worse) = now.compare(&saved, "t");
        assert!(
            worse.contains(&"tools: rate (rate)".to_owned()),
            "without this run's spread, no verdict: {worse:?}"
        );

        // A file of an earlier version: `time` and `instructions`, `null` where not counted.
        std::fs::write(
            dir.join("evchan-ratios-old.json"),
            "{\n  \"a (evchan)\": {\"time\": 1.1, \"instructions\": null},\n  \"b (evchan)\": \
             {\"time\": 2, \"instructions\": 1.2}\n}\n",
        )
        .unwrap();
        let old = Ratios::load(&dir, "old").unwrap();
        assert_eq!(
            old.0,
            vec![
                ("a (evchan)".into(), vec![(Measure::Time, 1.1, None)]),
                (
                    "b (evchan)".into(),
                    vec![
                        (Measure::Time, 2.0, None),
                        (Measure::Instructions, 1.2, None)
                    ]
                ),
            ]
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
