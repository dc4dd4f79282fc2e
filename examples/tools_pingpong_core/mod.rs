//! `tools_pingpong --layer core`: the same 64 B ping-pong through `evchan-core` alone, one
//! thread per side and no async runtime, as `ib_send_lat -R` does it: an rdma_cm connection
//! whose QP is on the caller's PD and CQ, receives posted before the connection, and each
//! message a signaled SEND of a registered slot (`post_send_slot`; the library's way, so a send
//! completion per message, which `ib_send_lat` does not ask for). Busy-poll (`--busy-poll-us`,
//! any value) spins on `Cq::poll_one`; event mode waits on the CQ's completion channel
//! (`Cq::wait`: poll, arm, poll, wait, poll; a wake-up's event is read and acked by the next
//! wait that finds the CQ empty, before it arms the CQ again).
//!
//! With `--tokio` each side's loop runs instead in one `block_on` of a current-thread tokio
//! runtime on that thread, and its waits are tokio's: busy-poll yields to the runtime every 64
//! empty polls, event mode waits through evchan-core's `AsyncWaiter` (the same loop, the sleep
//! done by the runtime's reactor). Still no shard and no hand-off: what an async API that posts
//! and reaps from the connection's own task could reach.
//!
//! The server echoes every message until the client disconnects; the client times each round
//! trip (post of the message → its echo's receive completion).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;

use evchan_core::cm::state::CanCreateQp;
use evchan_core::cm::{ConnParam, EventKind, PortSpace};
use evchan_core::verbs::{
    AsyncWaiter, CompChannel, Cq, Mr, Pd, PostedSlot, QpInit, Slot, SlotPool, WorkCompletion,
};
use evchan_core::{CmEvent, CmId, EventChannel};

use crate::tools_support::fail;
use crate::PROGRAM;

/// Receives kept posted on each side (the peer has one message in flight).
const RECVS: usize = 8;
/// Send slots: one in flight, its completion reaped before or after the echo.
const SENDS: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server waits for its client's request (a client under valgrind takes seconds
/// to start, in the VM).
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(60);
/// With `--tokio`, busy-poll yields to the runtime after this many empty polls.
const SPINS_PER_YIELD: u32 = 64;

/// How a side waits for its completions.
#[derive(Clone, Copy)]
pub enum Wait {
    Busy,
    Event,
}

/// The next event on `ch`, checked to be `kind`.
fn expect(ch: &EventChannel, kind: EventKind) -> CmEvent<'_> {
    expect_within(ch, kind, TIMEOUT)
}

/// The next event on `ch` within `timeout`, checked to be `kind`.
fn expect_within(ch: &EventChannel, kind: EventKind, timeout: Duration) -> CmEvent<'_> {
    let ev = ch
        .get_event_timeout(timeout)
        .unwrap_or_else(|e| fail(PROGRAM, format!("rdma_get_cm_event: {e}")))
        .unwrap_or_else(|| fail(PROGRAM, format!("no {kind} within {timeout:?}")));
    if ev.kind() != kind {
        fail(PROGRAM, format!("expected {kind}, got {ev:?}"));
    }
    ev
}

fn check<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| fail(PROGRAM, format!("{what}: {e}")))
}

/// Runs `f` to its end: in `rt`'s `block_on`, or else (no runtime: the waits are the thread's
/// own and never pend) polled once.
fn run<F: Future>(rt: Option<&Runtime>, f: F) -> F::Output {
    if let Some(rt) = rt {
        return rt.block_on(f);
    }
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => unreachable!("without a runtime no wait pends"),
    }
}

/// One side's verbs objects and slots once its QP exists.
struct Side<'a> {
    cq: &'a Cq<'a>,
    recvs: Vec<PostedSlot>,
    sends: Vec<PostedSlot>,
    free: Vec<Slot>,
    wait: Wait,
    /// `--tokio`: the runtime whose `block_on` runs the side's loop ([`run`]).
    rt: Option<&'a Runtime>,
    /// `--tokio` in event mode: the completion channel on the runtime's reactor.
    waiter: Option<&'a AsyncWaiter<'a, 'a>>,
}

impl Side<'_> {
    /// Handles one completion: a send's slot goes back to `free`; a receive's slot is returned
    /// (`Some(None)` for a failed receive: the peer disconnected).
    fn on_wc(&mut self, wc: &WorkCompletion) -> Option<Option<Slot>> {
        if let Some(i) = self.sends.iter().position(|p| p.is_completed_by(wc)) {
            let slot = self.sends.swap_remove(i).complete(wc);
            self.free.push(slot.unwrap_or_else(|_| unreachable!()));
            None
        } else if let Some(i) = self.recvs.iter().position(|p| p.is_completed_by(wc)) {
            let slot = self.recvs.swap_remove(i).complete(wc);
            Some(
                wc.is_success()
                    .then_some(slot.unwrap_or_else(|_| unreachable!())),
            )
        } else {
            fail(PROGRAM, format!("an unknown completion {wc:?}"))
        }
    }

    /// Waits for the next completion (or, in event mode, the next batch) and handles it:
    /// a receive's slot, if one came. Fails after [`TIMEOUT`] without a completion.
    async fn next(&mut self) -> Option<Option<Slot>> {
        let cq = self.cq;
        match (self.wait, self.waiter) {
            (Wait::Busy, _) => {
                // The clock is read only every 1024 empty polls, and first after that many.
                let mut spins = 0u32;
                let mut idle_since = None;
                loop {
                    if let Some(wc) = check(cq.poll_one(), "ibv_poll_cq") {
                        return self.on_wc(&wc);
                    }
                    spins = spins.wrapping_add(1);
                    if self.rt.is_some() && spins.is_multiple_of(SPINS_PER_YIELD) {
                        tokio::task::yield_now().await;
                    }
                    if spins.is_multiple_of(1024)
                        && idle_since.get_or_insert_with(Instant::now).elapsed() > TIMEOUT
                    {
                        fail(PROGRAM, format!("no completion within {TIMEOUT:?}"));
                    }
                }
            }
            (Wait::Event, waiter) => {
                let mut got = None;
                let mut on_wc = |wc: WorkCompletion| {
                    if let Some(slot) = self.on_wc(&wc) {
                        got = Some(slot);
                    }
                };
                let n = match waiter {
                    None => cq.wait(Some(TIMEOUT), on_wc),
                    Some(waiter) => {
                        let cqs = [cq];
                        let wait = waiter.wait(&cqs, |_, wc| on_wc(wc));
                        tokio::time::timeout(TIMEOUT, wait).await.unwrap_or(Ok(0))
                    }
                };
                if check(n, "the CQ's wait") == 0 {
                    fail(PROGRAM, format!("no completion within {TIMEOUT:?}"));
                }
                got
            }
        }
    }

    /// Waits until every send has completed (a receive's completion meanwhile is dropped).
    async fn reap_sends(&mut self) {
        while !self.sends.is_empty() {
            let _ = self.next().await;
        }
    }

    /// Waits for the next receive completion, reaping send completions on the way; the
    /// received slot (`None` at a failed receive: the peer disconnected).
    async fn recv(&mut self) -> Option<Slot> {
        loop {
            if let Some(got) = self.next().await {
                return got;
            }
        }
    }
}

/// Makes the id's verbs objects (a PD, a completion channel and CQ, a registered pool of
/// slots; with `tokio` a current-thread runtime) on its device, its QP on them, posts the
/// receives, and runs `f` with the id and its side; everything goes when `f` returns.
fn with_qp<S: CanCreateQp, R>(
    id: CmId<'_, S>,
    size: usize,
    wait: Wait,
    tokio: bool,
    f: impl for<'a> FnOnce(CmId<'a, S>, Side<'a>, &'a Mr<'a, SlotPool>) -> R,
) -> R {
    let ctx = check(id.context(), "the id's context");
    let pd = check(Pd::new(&ctx), "ibv_alloc_pd");
    let comp = check(CompChannel::new(&ctx), "ibv_create_comp_channel");
    let cq = check(Cq::new(&comp, 64), "ibv_create_cq");
    let (pool, free) = check(SlotPool::new(RECVS + SENDS, size.max(64)), "slots");
    let mr = check(pd.reg_mr(pool), "ibv_reg_mr");
    let rt = tokio.then(|| {
        check(
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
            "tokio",
        )
    });
    let waiter = match (&rt, wait) {
        (Some(rt), Wait::Event) => {
            let _in_rt = rt.enter();
            Some(check(
                comp.async_waiter(),
                "the completion channel's registration",
            ))
        }
        _ => None,
    };
    // Rebound after the objects its QP borrows, so that it goes before them.
    let mut id = id;
    check(
        id.create_qp_with(&pd, &cq, &cq, &QpInit::new()),
        "rdma_create_qp",
    );
    let mut side = Side {
        cq: &cq,
        recvs: Vec::new(),
        sends: Vec::new(),
        free,
        wait,
        rt: rt.as_ref(),
        waiter: waiter.as_ref(),
    };
    for _ in 0..RECVS {
        let slot = side.free.pop().expect("a slot");
        side.recvs
            .push(check(id.post_recv_slot(&mr, slot), "ibv_post_recv"));
    }
    f(id, side, &mr)
}

/// Echoes every message of one client until it disconnects.
pub fn serve(addr: SocketAddr, size: usize, wait: Wait, tokio: bool) {
    let ch = check(EventChannel::new(), "rdma_create_event_channel");
    let listener = check(CmId::new(&ch, PortSpace::Tcp), "rdma_create_id");
    let listener = check(
        check(listener.bind(addr), "rdma_bind_addr").listen(8),
        "rdma_listen",
    );
    let mut req = expect_within(&ch, EventKind::ConnectRequest, ACCEPT_TIMEOUT);
    let id = req.take_request().expect("a request's id");
    req.ack();
    with_qp(id, size, wait, tokio, |id, mut side, mr| {
        let id = check(id.accept(&ConnParam::new()), "rdma_accept");
        let ev = expect(&ch, EventKind::Established);
        let id = check(id.established(&ev), "ESTABLISHED");
        ev.ack();
        // Until the client's empty message (or a failed receive).
        run(side.rt, async {
            while let Some(msg) = side.recv().await.filter(|m| !m.is_empty()) {
                let mut out = side.free.pop().expect("a send slot");
                check(out.copy_from(msg.as_slice()), "the echo");
                side.recvs
                    .push(check(id.post_recv_slot(mr, msg), "ibv_post_recv"));
                side.sends
                    .push(check(id.post_send_slot(mr, out, None), "ibv_post_send"));
            }
        });
        // Both sides disconnect on the empty message, whichever goes first: the other's call
        // may find the connection gone, which ends it as well.
        let _ = id.disconnect();
    });
    drop(listener);
}

/// Connects (retrying while nobody listens yet), runs `warmup` untimed and `iters` timed round
/// trips of `size` bytes; the round trips' times in µs.
pub fn client(
    addr: SocketAddr,
    size: usize,
    warmup: usize,
    iters: usize,
    wait: Wait,
    tokio: bool,
) -> Vec<f64> {
    let ch = check(EventChannel::new(), "rdma_create_event_channel");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let id = check(CmId::new(&ch, PortSpace::Tcp), "rdma_create_id");
        let id = check(id.resolve_addr(None, addr, TIMEOUT), "rdma_resolve_addr");
        let ev = expect(&ch, EventKind::AddrResolved);
        let id = check(id.addr_resolved(&ev), "ADDR_RESOLVED");
        ev.ack();
        let id = check(id.resolve_route(TIMEOUT), "rdma_resolve_route");
        let ev = expect(&ch, EventKind::RouteResolved);
        let id = check(id.route_resolved(&ev), "ROUTE_RESOLVED");
        ev.ack();
        let done = with_qp(id, size, wait, tokio, |id, mut side, mr| {
            let id = check(id.connect(&ConnParam::new()), "rdma_connect");
            let ev = check(ch.get_event_timeout(TIMEOUT), "rdma_get_cm_event")
                .unwrap_or_else(|| fail(PROGRAM, "no answer to the connect"));
            if ev.kind() == EventKind::Rejected && Instant::now() < deadline {
                // Nobody listens yet: again, on a new id.
                ev.ack();
                return None;
            }
            if ev.kind() != EventKind::Established {
                fail(PROGRAM, format!("connect: {ev:?}"));
            }
            let id = check(id.established(&ev), "ESTABLISHED");
            ev.ack();
            let rtt = run(side.rt, async {
                let mut rtt = Vec::with_capacity(iters);
                let mut msg = vec![0x5au8; size];
                for i in 0..warmup + iters {
                    let seq = (i as u64).to_be_bytes();
                    let k = size.min(seq.len());
                    msg[..k].copy_from_slice(&seq[..k]);
                    let t = Instant::now();
                    let mut out = side.free.pop().expect("a send slot");
                    check(out.copy_from(&msg), "the message");
                    side.sends
                        .push(check(id.post_send_slot(mr, out, None), "ibv_post_send"));
                    let back = side
                        .recv()
                        .await
                        .unwrap_or_else(|| fail(PROGRAM, "the peer went away"));
                    let took = t.elapsed();
                    if back.as_slice() != msg.as_slice() {
                        fail(PROGRAM, format!("the echo of message {i} differs"));
                    }
                    side.recvs
                        .push(check(id.post_recv_slot(mr, back), "ibv_post_recv"));
                    if i >= warmup {
                        rtt.push(crate::tools_support::us(took));
                    }
                }
                // The end: an empty message, once it is through.
                let mut end = side.free.pop().expect("a send slot");
                check(end.set_len(0), "the end");
                side.sends
                    .push(check(id.post_send_slot(mr, end, None), "ibv_post_send"));
                side.reap_sends().await;
                rtt
            });
            let _ = id.disconnect();
            Some(rtt)
        });
        if let Some(rtt) = done {
            return rtt;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
