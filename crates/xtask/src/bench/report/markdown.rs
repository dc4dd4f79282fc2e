//! `docs/BENCHMARKS.md`'s generated parts: the run's part between its markers, and the
//! tools run's section between its own.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::ratios::{rows, target_text, time};
use super::samples::{Figure, Instructions};
use crate::Result;

/// Where the generated part of BENCHMARKS.md begins and ends; what lies outside is kept.
const BEGIN: &str = "<!-- cargo xtask bench: generated part, begin -->";
const END: &str = "<!-- cargo xtask bench: generated part, end -->";

/// How and where the run ran.
#[derive(Debug)]
pub struct Run {
    pub where_: String,
    pub criterion: String,
    pub took: Duration,
    pub warnings: Vec<String>,
    pub compared: Option<(String, Vec<String>)>,
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
        // The files this command writes do not count: a run after a run would otherwise say
        // "uncommitted" of a clean library.
        if first_line(
            "git",
            &[
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":(top)",
                ":(top,exclude)docs/BENCHMARKS.md",
                ":(top,exclude)docs/bench-latency.svg",
            ]
        ) == "?"
        {
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
        let _ = writeln!(s, "\n{}", compared_line(name, worse));
    }
    s.push_str(
        "\n![latency distributions against their baselines](bench-latency.svg)\n\n\
         Each dot is one of criterion's samples (time per iteration), divided by the median of \
         its figure's raw baseline; grey: the baseline, the bar: each median.\n\n",
    );
    let _ = writeln!(s, "{END}");
    s
}

/// The outcome of `--compare NAME` for a part: its measures flagged more than 5 % worse.
pub fn compared_line(name: &str, worse: &[String]) -> String {
    format!(
        "Compared with saved run `{name}`: {}.",
        if worse.is_empty() {
            "no ratio more than 5 % worse".to_owned()
        } else {
            format!("more than 5 % worse: {}", worse.join("; "))
        }
    )
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

/// Writes the many-connections run's section (`cargo xtask bench --scale`) into its part of
/// docs/BENCHMARKS.md.
pub fn write_scale(path: &Path, section: &str) -> Result<()> {
    replace_part(
        path,
        SCALE_BEGIN,
        SCALE_END,
        &format!("{SCALE_BEGIN}\n{}\n{SCALE_END}\n", section.trim_end()),
    )
}

/// Where the many-connections run's generated part begins and ends.
const SCALE_BEGIN: &str = "<!-- cargo xtask bench --scale: generated part, begin -->";
const SCALE_END: &str = "<!-- cargo xtask bench --scale: generated part, end -->";

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

#[cfg(test)]
mod tests {
    use super::*;

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
