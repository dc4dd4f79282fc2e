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

/// Lists the tests of each artifact (`EXE --list --format=terse ARGS`, on the host). Labels
/// are made unique (two packages in directories of the same name: `#2`, `#3`, …). A binary
/// whose listing fails comes back in the second list, with why.
pub fn list(artifacts: &[Artifact], args: &[String]) -> (Vec<Binary>, Vec<(String, String)>) {
    let mut out: Vec<Binary> = Vec::new();
    let mut failed = Vec::new();
    for a in artifacts {
        let mut label = a.label();
        let mut n = 1;
        while out.iter().any(|b| b.label == label) {
            n += 1;
            label = format!("{} #{n}", a.label());
        }
        let listed = Command::new(&a.exe)
            .args(["--list", "--format=terse"])
            .args(args.iter().filter(|a| !RUN_ONLY.contains(&a.as_str())))
            .current_dir(&a.package_dir)
            .stderr(Stdio::inherit())
            .output();
        match listed {
            Ok(o) if o.status.success() => out.push(Binary {
                label,
                exe: a.exe.clone(),
                dir: a.package_dir.clone(),
                tests: libtest::listed(&String::from_utf8_lossy(&o.stdout)),
            }),
            Ok(o) => failed.push((label, format!("`--list` failed ({})", o.status))),
            Err(e) => failed.push((label, format!("cannot run {}: {e}", a.exe.display()))),
        }
    }
    (out, failed)
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
         \x20   (cd \"$3\" || exit 125; export CARGO_MANIFEST_DIR=\"$3\"; exec timeout -k 10 {secs} \"$2\" {args}) 2>&1\n\
         \x20   rc=$?\n\
         \x20   echo; echo \"{end}$1 $rc\"\n\
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

/// Options of `cargo test` that take a value as the next argument: what follows them is not a
/// test filter.
const CARGO_VALUE_OPTIONS: &[&str] = &[
    "-p",
    "--package",
    "--exclude",
    "-F",
    "--features",
    "--target",
    "--target-dir",
    "--manifest-path",
    "--profile",
    "-j",
    "--jobs",
    "--bin",
    "--test",
    "--example",
    "--bench",
    "--color",
    "--config",
    "-Z",
    "--lockfile-path",
];

/// Test arguments whose output the counting cannot read.
const UNREADABLE: &[&str] = &["-q", "--quiet", "--format", "--list", "-Z"];

/// Splits `cargo rxe test`'s own arguments before `--` into cargo's and the test filters (a
/// positional argument, as `cargo test FILTER` takes it), the filters first.
fn split_cargo_args(own: Vec<String>) -> Result<(Vec<String>, Vec<String>)> {
    let mut cargo_args = vec!["test".to_owned()];
    let mut filters = Vec::new();
    let mut value_next = false;
    for a in own {
        if a == "--doc" || a == "--no-run" {
            return Err(format!("cargo rxe test cannot take `{a}`"));
        }
        if value_next || a.starts_with('-') {
            value_next = !value_next && CARGO_VALUE_OPTIONS.contains(&a.as_str());
            cargo_args.push(a);
        } else {
            filters.push(a);
        }
    }
    Ok((cargo_args, filters))
}

/// `cargo rxe test [RXE OPTIONS] [CARGO TEST OPTIONS] [FILTER] [-- TEST ARGS]`.
pub fn cli(args: &[String]) -> Result<i32> {
    let Some(vm::Options {
        job: mut opts,
        own,
        after,
    }) = vm::options(args, Duration::from_secs(600), &[])?
    else {
        return Ok(0);
    };
    let (cargo_args, mut test_args) = split_cargo_args(own.into_iter().map(|(a, _)| a).collect())?;
    if let Some(bad) = after.iter().find(|a| {
        UNREADABLE
            .iter()
            .any(|u| *a == u || a.starts_with(&format!("{u}=")))
    }) {
        return Err(format!(
            "cargo rxe test reads libtest's default output to count the tests: it cannot take `{bad}`"
        ));
    }
    test_args.extend(after);
    // `--timeout` bounds each binary; the run's bound follows from the number of binaries.
    let timeout = opts.timeout;
    // Device tests that follow the skip convention fail instead of skipping (`--env` wins).
    opts.env
        .insert(0, ("EVCHAN_REQUIRE_DEVICE".to_owned(), "1".to_owned()));
    setup::ensure()?;
    let cargo = cargo::program();
    let here = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    let built: Vec<Artifact> = cargo::build(&cargo, &here, &cargo_args)?
        .into_iter()
        .filter(|a| a.test)
        .collect();
    let (all, unlisted) = list(&built, &test_args);
    for (label, why) in &unlisted {
        eprintln!("cargo-rxe: {label}: {why}; it does not run, and the run fails");
    }
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
    let bound = timeout
        .checked_mul(u32::try_from(bins.len()).unwrap_or(u32::MAX))
        .and_then(|t| t.checked_add(Duration::from_secs(300)))
        .unwrap_or(vm::MAX_TIMEOUT)
        .min(vm::MAX_TIMEOUT);
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
        timeout: bound,
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
    // A binary that reported every test and still exited non-zero (a crash at exit): its
    // tests keep their verdicts, and the run fails.
    let bad_exits: Vec<String> = bins
        .iter()
        .filter_map(|b| {
            let (_, rc) = log.ended.get(&b.label)?;
            (*rc != 0).then(|| format!("{} exited with {rc}", b.label))
        })
        .collect();
    let report = Report::new(&mut log, &bins, &end);
    eprintln!(
        "cargo-rxe: {} binaries in {:.0} s",
        bins.len(),
        started.elapsed().as_secs_f64()
    );
    let t = report.tally;
    if t.failed == 0 {
        for e in &bad_exits {
            eprintln!("cargo-rxe: {e} after all its tests passed: the run fails");
        }
    }
    println!("{}", report.summary());
    let failed = t.failed > 0 || !bad_exits.is_empty() || !unlisted.is_empty();
    if t.passed == 0 && !failed {
        eprintln!("cargo-rxe: no test passed (all were skipped): the run fails");
    }
    Ok(i32::from(failed || t.passed == 0))
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
            s.contains("exec timeout -k 10 30 \"$2\" --test-threads=1 --show-output --color=never"),
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
    fn filters_and_cargo_options_are_told_apart() {
        let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let (cargo, filters) = split_cargo_args(own(&[
            "-p",
            "foo",
            "echo",
            "--features",
            "a,b",
            "--release",
            "x",
        ]))
        .unwrap();
        assert_eq!(
            cargo,
            ["test", "-p", "foo", "--features", "a,b", "--release"]
        );
        assert_eq!(filters, ["echo", "x"]);
        assert!(split_cargo_args(own(&["--doc"])).is_err());
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
