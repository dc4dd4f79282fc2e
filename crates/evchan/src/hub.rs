//! A completion channel shared by the connections of one shard on one device: their CQs report
//! to it, so a shard needs two descriptors per device (the channel's and its readiness proxy),
//! not two per connection.
//!
//! The channel carries only wake-ups. A connection's completions are still polled from its own
//! CQ by whichever of its tasks waits ([`crate::wire`]); what comes through the hub is "CQ `X`
//! has something": each event is read, acked at once and routed by its CQ's id to that
//! connection's waiters, whose futures then poll their CQ themselves. No message, no
//! completion and no lock of a connection passes through the hub.
//!
//! Who reads the channel: the hub is registered with the reactor of every tokio runtime whose
//! tasks wait on one of its connections (as each connection's own channel was before), and each
//! registration's waker is a [`Drainer`]: when the reactor sees the channel readable it calls
//! the drainer, which reads every event until `EAGAIN`, wakes the connections they name, clears
//! the readiness and registers itself again, on the reactor's thread, before it returns. So the
//! waker of a registration is always the drainer (never a task's, which would leave with its
//! task), and a runtime left idle (a current-thread runtime nobody drives) delays no one: the
//! runtime of a waiting task has a registration too, and any reactor's drain serves every
//! runtime. The cost: every registered reactor wakes on each event (the first reads it; with
//! one runtime, the usual case, that is the one that then runs the task). The shard's own
//! runtime is not registered: its waits look on a timer (`Wait::timed`).
//!
//! A wait (in `wire`) goes: put the task's waker in its line, make sure the hub is registered
//! with the current runtime ([`Hub::watch`]), arm the CQ, poll it once more, sleep. A completion
//! after the arm raises an event, which the drainer routes to the line: no wake-up is lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Wake, Waker};

use evchan_core::verbs::{CqId, CqWaiter, OwnedCompChannel, OwnedCq};

use crate::error::{Error, Result};
use crate::wait::Waiters;

/// One shard's completion channel on one device (see the module's docs).
pub(crate) struct Hub {
    channel: OwnedCompChannel,
    /// Each CQ on the channel with a connection: the waker of that connection's waiters.
    routes: Mutex<crate::runtime::IntMap<CqId, Waker>>,
    /// The channel registered with each runtime whose tasks waited (usually one or two).
    registrations: Mutex<Vec<Registration>>,
}

struct Registration {
    runtime: tokio::runtime::Id,
    /// Held for its registration (dropping it deregisters the channel from that reactor); its
    /// drainer holds it weakly.
    _waiter: Arc<CqWaiter>,
    drainer: Arc<Drainer>,
}

/// A wait's hold on the registration of its runtime ([`Hub::watch`]).
pub(crate) struct Watch(Arc<Drainer>);

impl Watch {
    /// The registration's runtime shut down: watch again (which fails where that runtime is
    /// the current one).
    pub(crate) fn is_dead(&self) -> bool {
        self.0.dead.load(Ordering::Acquire)
    }

    /// Finishes a drain the drainer left to the next wait (see [`Drainer::wake_by_ref`]):
    /// reads the events left, clears the readiness and registers the drainer again; the
    /// wakers of the connections those events name go into `found`, but for the waiting
    /// connection's own CQ (`own`), which its wait polls next anyway.
    pub(crate) fn resume(&self, own: CqId, found: &mut Vec<Waker>) {
        if self.0.pending.swap(false, Ordering::AcqRel) {
            self.0.drain(found, Some(own));
        }
    }
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// A hub on `channel` (no CQ on it yet, registered with no runtime).
    pub(crate) fn new(channel: OwnedCompChannel) -> Arc<Self> {
        Arc::new(Hub {
            channel,
            routes: Mutex::new(crate::runtime::IntMap::default()),
            registrations: Mutex::new(Vec::new()),
        })
    }

    /// A CQ of `entries` on the hub's channel, whose events wake the new waiters of its
    /// [`Route`] (until the route goes).
    pub(crate) fn cq(self: &Arc<Self>, entries: u32) -> Result<(OwnedCq, Route)> {
        let cq = OwnedCq::new(&self.channel, entries)?;
        let id = cq.cq().id();
        let waiters = Arc::new(Waiters::default());
        lock(&self.routes).insert(id, Waker::from(Arc::clone(&waiters)));
        let route = Route {
            hub: Arc::clone(self),
            cq: id,
            waiters,
        };
        Ok((cq, route))
    }

    /// Makes sure the channel is registered with the reactor of the current runtime (`runtime`),
    /// its drainer waiting for the readiness. Returns the wait's [`Watch`] of the registration
    /// and the wakers of what a first drain found: the caller wakes them once its own locks
    /// are let go.
    ///
    /// # Errors
    /// [`Error::Config`] when the runtime has no I/O driver; the reactor's registration error
    /// (a runtime that is shutting down).
    pub(crate) fn watch(
        self: &Arc<Self>,
        runtime: tokio::runtime::Id,
    ) -> Result<(Watch, Vec<Waker>)> {
        let mut regs = lock(&self.registrations);
        if let Some(r) = regs
            .iter()
            .find(|r| r.runtime == runtime && !r.drainer.dead.load(Ordering::Acquire))
        {
            return Ok((Watch(Arc::clone(&r.drainer)), Vec::new()));
        }
        // The registrations of runtimes that are gone go first (a runtime per call would pile
        // them up), then this runtime's (a dead one of the same id cannot exist: ids are not
        // reused, but it would be replaced all the same).
        regs.retain(|r| !r.drainer.dead.load(Ordering::Acquire) && r.runtime != runtime);
        let waiter = Arc::new(register(&self.channel)?);
        let drainer = Arc::new(Drainer {
            hub: Arc::downgrade(self),
            waiter: Arc::downgrade(&waiter),
            dead: AtomicBool::new(false),
            pending: AtomicBool::new(false),
        });
        regs.push(Registration {
            runtime,
            _waiter: waiter,
            drainer: Arc::clone(&drainer),
        });
        drop(regs);
        // Reads what is there already and leaves the drainer registered for what comes.
        let mut found = Vec::new();
        drainer.drain(&mut found, None);
        Ok((Watch(drainer), found))
    }

    /// Reads every event until `EAGAIN`, acks it, and puts the waker of its CQ's connection
    /// in `found` (but for `skip`'s).
    fn read_events(&self, found: &mut Vec<Waker>, skip: Option<CqId>) {
        loop {
            match self.channel.channel().try_next_cq() {
                Ok(Some(cq)) if Some(cq) == skip => {}
                Ok(Some(cq)) => {
                    // A CQ without a route: its connection is gone (CQ ids are not reused).
                    if let Some(w) = lock(&self.routes).get(&cq) {
                        found.push(w.clone());
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    // Not seen in practice (the descriptor is the channel's own, non-blocking).
                    // Events may be left queued, which the cleared readiness would not announce
                    // again: every connection looks at its CQ instead.
                    tracing::warn!("evchan: reading the completion channel failed: {e}");
                    found.extend(lock(&self.routes).values().cloned());
                    return;
                }
            }
        }
    }
}

/// A CQ's route in its hub; dropping it removes the route. Dropped before the CQ (field order
/// in `wire::Objects`): an event read after it is acked and dropped.
pub(crate) struct Route {
    hub: Arc<Hub>,
    cq: CqId,
    waiters: Arc<Waiters>,
}

impl Route {
    /// The hub this route is in.
    pub(crate) fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// The waiters the CQ's events wake.
    pub(crate) fn waiters(&self) -> &Arc<Waiters> {
        &self.waiters
    }

    /// The CQ's id.
    pub(crate) fn cq(&self) -> CqId {
        self.cq
    }
}

impl Drop for Route {
    fn drop(&mut self) {
        let mut routes = lock(&self.hub.routes);
        routes.remove(&self.cq);
        crate::runtime::trim::shrink_if_sparse(&mut routes);
    }
}

/// A registration's waker: drains the channel and registers itself again (module docs). It
/// holds neither the hub nor the registration (the registration holds it: a cycle would keep
/// both alive for good).
struct Drainer {
    hub: Weak<Hub>,
    waiter: Weak<CqWaiter>,
    /// The runtime shut down (the drainer saw the reactor's error and removed the
    /// registration).
    dead: AtomicBool,
    /// The drainer woke the hub's one connection without reading the channel: the next wait
    /// in this runtime reads it and registers the drainer again ([`Watch::resume`]).
    pending: AtomicBool,
}

impl Drainer {
    /// Until the readiness is pending with this drainer's waker registered: read every event
    /// (the wakers of the connections they name into `found`), then clear the readiness seen
    /// before the read.
    fn drain(self: &Arc<Self>, found: &mut Vec<Waker>, skip: Option<CqId>) {
        let (Some(hub), Some(waiter)) = (self.hub.upgrade(), self.waiter.upgrade()) else {
            return;
        };
        let waker = Waker::from(Arc::clone(self));
        let mut cx = Context::from_waker(&waker);
        loop {
            // Outside tokio's task budget: a spent budget would make the poll wake this waker
            // at once (a recursion) instead of registering it.
            let polled = {
                let ready = tokio::task::unconstrained(std::future::poll_fn(|cx| {
                    waiter.waiter().poll_readable(cx)
                }));
                std::future::Future::poll(std::pin::pin!(ready), &mut cx)
            };
            match polled {
                Poll::Pending => return,
                Poll::Ready(Err(_)) => {
                    // The runtime is gone: this registration serves no one any more, and goes
                    // (with the runtime's handle it holds). tokio calls this waker at its
                    // shutdown without a lock of its own held, so the deregistration is safe.
                    self.dead.store(true, Ordering::Release);
                    lock(&hub.registrations).retain(|r| !Arc::ptr_eq(&r.drainer, self));
                    // Whoever sleeps relying on it looks again (and registers anew, or learns
                    // that its runtime is gone).
                    found.extend(lock(&hub.routes).values().cloned());
                    return;
                }
                Poll::Ready(Ok(mut guard)) => {
                    hub.read_events(found, skip);
                    guard.clear_ready();
                }
            }
        }
    }
}

impl Wake for Drainer {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    /// On the reactor's thread, no lock of ours held: the connections are woken as found.
    ///
    /// With one connection on the hub, the event can only be its own: it is woken at once,
    /// and reading the channel is left to its next wait (or any next wait in this runtime),
    /// which then registers the drainer again. So the reads (two system calls: the event and
    /// `EAGAIN`) come after the message, as they do for a channel of one's own, instead of
    /// before its task runs. Until that wait, this runtime's reactor is deaf to the channel;
    /// every task that could need it was just woken (all the connection's waiters are), and
    /// a task that waits later resumes the drain first.
    fn wake_by_ref(self: &Arc<Self>) {
        let Some(hub) = self.hub.upgrade() else {
            return;
        };
        let single = {
            let routes = lock(&hub.routes);
            if routes.len() == 1 {
                routes.values().next().cloned()
            } else {
                None
            }
        };
        if let Some(waker) = single {
            self.pending.store(true, Ordering::Release);
            waker.wake();
            return;
        }
        let mut found = Vec::new();
        self.drain(&mut found, None);
        for w in found {
            w.wake();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The channel registered with the current tokio runtime.
fn register(channel: &OwnedCompChannel) -> Result<CqWaiter> {
    // tokio panics when the runtime has no I/O driver; that becomes a configuration error.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| channel.waiter())) {
        Ok(w) => Ok(w?),
        Err(_) => Err(Error::Config(
            "evchan connections need a tokio runtime with its I/O driver enabled \
             (Builder::enable_io or enable_all)"
                .into(),
        )),
    }
}
