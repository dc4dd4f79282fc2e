//! Liveness of idle connections ([`Config::keepalive`](crate::Config::keepalive)).
//!
//! A reliable connection learns that its peer is gone only when one of its own sends is not
//! acknowledged: a connection that only waits (a pending `recv`, a `send` or `close` waiting
//! for credits) would wait forever for a peer that died or a wire that was cut. So once a
//! connection to an evchan peer has had no completion for its keepalive interval, a keepalive
//! goes out: a control message that returns no credits (see
//! [`Credits::keepalive`](crate::proto::Credits::keepalive)). The peer's device acknowledges
//! it; if nobody does, the send fails after the transport's retries (`RETRY_EXC_ERR`) and the
//! completion path ends the connection like any failed work request.

use std::time::Instant;

use super::{connected, post_ctrl, CtrlPost, Shard};
use crate::runtime::conn::Phase;
use crate::runtime::ConnId;

impl Shard<'_, '_> {
    /// A connection `conn` became open: it is checked half a keepalive interval from now.
    pub(super) fn keepalive_opened(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let (Some(idle), true) = (c.config.keepalive, c.credits.is_some()) else {
            return;
        };
        c.last_activity = Instant::now();
        c.active = false;
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
            let (Phase::Open, true, Some(idle)) =
                (c.phase, c.credits.is_some(), c.config.keepalive)
            else {
                continue;
            };
            if std::mem::take(&mut c.active) {
                if let Some(t) = previous {
                    c.last_activity = c.last_activity.max(t);
                }
            }
            if c.last_activity + idle <= now {
                due.push(*conn);
                c.last_activity = now;
            }
            let at = (c.last_activity + idle).min(now + idle / 2);
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        self.keepalive_at = next;
        for conn in due {
            self.send_keepalive(conn, now);
        }
    }

    fn send_keepalive(&mut self, conn: ConnId, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        // The next one an interval from now, whether this one goes or not (no control credit
        // free: control messages are unconfirmed, and the peer's confirmation is due).
        c.last_activity = now;
        let (Some(path), Some(id), Some(credits)) =
            (c.path.as_mut(), connected(&c.id), c.credits.as_mut())
        else {
            return;
        };
        if path.free_ctrl.is_empty() {
            return;
        }
        let saved = credits.clone();
        let Some(imm) = credits.keepalive() else {
            return;
        };
        match post_ctrl(id, path, &mut self.posted, conn, imm) {
            CtrlPost::Posted(_) => {
                tracing::trace!(parent: &c.span, imm, "keepalive");
                c.outstanding += 1;
            }
            // Sends are queued: their completions (or their failure) say the same.
            CtrlPost::QueueFull => *credits = saved,
            CtrlPost::Failed(why) => self.lose(conn, why),
        }
    }
}
