//! cargo-rxe: your Rust RDMA tests against the real kernel RDMA stack, without RDMA hardware.
//!
//! It boots Debian's kernel under qemu with `rdma_rxe` (soft-RoCE) and runs binaries built on
//! the host inside it, on the host's filesystem. The binary `cargo-rxe` is the command
//! (`cargo rxe test`, `run`, `setup`; see [`cli::USAGE`]); this library is the same runner for
//! programs that drive it themselves (evchan's `cargo xtask`):
//!
//! - [`setup`]: the Debian packages and the VM kernel, in a per-user cache;
//! - [`vm`]: boot one VM or two on a virtual wire, run a job, fault hooks;
//! - [`suite`]: test binaries run in the VM and counted test by test;
//! - [`libtest`]: reading libtest's output; [`cargo`]: finding test binaries.
//!
//! ```no_run
//! use std::time::Duration;
//! let job = cargo_rxe::vm::Job {
//!     command: "ibv_devinfo -d rxe0".into(),
//!     timeout: Duration::from_secs(120),
//!     ..Default::default()
//! };
//! let outcome = cargo_rxe::vm::run(&job, &mut |line| println!("{line}"))?;
//! assert_eq!(outcome.code, 0);
//! # Ok::<(), String>(())
//! ```

pub mod cargo;
pub mod cli;
pub mod libtest;
pub mod setup;
pub mod suite;
pub mod vm;

/// An error: one message that says what is wrong and how to fix it.
pub type Result<T, E = String> = std::result::Result<T, E>;

/// Whether this process runs as root (`Uid:` of `/proc/self/status` is 0).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}
