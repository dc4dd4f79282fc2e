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
    /// When the next keepalive is due, over every open connection that has one.
    pub(super) fn next_keepalive(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter(|c| c.phase == Phase::Open && c.credits.is_some())
            .filter_map(|c| Some(c.last_activity + c.config.keepalive?))
            .min()
    }

    /// Sends a keepalive on each open connection idle for its interval.
    pub(super) fn on_keepalive(&mut self) {
        let now = Instant::now();
        let due: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.phase == Phase::Open && c.credits.is_some())
            .filter(|(_, c)| {
                c.config
                    .keepalive
                    .is_some_and(|k| c.last_activity + k <= now)
            })
            .map(|(k, _)| *k)
            .collect();
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
