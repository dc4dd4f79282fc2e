//! Running cargo, finding test and bench executables.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use cargo_rxe::cargo::Artifact;

use crate::{root, Result};

/// A `cargo` command in the workspace root, with the toolchain of `rust-toolchain.toml`.
pub fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(cargo_rxe::cargo::program());
    cmd.args(args).current_dir(root());
    cmd
}

/// Runs `cmd`, handing each line of its stdout to `on_line` as it comes; returns its success.
pub fn run_lines(cmd: &mut Command, on_line: &mut dyn FnMut(&str)) -> Result<bool> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let Ok(line) = line else { break };
        on_line(&line);
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    Ok(status.success())
}

/// Builds the workspace's tests without running them and returns the executables of the test
/// targets of every package whose name starts with `prefix` (the device tests: `device_`).
pub fn test_executables(prefix: &str) -> Result<Vec<Artifact>> {
    executables(&["test", "--workspace"], "test", prefix)
}

/// Builds with `cargo ARGS --no-run` (e.g. `["bench", "--workspace", "--benches"]`) and returns
/// the executables of the targets of `kind` (`test`, `bench`) whose name starts with `prefix`.
pub fn executables(args: &[&str], kind: &str, prefix: &str) -> Result<Vec<Artifact>> {
    let cargo = cargo_rxe::cargo::program();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    Ok(cargo_rxe::cargo::build(&cargo, &root(), &args)?
        .into_iter()
        .filter(|a| a.kinds.iter().any(|k| k == kind) && a.name.starts_with(prefix))
        .collect())
}
