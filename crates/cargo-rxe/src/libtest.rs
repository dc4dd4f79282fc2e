//! Reading what test binaries say: libtest's output of `cargo test`, the tests a binary lists
//! (`--list`), and the per-test protocol of the device-test runner (see `test/device.rs`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Marker the device-test script prints before each binary: `@@evchan-test-begin BIN`.
pub const BEGIN: &str = "@@evchan-test-begin ";
/// Marker the device-test script prints after each binary: `@@evchan-test-end BIN RC`.
pub const END: &str = "@@evchan-test-end ";

/// How one test ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    Failed(String),
    /// Skipped with a reason: a `skipping <test>: <reason>` line, or `#[ignore]`.
    Skipped(String),
}

/// The tally of some tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
}

impl Tally {
    pub fn add(&mut self, v: &Verdict) {
        match v {
            Verdict::Passed => self.passed += 1,
            Verdict::Failed(_) => self.failed += 1,
            Verdict::Skipped(_) => self.skipped += 1,
        }
    }

    pub fn total(&self) -> u64 {
        self.passed + self.failed + self.skipped
    }
}

/// A `skipping <test>: <reason>` line (anywhere in `line`: with `--nocapture` it may follow
/// libtest's `test <name> ... ` on the same line): `(test, reason)`.
pub fn skip_line(line: &str) -> Option<(&str, &str)> {
    let at = line.find("skipping ")?;
    let rest = &line[at + "skipping ".len()..];
    let (test, reason) = rest.split_once(": ")?;
    (!test.is_empty() && !test.contains(' ')).then_some((test, reason.trim()))
}

/// The tests a test binary lists with `--list`: lines `NAME: test`.
pub fn listed(list_output: &str) -> Vec<String> {
    list_output
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

/// One test binary (or doc-test run) in the output of `cargo test`.
#[derive(Debug, Default)]
pub struct Section {
    /// `device_cm`, `evchan_core` (unit tests), `doc-tests evchan_core`.
    pub name: String,
    /// The executable, from cargo's `Running … (PATH)` line.
    pub exe: Option<String>,
    /// libtest's `running N tests`.
    pub announced: Option<u64>,
    /// `test NAME ... RESULT` lines, in order.
    pub results: Vec<(String, String)>,
    /// `skipping NAME: reason` lines.
    pub skips: BTreeMap<String, String>,
    /// Whether its `test result:` line came.
    pub finished: bool,
}

impl Section {
    /// One line of libtest's output (trimmed); `pending` is a `test NAME ... ` whose result is
    /// still to come on a later line (with `--nocapture`, the test's output comes between).
    pub fn add_line(&mut self, t: &str, pending: &mut Option<String>) {
        if let Some((test, reason)) = skip_line(t) {
            self.skips.insert(test.to_owned(), reason.to_owned());
        }
        if let Some(n) = t
            .strip_prefix("running ")
            .and_then(|r| r.strip_suffix(" tests").or_else(|| r.strip_suffix(" test")))
            .and_then(|n| n.parse().ok())
        {
            self.announced = Some(n);
        } else if t.starts_with("test result: ") {
            // Only at a line's start, where libtest puts it (after a newline of its own): a
            // child process's output shown with a prefix is not this binary's summary.
            self.finished = true;
            *pending = None;
        } else if let Some(rest) = t.strip_prefix("test ") {
            if let Some((name, result)) = rest.split_once(" ... ") {
                // `#[should_panic]` tests are reported as `NAME - should panic`.
                let name = name.strip_suffix(" - should panic").unwrap_or(name);
                let word = result.split_whitespace().next().unwrap_or("");
                if matches!(word, "ok" | "FAILED" | "ignored" | "ignored,") {
                    self.results
                        .push((name.to_owned(), result.trim().to_owned()));
                    *pending = None;
                } else {
                    *pending = Some(name.to_owned());
                }
            } else if let Some(name) = rest.strip_suffix(" ...") {
                *pending = Some(name.to_owned());
            }
        } else if let Some(name) = pending.clone() {
            if matches!(t, "ok" | "FAILED") || t.starts_with("ignored") {
                self.results.push((name, t.to_owned()));
                *pending = None;
            }
        }
    }

    /// The verdict of test `name` by its result line and skip line, if it reported.
    pub fn verdict_of(&self, name: &str) -> Option<Verdict> {
        let (_, result) = self.results.iter().find(|(n, _)| n == name)?;
        Some(if result == "ok" {
            match self.skips.get(name) {
                Some(reason) => Verdict::Skipped(reason.clone()),
                None => Verdict::Passed,
            }
        } else if result.starts_with("ignored") {
            Verdict::Skipped(format!("#[ignore] ({result})"))
        } else {
            Verdict::Failed(result.clone())
        })
    }

    /// The verdicts of its tests; tests announced but never reported come last, as failures.
    pub fn verdicts(&self) -> Vec<(String, Verdict)> {
        let mut out: Vec<(String, Verdict)> = self
            .results
            .iter()
            .filter_map(|(name, _)| Some((name.clone(), self.verdict_of(name)?)))
            .collect();
        let lost = self.announced.unwrap_or(0).saturating_sub(out.len() as u64);
        for i in 0..lost {
            out.push((
                format!("<unreported test {}>", i + 1),
                Verdict::Failed(format!(
                    "{} of {} tests never reported (the binary crashed, aborted or hung)",
                    lost,
                    self.announced.unwrap_or(0)
                )),
            ));
        }
        out
    }
}

/// Reads `cargo test`'s merged stdout and stderr line by line into sections.
#[derive(Debug, Default)]
pub struct CargoTestLog {
    pub sections: Vec<Section>,
    /// A `test NAME ... ` whose result is still to come (on a later line, `--nocapture`).
    pending: Option<String>,
}

impl CargoTestLog {
    pub fn add_line(&mut self, line: &str) {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("Running ") {
            // `Running tests/device_cm.rs (target/debug/deps/device_cm-0123abcd)`
            let exe = rest
                .rsplit_once(" (")
                .map(|(_, p)| p.trim_end_matches(')').to_owned());
            let name = exe
                .as_deref()
                .and_then(|p| p.rsplit('/').next())
                .map(|f| f.rsplit_once('-').map_or(f, |(n, _)| n).to_owned())
                .unwrap_or_else(|| rest.to_owned());
            self.start(Section {
                name,
                exe,
                ..Section::default()
            });
            return;
        }
        if let Some(krate) = t.strip_prefix("Doc-tests ") {
            self.start(Section {
                name: format!("doc-tests {krate}"),
                ..Section::default()
            });
            return;
        }
        if let Some(sec) = self.sections.last_mut() {
            sec.add_line(t, &mut self.pending);
        }
    }

    fn start(&mut self, s: Section) {
        self.pending = None;
        self.sections.push(s);
    }
}

/// Reads the device-test script's output: each binary between its begin and end markers,
/// libtest's lines in between.
#[derive(Debug, Default)]
pub struct DeviceLog {
    /// Binary label → what it reported, and its exit status.
    pub ended: BTreeMap<String, (Section, i32)>,
    /// Binaries that began but never ended (the run ended first).
    pub unended: BTreeMap<String, Section>,
    current: Option<(String, Section)>,
    pending: Option<String>,
}

impl DeviceLog {
    pub fn add_line(&mut self, line: &str) {
        let plain = without_ansi(line);
        let t = plain.trim();
        if let Some(bin) = t.strip_prefix(BEGIN) {
            self.pending = None;
            if let Some((bin, sec)) = self.current.take() {
                self.unended.insert(bin, sec);
            }
            self.current = Some((bin.to_owned(), Section::default()));
            return;
        }
        if let Some(rest) = t.strip_prefix(END) {
            let rc = rest.rsplit(' ').next().and_then(|c| c.parse::<i32>().ok());
            if let Some((bin, sec)) = self.current.take() {
                self.ended.insert(bin, (sec, rc.unwrap_or(-1)));
            }
            return;
        }
        if let Some((_, sec)) = self.current.as_mut() {
            sec.add_line(t, &mut self.pending);
        }
    }

    /// The verdict of each listed test of `bin`; a test that never reported fails, saying how
    /// its binary ended (`end` when the whole run ended first).
    pub fn verdicts(&mut self, bin: &str, listed: &[String], end: &str) -> Vec<(String, Verdict)> {
        if let Some((bin, sec)) = self.current.take() {
            self.unended.insert(bin, sec);
        }
        let (sec, how) = match (self.ended.get(bin), self.unended.get(bin)) {
            (Some((sec, rc)), _) => (Some(sec), describe_exit(*rc)),
            (None, Some(sec)) => (Some(sec), format!("it never ended: {end}")),
            (None, None) => (None, format!("it never started: {end}")),
        };
        listed
            .iter()
            .map(|name| {
                let v = sec.and_then(|s| s.verdict_of(name)).unwrap_or_else(|| {
                    Verdict::Failed(format!("never reported: its binary {how}"))
                });
                (name.clone(), v)
            })
            .collect()
    }
}

/// `line` without ANSI escape sequences (`ESC [ … letter`): libtest colours its verdicts when its
/// output is a terminal, as the VM's console is.
pub fn without_ansi(line: &str) -> std::borrow::Cow<'_, str> {
    if !line.contains('\x1b') {
        return line.into();
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        }
    }
    out.into()
}

/// How a binary ended, from the exit status the script saw.
fn describe_exit(rc: i32) -> String {
    match rc {
        0 => "exited 0 without reporting it".into(),
        124 => "timed out (killed by `timeout`)".into(),
        c if c > 128 => format!("was killed by signal {} (crash or abort)", c - 128),
        c => format!("exited with {c}"),
    }
}

/// `name (reason)` lines for a report, at most `max` of them, then a count of the rest.
pub fn name_list(items: &[(String, String)], max: usize) -> String {
    let mut s = String::new();
    for (name, why) in items.iter().take(max) {
        let _ = writeln!(s, "          {name}: {why}");
    }
    if items.len() > max {
        let _ = writeln!(s, "          … and {} more", items.len() - max);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_test_sections_count_skips_and_lost_tests() {
        let mut log = CargoTestLog::default();
        for l in [
            "     Running unittests src/lib.rs (target/debug/deps/evchan_core-0123)",
            "running 3 tests",
            "test a ... ok",
            "test b ... ignored, needs a device",
            "skipping c: no RDMA device",
            "test c ... ok",
            "test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out",
            "     Running tests/device_cm.rs (target/debug/deps/device_cm-4567)",
            "running 4 tests",
            "test x ... skipping x: no device",
            "ok",
            "test y ... FAILED",
            "   Doc-tests evchan_core",
            "running 1 test",
            "test src/lib.rs - f (line 3) ... ok",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
        ] {
            log.add_line(l);
        }
        let names: Vec<_> = log.sections.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["evchan_core", "device_cm", "doc-tests evchan_core"]);
        let mut t = Tally::default();
        for (_, v) in log.sections[0].verdicts() {
            t.add(&v);
        }
        assert_eq!((t.passed, t.failed, t.skipped), (1, 0, 2));
        let dev = log.sections[1].verdicts();
        assert_eq!(dev.len(), 4, "{dev:?}");
        assert_eq!(dev[0].1, Verdict::Skipped("no device".into()));
        assert!(matches!(dev[1].1, Verdict::Failed(_)));
        assert!(matches!(&dev[3].1, Verdict::Failed(w) if w.contains("2 of 4")));
        assert!(!log.sections[1].finished);
        assert_eq!(
            log.sections[2].verdicts(),
            [("src/lib.rs - f (line 3)".to_owned(), Verdict::Passed)]
        );
    }

    #[test]
    fn device_protocol_per_binary() {
        let mut log = DeviceLog::default();
        for l in [
            "@@evchan-test-begin core/device_cm",
            "running 3 tests",
            "test a ... skipping a: no device",
            "ok",
            "test b ... some output of b",
            "more output",
            "ok",
            "test c ... FAILED",
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
            "@@evchan-test-end core/device_cm 101",
            "@@evchan-test-begin core/device_crash",
            "running 2 tests",
            "test x ... ok",
            "test y ... ",
            "@@evchan-test-end core/device_crash 134",
            "@@evchan-test-begin core/device_hang",
            "running 1 test",
        ] {
            log.add_line(l);
        }
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let v = log.verdicts("core/device_cm", &names(&["a", "b", "c"]), "");
        assert_eq!(v[0].1, Verdict::Skipped("no device".into()));
        assert_eq!(v[1].1, Verdict::Passed);
        assert!(matches!(v[2].1, Verdict::Failed(_)));
        let v = log.verdicts("core/device_crash", &names(&["x", "y"]), "");
        assert_eq!(v[0].1, Verdict::Passed);
        assert!(
            matches!(&v[1].1, Verdict::Failed(w) if w.contains("signal 6")),
            "{v:?}"
        );
        let v = log.verdicts("core/device_hang", &names(&["h"]), "the job timed out");
        assert!(
            matches!(&v[0].1, Verdict::Failed(w) if w.contains("never ended: the job timed out"))
        );
        let v = log.verdicts("core/device_never", &names(&["n"]), "VM died");
        assert!(matches!(&v[0].1, Verdict::Failed(w) if w.contains("never started")));
    }

    #[test]
    fn colours_and_should_panic_are_no_part_of_a_verdict() {
        assert_eq!(without_ansi("test a ... \x1b[32mok\x1b[m"), "test a ... ok");
        assert_eq!(without_ansi("plain"), "plain");
        let mut log = DeviceLog::default();
        for l in [
            "@@evchan-test-begin p/x",
            "test a ... \x1b[32mok\x1b[m",
            "test b ... \x1b[31mFAILED\x1b[m",
            "test c - should panic ... ok",
            "test d ... [child] ",
            "[child] test result: ok. 1 passed; 0 failed",
            "ok",
            "@@evchan-test-end p/x 101",
        ] {
            log.add_line(l);
        }
        let names = ["a", "b", "c", "d"].map(str::to_owned);
        let v = log.verdicts("p/x", &names, "");
        assert_eq!(v[0].1, Verdict::Passed);
        assert!(matches!(v[1].1, Verdict::Failed(_)));
        assert_eq!(
            v[2].1,
            Verdict::Passed,
            "a should_panic test by its own name"
        );
        assert_eq!(
            v[3].1,
            Verdict::Passed,
            "a child's summary line does not end the binary's"
        );
    }

    #[test]
    fn lists_and_skip_lines() {
        let out = "a::b: test\nc: test\nbench_x: benchmark\n\n2 tests, 1 benchmark\n";
        assert_eq!(listed(out), ["a::b", "c"]);
        assert_eq!(
            skip_line("skipping t: no device: ENODEV"),
            Some(("t", "no device: ENODEV"))
        );
        assert_eq!(skip_line("nothing here"), None);
    }
}
