//! Every example program rejects a bad command line with its usage and exit status 2, before
//! it looks for an RDMA device (so this runs natively, without one) and without a panic.
//!
//! The programs are this package's examples, which Cargo does not expose to integration tests
//! as `CARGO_BIN_EXE_*`: they are found next to the test's own executable, in
//! `target/<profile>/examples/`. A plain `cargo test` builds them first (Cargo builds the
//! examples to check that they compile); `cargo test --test bad_args` alone does not, so run
//! `cargo build --examples` before it. A missing or stale program fails the test, saying so.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// An address nothing needs to listen on: every case is rejected before it is used.
const A: &str = "127.0.0.1:7490";

/// The cases: (program, arguments), each a bad command line.
const CASES: &[(&str, &[&str])] = &[
    ("demo", &["not-an-ip"]),
    ("demo", &["--help"]),
    ("demo", &["127.0.0.1", "extra"]),
    ("tools_remote", &[]),
    ("tools_remote", &["--bogus", "x"]),
    ("tools_remote", &["--serve"]),
    ("tools_remote", &["--connect", A, "--mode", "nope"]),
    ("tools_remote", &["--connect", A, "--size", "0"]),
    ("tools_remote", &["--connect", A, "--window", "0"]),
    ("remote_write", &["--bogus"]),
    ("remote_write", &["--addr"]),
    ("remote_write", &["--addr", "not-an-address"]),
    ("rping", &[]),
    ("rping", &["--bogus"]),
    ("rping", &["-c", "-C"]),
    ("rping", &["-c", "-S", "10"]),
    ("rping", &["-c", "-S", "65536"]),
    ("rping", &["-s", "-p", "x"]),
    ("rping", &["-c", "-a", "not-an-ip"]),
    ("events", &["not-an-address"]),
    ("events", &["127.0.0.1:0"]),
    ("events", &["127.0.0.1", "extra"]),
    ("echo_client", &["--bogus"]),
    ("echo_client", &["--connections"]),
    ("echo_client", &["--connections", "0"]),
    ("echo_client", &["--connections", "65536"]),
    ("echo_client", &["--messages", "0"]),
    ("echo_client", &["--messages", "-1"]),
    ("echo_client", &["--size", "0"]),
    ("echo_client", &["--size", "x"]),
    ("echo_client", &["--size", "4294967296"]),
    ("echo_client", &["--addr", "127.0.0.1:0"]),
    ("echo_client", &["--busy-poll-us", "soon"]),
    ("echo_server", &["--bogus"]),
    ("echo_server", &["--busy-poll-us"]),
    ("echo_server", &["--exit-after", "0"]),
    ("echo_server", &["--max-message", "0"]),
    ("echo_server", &["--max-message", "4294967296"]),
    ("echo_server", &["--addr", "nonsense"]),
    ("tools_cm", &[]),
    ("tools_cm", &["--layer"]),
    ("tools_cm", &["--layer", "bogus"]),
    ("tools_cm", &["--layer", "raw", "--bogus", "1"]),
    ("tools_cm", &["--layer", "raw", "--connections", "0"]),
    ("tools_cm", &["--layer", "raw", "--connections", "x"]),
    ("tools_cm", &["--layer", "raw", "--addr", "[::1]:7471"]),
    ("tools_cm", &["--layer", "raw", "--addr", "127.0.0.1:0"]),
    ("tools_events", &[]),
    ("tools_events", &["--channels"]),
    ("tools_events", &["--channels", "0"]),
    ("tools_events", &["--channels", "x"]),
    ("tools_events", &["--channels", "1025"]),
    ("tools_events", &["--channels", "1", "--bogus", "1"]),
    ("tools_events", &["--channels", "1", "--connections", "0"]),
    ("tools_events", &["--channels", "1", "--in-flight", "0"]),
    ("tools_events", &["--channels", "1", "--layer", "bogus"]),
    ("tools_events", &["--channels", "1", "--rounds", "4"]),
    (
        "tools_events",
        &["--channels", "1", "--layer", "spin", "--rounds", "0"],
    ),
    (
        "tools_events",
        &[
            "--channels",
            "1",
            "--layer",
            "spin",
            "--rounds",
            "18446744073709551615",
        ],
    ),
    (
        "tools_events",
        &["--channels", "1", "--layer", "spin", "--in-flight", "4"],
    ),
    (
        "tools_events",
        &["--channels", "2", "--layer", "drain", "--connections", "1"],
    ),
    (
        "tools_events",
        &[
            "--channels",
            "2",
            "--layer",
            "core",
            "--addr",
            "127.0.0.1:65534",
        ],
    ),
    (
        "tools_events",
        &["--channels", "1", "--addr", "127.0.0.1:0"],
    ),
    ("tools_pingpong", &[]),
    ("tools_pingpong", &["--bogus", "1"]),
    ("tools_pingpong", &["--serve", A, "--connect", A]),
    ("tools_pingpong", &["--connect", "127.0.0.1:0"]),
    ("tools_pingpong", &["--connect", A, "--iters"]),
    ("tools_pingpong", &["--connect", A, "--iters", "0"]),
    ("tools_pingpong", &["--connect", A, "--size", "0"]),
    ("tools_pingpong", &["--connect", A, "--size", "4294967296"]),
    ("tools_pingpong", &["--connect", A, "--warmup", "x"]),
    ("tools_pingpong", &["--connect", A, "--layer", "bogus"]),
    ("tools_pingpong", &["--connect", A, "--tokio"]),
    (
        "tools_pingpong",
        &["--connect", A, "--layer", "core", "--multi-thread"],
    ),
    ("tools_stream", &[]),
    ("tools_stream", &["--bogus", "1"]),
    ("tools_scale", &[]),
    ("tools_scale", &["--bogus", "1"]),
    ("tools_scale", &["--serve", A, "--connect", A]),
    ("tools_scale", &["--connect", A]),
    ("tools_scale", &["--connect", A, "--connections", "0"]),
    (
        "tools_scale",
        &["--connect", A, "--connections", "2", "--ask", "quit"],
    ),
    ("tools_scale", &["--connect", A, "--ask", "reboot"]),
    (
        "tools_scale",
        &[
            "--connect",
            A,
            "--connections",
            "2",
            "--memory-budget-mib",
            "1",
        ],
    ),
    ("tools_scale", &["--serve", A, "--connections", "2"]),
    ("tools_scale", &["--serve", A, "--memory-budget-mib", "0"]),
    ("tools_scale", &["--serve", A, "--settle-ms", "x"]),
    ("http2", &["--bogus", "1"]),
    ("http2", &["--requests"]),
    ("http2", &["--requests", "0"]),
    ("http2", &["--concurrent", "x"]),
    ("http2", &["--addr", "127.0.0.1:0"]),
    ("tools_stream", &["--serve", A, "--connect", A]),
    ("tools_stream", &["--connect", A, "--workers"]),
    ("tools_stream", &["--connect", A, "--workers", "0"]),
    ("tools_stream", &["--connect", A, "--count", "0"]),
    ("tools_stream", &["--connect", A, "--count", "x"]),
    ("tools_stream", &["--connect", A, "--size", "0"]),
    ("tools_stream", &["--connect", A, "--size", "4294967296"]),
    ("tools_stream", &["--connect", A, "--conns", "0"]),
    ("tools_stream", &["--connect", A, "--depth", "0"]),
    ("tools_stream", &["--connect", A, "--depth", "8193"]),
    ("tools_stream", &["--connect", A, "--busy-poll-us", "0"]),
    (
        "tools_stream",
        &[
            "--connect",
            A,
            "--count",
            "18446744073709551615",
            "--conns",
            "2",
        ],
    ),
];

/// How long a case may run: a rejection is at once; a program that accepted the command line
/// might wait for a peer (with a device) and is killed.
const PATIENCE: Duration = Duration::from_secs(20);

/// `target/<profile>/examples/`: the test runs from `target/<profile>/deps/`.
fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test runs from target/<profile>/deps/")
        .join("examples")
}

/// The built program `name`; fails the test if it is missing, or older than one of its
/// sources under `examples/` (as its dep-info file lists them).
fn program(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let built = std::fs::metadata(&path).and_then(|m| m.modified());
    let Ok(built) = built else {
        panic!(
            "{} is missing: build the examples first (`cargo build --examples`; a plain \
             `cargo test` builds them too)",
            path.display()
        );
    };
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let dep_info = std::fs::read_to_string(dir.join(format!("{name}.d"))).unwrap_or_default();
    let stale = dep_info
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(_, deps)| deps))
        .flat_map(str::split_whitespace)
        .map(Path::new)
        .filter(|p| p.starts_with(&sources))
        .find(|p| modified(p) > built);
    if let Some(source) = stale {
        panic!(
            "{} is older than {}: rebuild the examples (`cargo build --examples`)",
            path.display(),
            source.display()
        );
    }
    path
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Runs `program` with `args`: its exit code (`None` if a signal ended it, or it was killed
/// after [`PATIENCE`]) and its stderr.
fn run(program: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(program)
        .args(args)
        .env_remove("EVCHAN_REQUIRE_DEVICE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not start: {e}", program.display()));
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    });
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the program's status") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = reader.join().expect("the stderr reader");
    (status.and_then(|s| s.code()), stderr)
}

#[test]
fn every_program_rejects_bad_arguments_with_its_usage() {
    let dir = examples_dir();
    let mut failures = Vec::new();
    for &(name, args) in CASES {
        let (code, stderr) = run(&program(&dir, name), args);
        let what = format!("{name} {}", args.join(" "));
        if code != Some(2) {
            failures.push(format!(
                "`{what}`: exit status {code:?}, not 2; stderr:\n{stderr}"
            ));
        } else if !stderr.to_lowercase().contains("usage") {
            failures.push(format!("`{what}`: no usage on stderr:\n{stderr}"));
        } else if stderr.contains("panicked") {
            failures.push(format!("`{what}`: a panic:\n{stderr}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

/// The programs that [`CASES`] covers are all of `examples/`'s programs.
#[test]
fn the_cases_cover_every_program() {
    let mut programs: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples"))
            .expect("examples/")
            .map(|e| e.expect("an entry").path())
            .filter_map(|p| {
                // `examples/x.rs` and `examples/x/main.rs` are programs; `x/mod.rs` a module.
                let stem = p.file_stem()?.to_str()?.to_owned();
                let program = if p.is_dir() {
                    p.join("main.rs").exists()
                } else {
                    p.extension().is_some_and(|e| e == "rs")
                };
                program.then_some(stem)
            })
            .collect();
    programs.sort();
    let mut covered: Vec<String> = CASES.iter().map(|(n, _)| (*n).to_owned()).collect();
    covered.sort();
    covered.dedup();
    assert_eq!(covered, programs, "every example program has cases");
}
