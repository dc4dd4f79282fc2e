//! `cargo rxe test` on code that is not this workspace's: a fresh crate written to a temporary
//! directory (under /tmp: the guest's /tmp is a fresh tmpfs, and the crate must stay visible
//! there), with a unit test, a device test that echoes over evchan on rxe, and a test that
//! fails when asked. Run twice: it must pass with `3 passed, 0 failed, 0 skipped` and status 0,
//! then, asked to fail, end with `2 passed, 1 failed, 0 skipped` and status 1.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::native::run_merged;
use super::Tally;
use crate::cargo::cargo;
use crate::{root, target_dir, Result};

const LIB: &str = r#"//! A crate that uses evchan, written by `cargo xtask test`.

/// Twice `x`.
pub fn double(x: u32) -> u32 {
    x * 2
}

#[cfg(test)]
mod tests {
    #[test]
    fn doubles() {
        assert_eq!(super::double(21), 42);
    }
}
"#;

const DEVICE_TEST: &str = r#"//! One message echoed over evchan on the VM's rxe device; skips (saying so) without it.

use evchan::{Config, Connection, Listener};

#[tokio::test]
async fn echo_over_rxe() {
    let Ok(ip) = std::env::var("RXE_SELF") else {
        assert!(
            std::env::var_os("EVCHAN_REQUIRE_DEVICE").is_none_or(|v| v != "1"),
            "no RXE_SELF: not in cargo rxe's VM"
        );
        let me = std::thread::current();
        eprintln!("skipping {}: not in cargo rxe's VM", me.name().unwrap_or("?"));
        return;
    };
    let addr = format!("{ip}:7499").parse().expect("an IPv4 address");
    let listener = Listener::bind(addr, Config::new()).await.expect("bind");
    let server = tokio::spawn(async move {
        let mut conn = listener.accept().await?.accept(b"").await?;
        while let Some(msg) = conn.recv().await? {
            conn.send(msg).await?;
        }
        Ok::<_, evchan::Error>(())
    });
    let mut conn = Connection::connect(addr).await.expect("connect");
    conn.send("from a fresh crate").await.expect("send");
    let back = conn.recv().await.expect("recv").expect("a message");
    assert_eq!(&back[..], b"from a fresh crate");
    conn.close().await.expect("close");
    server.await.expect("the server task").expect("the server");
}

#[test]
fn fails_when_asked() {
    assert!(
        std::env::var_os("EVCHAN_FRESH_FAIL").is_none(),
        "EVCHAN_FRESH_FAIL is set: failing as asked"
    );
}
"#;

/// Writes the crate into a new directory under the system's temporary directory.
fn write_crate() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("evchan-fresh-crate-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let w = |rel: &str, text: &str| {
        let p = dir.join(rel);
        fs::create_dir_all(p.parent().expect("a file in a directory"))
            .and_then(|()| fs::write(&p, text))
            .map_err(|e| format!("cannot write {}: {e}", p.display()))
    };
    let evchan = root().join("crates/evchan");
    w(
        "Cargo.toml",
        &format!(
            "[package]\nname = \"rxe-fresh\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
             [dev-dependencies]\nevchan = {{ path = {:?} }}\n\
             tokio = {{ version = \"1\", default-features = false, features = [\"rt\", \"macros\"] }}\n\n\
             # This workspace's dev profile, so that its built dependencies are reused.\n\
             [profile.dev]\ndebug = \"line-tables-only\"\n\n\
             # A workspace of its own, wherever the directory is.\n[workspace]\n",
            evchan.display().to_string()
        ),
    )?;
    w("src/lib.rs", LIB)?;
    w("tests/device_echo.rs", DEVICE_TEST)?;
    // The same versions and toolchain as this workspace: nothing new to download or build.
    for f in ["Cargo.lock", "rust-toolchain.toml"] {
        fs::copy(root().join(f), dir.join(f)).map_err(|e| format!("cannot copy {f}: {e}"))?;
    }
    Ok(dir)
}

/// Builds cargo-rxe, then runs `cargo rxe test` in the fresh crate twice (see the module).
pub(super) fn fresh_crate(t: &mut Tally) {
    let start = Instant::now();
    let built = cargo(&["build", "--quiet", "-p", "cargo-rxe"])
        .status()
        .is_ok_and(|s| s.success());
    let dir = match write_crate() {
        Ok(dir) if built => dir,
        Ok(_) | Err(_) => {
            eprintln!("xtask: building cargo-rxe or writing the fresh crate failed");
            t.gate("cargo rxe test in a fresh crate", false, start.elapsed());
            return;
        }
    };
    let runs: [(&str, Option<&str>, &str, bool); 2] = [
        (
            "cargo rxe test in a fresh crate under /tmp (a unit test, an evchan echo on rxe, \
             one more): `3 passed, 0 failed, 0 skipped`, status 0",
            None,
            "3 passed, 0 failed, 0 skipped",
            true,
        ),
        (
            "cargo rxe test in the fresh crate with a test failing: \
             `2 passed, 1 failed, 0 skipped`, status 1",
            Some("1"),
            "2 passed, 1 failed, 0 skipped",
            false,
        ),
    ];
    for (name, fail, want, want_ok) in runs {
        let start = Instant::now();
        let mut last = String::new();
        let ok = run_in(&dir, fail, &mut |l| {
            println!("{l}");
            if !l.trim().is_empty() {
                last = l.to_owned();
            }
        });
        let good = ok.as_ref().is_ok_and(|ok| *ok == want_ok) && last == want;
        if !good {
            eprintln!(
                "xtask: `cargo rxe test` ended {ok:?} with last line `{last}`; wanted `{want}`"
            );
        }
        t.gate(name, good, start.elapsed());
    }
    let _ = fs::remove_dir_all(&dir);
}

/// `cargo rxe test` in `dir`, with this workspace's cargo-rxe first on PATH and target dir.
fn run_in(dir: &Path, fail: Option<&str>, out: &mut dyn FnMut(&str)) -> Result<bool> {
    let bin = target_dir().join("debug");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = Command::new(cargo_rxe::cargo::program());
    cmd.args(["rxe", "test"])
        .current_dir(dir)
        .env(
            "PATH",
            std::env::join_paths(paths).map_err(|e| e.to_string())?,
        )
        .env("CARGO_TARGET_DIR", target_dir())
        .env_remove("EVCHAN_FRESH_FAIL");
    if let Some(v) = fail {
        cmd.env("EVCHAN_FRESH_FAIL", v);
    }
    run_merged(cmd, out)
}
