//! `cargo xtask setup`: Debian packages and the VM's kernel. Idempotent; quick when all is there.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{is_root, target_dir, Result};

/// Debian packages the project needs, with what each one is for.
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
        "valgrind",
        "callgrind: instructions per operation (cargo xtask bench)",
    ),
    (
        "linux-perf",
        "profiling the benchmarks in the VM (perf record)",
    ),
];

/// The unpacked VM kernel: its version, `vmlinuz` and its module tree.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub version: String,
    pub vmlinuz: PathBuf,
    /// The directory that holds `lib/modules/<version>/` (a `depmod -b` base).
    pub base: PathBuf,
}

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        return Err(format!("setup takes no arguments (got `{a}`)"));
    }
    ensure()?;
    ensure_tools()
}

/// Everything the VM and the build need: packages, then the kernel.
pub fn ensure() -> Result<Kernel> {
    ensure_packages()?;
    ensure_kernel()
}

fn missing_packages() -> Vec<&'static str> {
    PACKAGES
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

fn ensure_packages() -> Result<()> {
    let missing = missing_packages();
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
    eprintln!("setup: installing {}", missing.join(" "));
    apt(&["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend(missing.iter().copied());
    apt(&args)?;
    let still = missing_packages();
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

/// Cargo subcommands the ladder runs, installed with `cargo install --locked` when missing:
/// (crate, version, what for). Pinned, so that CI builds what was measured.
pub const TOOLS: &[(&str, &str, &str)] = &[
    (
        "cargo-fuzz",
        "0.13.2",
        "`cargo xtask fuzz` and the fuzz checks of `cargo xtask test`",
    ),
    (
        "cargo-deny",
        "0.20.2",
        "`cargo deny check` (licenses, advisories, bans, sources)",
    ),
];

/// Installs the cargo subcommands of [`TOOLS`] that `cargo <sub> --version` does not find.
/// Once installed (into `~/.cargo/bin`) this is quick.
pub fn ensure_tools() -> Result<()> {
    for (krate, version, why) in TOOLS {
        let sub = krate.trim_start_matches("cargo-");
        let found = crate::cargo::cargo(&[sub, "--version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if found {
            continue;
        }
        eprintln!("setup: installing {krate} {version} ({why}); this takes minutes, once");
        let status = crate::cargo::cargo(&["install", "--locked", krate, "--version", version])
            .status()
            .map_err(|e| format!("cannot run cargo install: {e}"))?;
        if !status.success() {
            return Err(format!(
                "`cargo install --locked {krate} --version {version}` failed ({status})"
            ));
        }
    }
    Ok(())
}

/// Where the VM's files live: `target/evchan-vm/`.
pub fn vm_dir() -> PathBuf {
    target_dir().join("evchan-vm")
}

/// The kernel package `linux-image-amd64` depends on, e.g. `linux-image-6.1.0-56-amd64`.
fn kernel_package() -> Result<String> {
    let query = || {
        Command::new("apt-cache")
            .args(["depends", "linux-image-amd64"])
            .stderr(Stdio::null())
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
                    l.trim()
                        .strip_prefix("Depends: ")
                        .filter(|p| p.starts_with("linux-image-"))
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
    Err("apt-cache knows no linux-image-amd64: run `apt-get update` as root, then retry".into())
}

fn ensure_kernel() -> Result<Kernel> {
    let dir = vm_dir().join("kernel");
    // A kernel unpacked before is enough: no network, no apt, when it is there.
    if let Some(k) = find_kernel(&dir) {
        return Ok(k);
    }
    let package = kernel_package()?;
    let version = package.trim_start_matches("linux-image-").to_owned();
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    eprintln!("setup: fetching the VM kernel ({package})");
    let dl = dir.join("download");
    let _ = fs::remove_dir_all(&dl);
    fs::create_dir_all(&dl).map_err(|e| format!("cannot create {}: {e}", dl.display()))?;
    let status = Command::new("apt-get")
        .args(["download", "-q", "-o", "APT::Sandbox::User=root", &package])
        .current_dir(&dl)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run apt-get: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`apt-get download {package}` failed ({status}); run `apt-get update` as root, then retry"
        ));
    }
    let deb = fs::read_dir(&dl)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| format!("apt-get download left no .deb in {}", dl.display()))?;
    let staging = dir.join(format!("{version}.partial"));
    let _ = fs::remove_dir_all(&staging);
    run_checked(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&staging))?;
    // The package ships no modules.dep (its postinst makes it); make it for our tree.
    run_checked(Command::new("depmod").arg("-b").arg(&staging).arg(&version))?;
    let final_dir = dir.join(&version);
    let _ = fs::remove_dir_all(&final_dir);
    fs::rename(&staging, &final_dir)
        .map_err(|e| format!("cannot move the kernel in place: {e}"))?;
    let _ = fs::remove_dir_all(&dl);
    find_kernel(&dir).ok_or_else(|| format!("no vmlinuz in the unpacked {package}"))
}

fn find_kernel(dir: &Path) -> Option<Kernel> {
    let entries = fs::read_dir(dir).ok()?;
    let mut kernels: Vec<Kernel> = entries
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.to_owned();
            if version.ends_with(".partial") || version == "download" {
                return None;
            }
            let base = e.path();
            let vmlinuz = base.join("boot").join(format!("vmlinuz-{version}"));
            let dep = base.join("lib/modules").join(&version).join("modules.dep");
            (vmlinuz.is_file() && dep.is_file()).then_some(Kernel {
                version,
                vmlinuz,
                base,
            })
        })
        .collect();
    kernels.sort_by(|a, b| a.version.cmp(&b.version));
    kernels.pop()
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
