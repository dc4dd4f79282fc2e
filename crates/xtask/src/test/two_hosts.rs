//! The two-VM steps: rping across two VMs, `cargo xtask test --two-hosts`, and the
//! two-host device binaries, pair by pair.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{finish, knobs, list_device_tests, DeviceBin, Tally};
use crate::libtest::Verdict;
use crate::{setup, vm, Result};

/// rping between two VMs on a virtual wire: server in VM a, client in VM b.
pub(super) fn two_hosts(t: &mut Tally) {
    let start = Instant::now();
    let job = vm::Job {
        server: Some(r#"rping -s -a "$EVCHAN_SELF" -v -C 3"#.into()),
        command: r#"rping -c -a "$EVCHAN_PEER" -v -C 3"#.into(),
        timeout: Duration::from_secs(300),
        ..crate::job()
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
pub(super) fn two_hosts_only(args: &[String]) -> Result<i32> {
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
            .filter(|a| is_two_host(&a.label()))
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
pub(super) fn is_two_host(label: &str) -> bool {
    let target = label.rsplit('/').next().unwrap_or(label);
    target == "device_two_host" || target.starts_with("device_two_host_")
}

/// A two-host device binary: its tests come in pairs, `NAME_server` in VM a and `NAME_client`
/// in VM b, one two-VM boot per pair; each test counted by its own verdict (libtest's summary
/// in its VM). A test whose VM was killed on request (`evchan-vm-fault kill`) passed when it
/// had printed `@@evchan-victim TEST` before: it got as far as its part of the fault. A test
/// outside a pair fails.
pub(super) fn evchan_two_hosts(t: &mut Tally, b: &DeviceBin) {
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
            ..crate::job()
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
