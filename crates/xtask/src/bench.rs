//! `cargo xtask bench`: the criterion benchmarks (`benches/`), on a device, as ratios, written to
//! `docs/BENCHMARKS.md`.
//!
//! Builds the bench executables on the host (`cargo bench --no-run`, the bench profile), runs
//! them in the soft-RoCE VM (natively on a host with an ACTIVE RDMA port, unless `--vm`) with
//! options that keep a run short under TCG, then counts the instructions of each operation under
//! `valgrind --tool=callgrind` in the same boot, then times each figure's paired ratio (pairs of
//! blocks, ours and raw right after each other: `PAIRED`). From criterion's per-sample data (brought back
//! from the guest into `target/criterion/`) it computes each figure's median, its raw-FFI
//! baseline's median of the same run, their ratio and spread, prints the table and writes
//! `docs/BENCHMARKS.md` (its generated part) and `docs/bench-latency.svg`.
//!
//! `--save NAME` keeps the run as criterion's baseline NAME and its ratios in
//! `target/criterion/evchan-ratios-NAME.json`; `--compare NAME` runs against criterion's
//! baseline NAME and flags every ratio more than 5 % worse than the saved one (exit status 1).
//! A flagged ratio with a spread in both runs (a paired ratio: its pairs' quartiles; a tools
//! ratio: the least and the largest of its rounds' own ratios) also says whether this run's
//! spread lies wholly on the worse side of the saved one's (`beyond both runs' spread`) or
//! overlaps it (`within the spread`); criterion's time ratios and the instruction ratios have
//! none.
//! The ratios are, per criterion row, its time ratio, its paired ratio and its instruction
//! ratio, and the ratios of the tools run's rows (`bench_tools`; without the `spin`
//! yardstick and the 1-channel rows, whose ratio is 1 by construction). Worse is larger, but
//! for the events/s rows (n channels ÷ 1), where it is smaller. `--tools` alone saves and
//! compares the tools' ratios only. Every run is also saved as `last`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::bench_tools::ROW_PREFIX;
use crate::cargo::{executables, run_lines};
use crate::test::Place;
use crate::{host_has_active_rdma_port, target_dir, vm, Result};

mod report;
pub(crate) use report::write_scale;

use report::{Instructions, Measure, Ratios, BEYOND};

/// Criterion options for every run: short under TCG, no plots, plain text.
const CRITERION_ARGS: &[&str] = &[
    "--bench",
    "--warm-up-time",
    "1",
    "--measurement-time",
    "3",
    // Criterion's bootstrap is only its own printed interval (the table uses the samples'
    // medians); under TCG its 100 000 sorts would take longer than the measurements.
    "--nresamples",
    "1000",
    "--noplot",
    "--color",
    "never",
];

/// The baseline's name in every group (`<group>/raw`).
pub(crate) const BASELINE: &str = "raw";

/// A ratio this much worse than the saved one is flagged by `--compare`.
pub(crate) const WORSE: f64 = 1.05;

/// The operations counted under callgrind: (bench executable, figure, variants, operations).
/// Every variant's count is divided by its operations; each figure's `raw` is its baseline.
const CALLGRIND: &[(&str, &str, &[&str], u64)] = &[
    ("cm_event", "resolve_addr", &["evchan", "async", "raw"], 100),
    ("cm_event", "queued_ack", &["evchan", "async", "raw"], 200),
    ("cm_event", "empty_read", &["evchan", "raw"], 5000),
    (
        "cq_event",
        "send_completion",
        &["evchan", "async", "raw"],
        200,
    ),
    ("cq_event", "poll_empty", &["evchan", "raw"], 20000),
];

/// The paired ratios (`EVCHAN_BENCH_PAIRED`, `benches/support`'s `paired`): (bench executable,
/// figure, variant, operations per block, pairs of blocks). Each pair times a block of the
/// variant and one of `raw` right after each other, so a drift of the machine's speed during the
/// run moves both sides of each ratio.
const PAIRED: &[(&str, &str, &str, u64, usize)] = &[
    ("cm_event", "resolve_addr", "evchan", 20, 30),
    ("cm_event", "resolve_addr", "async", 20, 30),
    ("cm_event", "queued_ack", "evchan", 100, 40),
    ("cm_event", "queued_ack", "async", 100, 40),
    ("cm_event", "empty_read", "evchan", 2000, 30),
    ("cq_event", "send_completion", "evchan", 100, 30),
    ("cq_event", "send_completion", "async", 100, 30),
    ("cq_event", "poll_empty", "evchan", 20000, 30),
];

/// What the command line asked for.
#[derive(Debug, Default, PartialEq)]
struct Options {
    force_vm: bool,
    save: Option<String>,
    compare: Option<String>,
    callgrind: bool,
    /// Also the comparisons with rdma-core's tools (not with `--no-tools` or criterion ARGS).
    tools: bool,
    /// Only the comparisons with rdma-core's tools (`--tools`), shorter with `--quick`.
    tools_only: bool,
    /// Only the many-connections run (`--scale`), shorter with `--quick`.
    scale: bool,
    quick: bool,
    criterion: Vec<String>,
}

fn options(args: &[String]) -> Result<Options> {
    let mut o = Options {
        callgrind: true,
        tools: true,
        ..Options::default()
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut name = |opt: &str| -> Result<String> {
            let n = it
                .next()
                .ok_or_else(|| format!("bench: {opt} needs a NAME"))?;
            if n.is_empty()
                || !n
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(format!(
                    "bench: {opt} {n}: a NAME of letters, digits, - _ ."
                ));
            }
            Ok(n.clone())
        };
        match a.as_str() {
            "--vm" => o.force_vm = true,
            "--no-callgrind" => o.callgrind = false,
            "--no-tools" => o.tools = false,
            "--tools" => o.tools_only = true,
            "--scale" => o.scale = true,
            "--quick" => o.quick = true,
            "--save" => o.save = Some(name("--save")?),
            "--compare" => o.compare = Some(name("--compare")?),
            "--" => {
                o.criterion = it.by_ref().cloned().collect();
                break;
            }
            other => {
                return Err(format!(
                    "bench: unknown option `{other}` (see `cargo xtask --help`)"
                ))
            }
        }
    }
    if o.tools_only && (!o.tools || !o.criterion.is_empty()) {
        return Err(
            "bench: --tools runs only the tools, without criterion's ARGS or --no-tools".into(),
        );
    }
    if o.scale
        && (o.tools_only
            || !o.tools
            || !o.criterion.is_empty()
            || o.save.is_some()
            || o.compare.is_some()
            || o.force_vm
            || !o.callgrind)
    {
        return Err("bench: --scale runs alone (with --quick at most)".into());
    }
    if o.quick && !o.tools_only && !o.scale {
        return Err("bench: --quick goes with --tools or --scale".into());
    }
    if !o.criterion.is_empty() {
        o.tools = false;
    }
    if o.save.is_some() && o.compare.is_some() {
        return Err("bench: --save and --compare are one or the other".into());
    }
    Ok(o)
}

/// The tools run's tracked ratios, among a run's.
fn add_tools(ratios: &mut Ratios, tools: &[crate::bench_tools::ToolRatio]) {
    for t in tools {
        let m = if t.higher_is_better {
            Measure::Rate
        } else {
            Measure::Tools
        };
        ratios.push_spread(&t.name, m, t.ratio, t.spread);
    }
}

/// `--compare` and `--save` of a run's ratios (`saved`: the compared run's, loaded before the
/// run so that a wrong NAME fails at once); the run is also saved as `last`. The flagged
/// measures (`ROW (MEASURE)`), empty without `--compare`.
fn track(
    ratios: &Ratios,
    home: &Path,
    opts: &Options,
    saved: Option<&Ratios>,
) -> Result<Vec<String>> {
    let mut worse = Vec::new();
    if let (Some(name), Some(saved)) = (&opts.compare, saved) {
        let (text, flagged) = ratios.compare(saved, name);
        print!("{text}");
        worse = flagged;
    }
    if let Some(name) = &opts.save {
        let path = ratios.save(home, name)?;
        println!("ratios saved to {}", path.display());
    }
    ratios.save(home, "last")?;
    Ok(worse)
}

/// The compared run's saved ratios, where `--compare` names one.
fn saved(home: &Path, opts: &Options) -> Result<Option<Ratios>> {
    opts.compare
        .as_deref()
        .map(|name| Ratios::load(home, name))
        .transpose()
}

/// `cargo xtask bench --tools [--quick] [--save NAME | --compare NAME]`: the comparisons with
/// rdma-core's tools (`bench_tools`) alone, in a VM boot of their own, written into their part
/// of docs/BENCHMARKS.md; only their ratios are saved or compared.
fn tools_alone(opts: &Options) -> Result<i32> {
    let home = target_dir().join("criterion");
    let saved = saved(&home, opts)?;
    let (section, tools) = crate::bench_tools::run(opts.quick)?;
    let mut ratios = Ratios::default();
    add_tools(&mut ratios, &tools);
    let worse = track(&ratios, &home, opts, saved.as_ref())?;
    write_tools_section(&section, opts, &worse)?;
    Ok(i32::from(flagged(opts, &worse)))
}

/// Writes the tools' section into docs/BENCHMARKS.md, with the outcome of `--compare` for its
/// rows.
fn write_tools_section(section: &str, opts: &Options, worse: &[String]) -> Result<()> {
    let mut section = section.trim_end().to_owned();
    if let Some(name) = &opts.compare {
        let tools: Vec<String> = worse
            .iter()
            .filter(|w| w.starts_with(ROW_PREFIX))
            .cloned()
            .collect();
        section.push_str("\n\n");
        section.push_str(&report::compared_line(name, &tools));
    }
    report::write_tools(&crate::root().join("docs").join("BENCHMARKS.md"), &section)?;
    crate::bench_tools::readme::write(&crate::root())?;
    println!(
        "wrote the comparisons with rdma-core's tools into docs/BENCHMARKS.md, and their \
         figures table into README.md"
    );
    Ok(())
}

/// Says so on stderr when `--compare` flagged ratios; whether it did.
fn flagged(opts: &Options, worse: &[String]) -> bool {
    if !worse.is_empty() {
        let beyond = worse
            .iter()
            .filter(|w| w.ends_with(&format!("{BEYOND})")))
            .count();
        eprintln!(
            "xtask: {} ratio(s) more than 5 % worse than saved run {} ({beyond} of them beyond \
             both runs' spread): {}",
            worse.len(),
            opts.compare.as_deref().unwrap_or_default(),
            worse.join("; ")
        );
    }
    !worse.is_empty()
}

/// `cargo xtask bench [--vm] [--save NAME | --compare NAME] [--no-callgrind] [--no-tools]
/// [-- ARGS...]`, or `cargo xtask bench --tools [--quick] [--save NAME | --compare NAME]`
pub fn run(args: &[String]) -> Result<i32> {
    let started = Instant::now();
    if args == ["--readme"] {
        crate::bench_tools::readme::write(&crate::root())?;
        println!("wrote README.md's figures table from docs/BENCHMARKS.md");
        return Ok(0);
    }
    let opts = options(args)?;
    if opts.scale {
        return crate::bench_scale::run(opts.quick);
    }
    if opts.tools_only {
        return tools_alone(&opts);
    }
    let home = target_dir().join("criterion");
    let saved = saved(&home, &opts)?;
    if let (Some(name), Some(saved)) = (&opts.compare, &saved) {
        if !saved.has_criterion_rows() {
            return Err(format!(
                "bench: saved run {name} holds the tools' ratios only (`--tools --save {name}`), \
                 and criterion has no baseline {name}: compare it with `cargo xtask bench \
                 --tools --compare {name}`"
            ));
        }
    }
    let place = if !opts.force_vm && host_has_active_rdma_port() {
        Place::Native
    } else {
        Place::Vm
    };
    let benches: Vec<_> = executables(&["bench", "--workspace", "--benches"], "bench", "")?
        .into_iter()
        .map(|a| (a.name, a.exe))
        .collect();
    if benches.is_empty() {
        return Err("no bench executables found (benches/*.rs)".into());
    }
    let mut criterion: Vec<String> = CRITERION_ARGS.iter().map(|s| (*s).to_owned()).collect();
    if let Some(n) = &opts.save {
        criterion.extend(["--save-baseline".to_owned(), n.clone()]);
    }
    if let Some(n) = &opts.compare {
        criterion.extend(["--baseline".to_owned(), n.clone()]);
    }
    criterion.extend(opts.criterion.iter().cloned());
    let callgrind: Vec<(PathBuf, &str, &str, u64)> = if opts.callgrind {
        CALLGRIND
            .iter()
            .filter_map(|(bench, fig, variants, n)| {
                let exe = &benches.iter().find(|(b, _)| b == bench)?.1;
                Some(variants.iter().map(move |v| (exe.clone(), *fig, *v, *n)))
            })
            .flatten()
            .collect()
    } else {
        Vec::new()
    };

    let mut extra = String::new();
    for (bench, figure, variant, block, pairs) in PAIRED {
        if let Some((_, exe)) = benches.iter().find(|(b, _)| b == bench) {
            extra.push_str(&paired_lines(exe, figure, variant, *block, *pairs));
        }
    }
    let load_start = load_average();
    let mut counts = Instructions::default();
    let watch = Watch::start(usize::from(place == Place::Vm));
    let ran = match place {
        Place::Vm => in_vm(&benches, &criterion, &callgrind, &extra, &home, &mut counts),
        Place::Native => native(&benches, &criterion, &callgrind, &extra, &home, &mut counts),
    };
    let busy = watch.stop();
    let ok = ran?;

    let where_ = match place {
        Place::Vm => format!(
            "in the soft-RoCE VM (qemu TCG, {} vCPUs, Debian kernel, rdma_rxe)",
            std::env::var("EVCHAN_VM_SMP").unwrap_or_else(|_| "2".into())
        ),
        Place::Native => "on this host's RDMA device".to_owned(),
    };
    let figures = report::figures(&home)?;
    let mut ratios = Ratios::of(&figures, &counts);
    let table = report::table(&figures, &counts);
    println!();
    println!("benchmarks {where_} (medians of criterion's samples):");
    print!("{table}");
    let took = started.elapsed();
    println!("(cargo xtask bench took {:.0} s)", took.as_secs_f64());
    let mut warnings = Vec::new();
    let load_end = load_average();
    if load_start.max(load_end) > 1.5 {
        warnings.push(format!(
            "the host's load average (1 min) was {load_start:.1} at the start and {load_end:.1} \
             at the end of the run, on {} CPUs",
            std::thread::available_parallelism().map_or(0, usize::from)
        ));
    }
    if busy > 0 {
        warnings.push(format!(
            "for {busy} s of the run, other work (another VM, a compiler) shared this host's \
             CPUs: the two sides of a ratio may have run under different loads"
        ));
    }

    // The tools run before the ratios are compared and saved, so that its ratios are among
    // them; a failure of it is returned once criterion's part is written.
    let tools = opts.tools.then(|| crate::bench_tools::run(false));
    if let Some(Ok((_, t))) = &tools {
        add_tools(&mut ratios, t);
    }
    let worse = track(&ratios, &home, &opts, saved.as_ref())?;
    let run = report::Run {
        where_: where_.clone(),
        criterion: criterion.join(" "),
        took,
        warnings: warnings.clone(),
        compared: opts.compare.clone().map(|n| {
            let own = worse.iter().filter(|w| !w.starts_with(ROW_PREFIX)).cloned();
            (n, own.collect())
        }),
    };
    let docs = crate::root().join("docs");
    report::write_markdown(&docs.join("BENCHMARKS.md"), &run, &figures, &counts)?;
    report::write_svg(&docs.join("bench-latency.svg"), &figures)?;
    println!("wrote docs/BENCHMARKS.md and docs/bench-latency.svg");
    for w in &warnings {
        println!("warning: {w}; rerun on an idle host");
    }
    match tools {
        Some(Ok((section, _))) => write_tools_section(&section, &opts, &worse)?,
        Some(Err(e)) => return Err(e),
        None => {}
    }

    let complete = report::complete(&figures);
    if !ok {
        eprintln!("xtask: a benchmark failed (see above)");
    }
    if !complete {
        eprintln!("xtask: a group has no `{BASELINE}` baseline or no samples were read");
    }
    let flagged = flagged(&opts, &worse);
    Ok(i32::from(!(ok && complete && !flagged)))
}

/// The shell lines that run one operation under callgrind and print its count between markers
/// (`@@callgrind FIGURE/VARIANT N`, then callgrind's `Collected : COUNT`).
fn callgrind_lines(exe: &Path, figure: &str, variant: &str, n: u64, out: &str) -> String {
    let exe = vm::shell_join(&[exe.display().to_string()]);
    format!(
        "echo '@@callgrind {figure}/{variant} {n}'\n\
         EVCHAN_BENCH_OPS='{figure}/{variant}:{n}' timeout 900 valgrind --tool=callgrind \
         --collect-atstart=no --toggle-collect='*evchan_measured*' \
         --callgrind-out-file={out} {exe} 2>&1 | grep -E 'Collected|panicked|Error' \
         || {{ echo '@@callgrind-failed {figure}/{variant}'; status=1; }}\n"
    )
}

/// The shell lines that run one figure's paired mode and print its `@paired` line (a run that
/// prints none prints `@@paired-failed FIGURE/VARIANT` and fails the script).
fn paired_lines(exe: &Path, figure: &str, variant: &str, block: u64, pairs: usize) -> String {
    let exe = vm::shell_join(&[exe.display().to_string()]);
    format!(
        "out=$(EVCHAN_BENCH_PAIRED='{figure}/{variant}:{block}:{pairs}' timeout 600 {exe} 2>&1)\n\
         echo \"$out\" | grep -E '@paired|panicked'\n\
         echo \"$out\" | grep -q '^@paired ' \
         || {{ echo '@@paired-failed {figure}/{variant}'; status=1; }}\n"
    )
}

/// Every bench executable, then every callgrind count, then the paired ratios (`extra`, shell
/// lines), in one VM boot, with
/// `EVCHAN_REQUIRE_DEVICE=1`; criterion's directory travels in (for `--baseline`) and back.
fn in_vm(
    benches: &[(String, PathBuf)],
    criterion: &[String],
    callgrind: &[(PathBuf, &str, &str, u64)],
    extra: &str,
    home: &Path,
    counts: &mut Instructions,
) -> Result<bool> {
    // The host's filesystem is read-only in the guest: criterion writes its data to a tmpfs
    // (`/tmp`, unless the checkout lives there), seeded with the host's target/criterion.
    let mut script = String::from(
        "status=0\n\
         for d in /tmp /var/tmp /dev/shm /run; do\n\
         \x20   mkdir -p \"$d/evchan-criterion\" 2>/dev/null && : >\"$d/evchan-criterion/rc\" 2>/dev/null &&\n\
         \x20       { export CRITERION_HOME=\"$d/evchan-criterion\"; break; }\n\
         done\n\
         [ -n \"$CRITERION_HOME\" ] || { echo 'no writable directory for criterion'; exit 125; }\n\
         rm -f \"$CRITERION_HOME/rc\"\n",
    );
    let home_s = vm::shell_join(&[home.display().to_string()]);
    let _ = writeln!(
        script,
        "[ -d {home_s} ] && cp -a {home_s}/. \"$CRITERION_HOME/\"\n\
         mkdir -p \"$CRITERION_HOME/.rc\""
    );
    for (name, exe) in benches {
        let mut argv = vec![exe.display().to_string()];
        argv.extend(criterion.iter().cloned());
        // Through `cat`: criterion sees no terminal and prints plain lines, no overwrites.
        let _ = writeln!(
            script,
            "echo '==> {name}'\n\
             ( timeout 900 {}; echo $? >\"$CRITERION_HOME/.rc/rc\" ) 2>&1 | cat\n\
             rc=$(cat \"$CRITERION_HOME/.rc/rc\")\n\
             [ \"$rc\" = 0 ] || {{ echo \"==> {name} exited with $rc\"; status=1; }}",
            vm::shell_join(&argv)
        );
    }
    for (exe, figure, variant, n) in callgrind {
        script.push_str(&callgrind_lines(
            exe,
            figure,
            variant,
            *n,
            "\"$CRITERION_HOME/.rc/callgrind.out\"",
        ));
    }
    script.push_str(extra);
    script.push_str(
        "rm -rf \"$CRITERION_HOME/.rc\"\n\
         echo '@@criterion-begin'\n\
         tar -C \"$CRITERION_HOME\" -czf - . | base64\n\
         echo '@@criterion-end'\n\
         exit $status\n",
    );
    let job = vm::Job {
        command: script,
        env: vec![("EVCHAN_REQUIRE_DEVICE".into(), "1".into())],
        timeout: Duration::from_secs(2400),
        ..crate::job()
    };
    let mut archive: Option<String> = None;
    let mut complete_archive = false;
    let outcome = vm::run(&job, &mut |line| {
        if line == "@@criterion-begin" {
            archive = Some(String::new());
            return;
        }
        if line == "@@criterion-end" {
            complete_archive = archive.is_some();
            return;
        }
        if let (Some(a), false) = (archive.as_mut(), complete_archive) {
            a.push_str(line.trim());
            return;
        }
        println!("{line}");
        counts.add_line(line);
    })?;
    match archive {
        Some(a) if complete_archive => unpack(&a, home)?,
        _ => eprintln!("xtask: criterion's data did not come back from the guest"),
    }
    Ok(outcome.code == 0)
}

/// Replaces `home` with the base64 tar.gz of criterion's directory that the guest printed.
fn unpack(base64: &str, home: &Path) -> Result<()> {
    let tmp = home.with_extension("incoming");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let archive = tmp.join("criterion.tgz.b64");
    std::fs::write(&archive, base64).map_err(|e| format!("{}: {e}", archive.display()))?;
    let sh = format!(
        "base64 -d {a} | tar -C {t} -xzf - && rm {a}",
        a = vm::shell_join(&[archive.display().to_string()]),
        t = vm::shell_join(&[tmp.display().to_string()])
    );
    let ok = Command::new("sh")
        .args(["-c", &sh])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Err("cannot unpack criterion's data from the guest (base64 -d | tar)".into());
    }
    let _ = std::fs::remove_dir_all(home);
    std::fs::rename(&tmp, home).map_err(|e| format!("{}: {e}", home.display()))
}

/// Every bench executable on this host, one after the other, with `EVCHAN_REQUIRE_DEVICE=1`,
/// then the callgrind counts, then the paired ratios (`extra`, shell lines).
fn native(
    benches: &[(String, PathBuf)],
    criterion: &[String],
    callgrind: &[(PathBuf, &str, &str, u64)],
    extra: &str,
    home: &Path,
    counts: &mut Instructions,
) -> Result<bool> {
    let mut ok = true;
    for (name, exe) in benches {
        println!("==> {name}");
        let mut cmd = Command::new(exe);
        cmd.args(criterion)
            .env("EVCHAN_REQUIRE_DEVICE", "1")
            .env("CRITERION_HOME", home);
        if !run_lines(&mut cmd, &mut |line| println!("{line}"))? {
            println!("==> {name} failed");
            ok = false;
        }
    }
    let out = home.join("callgrind.out");
    let mut script = String::from("status=0\n");
    for (exe, figure, variant, n) in callgrind {
        script.push_str(&callgrind_lines(
            exe,
            figure,
            variant,
            *n,
            &vm::shell_join(&[out.display().to_string()]),
        ));
    }
    script.push_str(extra);
    script.push_str("exit $status\n");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]).env("EVCHAN_REQUIRE_DEVICE", "1");
    ok &= run_lines(&mut cmd, &mut |line| {
        println!("{line}");
        counts.add_line(line);
    })?;
    let _ = std::fs::remove_file(out);
    Ok(ok)
}

/// Watches the host while the benchmarks run, once a second: another VM or a compiler beside
/// them takes CPU time that TCG (or a native run) needs, at different times for the two sides of
/// a ratio. Counts the seconds in which any ran.
struct Watch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Watch {
    /// Starts watching; `own_vms` qemu processes are the run's own.
    fn start(own_vms: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut busy = 0;
            while !flag.load(Ordering::Acquire) {
                let (vms, compilers) = others();
                if vms > own_vms || compilers > 0 {
                    busy += 1;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            busy
        });
        Watch { stop, thread }
    }

    /// Stops watching; the seconds in which other work ran.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or(0)
    }
}

/// The host's load average over the last minute (`/proc/loadavg`), 0 when unreadable.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// How many qemu system emulators and compilers (rustc) run on this host now (`/proc/*/comm`).
fn others() -> (usize, usize) {
    let (mut vms, mut compilers) = (0, 0);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        match comm.trim_end() {
            c if c.starts_with("qemu-system") => vms += 1,
            "rustc" => compilers += 1,
            _ => {}
        }
    }
    (vms, compilers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let a = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let o = options(&a(&["--vm", "--save", "base-1", "--", "poll"])).unwrap();
        assert!(o.force_vm && o.callgrind);
        assert_eq!(o.save.as_deref(), Some("base-1"));
        assert_eq!(o.criterion, a(&["poll"]));
        assert!(options(&a(&["--save", "x", "--compare", "y"])).is_err());
        assert!(options(&a(&["--compare"])).is_err());
        assert!(options(&a(&["--save", "../x"])).is_err());
        assert!(!options(&a(&["--no-callgrind"])).unwrap().callgrind);
        assert!(options(&a(&["--frob"])).is_err());
        let o = options(&a(&["--tools", "--quick", "--compare", "w"])).unwrap();
        assert!(o.tools_only && o.quick);
        assert_eq!(o.compare.as_deref(), Some("w"));
        assert!(
            options(&a(&["--quick"])).is_err(),
            "--quick without --tools"
        );
        assert!(options(&a(&["--tools", "--no-tools"])).is_err());
        assert!(options(&a(&["--tools", "--", "poll"])).is_err());
    }

    #[test]
    fn tools_ratios_are_tracked_with_their_direction() {
        use crate::bench_tools::ToolRatio;
        let t = |name: &str, ratio: f64, higher_is_better: bool| ToolRatio {
            name: name.into(),
            ratio,
            higher_is_better,
            spread: Some((ratio * 0.9, ratio * 1.1)),
        };
        let mut saved = Ratios::default();
        add_tools(
            &mut saved,
            &[
                t("tools: setup", 0.8, false),
                t("tools: 4 ch", 1.4, true),
                t("tools: rtt", 1.0, false),
            ],
        );
        let mut now = Ratios::default();
        add_tools(
            &mut now,
            &[
                t("tools: setup", 0.9, false),
                t("tools: 4 ch", 1.6, true),
                t("tools: rtt", 1.5, false),
            ],
        );
        let (text, worse) = now.compare(&saved, "s");
        assert_eq!(
            worse,
            vec![
                "tools: setup (ratio, within the spread)".to_owned(),
                format!("tools: rtt (ratio{BEYOND})"),
            ],
            "{text}"
        );
        let beyond = worse.iter().filter(|w| w.ends_with(&format!("{BEYOND})")));
        assert_eq!(beyond.count(), 1, "as `flagged` counts them");
    }
}
