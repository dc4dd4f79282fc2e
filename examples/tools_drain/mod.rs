//! The `drain` and `spin` layers of `tools_events` (`examples/tools_events.rs`).
//!
//! `drain`: the retrieval of CM events alone, apart from their generation. N threads, each with
//! its own event channel and C ÷ N ids (the first C mod N threads one more), in R rounds
//! (`--rounds`, default 32). Each round, untimed, each thread creates its ids and calls
//! `rdma_resolve_addr` on each toward `--addr` (the VM's own address); then it waits until its
//! C ÷ N `ADDR_RESOLVED` events are all queued on its channel (the witness, below); then a
//! barrier releases all threads at once and each reads its events with `try_get_event`,
//! checks each is `ADDR_RESOLVED` with status 0 for an id of its own, and acks it. The round's
//! time runs from the earliest thread's release to the latest thread's last ack; after a second
//! barrier, untimed, the ids are destroyed. One more round comes first and is left out of every
//! figure: a warm-up (in a TCG guest the first run of a code path is translated first; the first
//! `drain` run of a boot once measured 41 000 events/s against the next one's 68 000). A read
//! that finds no event waits in `poll` on the channel (`get_event_timeout`) and is counted:
//! `waits=K` in the result line, 0 when every read found its event already queued, which is
//! what this layer means to time. events/s = C × R ÷
//! the sum of the rounds' times. Also printed, to tell a lack of CPUs from costlier reads: the
//! threads' time on a CPU (`cpu_s`) and runnable but waiting for one (`runq_s`) from just before
//! the barrier to their last ack, summed over threads and rounds, as the kernel the program runs
//! on counts them (`/proc/thread-self/schedstat`; in a TCG guest, time the host takes a vCPU's
//! thread away counts as on a CPU).
//!
//! `spin`: no RDMA, the yardstick for `drain`: how much faster N threads get through a fixed
//! amount of pure computation than one, on the same machine at the same time. C units of work
//! (each [`SPIN_STEPS`] steps of a xorshift generator: about 14 µs in our VM on a quiet host,
//! where a `drain` event took 15 to 25) split over N threads as `drain` splits its events, R
//! rounds after a warm-up round as in `drain`, each started by a barrier and timed from the
//! earliest thread's release to the latest thread's end; units/s = C × R ÷ the sum of the
//! rounds' times. The threads share no data, so its N ÷ 1 ratio is the
//! parallelism the CPUs gave, the ceiling of `drain`'s. `cpu_s` and `runq_s` as in `drain`: when
//! they grow with N here as much as in `drain`, what grew was not the cost of a read.
//!
//! The witness: after its last `rdma_resolve_addr`, each thread resolves one more id, on a second
//! channel of its own, and waits for that id's event there before the barrier. The kernel
//! completes address resolution on ib_addr's ordered workqueue (`addr_wq`, one item at a time, in
//! the order queued; `drivers/infiniband/core/addr.c`), and a request to an address of a local
//! device resolves at once and is queued without delay; the completion handler queues the
//! `ADDR_RESOLVED` on the id's channel before it returns (`cma.c`'s `addr_handler`, `ucma.c`'s
//! `ucma_event_handler`). So once the witness's event has arrived, every request the thread made
//! before it has been handled and its event is queued. A fixed sleep would only make that
//! likely; the witness makes it sure for this address, and `waits=` shows it held (a request
//! that needed a neighbour lookup would be re-queued with a delay and overtaken: it would show as
//! waits; so would a kernel whose `addr_wq` is not ordered, as a proposed patch would make it).
//! The witness's own read, on its own channel, is not timed and not counted; reading it
//! also makes librdmacm open the device and its PD (`ucma_get_device`) before the first timed
//! read.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::tools_support::{emit, fail};
use crate::PROGRAM;

/// How long a `drain` thread waits for one event (the witness's, or one that a read did not
/// find queued) before it gives up.
const DRAIN_PATIENCE: Duration = Duration::from_secs(10);

/// One `drain` thread's round: when it was released, when it had acked its last event, how
/// many of its reads found no event and waited, and the thread's scheduler figures from just
/// before the barrier to its last ack ([`SchedStat`]).
#[derive(Debug, Clone, Copy)]
struct DrainRound {
    start: Instant,
    end: Instant,
    waits: usize,
    sched: SchedStat,
}

/// The calling thread's `/proc/thread-self/schedstat`: time on a CPU and time runnable but
/// waiting for one, as the (guest's) kernel counts them. Zero where the file is missing.
#[derive(Debug, Clone, Copy, Default)]
struct SchedStat {
    on_cpu: Duration,
    runnable: Duration,
}

impl SchedStat {
    /// The figures now, after a `sched_yield`: the kernel adds a running thread's time to them
    /// only at a tick or a switch, so without the yield a thread that woke less than a tick ago
    /// (4 ms at Debian's HZ=250, longer than many rounds here) reads none of its time since.
    fn now() -> Self {
        std::thread::yield_now();
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
        let mut ns = text
            .split_whitespace()
            .map(|v| Duration::from_nanos(v.parse().unwrap_or(0)));
        Self {
            on_cpu: ns.next().unwrap_or_default(),
            runnable: ns.next().unwrap_or_default(),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            on_cpu: self.on_cpu.saturating_sub(before.on_cpu),
            runnable: self.runnable.saturating_sub(before.runnable),
        }
    }
}

/// Thread `t`'s share of `n` units split over `threads` threads.
fn share(n: usize, threads: usize, t: usize) -> usize {
    n / threads + usize::from(t < n % threads)
}

/// The rounds of all threads folded: a round lasts from its first thread's start to its last
/// thread's end; waits and scheduler figures are summed over threads and rounds.
#[derive(Debug)]
struct Rounds {
    wall: Duration,
    fastest: Duration,
    slowest: Duration,
    waits: usize,
    sched: SchedStat,
}

impl Rounds {
    /// Folds `rounds` rounds of every thread's list (each at least that long).
    fn fold(threads: &[Vec<DrainRound>], rounds: usize) -> Result<Self, String> {
        let mut all = Self {
            wall: Duration::ZERO,
            fastest: Duration::MAX,
            slowest: Duration::ZERO,
            waits: 0,
            sched: SchedStat::default(),
        };
        for round in 0..rounds {
            let of =
                |pick: fn(&DrainRound) -> Instant| threads.iter().map(move |t| pick(&t[round]));
            let start = of(|r| r.start).min().ok_or("no thread")?;
            let end = of(|r| r.end).max().ok_or("no thread")?;
            let took = end.saturating_duration_since(start);
            all.wall += took;
            all.fastest = all.fastest.min(took);
            all.slowest = all.slowest.max(took);
            for t in threads {
                all.waits += t[round].waits;
                all.sched.on_cpu += t[round].sched.on_cpu;
                all.sched.runnable += t[round].sched.runnable;
            }
        }
        Ok(all)
    }
}

/// The `drain` layer (see the file's doc).
pub(crate) fn drain(
    addr: SocketAddr,
    channels: usize,
    n: usize,
    rounds: usize,
) -> Result<(), String> {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Barrier;

    let barrier = Barrier::new(channels);
    let failed = AtomicUsize::new(usize::MAX);
    let per_thread: Vec<Result<Vec<DrainRound>, String>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..channels)
            .map(|t| {
                let share = share(n, channels, t);
                let (barrier, failed) = (&barrier, &failed);
                s.spawn(move || drain_thread(addr, share, rounds, barrier, failed))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a thread panicked".to_owned()))
            })
            .collect()
    });
    let mut threads = Vec::with_capacity(channels);
    for (t, r) in per_thread.into_iter().enumerate() {
        threads.push(r.map_err(|e| format!("drain thread {t}: {e}"))?);
    }
    let Rounds {
        wall,
        fastest,
        slowest,
        waits,
        sched,
    } = Rounds::fold(&threads, rounds)?;
    let events = n * rounds;
    emit(
        "events",
        &[
            ("layer", "drain".to_owned()),
            ("channels", channels.to_string()),
            ("conns", n.to_string()),
            ("rounds", rounds.to_string()),
            ("events", events.to_string()),
            ("wall_s", format!("{:.4}", wall.as_secs_f64())),
            ("round_min_s", format!("{:.4}", fastest.as_secs_f64())),
            ("round_max_s", format!("{:.4}", slowest.as_secs_f64())),
            (
                "events_per_s",
                format!("{:.1}", events as f64 / wall.as_secs_f64()),
            ),
            ("waits", waits.to_string()),
            ("cpu_s", format!("{:.4}", sched.on_cpu.as_secs_f64())),
            ("runq_s", format!("{:.4}", sched.runnable.as_secs_f64())),
        ],
    );
    Ok(())
}

/// One `drain` thread: `rounds` rounds of `k` ids (see the file's doc).
///
/// The threads meet at two barriers a round, and every thread leaves at the same meeting when
/// one failed before it: the failing thread writes that meeting's number into `failed` (the
/// lowest one wins) before it waits, and after each wait every thread returns if `failed` names
/// this meeting or an earlier one (a later one, written by a thread already past it, is left for
/// its own meeting), so none waits forever at a barrier the others left.
fn drain_thread(
    addr: SocketAddr,
    k: usize,
    rounds: usize,
    barrier: &std::sync::Barrier,
    failed: &std::sync::atomic::AtomicUsize,
) -> Result<Vec<DrainRound>, String> {
    use std::cell::Cell;
    use std::sync::atomic::Ordering;

    use evchan_core::EventChannel;

    let meeting = Cell::new(0usize);
    // One barrier, after a step that may have failed.
    let meet = |step: Result<(), String>| -> Result<(), String> {
        let m = meeting.get();
        meeting.set(m + 1);
        if step.is_err() {
            failed.fetch_min(m, Ordering::SeqCst);
        }
        barrier.wait();
        step?;
        if failed.load(Ordering::SeqCst) <= m {
            return Err("stopped: another thread failed".to_owned());
        }
        Ok(())
    };
    let channels = EventChannel::new()
        .and_then(|ch| Ok((ch, EventChannel::new()?)))
        .map_err(|e| e.to_string());
    let (ch, witness_ch) = match channels {
        Ok(pair) => pair,
        Err(e) => {
            // Still meets the other threads at the first barrier, where all stop.
            return meet(Err(e)).map(|()| Vec::new());
        }
    };
    let mut out = Vec::with_capacity(rounds);
    let mut keys = Vec::with_capacity(k);
    // Round 0 warms up (see the file's doc) and is left out.
    for round in 0..=rounds {
        let mut ids = Vec::with_capacity(k);
        let queued = drain_setup(&ch, &witness_ch, addr, k, &mut ids);
        keys.clear();
        let sched = SchedStat::now();
        meet(queued)?;
        // Timed: the release to the last ack.
        let start = Instant::now();
        let read = drain_read(&ch, k, &mut keys);
        let end = Instant::now();
        let sched = SchedStat::now().since(sched);
        let read = read.and_then(|waits| {
            // Each event was for an id of this thread, and no id had two.
            let mut want: Vec<_> = ids.iter().map(|id| id.key()).collect();
            want.sort_unstable();
            keys.sort_unstable();
            if keys != want {
                return Err(format!(
                    "the {k} ADDR_RESOLVED events read were not one for each of the {k} ids"
                ));
            }
            Ok(waits)
        });
        let waits = read.as_ref().copied().unwrap_or(0);
        meet(read.map(drop))?;
        if round > 0 {
            out.push(DrainRound {
                start,
                end,
                waits,
                sched,
            });
        }
        // Untimed: every event is acked, so each id is destroyed at once.
        drop(ids);
    }
    Ok(out)
}

/// A `drain` round's untimed part: `k` ids on `ch`, each resolving toward `addr`; then the
/// witness on `witness_ch`, whose `ADDR_RESOLVED` says the `k` events are queued.
fn drain_setup<'ch>(
    ch: &'ch evchan_core::EventChannel,
    witness_ch: &evchan_core::EventChannel,
    addr: SocketAddr,
    k: usize,
    ids: &mut Vec<evchan_core::CmId<'ch, evchan_core::cm::state::ResolvingAddr>>,
) -> Result<(), String> {
    use evchan_core::cm::{EventKind, PortSpace};
    use evchan_core::CmId;

    fn resolve(
        ch: &evchan_core::EventChannel,
        addr: SocketAddr,
    ) -> Result<CmId<'_, evchan_core::cm::state::ResolvingAddr>, String> {
        CmId::new(ch, PortSpace::Tcp)
            .map_err(|e| format!("rdma_create_id: {e}"))?
            .resolve_addr(None, addr, DRAIN_PATIENCE)
            .map_err(|e| format!("rdma_resolve_addr {addr}: {}", e.error))
    }
    for _ in 0..k {
        ids.push(resolve(ch, addr)?);
    }
    let witness = resolve(witness_ch, addr)?;
    let ev = witness_ch
        .get_event_timeout(DRAIN_PATIENCE)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("the witness's event did not come within {DRAIN_PATIENCE:?}"))?;
    if !ev.is_for(&witness) || ev.kind() != EventKind::AddrResolved || ev.raw_status() != 0 {
        return Err(format!(
            "the witness got {} (status {}), not its ADDR_RESOLVED",
            ev.kind().name(),
            ev.raw_status()
        ));
    }
    ev.ack();
    drop(witness);
    Ok(())
}

/// A `drain` round's timed part: reads `k` events from `ch`, each an `ADDR_RESOLVED` with
/// status 0, pushes each one's id to `keys` and acks it. Returns how many reads found no event
/// and waited in `poll`.
fn drain_read(
    ch: &evchan_core::EventChannel,
    k: usize,
    keys: &mut Vec<evchan_core::cm::IdKey>,
) -> Result<usize, String> {
    use evchan_core::cm::EventKind;

    let mut waits = 0;
    while keys.len() < k {
        let ev = match ch.try_get_event().map_err(|e| e.to_string())? {
            Some(ev) => ev,
            None => {
                waits += 1;
                ch.get_event_timeout(DRAIN_PATIENCE)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| {
                        format!(
                            "{} of {k} events read; none came within {DRAIN_PATIENCE:?}",
                            keys.len()
                        )
                    })?
            }
        };
        if ev.kind() != EventKind::AddrResolved || ev.raw_status() != 0 {
            return Err(format!(
                "{} (status {}), not ADDR_RESOLVED with status 0",
                ev.kind().name(),
                ev.raw_status()
            ));
        }
        keys.push(ev.id());
        ev.ack();
    }
    Ok(waits)
}

/// Steps of the xorshift generator in one `spin` unit of work (see the file's doc).
const SPIN_STEPS: u32 = 8000;

/// The `spin` layer (see the file's doc). It cannot fail.
pub(crate) fn spin(channels: usize, n: usize, rounds: usize) {
    let barrier = std::sync::Barrier::new(channels);
    let per_thread: Vec<Vec<DrainRound>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..channels)
            .map(|t| {
                let share = share(n, channels, t);
                let barrier = &barrier;
                s.spawn(move || {
                    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                    // Round 0 warms up, as in `drain`, and is left out.
                    let mut timed: Vec<_> = (0..=rounds)
                        .map(|_| {
                            let sched = SchedStat::now();
                            barrier.wait();
                            let start = Instant::now();
                            for _ in 0..share {
                                for _ in 0..SPIN_STEPS {
                                    state ^= state << 13;
                                    state ^= state >> 7;
                                    state ^= state << 17;
                                }
                                state = std::hint::black_box(state);
                            }
                            let end = Instant::now();
                            let sched = SchedStat::now().since(sched);
                            barrier.wait();
                            DrainRound {
                                start,
                                end,
                                waits: 0,
                                sched,
                            }
                        })
                        .collect();
                    timed.remove(0);
                    timed
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| fail(PROGRAM, "a thread panicked"))
            })
            .collect()
    });
    let Ok(Rounds { wall, sched, .. }) = Rounds::fold(&per_thread, rounds) else {
        fail(PROGRAM, "no spin thread")
    };
    let units = n * rounds;
    emit(
        "events",
        &[
            ("layer", "spin".to_owned()),
            ("channels", channels.to_string()),
            ("conns", n.to_string()),
            ("rounds", rounds.to_string()),
            ("units", units.to_string()),
            ("wall_s", format!("{:.4}", wall.as_secs_f64())),
            (
                "units_per_s",
                format!("{:.1}", units as f64 / wall.as_secs_f64()),
            ),
            ("cpu_s", format!("{:.4}", sched.on_cpu.as_secs_f64())),
            ("runq_s", format!("{:.4}", sched.runnable.as_secs_f64())),
        ],
    );
}
