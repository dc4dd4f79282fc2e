//! Which of the shard's wake sources a turn looks at.
//!
//! Each source (the CM channel, the completion channels, the command channel, …) is polled
//! with a waker of its own, which marks the source due and then wakes the shard's task. A turn
//! polls only the sources marked since they last returned `Pending`: one that returned
//! `Pending` holds its own waker, so it is looked at again only once that waker fired. Before
//! this, every turn polled every source and registered the task's waker with each (a lock and
//! a compare per source), whichever one had woken it.
//!
//! The rule that keeps a wake-up from being lost: a source's mark is taken off only for a
//! poll with its own waker that returned `Pending`; a source that returned `Ready`, or that
//! the turn did not poll, keeps its mark. The task's waker is stored before the marks are
//! taken, so a source that fires after that wakes the task as it is now.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Wake, Waker};

/// What the source wakers share: the marks, and the shard task's waker.
#[derive(Debug)]
struct Shared {
    due: AtomicU32,
    task: Mutex<Option<Waker>>,
}

/// One source's waker.
#[derive(Debug)]
struct SourceWaker {
    shared: Arc<Shared>,
    bit: u32,
}

impl Wake for SourceWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.shared.due.fetch_or(self.bit, Ordering::AcqRel);
        // Woken after the lock is let go: a thread's unpark is a system call, and another
        // source may fire meanwhile from another thread.
        let task = self
            .shared
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(w) = task {
            w.wake();
        }
    }
}

/// The marks of up to 32 sources, and their wakers.
#[derive(Debug)]
pub(super) struct Sources {
    shared: Arc<Shared>,
    wakers: Vec<Waker>,
    /// The task's waker last stored in `shared` (compared without the lock).
    task: Option<Waker>,
}

impl Sources {
    /// `n` sources (at most 32), every one of them due: the first turn polls them all.
    pub(super) fn new(n: usize) -> Self {
        assert!(n <= 32, "at most 32 wake sources");
        let all = if n == 32 { u32::MAX } else { (1 << n) - 1 };
        let shared = Arc::new(Shared {
            due: AtomicU32::new(all),
            task: Mutex::new(None),
        });
        let wakers = (0..n)
            .map(|k| {
                Waker::from(Arc::new(SourceWaker {
                    shared: Arc::clone(&shared),
                    bit: 1 << k,
                }))
            })
            .collect();
        Self {
            shared,
            wakers,
            task: None,
        }
    }

    /// Stores the task's waker of `cx` (when it changed), then takes the marks: the sources to
    /// poll in this turn, as bits (`1 << source`). Every source taken must be polled with
    /// [`waker`](Self::waker) and return `Pending`, or be given back with [`keep`](Self::keep).
    pub(super) fn take(&mut self, cx: &Context<'_>) -> u32 {
        if !self.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            let w = cx.waker().clone();
            *self
                .shared
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(w.clone());
            self.task = Some(w);
        }
        self.shared.due.swap(0, Ordering::AcqRel)
    }

    /// Marks the sources of `bits` due again: found ready, not polled, or changed (a timer
    /// reset).
    pub(super) fn keep(&self, bits: u32) {
        if bits != 0 {
            self.shared.due.fetch_or(bits, Ordering::AcqRel);
        }
    }

    /// The waker to poll source `k` with.
    pub(super) fn waker(&self, k: usize) -> &Waker {
        &self.wakers[k]
    }
}

#[cfg(test)]
mod tests {
    use super::Sources;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};

    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_source_is_due_until_polled_pending_and_again_once_its_waker_fires() {
        let count = Arc::new(Count::default());
        let task = Waker::from(Arc::clone(&count));
        let cx = Context::from_waker(&task);
        let mut s = Sources::new(3);
        assert_eq!(s.take(&cx), 0b111, "the first turn polls every source");
        // Source 0 was ready, source 2 was not polled: both stay due; source 1 is registered.
        s.keep(0b101);
        assert_eq!(s.take(&cx), 0b101);
        assert_eq!(s.take(&cx), 0, "all three polled pending");
        s.waker(1).wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the task was woken");
        assert_eq!(s.take(&cx), 0b010);
        // A new task waker is the one a source wakes from then on.
        let other = Arc::new(Count::default());
        let task2 = Waker::from(Arc::clone(&other));
        let cx2 = Context::from_waker(&task2);
        assert_eq!(s.take(&cx2), 0);
        s.waker(2).wake_by_ref();
        assert_eq!(other.0.load(Ordering::SeqCst), 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(s.take(&cx2), 0b100);
    }
}
