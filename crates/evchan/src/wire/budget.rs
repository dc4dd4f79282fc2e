//! A listener's memory budget (`Config::memory_budget`) as one of its connections spends it:
//! the slots the connection holds from its shard's pool, counted as they are taken and given
//! back.
//!
//! A connection is admitted with a ticket of [`Config::admission_bytes`](crate::Config):
//! its first receives (`recv_initial` + `ctrl_slots`), one data send and `ctrl_slots` control
//! sends. Within that many slots it takes and gives back freely; each slot beyond is charged
//! to the listener's count ([`PathBudget::take`]) and refunded when it goes back to the pool
//! or the connection is released. A slot the count has no room for is not taken: a receive
//! beyond the connection's first posted is not posted (its peer gets no credit for it: it
//! waits, as the credits say; asked again at the next arrival, consumption or completions),
//! and a message or one-sided operation waits for one of the connection's own in flight from
//! a slot to bring its slot back. Where that could wait for ever — fewer than the first
//! receives posted, no message or one-sided operation of the connection's in flight from a
//! slot — and for control messages (at most `ctrl_slots` in flight: a credit update held back
//! could keep the peer waiting until somebody reaps), the slot is taken all the same
//! ([`PathBudget::take`]'s `floor`), so a listener's count may go beyond the budget by what
//! keeps each connection moving. While it is beyond, a connection holding more than its
//! admission gives each slot it is done with back to the pool ([`PathBudget::overdrawn`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A listener's count of its connections' buffer bytes and its budget (shared with its
/// admission tickets).
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    pub(crate) taken: Arc<AtomicU64>,
    pub(crate) max: u64,
}

impl Budget {
    /// `bytes` more when they fit within the budget (or unconditionally when `force`);
    /// whether they were counted.
    fn charge(&self, bytes: u64, force: bool) -> bool {
        if force {
            self.taken.fetch_add(bytes, Ordering::Relaxed);
            return true;
        }
        self.taken
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                n.checked_add(bytes).filter(|&t| t <= self.max)
            })
            .is_ok()
    }

    fn refund(&self, bytes: u64) {
        self.taken.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// One connection's spending of its listener's [`Budget`] (module docs).
#[derive(Debug)]
pub(crate) struct PathBudget {
    budget: Budget,
    /// Bytes per slot.
    size: u64,
    /// Slots the admission ticket pays for.
    reserve: u32,
    /// Slots held from the pool now (posted, unread, in flight, spare).
    held: u32,
    /// The receives the connection keeps posted whatever the budget says (its first).
    first_recvs: u32,
}

impl PathBudget {
    /// `first_recvs`: the receives the connection posted at its setup (it holds their slots)
    /// and keeps posted; `reserve`: the slots its admission ticket pays for.
    pub(crate) fn new(budget: Budget, size: u64, first_recvs: u32, reserve: u32) -> Self {
        let b = Self {
            budget,
            size,
            reserve,
            held: first_recvs,
            first_recvs,
        };
        b.budget.charge(b.beyond(), true);
        b
    }

    /// What the slots held beyond the reserve count for.
    fn beyond(&self) -> u64 {
        u64::from(self.held.saturating_sub(self.reserve)) * self.size
    }

    /// One slot more from the pool: within the reserve, or charged when the budget has room,
    /// or charged anyway when `floor` (the connection would otherwise wait with nothing to
    /// wake it); whether it may be taken. A slot taken and then not got from the pool goes
    /// back with [`give`](Self::give).
    pub(crate) fn take(&mut self, floor: bool) -> bool {
        if self.held >= self.reserve && !self.budget.charge(self.size, floor) {
            return false;
        }
        self.held += 1;
        true
    }

    /// One slot back to the pool.
    pub(crate) fn give(&mut self) {
        debug_assert!(self.held > 0, "a slot given back that was not counted");
        if self.held > self.reserve {
            self.budget.refund(self.size);
        }
        self.held = self.held.saturating_sub(1);
    }

    /// The listener's count is beyond its budget (slots taken at the floors) and this
    /// connection holds more than its admission: a slot it is done with goes back to the pool
    /// rather than being kept (kept, it would serve the next post, and the count would stay
    /// beyond for good).
    pub(crate) fn overdrawn(&self) -> bool {
        self.held > self.reserve && self.budget.taken.load(Ordering::Relaxed) > self.budget.max
    }

    /// Slots held now (for a probe).
    pub(crate) fn held(&self) -> u32 {
        self.held
    }

    /// The receives kept posted whatever the budget says.
    pub(crate) fn first_recvs(&self) -> u32 {
        self.first_recvs
    }
}

impl Drop for PathBudget {
    /// The connection's slots beyond its reserve no longer count (the release gave them back,
    /// or the application holds them, outside the budget).
    fn drop(&mut self) {
        self.budget.refund(self.beyond());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(max: u64) -> Budget {
        Budget {
            taken: Arc::new(AtomicU64::new(0)),
            max,
        }
    }

    fn taken(b: &Budget) -> u64 {
        b.taken.load(Ordering::Relaxed)
    }

    #[test]
    fn within_the_reserve_costs_nothing_beyond_it_is_charged_and_refunded() {
        let b = budget(100);
        let mut p = PathBudget::new(b.clone(), 10, 2, 3);
        assert!(p.take(false));
        assert_eq!(taken(&b), 0, "the third slot is in the reserve");
        assert!(p.take(false));
        assert_eq!(taken(&b), 10);
        p.give();
        assert_eq!(taken(&b), 0);
        p.give();
        assert_eq!(p.held(), 2);
        assert_eq!(taken(&b), 0);
    }

    #[test]
    fn refused_when_full_unless_at_a_floor_and_drop_refunds_everything() {
        let b = budget(20);
        let mut p = PathBudget::new(b.clone(), 10, 1, 1);
        assert!(p.take(false));
        assert!(p.take(false));
        assert_eq!(taken(&b), 20);
        assert!(!p.take(false), "no room left");
        assert_eq!(p.held(), 3);
        assert!(!p.overdrawn());
        assert!(p.take(true), "a floor takes it anyway");
        assert_eq!(taken(&b), 30);
        assert!(p.overdrawn(), "beyond the budget");
        let mut q = PathBudget::new(b.clone(), 10, 0, 1);
        assert!(q.take(false), "the reserve is paid by the admission");
        assert!(!q.take(false));
        drop(p);
        assert_eq!(taken(&b), 0);
        assert!(q.take(false));
        drop(q);
        assert_eq!(taken(&b), 0);
    }

    /// One step of [`counts_stay_exact`]: connection `i` takes a slot (at a floor or not),
    /// gives one back, or is released.
    #[derive(Debug, Clone)]
    enum Op {
        Take(usize, bool),
        Give(usize),
        Release(usize),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0usize..4, proptest::bool::weighted(0.2)).prop_map(|(i, f)| Op::Take(i, f)),
            3 => (0usize..4).prop_map(Op::Give),
            1 => (0usize..4).prop_map(Op::Release),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any sequence of takes, gives and releases over four connections of one listener:
        /// the count is always the sum of what each holds beyond its reserve; a take succeeds
        /// exactly when it fits (within the reserve, in the budget's room, or at a floor), and
        /// without a floor never takes the count beyond the budget; a refused take changes
        /// nothing; a connection is overdrawn exactly when it holds beyond its reserve while
        /// the count is beyond the budget; and once every connection is released the count is
        /// back at zero.
        #[test]
        fn counts_stay_exact(
            max in 0u64..40,
            reserves in proptest::collection::vec((0u32..4, 0u32..6), 4),
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let b = budget(max);
            let mut paths: Vec<Option<PathBudget>> = reserves
                .iter()
                .map(|&(first, reserve)| Some(PathBudget::new(b.clone(), 2, first, reserve)))
                .collect();
            for op in ops {
                let before = taken(&b);
                match op {
                    Op::Take(i, floor) => {
                        if let Some(p) = paths[i].as_mut() {
                            let held = p.held;
                            // Taken whenever it fits: within the reserve, in the budget's
                            // room, or at a floor.
                            let fits = held < p.reserve || before + p.size <= max || floor;
                            let took = p.take(floor);
                            proptest::prop_assert_eq!(took, fits);
                            if took && !floor && held >= p.reserve {
                                proptest::prop_assert!(taken(&b) <= max, "beyond the budget");
                            }
                            if !took {
                                proptest::prop_assert_eq!(p.held, held);
                                proptest::prop_assert_eq!(taken(&b), before);
                            }
                        }
                    }
                    Op::Give(i) => {
                        if let Some(p) = paths[i].as_mut().filter(|p| p.held > 0) {
                            p.give();
                        }
                    }
                    Op::Release(i) => drop(paths[i].take()),
                }
                let sum: u64 = paths.iter().flatten().map(PathBudget::beyond).sum();
                proptest::prop_assert_eq!(taken(&b), sum);
                for p in paths.iter().flatten() {
                    proptest::prop_assert_eq!(p.overdrawn(), p.held > p.reserve && sum > max);
                }
            }
            paths.clear();
            proptest::prop_assert_eq!(taken(&b), 0);
        }
    }

    #[test]
    fn held_beyond_the_reserve_at_the_start_is_charged() {
        let b = budget(u64::MAX);
        let p = PathBudget::new(b.clone(), 4, 5, 2);
        assert_eq!(taken(&b), 12);
        drop(p);
        assert_eq!(taken(&b), 0);
    }
}
