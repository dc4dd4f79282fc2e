//! Who waits on a connection, and whom a change wakes: the waiter bookkeeping of the data
//! path, sans-IO (no descriptors, no clock), so that a model test can drive every
//! interleaving of polls, drops and wake-ups without a device.
//!
//! A connection has four lines of waiters ([`Role`]): its receiver, its senders, its
//! closers (the application's `close` and the shard's background close) and its one-sided
//! operations. Any number of futures may wait in each: a method on `&self` (`send`) can have
//! many at once, and one waker slot per role would keep only the last waker, leaving the
//! others asleep for good.
//! So each line is a FIFO queue ([`Line`]), as tokio's `Semaphore` and `Notify` keep theirs:
//!
//! - a future takes a place ([`Place`]) the first time it has to wait, keeps it (its waker
//!   refreshed) while it waits, and leaves when it completes or is dropped;
//! - a wake takes the waker out (the place stays): a woken future that finds nothing for it
//!   waits again in the same place;
//! - senders go in turn: only the first in line (or a sender that finds nobody waiting) may
//!   post, so no sender starves; when the first leaves — done, dropped or failed — the next
//!   one is woken at once, whatever woke the first (the baton), so a wake-up is never lost
//!   with a dropped future;
//! - receivers, closers and one-sided operations are all woken by what concerns them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Wake, Waker};

/// A future's place in a [`Line`]: `None` until it first waits.
pub(crate) type Place = Option<u64>;

/// The lines of a connection's waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Recv = 0,
    Send = 1,
    Close = 2,
    /// One-sided operations: waiting for a send slot, then for their completion.
    Remote = 3,
}

impl Role {
    pub(crate) const ALL: [Role; 4] = [Role::Recv, Role::Send, Role::Close, Role::Remote];

    /// The role's bit in a mask of roles.
    pub(crate) const fn bit(self) -> u8 {
        1 << self as u8
    }
}

#[derive(Debug)]
struct Entry {
    key: u64,
    /// `None` once woken (until it waits again).
    waker: Option<Waker>,
}

/// One FIFO line of waiters.
#[derive(Debug, Default)]
pub(crate) struct Line {
    entries: VecDeque<Entry>,
    next_key: u64,
}

impl Line {
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many futures wait.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the future at `place` may go ahead: nobody waits, or it is first in line.
    pub(crate) fn is_turn(&self, place: Place) -> bool {
        match (place, self.entries.front()) {
            (_, None) => true,
            (Some(key), Some(first)) => first.key == key,
            (None, Some(_)) => false,
        }
    }

    /// The future at `place` (none yet: at the back of the line) waits, to be woken with
    /// `waker`.
    pub(crate) fn wait(&mut self, place: &mut Place, waker: &Waker) {
        if let Some(key) = *place {
            if let Some(e) = self.entries.iter_mut().find(|e| e.key == key) {
                match &e.waker {
                    Some(w) if w.will_wake(waker) => {}
                    _ => e.waker = Some(waker.clone()),
                }
                return;
            }
        }
        let key = self.next_key;
        self.next_key += 1;
        self.entries.push_back(Entry {
            key,
            waker: Some(waker.clone()),
        });
        *place = Some(key);
    }

    /// The future at `place` leaves the line (done or dropped; nothing when it had no place).
    /// When it was first, the new first is woken (its waker returned): it may go now.
    #[must_use]
    pub(crate) fn leave(&mut self, place: &mut Place) -> Option<Waker> {
        let key = place.take()?;
        let i = self.entries.iter().position(|e| e.key == key)?;
        self.entries.remove(i);
        if i == 0 {
            self.entries.front_mut().and_then(|e| e.waker.take())
        } else {
            None
        }
    }

    /// The first waiter's waker, unless it is `except` (it was woken already, or it is the
    /// caller).
    pub(crate) fn take_first(&mut self, except: Place) -> Option<Waker> {
        let first = self.entries.front_mut()?;
        if except == Some(first.key) {
            return None;
        }
        first.waker.take()
    }

    /// Every waiter's waker but `except`'s, to `out`; their places go (a line whose waiters
    /// need no order: each woken one that finds nothing waits again, at the back).
    pub(crate) fn take_all(&mut self, except: Place, mut out: impl FnMut(Waker)) {
        let spared = |e: &Entry| except == Some(e.key);
        if except.is_none() || (self.entries.len() == 1 && !spared(&self.entries[0])) {
            for e in self.entries.drain(..) {
                if let Some(w) = e.waker {
                    out(w);
                }
            }
            return;
        }
        self.entries.retain_mut(|e| {
            if except == Some(e.key) {
                return true;
            }
            if let Some(w) = e.waker.take() {
                out(w);
            }
            false
        });
    }
}

/// Wakers taken under a lock, woken after it: a few inline, the rest in a `Vec` (which
/// allocates only past them).
#[derive(Debug, Default)]
pub(crate) struct Taken {
    inline: [Option<Waker>; 4],
    len: usize,
    more: Vec<Waker>,
}

impl Taken {
    pub(crate) fn push(&mut self, w: Waker) {
        match self.inline.get_mut(self.len) {
            Some(slot) => {
                *slot = Some(w);
                self.len += 1;
            }
            None => self.more.push(w),
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0 && self.more.is_empty()
    }

    pub(crate) fn wake(self) {
        for w in self.inline.into_iter().flatten().chain(self.more) {
            w.wake();
        }
    }
}

/// The lines of a connection, shared by its futures and its CQ's readiness: as a
/// [`Waker`] (`Arc<Waiters>` is one), it wakes what any completion may concern — the
/// receiver, the first sender, every closer, every one-sided operation.
///
/// Lock order: a caller may hold the data path's lock when it calls in here, never the other
/// way round. No waker is woken under either lock: [`wake_lines`](Self::wake_lines) hands the
/// wakers to its caller, to wake once the data path's lock is let go (a waker may run code
/// that takes it: a task's last waker, dropped, may drop a received message, which gives its
/// buffer back under that lock).
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    lines: Mutex<[Line; 4]>,
    /// Which lines have waiters (a role's [`bit`](Role::bit)), changed under `lines`' lock: a
    /// wake of lines without waiters, and a sender's turn when nobody waits, take no lock.
    held: AtomicU8,
}

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, [Line; 4]> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn note(&self, lines: &[Line; 4]) {
        let held = Role::ALL
            .iter()
            .filter(|r| !lines[**r as usize].is_empty())
            .fold(0, |m, r| m | r.bit());
        self.held.store(held, Ordering::SeqCst);
    }

    /// Whether the future at `place` may go ahead in `role`'s line (nobody waits, or it is
    /// first); if not, it waits in line, to be woken with `waker`. One step, under the lock:
    /// a first that leaves meanwhile cannot miss it.
    #[inline]
    pub(crate) fn turn_or_wait(&self, role: Role, place: &mut Place, waker: &Waker) -> bool {
        if place.is_none() && self.held.load(Ordering::SeqCst) & role.bit() == 0 {
            return true;
        }
        self.turn_or_wait_locked(role, place, waker)
    }

    #[inline(never)]
    fn turn_or_wait_locked(&self, role: Role, place: &mut Place, waker: &Waker) -> bool {
        let mut lines = self.lock();
        let line = &mut lines[role as usize];
        if line.is_turn(*place) {
            return true;
        }
        line.wait(place, waker);
        self.note(&lines);
        false
    }

    /// The future at `place` waits in `role`'s line, to be woken with `waker`.
    pub(crate) fn wait(&self, role: Role, place: &mut Place, waker: &Waker) {
        let mut lines = self.lock();
        lines[role as usize].wait(place, waker);
        self.note(&lines);
    }

    /// The future at `place` leaves `role`'s line (done, failed or dropped); the next one is
    /// woken when it was first.
    #[inline]
    pub(crate) fn leave(&self, role: Role, place: &mut Place) {
        if place.is_none() {
            return;
        }
        if self.held.load(Ordering::SeqCst) & role.bit() == 0 {
            // The line is empty: a wake took the place already.
            *place = None;
            return;
        }
        self.leave_locked(role, place);
    }

    #[inline(never)]
    fn leave_locked(&self, role: Role, place: &mut Place) {
        let next = {
            let mut lines = self.lock();
            let next = lines[role as usize].leave(place);
            self.note(&lines);
            next
        };
        if let Some(w) = next {
            w.wake();
        }
    }

    /// The wakers of what concerns the lines of `mask` (bits of [`Role::bit`]), into `taken`:
    /// the receiver, the first sender, every closer, every one-sided operation; not `except`,
    /// the caller (a role and its place). The caller wakes them, after its locks.
    #[inline]
    pub(crate) fn wake_lines(&self, mask: u8, except: Option<(Role, Place)>, taken: &mut Taken) {
        if mask & self.held.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.wake_lines_locked(mask, except, taken);
    }

    #[inline(never)]
    fn wake_lines_locked(&self, mask: u8, except: Option<(Role, Place)>, taken: &mut Taken) {
        {
            let mut lines = self.lock();
            for role in Role::ALL {
                if mask & role.bit() == 0 {
                    continue;
                }
                let except = except.and_then(|(r, p)| (r == role).then_some(p).flatten());
                let line = &mut lines[role as usize];
                match role {
                    Role::Send => taken.extend(line.take_first(except)),
                    Role::Recv | Role::Close | Role::Remote => {
                        line.take_all(except, |w| taken.push(w))
                    }
                }
            }
        }
    }

    /// How many futures wait in `role`'s line.
    #[cfg(test)]
    pub(crate) fn waiting(&self, role: Role) -> usize {
        self.line_state(role).0
    }

    /// How many futures wait in `role`'s line, and how many of them hold a waker. In the
    /// senders' line a woken sender keeps its place without its waker until it is polled; in
    /// the others a woken future leaves the line (so there both counts are always equal).
    pub(crate) fn line_state(&self, role: Role) -> (usize, usize) {
        let lines = self.lock();
        let line = &lines[role as usize];
        (
            line.len(),
            line.entries.iter().filter(|e| e.waker.is_some()).count(),
        )
    }
}

impl Extend<Waker> for Taken {
    fn extend<I: IntoIterator<Item = Waker>>(&mut self, iter: I) {
        for w in iter {
            self.push(w);
        }
    }
}

/// Every line's concern: what the CQ's readiness wakes.
const ALL_LINES: u8 = Role::Recv.bit() | Role::Send.bit() | Role::Close.bit() | Role::Remote.bit();

impl Wake for Waiters {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut taken = Taken::default();
        self.wake_lines(ALL_LINES, None, &mut taken);
        taken.wake();
    }
}

#[cfg(test)]
mod tests {
    //! A model of the senders' line as the data path uses it: tasks that send one message each
    //! through a window of slots, a queue of completions that free them, and a scheduler that
    //! picks at random what happens next — a woken task polled, a task polled spuriously, a
    //! completion, a task dropped (a timeout, a `select!`). It checks that nothing is lost:
    //! every task not dropped finishes once the completions are in, the senders that waited
    //! post in the order they lined up, and at every quiet moment no sender sleeps while a slot
    //! is free.

    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    #[derive(Default)]
    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[derive(Default)]
    struct Task {
        flag: Arc<Flag>,
        place: Place,
        /// Armed the "CQ": the next completion wakes the line's first (the shared readiness).
        started: bool,
        done: bool,
        dropped: bool,
        /// The key it lined up with, when it waited.
        lined: Option<u64>,
    }

    struct Model {
        line: Line,
        tasks: Vec<Task>,
        free: u32,
        in_flight: u32,
        /// Keys of the tasks that waited, in the order they posted.
        posted: Vec<u64>,
    }

    impl Model {
        fn new(tasks: usize, window: u32) -> Self {
            Model {
                line: Line::default(),
                tasks: (0..tasks).map(|_| Task::default()).collect(),
                free: window,
                in_flight: 0,
                posted: Vec::new(),
            }
        }

        fn live(&self, i: usize) -> bool {
            !self.tasks[i].done && !self.tasks[i].dropped
        }

        /// `poll_send`'s logic: go when it is the task's turn and a slot is free; else wait in
        /// line (the first also arms the CQ, whose completion wakes the first).
        fn poll(&mut self, i: usize) {
            if !self.live(i) {
                return;
            }
            let t = &mut self.tasks[i];
            t.started = true;
            t.flag.0.store(false, Ordering::SeqCst);
            let waker = Waker::from(Arc::clone(&t.flag));
            if self.line.is_turn(t.place) && self.free > 0 {
                // Nobody overtakes a sender that waits in line before it.
                let mine = t.lined.unwrap_or(u64::MAX);
                let ahead = (0..self.tasks.len()).find(|&j| {
                    j != i && self.live(j) && self.tasks[j].lined.is_some_and(|k| k < mine)
                });
                assert!(ahead.is_none(), "task {i} overtook task {ahead:?}");
                let t = &mut self.tasks[i];
                self.free -= 1;
                self.in_flight += 1;
                t.done = true;
                if let Some(k) = t.lined {
                    self.posted.push(k);
                }
                let mut place = t.place;
                if let Some(w) = self.line.leave(&mut place) {
                    w.wake();
                }
                self.tasks[i].place = place;
                return;
            }
            self.line.wait(&mut t.place, &waker);
            t.lined.get_or_insert(t.place.expect("placed"));
        }

        /// A send completes: its slot is free, and the first sender is woken (what
        /// `wake_helped` does for whoever reaped it).
        fn complete(&mut self) {
            if self.in_flight == 0 {
                return;
            }
            self.in_flight -= 1;
            self.free += 1;
            if let Some(w) = self.line.take_first(None) {
                w.wake();
            }
        }

        fn drop_task(&mut self, i: usize) {
            if !self.live(i) {
                return;
            }
            let t = &mut self.tasks[i];
            t.dropped = true;
            if let Some(w) = self.line.leave(&mut t.place) {
                w.wake();
            }
        }

        fn woken(&self) -> Option<usize> {
            (0..self.tasks.len())
                .find(|&i| self.live(i) && self.tasks[i].flag.0.load(Ordering::SeqCst))
        }

        /// Polls woken tasks until none is; then no live task that has started may be asleep
        /// while a slot is free (that would be a lost wake-up).
        fn settle(&mut self) {
            while let Some(i) = self.woken() {
                self.poll(i);
            }
            if self.free > 0 {
                for (i, t) in self.tasks.iter().enumerate() {
                    assert!(
                        !(t.started && self.live(i)),
                        "task {i} sleeps in line while {} slots are free",
                        self.free
                    );
                }
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Poll(usize),
        Complete,
        Drop(usize),
        Settle,
    }

    fn op(tasks: usize) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..tasks).prop_map(Op::Poll),
            3 => Just(Op::Complete),
            1 => (0..tasks).prop_map(Op::Drop),
            2 => Just(Op::Settle),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn no_sender_is_lost_and_the_line_is_fifo(
            (tasks, window, ops) in (1usize..8, 1u32..4).prop_flat_map(|(t, w)| {
                (Just(t), Just(w), proptest::collection::vec(op(t), 0..80))
            })
        ) {
            let mut m = Model::new(tasks, window);
            for op in ops {
                match op {
                    Op::Poll(i) => m.poll(i),
                    Op::Complete => m.complete(),
                    Op::Drop(i) => m.drop_task(i),
                    Op::Settle => m.settle(),
                }
            }
            // Everyone not dropped starts, then the completions come in.
            for i in 0..tasks {
                if !m.tasks[i].started {
                    m.poll(i);
                }
            }
            m.settle();
            while m.in_flight > 0 {
                m.complete();
                m.settle();
            }
            for (i, t) in m.tasks.iter().enumerate() {
                prop_assert!(t.done || t.dropped, "task {i} never sent");
            }
            prop_assert!(m.line.is_empty());
            let mut sorted = m.posted.clone();
            sorted.sort_unstable();
            prop_assert_eq!(&m.posted, &sorted, "the senders that waited went out of order");
        }
    }

    #[test]
    fn a_woken_first_that_is_dropped_hands_its_turn_on() {
        let mut line = Line::default();
        let (a, b) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
        let (mut pa, mut pb) = (None, None);
        line.wait(&mut pa, &Waker::from(Arc::clone(&a)));
        line.wait(&mut pb, &Waker::from(Arc::clone(&b)));
        assert!(line.is_turn(pa) && !line.is_turn(pb) && !line.is_turn(None));
        line.take_first(None).unwrap().wake();
        assert!(a.0.load(Ordering::SeqCst));
        // a was woken, then dropped before it was polled: b is woken in its stead.
        line.leave(&mut pa).unwrap().wake();
        assert!(b.0.load(Ordering::SeqCst));
        assert!(line.is_turn(pb));
        assert!(line.leave(&mut pb).is_none() && line.is_empty());
    }

    #[test]
    fn take_all_spares_the_caller_and_keeps_places() {
        let mut line = Line::default();
        let flags: Vec<_> = (0..3).map(|_| Arc::new(Flag::default())).collect();
        let mut places = [None; 3];
        for (f, p) in flags.iter().zip(&mut places) {
            line.wait(p, &Waker::from(Arc::clone(f)));
        }
        let mut out = Vec::new();
        line.take_all(places[1], |w| out.push(w));
        assert_eq!(out.len(), 2);
        out.drain(..).for_each(Waker::wake);
        assert!(flags[0].0.load(Ordering::SeqCst) && flags[2].0.load(Ordering::SeqCst));
        assert!(!flags[1].0.load(Ordering::SeqCst));
        // The woken left the line; the caller keeps its place.
        assert_eq!(line.len(), 1);
        assert!(line.is_turn(places[1]));
        line.take_all(None, |w| out.push(w));
        assert_eq!(out.len(), 1);
        assert!(line.is_empty());
    }

    #[test]
    fn waiters_wake_past_the_inline_wakers_and_spare_the_caller() {
        let waiters = Arc::new(Waiters::default());
        let flags: Vec<_> = (0..6).map(|_| Arc::new(Flag::default())).collect();
        let mut places = [None; 6];
        for (f, p) in flags.iter().zip(&mut places) {
            waiters.wait(Role::Close, p, &Waker::from(Arc::clone(f)));
        }
        let mut taken = Taken::default();
        waiters.wake_lines(
            Role::Close.bit(),
            Some((Role::Close, places[0])),
            &mut taken,
        );
        taken.wake();
        let woken = flags.iter().filter(|f| f.0.load(Ordering::SeqCst)).count();
        assert_eq!(woken, 5);
        assert!(!flags[0].0.load(Ordering::SeqCst));
        assert_eq!(
            waiters.waiting(Role::Close),
            1,
            "the spared closer keeps its place"
        );
        // The readiness waker wakes the first sender only: the first found the line empty
        // (its turn), found no slot and waits; the others line up behind it.
        let senders: Vec<_> = (0..3).map(|_| Arc::new(Flag::default())).collect();
        let wakers: Vec<Waker> = senders.iter().map(|f| Waker::from(Arc::clone(f))).collect();
        let mut sp = [None; 3];
        assert!(waiters.turn_or_wait(Role::Send, &mut sp[0], &wakers[0]));
        waiters.wait(Role::Send, &mut sp[0], &wakers[0]);
        assert!(!waiters.turn_or_wait(Role::Send, &mut sp[1], &wakers[1]));
        assert!(!waiters.turn_or_wait(Role::Send, &mut sp[2], &wakers[2]));
        Waker::from(Arc::clone(&waiters)).wake();
        let woken: Vec<bool> = senders.iter().map(|f| f.0.load(Ordering::SeqCst)).collect();
        assert_eq!(woken, [true, false, false]);
        // The first posts and leaves: the second's turn, and it is woken.
        waiters.leave(Role::Send, &mut sp[0]);
        assert!(senders[1].0.load(Ordering::SeqCst));
        assert!(waiters.turn_or_wait(Role::Send, &mut sp[1], &wakers[1]));
        // The woken closers left the line (the readiness woke the spared one too).
        assert_eq!(waiters.waiting(Role::Close), 0);
        for p in &mut places {
            waiters.leave(Role::Close, p);
            assert!(p.is_none());
        }
        assert_eq!(waiters.waiting(Role::Close), 0);
    }
}
