//! `cargo xtask demo`: the echo server and client (`examples/echo_*.rs`, the async `evchan`
//! API) on a device, the soft-RoCE VM or natively on a host with an ACTIVE RDMA port, against
//! rdma-core's `ib_send_lat -R -e` with the same message size in the same boot: interleaved
//! rounds (the tool, then ours), and the medians of their round-trip p50 and p99 side by side.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::bench_tools::parse::send_lat_result;
use crate::bench_tools::report::median;
use crate::cargo::cargo;
use crate::{host_has_active_rdma_port, setup, vm, Result};

const USAGE: &str = "usage: cargo xtask demo [--vm] [--addr IP:PORT] [--connections N] \
                     [--messages M] [--size BYTES] [--rounds R] | demo --core [--vm]";

/// What the demo runs: the client's load and the number of interleaved rounds.
#[derive(Debug, Clone, PartialEq)]
struct Load {
    addr: String,
    connections: u32,
    messages: u32,
    size: u32,
    rounds: u32,
}

/// `cargo xtask demo [--vm] [--addr IP:PORT] [--connections N] [--messages M] [--size BYTES]
/// [--rounds R]`, or `--core` for the core layer's resolve-only smoke run (`examples/demo.rs`).
pub fn run(args: &[String]) -> Result<i32> {
    if args.iter().any(|a| a == "--core") {
        let rest: Vec<String> = args.iter().filter(|a| *a != "--core").cloned().collect();
        return crate::test::demo(&rest);
    }
    let (force_vm, load) = parse_args(args)?;
    let native = !force_vm && host_has_active_rdma_port();
    setup::ensure()?;
    let ok = cargo(&[
        "build",
        "--release",
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
    let dir = crate::target_dir().join("release/examples");
    let line = script(
        &dir.join("echo_server").display().to_string(),
        &dir.join("echo_client").display().to_string(),
        &load,
    );
    let mut figures = Figures::new(load.size);
    let code = if native {
        println!("demo: natively, on this host's RDMA device ({})", load.addr);
        let mut child = Command::new("sh")
            .args(["-c", &line])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run sh: {e}"))?;
        if let Some(out) = child.stdout.take() {
            for l in BufReader::new(out).lines().map_while(std::io::Result::ok) {
                figures.line(&l);
            }
        }
        let st = child.wait().map_err(|e| format!("waiting for sh: {e}"))?;
        st.code().unwrap_or(1)
    } else {
        println!(
            "demo: in the soft-RoCE VM (qemu TCG: its absolute times are slow; the ratio to \
             the C tool in the same boot is the figure)"
        );
        let job = vm::Job {
            command: line,
            timeout: Duration::from_secs(600),
            ..crate::job()
        };
        vm::run(&job, &mut |l| figures.line(l))?.code
    };
    match figures.summary(&load) {
        Ok(text) => print!("{text}"),
        Err(missing) => {
            println!("demo: no figure of {missing} (the output above says why)");
            return Ok(if code == 0 { 1 } else { code });
        }
    }
    Ok(code)
}

fn parse_args(args: &[String]) -> Result<(bool, Load)> {
    let mut force_vm = false;
    let mut load = Load {
        addr: "169.254.77.1:7471".to_owned(),
        connections: 1,
        messages: 1000,
        size: 64,
        rounds: 3,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("demo: {a} needs a value\n{USAGE}"));
        let number = |v: &String| match v.parse::<u32>() {
            Ok(0) => Err(format!("demo: {a} must be at least 1")),
            Ok(n) => Ok(n),
            Err(e) => Err(format!("demo: {a}: {e}")),
        };
        match a.as_str() {
            "--vm" => force_vm = true,
            "--addr" => load.addr = value()?.clone(),
            "--connections" => load.connections = number(value()?)?,
            "--messages" => load.messages = number(value()?)?,
            "--size" => load.size = number(value()?)?,
            "--rounds" => load.rounds = number(value()?)?,
            other => return Err(format!("demo: unknown option `{other}`\n{USAGE}")),
        }
    }
    if load.addr.parse::<std::net::SocketAddr>().is_err() {
        return Err(format!("demo: --addr must be IP:PORT, not `{}`", load.addr));
    }
    Ok((force_vm, load))
}

/// The shell script: each round `ib_send_lat -R -e` (server in the background, the client
/// retried while nobody listens yet), then the echo pair; a marker line before each says what
/// the lines after it are. Exits with 0 only if every run succeeded.
fn script(server: &str, client: &str, load: &Load) -> String {
    let q = |s: &str| vm::shell_join(&[s.to_owned()]);
    let ip = load.addr.rsplit_once(':').map_or("", |(ip, _)| ip);
    let ip = ip.trim_start_matches('[').trim_end_matches(']');
    let Load {
        connections: c,
        messages: m,
        size,
        rounds,
        ..
    } = load;
    format!(
        "status=0\n\
         for r in $(seq 1 {rounds}); do\n\
         \x20 echo \"@@demo round=$r tool\"\n\
         \x20 for try in 1 2 3 4 5; do\n\
         \x20   timeout 300 ib_send_lat -R -e -s {size} -n {m} -F >/dev/null 2>&1 & s=$!\n\
         \x20   sleep 1\n\
         \x20   out=$(timeout 300 ib_send_lat -R -e -s {size} -n {m} -F {ip} 2>&1); rc=$?\n\
         \x20   kill $s 2>/dev/null; wait $s 2>/dev/null\n\
         \x20   [ $rc = 0 ] && break\n\
         \x20 done\n\
         \x20 echo \"$out\"; [ $rc = 0 ] || status=1\n\
         \x20 echo \"@@demo round=$r ours\"\n\
         \x20 {server} --addr {addr} --exit-after {served} --max-message {max} & s=$!\n\
         \x20 {client} --addr {addr} --warm-up --connections {c} --messages {m} --size {size}; rc=$?\n\
         \x20 [ $rc = 0 ] || kill $s; wait $s || status=1; [ $rc = 0 ] || status=1\n\
         done\n\
         exit $status\n",
        ip = q(ip),
        server = q(server),
        client = q(client),
        addr = q(&load.addr),
        max = size.max(&4096),
        served = c + 1,
    )
}

/// What the rounds printed: each round's figures, by side.
#[derive(Debug, Default)]
struct Figures {
    /// `tool`, `ours`, or nothing yet: whose lines these are.
    section: Option<&'static str>,
    /// `ib_send_lat`'s round-trip (p50, p99), µs, one per round.
    tool: Vec<(f64, f64)>,
    /// The tool's output of the current round, printed only if it had no result line.
    tool_out: Vec<String>,
    /// The echo client's round-trip (p50, p99), µs, one per round.
    ours: Vec<(f64, f64)>,
    /// The echo client's median setup per connection, ms, one per round.
    setup_ms: Vec<f64>,
    /// The echo client's messages/s, one per round.
    rate: Vec<f64>,
    /// The message size: `ib_send_lat`'s result line begins with it.
    size: u32,
}

impl Figures {
    fn new(size: u32) -> Self {
        Figures {
            size,
            ..Figures::default()
        }
    }

    /// Reads (and shows) one line of the run's output: the echo pair's lines as they are,
    /// `ib_send_lat`'s as one line of its figures (all of them if it printed none).
    fn line(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix("@@demo round=") {
            self.end_tool();
            let (round, side) = rest.split_once(' ').unwrap_or((rest, ""));
            self.section = match side {
                "tool" => Some("tool"),
                _ => Some("ours"),
            };
            if side == "tool" {
                println!("round {round}:");
            }
            return;
        }
        match self.section {
            Some("tool") => {
                if let Some((p50, p99)) = send_lat_result(line, self.size) {
                    println!("  ib_send_lat -R -e: round-trip p50 {p50:.1} µs, p99 {p99:.1} µs");
                    self.tool.push((p50, p99));
                    self.tool_out.clear();
                    self.section = Some("tool done");
                } else {
                    self.tool_out.push(line.to_owned());
                }
            }
            // The rest of the tool's output.
            Some("tool done") => {}
            Some(_) => {
                println!("  {line}");
                if let Some(p50) = number_after(line, "latency p50 ") {
                    if let Some(p99) = number_after(line, ", p99 ") {
                        self.ours.push((p50, p99));
                    }
                }
                if line.contains("setup per connection: ") {
                    if let Some(median) = number_after(line, "median ") {
                        self.setup_ms.push(median);
                    }
                }
                if let Some((rate, _)) = line
                    .strip_prefix("echo_client: ")
                    .and_then(|l| l.split_once(" messages/s echoed"))
                {
                    if let Ok(r) = rate.parse() {
                        self.rate.push(r);
                    }
                }
            }
            None => println!("{line}"),
        }
    }

    /// A tool's section ended: if it printed no result line, shows what it printed.
    fn end_tool(&mut self) {
        if self.section == Some("tool") {
            for l in self.tool_out.drain(..) {
                println!("  ib_send_lat: {l}");
            }
        }
        self.section = None;
    }

    /// The aligned comparison, or which figure is missing.
    fn summary(&mut self, load: &Load) -> std::result::Result<String, &'static str> {
        self.end_tool();
        let side = |v: &[(f64, f64)]| {
            let p50: Vec<f64> = v.iter().map(|f| f.0).collect();
            let p99: Vec<f64> = v.iter().map(|f| f.1).collect();
            median(&p50).zip(median(&p99))
        };
        let (tool50, tool99) = side(&self.tool).ok_or("ib_send_lat -R -e")?;
        let (ours50, ours99) = side(&self.ours).ok_or("the echo client's round trips")?;
        let setup = median(&self.setup_ms).ok_or("the echo client's connection setup")?;
        let rate = median(&self.rate).ok_or("the echo client's messages/s")?;
        let conns = if load.connections == 1 {
            "1 connection".to_owned()
        } else {
            format!(
                "{} connections at once (ib_send_lat runs one: the ratio also counts their \
                 sharing of the CPUs)",
                load.connections
            )
        };
        Ok(format!(
            "\n{size}-byte round trips in event mode, one message in flight, {conns}; medians \
             of {n} interleaved rounds of {m} in one boot:\n\
             \x20                     p50           p99\n\
             \x20 evchan Connection  {ours50:>9.1} µs  {ours99:>9.1} µs\n\
             \x20 ib_send_lat -R -e  {tool50:>9.1} µs  {tool99:>9.1} µs\n\
             \x20 ratio              {r50:>9.2}     {r99:>9.2}\n\
             connection setup (connect to ESTABLISHED, evchan's runtime started by a warm-up \
             connection): median {setup:.2} ms; \
             {rate:.0} messages/s echoed\n",
            size = load.size,
            n = self.ours.len().min(self.tool.len()),
            m = load.messages,
            r50 = ours50 / tool50,
            r99 = ours99 / tool99,
        ))
    }
}

/// The number right after `key` in `line` (up to a space or a comma).
fn number_after(line: &str, key: &str) -> Option<f64> {
    let (_, rest) = line.split_once(key)?;
    rest.split([' ', ',']).next().and_then(|t| t.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load() -> Load {
        parse_args(&[]).expect("the defaults parse").1
    }

    #[test]
    fn options_and_their_errors() {
        let (vm, l) = parse_args(&["--vm".into(), "--size".into(), "4096".into()]).unwrap();
        assert!(vm);
        assert_eq!((l.size, l.connections, l.rounds), (4096, 1, 3));
        assert!(parse_args(&["--size".into(), "0".into()])
            .unwrap_err()
            .contains("at least 1"));
        assert!(parse_args(&["--rounds".into()])
            .unwrap_err()
            .contains("needs a value"));
        assert!(parse_args(&["--addr".into(), "10.0.0.1".into()])
            .unwrap_err()
            .contains("IP:PORT"));
        assert!(parse_args(&["--fast".into()])
            .unwrap_err()
            .contains("unknown option"));
    }

    /// The lines as `ib_send_lat` 4.5 and examples/echo_client.rs print them.
    #[test]
    fn reads_both_sides_and_compares_medians() {
        let mut f = Figures::new(64);
        for (tool, ours) in [("81.00", "174.0"), ("90.00", "200.0"), ("70.00", "150.0")] {
            for l in [
                "@@demo round=1 tool".to_owned(),
                " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ".to_owned(),
                format!(" 64       1000          50.10          900.00       {tool}        \t88.00      \t-nan   \t\t175.50 \t\t800.00"),
                "@@demo round=1 ours".to_owned(),
                "echo_client: 1 connections to 169.254.77.1:7471, setup per connection: min 2.00 ms, median 2.50 ms, max 3.00 ms".to_owned(),
                format!("echo_client: round-trip latency p50 {ours} µs, p99 445.0 µs, p99.9 900.1 µs (min 90.0 µs, max 1200.0 µs)"),
                "echo_client: 5700 messages/s echoed (1 connections, one message in flight each)".to_owned(),
            ] {
                f.line(&l);
            }
        }
        assert_eq!(f.tool, vec![(162.0, 351.0), (180.0, 351.0), (140.0, 351.0)]);
        assert_eq!(f.ours.len(), 3);
        let text = f.summary(&load()).unwrap();
        assert!(
            text.contains("evchan Connection      174.0 µs      445.0 µs"),
            "{text}"
        );
        assert!(
            text.contains("ib_send_lat -R -e      162.0 µs      351.0 µs"),
            "{text}"
        );
        assert!(
            text.contains("ratio                   1.07          1.27"),
            "{text}"
        );
        assert!(
            text.contains("connection): median 2.50 ms; 5700 messages/s"),
            "{text}"
        );
    }

    #[test]
    fn a_missing_side_is_named() {
        let mut f = Figures::new(64);
        f.line("@@demo round=1 tool");
        f.line("Couldn't connect to 169.254.77.1:18515");
        f.line("@@demo round=1 ours");
        assert_eq!(f.summary(&load()).unwrap_err(), "ib_send_lat -R -e");
    }

    #[test]
    fn the_script_is_valid_sh() {
        let s = script("/x/echo_server", "/x/echo_client", &load());
        assert!(
            s.contains("ib_send_lat -R -e -s 64 -n 1000 -F 169.254.77.1"),
            "{s}"
        );
        let st = Command::new("sh").args(["-n", "-c", &s]).status().unwrap();
        assert!(st.success());
    }
}
