//! Sending and ending: flushing what connections queued (data, credit updates, FIN), a
//! connection's loss, its release once drained, and the deadlines.

use std::time::Instant;

use super::{connected, post_ctrl, record, CtrlPost, Shard, WrKind, DRAIN_TIMEOUT};
use crate::error::{Error, Lost};
use crate::runtime::conn::{with_id, Conn, IdState, Phase};
use crate::runtime::{ConnId, Delivery, SendEnd};

impl<'s, 'c> Shard<'s, 'c> {
    pub(super) fn remove(&mut self, conn: ConnId) -> Option<Conn<'s>> {
        let c = self.conns.remove(&conn)?;
        if let Some(key) = with_id!(&c.id, id => id.key()) {
            self.by_key.remove(&key);
        }
        Some(c)
    }

    /// Destroys a removed connection: the id (and its QP) first, then its memory regions;
    /// posted work requests of it are forgotten (their slots are never reused).
    pub(super) fn release(&mut self, conn: ConnId, mut c: Conn<'s>) {
        c.id = IdState::Gone;
        if c.outstanding > 0 {
            // The QP is gone with the id: its posted work requests never complete. Their slots
            // are forgotten (never reused); the memory goes with the pool.
            self.posted.retain(|_, w| w.conn != conn);
        }
        if let Some(path) = c.path.take() {
            self.cq_free[path.dev] += c.cq_reserved;
            drop(path);
        }
        mark_if_undelivered(&c);
        if let Some(shared) = &c.shared {
            shared.end(SendEnd::Lost(Lost::Closed));
        }
        for w in c.close_waiters.drain(..) {
            let _ = w.send(());
        }
    }

    /// Ends a connection abnormally: the receive half gets `why`, sends fail, the id is
    /// disconnected and goes once its work requests are flushed.
    pub(super) fn lose(&mut self, conn: ConnId, why: Lost) {
        // Whatever ends a connection once the runtime retired (a peer of another retiring
        // runtime of this process that went first, the flushes of its QP), the cause is the
        // removal.
        let why = self.env.removal_cause(false).unwrap_or(why);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        tracing::debug!(parent: &c.span, %why, "connection lost");
        tell_lost(c, &why);
        c.outbox.clear();
        c.end_deferral();
        if !c.disconnected {
            c.disconnected = true;
            c.id.disconnect();
        }
        c.phase = Phase::Draining;
        c.deadline = Some(Instant::now() + DRAIN_TIMEOUT);
    }

    /// Releases a disconnected connection whose work requests have all completed.
    pub(super) fn try_finish(&mut self, conn: ConnId) {
        let done = self
            .conns
            .get(&conn)
            .is_some_and(|c| c.phase == Phase::Draining && c.outstanding == 0);
        if done {
            if let Some(c) = self.remove(conn) {
                tracing::debug!(parent: &c.span, "released");
                self.release(conn, c);
            }
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
            let phase = self.conns[&conn].phase;
            match phase {
                Phase::Setup(step) => self.fail_setup(conn, Error::TimedOut(step)),
                // Unanswered for the connect timeout: a half-open connection goes.
                Phase::Requested => self.reject(conn, &[]),
                // The grace of sends in flight at the peer's disconnect is over.
                Phase::Draining if self.conns[&conn].disconnect_deferred => {
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.end_deferral();
                    }
                }
                Phase::Open | Phase::Draining => {
                    // A close that did not finish: release everything now.
                    if let Some(c) = self.remove(conn) {
                        tracing::debug!(?conn, "drain timed out; released");
                        self.release(conn, c);
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Sending
    // ---------------------------------------------------------------------------------------

    /// Flushes each connection marked since the last flush, once: a connection is often
    /// marked twice in one turn (its receive, then its send's completion; its command, then
    /// its returned slot), and a second flush right after the first finds nothing to do.
    pub(super) fn flush_dirty(&mut self) {
        if self.dirty.len() > 1 {
            self.dirty.sort_unstable();
            self.dirty.dedup();
        }
        while let Some(conn) = self.dirty.pop() {
            self.flush(conn);
        }
    }

    fn flush(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.phase != Phase::Open {
            return;
        }
        let (Some(path), Some(id)) = (c.path.as_mut(), connected(&c.id)) else {
            return;
        };
        let mut failed = None;
        // Data, as credits and send slots allow.
        while let Some(data) = c.outbox.front() {
            if path.free_data.is_empty() {
                break;
            }
            let saved = c.credits.clone();
            let imm = match c.credits.as_mut() {
                Some(credits) => match credits.send_data() {
                    Some(imm) => Some(imm),
                    None => break,
                },
                None => None,
            };
            let mut slot = path.free_data.pop().expect("checked");
            let n = data.len();
            slot.as_mut_slice()[..n].copy_from_slice(data);
            if let Err(e) = slot.set_len(n) {
                failed = Some(Lost::Verbs(e.to_string()));
                break;
            }
            tracing::trace!(?conn, ?imm, "data sent");
            match id.post_send_slot(&path.send_mr, slot, imm) {
                Ok(posted) => {
                    c.outbox.pop_front();
                    c.outstanding += 1;
                    c.sends_in_flight += 1;
                    record(&mut self.posted, conn, posted, WrKind::Data);
                }
                Err(e) if e.is_queue_full() => {
                    // Backpressure: retried on the next completion.
                    c.credits = saved;
                    path.free_data.push(e.slot);
                    break;
                }
                Err(e) => {
                    failed = Some(Lost::Verbs(e.error.to_string()));
                    break;
                }
            }
        }
        // Credit updates and FIN, from their own slots and budget.
        if let Some(credits) = c.credits.as_mut() {
            loop {
                if path.free_ctrl.is_empty() {
                    break;
                }
                let saved = credits.clone();
                let (imm, fin) = if let Some(imm) = credits.credit_update() {
                    tracing::trace!(?conn, imm, "credit update");
                    (imm, false)
                } else if c.want_fin && c.outbox.is_empty() {
                    match credits.send_fin() {
                        Some(imm) => (imm, true),
                        None => break,
                    }
                } else {
                    break;
                };
                match post_ctrl(id, path, &mut self.posted, conn, imm) {
                    CtrlPost::Posted(wr_id) => {
                        c.outstanding += 1;
                        if fin {
                            c.fin_wr = Some(wr_id);
                            if c.closing {
                                c.deadline = Some(Instant::now() + DRAIN_TIMEOUT);
                            }
                        }
                    }
                    CtrlPost::QueueFull => {
                        *credits = saved;
                        break;
                    }
                    CtrlPost::Failed(why) => {
                        failed = Some(why);
                        break;
                    }
                }
            }
        }
        // Closing: disconnect once our FIN (or, with a plain peer, every send) completed.
        let sent_all = match &c.credits {
            Some(credits) => credits.fin_sent() && c.fin_wr.is_none(),
            None => c.outbox.is_empty() && c.sends_in_flight == 0,
        };
        if failed.is_none() && c.closing && sent_all && !c.disconnected {
            c.disconnected = true;
            c.id.disconnect();
            if let Some(shared) = &c.shared {
                shared.end(SendEnd::Lost(Lost::Closed));
            }
            c.phase = Phase::Draining;
            c.deadline = Some(Instant::now() + DRAIN_TIMEOUT);
        }
        if let Some(why) = failed {
            self.lose(conn, why);
        }
        self.try_finish(conn);
    }
}

/// Tells every part of `c` that waits that the connection is lost: its sends first (a `send`
/// after `recv` returned the loss is refused, never queued to nowhere), then a connect or
/// accept still waiting for `ESTABLISHED` (a peer's first message can come before it), then
/// its receive half, once.
pub(super) fn tell_lost(c: &mut Conn<'_>, why: &Lost) {
    mark_if_undelivered(c);
    if let Some(shared) = &c.shared {
        shared.end(SendEnd::Lost(why.clone()));
    }
    if let Some(reply) = c.reply.take() {
        let _ = reply.send(Err(Error::ConnectionLost(why.clone())));
    }
    if !c.ended {
        c.ended = true;
        if let Some(inbox) = &c.inbox {
            let _ = inbox.send(Delivery::Lost(why.clone()));
        }
    }
}

/// Records on the connection's shared state that a message it was given was not delivered,
/// when one is still queued or in flight (its send not completed) as the connection ends.
fn mark_if_undelivered(c: &Conn<'_>) {
    if !c.outbox.is_empty() || c.sends_in_flight > 0 {
        if let Some(shared) = &c.shared {
            shared.mark_undelivered();
        }
    }
}
