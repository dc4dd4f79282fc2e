//! The bound on a listener's half-open connections: requests waiting for the application's
//! answer, and accepted ones waiting for `ESTABLISHED`. Each holds a [`HalfOpen`] ticket, taken
//! when its `CONNECT_REQUEST` arrives and given back when it is established or goes; a request
//! that finds every ticket taken is rejected at once. Each such connection also has a deadline,
//! `Config::connect_timeout` from the request and again from the accept, so a peer that never
//! completes its side holds a ticket for at most twice that, and the QP and slots made at the
//! accept for at most once that (plus the drain of a connection that failed, 15 s at most).
//!
//! The same counter bounds a listener's connections (`Config::max_connections`): a ticket
//! taken at the request and held by the connection until it is released.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// The tickets of one listener (shared by its shards: requests are migrated).
#[derive(Debug, Clone)]
pub(super) struct HalfOpenLimit {
    taken: Arc<AtomicU32>,
    max: u32,
}

/// One half-open connection's ticket; dropping it gives it back.
#[derive(Debug)]
pub(super) struct HalfOpen(Arc<AtomicU32>);

impl HalfOpenLimit {
    pub(super) fn new(max: u32) -> Self {
        Self {
            taken: Arc::new(AtomicU32::new(0)),
            max,
        }
    }

    /// A ticket, or `None` when `max` are taken.
    pub(super) fn take(&self) -> Option<HalfOpen> {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| HalfOpen(self.taken.clone()))
    }

    /// Tickets taken now.
    #[cfg(test)]
    pub(super) fn taken(&self) -> u32 {
        self.taken.load(Ordering::Acquire)
    }
}

impl Drop for HalfOpen {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_and_given_back_on_drop() {
        let limit = HalfOpenLimit::new(2);
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
}
