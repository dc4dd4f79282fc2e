//! What `cargo xtask bench` makes of a run: medians from criterion's samples, instructions from
//! callgrind, the ratios (saved and compared), `docs/BENCHMARKS.md` and the SVG plot.
//!
//! [`samples`] reads the run (criterion's samples, callgrind's counts), [`ratios`] makes the
//! table and the saved ratios of them, [`markdown`] writes `docs/BENCHMARKS.md`'s generated
//! parts, [`svg`] the plot.

mod markdown;
mod ratios;
mod samples;
mod svg;

pub use markdown::{compared_line, write_markdown, write_scale, write_tools, Run};
pub use ratios::{table, Measure, Ratios, BEYOND};
pub use samples::{complete, figures, Instructions};
pub use svg::write_svg;
