//! `cargo rxe test`: a package's or workspace's test binaries, built on the host, run in the
//! VM binary by binary between markers, and counted test by test.
//!
//! # How tests are counted
//!
//! Each binary's tests come from `BIN --list` on the host (with the test arguments, so a filter
//! narrows both the list and the run). In the guest each binary runs in its package's directory,
//! as `cargo test` runs it, with `--show-output` added (unless `--nocapture` is given), so that
//! a passed test's output is printed after libtest's result lines. A test is **passed** when
//! libtest reports it `ok`; **skipped** when it is `#[ignore]`d, or when it printed a line
//! `skipping <test>: <reason>` (the skip convention of device tests: a test that finds no device
//! says so instead of passing); **failed** when libtest reports it `FAILED` or when it never
//! reported (its binary crashed, hung past `--timeout`, or the VM run ended first). Binaries
//! that list no test do not run. Doc-tests are not built by `cargo test --no-run`; they are not
//! run here.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cargo::{self, Artifact};
use crate::libtest::{self, DeviceLog, Tally, Verdict};
use crate::vm::{self, shell_join};
use crate::{setup, Result};

/// One test binary and the tests it lists.
#[derive(Debug, Clone)]
pub struct Binary {
    /// `package-dir/target`: how the binary is named in the output and the markers.
    pub label: String,
    pub exe: PathBuf,
    /// Where it runs (its package's directory), with `CARGO_MANIFEST_DIR` set to it.
    pub dir: PathBuf,
    pub tests: Vec<String>,
}

/// Lists the tests of each artifact (`EXE --list --format=terse ARGS`, on the host).
pub fn list(artifacts: &[Artifact], args: &[String]) -> Result<Vec<Binary>> {
    let mut out = Vec::new();
    for a in artifacts {
        let o = Command::new(&a.exe)
            .args(["--list", "--format=terse"])
            .args(args.iter().filter(|a| !RUN_ONLY.contains(&a.as_str())))
            .current_dir(&a.package_dir)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", a.exe.display()))?;
        if !o.status.success() {
            return Err(format!(
                "`{} --list` failed ({})",
                a.exe.display(),
                o.status
            ));
        }
        out.push(Binary {
            label: a.label(),
            exe: a.exe.clone(),
            dir: a.package_dir.clone(),
            tests: libtest::listed(&String::from_utf8_lossy(&o.stdout)),
        });
    }
    Ok(out)
}

/// Test arguments that change how tests run, not which: left out of `--list`.
const RUN_ONLY: &[&str] = &["--nocapture", "--show-output", "--quiet", "-q"];

/// What a [`script`] does around the binaries.
#[derive(Debug, Clone, Default)]
pub struct Script<'a> {
    /// Shell text before the first binary (functions for `after_each`).
    pub prelude: &'a str,
    /// Shell text after each binary; `$1` is its label.
    pub after_each: &'a str,
    /// Shell text after the last binary, before the script exits with its status.
    pub tail: &'a str,
    /// The arguments of every binary (`--show-output` is added unless it or `--nocapture` is
    /// there).
    pub args: &'a [String],
    /// Each binary's bound: `timeout` kills it after this long (exit status 124).
    pub timeout: Duration,
}

/// The guest's shell script: each binary between `@@evchan-test-begin LABEL` and
/// `@@evchan-test-end LABEL STATUS` (read back by [`DeviceLog`]); it exits 1 when any failed.
pub fn script(bins: &[Binary], s: &Script<'_>) -> String {
    let mut args = s.args.to_vec();
    // Skip lines must reach the output: libtest prints a passed test's captured output at the
    // end with `--show-output`, after clean result lines (with `--nocapture` and several test
    // threads, the tests' output can split libtest's lines).
    if !args
        .iter()
        .any(|a| a == "--nocapture" || a == "--show-output")
    {
        args.push("--show-output".into());
    }
    // The guest's console is a terminal: no colours unless asked for.
    if !args.iter().any(|a| a.starts_with("--color")) {
        args.push("--color=never".into());
    }
    let mut out = String::from("status=0\nsay() { echo \"evchan-test: $*\"; }\n");
    out.push_str(s.prelude);
    let _ = write!(
        out,
        "run() {{\n\
         \x20   echo \"{begin}$1\"\n\
         \x20   (cd \"$3\" || exit 125; export CARGO_MANIFEST_DIR=\"$3\"; exec timeout {secs} \"$2\" {args}) 2>&1\n\
         \x20   rc=$?\n\
         \x20   echo \"{end}$1 $rc\"\n\
         \x20   [ $rc -eq 0 ] || status=1\n\
         {after}}}\n",
        begin = libtest::BEGIN,
        end = libtest::END,
        secs = s.timeout.as_secs().max(1),
        args = shell_join(&args),
        after = s.after_each,
    );
    for b in bins {
        let _ = writeln!(
            out,
            "run {}",
            shell_join(&[
                b.label.clone(),
                b.exe.display().to_string(),
                b.dir.display().to_string()
            ])
        );
    }
    out.push_str(s.tail);
    out.push_str("exit $status\n");
    out
}

/// How a run of binaries went: each listed test's verdict, by binary.
#[derive(Debug, Default)]
pub struct Report {
    pub verdicts: Vec<(String, Verdict)>,
    pub tally: Tally,
}

impl Report {
    /// Each listed test of `bins` from the log; `end` says how the run ended when a binary
    /// never ended.
    pub fn new(log: &mut DeviceLog, bins: &[Binary], end: &str) -> Self {
        let mut r = Self::default();
        for b in bins {
            for (test, v) in log.verdicts(&b.label, &b.tests, end) {
                r.tally.add(&v);
                r.verdicts.push((format!("{} {test}", b.label), v));
            }
        }
        r
    }

    /// The failed and skipped tests by name, then `N passed, N failed, N skipped`.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for (kind, what) in [("failed", true), ("skipped", false)] {
            let named: Vec<(String, String)> = self
                .verdicts
                .iter()
                .filter_map(|(n, v)| match v {
                    Verdict::Failed(w) if what => Some((n.clone(), w.clone())),
                    Verdict::Skipped(w) if !what => Some((n.clone(), w.clone())),
                    _ => None,
                })
                .collect();
            if !named.is_empty() {
                let _ = writeln!(s, "{kind}:");
                s.push_str(&libtest::name_list(&named, 50));
            }
        }
        let t = self.tally;
        let _ = write!(
            s,
            "{} passed, {} failed, {} skipped",
            t.passed, t.failed, t.skipped
        );
        s
    }
}

/// `cargo rxe test [RXE OPTIONS] [CARGO TEST OPTIONS] [-- TEST ARGS]`.
pub fn cli(args: &[String]) -> Result<i32> {
    let Some(vm::Options {
        job: mut opts,
        own,
        after: test_args,
    }) = vm::options(args, Duration::from_secs(600), &[])?
    else {
        return Ok(0);
    };
    let mut cargo_args = vec!["test".to_owned()];
    for (a, _) in own {
        if a == "--doc" || a == "--no-run" {
            return Err(format!("cargo rxe test cannot take `{a}`"));
        }
        cargo_args.push(a);
    }
    // `--timeout` bounds each binary; the run's bound follows from the number of binaries.
    let timeout = opts.timeout;
    // Device tests that follow the skip convention fail instead of skipping (`--env` wins).
    opts.env
        .insert(0, ("EVCHAN_REQUIRE_DEVICE".to_owned(), "1".to_owned()));
    setup::ensure()?;
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    let here = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    let built: Vec<Artifact> = cargo::build(&cargo, &here, &cargo_args)?
        .into_iter()
        .filter(|a| a.test)
        .collect();
    let all = list(&built, &test_args)?;
    let (bins, empty): (Vec<Binary>, Vec<Binary>) =
        all.into_iter().partition(|b| !b.tests.is_empty());
    if !empty.is_empty() {
        let names: Vec<&str> = empty.iter().map(|b| b.label.as_str()).collect();
        eprintln!(
            "cargo-rxe: {} binaries list no test and do not run: {}",
            names.len(),
            names.join(", ")
        );
    }
    if bins.is_empty() {
        println!("0 passed, 0 failed, 0 skipped");
        return Err("no test to run: no test binary lists a test".into());
    }
    let n: usize = bins.iter().map(|b| b.tests.len()).sum();
    eprintln!(
        "cargo-rxe: running {n} tests of {} binaries in the soft-RoCE VM",
        bins.len()
    );
    let mut keep: Vec<PathBuf> = bins
        .iter()
        .flat_map(|b| [b.exe.clone(), b.dir.clone()])
        .collect();
    keep.push(here);
    let job = vm::Job {
        command: script(
            &bins,
            &Script {
                args: &test_args,
                timeout,
                ..Script::default()
            },
        ),
        keep,
        timeout: timeout * u32::try_from(bins.len()).unwrap_or(u32::MAX) + Duration::from_secs(300),
        ..opts
    };
    let started = Instant::now();
    let mut log = DeviceLog::default();
    let end = match vm::run(&job, &mut |line| {
        println!("{line}");
        log.add_line(line);
    }) {
        Ok(_) => "no end marker".to_owned(),
        Err(e) => {
            eprintln!("cargo-rxe: {e}");
            e
        }
    };
    let report = Report::new(&mut log, &bins, &end);
    eprintln!(
        "cargo-rxe: {} binaries in {:.0} s",
        bins.len(),
        started.elapsed().as_secs_f64()
    );
    println!("{}", report.summary());
    Ok(i32::from(
        report.tally.failed > 0 || report.tally.total() == 0,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(label: &str, tests: &[&str]) -> Binary {
        Binary {
            label: label.into(),
            exe: PathBuf::from(format!("/t/{label}")),
            dir: PathBuf::from("/w/a b"),
            tests: tests.iter().map(|t| (*t).to_owned()).collect(),
        }
    }

    #[test]
    fn the_script_runs_each_binary_in_its_package_between_markers() {
        let s = script(
            &[bin("p/device_x", &["a"]), bin("p/unit", &["b"])],
            &Script {
                after_each: "    check \"$1\"\n",
                args: &["--test-threads=1".to_owned()],
                timeout: Duration::from_secs(30),
                ..Script::default()
            },
        );
        assert!(s.contains("echo \"@@evchan-test-begin $1\""), "{s}");
        assert!(
            s.contains("exec timeout 30 \"$2\" --test-threads=1 --show-output --color=never"),
            "{s}"
        );
        assert!(
            s.contains("run p/device_x /t/p/device_x '/w/a b'\nrun p/unit"),
            "{s}"
        );
        assert!(s.contains("    check \"$1\"\n}"), "{s}");
        assert!(s.ends_with("exit $status\n"));
        let once = script(
            &[],
            &Script {
                args: &["--nocapture".to_owned()],
                ..Script::default()
            },
        );
        assert_eq!(once.matches("--nocapture").count(), 1, "{once}");
        assert!(!once.contains("--show-output"), "{once}");
    }

    #[test]
    fn the_summary_counts_every_listed_test_once() {
        let bins = [
            bin("p/a", &["ok1", "skip1", "fail1"]),
            bin("p/hung", &["h"]),
        ];
        let mut log = DeviceLog::default();
        for l in [
            "@@evchan-test-begin p/a",
            "running 3 tests",
            "test ok1 ... ok",
            "skipping skip1: no device",
            "test skip1 ... ok",
            "test fail1 ... FAILED",
            "@@evchan-test-end p/a 101",
            "@@evchan-test-begin p/hung",
            "running 1 test",
        ] {
            log.add_line(l);
        }
        let r = Report::new(&mut log, &bins, "the job did not finish");
        assert_eq!((r.tally.passed, r.tally.failed, r.tally.skipped), (1, 2, 1));
        let s = r.summary();
        assert!(s.ends_with("1 passed, 2 failed, 1 skipped"), "{s}");
        assert!(s.contains("p/hung h: never reported"), "{s}");
        assert!(s.contains("p/a skip1: no device"), "{s}");
    }
}
