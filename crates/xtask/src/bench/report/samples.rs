//! Reading a run: criterion's samples per figure and variant (medians, spreads), and
//! callgrind's instruction counts and the paired measurements from the run's output.

use std::path::{Path, PathBuf};

use super::super::BASELINE;
use crate::Result;

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
    pub(super) fn short(&self) -> &str {
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
}
