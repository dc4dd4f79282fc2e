//! The native steps: `cargo test --workspace`, counted, and the check that every device test
//! skips without a device and fails under `EVCHAN_REQUIRE_DEVICE=1`.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use super::device::device_script;
use cargo_rxe::cargo::Artifact;

use super::{DeviceBin, Tally};
use crate::cargo::cargo;
use crate::libtest::{name_list, CargoTestLog, DeviceLog, Verdict};
use crate::Result;

/// `cargo test --workspace`, stdout and stderr read as one stream. The device binaries run
/// here too (and skip), but are not counted: their tests count where a device is.
pub(super) fn native_tests(t: &mut Tally, device_bins: &[Artifact]) {
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
                .any(|a| a.exe.ends_with(e) || PathBuf::from(e).ends_with(&a.exe))
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
pub(super) fn run_merged(mut cmd: Command, on_line: &mut dyn FnMut(&str)) -> Result<bool> {
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

/// Without a device: each device test must skip (its `skipping` line, `ok`), and must fail
/// under `EVCHAN_REQUIRE_DEVICE=1` — per test, not per binary. A check, not counted
/// as the tests themselves (they count where a device is).
pub(super) fn native_device_checks(t: &mut Tally, bins: &[DeviceBin]) {
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
