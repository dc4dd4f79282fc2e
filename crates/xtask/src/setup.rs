//! `cargo xtask setup`: cargo-rxe's setup (the VM's packages and kernel), then what only this
//! project needs: more Debian packages and the cargo subcommands of its ladder.

use std::process::Stdio;

use crate::Result;

pub use cargo_rxe::setup::Kernel;

/// Debian packages this project needs beyond cargo-rxe's, with what each one is for.
pub const PACKAGES: &[(&str, &str)] = &[
    (
        "valgrind",
        "callgrind: instructions per operation (cargo xtask bench)",
    ),
    (
        "linux-perf",
        "profiling the benchmarks in the VM (perf record)",
    ),
];

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        return Err(format!("setup takes no arguments (got `{a}`)"));
    }
    ensure()?;
    ensure_tools()
}

/// Everything the VM and the build need: cargo-rxe's packages and kernel, then ours.
pub fn ensure() -> Result<Kernel> {
    let kernel = cargo_rxe::setup::ensure()?;
    cargo_rxe::setup::ensure_packages(PACKAGES)?;
    Ok(kernel)
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
