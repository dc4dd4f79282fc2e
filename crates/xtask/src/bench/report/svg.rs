//! The SVG plot of a run's samples.

use std::fmt::Write as _;
use std::path::Path;

use super::super::BASELINE;
use super::samples::{Figure, Series};
use crate::Result;

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
