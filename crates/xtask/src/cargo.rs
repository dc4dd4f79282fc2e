//! Running cargo, finding test and bench executables.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::{root, Result};

/// A `cargo` command in the workspace root, with the toolchain of `rust-toolchain.toml`.
pub fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
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
/// targets of every package whose name starts with `prefix` (the device tests: `device_`), as
/// (label, path); the label is the package's directory and the target, `evchan-core/device_cm`.
pub fn test_executables(prefix: &str) -> Result<Vec<(String, PathBuf)>> {
    executables(&["test", "--workspace"], "test", prefix).map(|found| {
        found
            .into_iter()
            .map(|(name, exe, dir)| (format!("{dir}/{name}"), exe))
            .collect()
    })
}

/// Builds with `cargo ARGS --no-run` (e.g. `["bench", "--workspace", "--benches"]`) and returns
/// the executables of the targets of `kind` (`test`, `bench`) whose name starts with `prefix`,
/// as (name, path, the directory name of its package), read from cargo's JSON messages.
pub fn executables(
    args: &[&str],
    kind: &str,
    prefix: &str,
) -> Result<Vec<(String, PathBuf, String)>> {
    let mut all = args.to_vec();
    all.extend(["--no-run", "--message-format=json-render-diagnostics"]);
    let out = cargo(&all)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("building the {kind} binaries failed"));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if !line.contains(r#""reason":"compiler-artifact""#) || !has_kind(line, kind) {
            continue;
        }
        let (Some(name), Some(exe)) = (json_str(line, "name"), json_str(line, "executable")) else {
            continue;
        };
        let dir = json_str(line, "manifest_path")
            .and_then(|m| {
                let m = PathBuf::from(m);
                Some(m.parent()?.file_name()?.to_str()?.to_owned())
            })
            .unwrap_or_default();
        if name.starts_with(prefix) {
            found.push((name, PathBuf::from(exe), dir));
        }
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// Whether the first `"kind":[…]` of one line of cargo's JSON (the target's) lists `kind`.
fn has_kind(line: &str, kind: &str) -> bool {
    let Some(start) = line.find(r#""kind":["#) else {
        return false;
    };
    let rest = &line[start + 8..];
    let list = &rest[..rest.find(']').unwrap_or(rest.len())];
    list.split(',').any(|k| k.trim_matches('"') == kind)
}

/// The first string value of `"key":"…"` in one line of cargo's JSON (cargo writes it compactly;
/// the first `name` of a compiler-artifact line is its target's). Escapes are not expected in
/// target names or paths of this workspace; a value with one is skipped.
fn json_str(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!(r#""{key}":""#))? + key.len() + 4;
    let len = line[start..].find('"')?;
    let value = &line[start..start + len];
    (!value.contains('\\')).then(|| value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_compiler_artifact_json() {
        let line = r#"{"reason":"compiler-artifact","package_id":"x","target":{"kind":["test"],"name":"device_cm","src_path":"/a/b.rs"},"executable":"/t/debug/deps/device_cm-1234","fresh":true}"#;
        assert_eq!(json_str(line, "name").as_deref(), Some("device_cm"));
        assert_eq!(
            json_str(line, "executable").as_deref(),
            Some("/t/debug/deps/device_cm-1234")
        );
        assert_eq!(json_str(r#"{"executable":null}"#, "executable"), None);
        assert!(has_kind(line, "test"));
        assert!(!has_kind(line, "bench"));
        let bench = r#"{"reason":"compiler-artifact","target":{"kind":["bench"],"crate_types":["bin"],"name":"cm_event"},"executable":"/t/release/deps/cm_event-1"}"#;
        assert!(has_kind(bench, "bench"));
        assert!(!has_kind(bench, "bin"));
    }
}
