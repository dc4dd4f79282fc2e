//! Ours ÷ baseline: the rows of a run's table against their targets, and the ratios saved
//! per run and compared with a saved one.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::super::{BASELINE, WORSE};
use super::samples::{Figure, Instructions, Series};
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
}
