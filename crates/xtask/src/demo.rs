//! `cargo xtask demo`: the echo server and client (`examples/echo_*.rs`, the async `evchan`
//! API) on a device: the soft-RoCE VM, or natively on a host with an ACTIVE RDMA port.

use std::time::Duration;

use crate::cargo::cargo;
use crate::{host_has_active_rdma_port, setup, vm, Result};

const USAGE: &str = "usage: cargo xtask demo [--vm] [--addr IP:PORT] [--connections N] \
                     [--messages M] [--size BYTES] | demo --core [--vm]";

/// `cargo xtask demo [--vm] [--addr IP:PORT] [--connections N] [--messages M] [--size BYTES]`,
/// or `--core` for the core layer's resolve-only smoke run (`examples/demo.rs`).
pub fn run(args: &[String]) -> Result<i32> {
    if args.iter().any(|a| a == "--core") {
        let rest: Vec<String> = args.iter().filter(|a| *a != "--core").cloned().collect();
        return crate::test::demo(&rest);
    }
    let mut force_vm = false;
    let mut addr = "169.254.77.1:7471".to_owned();
    let (mut connections, mut messages, mut size) = (4u32, 250u32, 64u32);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("demo: {a} needs a value\n{USAGE}"));
        let number = |v: &String| v.parse::<u32>().map_err(|e| format!("demo: {a}: {e}"));
        match a.as_str() {
            "--vm" => force_vm = true,
            "--addr" => addr = value()?.clone(),
            "--connections" => connections = number(value()?)?,
            "--messages" => messages = number(value()?)?,
            "--size" => size = number(value()?)?,
            other => return Err(format!("demo: unknown option `{other}`\n{USAGE}")),
        }
    }
    let native = !force_vm && host_has_active_rdma_port();
    setup::ensure()?;
    let ok = cargo(&[
        "build",
        "--quiet",
        "--example",
        "echo_server",
        "--example",
        "echo_client",
    ])
    .status()
    .is_ok_and(|s| s.success());
    if !ok {
        return Err("building examples/echo_server.rs and echo_client.rs failed".into());
    }
    let dir = crate::target_dir().join("debug/examples");
    let (server, client) = (dir.join("echo_server"), dir.join("echo_client"));
    let q = |s: &str| vm::shell_join(&[s.to_owned()]);
    // The server serves exactly the client's connections and exits; if the client fails, the
    // server is stopped so the run ends. Exits with 0 only if both succeeded.
    let line = format!(
        "{server} --addr {addr} --exit-after {connections} --max-message {max} & s=$!; \
         {client} --addr {addr} --connections {connections} --messages {messages} --size {size}; \
         c=$?; [ $c -eq 0 ] || kill $s; wait $s; w=$?; [ $c -eq 0 ] && [ $w -eq 0 ]",
        server = q(&server.display().to_string()),
        client = q(&client.display().to_string()),
        addr = q(&addr),
        max = size.max(4096),
    );
    if native {
        println!("demo: natively, on this host's RDMA device ({addr})");
        let st = std::process::Command::new("sh")
            .args(["-c", &line])
            .status()
            .map_err(|e| format!("cannot run sh: {e}"))?;
        return Ok(st.code().unwrap_or(1));
    }
    println!("demo: in the soft-RoCE VM (TCG: absolute times are meaningless there)");
    let job = vm::Job {
        command: line,
        timeout: Duration::from_secs(300),
        ..vm::Job::default()
    };
    Ok(vm::run(&job, &mut |l| println!("{l}"))?.code)
}
