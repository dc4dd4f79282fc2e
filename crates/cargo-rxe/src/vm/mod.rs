//! The soft-RoCE VM runner: Debian's kernel under qemu (TCG), rdma_rxe, the host's filesystem.
//!
//! One VM: rxe0 on a dummy interface (169.254.77.1, fe80::ff:fe00:1). Two VMs: joined by a
//! qemu `stream` netdev over a unix socket, rxe0 on each eth0. The guest mounts the host's `/`
//! read-only through 9p and chroots into it, so binaries built on the host run unchanged; a
//! second, writable 9p share (a fresh directory under `runs/` of the per-user cache,
//! [`setup::cache_dir`]) carries the job scripts in and the exit status out. `/tmp`, `/run`,
//! `/var/tmp` and `/dev/shm` are fresh tmpfs mounts; what the job needs under them (its working
//! directory, [`Job::keep`]) is bound back in.
//!
//! Fault hooks (`fault.rs`): a guest writes a request into the share (the `rxe-fault`
//! helper does it) and the runner, which watches the share while it reads the consoles, cuts or
//! restores the wire through qemu's QMP socket, or stops, continues or kills a VM's qemu. A VM
//! killed that way is expected to end without an exit status; the others' statuses decide.
//!
//! This module holds the CLI, the job and the run itself (booting, streaming the consoles,
//! carrying out fault requests); `guest.rs` builds what each guest is made of.

mod fault;
mod guest;

use std::collections::VecDeque;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::setup;
use crate::Result;

pub use guest::passed_env;
use guest::{fresh_share, initramfs, qemu, write_share};

const BEGIN: &str = "@@evchan-vm-begin";
const END: &str = "@@evchan-vm-end";
const ERROR: &str = "@@evchan-vm-error";
/// How long a guest may take from qemu's start to the job's start.
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);
const CONSOLE_TAIL: usize = 60;
/// With two hosts: how long the server may run on after the client's job ended.
const SERVER_GRACE: Duration = Duration::from_secs(30);
/// How often the runner looks for fault requests in the share.
const FAULT_POLL: Duration = Duration::from_millis(50);

/// How qemu runs the guest's CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Accel {
    /// qemu's emulator: slow, and works everywhere (KVM guests hang at kernel start on some
    /// hosts, ours among them).
    #[default]
    Tcg,
    /// `/dev/kvm`, with the host's CPU model.
    Kvm,
}

impl std::str::FromStr for Accel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tcg" => Ok(Self::Tcg),
            "kvm" => Ok(Self::Kvm),
            other => Err(format!("--accel takes tcg or kvm, not `{other}`")),
        }
    }
}

/// What to run, where.
#[derive(Debug, Clone, Default)]
pub struct Job {
    /// The command of the single VM, or the client's (VM b) with two hosts: a shell line.
    pub command: String,
    /// With two hosts: the server's shell line (VM a).
    pub server: Option<String>,
    /// Variables for the job, on top of the caller's EVCHAN_* and RUST_* ones.
    pub env: Vec<(String, String)>,
    /// Paths that must stay visible in the guest when they lie under `/tmp`, `/run`, `/var/tmp`
    /// or `/dev/shm` (which are fresh tmpfs mounts there): the binaries, a target directory. The
    /// working directory is kept by itself.
    pub keep: Vec<std::path::PathBuf>,
    pub timeout: Duration,
    pub accel: Accel,
    pub verbose: bool,
}

/// How a run ended.
#[derive(Debug)]
#[must_use]
pub struct Outcome {
    /// The job's exit status (with two hosts: the client's, or the server's when only it failed).
    pub code: i32,
    /// From qemu's start to the job's start, of the slowest VM.
    pub boot: Option<Duration>,
    /// The VMs killed on a guest's request (`rxe-fault kill`), in order.
    pub killed: Vec<&'static str>,
}

/// `cargo rxe run [--hosts 2] [--server CMD] [--env K=V] [--timeout S] [--accel A] [-v] -- CMD...`
/// (also `cargo xtask vm`): runs CMD and returns its exit status.
pub fn cli(args: &[String]) -> Result<i32> {
    let Some(Options {
        mut job,
        own,
        after: command,
    }) = options(args, Duration::from_secs(1200), &["--hosts", "--server"])?
    else {
        return Ok(0);
    };
    let mut hosts = 1;
    for (flag, value) in own {
        match (flag.as_str(), value) {
            ("--hosts", Some(n)) => {
                hosts = match n.as_str() {
                    "1" => 1,
                    "2" => 2,
                    n => return Err(format!("--hosts takes 1 or 2, not {n}")),
                }
            }
            ("--server", Some(cmd)) => job.server = Some(cmd),
            ("-v" | "--verbose", None) => job.verbose = true,
            (other, _) => {
                return Err(format!(
                    "unknown run option `{other}` (the command goes after `--`)"
                ))
            }
        }
    }
    if command.is_empty() {
        return Err("no command: cargo rxe run [OPTIONS] -- CMD [ARGS...]".into());
    }
    if hosts == 2 && job.server.is_none() {
        return Err("--hosts 2 needs --server 'SERVER COMMAND' (CMD runs as the client)".into());
    }
    if hosts == 1 && job.server.is_some() {
        return Err("--server only makes sense with --hosts 2".into());
    }
    // A program or file named by an absolute path under /tmp stays visible in the guest.
    job.keep = command
        .iter()
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute() && p.exists())
        .collect();
    job.command = shell_join(&command);
    let outcome = run(&job, &mut |line| println!("{line}"))?;
    for vm in &outcome.killed {
        eprintln!("cargo-rxe: VM {vm} was killed on request; the other VM's status decides");
    }
    Ok(outcome.code)
}

/// A command line of `run` or `test`, read by [`options`].
#[derive(Debug)]
pub struct Options {
    /// `--env`, `--timeout`, `--accel` and `--console` applied.
    pub job: Job,
    /// The other arguments before `--`, in order, each with its value when it is one of the
    /// caller's options that take one.
    pub own: Vec<(String, Option<String>)>,
    /// The arguments after `--`.
    pub after: Vec<String>,
}

/// Reads the options `run` and `test` share; `None` after printing the help for `-h`.
pub fn options(args: &[String], timeout: Duration, with_value: &[&str]) -> Result<Option<Options>> {
    let mut o = Options {
        job: Job {
            timeout,
            ..Job::default()
        },
        own: Vec::new(),
        after: Vec::new(),
    };
    // `--opt=value` is `--opt value`, for the options read here.
    let mut split: Vec<String> = Vec::new();
    let mut rest = args.iter();
    for a in rest.by_ref() {
        if a == "--" {
            split.push(a.clone());
            break;
        }
        match a.split_once('=') {
            Some((opt, v))
                if ["--env", "--timeout", "--accel"].contains(&opt)
                    || with_value.contains(&opt) =>
            {
                split.extend([opt.to_owned(), v.to_owned()]);
            }
            _ => split.push(a.clone()),
        }
    }
    split.extend(rest.cloned());
    let mut it = split.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "--" => {
                o.after = it.by_ref().cloned().collect();
                break;
            }
            "--env" => o.job.env.push(env_pair(&value("--env")?)?),
            "--timeout" => o.job.timeout = seconds(&value("--timeout")?)?,
            "--accel" => o.job.accel = value("--accel")?.parse()?,
            "--console" => o.job.verbose = true,
            "-h" | "--help" => {
                print!("{}", crate::cli::USAGE);
                return Ok(None);
            }
            own if with_value.contains(&own) => {
                let v = value(own)?;
                o.own.push((own.to_owned(), Some(v)));
            }
            own => o.own.push((own.to_owned(), None)),
        }
    }
    Ok(Some(o))
}

/// `K=V` of `--env`.
pub fn env_pair(kv: &str) -> Result<(String, String)> {
    let (k, v) = kv
        .split_once('=')
        .ok_or_else(|| format!("--env takes K=V, not `{kv}`"))?;
    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(format!("--env: `{k}` is not a variable name"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// The longest `--timeout`: 30 days.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

/// Whole seconds of `--timeout`, at most [`MAX_TIMEOUT`].
pub fn seconds(s: &str) -> Result<Duration> {
    s.parse()
        .ok()
        .map(Duration::from_secs)
        .filter(|d| *d <= MAX_TIMEOUT)
        .ok_or_else(|| {
            format!(
                "--timeout takes whole seconds up to {}, not `{s}`",
                MAX_TIMEOUT.as_secs()
            )
        })
}

/// Quotes argv into one POSIX shell line.
pub fn shell_join(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+%@".contains(&b))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Boots the VM(s), runs the job, streams its output through `out` line by line.
pub fn run(job: &Job, out: &mut dyn FnMut(&str)) -> Result<Outcome> {
    let kernel = setup::ensure()?;
    let initrd = initramfs(&kernel)?;
    // The lock on the share's `owner` file lives as long as this run.
    let owned = fresh_share()?;
    let share = owned.dir.clone();
    // The share's path goes on the kernel's command line and into qemu's options.
    if share
        .to_str()
        .is_none_or(|s| s.contains([' ', ',', '\t', '\n']))
    {
        return Err(format!(
            "the run directory {} has a space, comma or other character that qemu's options \
             and the kernel's command line cannot carry: set XDG_CACHE_HOME to a plain path",
            share.display()
        ));
    }
    write_share(&share, job)?;

    let roles: &[&str] = if job.server.is_some() {
        &["a", "b"]
    } else {
        &["single"]
    };
    let wire = share.join("wire.sock");
    let mut vms = Vec::new();
    let (tx, rx) = mpsc::channel::<(usize, Option<String>)>();
    let started = Instant::now();
    for (i, role) in roles.iter().enumerate() {
        let mut cmd = qemu(&kernel, &initrd, &share, role, job.accel);
        match *role {
            "a" => {
                let _ = fs::remove_file(&wire);
                cmd.args([
                    "-netdev",
                    &format!(
                        "stream,id=n0,server=on,addr.type=unix,addr.path={}",
                        wire.display()
                    ),
                ]);
            }
            "b" => {
                wait_for_socket(&wire, &mut vms)?;
                cmd.args([
                    "-netdev",
                    &format!(
                        "stream,id=n0,server=off,addr.type=unix,addr.path={}",
                        wire.display()
                    ),
                ]);
            }
            _ => {}
        }
        if *role != "single" {
            cmd.args(["-device", "virtio-net-pci,netdev=n0"]);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start qemu-system-x86_64: {e} (run `cargo rxe setup`)"))?;
        let stdout = child.stdout.take().expect("piped");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).split(b'\n') {
                let Ok(line) = line else { break };
                let text = String::from_utf8_lossy(&line)
                    .trim_end_matches('\r')
                    .to_owned();
                if tx.send((i, Some(text))).is_err() {
                    return;
                }
            }
            let _ = tx.send((i, None));
        });
        vms.push(Vm {
            role,
            pid: child.id(),
            killed: false,
            child,
            console: VecDeque::new(),
            began: None,
            ended: false,
            eof: false,
            error: None,
            panicked: false,
        });
    }
    drop(tx);

    let prefix = roles.len() > 1;
    let deadline = started + job.timeout;
    let mut timed_out = None;
    // Two hosts: once the client's job ended, the server gets SERVER_GRACE to end too.
    let mut server_grace: Option<Instant> = None;
    let mut server_stuck = false;
    while vms.iter().any(|v| !v.eof) {
        let now = Instant::now();
        let boot_deadline = started + BOOT_TIMEOUT;
        let mut next = if vms.iter().all(|v| v.began.is_some() || v.killed) {
            deadline
        } else {
            deadline.min(boot_deadline)
        };
        if let Some(g) = server_grace {
            next = next.min(g);
        }
        let wait = next.saturating_duration_since(now);
        for (tag, line) in fault::pending(&share) {
            let result = carry_out(&line, roles, &share, &mut vms);
            match &result {
                Ok(()) => eprintln!("cargo-rxe: fault `{line}`: done"),
                Err(e) => eprintln!("cargo-rxe: fault `{line}`: {e}"),
            }
            fault::answer(&share, &tag, &result);
        }
        match rx.recv_timeout(wait.min(FAULT_POLL)) {
            Ok((i, Some(line))) => {
                let vm = &mut vms[i];
                vm.remember(&line);
                if line.contains("Kernel panic") {
                    vm.panicked = true;
                }
                if let Some(msg) = line.strip_prefix(ERROR) {
                    vm.error = Some(msg.trim().to_owned());
                } else if line == BEGIN {
                    vm.began = Some(started.elapsed());
                } else if line == END {
                    vm.ended = true;
                    if vm.role == "b" {
                        server_grace = Some(Instant::now() + SERVER_GRACE);
                    }
                } else if vm.began.is_some() && !vm.ended {
                    if prefix {
                        out(&format!("[{}] {line}", vm.role));
                    } else {
                        out(&line);
                    }
                } else if job.verbose {
                    eprintln!("[{} console] {line}", vm.role);
                }
            }
            Ok((i, None)) => {
                vms[i].eof = true;
                let _ = vms[i].child.wait();
            }
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < next => {}
            Err(mpsc::RecvTimeoutError::Timeout)
                if server_grace.is_some_and(|g| Instant::now() >= g) =>
            {
                server_stuck = true;
                break;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let booting = vms.iter().any(|v| v.began.is_none() && !v.killed);
                timed_out = Some(if Instant::now() >= deadline && !booting {
                    format!("the job did not finish within {} s", job.timeout.as_secs())
                } else if Instant::now() >= deadline {
                    format!(
                        "a guest did not reach its job within the job's {} s",
                        job.timeout.as_secs()
                    )
                } else if booting {
                    format!(
                        "a guest did not reach its job within {} s of boot",
                        BOOT_TIMEOUT.as_secs()
                    )
                } else {
                    "timed out".to_owned()
                });
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    for vm in &mut vms {
        let _ = vm.child.kill();
        let _ = vm.child.wait();
    }

    let killed: Vec<&'static str> = vms.iter().filter(|v| v.killed).map(|v| v.role).collect();
    let boot = vms
        .iter()
        .filter(|v| !v.killed)
        .map(|v| v.began)
        .collect::<Option<Vec<_>>>()
        .and_then(|b| b.into_iter().max());
    if let Some(b) = boot {
        eprintln!("cargo-rxe: booted to the job in {:.1} s", b.as_secs_f64());
    }
    let mut problems = Vec::new();
    if let Some(why) = &timed_out {
        problems.push(why.clone());
    }
    let mut codes = Vec::new();
    if server_stuck {
        let client = fs::read_to_string(share.join("rc.b"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        eprintln!(
            "cargo-rxe: the server (VM a) was still running {} s after the client's job ended; stopped it",
            SERVER_GRACE.as_secs()
        );
        match client {
            // The client's failure is the news; the server waited for a client that gave up.
            Some(c) if c != 0 => {
                let _ = fs::remove_dir_all(&share);
                return Ok(Outcome {
                    code: c,
                    boot,
                    killed,
                });
            }
            _ => problems.push(format!(
                "the server (VM a) did not end within {} s of the client",
                SERVER_GRACE.as_secs()
            )),
        }
    }
    for vm in vms.iter().filter(|v| !v.killed) {
        let rc = fs::read_to_string(share.join(format!("rc.{}", vm.role)))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if vm.panicked {
            problems.push(format!("the guest kernel of VM {} panicked", vm.role));
        } else if let Some(e) = &vm.error {
            problems.push(format!("VM {}: {e}", vm.role));
        } else if rc.is_none() && timed_out.is_none() && !server_stuck {
            problems.push(format!("VM {} stopped without an exit status", vm.role));
        }
        codes.push(rc);
    }
    if !problems.is_empty() {
        for vm in &vms {
            eprintln!(
                "---- last {} console lines of VM {} ----",
                vm.console.len(),
                vm.role
            );
            for l in &vm.console {
                eprintln!("{l}");
            }
        }
        let _ = fs::remove_dir_all(&share);
        return Err(format!("VM run failed: {}", problems.join("; ")));
    }
    let _ = fs::remove_dir_all(&share);
    // Two hosts: the client's status decides, unless only the server failed.
    let code = match codes.as_slice() {
        [Some(c)] => *c,
        [Some(a), Some(b)] => {
            if *b != 0 {
                *b
            } else {
                if *a != 0 {
                    eprintln!("cargo-rxe: the server (VM a) exited with {a}");
                }
                *a
            }
        }
        _ => 1,
    };
    Ok(Outcome { code, boot, killed })
}

/// Carries out one fault request of a guest.
fn carry_out(line: &str, roles: &[&'static str], share: &Path, vms: &mut [Vm]) -> Result<()> {
    match fault::parse(line, roles)? {
        fault::Fault::Link { up, vms: which } => {
            for role in which {
                fault::set_link(&fault::qmp_path(share, role), up)
                    .map_err(|e| format!("VM {role}: {e}"))?;
            }
            Ok(())
        }
        fault::Fault::Signal { sig, vm } => {
            let v = vms
                .iter_mut()
                .find(|v| v.role == vm)
                .ok_or_else(|| format!("no VM {vm}"))?;
            if v.killed || v.eof {
                return Err(format!("VM {vm} has ended already"));
            }
            fault::signal(v.pid, sig)?;
            if sig == fault::Signal::Kill {
                v.killed = true;
            }
            Ok(())
        }
    }
}

struct Vm {
    role: &'static str,
    /// qemu's (`setpriv` execs it).
    pid: u32,
    /// Killed on a guest's request: its missing exit status is expected.
    killed: bool,
    child: Child,
    console: VecDeque<String>,
    began: Option<Duration>,
    ended: bool,
    eof: bool,
    error: Option<String>,
    panicked: bool,
}

impl Vm {
    fn remember(&mut self, line: &str) {
        if self.console.len() == CONSOLE_TAIL {
            self.console.pop_front();
        }
        self.console.push_back(line.to_owned());
    }
}

/// Waits until VM a's qemu has created the wire's socket (VM b connects to it).
fn wait_for_socket(sock: &Path, vms: &mut [Vm]) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        if let Some(vm) = vms.first_mut() {
            if let Ok(Some(status)) = vm.child.try_wait() {
                return Err(format!("qemu of VM a exited early ({status})"));
            }
        }
        if Instant::now() > until {
            return Err(format!("qemu of VM a never created {}", sock.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::shell_join;

    #[test]
    fn shell_join_quotes_only_what_needs_it() {
        let args = [
            "rping",
            "-a",
            "fe80::ff:fe00:1%dummy0",
            "it's",
            "",
            "a b",
            "$HOME",
        ];
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(
            shell_join(&args),
            r#"rping -a fe80::ff:fe00:1%dummy0 'it'\''s' '' 'a b' '$HOME'"#
        );
    }
}
