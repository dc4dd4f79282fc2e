//! Fault hooks: a guest asks for a fault through a file in the writable share, the runner
//! carries it out on the host and answers (see `fault.sh`, installed in the guest as
//! `rxe-fault`, also as `evchan-vm-fault`).
//!
//! Requests: `link off|on [a|b]` (qemu's `set_link` of netdev `n0` through each VM's QMP socket; both
//! ends when no VM is named), `stop|cont|kill a|b` (SIGSTOP, SIGCONT, SIGKILL of that VM's
//! qemu). A killed VM's missing exit status is expected, not a failure of the run.

use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The helper script, installed as `bin/rxe-fault` (and `bin/evchan-vm-fault`) in the share.
pub(super) const SCRIPT: &str = include_str!("fault.sh");
const REQ: &str = "fault.req.";
const ACK: &str = "fault.ack.";

/// A request the runner carries out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fault {
    /// `set_link n0 on|off` on the named VMs' qemu.
    Link { up: bool, vms: Vec<&'static str> },
    /// A signal to a VM's qemu.
    Signal { sig: Signal, vm: &'static str },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Signal {
    Stop,
    Cont,
    Kill,
}

fn vm_name(s: &str, roles: &[&'static str]) -> Result<&'static str, String> {
    roles
        .iter()
        .find(|r| **r == s)
        .copied()
        .ok_or_else(|| format!("no VM `{s}` in this run (VMs: {})", roles.join(", ")))
}

/// Parses one request line against the run's VMs (`a`, `b`, or `single`).
pub(super) fn parse(line: &str, roles: &[&'static str]) -> Result<Fault, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["link", state, rest @ ..] => {
            let up = match *state {
                "on" => true,
                "off" => false,
                s => return Err(format!("link takes on or off, not `{s}`")),
            };
            if roles.len() < 2 {
                return Err("link needs two VMs (--hosts 2)".into());
            }
            let vms = match rest {
                [] => roles.to_vec(),
                [vm] => vec![vm_name(vm, roles)?],
                _ => return Err(format!("link {state} takes at most one VM")),
            };
            Ok(Fault::Link { up, vms })
        }
        [action @ ("stop" | "cont" | "kill"), vm] => Ok(Fault::Signal {
            sig: match *action {
                "stop" => Signal::Stop,
                "cont" => Signal::Cont,
                _ => Signal::Kill,
            },
            vm: vm_name(vm, roles)?,
        }),
        _ => Err(format!(
            "unknown request `{}` (link off|on [a|b], stop|cont|kill a|b)",
            line.trim()
        )),
    }
}

/// The requests waiting in `share`: (name, request line), oldest name first.
pub(super) fn pending(share: &Path) -> Vec<(String, String)> {
    let Ok(entries) = fs::read_dir(share) else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let tag = name.strip_prefix(REQ)?.to_owned();
            let text = fs::read_to_string(e.path()).ok()?;
            let _ = fs::remove_file(e.path());
            Some((tag, text.trim().to_owned()))
        })
        .collect();
    out.sort();
    out
}

/// Writes the answer to request `tag` (atomically: the guest polls for the name).
pub(super) fn answer(share: &Path, tag: &str, result: &Result<(), String>) {
    let text = match result {
        Ok(()) => "ok\n".to_owned(),
        Err(e) => format!("error: {e}\n"),
    };
    let tmp = share.join(format!(".ack.{tag}"));
    if fs::write(&tmp, text).is_ok() {
        let _ = fs::rename(&tmp, share.join(format!("{ACK}{tag}")));
    }
}

/// The QMP socket of a VM's qemu.
pub(super) fn qmp_path(share: &Path, role: &str) -> PathBuf {
    share.join(format!("qmp.{role}.sock"))
}

/// `set_link` of netdev `n0` through a qemu's QMP socket: done once qemu has answered.
pub(super) fn set_link(sock: &Path, up: bool) -> Result<(), String> {
    let s = UnixStream::connect(sock)
        .map_err(|e| format!("cannot reach qemu's QMP socket {}: {e}", sock.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(s).lines();
    // QMP: a greeting, then one JSON object per line; events may come between the answers.
    let answer = |lines: &mut std::io::Lines<BufReader<UnixStream>>| loop {
        let line = lines
            .next()
            .ok_or("qemu closed its QMP socket")?
            .map_err(|e| format!("qemu's QMP socket: {e}"))?;
        if line.contains("\"return\"") {
            return Ok(());
        }
        if line.contains("\"error\"") {
            return Err(format!("qemu: {line}"));
        }
    };
    let greeting = lines
        .next()
        .ok_or("no QMP greeting")?
        .map_err(|e| format!("qemu's QMP socket: {e}"))?;
    if !greeting.contains("\"QMP\"") {
        return Err(format!("not a QMP greeting: {greeting}"));
    }
    w.write_all(b"{\"execute\": \"qmp_capabilities\"}\n")
        .map_err(|e| e.to_string())?;
    answer(&mut lines)?;
    let cmd = format!(
        "{{\"execute\": \"set_link\", \"arguments\": {{\"name\": \"n0\", \"up\": {up}}}}}\n"
    );
    w.write_all(cmd.as_bytes()).map_err(|e| e.to_string())?;
    answer(&mut lines)
}

/// `kill(pid, sig)` through the `kill` program (xtask has no libc dependency).
pub(super) fn signal(pid: u32, sig: Signal) -> Result<(), String> {
    let name = match sig {
        Signal::Stop => "STOP",
        Signal::Cont => "CONT",
        Signal::Kill => "KILL",
    };
    let st = std::process::Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .status()
        .map_err(|e| format!("cannot run kill: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("kill -s {name} {pid} failed ({st})"))
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, Fault, Signal};

    #[test]
    fn requests() {
        let two = ["a", "b"];
        assert_eq!(
            parse("link off", &two),
            Ok(Fault::Link {
                up: false,
                vms: vec!["a", "b"]
            })
        );
        assert_eq!(
            parse(" link on b\n", &two),
            Ok(Fault::Link {
                up: true,
                vms: vec!["b"]
            })
        );
        assert_eq!(
            parse("kill a", &two),
            Ok(Fault::Signal {
                sig: Signal::Kill,
                vm: "a"
            })
        );
        assert!(parse("kill c", &two).is_err());
        assert!(parse("link off", &["single"]).is_err());
        assert!(parse("link sideways", &two).is_err());
        assert!(parse("stop", &two).is_err());
        assert!(parse("reboot a", &two).is_err());
    }
}
