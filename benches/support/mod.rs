//! Shared by the benchmarks: the device check and criterion's setup.
//!
//! Every figure is a ratio: each benchmark group measures the safe layer (`evchan`) and a raw-FFI
//! baseline (`raw`) of the same work, on the same machine, in the same run. Under the VM's TCG
//! emulation absolute times mean nothing; the ratios hold. `cargo xtask bench` runs them there
//! and prints the table.

// Each benchmark uses a part of this module.
#![allow(dead_code)]

use criterion::Criterion;

/// Whether `EVCHAN_REQUIRE_DEVICE=1`: a missing device fails the benchmark instead of skipping it.
fn device_required() -> bool {
    std::env::var("EVCHAN_REQUIRE_DEVICE").is_ok_and(|v| v == "1")
}

/// `true` when an RDMA device is there. Without one: prints the skip line and returns `false`
/// (the benchmark then exits 0), or, under `EVCHAN_REQUIRE_DEVICE=1`, exits with status 1.
pub fn device_present() -> bool {
    match evchan_core::device::probe() {
        Ok(_) => true,
        Err(e) if device_required() => {
            eprintln!("EVCHAN_REQUIRE_DEVICE=1 but {e}");
            std::process::exit(1);
        }
        Err(_) => {
            eprintln!("skipping: no RDMA device (run `cargo xtask bench`)");
            false
        }
    }
}

/// Criterion, configured from the command line (`cargo bench -- --help` lists the options).
pub fn criterion() -> Criterion {
    Criterion::default().configure_from_args()
}

/// A group whose every iteration needs a slow, untimed setup (`cm_event/queued_ack`: each event
/// needs an id resolving its address first): fewer samples and a short measurement, so that the
/// untimed part stays within a minute under TCG.
pub fn slow_setup(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(500))
        .sampling_mode(criterion::SamplingMode::Flat);
}

/// The current_thread tokio runtime (I/O enabled) of the `async` variants.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a current_thread tokio runtime")
}

/// Waits (in `poll`, no timeout) until `fd` is readable: an untimed wait for an event.
pub fn wait_readable(fd: std::os::fd::BorrowedFd<'_>) {
    evchan_sys::fd::poll_readable(fd, None).expect("poll");
}

/// The callgrind mode: `EVCHAN_BENCH_OPS=FIGURE/VARIANT:N` → `(figure, variant, n)`.
pub fn ops_mode() -> Option<(String, String, u64)> {
    let spec = std::env::var("EVCHAN_BENCH_OPS").ok()?;
    let parsed = spec.split_once(':').and_then(|(name, n)| {
        let (figure, variant) = name.split_once('/')?;
        Some((figure.to_owned(), variant.to_owned(), n.parse().ok()?))
    });
    match parsed {
        Some(p) => Some(p),
        None => {
            eprintln!("EVCHAN_BENCH_OPS={spec}: expected FIGURE/VARIANT:N");
            std::process::exit(2);
        }
    }
}

/// Untimed: lets the events of the ids that were just made resolve and queue.
pub fn wait_queued() {
    std::thread::sleep(std::time::Duration::from_millis(500));
}

/// Runs `op` `n` times. Never inlined, and named for callgrind's
/// `--toggle-collect='*evchan_measured*'`: the instructions counted are those of the `n` ops.
#[inline(never)]
pub fn evchan_measured(n: u64, mut op: impl FnMut()) {
    for _ in 0..n {
        op();
    }
}

/// The paired mode: `EVCHAN_BENCH_PAIRED=FIGURE/VARIANT:BLOCK:PAIRS` → `(figure, variant, block,
/// pairs)`.
pub fn paired_mode() -> Option<(String, String, u64, usize)> {
    let spec = std::env::var("EVCHAN_BENCH_PAIRED").ok()?;
    let parsed = spec.split_once(':').and_then(|(name, rest)| {
        let (figure, variant) = name.split_once('/')?;
        let (block, pairs) = rest.split_once(':')?;
        let (block, pairs) = (block.parse().ok()?, pairs.parse().ok()?);
        (block > 0 && pairs > 0).then(|| (figure.to_owned(), variant.to_owned(), block, pairs))
    });
    match parsed {
        Some(p) => Some(p),
        None => {
            eprintln!("EVCHAN_BENCH_PAIRED={spec}: expected FIGURE/VARIANT:BLOCK:PAIRS (both > 0)");
            std::process::exit(2);
        }
    }
}

/// The paired mode's measurement: `pairs` pairs of blocks, each pair one block of `block`
/// operations of `variant` and one of the baseline (`raw`) right after each other, in turns
/// which one goes first; `run(variant, block)` makes a block's untimed setup and returns the
/// time of its operations. One untimed pair first, as a warm-up. Prints the median and quartiles
/// of the pairs' ratios (ours ÷ raw) as `@paired figure=… variant=… block=… pairs=… median=…
/// q1=… q3=…`: each ratio compares two blocks that ran within moments of each other, so a
/// drift of the machine's speed during the run (another tenant, TCG) moves both sides of it.
pub fn paired(
    figure: &str,
    variant: &str,
    block: u64,
    pairs: usize,
    mut run: impl FnMut(&str, u64) -> std::time::Duration,
) {
    let _ = (run(variant, block), run("raw", block));
    let mut ratios: Vec<f64> = (0..pairs)
        .map(|i| {
            let (ours, raw) = if i % 2 == 0 {
                let ours = run(variant, block);
                (ours, run("raw", block))
            } else {
                let raw = run("raw", block);
                (run(variant, block), raw)
            };
            ours.as_secs_f64() / raw.as_secs_f64().max(f64::MIN_POSITIVE)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    println!(
        "@paired figure={figure} variant={variant} block={block} pairs={pairs} median={:.4} \
         q1={:.4} q3={:.4}",
        at(0.5),
        at(0.25),
        at(0.75)
    );
}

/// The time `f` takes.
pub fn timed(f: impl FnOnce()) -> std::time::Duration {
    let start = std::time::Instant::now();
    f();
    start.elapsed()
}

/// Runs `op` `n` times and returns the time it took. Never inlined, so that each figure's
/// timed loop is compiled on its own, as criterion's `iter` closure is, whatever else the
/// caller holds (an inlined tight loop, e.g. the empty poll's, was compiled differently inside
/// the paired mode's large closure than in criterion's).
#[inline(never)]
pub fn timed_block(n: u64, mut op: impl FnMut()) -> std::time::Duration {
    let start = std::time::Instant::now();
    for _ in 0..n {
        op();
    }
    start.elapsed()
}
