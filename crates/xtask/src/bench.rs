//! `cargo xtask bench`: the criterion benchmarks (`benches/`), on a device, as ratios.
//!
//! Builds the bench executables on the host (`cargo bench --no-run`, the bench profile), runs
//! them in the soft-RoCE VM (natively on a host with an ACTIVE RDMA port, unless `--vm`) with
//! options that keep a run short under TCG, reads each benchmark's estimate from criterion's
//! output and prints, per group, the safe layer's time against the raw-FFI baseline's of the
//! same run: under TCG only that ratio means anything.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cargo::{executables, run_lines};
use crate::test::{place, Place};
use crate::{target_dir, vm, Result};

/// Criterion options for every run: short under TCG, no plots, plain text.
const CRITERION_ARGS: &[&str] = &[
    "--bench",
    "--warm-up-time",
    "1",
    "--measurement-time",
    "3",
    "--nresamples",
    "10000",
    "--noplot",
    "--color",
    "never",
];

/// The baseline's name in every group (`<group>/raw`).
const BASELINE: &str = "raw";

/// `cargo xtask bench [--vm] [-- CRITERION_ARGS...]`
pub fn run(args: &[String]) -> Result<i32> {
    if args.iter().any(|a| a == "--tools") {
        return crate::bench_tools::run(args.iter().any(|a| a == "--quick")).map(|_| 0);
    }
    let started = Instant::now();
    let (ours, extra) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[][..]),
    };
    let place = place(ours, "bench")?;
    let benches: Vec<_> = executables(&["bench", "--workspace", "--benches"], "bench", "")?
        .into_iter()
        .map(|(name, exe, _)| (name, exe))
        .collect();
    if benches.is_empty() {
        return Err("no bench executables found (benches/*.rs)".into());
    }
    let mut criterion: Vec<String> = CRITERION_ARGS.iter().map(|s| (*s).to_owned()).collect();
    criterion.extend(extra.iter().cloned());

    let mut estimates = Estimates::default();
    let watch = Watch::start(usize::from(place == Place::Vm));
    let ran = match place {
        Place::Vm => in_vm(&benches, &criterion, &mut estimates),
        Place::Native => native(&benches, &criterion, &mut estimates),
    };
    let busy = watch.stop();
    let ok = ran?;

    let where_ = match place {
        Place::Vm => "in the soft-RoCE VM (TCG: only the ratios mean anything)",
        Place::Native => "on this host's RDMA device",
    };
    println!();
    println!("benchmarks {where_}:");
    let (table, complete) = estimates.table();
    print!("{table}");
    println!(
        "(cargo xtask bench took {:.0} s)",
        started.elapsed().as_secs_f64()
    );
    if busy > 0 {
        println!(
            "warning: for {busy} s of the run, other work (another VM, a compiler) shared this \
             host's CPUs: the two sides of a ratio may have run under different loads; rerun \
             on an idle host"
        );
    }
    if !ok {
        eprintln!("xtask: a benchmark failed (see above)");
    }
    if !complete {
        eprintln!("xtask: a group has no `{BASELINE}` baseline or no estimate was read");
    }
    Ok(i32::from(!(ok && complete)))
}

/// Every bench executable in one VM boot, with `EVCHAN_REQUIRE_DEVICE=1`.
fn in_vm(
    benches: &[(String, PathBuf)],
    criterion: &[String],
    estimates: &mut Estimates,
) -> Result<bool> {
    // The host's filesystem is read-only in the guest: criterion writes its data to a tmpfs
    // (`/tmp`, unless the checkout lives there).
    let mut script = String::from(
        "status=0\n\
         for d in /tmp /var/tmp /dev/shm /run; do\n\
         \x20   mkdir -p \"$d/evchan-criterion\" 2>/dev/null && : >\"$d/evchan-criterion/rc\" 2>/dev/null &&\n\
         \x20       { export CRITERION_HOME=\"$d/evchan-criterion\"; break; }\n\
         done\n\
         [ -n \"$CRITERION_HOME\" ] || { echo 'no writable directory for criterion'; exit 125; }\n",
    );
    for (name, exe) in benches {
        let mut argv = vec![exe.display().to_string()];
        argv.extend(criterion.iter().cloned());
        // Through `cat`: criterion sees no terminal and prints plain lines, no overwrites.
        let _ = writeln!(
            script,
            "echo '==> {name}'\n\
             ( timeout 900 {}; echo $? >\"$CRITERION_HOME/rc\" ) 2>&1 | cat\n\
             rc=$(cat \"$CRITERION_HOME/rc\")\n\
             [ \"$rc\" = 0 ] || {{ echo \"==> {name} exited with $rc\"; status=1; }}",
            vm::shell_join(&argv)
        );
    }
    script.push_str("exit $status\n");
    let job = vm::Job {
        command: script,
        env: vec![("EVCHAN_REQUIRE_DEVICE".into(), "1".into())],
        timeout: Duration::from_secs(1800),
        ..vm::Job::default()
    };
    let outcome = vm::run(&job, &mut |line| {
        println!("{line}");
        estimates.add_line(line);
    })?;
    Ok(outcome.code == 0)
}

/// Every bench executable on this host, one after the other, with `EVCHAN_REQUIRE_DEVICE=1`.
fn native(
    benches: &[(String, PathBuf)],
    criterion: &[String],
    estimates: &mut Estimates,
) -> Result<bool> {
    let mut ok = true;
    for (name, exe) in benches {
        println!("==> {name}");
        let mut cmd = Command::new(exe);
        cmd.args(criterion)
            .env("EVCHAN_REQUIRE_DEVICE", "1")
            .env("CRITERION_HOME", target_dir().join("criterion"));
        let ran = run_lines(&mut cmd, &mut |line| {
            println!("{line}");
            estimates.add_line(line);
        })?;
        if !ran {
            println!("==> {name} failed");
            ok = false;
        }
    }
    Ok(ok)
}

/// Watches the host while the benchmarks run, once a second: another VM or a compiler beside
/// them takes CPU time that TCG (or a native run) needs, at different times for the two sides of
/// a ratio. Counts the seconds in which any ran.
struct Watch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Watch {
    /// Starts watching; `own_vms` qemu processes are the run's own.
    fn start(own_vms: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut busy = 0;
            while !flag.load(Ordering::Acquire) {
                let (vms, compilers) = others();
                if vms > own_vms || compilers > 0 {
                    busy += 1;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            busy
        });
        Watch { stop, thread }
    }

    /// Stops watching; the seconds in which other work ran.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or(0)
    }
}

/// How many qemu system emulators and compilers (rustc) run on this host now (`/proc/*/comm`).
fn others() -> (usize, usize) {
    let (mut vms, mut compilers) = (0, 0);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        match comm.trim_end() {
            c if c.starts_with("qemu-system") => vms += 1,
            "rustc" => compilers += 1,
            _ => {}
        }
    }
    (vms, compilers)
}

/// Criterion's estimates, read from its report lines, in the order they came.
#[derive(Debug, Default)]
struct Estimates {
    /// (benchmark id, nanoseconds per iteration).
    found: Vec<(String, f64)>,
    /// The previous non-empty line: the id, when it was too long to share the `time:` line.
    previous: String,
}

impl Estimates {
    /// Adds one line of criterion's output, if it is a result line:
    /// `ID   time:   [LOW UNIT ESTIMATE UNIT HIGH UNIT]` (ID on the line before when long).
    fn add_line(&mut self, line: &str) {
        let line = line.trim_end();
        if let Some((before, after)) = line.split_once("time:") {
            let values = after
                .trim()
                .strip_prefix('[')
                .and_then(|v| v.strip_suffix(']'));
            let id = match before.trim() {
                "" => self.previous.trim(),
                id => id,
            };
            if let (Some(values), false) = (values, id.is_empty()) {
                let v: Vec<&str> = values.split_whitespace().collect();
                if let [_, _, value, unit, _, _] = v.as_slice() {
                    if let Some(ns) = nanos(value, unit) {
                        self.found.push((id.to_owned(), ns));
                    }
                }
            }
        }
        if !line.trim().is_empty() {
            self.previous = line.to_owned();
        }
    }

    /// The table of every group (`<group>/<variant>`) against its `raw` variant, and whether
    /// every group had both.
    fn table(&self) -> (String, bool) {
        let mut groups: Vec<&str> = Vec::new();
        for (id, _) in &self.found {
            let group = id.rsplit_once('/').map_or(id.as_str(), |(g, _)| g);
            if !groups.contains(&group) {
                groups.push(group);
            }
        }
        let get = |group: &str, variant: &str| {
            self.found
                .iter()
                .rev()
                .find(|(id, _)| {
                    id.strip_prefix(group).and_then(|r| r.strip_prefix('/')) == Some(variant)
                })
                .map(|(_, ns)| *ns)
        };
        let mut out = format!(
            "{:<36} {:>12} {:>12} {:>11}\n",
            "benchmark", "evchan", "raw", "evchan/raw"
        );
        let mut complete = !groups.is_empty();
        for group in groups {
            let raw = get(group, BASELINE);
            let mut variants: Vec<&str> = Vec::new();
            for (id, _) in &self.found {
                let variant = id.strip_prefix(group).and_then(|r| r.strip_prefix('/'));
                if let Some(v) = variant.filter(|v| *v != BASELINE && !variants.contains(v)) {
                    variants.push(v);
                }
            }
            if variants.is_empty() || raw.is_none() {
                complete = false;
            }
            for variant in variants {
                let ours = get(group, variant).unwrap_or(f64::NAN);
                let name = if variant == "evchan" {
                    group.to_owned()
                } else {
                    format!("{group} ({variant})")
                };
                let ratio = raw.map_or_else(|| "-".to_owned(), |r| format!("{:.2}", ours / r));
                let raw = raw.map_or_else(|| "-".to_owned(), time);
                let _ = writeln!(out, "{name:<36} {:>12} {raw:>12} {ratio:>11}", time(ours));
            }
        }
        (out, complete)
    }
}

/// `value` in criterion's `unit` (ps, ns, µs, ms, s) as nanoseconds.
fn nanos(value: &str, unit: &str) -> Option<f64> {
    let v: f64 = value.parse().ok()?;
    let scale = match unit {
        "ps" => 1e-3,
        "ns" => 1.0,
        "µs" | "μs" | "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return None,
    };
    Some(v * scale)
}

/// Nanoseconds, printed in a unit that suits them.
fn time(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.1} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_criterion_results_short_and_long_ids() {
        let mut e = Estimates::default();
        for line in [
            "Benchmarking cm_event/empty_read/raw: Analyzing",
            "cm_event/empty_read/raw",
            "                        time:   [1.0000 µs 1.2000 µs 1.4000 µs]",
            "Found 3 outliers among 100 measurements (3.00%)",
            "Benchmarking g/evchan: Analyzing",
            "g/evchan                time:   [2.9 µs 3.0 µs 3.1 µs]",
            "g/raw                   time:   [1.4 µs 1.5 µs 1.6 µs]",
            "                        change: [-1.0% +0.5% +2.0%] (p = 0.50 > 0.05)",
            "cm_event/empty_read/evchan",
            "                        time:   [900.00 ns 960.00 ns 1.0000 µs]",
            "h/evchan                time:   [1.0 ms 1.0 ms 1.0 ms]",
        ] {
            e.add_line(line);
        }
        assert_eq!(
            e.found,
            vec![
                ("cm_event/empty_read/raw".to_owned(), 1200.0),
                ("g/evchan".to_owned(), 3000.0),
                ("g/raw".to_owned(), 1500.0),
                ("cm_event/empty_read/evchan".to_owned(), 960.0),
                ("h/evchan".to_owned(), 1e6),
            ]
        );
        let (table, complete) = e.table();
        assert!(!complete, "h has no baseline");
        assert!(
            table.contains("cm_event/empty_read") && table.contains("0.80"),
            "{table}"
        );
        assert!(table.contains("g ") && table.contains("2.00"), "{table}");
    }

    #[test]
    fn units() {
        assert_eq!(nanos("1.5", "µs"), Some(1500.0));
        assert_eq!(nanos("2", "ms"), Some(2e6));
        assert_eq!(nanos("500", "ps"), Some(0.5));
        assert_eq!(nanos("x", "ns"), None);
        assert_eq!(time(1500.0), "1.50 µs");
        assert_eq!(time(12.25), "12.2 ns");
    }
}
