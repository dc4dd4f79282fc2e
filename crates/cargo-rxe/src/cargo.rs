//! Cargo's side: building test binaries on the host and finding them in cargo's JSON messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Result;

/// One executable cargo built (a `compiler-artifact` message with an `executable`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Artifact {
    /// The target's name (`device_cm`, or the crate's for its unit tests).
    pub name: String,
    /// The target's kinds (`lib`, `bin`, `test`, `bench`, `example`).
    pub kinds: Vec<String>,
    pub exe: PathBuf,
    /// The directory of its package's `Cargo.toml`: `cargo test` runs a test binary there.
    pub package_dir: PathBuf,
    /// Built with the test harness (`profile.test`): a libtest binary.
    pub test: bool,
}

impl Artifact {
    /// `package-dir-name/target`, e.g. `evchan-core/device_cm`; a target that is not an
    /// integration test says its kind, `sideway/sideway (lib)`, so that a crate's unit tests
    /// and a `tests/NAME.rs` of the same name are told apart.
    pub fn label(&self) -> String {
        let dir = self
            .package_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        match self.kinds.first() {
            Some(kind) if !self.kinds.iter().any(|k| k == "test") => {
                format!("{dir}/{} ({kind})", self.name)
            }
            _ => format!("{dir}/{}", self.name),
        }
    }
}

/// The cargo to run: `$CARGO` (set by cargo for its subcommands, so the same toolchain), else
/// `cargo` on `PATH`.
pub fn program() -> PathBuf {
    std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from)
}

/// `cargo ARGS --no-run --message-format=json-render-diagnostics` in `dir` (`ARGS` such as
/// `["test", "--workspace"]`); the diagnostics go to stderr, the executables come back.
pub fn build(cargo: &Path, dir: &Path, args: &[String]) -> Result<Vec<Artifact>> {
    let mut cmd = Command::new(cargo);
    cmd.args(args)
        .args(["--no-run", "--message-format=json-render-diagnostics"])
        .current_dir(dir)
        .stderr(Stdio::inherit());
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.display()))?;
    if !out.status.success() {
        return Err(format!(
            "`cargo {} --no-run` failed ({})",
            args.join(" "),
            out.status
        ));
    }
    Ok(artifacts(&String::from_utf8_lossy(&out.stdout)))
}

/// The executables in cargo's JSON messages (one per line), sorted, each once.
pub fn artifacts(json_lines: &str) -> Vec<Artifact> {
    let mut found: Vec<Artifact> = json_lines
        .lines()
        .filter(|l| l.contains(r#""reason":"compiler-artifact""#))
        .filter_map(|line| {
            let exe = json_str(line, "executable")?;
            let manifest = PathBuf::from(json_str(line, "manifest_path")?);
            Some(Artifact {
                name: json_str(line, "name")?,
                kinds: list_after(line, r#""kind":["#),
                exe: PathBuf::from(exe),
                package_dir: manifest.parent()?.to_path_buf(),
                test: object_after(line, r#""profile":{"#).contains(r#""test":true"#),
            })
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The strings of the first `[…]` list after `key` (the target's kinds come first).
fn list_after(line: &str, key: &str) -> Vec<String> {
    let Some(start) = line.find(key) else {
        return Vec::new();
    };
    let rest = &line[start + key.len()..];
    rest[..rest.find(']').unwrap_or(rest.len())]
        .split(',')
        .map(|k| k.trim_matches('"').to_owned())
        .filter(|k| !k.is_empty())
        .collect()
}

/// The text of the flat `{…}` object after `key` (cargo's `profile` holds no nested object).
fn object_after<'a>(line: &'a str, key: &str) -> &'a str {
    let Some(start) = line.find(key) else {
        return "";
    };
    let rest = &line[start + key.len()..];
    &rest[..rest.find('}').unwrap_or(rest.len())]
}

/// The first string value of `"key":"…"` in one line of cargo's JSON (cargo writes it compactly;
/// the first `name` of a compiler-artifact line is its target's). A value with an escape is
/// not expected in target names or paths; it is skipped.
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
        let lines = concat!(
            r#"{"reason":"compiler-artifact","package_id":"x","manifest_path":"/w/crates/evchan-core/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"device_cm","src_path":"/a/b.rs","test":true},"profile":{"opt_level":"0","debuginfo":2,"test":true},"executable":"/t/debug/deps/device_cm-1234","fresh":true}"#,
            "\n",
            r#"{"reason":"compiler-artifact","manifest_path":"/w/Cargo.toml","target":{"kind":["bench"],"crate_types":["bin"],"name":"cm_event","test":false},"profile":{"opt_level":"3","test":false},"executable":"/t/release/deps/cm_event-1"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","manifest_path":"/w/Cargo.toml","target":{"kind":["lib"],"name":"w","test":true},"profile":{"test":false},"executable":null}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        let found = artifacts(lines);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].name, "cm_event");
        assert_eq!(found[0].kinds, ["bench"]);
        assert!(!found[0].test, "the target's `test` is not the profile's");
        assert_eq!(found[1].label(), "evchan-core/device_cm");
        assert_eq!(found[1].exe, Path::new("/t/debug/deps/device_cm-1234"));
        assert_eq!(found[1].package_dir, Path::new("/w/crates/evchan-core"));
        assert!(found[1].test);
    }
}
