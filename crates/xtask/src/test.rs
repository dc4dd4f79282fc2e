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

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cargo::{cargo, executables, test_executables};
use crate::libtest::{self, name_list, CargoTestLog, DeviceLog, Verdict};
use crate::{fuzz, host_has_active_rdma_port, setup, vm, Result};

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
        Ok(found) => found
            .into_iter()
            .map(|(name, exe, _)| (name, exe))
            .collect(),
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

fn gate(t: &mut Tally, name: &str, args: &[&str]) {
    let start = Instant::now();
    let ok = cargo(args).status().is_ok_and(|s| s.success());
    t.gate(name, ok, start.elapsed());
}

/// One device test binary and its tests, as `BIN --list` names them.
struct DeviceBin {
    /// `evchan-core/device_cm`: the package's directory and the target.
    label: String,
    exe: PathBuf,
    tests: Vec<String>,
}

fn list_device_tests(bins: &[(String, PathBuf)]) -> Result<Vec<DeviceBin>> {
    let mut out = Vec::new();
    for (label, exe) in bins {
        let o = Command::new(exe)
            .args(["--list", "--format=terse"])
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        if !o.status.success() {
            return Err(format!("`{} --list` failed ({})", exe.display(), o.status));
        }
        out.push(DeviceBin {
            label: label.clone(),
            exe: exe.clone(),
            tests: libtest::listed(&String::from_utf8_lossy(&o.stdout)),
        });
    }
    Ok(out)
}

/// `cargo test --workspace`, stdout and stderr read as one stream. The device binaries run
/// here too (and skip), but are not counted: their tests count where a device is.
fn native_tests(t: &mut Tally, device_bins: &[(String, PathBuf)]) {
    let start = Instant::now();
    let mut log = CargoTestLog::default();
    let mut cmd = cargo(&["test", "--workspace", "--no-fail-fast"]);
    cmd.env_remove("EVCHAN_REQUIRE_DEVICE");
    let ok = run_merged(cmd, &mut |line| {
        println!("{line}");
        log.add_line(line);
    });
    let is_device = |exe: &Option<String>| {
        exe.as_deref().is_some_and(|e| {
            device_bins
                .iter()
                .any(|(_, p)| p.ends_with(e) || PathBuf::from(e).ends_with(p))
        })
    };
    let mut verdicts = Vec::new();
    let mut expected = 0;
    let mut not_counted = 0;
    for s in &log.sections {
        if is_device(&s.exe) {
            not_counted += s.announced.unwrap_or(0);
            continue;
        }
        let v = s.verdicts();
        expected += s.announced.unwrap_or(0).max(v.len() as u64);
        verdicts.extend(v.into_iter().map(|(n, v)| (format!("{} {n}", s.name), v)));
    }
    match ok {
        Ok(true) => {}
        Ok(false)
            if verdicts
                .iter()
                .any(|(_, v)| matches!(v, Verdict::Failed(_))) => {}
        Ok(false) | Err(_) => {
            // A build error or a crash with no failing test to show for it: one failure.
            if let Err(e) = &ok {
                eprintln!("xtask: {e}");
            }
            verdicts.push((
                "cargo test --workspace".into(),
                Verdict::Failed("failed without a failing test (see above)".into()),
            ));
            expected += 1;
        }
    }
    t.tests(
        "native tests (cargo test --workspace)",
        &verdicts,
        expected,
        start.elapsed(),
    );
    t.report.push(format!(
        "        ({not_counted} device tests ran natively too, skipping; they count where a device is)"
    ));
}

/// Runs `cmd` with stdout and stderr on one pipe, handing each line to `on_line`.
fn run_merged(mut cmd: Command, on_line: &mut dyn FnMut(&str)) -> Result<bool> {
    let (reader, writer) = std::io::pipe().map_err(|e| e.to_string())?;
    let writer2 = writer.try_clone().map_err(|e| e.to_string())?;
    cmd.stdout(writer).stderr(writer2);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    // Our copies of the write end must go, or the read below never sees the end.
    drop(cmd);
    for line in std::io::BufReader::new(reader).split(b'\n') {
        let Ok(line) = line else { break };
        on_line(String::from_utf8_lossy(&line).trim_end_matches('\r'));
    }
    Ok(child.wait().map_err(|e| e.to_string())?.success())
}

/// The shell script that runs every device test binary, one test at a time, between markers
/// (see [`libtest::DeviceLog`]). In the VM (`reset`), after each binary it puts back what a
/// test may have changed for the others (rxe0 deleted, dummy0 down), saying so, so that no
/// binary depends on the order of the binaries; at the end it lists what `rdma resource show`
/// still has of any process.
fn device_script(bins: &[DeviceBin], reset: bool, extra: &str) -> String {
    let mut s = String::from(
        r#"status=0
say() { echo "evchan-test: $*"; }
"#,
    );
    if reset {
        s.push_str(
            r#"ensure_rdma() {
    ip link show dummy0 | grep -q '[<,]UP[,>]' || { say "dummy0 was down after $1: up again"; ip link set dummy0 up; }
    ip -4 addr show dev dummy0 | grep -q 169.254.77.1 || { say "169.254.77.1 was gone after $1: added again"; ip addr add 169.254.77.1/32 dev dummy0; }
    rdma link show rxe0/1 >/dev/null 2>&1 || { say "rxe0 was gone after $1: added again"; rdma link add rxe0 type rxe netdev dummy0; }
    start=$(date +%s)
    until rdma link show rxe0/1 2>/dev/null | grep -q 'state ACTIVE' &&
        ip -6 addr show dev dummy0 | grep -q 'fe80::ff:fe00' &&
        [ -z "$(ip -6 addr show dev dummy0 tentative)" ]; do
        [ $(($(date +%s) - start)) -lt 30 ] || { say "rxe0 not usable again within 30 s after $1"; rdma link show; break; }
        sleep 0.1
    done
}
"#,
        );
    }
    s.push_str(
        r#"run() {
    echo "@@evchan-test-begin $1"
    timeout 1800 "$2" --nocapture --test-threads=1 2>&1
    rc=$?
    echo "@@evchan-test-end $1 $rc"
    [ $rc -eq 0 ] || status=1
"#,
    );
    if reset {
        s.push_str("    ensure_rdma \"$1\"\n");
    }
    s.push_str("}\n");
    for b in bins {
        let _ = writeln!(
            s,
            "run {}",
            vm::shell_join(&[b.label.clone(), b.exe.display().to_string()])
        );
    }
    s.push_str(extra);
    if reset {
        s.push_str(
            r#"left=$(for r in cm_id qp cq pd mr ctx srq; do rdma resource show $r 2>/dev/null | grep ' pid '; done)
if [ -n "$left" ]; then
    echo "$left" | sed 's/^/@@evchan-leftover /'
else
    echo "@@evchan-no-leftovers"
fi
rdma resource show
"#,
        );
    }
    s.push_str("exit $status\n");
    s
}

/// The shell lines that run each benchmark executable once, briefly (criterion's `--test`:
/// every benchmark one iteration), between markers, after the device tests.
fn bench_script(benches: &[(String, PathBuf)]) -> String {
    if benches.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "for d in /tmp /var/tmp /dev/shm /run; do\n\
         \x20   mkdir -p \"$d/evchan-criterion-test\" 2>/dev/null && : >\"$d/evchan-criterion-test/w\" 2>/dev/null &&\n\
         \x20       { export CRITERION_HOME=\"$d/evchan-criterion-test\"; break; }\n\
         done\n",
    );
    for (name, exe) in benches {
        let _ = writeln!(
            s,
            "echo '@@evchan-bench-begin {name}'\n\
             timeout 600 {} --test 2>&1\n\
             rc=$?\n\
             echo \"@@evchan-bench-end {name} $rc\"\n\
             [ $rc -eq 0 ] || status=1",
            vm::shell_join(&[exe.display().to_string()])
        );
    }
    s
}

/// Without a device: each device test must skip (its `skipping` line, `ok`), and must fail
/// under `EVCHAN_REQUIRE_DEVICE=1` — per test, not per binary. A check, not counted
/// as the tests themselves (they count where a device is).
fn native_device_checks(t: &mut Tally, bins: &[DeviceBin]) {
    let start = Instant::now();
    let script = device_script(bins, false, "");
    let mut wrong: Vec<(String, String)> = Vec::new();
    let mut skipped = 0;
    for require in [false, true] {
        let mut log = DeviceLog::default();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script]);
        if require {
            cmd.env("EVCHAN_REQUIRE_DEVICE", "1");
        } else {
            cmd.env_remove("EVCHAN_REQUIRE_DEVICE");
        }
        if let Err(e) = run_merged(cmd, &mut |l| log.add_line(l)) {
            wrong.push(("(the script)".into(), e));
        }
        for b in bins {
            for (test, v) in log.verdicts(&b.label, &b.tests, "the script ended") {
                let name = format!("{} {test}", b.label);
                match (require, v) {
                    (false, Verdict::Skipped(_)) => skipped += 1,
                    (true, Verdict::Failed(_)) => {}
                    (false, v) => {
                        wrong.push((name, format!("did not skip without a device: {v:?}")))
                    }
                    (true, v) => wrong.push((
                        name,
                        format!("did not fail under EVCHAN_REQUIRE_DEVICE=1: {v:?}"),
                    )),
                }
            }
        }
    }
    let total: usize = bins.iter().map(|b| b.tests.len()).sum();
    t.report.push(format!(
        "        device tests natively: {skipped} of {total} skipped (counted where a device is)"
    ));
    if !wrong.is_empty() {
        eprintln!(
            "xtask: device tests that break the skip rule:\n{}",
            name_list(&wrong, 40)
        );
        t.report.push(name_list(&wrong, 40).trim_end().to_owned());
    }
    t.gate(
        "each device test skips natively and fails under EVCHAN_REQUIRE_DEVICE=1",
        wrong.is_empty(),
        start.elapsed(),
    );
}

/// Runs every device test with EVCHAN_REQUIRE_DEVICE=1 in one VM boot (or natively), and
/// counts each one listed: a test that never reported fails by name, saying how its binary
/// ended (crashed, aborted, timed out, or the VM run ended first).
fn device_tests(t: &mut Tally, place: Place, bins: &[DeviceBin], benches: &[(String, PathBuf)]) {
    let start = Instant::now();
    let script = device_script(bins, place == Place::Vm, &bench_script(benches));
    let mut log = DeviceLog::default();
    let mut leftovers = Vec::new();
    let mut clean = false;
    let mut bench_ends: Vec<(String, i32, Duration)> = Vec::new();
    let mut bench_began = Instant::now();
    let mut on_line = |line: &str| {
        println!("{line}");
        if line.starts_with("@@evchan-bench-begin ") {
            bench_began = Instant::now();
        }
        if let Some((name, rc)) = line
            .strip_prefix("@@evchan-bench-end ")
            .and_then(|l| l.rsplit_once(' '))
        {
            let rc = rc.parse().unwrap_or(-1);
            bench_ends.push((name.to_owned(), rc, bench_began.elapsed()));
        }
        if let Some(l) = line.strip_prefix("@@evchan-leftover ") {
            leftovers.push(l.to_owned());
        }
        clean |= line == "@@evchan-no-leftovers";
        log.add_line(line);
    };
    let (name, end) = match place {
        Place::Vm => {
            let job = vm::Job {
                command: script,
                env: vec![("EVCHAN_REQUIRE_DEVICE".into(), "1".into())],
                timeout: Duration::from_secs(3600),
                ..vm::Job::default()
            };
            let end = match vm::run(&job, &mut on_line) {
                Ok(o) => {
                    if let Some(b) = o.boot {
                        t.report.push(format!(
                            "        (the VM booted to its job in {:.1} s)",
                            b.as_secs_f64()
                        ));
                    }
                    None
                }
                Err(e) => {
                    eprintln!("xtask: {e}");
                    Some(e)
                }
            };
            ("device tests in the soft-RoCE VM", end)
        }
        Place::Native => {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", &script]).env("EVCHAN_REQUIRE_DEVICE", "1");
            let end = run_merged(cmd, &mut on_line).err();
            ("device tests on this host's RDMA device", end)
        }
    };
    let mut verdicts = Vec::new();
    let mut lost_by_bin: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let end = end.unwrap_or_else(|| "no end marker".into());
    for b in bins {
        for (test, v) in log.verdicts(&b.label, &b.tests, &end) {
            let entry = lost_by_bin.entry(&b.label).or_default();
            entry.1 += 1;
            if matches!(&v, Verdict::Failed(w) if w.starts_with("never reported")) {
                entry.0 += 1;
            }
            verdicts.push((format!("{} {test}", b.label), v));
        }
    }
    let expected = verdicts.len() as u64;
    t.tests(name, &verdicts, expected, start.elapsed());
    // Each benchmark executable, run once briefly in the same boot: one check each.
    for (bench, _) in benches {
        let end = bench_ends.iter().find(|(n, _, _)| n == bench);
        let ok = end.is_some_and(|(_, rc, _)| *rc == 0);
        if end.is_none() {
            eprintln!("xtask: benchmark {bench} never reported its end");
        }
        t.gate(
            &format!(
                "benchmark {bench}, each figure once (criterion --test), with the device tests"
            ),
            ok,
            end.map_or(Duration::ZERO, |e| e.2),
        );
    }
    for (bin, (lost, of)) in lost_by_bin.into_iter().filter(|(_, (l, _))| *l > 0) {
        t.report.push(format!(
            "        {bin} lost {lost} of its {of} tests (named above)"
        ));
    }
    if place == Place::Vm {
        let start = Instant::now();
        if !leftovers.is_empty() {
            eprintln!("xtask: rdma resources left after the device tests:");
            for l in &leftovers {
                eprintln!("  {l}");
            }
        }
        t.gate(
            "after the device tests, `rdma resource show` lists no process's resources",
            clean && leftovers.is_empty(),
            start.elapsed(),
        );
    }
}

/// The runner's own promises: the job's exit status comes back, a hung guest is killed after
/// its timeout, a guest kernel panic is a failure — never a pass.
fn runner_faults(t: &mut Tally) {
    type Expect = fn(&Result<vm::Outcome>) -> bool;
    let cases: [(&str, &str, u64, Expect); 3] = [
        (
            "exit status 7 comes back",
            "exit 7",
            120,
            |r| matches!(r, Ok(o) if o.code == 7),
        ),
        (
            "a hung guest, after reaching its job, is killed at its timeout",
            "echo @@evchan-test-reached-job; sleep 100000",
            45,
            |r| matches!(r, Err(e) if e.contains("did not finish within 45 s")),
        ),
        (
            "a guest kernel panic fails the run",
            "echo c >/proc/sysrq-trigger; sleep 60",
            120,
            |r| matches!(r, Err(e) if e.contains("panicked")),
        ),
    ];
    for (name, command, secs, expect) in cases {
        let start = Instant::now();
        let job = vm::Job {
            command: command.into(),
            timeout: Duration::from_secs(secs),
            ..vm::Job::default()
        };
        let mut reached = false;
        let result = vm::run(&job, &mut |l| {
            reached |= l == "@@evchan-test-reached-job";
            println!("{l}");
        });
        // The hung guest must have hung in its job, not on the way there.
        let ok = expect(&result) && (reached || !command.contains("reached-job"));
        if !ok {
            eprintln!("xtask: runner check `{name}` got {result:?}");
        }
        t.gate(&format!("vm runner: {name}"), ok, start.elapsed());
    }
}

/// rping between two VMs on a virtual wire: server in VM a, client in VM b.
fn two_hosts(t: &mut Tally) {
    let start = Instant::now();
    let job = vm::Job {
        server: Some(r#"rping -s -a "$EVCHAN_SELF" -v -C 3"#.into()),
        command: r#"rping -c -a "$EVCHAN_PEER" -v -C 3"#.into(),
        timeout: Duration::from_secs(300),
        ..vm::Job::default()
    };
    let mut pings = 0;
    let mut out = |line: &str| {
        println!("{line}");
        if line.starts_with("[b] ping data: rdma-ping-") {
            pings += 1;
        }
    };
    let ok = match vm::run(&job, &mut out) {
        Ok(o) => o.code == 0,
        Err(e) => {
            eprintln!("xtask: {e}");
            false
        }
    };
    if ok && pings != 3 {
        eprintln!("xtask: the rping client saw {pings} pings, not 3");
    }
    t.gate(
        "two hosts: rping across two VMs",
        ok && pings == 3,
        start.elapsed(),
    );
}

/// `cargo xtask test --two-hosts`: only the two-VM steps (rping, then every
/// `tests/device_two_host*.rs` binary, pair by pair), counted as in the whole ladder.
fn two_hosts_only(args: &[String]) -> Result<i32> {
    if let Some(other) = args.iter().find(|a| *a != "--two-hosts") {
        return Err(format!("test --two-hosts: unknown option `{other}`"));
    }
    setup::ensure()?;
    let mut t = Tally::default();
    knobs(&mut t);
    let start = Instant::now();
    let bins = crate::cargo::executables(
        &["test", "--workspace", "--test", "device_two_host*"],
        "test",
        "device_two_host",
    )
    .map(|found| {
        found
            .into_iter()
            .map(|(name, exe, dir)| (format!("{dir}/{name}"), exe))
            .filter(|(label, _)| is_two_host(label))
            .collect::<Vec<_>>()
    });
    let listed = match bins.and_then(|b| list_device_tests(&b)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("xtask: {e}");
            t.gate("two-host test binaries build", false, start.elapsed());
            return Ok(finish(&t));
        }
    };
    two_hosts(&mut t);
    for b in &listed {
        evchan_two_hosts(&mut t, b);
    }
    Ok(finish(&t))
}

/// Whether a device binary runs across two VMs: `tests/device_two_host.rs` and
/// `tests/device_two_host_*.rs` of any package.
fn is_two_host(label: &str) -> bool {
    let target = label.rsplit('/').next().unwrap_or(label);
    target == "device_two_host" || target.starts_with("device_two_host_")
}

/// A two-host device binary: its tests come in pairs, `NAME_server` in VM a and `NAME_client`
/// in VM b, one two-VM boot per pair; each test counted by its own verdict (libtest's summary
/// in its VM). A test whose VM was killed on request (`evchan-vm-fault kill`) passed when it
/// had printed `@@evchan-victim TEST` before: it got as far as its part of the fault. A test
/// outside a pair fails.
fn evchan_two_hosts(t: &mut Tally, b: &DeviceBin) {
    let start = Instant::now();
    let exe = b.exe.display().to_string();
    let mut verdicts: Vec<(String, Verdict)> = Vec::new();
    let mut pairs: Vec<&str> = Vec::new();
    for test in &b.tests {
        let pair = test
            .strip_suffix("_server")
            .filter(|p| b.tests.contains(&format!("{p}_client")))
            .or_else(|| {
                test.strip_suffix("_client")
                    .filter(|p| b.tests.contains(&format!("{p}_server")))
            });
        match pair {
            Some(p) if !pairs.contains(&p) => pairs.push(p),
            Some(_) => {}
            None => verdicts.push((
                format!("{} {test}", b.label),
                Verdict::Failed("not half of a NAME_server / NAME_client pair".into()),
            )),
        }
    }
    for pair in pairs {
        let server = format!("{pair}_server");
        let client = format!("{pair}_client");
        let job = vm::Job {
            server: Some(format!(
                "EVCHAN_ROLE=server {exe} --exact {server} --nocapture --test-threads=1"
            )),
            command: format!(
                "env EVCHAN_ROLE=client {exe} --exact {client} --nocapture --test-threads=1"
            ),
            env: vec![("EVCHAN_REQUIRE_DEVICE".into(), "1".into())],
            timeout: Duration::from_secs(600),
            ..vm::Job::default()
        };
        // Each VM runs one test (`--exact`): its libtest summary line is that test's verdict
        // (with `--nocapture` the test's own output splits `test NAME ... ok` over lines).
        let mut results: BTreeMap<&'static str, bool> = BTreeMap::new();
        let mut ready: Vec<&'static str> = Vec::new();
        let mut out = |line: &str| {
            println!("{line}");
            for (role, test) in [("a", &server), ("b", &client)] {
                let Some(l) = line.strip_prefix(&format!("[{role}] ")) else {
                    continue;
                };
                if let Some(summary) = l.strip_prefix("test result: ") {
                    results.insert(role, summary.starts_with("ok. 1 passed; 0 failed"));
                }
                if l.contains(&format!("@@evchan-victim {test}")) {
                    ready.push(role);
                }
            }
        };
        let (ended, killed) = match vm::run(&job, &mut out) {
            Ok(o) => (format!("the two-host run exited {}", o.code), o.killed),
            Err(e) => {
                eprintln!("xtask: {e}");
                (e, Vec::new())
            }
        };
        for (role, test) in [("a", &server), ("b", &client)] {
            let v = match results.get(role) {
                Some(true) => Verdict::Passed,
                Some(false) => Verdict::Failed("failed".into()),
                None if killed.contains(&role) && ready.contains(&role) => Verdict::Passed,
                None if killed.contains(&role) => Verdict::Failed(format!(
                    "VM {role} was killed before the test printed @@evchan-victim {test}"
                )),
                None => Verdict::Failed(format!("never reported ({ended})")),
            };
            verdicts.push((format!("{} {test}", b.label), v));
        }
    }
    let expected = b.tests.len() as u64;
    t.tests(
        &format!("two hosts: {} across two VMs", b.label),
        &verdicts,
        expected,
        start.elapsed(),
    );
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
                ..vm::Job::default()
            };
            Ok(vm::run(&job, &mut |l| println!("{l}"))?.code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_script_runs_each_bench_once_between_markers() {
        assert_eq!(bench_script(&[]), "");
        let s = bench_script(&[
            ("cm_event".into(), PathBuf::from("/t/cm_event-1")),
            ("cq_event".into(), PathBuf::from("/t/cq_event-2")),
        ]);
        for name in ["cm_event", "cq_event"] {
            assert!(
                s.contains(&format!("echo '@@evchan-bench-begin {name}'")),
                "{s}"
            );
            assert!(s.contains(&format!("@@evchan-bench-end {name} $rc")), "{s}");
        }
        assert!(
            s.contains("/t/cm_event-1 --test") && s.contains("status=1"),
            "{s}"
        );
        let script = device_script(&[], true, &s);
        let (before, after) = script.split_once("@@evchan-bench-begin").unwrap();
        assert!(before.contains("CRITERION_HOME") && after.contains("@@evchan-no-leftovers"));
    }
}
