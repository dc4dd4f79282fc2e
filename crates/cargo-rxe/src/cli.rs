//! The command line of `cargo rxe`.

use crate::Result;

/// `cargo rxe --help`.
pub const USAGE: &str = "\
usage: cargo rxe <command> [options]

Runs programs and tests in a soft-RoCE VM: Debian's kernel under qemu with rdma_rxe, on this
host's filesystem (read-only, so binaries built here run unchanged there).

commands:
  test [RXE OPTS] [CARGO TEST OPTS] [FILTER] [-- TEST ARGS]
                        build the tests on the host (`cargo test --no-run` with the cargo
                        options: -p, --workspace, --features, a filter, ...), list each binary's
                        tests, run the binaries in one VM boot, each in its package's directory
                        with the TEST ARGS and --show-output, and end with one line
                        `N passed, N failed, N skipped`. A test that prints
                        `skipping <test>: <reason>` counts as skipped; one that never reports
                        (crash, hang, VM failure) as failed. Exit status 0 only when none failed,
                        every binary exited 0 and at least one test passed. A FILTER before `--`
                        narrows the tests as `cargo test FILTER` does. Doc-tests are not run.
      --timeout SECS    each binary's bound (default 600)
  run [RXE OPTS] [--hosts 2 --server SHELLCMD] -- CMD...
                        run CMD in the VM and exit with its status
      --hosts 2         two VMs joined by a virtual wire: --server's shell command runs in VM a,
                        CMD (the client) in VM b once a cm_id listens in VM a
      --timeout SECS    kill the VM(s) after SECS (default 1200) and fail with the console's tail
  setup                 install the missing Debian packages (as root; otherwise print the
                        apt-get line) and fetch the VM kernel into $XDG_CACHE_HOME/cargo-rxe
                        (~/.cache/cargo-rxe); `test` and `run` do it when something is missing

RXE OPTS (test and run):
      --env K=V         a variable for the guest (repeatable); RXE_*, EVCHAN_* and RUST_*
                        variables of this environment pass by themselves
      --accel tcg|kvm   qemu's accelerator (default tcg: KVM guests hang at start on some hosts)
      --console, -v     print the guest's boot console too (`run` takes -v, `test` --console)

in the guest:
  one VM                rxe0 on dummy0: 169.254.77.1 and fe80::ff:fe00:1%dummy0 (RXE_SELF,
                        RXE_SELF6); 127.0.0.1 does not reach rxe
  two VMs               rxe0 on eth0: fe80::ff:fe00:a%eth0 (VM a) and fe80::ff:fe00:b%eth0
                        (VM b) in RXE_SELF / RXE_PEER
  always                2 vCPUs (1 each of two VMs), 1 GiB, `ulimit -l unlimited`, root, a fresh
                        writable tmpfs on /tmp /run /var/tmp /dev/shm (the working directory and
                        the test binaries stay visible under it), CARGO_RXE=1,
                        EVCHAN_REQUIRE_DEVICE=1 under `test`
  fault hooks           `rxe-fault link off|on [a|b]` cuts or restores the wire,
                        `rxe-fault stop|cont|kill a|b` stops, continues or kills a VM's qemu
";

/// `cargo-rxe`'s `main`: `args` without the program name. Cargo runs a subcommand as
/// `cargo-rxe rxe ARGS`; `cargo-rxe ARGS` works too.
pub fn main(args: &[String]) -> Result<i32> {
    let args = match args.split_first() {
        Some((first, rest)) if first == "rxe" => rest,
        _ => args,
    };
    let Some((command, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return Ok(2);
    };
    match command.as_str() {
        "test" => crate::suite::cli(rest),
        "run" => crate::vm::cli(rest),
        "setup" => crate::setup::run(rest).map(|()| 0),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(0)
        }
        "-V" | "--version" => {
            println!("cargo-rxe {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
        other => Err(format!(
            "unknown command `{other}` (test, run, setup; see --help)"
        )),
    }
}
