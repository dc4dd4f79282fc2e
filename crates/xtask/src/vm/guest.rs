//! What a guest is made of: its qemu command line, its writable share (the job scripts, the
//! environment, the scratch mounts) and its initramfs (busybox, /init, the modules).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{fault, shell_join, Job};
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

/// qemu for one guest; `setpriv --pdeathsig KILL` so that it dies with the runner, always.
pub(super) fn qemu(kernel: &Kernel, initrd: &Path, share: &Path, role: &str) -> Command {
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

/// A fresh, empty directory for one run's writable share. Leftovers of runs older than an hour
/// (a runner killed with SIGKILL) are removed on the way.
pub(super) fn fresh_share() -> Result<PathBuf> {
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
pub(super) fn write_share(share: &Path, job: &Job) -> Result<()> {
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
pub(super) fn initramfs(kernel: &Kernel) -> Result<PathBuf> {
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
