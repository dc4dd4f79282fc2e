//! The completion side: the completion channels' events, arming and polling the CQs, the
//! busy poll, and what each completion does (receives, sends, control messages).

use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use evchan_core::verbs::{Slot, WcStatus, WorkCompletion};

use super::{connected, record, Shard, Spun, WrKind, POLL_BATCH, SPINS_PER_CLOCK_READ};
use crate::cm_map;
use crate::error::Lost;
use crate::proto::Kind;
use crate::runtime::conn::Phase;
use crate::runtime::{Cmd, ConnId, Delivery};

/// A received message's slot as the owner of its `Bytes`: dropping the last clone sends the
/// slot back to the shard, which posts it again and returns the credit.
struct RecvBuf {
    slot: Option<Slot>,
    conn: ConnId,
    back: mpsc::UnboundedSender<(ConnId, Slot)>,
}

impl AsRef<[u8]> for RecvBuf {
    fn as_ref(&self) -> &[u8] {
        self.slot.as_ref().map_or(&[], Slot::as_slice)
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            // The shard may be gone; the slot's memory is then freed with it.
            let _ = self.back.send((self.conn, slot));
        }
    }
}

impl<'s, 'c> Shard<'s, 'c> {
    /// Reads the completion channel of device `d` until it is empty (`EAGAIN`), before its
    /// readiness is cleared: an edge is never lost. (Its one CQ notifies once per arm, so
    /// there is one event in the common case; the last read, which finds the channel empty,
    /// costs a `read` that returns `EAGAIN`, and is kept rather than trusting that count.)
    pub(super) fn drain_cq_events(&mut self, d: usize) {
        let cq = &self.env.cqs[d];
        loop {
            match self.env.comps[d].try_get_cq_event(&[cq]) {
                Ok(Some(event)) => event.ack(), // counted; acked in batches by the CQ
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("ibv_get_cq_event: {e}");
                    break;
                }
            }
        }
    }

    /// Arm, then poll: a completion that came before the arm is not lost.
    pub(super) fn arm_and_poll(&mut self, d: usize) {
        match self.env.cqs[d].req_notify(false) {
            Ok(()) => self.armed[d] = true,
            Err(e) => tracing::error!("ibv_req_notify_cq: {e}"),
        }
        let _ = self.poll_cq(d);
    }

    /// Polls the CQs, commands and returned slots without sleeping until nothing has happened
    /// for `window` (at most 16 windows in all, so that rdma_cm events wait no longer). A CQ
    /// whose notification came is not armed again while the shard spins (no notifications,
    /// no events to read while it polls anyway); it is armed, then polled, before the shard
    /// sleeps. In a task ([`Config::in_task`](crate::Config::in_task)) it returns at the first progress instead, so that the tasks
    /// it woke can run on this thread; the caller polls again after them.
    pub(super) fn busy_poll(
        &mut self,
        window: Duration,
        rx: &mut mpsc::UnboundedReceiver<Cmd>,
        slots_rx: &mut mpsc::UnboundedReceiver<(ConnId, Slot)>,
    ) -> Spun {
        if self.conns.is_empty() {
            return Spun::Idle;
        }
        let start = Instant::now();
        let mut last = self.spin_last.take().unwrap_or(start);
        let mut busy_since_read = false;
        let mut spins = 0u32;
        loop {
            let mut busy = self.take_queued(rx, slots_rx);
            for d in 0..self.env.cqs.len() {
                busy |= self.poll_cq(d) > 0;
            }
            if busy {
                self.flush_dirty();
                if self.env.in_task {
                    return Spun::Progress;
                }
                busy_since_read = true;
            } else {
                std::hint::spin_loop();
            }
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_CLOCK_READ) {
                // Progress is dated by the first clock read after it: the spin lasts at most
                // one read's worth of spins longer than `window` after the last progress.
                let now = Instant::now();
                if std::mem::take(&mut busy_since_read) {
                    last = now;
                }
                if now - last >= window || now - start >= window * 16 {
                    return Spun::Idle;
                }
                if self.env.in_task {
                    // A pause: the runtime polls its reactor (a system call, which also lets
                    // the kernel's deferred work on this CPU run), then the spin goes on.
                    self.spin_last = Some(last);
                    return Spun::Progress;
                }
            }
        }
    }

    /// Handles every command and returned slot already queued, without waiting; whether
    /// there was any.
    pub(super) fn take_queued(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Cmd>,
        slots_rx: &mut mpsc::UnboundedReceiver<(ConnId, Slot)>,
    ) -> bool {
        let mut any = false;
        while let Ok(cmd) = rx.try_recv() {
            self.on_cmd(cmd);
            any = true;
        }
        while let Ok((conn, slot)) = slots_rx.try_recv() {
            self.on_slot_back(conn, slot);
            any = true;
        }
        any
    }

    /// Polls the CQ of device `d` until it is empty; how many completions it had.
    pub(super) fn poll_cq(&mut self, d: usize) -> usize {
        let mut total = 0;
        loop {
            let mut wcs = std::mem::take(&mut self.wcs);
            let n = match self.env.cqs[d].poll(&mut wcs, POLL_BATCH) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!("ibv_poll_cq: {e}");
                    0
                }
            };
            for wc in wcs.drain(..) {
                self.on_wc(&wc);
            }
            self.wcs = wcs;
            total += n;
            if n < POLL_BATCH {
                break total;
            }
        }
    }

    fn on_wc(&mut self, wc: &WorkCompletion) {
        let Some(w) = self.posted.remove(&wc.wr_id()) else {
            return;
        };
        let conn = w.conn;
        let Ok(slot) = w.slot.complete(wc) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.outstanding = c.outstanding.saturating_sub(1);
        c.active = true;
        let ok = wc.is_success();
        let max = c.config.max_message;
        match w.kind {
            WrKind::Recv => match c.phase {
                Phase::Open if ok => self.on_recv(conn, slot, wc),
                Phase::Setup(_) if ok => c.early.push((slot, *wc)),
                _ => {}
            },
            WrKind::Data => {
                c.sends_in_flight = c.sends_in_flight.saturating_sub(1);
                if let Some(path) = c.path.as_mut() {
                    path.free_data.push(slot);
                }
                if let Some(shared) = &c.shared {
                    shared.permits.add_permits(1);
                    if !ok {
                        shared.mark_undelivered();
                    }
                }
                c.after_send();
                self.dirty.push(conn);
            }
            WrKind::Ctrl => {
                if c.fin_wr == Some(wc.wr_id()) {
                    c.fin_wr = None;
                }
                if let Some(path) = c.path.as_mut() {
                    path.free_ctrl.push(slot);
                }
                c.after_send();
                self.dirty.push(conn);
            }
        }
        if !ok && wc.status() != WcStatus::WrFlush {
            self.lose(
                conn,
                cm_map::wc_failure(w.kind == WrKind::Recv, wc.status(), max),
            );
        }
        self.try_finish(conn);
    }

    pub(super) fn on_recv(&mut self, conn: ConnId, slot: Slot, wc: &WorkCompletion) {
        let c = self.conns.get_mut(&conn).expect("present");
        let kind = match c.credits.as_mut() {
            None => Ok(Kind::Data),
            Some(credits) => credits.on_receive(wc.imm_data(), wc.byte_len()),
        };
        tracing::trace!(?conn, ?kind, imm = ?wc.imm_data(), credits = ?c.credits, "received");
        match kind {
            Err(e) => {
                tracing::debug!(?conn, "protocol violation: {e}");
                let _ = &e;
                self.lose(conn, Lost::Protocol(e));
            }
            Ok(Kind::Data) => {
                // Credits may have come back with it: what waits may go now.
                self.dirty.push(conn);
                let deliver = c.inbox.as_ref().filter(|i| !i.is_closed()).cloned();
                match deliver {
                    Some(inbox) => {
                        let buf = RecvBuf {
                            slot: Some(slot),
                            conn,
                            back: self.slots_back.clone(),
                        };
                        let _ = inbox.send(Delivery::Data(Bytes::from_owner(buf)));
                    }
                    // Nobody reads: the message is dropped and credited at once.
                    None => self.on_slot_back(conn, slot),
                }
            }
            Ok(kind) => {
                self.repost(conn, slot);
                if kind == Kind::Fin {
                    let c = self.conns.get_mut(&conn).expect("present");
                    c.ended = true;
                    if let Some(inbox) = &c.inbox {
                        let _ = inbox.send(Delivery::Fin);
                    }
                }
                self.dirty.push(conn);
            }
        }
    }

    /// A received slot came back from the application (its last `Bytes` dropped).
    pub(super) fn on_slot_back(&mut self, conn: ConnId, slot: Slot) {
        let open = self
            .conns
            .get(&conn)
            .is_some_and(|c| c.phase == Phase::Open);
        if !open {
            return;
        }
        if self.repost(conn, slot) {
            let c = self.conns.get_mut(&conn).expect("present");
            if let Some(credits) = c.credits.as_mut() {
                credits.consumed();
            }
            tracing::trace!(?conn, credits = ?c.credits, "consumed");
            self.dirty.push(conn);
        }
    }

    fn repost(&mut self, conn: ConnId, slot: Slot) -> bool {
        let c = self.conns.get_mut(&conn).expect("present");
        let (Some(path), Some(id)) = (c.path.as_ref(), connected(&c.id)) else {
            return false;
        };
        match id.post_recv_slot(&path.recv_mr, slot) {
            Ok(posted) => {
                c.outstanding += 1;
                record(&mut self.posted, conn, posted, WrKind::Recv);
                true
            }
            Err(e) => {
                let e = e.error.to_string();
                self.lose(conn, Lost::Verbs(e));
                false
            }
        }
    }
}
