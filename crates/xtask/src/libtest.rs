//! Reading what test binaries say: libtest's output of `cargo test`, the tests a binary lists
//! (`--list`), and the per-test protocol of the device-test runner (see `test.rs`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Marker the device-test script prints before each test: `@@evchan-test-begin BIN TEST`.
pub const BEGIN: &str = "@@evchan-test-begin ";
/// Marker the device-test script prints after each test: `@@evchan-test-end BIN TEST RC`.
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

/// The numbers of a `test result: ok. 1 passed; 0 failed; 2 ignored; …` line.
fn result_numbers(line: &str) -> Option<(u64, u64, u64)> {
    let rest = &line[line.find("test result: ")? + "test result: ".len()..];
    let number_before = |word: &str| {
        rest.split(';')
            .find_map(|part| {
                part.trim()
                    .strip_suffix(word)?
                    .trim()
                    .rsplit(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    Some((
        number_before(" passed"),
        number_before(" failed"),
        number_before(" ignored"),
    ))
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
    /// The verdicts of its tests; tests announced but never reported come last, as failures.
    pub fn verdicts(&self) -> Vec<(String, Verdict)> {
        let mut out: Vec<(String, Verdict)> = self
            .results
            .iter()
            .map(|(name, result)| {
                let v = if result == "ok" {
                    match self.skips.get(name) {
                        Some(reason) => Verdict::Skipped(reason.clone()),
                        None => Verdict::Passed,
                    }
                } else if result.starts_with("ignored") {
                    Verdict::Skipped(format!("#[ignore] ({result})"))
                } else {
                    Verdict::Failed(result.clone())
                };
                (name.clone(), v)
            })
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
        let Some(sec) = self.sections.last_mut() else {
            return;
        };
        if let Some((test, reason)) = skip_line(t) {
            sec.skips.insert(test.to_owned(), reason.to_owned());
        }
        if let Some(n) = t
            .strip_prefix("running ")
            .and_then(|r| r.strip_suffix(" tests").or_else(|| r.strip_suffix(" test")))
            .and_then(|n| n.parse().ok())
        {
            sec.announced = Some(n);
        } else if t.contains("test result: ") {
            sec.finished = true;
            self.pending = None;
        } else if let Some(rest) = t.strip_prefix("test ") {
            if let Some((name, result)) = rest.split_once(" ... ") {
                let word = result.split_whitespace().next().unwrap_or("");
                if matches!(word, "ok" | "FAILED" | "ignored" | "ignored,") {
                    sec.results
                        .push((name.to_owned(), result.trim().to_owned()));
                    self.pending = None;
                } else {
                    self.pending = Some(name.to_owned());
                }
            } else if let Some(name) = rest.strip_suffix(" ...") {
                self.pending = Some(name.to_owned());
            }
        } else if let Some(name) = self.pending.clone() {
            if matches!(t, "ok" | "FAILED") || t.starts_with("ignored") {
                sec.results.push((name, t.to_owned()));
                self.pending = None;
            }
        }
    }

    fn start(&mut self, s: Section) {
        self.pending = None;
        self.sections.push(s);
    }
}

/// Reads the device-test script's output: the begin/end markers around each test, its skip
/// line and libtest's result line in between.
#[derive(Debug, Default)]
pub struct DeviceLog {
    /// `(binary, test)` → verdict, for every test that ended.
    pub ended: BTreeMap<(String, String), Verdict>,
    current: Option<Current>,
}

#[derive(Debug)]
struct Current {
    bin: String,
    test: String,
    skip: Option<String>,
    /// (passed, failed, ignored) of libtest's result line.
    result: Option<(u64, u64, u64)>,
}

impl DeviceLog {
    pub fn add_line(&mut self, line: &str) {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix(BEGIN) {
            if let Some((bin, test)) = rest.split_once(' ') {
                self.current = Some(Current {
                    bin: bin.to_owned(),
                    test: test.to_owned(),
                    skip: None,
                    result: None,
                });
            }
            return;
        }
        if let Some(rest) = t.strip_prefix(END) {
            let Some(cur) = self.current.take() else {
                return;
            };
            let rc = rest.rsplit(' ').next().and_then(|c| c.parse::<i32>().ok());
            let v = verdict(rc, cur.skip, cur.result);
            self.ended.insert((cur.bin, cur.test), v);
            return;
        }
        let Some(cur) = self.current.as_mut() else {
            return;
        };
        if let Some((test, reason)) = skip_line(t) {
            if test == cur.test {
                cur.skip = Some(reason.to_owned());
            }
        }
        if let Some(n) = result_numbers(t) {
            cur.result = Some(n);
        }
    }
}

/// One test run alone (`--exact NAME`): its exit status, skip line and result line.
fn verdict(rc: Option<i32>, skip: Option<String>, result: Option<(u64, u64, u64)>) -> Verdict {
    match rc {
        Some(0) => match (skip, result) {
            (Some(reason), Some((1, 0, 0))) => Verdict::Skipped(reason),
            (None, Some((1, 0, 0))) => Verdict::Passed,
            (_, Some((0, 0, 1))) => Verdict::Skipped("#[ignore]".into()),
            (_, r) => Verdict::Failed(format!(
                "exit status 0, but libtest reported {}",
                match r {
                    Some((p, f, i)) => format!("{p} passed, {f} failed, {i} ignored"),
                    None => "no result".into(),
                }
            )),
        },
        Some(124) => Verdict::Failed("timed out (killed by `timeout`)".into()),
        Some(c) if c > 128 => Verdict::Failed(format!("killed by signal {}", c - 128)),
        Some(c) => Verdict::Failed(format!("exit status {c}")),
        None => Verdict::Failed("no exit status".into()),
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
    fn device_protocol_per_test() {
        let mut log = DeviceLog::default();
        for l in [
            "@@evchan-test-begin device_cm a",
            "running 1 test",
            "test a ... skipping a: EVCHAN_REQUIRE_DEVICE unset",
            "ok",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out",
            "@@evchan-test-end device_cm a 0",
            "@@evchan-test-begin device_cm b",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out",
            "@@evchan-test-end device_cm b 0",
            "@@evchan-test-begin device_cm c",
            "@@evchan-test-end device_cm c 134",
            "@@evchan-test-begin device_cm d",
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 10 filtered out",
            "@@evchan-test-end device_cm d 0",
            "@@evchan-test-begin device_cm e",
        ] {
            log.add_line(l);
        }
        let get = |t: &str| {
            log.ended
                .get(&("device_cm".to_owned(), t.to_owned()))
                .cloned()
        };
        assert_eq!(
            get("a"),
            Some(Verdict::Skipped("EVCHAN_REQUIRE_DEVICE unset".into()))
        );
        assert_eq!(get("b"), Some(Verdict::Passed));
        assert_eq!(get("c"), Some(Verdict::Failed("killed by signal 6".into())));
        assert!(matches!(get("d"), Some(Verdict::Failed(_))));
        assert_eq!(get("e"), None, "never ended: lost");
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
