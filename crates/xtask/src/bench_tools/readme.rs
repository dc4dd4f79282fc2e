//! The README's table of figures: rows of docs/BENCHMARKS.md's generated tools part, picked
//! and named for a newcomer. `cargo xtask bench --tools` writes it after that part, and a test
//! checks that the committed README's table is the one the committed BENCHMARKS.md gives, so
//! the two never disagree.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::Result;

/// Where the README's generated table begins and ends.
const BEGIN: &str = "<!-- cargo xtask bench --tools: README figures, begin -->";
const END: &str = "<!-- cargo xtask bench --tools: README figures, end -->";

/// (the row's figure in BENCHMARKS.md's tables, its name in the README, its unit).
const ROWS: &[(&str, &str, &str)] = &[
    (
        "**core-shared: total**",
        "connection setup, evchan-core ÷ `cmtime`",
        "µs",
    ),
    (
        "RTT p50, event mode, current-thread runtime vs `ib_send_lat -R -e`",
        "64 B round trip, event mode ÷ `ib_send_lat -R -e`",
        "µs",
    ),
    (
        "RTT p50, event mode, multi-thread runtime, spawned task vs `ib_send_lat -R -e`",
        "the same, multi-thread runtime (task per connection)",
        "µs",
    ),
    (
        "RTT p50, busy-poll, current-thread runtime vs `ib_send_lat -R`",
        "64 B round trip, busy-poll ÷ `ib_send_lat -R`",
        "µs",
    ),
    (
        "instructions per round trip, current-thread runtime vs core layer, tokio waits",
        "user-space instructions per round trip ÷ evchan-core's",
        "",
    ),
    (
        "messages/s, 64 B, 1 connection, event mode vs `ib_send_bw -R -e`",
        "64 B messages/s, event mode ÷ `ib_send_bw -R -e`",
        "/s",
    ),
    (
        "messages/s, 4 KiB, 1 connection, event mode vs `ib_send_bw -R -e`",
        "4 KiB messages/s, event mode ÷ `ib_send_bw -R -e`",
        "/s",
    ),
    (
        "MB/s, 64 KiB, 1 connection, event mode vs `ib_send_bw -R -e`",
        "64 KiB messages, event mode ÷ `ib_send_bw -R -e`",
        "MB/s",
    ),
    (
        "messages/s, 64 B, 4 connections, event mode vs `ib_send_bw -R -e`",
        "64 B messages/s, 4 connections ÷ `ib_send_bw -R -e -q 4`",
        "/s",
    ),
    (
        "messages/s, 64 B, 1 connection, busy-poll vs `ib_send_bw -R`",
        "64 B messages/s, busy-poll ÷ `ib_send_bw -R`",
        "/s",
    ),
];

/// The table rows of `markdown`, each as its header's column name → cell.
fn table_rows(markdown: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_owned())
            .collect()
    };
    let mut header: Vec<String> = Vec::new();
    let mut rows = BTreeMap::new();
    for line in markdown.lines().filter(|l| l.trim_start().starts_with('|')) {
        let c = cells(line);
        if c.first().is_some_and(|f| f == "figure") {
            header = c;
        } else if c.first().is_some_and(|f| !f.starts_with("---")) && !header.is_empty() {
            let row = header.iter().cloned().zip(c.iter().cloned()).collect();
            rows.insert(c[0].clone(), row);
        }
    }
    rows
}

/// The README's table (markers included) from BENCHMARKS.md's text: its rows that the last
/// tools run wrote, in [`ROWS`]' order; an error if it has none of them.
pub(crate) fn table(benchmarks: &str) -> std::result::Result<String, String> {
    let rows = table_rows(benchmarks);
    let mut out = format!(
        "{BEGIN}\n| figure | evchan | baseline | ratio | target |\n|---|---:|---:|---:|---|\n"
    );
    let mut n = 0;
    for (key, name, unit) in ROWS {
        let Some(r) = rows.get(*key) else { continue };
        let get = |k: &[&str]| {
            k.iter()
                .find_map(|k| r.get(*k))
                .map_or("–", String::as_str)
                .to_owned()
        };
        let with_unit = |v: String| {
            if unit.is_empty() || v == "–" {
                v
            } else if unit.starts_with('/') {
                format!("{v}{unit}")
            } else {
                format!("{v} {unit}")
            }
        };
        let target = match (get(&["target"]).as_str(), get(&["met?"]).as_str()) {
            ("" | "–", _) => String::new(),
            (t, "yes") => format!("{t}: met"),
            (t, _) => format!("{t}: missed"),
        };
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {target} |",
            with_unit(get(&["ours (median)", "ours"])),
            with_unit(get(&["baseline (median)", "baseline"])),
            get(&["ratio"]),
        );
        n += 1;
    }
    if n == 0 {
        return Err("docs/BENCHMARKS.md has none of the README's figures".into());
    }
    out.push_str(END);
    Ok(out)
}

/// The README's generated table as it stands (markers included), or `None` without markers.
pub(crate) fn current(readme: &str) -> Option<&str> {
    let b = readme.find(BEGIN)?;
    let e = readme[b..].find(END)? + b + END.len();
    Some(&readme[b..e])
}

/// Rewrites the README's table from BENCHMARKS.md (both at the repository's root `root`).
pub(crate) fn write(root: &Path) -> Result<()> {
    let (readme_path, bench_path) = (root.join("README.md"), root.join("docs/BENCHMARKS.md"));
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let (readme, benchmarks) = (read(&readme_path)?, read(&bench_path)?);
    let old = current(&readme).ok_or_else(|| {
        format!("README.md has no `{BEGIN}` … `{END}` part for the figures table")
    })?;
    let text = readme.replacen(old, &table(&benchmarks)?, 1);
    std::fs::write(&readme_path, text).map_err(|e| format!("{}: {e}", readme_path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed README's figures are those of the committed BENCHMARKS.md.
    #[test]
    fn the_readme_table_is_the_benchmarks_table() {
        let root = crate::root();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let bench = std::fs::read_to_string(root.join("docs/BENCHMARKS.md")).unwrap();
        let want = table(&bench).unwrap();
        assert_eq!(
            current(&readme),
            Some(want.as_str()),
            "README.md's figures table differs from docs/BENCHMARKS.md's last run: \
             `cargo xtask bench --tools` writes both"
        );
    }

    #[test]
    fn rows_are_picked_by_figure_and_column() {
        let bench = "\
| figure | ours (median) | baseline (median) | ratio | paired | p99 | spread | target | met? |
|---|---:|---:|---:|---:|---:|---:|---:|---|
| RTT p50, busy-poll, current-thread runtime vs `ib_send_lat -R` | 34.5 | 25.8 | 1.33 | 1.34 | 152 / 116 | 11 % | ≤ 1.20 | **no** |
| RTT p50, event mode, current-thread runtime vs `ib_send_lat -R -e` | 174 | 162 | 1.08 | 1.06 | 445 / 351 | 9 % | ≤ 1.15 | yes |

| figure | ours | baseline | ratio | target | met? |
|---|---:|---:|---:|---:|---|
| instructions per round trip, current-thread runtime vs core layer, tokio waits | 2979 | 2240 | 1.33 | ≤ 1.50 | yes |
";
        let t = table(bench).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 7, "{t}");
        assert_eq!(
            lines[3],
            "| 64 B round trip, event mode ÷ `ib_send_lat -R -e` | 174 µs | 162 µs | 1.08 | ≤ 1.15: met |"
        );
        assert_eq!(
            lines[4],
            "| 64 B round trip, busy-poll ÷ `ib_send_lat -R` | 34.5 µs | 25.8 µs | 1.33 | ≤ 1.20: missed |"
        );
        assert!(lines[5].starts_with("| user-space instructions"), "{t}");
        assert!(table("| figure | ours |\n|---|---|\n| other | 1 |").is_err());
        let readme = format!("intro\n{t}\nrest");
        assert_eq!(current(&readme), Some(t.as_str()));
        assert_eq!(current("no table"), None);
    }
}
