//! `cargo rxe setup`: the Debian packages and the VM's kernel, in a per-user cache. Idempotent;
//! quick when all is there (no network, no apt).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{is_root, Result};

/// The Debian packages the VM and a Rust RDMA crate's build need, with what each one is for.
pub const PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "the soft-RoCE VM"),
    ("busybox-static", "the VM's initramfs"),
    ("cpio", "packing the initramfs"),
    ("kmod", "module dependencies of the VM kernel"),
    ("util-linux", "setpriv, so that no qemu outlives the runner"),
    ("rdma-core", "rdma_rxe user space"),
    ("ibverbs-providers", "the rxe verbs provider"),
    ("ibverbs-utils", "ibv_devinfo"),
    (
        "rdmacm-utils",
        "rping, rdma_client/rdma_server, ucmatose, cmtime",
    ),
    ("perftest", "ib_send_lat and friends"),
    ("librdmacm-dev", "librdmacm headers (rdma-sys)"),
    ("libibverbs-dev", "libibverbs headers (rdma-sys)"),
    ("libclang-dev", "bindgen in rdma-sys"),
    ("pkg-config", "finding rdma-core (rdma-sys)"),
    ("iproute2", "ip and rdma inside the VM"),
    (
        "xz-utils",
        "unpacking the kernel once, so that each boot skips it",
    ),
];

/// The unpacked VM kernel: its version, `vmlinuz` and its module tree.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub version: String,
    pub vmlinuz: PathBuf,
    /// The uncompressed ELF kernel, which qemu boots straight into (PVH): no decompression of
    /// `vmlinuz` under TCG (about 5 s of each boot). `None` when it cannot be had (a kernel
    /// without `CONFIG_PVH`, or not xz-compressed): then `vmlinuz` boots.
    pub vmlinux: Option<PathBuf>,
    /// The directory that holds `lib/modules/<version>/` (a `depmod -b` base).
    pub base: PathBuf,
}

/// `cargo rxe setup`: the packages, then the kernel; prints where things are.
pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        if a == "-h" || a == "--help" {
            print!("{}", crate::cli::USAGE);
            return Ok(());
        }
        return Err(format!("setup takes no arguments (got `{a}`)"));
    }
    let k = ensure()?;
    println!(
        "cargo-rxe: ready: the packages are installed, the VM kernel {} is in {}",
        k.version,
        k.base.display()
    );
    Ok(())
}

/// Everything the VM needs: [`PACKAGES`], then the kernel.
pub fn ensure() -> Result<Kernel> {
    ensure_packages(PACKAGES)?;
    ensure_kernel()
}

fn missing_packages(packages: &[(&'static str, &str)]) -> Vec<&'static str> {
    packages
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| {
            let out = Command::new("dpkg-query")
                .args(["-W", "-f=${db:Status-Status}", p])
                .stderr(Stdio::null())
                .output();
            !matches!(out, Ok(o) if o.status.success() && o.stdout == b"installed")
        })
        .collect()
}

/// Installs those of `packages` that dpkg does not list as installed; as another user than
/// root, fails with the exact `apt-get install` line to run instead.
pub fn ensure_packages(packages: &[(&'static str, &str)]) -> Result<()> {
    let missing = missing_packages(packages);
    if missing.is_empty() {
        return Ok(());
    }
    let line = format!("apt-get install -y {}", missing.join(" "));
    if !is_root() {
        return Err(format!(
            "missing Debian packages: {} (fix, as root: apt-get update && {line})",
            missing.join(", ")
        ));
    }
    eprintln!("cargo-rxe: installing {}", missing.join(" "));
    apt(&["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend(missing.iter().copied());
    apt(&args)?;
    let still = missing_packages(packages);
    if still.is_empty() {
        Ok(())
    } else {
        Err(format!("apt-get did not install: {}", still.join(", ")))
    }
}

fn apt(args: &[&str]) -> Result<()> {
    let status = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run apt-get: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`apt-get {}` failed ({status})", args.join(" ")))
    }
}

/// The per-user cache of the VM's files (the kernel, the initramfs, the runs' shares):
/// `$XDG_CACHE_HOME/cargo-rxe`, else `~/.cache/cargo-rxe`.
pub fn cache_dir() -> Result<PathBuf> {
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").and_then(absolute) {
        return Ok(dir.join("cargo-rxe"));
    }
    std::env::var_os("HOME")
        .and_then(absolute)
        .map(|h| h.join(".cache").join("cargo-rxe"))
        .ok_or_else(|| "neither XDG_CACHE_HOME nor HOME is set to an absolute path".into())
}
/// The kernel meta-packages: Debian's, then Ubuntu's.
const KERNEL_METAS: &[&str] = &["linux-image-amd64", "linux-image-generic"];

/// The kernel package a meta-package depends on: `linux-image-6.1.0-56-amd64` (Debian),
/// `linux-image-6.8.0-51-generic` (Ubuntu).
fn kernel_package() -> Result<String> {
    let query = || {
        KERNEL_METAS.iter().find_map(|meta| {
            let o = Command::new("apt-cache")
                .args(["depends", meta])
                .stderr(Stdio::null())
                .output()
                .ok()?;
            String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
                l.trim()
                    .strip_prefix("Depends: ")
                    .filter(|p| p.starts_with("linux-image-") && !p.contains("unsigned"))
                    .map(str::to_owned)
            })
        })
    };
    if let Some(p) = query() {
        return Ok(p);
    }
    if is_root() {
        apt(&["update", "-q"])?;
        if let Some(p) = query() {
            return Ok(p);
        }
    }
    Err(format!(
        "apt-cache knows none of {}: run `apt-get update` as root, then retry",
        KERNEL_METAS.join(", ")
    ))
}

/// Whether apt knows a package by that name.
fn apt_knows(package: &str) -> bool {
    Command::new("apt-cache")
        .args(["show", "-q", package])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ensure_kernel() -> Result<Kernel> {
    let dir = cache_dir()?.join("kernel");
    // A kernel unpacked before is enough: no network, no apt, when it is there.
    if let Some(k) = find_kernel(&dir) {
        return Ok(k);
    }
    let package = kernel_package()?;
    let version = package.trim_start_matches("linux-image-").to_owned();
    // Debian's image package holds the modules; Ubuntu's keeps them in two more.
    let mut packages = vec![package.clone()];
    packages.extend(
        [
            format!("linux-modules-{version}"),
            format!("linux-modules-extra-{version}"),
        ]
        .into_iter()
        .filter(|p| apt_knows(p)),
    );
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    eprintln!(
        "cargo-rxe: fetching the VM kernel ({})",
        packages.join(", ")
    );
    // Names of this process's own: another runner of this user may be fetching too.
    let pid = std::process::id();
    let dl = dir.join(format!("download.{pid}"));
    let _ = fs::remove_dir_all(&dl);
    fs::create_dir_all(&dl).map_err(|e| format!("cannot create {}: {e}", dl.display()))?;
    let status = Command::new("apt-get")
        .args(["download", "-q", "-o", "APT::Sandbox::User=root"])
        .args(&packages)
        .current_dir(&dl)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run apt-get: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`apt-get download {}` failed ({status}); run `apt-get update` as root, then retry",
            packages.join(" ")
        ));
    }
    let debs: Vec<PathBuf> = fs::read_dir(&dl)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    if debs.is_empty() {
        return Err(format!("apt-get download left no .deb in {}", dl.display()));
    }
    let staging = dir.join(format!("{version}.partial.{pid}"));
    let _ = fs::remove_dir_all(&staging);
    for deb in &debs {
        run_checked(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&staging))?;
    }
    // The package ships no modules.dep (its postinst makes it); make it for our tree.
    run_checked(Command::new("depmod").arg("-b").arg(&staging).arg(&version))?;
    // Never over another runner's kernel: a rename onto a directory that exists fails, and
    // then that runner's kernel is the one to use.
    let moved = fs::rename(&staging, dir.join(&version));
    let _ = fs::remove_dir_all(&staging);
    if let (Err(e), None) = (moved, find_kernel(&dir)) {
        return Err(format!("cannot move the kernel in place: {e}"));
    }
    let _ = fs::remove_dir_all(&dl);
    find_kernel(&dir).ok_or_else(|| format!("no vmlinuz in the unpacked {package}"))
}

fn find_kernel(dir: &Path) -> Option<Kernel> {
    let entries = fs::read_dir(dir).ok()?;
    let mut kernels: Vec<Kernel> = entries
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.to_owned();
            if version.contains(".partial") || version.starts_with("download") {
                return None;
            }
            let base = e.path();
            let vmlinuz = base.join("boot").join(format!("vmlinuz-{version}"));
            let dep = base.join("lib/modules").join(&version).join("modules.dep");
            (vmlinuz.is_file() && dep.is_file()).then(|| Kernel {
                vmlinux: pvh_kernel(&base, &version, &vmlinuz),
                version,
                vmlinuz,
                base,
            })
        })
        .collect();
    kernels.sort_by(|a, b| a.version.cmp(&b.version));
    kernels.pop()
}

/// `boot/vmlinux-VERSION` beside `vmlinuz`, made once: the ELF kernel inside the xz-compressed
/// `vmlinuz`, when the kernel boots by PVH (`CONFIG_PVH=y`, so qemu can start it directly).
fn pvh_kernel(base: &Path, version: &str, vmlinuz: &Path) -> Option<PathBuf> {
    let out = base.join("boot").join(format!("vmlinux-{version}"));
    if out.is_file() {
        return Some(out);
    }
    let config = fs::read_to_string(base.join("boot").join(format!("config-{version}"))).ok()?;
    if !config.lines().any(|l| l == "CONFIG_PVH=y") {
        return None;
    }
    let image = fs::read(vmlinuz).ok()?;
    const XZ: &[u8] = b"\xfd7zXZ\x00";
    let at = image.windows(XZ.len()).position(|w| w == XZ)?;
    let tmp = base
        .join("boot")
        .join(format!("vmlinux-{version}.{}.tmp", std::process::id()));
    let ok = (|| {
        let mut xz = Command::new("xz")
            .args(["-dc", "--single-stream"])
            .stdin(Stdio::piped())
            .stdout(fs::File::create(&tmp).ok()?)
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        {
            use std::io::Write as _;
            // xz stops reading at the stream's end: the bytes after it may meet a closed pipe.
            let _ = xz.stdin.take()?.write_all(&image[at..]);
        }
        let elf = xz.wait().ok()?.success()
            && fs::read(&tmp)
                .ok()
                .is_some_and(|b| b.starts_with(b"\x7fELF"));
        elf.then_some(())
    })();
    match ok {
        Some(()) => fs::rename(&tmp, &out).ok().map(|()| out),
        None => {
            let _ = fs::remove_file(&tmp);
            None
        }
    }
}

/// Runs a command to completion; its failure becomes an error naming it.
pub fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({status})"))
    }
}
