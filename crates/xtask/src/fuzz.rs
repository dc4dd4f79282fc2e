//! `cargo xtask fuzz [--seconds N] [TARGET...]`: every fuzz target of `fuzz/`, with the address
//! sanitizer; and the short fuzz checks of `cargo xtask test`.
//!
//! Toolchain: the pinned one of `rust-toolchain.toml` with `RUSTC_BOOTSTRAP=1`, which lets it
//! take the `-Z` flags cargo-fuzz passes (`-Zsanitizer=address`). Its `rust-std` ships the
//! sanitizer runtimes, so no nightly is downloaded, and CI's fresh machine (which has the
//! pinned toolchain and nothing else) builds exactly what runs here.
//!
//! Inputs: `fuzz/seeds/TARGET/` (committed seed corpora) and `fuzz/regressions/TARGET/` (every
//! crash found, committed before its fix) are run first, each input once; then libFuzzer
//! mutates, keeping new inputs in `fuzz/corpus/TARGET/` (ignored by git). A crash leaves its
//! input in `fuzz/artifacts/TARGET/`: copy it into `fuzz/regressions/TARGET/`, commit, then fix.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{root, setup, Result};

/// The fuzz targets (`fuzz/fuzz_targets/*.rs`).
pub const TARGETS: &[&str] = &[
    "cm_event",
    "work_completion",
    "async_event",
    "handshake",
    "remote_buf",
];
/// How long `cargo xtask test` fuzzes each target, after its seeds and regressions.
const LADDER_SECONDS: u64 = 20;
/// The default of `cargo xtask fuzz`.
const DEFAULT_SECONDS: u64 = 60;

pub fn run(args: &[String]) -> Result<i32> {
    let mut seconds = DEFAULT_SECONDS;
    let mut targets: Vec<&str> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                let s = it.next().ok_or("--seconds needs a value")?;
                seconds = s
                    .parse()
                    .map_err(|_| format!("--seconds takes a number, not `{s}`"))?;
            }
            t if TARGETS.contains(&t) => targets.push(t),
            other => {
                return Err(format!(
                    "fuzz: unknown option or target `{other}` (targets: {})",
                    TARGETS.join(", ")
                ))
            }
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    setup::ensure_tools()?;
    if !build() {
        return Err("building the fuzz targets failed".into());
    }
    let mut failed = Vec::new();
    for t in targets {
        if !replay(t) || !fuzz(t, seconds) {
            failed.push(t);
        }
    }
    if failed.is_empty() {
        eprintln!("fuzz: every target ran clean");
        Ok(0)
    } else {
        eprintln!(
            "fuzz: FAILED: {} (inputs in fuzz/artifacts/TARGET/)",
            failed.join(", ")
        );
        Ok(1)
    }
}

/// The ladder's fuzz checks: the build of every target, then each target over its seeds and
/// regressions and for [`LADDER_SECONDS`] more; one check each.
pub fn ladder(gate: &mut dyn FnMut(&str, bool, Duration)) {
    let start = Instant::now();
    let built = build();
    gate(
        "fuzz targets build (cargo fuzz build, address sanitizer)",
        built,
        start.elapsed(),
    );
    for t in TARGETS {
        let start = Instant::now();
        let ok = built && replay(t) && fuzz(t, LADDER_SECONDS);
        gate(
            &format!("fuzz {t}: seeds, regressions, {LADDER_SECONDS} s of fuzzing"),
            ok,
            start.elapsed(),
        );
    }
}

/// `cargo fuzz` in the workspace root, on the pinned toolchain (see the module docs).
fn cargo_fuzz(args: &[&str]) -> Command {
    let mut cmd = crate::cargo::cargo(&["fuzz"]);
    cmd.args(args).env("RUSTC_BOOTSTRAP", "1");
    cmd
}

fn build() -> bool {
    // Debug assertions on: overflow in the decoding is a finding too.
    cargo_fuzz(&["build", "--debug-assertions", "--sanitizer", "address"])
        .status()
        .is_ok_and(|s| s.success())
}

fn dirs(target: &str) -> Vec<String> {
    ["seeds", "regressions"]
        .iter()
        .map(|d| root().join("fuzz").join(d).join(target))
        .filter(|p| p.is_dir())
        .map(|p| p.display().to_string())
        .collect()
}

/// Runs every seed and regression input once.
fn replay(target: &str) -> bool {
    let dirs = dirs(target);
    if dirs.is_empty() {
        return true;
    }
    let mut args = vec![
        "run",
        "--debug-assertions",
        "--sanitizer",
        "address",
        target,
    ];
    args.extend(dirs.iter().map(String::as_str));
    args.extend(["--", "-runs=0"]);
    cargo_fuzz(&args).status().is_ok_and(|s| s.success())
}

/// Fuzzes `target` for `seconds`, from its seeds, keeping new inputs in `fuzz/corpus/`.
fn fuzz(target: &str, seconds: u64) -> bool {
    let corpus = root().join("fuzz/corpus").join(target);
    if std::fs::create_dir_all(&corpus).is_err() {
        return false;
    }
    let corpus = corpus.display().to_string();
    let mut args = vec![
        "run",
        "--debug-assertions",
        "--sanitizer",
        "address",
        target,
        &corpus,
    ];
    let dirs = dirs(target);
    args.extend(dirs.iter().map(String::as_str));
    let time = format!("-max_total_time={seconds}");
    args.extend(["--", &time, "-print_final_stats=1"]);
    let ok = cargo_fuzz(&args).status().is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "fuzz: {target} failed; its input is in {}",
            Path::new("fuzz/artifacts").join(target).display()
        );
    }
    ok
}
