//! `cargo xtask test`: the whole ladder, ending in one `N passed, N failed, N skipped` line.
//! `cargo xtask demo`: the smoke program through the layers, on a device.
//!
//! # How tests are counted
//!
//! Every test is counted once, as passed, failed or skipped, and the total is checked against
//! the tests that exist. Checks of the ladder itself (fmt, clippy, docs, cargo-deny, the fuzz
//! targets, the VM runner's promises, two-host rping) count as one test each, and so does each
//! benchmark executable (`benches/*.rs`, test profile), run once in the device tests' VM boot
//! after them with criterion's `--test` (each benchmark one iteration): it passes when it exits 0.
//!
//! - Native (`cargo test --workspace`): libtest's `test NAME ... RESULT` lines of every binary
//!   and doc-test run; `ignored` is skipped; a binary that ends before its `test result:` line
//!   fails the tests it announced (`running N tests`) and never reported.
//! - Device tests: every `tests/device_*.rs` of every workspace package, run binary by binary
//!   (`--nocapture --test-threads=1`, one test at a time) between markers. The list of tests
//!   comes from `BIN --list` on the host: a test that never reported is failed by name, with
//!   how its binary ended (crashed, aborted, timed out, or the VM run ended first). They count
//!   once, where a device is (the VM, or this host's ACTIVE port); natively they are only
//!   checked: each must skip without `EVCHAN_REQUIRE_DEVICE`, and fail with
//!   `EVCHAN_REQUIRE_DEVICE=1`. Between binaries the VM puts back rxe0 and dummy0, so no binary
//!   depends on the order of the others.
//!
//! # The skip convention, for any crate's device tests
//!
//! A device test that cannot run here prints one line to stderr,
//!
//! ```text
//! skipping <test>: <reason>
//! ```
//!
//! with `<test>` libtest's name of the test (`std::thread::current().name()`), and returns;
//! under `EVCHAN_REQUIRE_DEVICE=1` it panics instead. `eprintln!` is fine: the runner runs the
//! device binaries with `--nocapture`. A test that returns without that line passed; one whose line
//! names it was skipped. `crates/evchan-core/tests/support/mod.rs` (`require_device!`) is the
//! reference; a crate copies it.
//!
//! This module holds the ladder's order, its tally and summary, and `demo`; [`native`] runs the
//! native tests and checks that the device tests skip and fail as they must, [`device`] runs
//! the device tests and benchmarks where a device is and checks the VM runner,
//! [`two_hosts`](mod@two_hosts) runs the two-VM steps.

mod device;
mod fresh;
mod native;
mod two_hosts;

use std::time::{Duration, Instant};

use cargo_rxe::cargo::Artifact;

use crate::cargo::{cargo, executables, test_executables};
use crate::libtest::{self, name_list, Verdict};
use crate::{fuzz, host_has_active_rdma_port, setup, vm, Result};

use device::{device_tests, runner_faults};
use native::{native_device_checks, native_tests};
use two_hosts::{evchan_two_hosts, is_two_host, two_hosts, two_hosts_only};

/// Where device tests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// This host has an ACTIVE RDMA port.
    Native,
    /// The soft-RoCE VM.
    Vm,
}

pub(crate) fn place(args: &[String], task: &str) -> Result<Place> {
    let mut force_vm = false;
    for a in args {
        match a.as_str() {
            "--vm" => force_vm = true,
            other => return Err(format!("{task}: unknown option `{other}` (only --vm)")),
        }
    }
    Ok(if !force_vm && host_has_active_rdma_port() {
        Place::Native
    } else {
        Place::Vm
    })
}

/// The running tally: tests one by one, checks of the ladder as one test each.
#[derive(Default)]
struct Tally {
    counts: libtest::Tally,
    /// Tests that exist: listed by libtest (`running N tests`, `--list`), plus the checks.
    expected: u64,
    report: Vec<String>,
}

impl Tally {
    /// One check of the ladder (fmt, clippy, a fuzz target, …): one test that exists.
    fn gate(&mut self, name: &str, ok: bool, took: Duration) {
        self.expected += 1;
        self.counts.add(&if ok {
            Verdict::Passed
        } else {
            Verdict::Failed(String::new())
        });
        let verdict = if ok { "ok" } else { "FAILED" };
        self.report.push(format!(
            "{verdict:>6}  {name} ({:.0} s)",
            took.as_secs_f64()
        ));
        eprintln!("==> {name}: {verdict}");
    }

    /// A group of tests: each verdict counted; `expected` of them exist. Failures and skips
    /// are named in the report.
    fn tests(&mut self, name: &str, verdicts: &[(String, Verdict)], expected: u64, took: Duration) {
        let mut c = libtest::Tally::default();
        let mut failed = Vec::new();
        let mut skipped = Vec::new();
        for (test, v) in verdicts {
            c.add(v);
            match v {
                Verdict::Failed(why) => failed.push((test.clone(), why.clone())),
                Verdict::Skipped(why) => skipped.push((test.clone(), why.clone())),
                Verdict::Passed => {}
            }
        }
        self.counts.passed += c.passed;
        self.counts.failed += c.failed;
        self.counts.skipped += c.skipped;
        self.expected += expected;
        let verdict = if c.failed == 0 { "ok" } else { "FAILED" };
        let mut line = format!(
            "{verdict:>6}  {name}: {} passed, {} failed, {} skipped of {expected} ({:.0} s)",
            c.passed,
            c.failed,
            c.skipped,
            took.as_secs_f64()
        );
        if !failed.is_empty() {
            line.push_str("\n        failed:\n");
            line.push_str(name_list(&failed, 40).trim_end());
        }
        if !skipped.is_empty() {
            line.push_str("\n        skipped:\n");
            line.push_str(name_list(&skipped, 10).trim_end());
        }
        self.report.push(line);
        eprintln!("==> {name}: {verdict}");
    }
}

pub fn run(args: &[String]) -> Result<i32> {
    if args.iter().any(|a| a == "--two-hosts") {
        return two_hosts_only(args);
    }
    if args.iter().any(|a| a == "--fresh-crate") {
        if let Some(other) = args.iter().find(|a| *a != "--fresh-crate") {
            return Err(format!("test --fresh-crate: unknown option `{other}`"));
        }
        setup::ensure()?;
        let mut t = Tally::default();
        fresh::fresh_crate(&mut t);
        return Ok(finish(&t));
    }
    let place = place(args, "test")?;
    let mut t = Tally::default();
    knobs(&mut t);

    let start = Instant::now();
    if let Err(e) = setup::ensure().and_then(|_| setup::ensure_tools()) {
        // Nothing below can run without the packages: say so, and count it.
        t.gate("setup", false, start.elapsed());
        eprintln!("xtask: {e}");
        return Ok(finish(&t));
    }
    t.gate(
        "setup (packages, VM kernel, cargo-fuzz, cargo-deny)",
        true,
        start.elapsed(),
    );

    gate(&mut t, "cargo fmt --check", &["fmt", "--all", "--check"]);
    gate(
        &mut t,
        "cargo clippy -D warnings",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--quiet",
            "--",
            "-D",
            "warnings",
        ],
    );
    let start = Instant::now();
    let doc = cargo(&["doc", "--workspace", "--no-deps", "--quiet"])
        .env("RUSTDOCFLAGS", "-D warnings")
        .status()
        .is_ok_and(|s| s.success());
    t.gate("cargo doc -D warnings", doc, start.elapsed());
    // Not `advisories`: the RustSec database is cloned from github.com, which CI cannot reach.
    gate(
        &mut t,
        "cargo deny check bans licenses sources",
        &["deny", "check", "bans", "licenses", "sources"],
    );

    let start = Instant::now();
    let packaged = published_packages_ship_licenses();
    if let Err(e) = &packaged {
        eprintln!("xtask: {e}");
    }
    t.gate(
        "every published package ships LICENSE-MIT and LICENSE-APACHE (cargo package --list) \
         and a README without relative links",
        packaged.is_ok(),
        start.elapsed(),
    );

    let start = Instant::now();
    let device_bins = match test_executables("device_") {
        Ok(bins) => bins,
        Err(e) => {
            eprintln!("xtask: {e}");
            t.gate("device test binaries build", false, start.elapsed());
            return Ok(finish(&t));
        }
    };
    let listed = match list_device_tests(&device_bins) {
        Ok(l) if !l.is_empty() => l,
        Ok(_) => {
            eprintln!("xtask: no device tests (tests/device_*.rs) found");
            t.gate("device tests exist", false, start.elapsed());
            return Ok(finish(&t));
        }
        Err(e) => {
            eprintln!("xtask: {e}");
            t.gate("device tests --list", false, start.elapsed());
            return Ok(finish(&t));
        }
    };

    native_tests(&mut t, &device_bins);
    if !host_has_active_rdma_port() {
        native_device_checks(&mut t, &listed);
    }
    // A `device_two_host*` binary needs two hosts: it runs (and counts) in the two-VM checks.
    let (two_host, one_host): (Vec<_>, Vec<_>) =
        listed.into_iter().partition(|b| is_two_host(&b.label));
    // The benchmarks (benches/*.rs), built in the test profile, each run once in the same boot.
    let start = Instant::now();
    let benches = match executables(&["test", "--workspace", "--benches"], "bench", "") {
        Ok(found) => found.into_iter().map(|a| (a.name, a.exe)).collect(),
        Err(e) => {
            eprintln!("xtask: {e}");
            t.gate("benchmark executables build", false, start.elapsed());
            Vec::new()
        }
    };
    device_tests(&mut t, place, &one_host, &benches);
    two_hosts(&mut t);
    for b in &two_host {
        evchan_two_hosts(&mut t, b);
    }
    runner_faults(&mut t);
    fresh::fresh_crate(&mut t);
    fuzz::ladder(&mut |name, ok, took| t.gate(name, ok, took));

    Ok(finish(&t))
}

/// Variables of this environment that pass into the guest and may change what a test does
/// (e.g. `EVCHAN_COMPLETIONS` shrinks one): said out loud, and in the summary.
fn knobs(t: &mut Tally) {
    let set: Vec<String> = vm::passed_env()
        .into_iter()
        .filter(|(k, _)| k != "EVCHAN_REQUIRE_DEVICE")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !set.is_empty() {
        let line = format!(
            "note: set in this environment and passed into the guest: {} (such knobs may \
             shrink or change tests)",
            set.join(" ")
        );
        eprintln!("xtask: {line}");
        t.report.push(format!("        {line}"));
    }
}

/// The packages this workspace publishes, by their directory under `crates/`.
const PUBLISHED: &[&str] = &["evchan-sys", "evchan-core", "evchan", "cargo-rxe"];

/// Each of [`PUBLISHED`] lists both license files in `cargo package --list`, and its README
/// links nothing by a relative path (which breaks on crates.io).
fn published_packages_ship_licenses() -> Result<()> {
    let mut wrong = Vec::new();
    for p in PUBLISHED {
        let o = cargo(&["package", "--list", "--allow-dirty", "--quiet", "-p", p])
            .output()
            .map_err(|e| format!("cannot run cargo package: {e}"))?;
        let list = String::from_utf8_lossy(&o.stdout);
        for f in ["LICENSE-MIT", "LICENSE-APACHE", "README.md"] {
            if !o.status.success() || !list.lines().any(|l| l == f) {
                wrong.push(format!("{p}: `cargo package --list` has no {f}"));
            }
        }
        let readme =
            std::fs::read_to_string(crate::root().join("crates").join(p).join("README.md"))
                .unwrap_or_default();
        for link in readme.split("](").skip(1) {
            let target = link.split(')').next().unwrap_or_default();
            if !(target.starts_with("https://")
                || target.starts_with("http://")
                || target.starts_with('#'))
            {
                wrong.push(format!(
                    "{p}: README.md links `{target}`, which breaks on crates.io"
                ));
            }
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

fn gate(t: &mut Tally, name: &str, args: &[&str]) {
    let start = Instant::now();
    let ok = cargo(args).status().is_ok_and(|s| s.success());
    t.gate(name, ok, start.elapsed());
}

/// One device test binary and its tests, as `BIN --list` names them; its label is the
/// package's directory and the target, `evchan-core/device_cm`.
type DeviceBin = cargo_rxe::suite::Binary;

fn list_device_tests(bins: &[Artifact]) -> Result<Vec<DeviceBin>> {
    match cargo_rxe::suite::list(bins, &[]) {
        (listed, failed) if failed.is_empty() => Ok(listed),
        (_, failed) => Err(failed
            .iter()
            .map(|(label, why)| format!("{label}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

fn finish(t: &Tally) -> i32 {
    let mut c = t.counts;
    println!();
    println!("summary:");
    for line in &t.report {
        println!("{line}");
    }
    if c.total() != t.expected {
        // Every test that exists must have been counted once; anything else is a bug here.
        println!(
            "FAILED  the count: {} counted, but {} tests and checks exist",
            c.total(),
            t.expected
        );
        c.failed += 1;
    } else {
        println!(
            "        {} counted = {} tests and checks that exist (libtest's lists, `--list`)",
            c.total(),
            t.expected
        );
    }
    println!(
        "{} passed, {} failed, {} skipped",
        c.passed, c.failed, c.skipped
    );
    i32::from(c.failed > 0)
}

/// `cargo xtask demo`: build examples/demo.rs and run it where a device is.
pub fn demo(args: &[String]) -> Result<i32> {
    let place = place(args, "demo")?;
    setup::ensure()?;
    let ok = cargo(&["build", "--quiet", "--example", "demo"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Err("building examples/demo.rs failed".into());
    }
    let exe = crate::target_dir().join("debug/examples/demo");
    match place {
        Place::Native => {
            let st = std::process::Command::new(&exe)
                .status()
                .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
            Ok(st.code().unwrap_or(1))
        }
        Place::Vm => {
            let job = vm::Job {
                command: vm::shell_join(&[exe.display().to_string()]),
                timeout: Duration::from_secs(300),
                ..crate::job()
            };
            Ok(vm::run(&job, &mut |l| println!("{l}"))?.code)
        }
    }
}
