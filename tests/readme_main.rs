//! The README's async example as a newcomer first runs it: on a machine without an RDMA
//! device its `main` returns the error, and Rust prints that through `Debug`, which must
//! carry the message and its help.

use std::process::Command;

/// The README's block that `tests/bin/readme_echo.rs` holds.
fn readme_block() -> &'static str {
    let readme = include_str!("../README.md");
    let start = readme
        .find("```rust,no_run\nuse evchan::{Config, Connection, Listener};")
        .expect("the README's async example")
        + "```rust,no_run\n".len();
    let len = readme[start..].find("```\n").expect("the block's end");
    &readme[start..start + len]
}

#[test]
fn the_program_is_the_readme_example() {
    let program = include_str!("bin/readme_echo.rs");
    assert!(
        program.ends_with(readme_block()),
        "tests/bin/readme_echo.rs must end with the README's async example, verbatim"
    );
}

#[test]
fn without_a_device_main_prints_the_help() {
    if evchan_core::device::probe().is_ok() {
        eprintln!(
            "skipping without_a_device_main_prints_the_help: this machine has an RDMA device \
             (the example would run)"
        );
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_readme_echo"))
        .output()
        .expect("the README's example runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("Error: no RDMA device: "),
        "main's error, as Rust prints it: {stderr}"
    );
    assert!(stderr.contains("To get one: "), "{stderr}");
    assert!(stderr.contains("caused by: "), "{stderr}");
    assert!(!stderr.contains("NoDevice {"), "{stderr}");
}
