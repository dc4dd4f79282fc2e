//! Liveness of idle connections ([`Config::keepalive`](crate::Config::keepalive)).
//!
//! A reliable connection learns that its peer is gone only when one of its own sends is not
//! acknowledged: a connection that only waits (a pending `recv`, a `send` or `close` waiting
//! for credits) would wait forever for a peer that died or a wire that was cut. So once a
//! connection to an evchan peer has had no completion for its keepalive interval, a keepalive
//! goes out: a control message that returns no credits (see
//! [`Credits::keepalive`](crate::proto::Credits::keepalive)). The peer's device acknowledges
//! it; if nobody does, the send fails after the transport's retries (`RETRY_EXC_ERR`), and
//! whoever reaps that completion (a waiting `recv`, `send` or `close`, whose task the
//! completion wakes, or the shard at its next check) ends the connection like any failed work
//! request. Each check also reaps what an idle connection's CQ holds, so that the peer's own
//! keepalives are confirmed while nobody waits on this side.

use std::time::Instant;

use super::Shard;
use crate::runtime::conn::Phase;
use crate::runtime::ConnId;

impl Shard<'_> {
    /// A connection `conn` became open: it is checked half a keepalive interval from now.
    pub(super) fn keepalive_opened(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let (Some(idle), true) = (c.config.keepalive, c.evchan_peer()) else {
            return;
        };
        c.last_activity = Instant::now();
        if let Some(w) = &c.wire {
            w.take_active();
        }
        let at = c.last_activity + idle / 2;
        self.keepalive_at = Some(self.keepalive_at.map_or(at, |t| t.min(at)));
    }

    /// The keepalive timer fired: sends a keepalive on each open connection without a
    /// completion for its interval, and sets the next check.
    ///
    /// Completions only mark their connection active (no clock read per completion: the
    /// guest's clock is a system call). A check at `now` dates a connection marked since the
    /// previous check at that check's time, which is before the completion: so a keepalive
    /// goes out at most one interval after the last completion. Checks come at least every
    /// half interval while connections are open, so a busy connection never sends one (unless
    /// the timer fires late by half an interval), and an idle one sends it no sooner than half
    /// an interval after its last completion.
    pub(super) fn on_keepalive(&mut self) {
        let now = Instant::now();
        let previous = self.keepalive_tick.replace(now);
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (conn, c) in &mut self.conns {
            let (Phase::Open, true, Some(idle)) = (c.phase, c.evchan_peer(), c.config.keepalive)
            else {
                continue;
            };
            let active = c.wire.as_ref().is_some_and(|w| w.take_active());
            if active {
                if let Some(t) = previous {
                    c.last_activity = c.last_activity.max(t);
                }
            }
            let keepalive = c.last_activity + idle <= now;
            if keepalive {
                c.last_activity = now;
            }
            due.push((*conn, keepalive));
            let at = (c.last_activity + idle).min(now + idle / 2);
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        self.keepalive_at = next;
        for (conn, keepalive) in due {
            self.check(conn, keepalive);
        }
    }

    /// Reaps what the connection's CQ holds (confirming the peer's keepalives, among others),
    /// and sends a keepalive when `keepalive` (whether it goes or not: no control credit free
    /// means unconfirmed control messages, whose confirmation is due).
    fn check(&mut self, conn: ConnId, keepalive: bool) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if let Some(wire) = &c.wire {
            if keepalive {
                tracing::trace!(parent: &c.span, "keepalive due");
            }
            // A loss found here tells the shard itself (`Heard::Lost`).
            wire.tick(keepalive);
        }
    }
}
