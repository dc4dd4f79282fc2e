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
mod bench_scale;
mod bench_tools;
mod cargo;
mod demo;
mod fuzz;
mod setup;
mod test;

// The VM runner and the libtest reader are cargo-rxe's: `cargo xtask vm` is `cargo rxe run`.
use cargo_rxe::{libtest, vm};

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [options]

tasks:
  setup                 cargo-rxe's setup (install missing Debian packages as root, otherwise
                        print the apt-get line; fetch + unpack the VM kernel into the per-user
                        cache, ~/.cache/cargo-rxe), this project's packages (valgrind,
                        linux-perf), and `cargo install` cargo-fuzz and cargo-deny when missing
  vm [OPTS] -- CMD...   `cargo rxe run` (crates/cargo-rxe): run CMD inside a soft-RoCE VM on the
                        host's filesystem and exit with its status; `cargo xtask vm --help` lists
                        its options (--hosts 2 --server, --env, --timeout, --accel, -v, the
                        fault hooks). rxe0 sits on dummy0 with 169.254.77.1 and
                        fe80::ff:fe00:1%dummy0; EVCHAN_SELF and EVCHAN_SELF6 hold them.
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
  bench --scale [--quick]
                        many connections to one server across two VMs (server in VM a): bursts
                        of 1,000, 2,000, 5,000 and 10,000 connections (--quick: the first two),
                        64 connects in flight, each echoing one message, after `cmtime -c N` in
                        the same boot; setup rate against cmtime's, memory and descriptors per
                        connection on both sides, memory after each burst; writes its part of
                        docs/BENCHMARKS.md and docs/bench-scale.svg
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

/// A VM job's defaults for this workspace: the checkout and the target directory stay visible
/// in the guest wherever they are (under /tmp too, which the guest mounts fresh).
fn job() -> vm::Job {
    vm::Job {
        keep: vec![root(), target_dir()],
        ..vm::Job::default()
    }
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
