//! evchan's developer tasks, run as `cargo xtask <task>`.
//!
//! - `setup`: install the Debian packages the project needs, fetch and unpack the VM's kernel.
//! - `vm`: run a command inside a soft-RoCE VM (one host, or two on a virtual wire).
//! - `test`: the whole ladder: formatting, lints, native tests, device tests in the VM.
//! - `bench`: the criterion benchmarks on a device (the VM), as ratios against raw FFI;
//!   `--tools`: against rdma-core's `cmtime` and `ib_send_lat` in one VM boot.
//! - `demo`: the async echo server and client with their figures, in the VM (or natively on an
//!   RDMA host); `--core` for the core layer's resolve-only smoke run.
//! - `fuzz`: the cargo-fuzz targets of `fuzz/`, with the address sanitizer.

mod bench;
mod bench_tools;
mod cargo;
mod demo;
mod fuzz;
mod libtest;
mod setup;
mod test;
mod vm;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [options]

tasks:
  setup                 install missing Debian packages (as root; otherwise print the apt-get
                        line), fetch + unpack the VM kernel into target/evchan-vm/, and
                        `cargo install` cargo-fuzz and cargo-deny when missing
  vm [OPTS] -- CMD...   run CMD inside a soft-RoCE VM on the host's filesystem and exit with its
                        status. rxe0 sits on dummy0 with 169.254.77.1 and fe80::ff:fe00:1%dummy0;
                        EVCHAN_SELF and EVCHAN_SELF6 hold them.
      --hosts 2         boot two VMs joined by a virtual wire (rxe0 on eth0 in each): the --server
                        command runs in VM a, CMD (the client) in VM b once a cm_id listens in a.
                        EVCHAN_SELF / EVCHAN_PEER hold the link-local addresses (fe80::ff:fe00:a
                        and fe80::ff:fe00:b, on eth0).
      --server SHELLCMD the server side's command (with --hosts 2), a shell command line
      --env K=V         set a variable for the command (repeatable); EVCHAN_* and RUST_*
                        variables of the caller are passed on by themselves
      --timeout SECS    kill the VM(s) after SECS (default 1200) and fail with the console's tail
      -v, --verbose     print the guest's boot console too
      fault hooks       inside either VM, `evchan-vm-fault link off|on [a|b]` cuts or restores
                        the wire (qemu's set_link of n0; both ends unless a VM is named),
                        `evchan-vm-fault stop|cont|kill a|b` sends SIGSTOP/SIGCONT/SIGKILL to a
                        VM's qemu; it returns once the runner has done it. A VM killed that way
                        ends without an exit status and does not fail the run: the other VM's
                        status decides. (Protocol: crates/xtask/src/vm/fault.sh)
                        (EVCHAN_VM_SMP=N sets the vCPUs per guest: 2 alone, 1 each of two)
  test [--vm]           fmt, clippy, docs, native tests, then the device tests in the VM with
                        EVCHAN_REQUIRE_DEVICE=1 (natively instead when this host has an ACTIVE
                        RDMA port, unless --vm), cargo deny, the fuzz targets briefly; ends
                        with `N passed, N failed, N skipped`, each test counted once
  test --two-hosts      only the two-VM steps: rping, then each NAME_server / NAME_client pair
                        of every tests/device_two_host*.rs in a two-VM boot of its own
  bench [--vm] [--save NAME | --compare NAME] [--no-callgrind] [--no-tools] [-- ARGS]
                        build benches/ (bench profile) and run them in the VM (natively on an
                        ACTIVE RDMA port unless --vm), then count each operation's instructions
                        under callgrind in the same boot (--no-callgrind: not). Prints each
                        figure's median against its raw-FFI baseline's and writes
                        docs/BENCHMARKS.md and docs/bench-latency.svg. --save NAME: keep the run
                        as criterion's baseline NAME, its ratios (criterion's time, paired,
                        instructions, and the tools run's) in
                        target/criterion/evchan-ratios-NAME.json; --compare NAME: compare
                        against them, flag each ratio more than 5 % worse, and exit 1 if any is.
                        ARGS go to criterion (e.g. a filter). Then, unless --no-tools or ARGS,
                        `bench --tools` below, in a VM boot of its own.
  bench --tools [--quick] [--save NAME | --compare NAME]
                        against rdma-core's tools in one VM boot: connection setup step by step
                        vs cmtime, 64 B ping-pong vs ib_send_lat -R [-e], CM events/s through
                        1, 2, 4 channels; prints a markdown section and writes it into its part
                        of docs/BENCHMARKS.md (--quick: fewer rounds); --save / --compare as
                        above, with the tools' ratios only
  bench --readme        rewrite README.md's figures table from docs/BENCHMARKS.md's tools part
                        (`bench --tools` does it after each run; a native test checks they agree)
  demo [--vm] [OPTS]    build examples/echo_server.rs and echo_client.rs (release) and run them
                        on a device (the VM unless this host has an RDMA port), each round right
                        after rdma-core's `ib_send_lat -R -e` with the same size: 3 rounds of
                        1,000 ping-pongs of 64 bytes over 1 connection; prints each side's
                        round-trip p50 and p99 (medians of the rounds) and their ratio,
                        connection setup and messages/s
      --addr IP:PORT    the server's address (default 169.254.77.1:7471, the VM's; natively,
                        an address on this host's RDMA port)
      --connections N, --messages M, --size BYTES, --rounds R   the load
  demo --core [--vm]    the core layer alone: examples/demo.rs (create a channel and an id,
                        resolve the address and the route, print the events)
  fuzz [--seconds N] [TARGET...]
                        every fuzz target (or those named: cm_event, work_completion,
                        async_event, handshake) with the address sanitizer: its committed seeds
                        and regressions, then N s of fuzzing each (default 60)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match task.as_str() {
        "setup" => setup::run(rest).map(|()| 0),
        "vm" => vm::cli(rest),
        "test" => test::run(rest),
        "bench" => bench::run(rest),
        "demo" => demo::run(rest),
        "fuzz" => fuzz::run(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(0)
        }
        other => Err(format!("unknown task `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1)),
        Err(msg) => {
            eprintln!("xtask: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// The task's error: one message that says what is wrong and how to fix it.
type Result<T, E = String> = std::result::Result<T, E>;

/// The workspace root (two levels above this crate's manifest).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/xtask sits two levels below the workspace root")
        .to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set, else `target/` in the workspace.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                root().join(dir)
            }
        }
        None => root().join("target"),
    }
}

/// Whether this process runs as root (`id -u` is 0), without any unsafe code.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Whether this host itself has an RDMA port in state ACTIVE (a real NIC or an rxe link), so
/// device tests may run natively.
fn host_has_active_rdma_port() -> bool {
    let Ok(devices) = std::fs::read_dir("/sys/class/infiniband") else {
        return false;
    };
    devices.flatten().any(|dev| {
        std::fs::read_dir(dev.path().join("ports")).is_ok_and(|ports| {
            ports.flatten().any(|p| {
                std::fs::read_to_string(p.path().join("state")).is_ok_and(|s| s.contains("ACTIVE"))
            })
        })
    })
}
