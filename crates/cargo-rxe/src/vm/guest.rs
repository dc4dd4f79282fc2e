//! What a guest is made of: its qemu command line, its writable share (the job scripts, the
//! environment, the scratch mounts) and its initramfs (busybox, /init, the modules).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{fault, shell_join, Accel, Job};
use crate::setup::{self, Kernel};
use crate::Result;

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
pub(super) fn qemu(
    kernel: &Kernel,
    initrd: &Path,
    share: &Path,
    role: &str,
    accel: Accel,
) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL", "--", "qemu-system-x86_64"]);
    // One vCPU per guest when two guests share the host's cores; two for a lone guest.
    let smp = std::env::var("EVCHAN_VM_SMP")
        .ok()
        .unwrap_or_else(|| if role == "single" { "2" } else { "1" }.to_owned());
    match accel {
        // `max`, not the ~0.5 s quicker-booting `qemu64`: a binary built for a newer CPU
        // (`-C target-cpu=native`) must not die of SIGILL in the guest.
        Accel::Tcg => cmd.args(["-accel", "tcg", "-cpu", "max"]),
        Accel::Kvm => cmd.args(["-accel", "kvm", "-cpu", "host"]),
    };
    cmd.args(["-smp", &smp, "-m", "1024"]);
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
    cmd.arg("-kernel")
        .arg(kernel.vmlinux.as_ref().unwrap_or(&kernel.vmlinuz));
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

/// One run's writable share: its directory, and the lock on its `owner` file that tells other
/// runners it is in use (released when this drops, or when the process dies).
#[derive(Debug)]
pub(super) struct Share {
    pub(super) dir: PathBuf,
    _owner: fs::File,
}

/// A fresh, empty directory for one run's writable share, `runs/PID-N` in the cache. Leftovers
/// of runs older than an hour whose runner is gone (killed with SIGKILL) are removed on the way.
pub(super) fn fresh_share() -> Result<Share> {
    let runs = setup::cache_dir()?.join("runs");
    fs::create_dir_all(&runs).map_err(|e| format!("cannot create {}: {e}", runs.display()))?;
    if let Ok(entries) = fs::read_dir(&runs) {
        for e in entries.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(3600));
            // The cache is shared by every runner of this user: never a live runner's share.
            // Its runner holds a lock on its `owner` file for as long as it runs.
            let owner_alive = fs::File::open(e.path().join("owner"))
                .is_ok_and(|f| matches!(f.try_lock(), Err(fs::TryLockError::WouldBlock)));
            if old && !owner_alive {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    for n in 0..1000u32 {
        let dir = runs.join(format!("{}-{n}", std::process::id()));
        if fs::create_dir(&dir).is_ok() {
            let owner = fs::File::create(dir.join("owner"))
                .map_err(|e| format!("cannot create {}/owner: {e}", dir.display()))?;
            owner
                .lock()
                .map_err(|e| format!("cannot lock {}/owner: {e}", dir.display()))?;
            return Ok(Share { dir, _owner: owner });
        }
    }
    Err(format!(
        "cannot create a run directory under {}",
        runs.display()
    ))
}

/// The caller's variables that pass into the guest by themselves: `RXE_*`, `EVCHAN_*` and
/// `RUST_*`.
pub fn passed_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| {
            ["RXE_", "EVCHAN_", "RUST_"]
                .iter()
                .any(|p| k.starts_with(p))
        })
        .collect()
}

/// The job scripts, its environment and working directory, and the scratch mounts.
pub(super) fn write_share(share: &Path, job: &Job) -> Result<()> {
    let write = |name: &str, text: &str| {
        fs::write(share.join(name), text).map_err(|e| format!("cannot write {name}: {e}"))
    };
    write("guest.sh", GUEST)?;
    fs::create_dir_all(share.join("bin")).map_err(|e| format!("cannot create bin/: {e}"))?;
    // One helper, two names: `rxe-fault`, and `evchan-vm-fault` of the runner's first users.
    for name in ["rxe-fault", "evchan-vm-fault"] {
        write(&format!("bin/{name}"), fault::SCRIPT)?;
        set_executable(&share.join("bin").join(name))?;
    }
    let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
    write("cwd", &cwd.display().to_string())?;
    let mut env = String::new();
    let inherited = passed_env();
    for (k, v) in &inherited {
        // Never silently: a knob such as EVCHAN_COMPLETIONS changes what a test does.
        if !job.env.iter().any(|(jk, _)| jk == k) {
            eprintln!("cargo-rxe: passing {k}={v} into the guest (from this environment)");
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
    // A fresh, writable tmpfs on each scratch directory; what must stay visible under one
    // (the working directory, the share, the job's own paths: a checkout under /tmp) is bound
    // back into it from the host's read-only view.
    write("tmpfs.list", &lines(&SCRATCH))?;
    let mut keep: Vec<PathBuf> = vec![cwd, share.to_path_buf()];
    // Directories only (a file's directory is kept with it), as they really are (a symlink
    // into /tmp is kept by its target), and only those that exist.
    keep.extend(job.keep.iter().map(|p| match p.parent() {
        Some(dir) if !p.is_dir() => dir.to_path_buf(),
        _ => p.clone(),
    }));
    let keep: Vec<PathBuf> = keep
        .iter()
        .filter_map(|p| fs::canonicalize(p).ok())
        .filter(|p| p.is_dir())
        .collect();
    write("keep.list", &lines(&kept_under_scratch(&keep)))
}

/// One item per line, each line ended (the guest's `read` drops an unended last line).
fn lines<S: AsRef<str>>(items: &[S]) -> String {
    items.iter().map(|i| format!("{}\n", i.as_ref())).collect()
}

/// The directories that get a fresh tmpfs in the guest.
const SCRATCH: [&str; 4] = ["/tmp", "/run", "/var/tmp", "/dev/shm"];

/// Of `paths`, those under a scratch directory, outermost only (a path inside another is
/// visible with it), as absolute strings without a trailing slash, sorted.
fn kept_under_scratch(paths: &[PathBuf]) -> Vec<String> {
    let mut under: Vec<&Path> = paths
        .iter()
        .map(PathBuf::as_path)
        .filter(|p| {
            p.is_absolute()
                && SCRATCH
                    .iter()
                    .any(|d| p.starts_with(d) && *p != Path::new(d))
        })
        .collect();
    under.sort();
    under.dedup();
    let outer: Vec<&Path> = under
        .iter()
        .copied()
        .filter(|p| !under.iter().any(|o| o != p && p.starts_with(o)))
        .collect();
    outer
        .iter()
        .filter_map(|p| p.to_str())
        // One path per line, read by the shell: no newline in it.
        .filter(|p| !p.contains('\n'))
        .map(str::to_owned)
        .collect()
}

/// The initramfs (busybox, /init, the modules), cached beside the kernel and rebuilt
/// only when the kernel, the init script or the module list changes.
pub(super) fn initramfs(kernel: &Kernel) -> Result<PathBuf> {
    let dir = setup::cache_dir()?;
    let out = dir.join(format!("initramfs-{}.cpio", kernel.version));
    let stamp_path = dir.join(format!("initramfs-{}.stamp", kernel.version));
    // What the initramfs is made of; any change to how it is made changes FORMAT.
    const FORMAT: &str = "2: modules without signatures";
    let stamp = format!(
        "{FORMAT}\n{INIT}\n{}\n{}",
        MODULES.join(" "),
        kernel.base.display()
    );
    if out.is_file() && fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        return Ok(out);
    }
    let staging = dir.join(format!("initramfs.staging.{}", std::process::id()));
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
            let file = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            // Debian's modules are plain `.ko`; Ubuntu's (and newer Debian's) are compressed,
            // which busybox's insmod cannot read: unpacked here.
            let (name, unpack) = [
                (".ko", None),
                (".ko.xz", Some("xz")),
                (".ko.zst", Some("zstd")),
                (".ko.gz", Some("gzip")),
            ]
            .into_iter()
            .find_map(|(suffix, tool)| Some((file.strip_suffix(suffix)?.to_owned(), tool)))
            .ok_or_else(|| format!("unexpected module file {}", path.display()))?;
            if !order.contains(&name) {
                let ko = match unpack {
                    None => fs::read(path)
                        .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
                    Some(tool) => {
                        let o = Command::new(tool)
                            .arg("-dc")
                            .arg(path)
                            .output()
                            .map_err(|e| {
                                format!(
                                    "cannot run {tool} for {}: {e} (install it)",
                                    path.display()
                                )
                            })?;
                        if !o.status.success() {
                            return Err(format!("{tool} -dc {} failed", path.display()));
                        }
                        o.stdout
                    }
                };
                fs::write(
                    staging.join("modules").join(format!("{name}.ko")),
                    unsigned(&ko),
                )
                .map_err(|e| format!("cannot copy {}: {e}", path.display()))?;
                order.push(name);
            }
        }
    }
    fs::write(staging.join("modules.list"), order.join("\n")).map_err(|e| e.to_string())?;

    let tmp = dir.join(format!("initramfs.cpio.{}.tmp", std::process::id()));
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

/// A module without its appended signature: the guest kernel then does not check it (about
/// 60 ms each under TCG; it loads it all the same, `module.sig_enforce` is off). A module
/// without one comes back as it is.
fn unsigned(ko: &[u8]) -> &[u8] {
    const MAGIC: &[u8] = b"~Module signature appended~\n";
    // Before the magic: `struct module_signature`, 12 bytes, its last 4 the signature's length
    // (big-endian); before that, the signature.
    let Some(rest) = ko.strip_suffix(MAGIC) else {
        return ko;
    };
    let Some(info) = rest.len().checked_sub(12).map(|at| &rest[at..]) else {
        return ko;
    };
    let sig_len = u32::from_be_bytes([info[8], info[9], info[10], info[11]]) as usize;
    match (rest.len() - 12).checked_sub(sig_len) {
        Some(end) => &ko[..end],
        None => ko,
    }
}

fn set_executable(p: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_signatures_are_cut_off() {
        let mut ko = b"\x7fELF module".to_vec();
        let signed = {
            let mut s = ko.clone();
            s.extend_from_slice(&[0xAB; 5]);
            s.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
            s.extend_from_slice(b"~Module signature appended~\n");
            s
        };
        assert_eq!(unsigned(&signed), &ko[..]);
        assert_eq!(unsigned(&ko), &ko[..]);
        ko.extend_from_slice(b"~Module signature appended~\n");
        assert_eq!(
            unsigned(&ko),
            &ko[..],
            "too short to hold a signature: as it is"
        );
    }

    #[test]
    fn only_the_outermost_paths_under_scratch_dirs_are_kept() {
        let p = |s: &str| PathBuf::from(s);
        let kept = kept_under_scratch(&[
            p("/work/main"),
            p("/tmp/crate"),
            p("/tmp/crate/target"),
            p("/tmp"),
            p("/tmpfoo/x"),
            p("/dev/shm/a"),
            p("relative/tmp"),
            p("/tmp/crate"),
        ]);
        assert_eq!(kept, ["/dev/shm/a", "/tmp/crate"]);
    }
}
