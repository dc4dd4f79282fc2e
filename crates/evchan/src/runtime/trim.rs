//! Memory back to the system after a burst of connections.
//!
//! A connection's buffers are mappings of their own, unmapped when it is released
//! (`evchan_core::verbs::SlotPool`). Its smaller allocations (its state here, librdmacm's and
//! libibverbs' structures for its id, QP and CQ, tokio's for its tasks) come from the
//! allocator, and glibc keeps freed memory in its arenas: after a burst of a thousand
//! connections had closed, a process measured 15 MiB above where it started. So each runtime's
//! thread, which looks at its devices every 50 ms anyway, calls `malloc_trim(0)` once
//! connections with a data path were released in the process ([`TRIM_AFTER`] or more since its
//! last trim) and none for [`QUIET`] (to within one look), and once more as the runtime ends
//! (its last handle gone: a client whose connections all closed), after its objects are freed,
//! when that many were released while it ran and any since its last trim: once per burst and
//! runtime (a process has a runtime
//! per `Config::shards` value in use), off every connection's path. After each trim, the
//! runtime's threads give their own arenas' free tops back too ([`nudge_arena`]), which
//! `malloc_trim` does not. (The threads of the application's tokio runtime keep theirs: what
//! their tasks freed comes back to the system only when glibc trims on its own. And where
//! transparent huge pages are `always`, khugepaged may fold a trimmed range of an arena that
//! still has a page in use into one huge page again, up to 2 MiB each.)
//! Under slow churn it trims about every [`TRIM_AFTER`] releases that a second's pause
//! follows. `malloc_trim` holds each arena's lock while it walks it: an application with a
//! large heap that cannot afford that pause turns the trims (and the arenas' tops given back
//! with them) off with `EVCHAN_MALLOC_TRIM=0` in the environment (read when the runtime
//! starts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Releases since the process started, all runtimes together.
static RELEASED: AtomicU64 = AtomicU64::new(0);

/// Releases that make a trim due.
const TRIM_AFTER: u64 = 64;
/// How long no release may come before the trim.
const QUIET: Duration = Duration::from_secs(1);

/// Gives a map's room back once it is mostly empty (a map keeps its largest size: after a
/// burst, the per-connection maps would hold the burst's room for good).
pub(crate) fn shrink_if_sparse<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(
    map: &mut std::collections::HashMap<K, V, S>,
) {
    if map.capacity() > 64 && map.len() < map.capacity() / 8 {
        map.shrink_to_fit();
    }
}

/// Gives the free top of the calling thread's malloc arena back to the system
/// ([`evchan_sys::free_arena_top`]), which `malloc_trim` does not. Called on each of the
/// runtime's threads after each trim (a shard thread on the runtime thread's word,
/// [`Cmd::NudgeArena`](super::Cmd::NudgeArena)) and by a shard thread as it ends. A shard
/// thread's arena held most of what a client kept after a burst (several MiB each): its many
/// small frees had raised no trim of the top, or `malloc_trim`'s own consolidation had merged
/// them into the top without one. (The chunks a thread's cache gives back as the thread exits
/// come after its last call.)
pub(super) fn nudge_arena() {
    evchan_sys::free_arena_top();
}

/// A connection was released (its objects are gone).
pub(super) fn released() {
    RELEASED.fetch_add(1, Ordering::Relaxed);
}

/// One runtime thread's view of the releases.
pub(super) struct Trimmer {
    /// The releases counted when the runtime started.
    started: u64,
    seen: u64,
    trimmed: u64,
    changed: Instant,
}

impl Trimmer {
    /// `None` when `EVCHAN_MALLOC_TRIM=0` turns the trims off.
    pub(super) fn new() -> Option<Self> {
        if std::env::var_os("EVCHAN_MALLOC_TRIM").is_some_and(|v| v == "0") {
            return None;
        }
        Some(Self::starting())
    }

    /// A trimmer from now, whatever the environment says.
    fn starting() -> Self {
        let n = RELEASED.load(Ordering::Relaxed);
        Self {
            started: n,
            seen: n,
            trimmed: n,
            changed: Instant::now(),
        }
    }

    /// Looks at the releases, and trims when due (see the module's docs); whether it did.
    pub(super) fn tick(&mut self) -> bool {
        let n = RELEASED.load(Ordering::Relaxed);
        if n != self.seen {
            self.seen = n;
            self.changed = Instant::now();
            return false;
        }
        self.changed.elapsed() >= QUIET && self.trim_if_due(n)
    }

    /// The runtime has ended (its last handle went, its threads are done and its objects
    /// freed): trims, without waiting for [`QUIET`] since this thread does not look again,
    /// when [`TRIM_AFTER`] or more releases came while it ran and any since its last trim (one
    /// that came mid-close leaves the rest of the burst and the runtime's own objects). A
    /// client that opens and closes one connection at a time, its runtime ending with each,
    /// does not trim each time.
    pub(super) fn at_end(mut self) {
        let n = RELEASED.load(Ordering::Relaxed);
        if n.wrapping_sub(self.started) >= TRIM_AFTER && n != self.trimmed {
            self.trim(n);
        }
    }

    fn trim_if_due(&mut self, n: u64) -> bool {
        if n.wrapping_sub(self.trimmed) < TRIM_AFTER {
            return false;
        }
        self.trim(n);
        true
    }

    /// `malloc_trim`, then this thread's arena's top ([`nudge_arena`]).
    fn trim(&mut self, n: u64) {
        let released = n.wrapping_sub(self.trimmed);
        self.trimmed = n;
        #[cfg(test)]
        TRIMS.fetch_add(1, Ordering::Relaxed);
        let trimmed = evchan_sys::malloc_trim();
        nudge_arena();
        tracing::debug!(
            trimmed,
            released,
            "malloc_trim after connections were released"
        );
    }
}

/// Trims made, for the tests.
#[cfg(test)]
static TRIMS: AtomicU64 = AtomicU64::new(0);

#[cfg(test)]
mod tests {
    use super::*;

    /// The one test of this module: `RELEASED` and `TRIMS` are the process's.
    #[test]
    fn a_runtime_trims_as_it_ends_after_a_burst_not_after_one_connection() {
        let trims = || TRIMS.load(Ordering::Relaxed);
        let burst = || (0..TRIM_AFTER).for_each(|_| released());
        let before = trims();
        // One connection, its runtime ending with it: no trim.
        let t = Trimmer::starting();
        released();
        t.at_end();
        assert_eq!(trims(), before);
        // A burst with no quiet second in it: the runtime's end trims.
        let t = Trimmer::starting();
        burst();
        t.at_end();
        assert_eq!(trims(), before + 1);
        // A burst, then a quiet second: the runtime thread's look trims.
        let quiet_trim = |t: &mut Trimmer| {
            burst();
            assert!(!t.tick(), "the first look sees the releases change");
            t.changed -= QUIET;
            assert!(t.tick(), "a quiet second after the burst trims");
        };
        // Then a few more releases before the end: the end trims again; without any since,
        // it does not.
        let mut t = Trimmer::starting();
        quiet_trim(&mut t);
        assert_eq!(trims(), before + 2);
        released();
        t.at_end();
        assert_eq!(trims(), before + 3);
        let mut t = Trimmer::starting();
        quiet_trim(&mut t);
        t.at_end();
        assert_eq!(trims(), before + 4, "nothing released since the last trim");
    }
}
