//! Shared helpers of evchan's device tests.
//!
//! Device tests start with [`require_device!`]: without a usable RDMA device the test prints
//! `skipping <test>: <reason>` to stderr and returns, unless `EVCHAN_REQUIRE_DEVICE=1` (the VM
//! runner and CI), where it fails with the reason.
#![allow(dead_code, unused_macros)]

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Duration;

#[path = "../../../evchan-core/tests/support/cpu.rs"]
mod cpu;
#[allow(unused_imports)]
pub use cpu::thread_cpu_ticks;

/// The soft-RoCE VM's IPv4 address (on `dummy0`).
pub const VM_IPV4: Ipv4Addr = Ipv4Addr::new(169, 254, 77, 1);
/// The soft-RoCE VM's IPv6 link-local address (on `dummy0`).
pub const VM_V6: &str = "fe80::ff:fe00:1";

/// How long any one step may take before a test fails (TCG is slow).
pub const STEP: Duration = Duration::from_secs(30);

pub fn device_required() -> bool {
    std::env::var("EVCHAN_REQUIRE_DEVICE").is_ok_and(|v| v == "1")
}

pub fn probe() -> Result<Vec<String>, String> {
    init_log();
    evchan_core::device::probe().map_err(|e| e.to_string())
}

#[track_caller]
pub fn skip(reason: &str) {
    let current = std::thread::current();
    let test = current.name().unwrap_or("<unnamed test>");
    assert!(
        !device_required(),
        "{test}: EVCHAN_REQUIRE_DEVICE=1 but {reason}"
    );
    eprintln!("skipping {test}: {reason}");
}

#[macro_export]
macro_rules! require_device {
    () => {
        if let Err(reason) = $crate::support::probe() {
            $crate::support::skip(&reason);
            return;
        }
    };
}

/// `169.254.77.1:port`.
pub fn v4(port: u16) -> SocketAddr {
    SocketAddr::new(VM_IPV4.into(), port)
}

/// `[fe80::ff:fe00:1%dummy0]:port`.
pub fn v6(port: u16) -> SocketAddr {
    let scope = evchan_core::if_index("dummy0").expect("the VM's dummy0 interface");
    let ip: Ipv6Addr = VM_V6.parse().unwrap();
    SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope))
}

/// A port for one test, distinct per test binary and call.
pub fn port(n: u16) -> u16 {
    30000 + (std::process::id() % 1000) as u16 * 25 + n
}

/// `fut` within [`STEP`], or a panic naming `what`.
pub async fn step<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(STEP, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {STEP:?}"),
    }
}

/// An echo server on `addr` whose accept loop runs in a task (aborted to drop the listener):
/// each connection in a task of its own, each message sent back.
pub async fn echo_server(addr: SocketAddr, config: evchan::Config) -> tokio::task::JoinHandle<()> {
    let listener = step("bind", evchan::Listener::bind(addr, config))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok(incoming) = listener.accept().await {
            tokio::spawn(async move {
                let mut conn = incoming.accept(b"").await?;
                while let Some(m) = conn.recv().await? {
                    conn.send(m).await?;
                }
                Ok::<_, evchan::Error>(())
            });
        }
    })
}

/// Open file descriptors of this process, leaving out those open on sysfs: a thread-driven
/// runtime watches its devices' verbs nodes every 50 ms (`read_dir` of
/// `/sys/class/infiniband_verbs`, then each `ibdev`), and a count that lands inside one of
/// those reads saw one descriptor more (a soak run measured 24 after its warm-up, 23 after;
/// the listing made right after the 24 had 23 entries). evchan keeps no descriptor on sysfs,
/// so none of its own can hide there. The listing's own directory descriptor is counted, as
/// before.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(Result::ok)
        // A descriptor closed since the directory was read is not open any more.
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| !t.starts_with("/sys/")))
        .count()
}

/// Resident set size of this process, in KiB.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Where rxe0's hardware counters are.
const RXE_COUNTERS: &str = "/sys/class/infiniband/rxe0/ports/1/hw_counters";

/// rxe0's hardware counter `name` (e.g. `rcvd_rnr_err`), if the device exposes it.
pub fn rxe_counter(name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("{RXE_COUNTERS}/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// rxe0's hardware counters that are not zero, on one line (for a test that stalled).
pub fn device_counters() -> String {
    let Ok(entries) = std::fs::read_dir(RXE_COUNTERS) else {
        return format!("no {RXE_COUNTERS}\n");
    };
    let mut counters: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let v = rxe_counter(&name)?;
            (v > 0).then(|| format!("{name} {v}"))
        })
        .collect();
    counters.sort();
    format!("rxe0 counters: {}\n", counters.join(", "))
}

/// `EVCHAN_LOG=debug` (an env filter) prints the driver's tracing events to stderr.
pub fn init_log() {
    if let Ok(filter) = std::env::var("EVCHAN_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_thread_names(true)
            .try_init();
    }
}

/// rdma-core's programs as subprocesses: evchan-core's test helper, one file for both crates.
#[path = "../../../evchan-core/tests/support/tool.rs"]
pub mod tool;

pub mod raw_cm;

/// Threads of evchan's runtime (`evchan-rt`, `evchan-shard-N`) alive in this process.
pub fn evchan_threads() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .filter(|c| c.starts_with("evchan-rt") || c.starts_with("evchan-shard"))
        .collect()
}

/// Waits (at most [`STEP`]) until no evchan runtime thread is left: the runtime has shut
/// down once its last handle is gone.
#[track_caller]
pub fn wait_runtime_gone() {
    let start = std::time::Instant::now();
    loop {
        let left = evchan_threads();
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < STEP,
            "evchan's runtime threads still run {STEP:?} after the last handle went: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Makes librdmacm's own PD of the device now, once no evchan runtime runs: librdmacm 44
/// allocates one PD per device when the first id binds to it and, once the device list was
/// taken meanwhile (`rdma_get_devices`, as evchan's runtime and a local connection's context
/// do), keeps it for the rest of the process (`device_scale`'s
/// `librdmacm_keeps_its_device_pd`). A test that counts PDs before and after then counts that
/// one in both, whichever of its objects goes last.
pub fn pin_librdmacm_pd() {
    use evchan_core::verbs::Context;
    use evchan_core::EventChannel;
    wait_runtime_gone();
    let ctxs = Context::rdma_cm_devices().unwrap();
    let ch = EventChannel::new().unwrap();
    let id = bound_tcp_id(&ch);
    drop(id);
    drop(ch);
    drop(ctxs);
}

/// A TCP-port-space id on `ch`, bound to the VM's IPv4 address (any port): the first id
/// bound to a device, which makes librdmacm allocate its PD of that device.
pub fn bound_tcp_id(
    ch: &evchan_core::EventChannel,
) -> evchan_core::CmId<'_, evchan_core::cm::state::Bound> {
    evchan_core::CmId::new(ch, evchan_core::cm::PortSpace::Tcp)
        .unwrap()
        .bind(v4(0))
        .map_err(|e| e.error)
        .unwrap()
}

/// What each open file descriptor of this process points to.
pub fn fd_targets() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let t = std::fs::read_link(e.path()).ok()?;
            Some(format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                t.display()
            ))
        })
        .collect();
    v.sort();
    v
}

/// Lines of `rdma resource show <kind>` owned by user space (every entry but the kernel's own,
/// whose `comm` is bracketed, like `[ib_core]`).
///
/// [`rdma_resources`] cannot see evchan's resources: the kernel records the *thread* that
/// created a resource (`task_pid_vnr`), and evchan creates its ids, QPs, CQs, MRs and PDs on
/// its runtime threads, whose ids are not the process id (and read 0 once they have exited).
/// In the VM this test process is the only user of the device, so every user-space entry is
/// ours.
pub fn user_rdma_resources(kind: &str) -> Vec<String> {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show", kind])
        .output()
        .expect("the rdma tool (iproute2)");
    assert!(out.status.success(), "rdma resource show {kind}: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("comm ["))
        .map(str::to_owned)
        .collect()
}

/// Waits (at most 20 s) until `rdma resource show qp` lists exactly `n` user-space QPs;
/// blocking (from async code, call it in `spawn_blocking`).
#[track_caller]
pub fn qps_settle_to(n: usize, what: &str) {
    let start = std::time::Instant::now();
    loop {
        let qps = user_rdma_resources("qp");
        if qps.len() == n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}: {} QPs listed, {n} expected: {qps:#?}",
            qps.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// glibc's `malloc_trim(0)`: gives the free memory of every malloc arena back to the kernel, so
/// that [`rss_kib`] afterwards counts what is allocated rather than what glibc keeps cached
/// (each round's new threads get arenas of their own, whose cached free memory otherwise moves
/// RSS by several MiB either way).
pub fn malloc_trim() {
    evchan_sys::malloc_trim();
}

/// No transparent huge pages for this process from now on (`prctl(PR_SET_THP_DISABLE)`), so
/// that [`rss_kib`] grows by the pages touched: with THP `always` (Debian's kernel, in the VM)
/// khugepaged may fold a 2 MiB range with a few touched pages into one huge page at any time,
/// a jump of up to 2 MiB with nothing allocated (it failed core's `device_leak` once in CI).
pub fn no_huge_pages() {
    evchan_sys::disable_transparent_huge_pages().unwrap();
}

/// Raises the process's soft limit of open descriptors to its hard limit and checks that it
/// allows `want` (a connection holds none of its own since the shards share completion
/// channels; the tests that ask keep their margin).
pub fn open_files_for(want: u64) {
    let limit = evchan_sys::raise_open_files_limit().unwrap();
    assert!(
        limit >= want,
        "RLIMIT_NOFILE allows {limit} descriptors; this test needs {want} (ulimit -Hn)"
    );
}
