//! The device tests where a device is (the VM, or this host's ACTIVE port): the guest's
//! script, the run of every device binary and benchmark executable, counted, and the VM
//! runner's own promises.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::native::run_merged;
use cargo_rxe::suite;

use super::{DeviceBin, Place, Tally};
use crate::libtest::{DeviceLog, Verdict};
use crate::{vm, Result};

/// The shell script that runs every device test binary, one test at a time, between markers
/// (cargo-rxe's [`suite::script`]). In the VM (`reset`), after each binary it puts back what a
/// test may have changed for the others (rxe0 deleted, dummy0 down), saying so, so that no
/// binary depends on the order of the binaries; at the end it lists what `rdma resource show`
/// still has of any process.
pub(super) fn device_script(bins: &[DeviceBin], reset: bool, extra: &str) -> String {
    let tail = if reset {
        format!("{extra}{LEFTOVERS}")
    } else {
        extra.to_owned()
    };
    suite::script(
        bins,
        &suite::Script {
            prelude: if reset { ENSURE_RDMA } else { "" },
            after_each: if reset {
                "    ensure_rdma \"$1\"\n"
            } else {
                ""
            },
            tail: &tail,
            args: &["--nocapture".to_owned(), "--test-threads=1".to_owned()],
            timeout: Duration::from_secs(1800),
        },
    )
}

/// `ensure_rdma LABEL`: rxe0 on dummy0 with its addresses, usable, again.
const ENSURE_RDMA: &str = r#"ensure_rdma() {
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
"#;

/// What `rdma resource show` still has of any process, between markers.
const LEFTOVERS: &str = r#"left=$(for r in cm_id qp cq pd mr ctx srq; do rdma resource show $r 2>/dev/null | grep ' pid '; done)
if [ -n "$left" ]; then
    echo "$left" | sed 's/^/@@evchan-leftover /'
else
    echo "@@evchan-no-leftovers"
fi
rdma resource show
"#;

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

/// Runs every device test with EVCHAN_REQUIRE_DEVICE=1 in one VM boot (or natively), and
/// counts each one listed: a test that never reported fails by name, saying how its binary
/// ended (crashed, aborted, timed out, or the VM run ended first).
pub(super) fn device_tests(
    t: &mut Tally,
    place: Place,
    bins: &[DeviceBin],
    benches: &[(String, PathBuf)],
) {
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
                ..crate::job()
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
pub(super) fn runner_faults(t: &mut Tally) {
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
            ..crate::job()
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
