//! rdma-core's own programs (`cmtime`, `ucmatose`, `udaddy`, …) as subprocesses, for interop
//! tests: found on `PATH` (inside the VM, the host's binaries), never left running, never waited
//! for without a deadline.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `Err(reason)` naming the Debian package when `name` is not on `PATH`.
/// Waits for `child` at most `deadline`; past it, sends SIGKILL and panics. It does not wait
/// after the kill: a process blocked in the kernel (`rdma link delete` waiting for the device's
/// users) takes SIGKILL only once it returns there.
pub fn wait_for(child: &mut Child, deadline: Duration, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            panic!("{what} did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The variable that tells a test binary's child process which test it runs as the child.
const CHILD_ENV: &str = "EVCHAN_TEST_CHILD";

/// Whether this process is the child that [`run_in_child`] started for `test`.
pub fn is_child(test: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|v| v == test)
}

/// Runs `test` of this same test binary in a child process (within `deadline`), asserting that
/// it passed; in the child, [`is_child`] says so. For device work whose resources librdmacm
/// keeps until the process exits.
pub fn run_in_child(test: &str, deadline: Duration) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, test)
        .spawn()
        .unwrap();
    let status = wait_for(&mut child, deadline, "the child process");
    assert!(status.success(), "the child process failed: {status}");
}

pub fn find(name: &str, package: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "rdma-core's `{name}` is not on PATH: install the Debian package `{package}` \
                 (`apt-get install {package}`, or `cargo xtask setup`)"
            )
        })
}

/// The path of tool `$name` from Debian package `$package`; without it the calling test is
/// skipped, or fails when `EVCHAN_REQUIRE_DEVICE=1`.
#[macro_export]
macro_rules! require_tool {
    ($name:expr, $package:expr) => {
        match $crate::support::tool::find($name, $package) {
            Ok(path) => path,
            Err(reason) => {
                let test = std::thread::current()
                    .name()
                    .unwrap_or("<unnamed test>")
                    .to_owned();
                if $crate::support::device_required() {
                    panic!("{test}: EVCHAN_REQUIRE_DEVICE=1 but {reason}");
                }
                eprintln!("skipping {test}: {reason}");
                return;
            }
        }
    };
}

/// What a finished tool left.
#[derive(Debug)]
pub struct Output {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}\n--- stdout\n{}--- stderr\n{}---",
            self.status, self.stdout, self.stderr
        )
    }
}

/// A running tool; killed (and reaped) on drop if still running.
pub struct Tool {
    name: String,
    child: Option<Child>,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
    started: Instant,
}

fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    })
}

impl Tool {
    /// Starts `path` with `args`, stdin closed, stdout and stderr captured.
    pub fn spawn(path: &PathBuf, args: &[&str]) -> Tool {
        let name = format!("{} {}", path.display(), args.join(" "));
        eprintln!("spawning: {name}");
        let mut child = Command::new(path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning `{name}`: {e}"));
        let out = drain(child.stdout.take().unwrap());
        let err = drain(child.stderr.take().unwrap());
        Tool {
            name,
            child: Some(child),
            out: Some(out),
            err: Some(err),
            started: Instant::now(),
        }
    }

    /// The exit status, if it has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().unwrap().try_wait().unwrap()
    }

    /// Panics (after killing the tool and printing its output) if it has already exited:
    /// for a server that must still be serving.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.try_status() {
            let out = self.collect(status);
            panic!("`{}` ended early: {out}", self.name);
        }
    }

    fn collect(&mut self, status: ExitStatus) -> Output {
        self.child = None;
        Output {
            status,
            stdout: self.out.take().unwrap().join().unwrap_or_default(),
            stderr: self.err.take().unwrap().join().unwrap_or_default(),
        }
    }

    /// Waits for the tool to exit, at most `deadline` from its start; past it the tool is
    /// killed and the test fails with its output.
    pub fn wait(mut self, deadline: Duration) -> Output {
        loop {
            if let Some(status) = self.try_status() {
                return self.collect(status);
            }
            if self.started.elapsed() > deadline {
                let out = self.kill_now();
                panic!(
                    "`{}` did not exit within {deadline:?}; killed: {out}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills a tool that is still running (a server that never exits on its own) and returns
    /// its output; fails if it had already exited.
    pub fn kill(mut self) -> Output {
        self.assert_running();
        self.kill_now()
    }

    fn kill_now(&mut self) -> Output {
        let child = self.child.as_mut().unwrap();
        let _ = child.kill();
        let status = child.wait().unwrap();
        self.collect(status)
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
