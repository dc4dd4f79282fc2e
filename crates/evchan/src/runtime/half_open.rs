//! The bound on a listener's half-open connections: requests waiting for the application's
//! answer, and accepted ones waiting for `ESTABLISHED`. Each holds a [`HalfOpen`] ticket, taken
//! when its `CONNECT_REQUEST` arrives and given back when it is established or goes; a request
//! that finds every ticket taken is rejected at once. Each such connection also has a deadline,
//! `Config::connect_timeout` from the request and again from the accept, so a peer that never
//! completes its side holds a ticket for at most twice that, and the QP and slots made at the
//! accept for at most once that (plus the drain of a connection that failed, 15 s at most).
//!
//! The same counter bounds a listener's connections (`Config::max_connections`): a ticket
//! taken at the request and held by the connection until it is released; and, with weighted
//! tickets, their buffers (`Config::memory_budget`): each connection's ticket weighs its
//! `Config::admission_bytes`, and its data path counts the slots it holds beyond them in the
//! same count ([`crate::wire::PathBudget`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The tickets of one listener (shared by its shards: requests are migrated).
#[derive(Debug, Clone)]
pub(super) struct HalfOpenLimit {
    taken: Arc<AtomicU64>,
    max: u64,
}

/// One ticket (of some weight); dropping it gives it back.
#[derive(Debug)]
pub(super) struct HalfOpen {
    taken: Arc<AtomicU64>,
    weight: u64,
}

impl HalfOpenLimit {
    pub(super) fn new(max: impl Into<u64>) -> Self {
        Self {
            taken: Arc::new(AtomicU64::new(0)),
            max: max.into(),
        }
    }

    /// A ticket, or `None` when `max` are taken.
    pub(super) fn take(&self) -> Option<HalfOpen> {
        self.take_weighted(1)
    }

    /// A ticket of `weight`, or `None` when it would take the total beyond `max`.
    pub(super) fn take_weighted(&self, weight: u64) -> Option<HalfOpen> {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(weight).filter(|&t| t <= self.max)
            })
            .ok()
            .map(|_| HalfOpen {
                taken: self.taken.clone(),
                weight,
            })
    }

    /// The weight taken now.
    #[cfg(test)]
    pub(super) fn taken(&self) -> u64 {
        self.taken.load(Ordering::Acquire)
    }
}

impl HalfOpen {
    /// The count this ticket is part of, as the budget `max` (`Config::memory_budget`) that
    /// a connection's data path spends beyond its ticket ([`crate::wire::PathBudget`]).
    pub(super) fn budget(&self, max: u64) -> crate::wire::Budget {
        crate::wire::Budget {
            taken: Arc::clone(&self.taken),
            max,
        }
    }
}

impl Drop for HalfOpen {
    fn drop(&mut self) {
        self.taken.fetch_sub(self.weight, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_and_given_back_on_drop() {
        let limit = HalfOpenLimit::new(2u32);
        let a = limit.take().unwrap();
        let b = limit.take().unwrap();
        assert!(limit.take().is_none());
        assert_eq!(limit.taken(), 2);
        drop(a);
        let c = limit.take().unwrap();
        assert!(limit.take().is_none());
        drop((b, c));
        assert_eq!(limit.taken(), 0);
    }

    #[test]
    fn weighted_tickets_fit_within_max_exactly() {
        let limit = HalfOpenLimit::new(10u64);
        let a = limit.take_weighted(6).unwrap();
        assert!(limit.take_weighted(5).is_none());
        let b = limit.take_weighted(4).unwrap();
        assert_eq!(limit.taken(), 10);
        assert!(limit.take_weighted(1).is_none());
        drop(a);
        assert!(limit.take_weighted(7).is_none());
        let c = limit.take_weighted(6).unwrap();
        drop((b, c));
        assert_eq!(limit.taken(), 0);
        // A weight that overflows the count is refused, not wrapped.
        let huge = HalfOpenLimit::new(u64::MAX);
        let d = huge.take_weighted(u64::MAX).unwrap();
        assert!(huge.take_weighted(1).is_none());
        drop(d);
    }
}
