//! `cargo xtask test`: the whole ladder, ending in one `N passed, N failed` line.
//! `cargo xtask demo`: the smoke program through the layers, on a device.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::cargo::{cargo, run_counting, test_executables, Counts};
use crate::{host_has_active_rdma_port, setup, vm, Result};

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

/// The running tally: tests counted one by one, gates (fmt, clippy, …) as one check each.
#[derive(Default)]
struct Tally {
    passed: u64,
    failed: u64,
    report: Vec<String>,
}

impl Tally {
    fn gate(&mut self, name: &str, ok: bool, took: Duration) {
        if ok {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
        let verdict = if ok { "ok" } else { "FAILED" };
        self.report.push(format!(
            "{verdict:>6}  {name} ({:.0} s)",
            took.as_secs_f64()
        ));
        eprintln!("==> {name}: {verdict}");
    }

    /// Adds a run of test binaries: their counted tests, and one failure for a run that failed
    /// without a failing test to show for it (a build error, a crash, a timeout).
    fn tests(&mut self, name: &str, ok: bool, c: Counts, took: Duration) {
        self.passed += c.passed;
        self.failed += c.failed;
        let extra = u64::from(!ok && c.failed == 0);
        self.failed += extra;
        let verdict = if ok { "ok" } else { "FAILED" };
        let mut line = format!(
            "{verdict:>6}  {name}: {} passed, {} failed in {} runs ({:.0} s)",
            c.passed,
            c.failed,
            c.runs,
            took.as_secs_f64()
        );
        if extra > 0 {
            line.push_str(" — failed without a failing test (see above)");
        }
        self.report.push(line);
        eprintln!("==> {name}: {verdict}");
    }
}

pub fn run(args: &[String]) -> Result<i32> {
    let place = place(args, "test")?;
    let mut t = Tally::default();

    let start = Instant::now();
    if let Err(e) = setup::ensure() {
        // Nothing below can run without the packages: say so, and count it.
        t.gate("setup", false, start.elapsed());
        eprintln!("xtask: {e}");
        return Ok(finish(&t));
    }
    t.gate("setup (packages, VM kernel)", true, start.elapsed());

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

    // Native: unit, doc and compile-fail tests; device tests skip here with a message.
    let start = Instant::now();
    match run_counting(
        cargo(&["test", "--workspace", "--no-fail-fast"]).env_remove("EVCHAN_REQUIRE_DEVICE"),
    ) {
        Ok((ok, c)) => t.tests(
            "native tests (cargo test --workspace)",
            ok,
            c,
            start.elapsed(),
        ),
        Err(e) => {
            eprintln!("xtask: {e}");
            t.gate("native tests", false, start.elapsed());
        }
    }

    let start = Instant::now();
    let device_bins = match test_executables("device_") {
        Ok(bins) if !bins.is_empty() => bins,
        Ok(_) => {
            eprintln!("xtask: no device test binaries (tests/device_*.rs) found");
            t.gate("device test binaries", false, start.elapsed());
            return Ok(finish(&t));
        }
        Err(e) => {
            eprintln!("xtask: {e}");
            t.gate("device test binaries", false, start.elapsed());
            return Ok(finish(&t));
        }
    };

    if place == Place::Vm && !host_has_active_rdma_port() {
        // Without a device, EVCHAN_REQUIRE_DEVICE=1 must turn every device test into a failure.
        let start = Instant::now();
        let all_fail = device_bins.iter().all(|(name, exe)| {
            let st = std::process::Command::new(exe)
                .arg("--quiet")
                .env("EVCHAN_REQUIRE_DEVICE", "1")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
            let failed = st.is_ok_and(|s| !s.success());
            if !failed {
                eprintln!("xtask: {name} passed without a device under EVCHAN_REQUIRE_DEVICE=1");
            }
            failed
        });
        t.gate(
            "device tests fail (not skip) without a device under EVCHAN_REQUIRE_DEVICE=1",
            all_fail,
            start.elapsed(),
        );
    }

    device_tests(&mut t, place, &device_bins);
    two_hosts(&mut t);
    runner_faults(&mut t);

    Ok(finish(&t))
}

fn gate(t: &mut Tally, name: &str, args: &[&str]) {
    let start = Instant::now();
    let ok = cargo(args).status().is_ok_and(|s| s.success());
    t.gate(name, ok, start.elapsed());
}

/// Runs every device test binary with EVCHAN_REQUIRE_DEVICE=1, in one VM boot (or natively).
fn device_tests(t: &mut Tally, place: Place, bins: &[(String, PathBuf)]) {
    let start = Instant::now();
    let mut script = String::from("status=0\n");
    for (name, exe) in bins {
        let _ = writeln!(
            script,
            "echo '==> {name}'\ntimeout 900 {} --test-threads=1 || {{ echo \"==> {name} exited with $?\"; status=1; }}",
            vm::shell_join(&[exe.display().to_string()])
        );
    }
    script.push_str("exit $status\n");
    let mut counts = Counts::default();
    let name = match place {
        Place::Vm => "device tests in the soft-RoCE VM",
        Place::Native => "device tests on this host's RDMA device",
    };
    let ok = match place {
        Place::Vm => {
            let job = vm::Job {
                command: script,
                env: vec![("EVCHAN_REQUIRE_DEVICE".into(), "1".into())],
                timeout: Duration::from_secs(1800),
                ..vm::Job::default()
            };
            let mut out = |line: &str| {
                println!("{line}");
                counts.add_line(line);
            };
            match vm::run(&job, &mut out) {
                Ok(o) => {
                    if let Some(b) = o.boot {
                        t.report.push(format!(
                            "        (the VM booted to its job in {:.1} s)",
                            b.as_secs_f64()
                        ));
                    }
                    o.code == 0
                }
                Err(e) => {
                    eprintln!("xtask: {e}");
                    false
                }
            }
        }
        Place::Native => {
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", &script]).env("EVCHAN_REQUIRE_DEVICE", "1");
            match run_counting(&mut cmd) {
                Ok((ok, c)) => {
                    counts = c;
                    ok
                }
                Err(e) => {
                    eprintln!("xtask: {e}");
                    false
                }
            }
        }
    };
    t.tests(name, ok, counts, start.elapsed());
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
            "a hung guest is killed at its timeout",
            "sleep 100000",
            20,
            |r| matches!(r, Err(e) if e.contains("did not finish within 20 s")),
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
        let result = vm::run(&job, &mut |l| println!("{l}"));
        let ok = expect(&result);
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

fn finish(t: &Tally) -> i32 {
    println!();
    println!("summary:");
    for line in &t.report {
        println!("{line}");
    }
    println!("{} passed, {} failed", t.passed, t.failed);
    i32::from(t.failed > 0)
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
