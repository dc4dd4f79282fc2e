//! Closing and ending: a close (the `FIN`'s completion, then the disconnect), what the data
//! paths tell the shard, the release of everything, and the setup deadlines.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{Shard, DRAIN_TIMEOUT};
use crate::error::{Error, Lost, Result};
use crate::runtime::conn::{Conn, IdState, Phase};
use crate::runtime::ConnId;
use crate::wait::Role;
use crate::wire::{Heard, Wait, Waiting, Wire};

/// How soon the shard's own waits on a connection (its background close, a deferred
/// disconnect) look at its CQ again, at first: the interval doubles after each look, up to
/// [`SHARD_LOOK_MAX`]. Bounded waits of the close, off every message's path.
const SHARD_LOOK: Duration = Duration::from_millis(10);
/// The longest interval between two looks of a shard's wait.
const SHARD_LOOK_MAX: Duration = Duration::from_millis(200);

impl<'s> Shard<'s> {
    pub(super) fn remove(&mut self, conn: ConnId) -> Option<Box<Conn<'s>>> {
        let c = self.conns.remove(&conn)?;
        // (Its key, even when a failed setup step dropped the id; an entry another
        // connection's id took since stays.)
        if let Some(key) = c.key {
            if self.by_key.get(&key) == Some(&conn) {
                self.by_key.remove(&key);
            }
        }
        crate::runtime::trim::shrink_if_sparse(&mut self.conns);
        crate::runtime::trim::shrink_if_sparse(&mut self.by_key);
        Some(c)
    }

    /// Destroys a removed connection: the id (and its QP) first, then its data path's
    /// objects (its halves then see the end, `why` unless they saw another first); the close
    /// waiters are answered.
    pub(super) fn release(&mut self, mut c: Box<Conn<'s>>, why: Lost) {
        c.id = IdState::Gone;
        if let Some(wire) = c.wire.take() {
            wire.release(why);
            crate::runtime::trim::released();
        }
        for w in c.close_waiters.drain(..) {
            let _ = w.send(());
        }
    }

    /// Disconnects and releases: the end of a close, a loss, or the peer's disconnect.
    pub(super) fn finish(&mut self, conn: ConnId, why: Lost) {
        if let Some(mut c) = self.remove(conn) {
            if let Some(wire) = &c.wire {
                wire.ending();
            }
            c.id.disconnect();
            tracing::debug!(parent: &c.span, "disconnected and released");
            self.release(c, why);
        }
    }

    pub(super) fn close(&mut self, conn: ConnId, reply: Option<oneshot::Sender<()>>) {
        let Some(c) = self.conns.get_mut(&conn) else {
            if let Some(r) = reply {
                let _ = r.send(());
            }
            return;
        };
        c.close_waiters.extend(reply);
        c.closing = true;
        match c.phase {
            Phase::Open => {
                let wire = Arc::clone(c.wire.as_ref().expect("an open connection has its path"));
                if wire.close_ready() {
                    return self.finish(conn, Lost::Closed);
                }
                // No deadline while the FIN waits for a control credit from a live peer; once
                // it is posted, the transport's retries bound its completion, and DRAIN_TIMEOUT
                // bounds it all.
                c.phase = Phase::Closing;
                self.wait_for(conn, wire, DRAIN_TIMEOUT, Heard::Closable, Wire::poll_close);
            }
            Phase::Closing => {}
            Phase::Setup(_) | Phase::Requested => {
                if let Some(r) = c.reply.take() {
                    let _ = r.send(Err(Error::ConnectionLost(Lost::Closed)));
                }
                if let Some(c) = self.remove(conn) {
                    self.release(c, Lost::Closed);
                }
            }
        }
    }

    /// Waits, in a task of this shard's runtime (looking on a timer, see [`SHARD_LOOK`]), until
    /// `poll` is ready on `wire` (or `limit` passed), then tells the shard `heard`.
    pub(super) fn wait_for(
        &self,
        conn: ConnId,
        wire: Arc<Wire>,
        limit: Duration,
        heard: Heard,
        poll: fn(&Wire, &mut Context<'_>, &mut Wait) -> Poll<Result<()>>,
    ) {
        let tx = self.heard.clone();
        tokio::spawn(async move {
            {
                // A wait that times out leaves the closers' line. It looks again on a timer
                // (or when a runtime's reactor routes the CQ's event to it): it does not
                // register this runtime with the hub (see `Wait::timed`).
                let mut waiting = Waiting::new(&wire, Role::Close);
                waiting.wait.timed = true;
                let mut every = SHARD_LOOK;
                let mut look = std::pin::pin!(tokio::time::sleep(every));
                let wait = poll_fn(|cx| {
                    while std::future::Future::poll(look.as_mut(), cx).is_ready() {
                        every = (every * 2).min(SHARD_LOOK_MAX);
                        look.as_mut().reset(tokio::time::Instant::now() + every);
                    }
                    poll(&wire, cx, &mut waiting.wait)
                });
                let _ = tokio::time::timeout(limit, wait).await;
            }
            let _ = tx.send((conn, heard));
        });
    }

    /// What a connection's data path (or the shard's own wait on it) told the shard.
    pub(super) fn on_heard(&mut self, conn: ConnId, heard: Heard) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let go = match (heard, c.phase) {
            (Heard::Lost, Phase::Open | Phase::Closing) => true,
            (Heard::Closable, Phase::Closing) => !c.disconnect_deferred,
            (Heard::Quiet, Phase::Closing) => c.disconnect_deferred,
            _ => false,
        };
        if go {
            self.finish(conn, Lost::Closed);
        }
    }

    pub(super) fn fail_setup(&mut self, conn: ConnId, error: Error) {
        if let Some(mut c) = self.remove(conn) {
            tracing::debug!(parent: &c.span, "setup failed: {error}");
            if let Some(reply) = c.reply.take() {
                let _ = reply.send(Err(error));
            }
            self.release(c, Lost::Closed);
        }
    }

    pub(super) fn on_deadlines(&mut self) {
        let now = Instant::now();
        let due: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(k, _)| *k)
            .collect();
        for conn in due {
            match self.conns[&conn].phase {
                Phase::Setup(step) => self.fail_setup(conn, Error::TimedOut(step)),
                // Unanswered for the connect timeout: a half-open connection goes.
                Phase::Requested => self.reject(conn, &[]),
                Phase::Open | Phase::Closing => {
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.deadline = None;
                    }
                }
            }
        }
    }
}
