//! The soft-RoCE VM runner: Debian's kernel under qemu (TCG), rdma_rxe, the host's filesystem.
//!
//! One VM: rxe0 on a dummy interface (169.254.77.1, fe80::ff:fe00:1). Two VMs: joined by a
//! qemu `stream` netdev over a unix socket, rxe0 on each eth0. The guest mounts the host's `/`
//! read-only through 9p and chroots into it, so binaries built on the host run unchanged; a
//! second, writable 9p share (a fresh directory under `target/evchan-vm/runs/`) carries the job
//! scripts in and the exit status out. See SOFTROCE.md for the observed facts behind each step.
//!
//! Fault hooks (`fault.rs`): a guest writes a request into the share (the `evchan-vm-fault`
//! helper does it) and the runner, which watches the share while it reads the consoles, cuts or
//! restores the wire through qemu's QMP socket, or stops, continues or kills a VM's qemu. A VM
//! killed that way is expected to end without an exit status; the others' statuses decide.

mod fault;

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::setup::{self, Kernel};
use crate::{root, target_dir, Result};

const INIT: &str = include_str!("init.sh");
const GUEST: &str = include_str!("guest.sh");
/// The modules the guest needs; `modprobe --show-depends` adds their dependencies in order.
const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "9pnet_virtio",
    "9p",
    "crc32_generic",
    "rdma_ucm",
    "rdma_rxe",
    "dummy",
    "veth",
    // evchan-core's device_events: ADDR_CHANGE comes from a bond's failover.
    "bonding",
];
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

/// What to run, where.
#[derive(Debug, Clone, Default)]
pub struct Job {
    /// The command of the single VM, or the client's (VM b) with two hosts: a shell line.
    pub command: String,
    /// With two hosts: the server's shell line (VM a).
    pub server: Option<String>,
    /// Variables for the job, on top of the caller's EVCHAN_* and RUST_* ones.
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
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
    /// The VMs killed on a guest's request (`evchan-vm-fault kill`), in order.
    pub killed: Vec<&'static str>,
}

/// `cargo xtask vm [--hosts 2] [--server CMD] [--env K=V] [--timeout S] [-v] -- CMD...`
pub fn cli(args: &[String]) -> Result<i32> {
    let mut job = Job {
        timeout: Duration::from_secs(1200),
        ..Job::default()
    };
    let mut hosts = 1;
    let mut it = args.iter();
    let mut command: Vec<String> = Vec::new();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "--" => {
                command = it.by_ref().cloned().collect();
                break;
            }
            "--hosts" => {
                hosts = match value("--hosts")?.as_str() {
                    "1" => 1,
                    "2" => 2,
                    n => return Err(format!("--hosts takes 1 or 2, not {n}")),
                }
            }
            "--server" => job.server = Some(value("--server")?),
            "--env" => {
                let kv = value("--env")?;
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("--env takes K=V, not `{kv}`"))?;
                job.env.push((k.to_owned(), v.to_owned()));
            }
            "--timeout" => {
                let s = value("--timeout")?;
                let secs: u64 = s
                    .parse()
                    .map_err(|_| format!("--timeout takes seconds, not `{s}`"))?;
                job.timeout = Duration::from_secs(secs);
            }
            "-v" | "--verbose" => job.verbose = true,
            "-h" | "--help" => {
                print!("{}", crate::USAGE);
                return Ok(0);
            }
            other => {
                return Err(format!(
                    "unknown vm option `{other}` (the command goes after `--`)"
                ))
            }
        }
    }
    if command.is_empty() {
        return Err("no command: cargo xtask vm [OPTIONS] -- CMD [ARGS...]".into());
    }
    if hosts == 2 && job.server.is_none() {
        return Err("--hosts 2 needs --server 'SERVER COMMAND' (CMD runs as the client)".into());
    }
    if hosts == 1 && job.server.is_some() {
        return Err("--server only makes sense with --hosts 2".into());
    }
    job.command = shell_join(&command);
    let outcome = run(&job, &mut |line| println!("{line}"))?;
    for vm in &outcome.killed {
        eprintln!("evchan-vm: VM {vm} was killed on request; the other VM's status decides");
    }
    Ok(outcome.code)
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
    let share = fresh_share()?;
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
        let mut cmd = qemu(&kernel, &initrd, &share, role);
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
        let mut child = cmd.spawn().map_err(|e| {
            format!("cannot start qemu-system-x86_64: {e} (run `cargo xtask setup`)")
        })?;
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
                Ok(()) => eprintln!("evchan-vm: fault `{line}`: done"),
                Err(e) => eprintln!("evchan-vm: fault `{line}`: {e}"),
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
        eprintln!("evchan-vm: booted to the job in {:.1} s", b.as_secs_f64());
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
            "evchan-vm: the server (VM a) was still running {} s after the client's job ended; stopped it",
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
                    eprintln!("evchan-vm: the server (VM a) exited with {a}");
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

/// qemu for one guest; `setpriv --pdeathsig KILL` so that it dies with the runner, always.
fn qemu(kernel: &Kernel, initrd: &Path, share: &Path, role: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL", "--", "qemu-system-x86_64"]);
    // One vCPU per guest when two guests share the host's cores; two for a lone guest.
    let smp = std::env::var("EVCHAN_VM_SMP")
        .ok()
        .unwrap_or_else(|| if role == "single" { "2" } else { "1" }.to_owned());
    cmd.args(["-accel", "tcg", "-cpu", "max", "-smp", &smp, "-m", "1024"]);
    cmd.args([
        "-nodefaults",
        "-no-user-config",
        "-no-reboot",
        "-display",
        "none",
    ]);
    cmd.arg("-qmp").arg(format!(
        "unix:{},server=on,wait=off",
        fault::qmp_path(share, role).display()
    ));
    cmd.args([
        "-chardev",
        "stdio,id=con,signal=off",
        "-serial",
        "chardev:con",
    ]);
    cmd.arg("-kernel").arg(&kernel.vmlinuz);
    cmd.arg("-initrd").arg(initrd);
    cmd.arg("-append").arg(format!(
        "console=ttyS0 quiet loglevel=3 panic=-1 clocksource=tsc tsc=reliable evchan.share={} evchan.role={role}",
        share.display()
    ));
    cmd.args([
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
    ]);
    cmd.arg("-virtfs").arg(format!(
        "local,path={},mount_tag=share,security_model=none,multidevs=remap",
        share.display()
    ));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
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

/// A fresh, empty directory for one run's writable share. Leftovers of runs older than an hour
/// (a runner killed with SIGKILL) are removed on the way.
fn fresh_share() -> Result<PathBuf> {
    let runs = setup::vm_dir().join("runs");
    fs::create_dir_all(&runs).map_err(|e| format!("cannot create {}: {e}", runs.display()))?;
    if let Ok(entries) = fs::read_dir(&runs) {
        for e in entries.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(3600));
            if old {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    for n in 0..1000u32 {
        let dir = runs.join(format!("{}-{n}", std::process::id()));
        if fs::create_dir(&dir).is_ok() {
            return Ok(dir);
        }
    }
    Err(format!(
        "cannot create a run directory under {}",
        runs.display()
    ))
}

/// The caller's variables that pass into the guest by themselves: `EVCHAN_*` and `RUST_*`.
pub fn passed_env() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("EVCHAN_") || k.starts_with("RUST_"))
        .collect()
}

/// The job scripts, its environment and working directory, and the scratch mounts.
fn write_share(share: &Path, job: &Job) -> Result<()> {
    let write = |name: &str, text: &str| {
        fs::write(share.join(name), text).map_err(|e| format!("cannot write {name}: {e}"))
    };
    write("guest.sh", GUEST)?;
    fs::create_dir_all(share.join("bin")).map_err(|e| format!("cannot create bin/: {e}"))?;
    write("bin/evchan-vm-fault", fault::SCRIPT)?;
    set_executable(&share.join("bin/evchan-vm-fault"))?;
    let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
    write("cwd", &cwd.display().to_string())?;
    let mut env = String::new();
    let inherited = passed_env();
    for (k, v) in &inherited {
        // Never silently: a knob such as EVCHAN_COMPLETIONS changes what a test does.
        if !job.env.iter().any(|(jk, _)| jk == k) {
            eprintln!("evchan-vm: passing {k}={v} into the guest (from this environment)");
        }
    }
    for (k, v) in inherited.into_iter().chain(job.env.iter().cloned()) {
        if k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            let _ = writeln!(env, "export {k}={}", shell_join(&[v]));
        }
    }
    write("env", &env)?;
    match &job.server {
        None => write("job.single", &job.command)?,
        Some(server) => {
            write("job.a", server)?;
            write("job.b", &job.command)?;
        }
    }
    // Writable tmpfs in the guest, but never over the repository, the target dir or the share.
    let keep = [root(), target_dir(), share.to_path_buf(), cwd];
    let scratch: Vec<&str> = ["/tmp", "/run", "/var/tmp", "/dev/shm"]
        .into_iter()
        .filter(|d| keep.iter().all(|k| !k.starts_with(d)))
        .collect();
    write("tmpfs.list", &scratch.join("\n"))
}

/// The initramfs (busybox, /init, the modules), cached under `target/evchan-vm/` and rebuilt
/// only when the kernel, the init script or the module list changes.
fn initramfs(kernel: &Kernel) -> Result<PathBuf> {
    let dir = setup::vm_dir();
    let out = dir.join(format!("initramfs-{}.cpio", kernel.version));
    let stamp_path = dir.join(format!("initramfs-{}.stamp", kernel.version));
    let stamp = format!("{INIT}\n{}\n{}", MODULES.join(" "), kernel.base.display());
    if out.is_file() && fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        return Ok(out);
    }
    let staging = dir.join("initramfs.staging");
    let _ = fs::remove_dir_all(&staging);
    for d in ["bin", "proc", "sys", "dev", "modules", "newroot"] {
        fs::create_dir_all(staging.join(d)).map_err(|e| e.to_string())?;
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .ok_or("no busybox: apt-get install -y busybox-static")?;
    fs::copy(busybox, staging.join("bin/busybox"))
        .map_err(|e| format!("cannot copy busybox: {e}"))?;
    fs::write(staging.join("init"), INIT).map_err(|e| e.to_string())?;
    set_executable(&staging.join("init"))?;
    set_executable(&staging.join("bin/busybox"))?;

    let mut order: Vec<String> = Vec::new();
    for m in MODULES {
        let o = Command::new("modprobe")
            .arg("-d")
            .arg(&kernel.base)
            // `-C /dev/null`: no module options from this host's modprobe.d.
            .args([
                "-C",
                "/dev/null",
                "-S",
                &kernel.version,
                "--show-depends",
                m,
            ])
            .output()
            .map_err(|e| format!("cannot run modprobe: {e} (apt-get install -y kmod)"))?;
        if !o.status.success() {
            return Err(format!(
                "modprobe --show-depends {m} failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let Some(rest) = line.strip_prefix("insmod ") else {
                continue;
            };
            let path = Path::new(rest.split_whitespace().next().unwrap_or_default());
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".ko"))
                .ok_or_else(|| format!("unexpected module file {}", path.display()))?
                .to_owned();
            if !order.contains(&name) {
                fs::copy(path, staging.join("modules").join(format!("{name}.ko")))
                    .map_err(|e| format!("cannot copy {}: {e}", path.display()))?;
                order.push(name);
            }
        }
    }
    fs::write(staging.join("modules.list"), order.join("\n")).map_err(|e| e.to_string())?;

    let tmp = dir.join("initramfs.cpio.tmp");
    let list = Command::new("find")
        .args([".", "-print0"])
        .current_dir(&staging)
        .output()
        .map_err(|e| e.to_string())?;
    let mut cpio = Command::new("cpio")
        .args(["--null", "--quiet", "-o", "-H", "newc", "-R", "0:0"])
        .current_dir(&staging)
        .stdin(Stdio::piped())
        .stdout(fs::File::create(&tmp).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("cannot run cpio: {e} (apt-get install -y cpio)"))?;
    {
        use std::io::Write;
        let mut stdin = cpio.stdin.take().expect("piped");
        stdin.write_all(&list.stdout).map_err(|e| e.to_string())?;
    }
    let status = cpio.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("cpio failed ({status})"));
    }
    fs::rename(&tmp, &out).map_err(|e| e.to_string())?;
    fs::write(&stamp_path, stamp).map_err(|e| e.to_string())?;
    let _ = fs::remove_dir_all(&staging);
    Ok(out)
}

fn set_executable(p: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", p.display()))
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
