//! Device tests of the verbs layer: run them in the soft-RoCE VM
//! (`cargo xtask vm --env EVCHAN_REQUIRE_DEVICE=1 -- target/debug/deps/device_verbs-… --test-threads=1`).
//! Natively without a device they skip (or fail with `EVCHAN_REQUIRE_DEVICE=1`).
#![forbid(unsafe_code)]

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use evchan_core::verbs::{
    CompChannel, Cq, GidType, LinkLayer, Mr, PortState, Posted, QpCaps, QpState, RtsAttr, WcOpcode,
    WcStatus, WorkCompletion, ACK_BATCH,
};
use support::verbs::{
    complete, loopback, open_device, rc_pair, rc_pair_with, recv, send, wait_for,
};
use support::within;

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn device_list_ports_and_gids() {
    require_device!();
    let ctx = open_device();
    assert!(!ctx.name().is_empty());
    let ports = ctx.ports().unwrap();
    assert!(!ports.is_empty());
    let p1 = ports[0];
    eprintln!("{}: {p1:?}", ctx.name());
    assert_eq!(p1.number, 1);
    assert_eq!(p1.state, PortState::Active);
    assert_eq!(p1.link_layer, LinkLayer::Ethernet);
    let gids = ctx.gids(1).unwrap();
    for g in &gids {
        eprintln!("  {g:?}");
    }
    if ctx.name() == "rxe0" {
        assert!(gids
            .iter()
            .any(|g| g.ipv4() == Some(support::VM_IPV4) && g.gid_type == GidType::RoceV2));
        let ll: std::net::Ipv6Addr = "fe80::ff:fe00:1".parse().unwrap();
        assert!(gids.iter().any(|g| g.ipv6() == ll));
    }
    assert!(ctx.port(0).is_err(), "port 0 is rejected, not queried");
    assert!(ctx.gid(1, 100_000).is_err());
}

/// A send and a receive through the safe owned-buffer posts, waited for on one CQ.
#[test]
fn one_cq_send_recv_event_driven() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, ch) = loopback(&ctx);
    let cq = Cq::new(&ch, 16).unwrap();
    let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));
    assert_eq!(a.state(), QpState::Rts);

    let rx = recv(&pd, &b, 64);
    let tx = send(&pd, &a, b"hello, rxe".to_vec(), Some(0xfeed_beef));
    let start = Instant::now();
    let wcs = wait_for(&cq, 2, 10 * SECOND);
    eprintln!("2 completions in {:?}", start.elapsed());
    assert_eq!(wcs.len(), 2);
    let recv = *wcs.iter().find(|wc| rx.is_completed_by(wc)).unwrap();
    let send = *wcs.iter().find(|wc| tx.is_completed_by(wc)).unwrap();
    assert_eq!(recv.status(), WcStatus::Success);
    assert_eq!(recv.opcode(), Some(WcOpcode::Recv));
    assert_eq!(recv.byte_len(), 10);
    assert_eq!(recv.imm_data(), Some(0xfeed_beef));
    assert_eq!(recv.qp_num(), b.qp_num());
    assert_eq!(send.status(), WcStatus::Success);
    assert_eq!(send.opcode(), Some(WcOpcode::Send));
    assert_eq!(send.qp_num(), a.qp_num());
    // The wrong completion does not give a region back; the right one does.
    let rx = rx.complete(&send).unwrap_err();
    let mr = rx.complete(&recv).unwrap();
    assert_eq!(&mr.as_slice()[..10], b"hello, rxe");
    let buf = tx.complete(&send).unwrap().into_inner().unwrap();
    assert_eq!(buf, b"hello, rxe");
}

/// `wait` hands out a wake-up's completions before it reads the event that announced them;
/// the next wait that finds the CQ empty reads (and counts the ack of) that event before it
/// arms the CQ and sleeps, so none is left behind.
#[test]
fn wait_reads_the_event_after_handing_out_its_completions() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, ch) = loopback(&ctx);
    let cq = Cq::new(&ch, 16).unwrap();
    // The sender's completions go to a CQ of their own, never armed: the watched CQ gets the
    // receive's completion alone, so one wake-up brings all it will get (with both on one CQ,
    // a slow host can split them over two wake-ups, the second wait then reading the first
    // event, as it should).
    let sender_cq = Cq::new(&ch, 16).unwrap();
    let (a, b) = rc_pair(&gid, &pd, (&sender_cq, &sender_cq), (&cq, &cq));
    let rx = recv(&pd, &b, 64);
    let mut wcs = Vec::new();
    let tx = std::thread::scope(|scope| {
        // The send goes out once the wait below has found nothing and is asleep.
        let sender = scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            send(&pd, &a, b"woken".to_vec(), None)
        });
        let n = cq.wait(Some(10 * SECOND), |wc| wcs.push(wc)).unwrap();
        assert_eq!(n, 1, "the receive's completion within 10 s");
        sender.join().unwrap()
    });
    assert_eq!(
        ch.events_read(),
        0,
        "the completions came before the event's read"
    );
    // It sleeps: 300 ms of waiting cost next to no CPU time.
    let ticks = support::thread_cpu_ticks();
    let idle = cq.wait(Some(Duration::from_millis(300)), |wc| wcs.push(wc));
    assert_eq!(idle.unwrap(), 0, "nothing more was posted");
    let spent = support::thread_cpu_ticks() - ticks;
    assert!(
        spent < 15,
        "an idle wait used {spent} ticks of CPU in 300 ms"
    );
    assert_eq!(ch.events_read(), 1, "the next wait read the event");
    assert_eq!(cq.pending_acks(), 1, "its ack is counted into the batch");
    assert!(
        ch.try_get_cq_event(&[&cq]).unwrap().is_none(),
        "no event left"
    );
    // The send's completion, polled from its own CQ.
    let start = Instant::now();
    while !wcs.iter().any(|wc| tx.is_completed_by(wc)) {
        assert!(start.elapsed() < 10 * SECOND, "the send's completion");
        sender_cq.poll(&mut wcs, 1).unwrap();
    }
    for p in [tx, rx] {
        let wc = wcs.iter().find(|wc| p.is_completed_by(wc)).unwrap();
        assert!(p.complete(wc).is_ok(), "{wc:?}");
    }
}

/// Four CQs on one channel: events are routed to the right CQ, completions land on the CQ
/// their QP's queue names.
#[test]
fn four_cqs_on_one_channel() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, ch) = loopback(&ctx);
    let cqs: Vec<Cq<'_>> = (0..4).map(|_| Cq::new(&ch, 64).unwrap()).collect();
    let refs: Vec<&Cq<'_>> = cqs.iter().collect();
    // a: sends on cq0, receives on cq1; b: sends on cq2, receives on cq3.
    let (a, b) = rc_pair(&gid, &pd, (&cqs[0], &cqs[1]), (&cqs[2], &cqs[3]));

    // 1. get_cq_event by hand: a -> b raises events on cq0 (send) and cq3 (recv) only.
    for cq in &cqs {
        cq.req_notify(false).unwrap();
    }
    let rx = recv(&pd, &b, 32);
    let tx = send(&pd, &a, vec![1u8; 32], None);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let ev = ch
            .get_cq_event_timeout(&refs, 10 * SECOND)
            .unwrap()
            .expect("an event within 10 s");
        assert_eq!(ev.cq().id(), refs[ev.index()].id());
        seen.push(ev.index());
        ev.ack();
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 3]);
    assert!(
        ch.try_get_cq_event(&refs).unwrap().is_none(),
        "EAGAIN: Ok(None)"
    );
    assert_eq!(cqs[0].pending_acks(), 1);
    assert_eq!(cqs[3].pending_acks(), 1);
    let mut wcs = Vec::new();
    assert_eq!(cqs[0].poll(&mut wcs, 8).unwrap(), 1);
    assert_eq!(cqs[3].poll(&mut wcs, 8).unwrap(), 1);
    assert!(tx.complete(&wcs[0]).is_ok());
    assert!(rx.complete(&wcs[1]).is_ok());

    // 2. The wait helper over all four, both directions at once.
    let mut pending: HashMap<u64, Posted<'_, Vec<u8>>> = HashMap::new();
    for (qp, peer) in [(&a, &b), (&b, &a)] {
        for _ in 0..8 {
            let r = recv(&pd, peer, 32);
            pending.insert(r.wr_id(), r);
            let s = send(&pd, qp, vec![2u8; 32], None);
            pending.insert(s.wr_id(), s);
        }
    }
    let expected_cq = |wc: &WorkCompletion| -> usize {
        match (wc.qp_num() == a.qp_num(), wc.opcode()) {
            (true, Some(WcOpcode::Send)) => 0,
            (true, Some(WcOpcode::Recv)) => 1,
            (false, Some(WcOpcode::Send)) => 2,
            (false, Some(WcOpcode::Recv)) => 3,
            other => panic!("unexpected completion {other:?} {wc:?}"),
        }
    };
    let mut per_cq = [0usize; 4];
    while !pending.is_empty() {
        let n = ch
            .wait(&refs, Some(10 * SECOND), |i, wc| {
                assert!(wc.is_success(), "{wc:?}");
                assert_eq!(i, expected_cq(&wc), "{wc:?} on the wrong CQ");
                per_cq[i] += 1;
                let posted = pending.remove(&wc.wr_id()).expect("a completion seen once");
                assert!(posted.complete(&wc).is_ok());
            })
            .unwrap();
        assert!(
            n > 0,
            "no completion within 10 s; missing {}",
            pending.len()
        );
    }
    assert_eq!(per_cq, [8, 8, 8, 8]);
    eprintln!(
        "pending acks after: {:?}",
        cqs.iter().map(Cq::pending_acks).collect::<Vec<_>>()
    );
}

/// 100,000 messages (set EVCHAN_COMPLETIONS to change), each one a send completion and a
/// receive completion, every one counted exactly once: none lost, none twice.
///
/// soft-RoCE completes a loopback send inside `ibv_post_send`, so a single thread that posts
/// and then waits always finds its completions by polling and never sleeps. Here the receiver
/// is its own thread with its own channel: its CQ is usually empty when it waits, so it arms,
/// polls and sleeps on the channel, and is woken by the events the sender's posts raise.
#[test]
fn hundred_thousand_completions_none_lost_none_twice() {
    require_device!();
    let ctx = open_device();
    let total: u32 = std::env::var("EVCHAN_COMPLETIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let window: usize = std::env::var("EVCHAN_WINDOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    const RECVS: usize = 256;
    // One channel per waiting thread (an event read by one waiter is not seen by another).
    let (gid, pd, send_ch) = loopback(&ctx);
    let recv_ch = CompChannel::new(&ctx).unwrap();
    let send_cq = Cq::new(&send_ch, 1024).unwrap();
    let recv_cq = Cq::new(&recv_ch, 1024).unwrap();
    let caps = QpCaps {
        max_send_wr: 512,
        max_recv_wr: 512,
        ..QpCaps::default()
    };
    let (a, b) = rc_pair_with(
        &gid,
        &pd,
        (&send_cq, &send_cq),
        (&recv_cq, &recv_cq),
        caps,
        RtsAttr::default(),
    );

    let mut recvs: HashMap<u64, Posted<'_, Vec<u8>>> = HashMap::new();
    for _ in 0..RECVS {
        let r = recv(&pd, &b, 8);
        recvs.insert(r.wr_id(), r);
    }
    let start = Instant::now();
    let (sender_stats, recv_waits) = std::thread::scope(|scope| {
        let sender = scope.spawn(|| {
            let mut free: Vec<Mr<'_, Vec<u8>>> = (0..window)
                .map(|_| pd.reg_mr(vec![0u8; 8]).unwrap())
                .collect();
            let mut in_flight: HashMap<u64, (u32, Posted<'_, Vec<u8>>)> = HashMap::new();
            let mut done = vec![false; total as usize];
            let (mut next, mut completed, mut waits) = (0u32, 0u32, 0u64);
            while completed < total {
                while next < total {
                    let Some(mut mr) = free.pop() else { break };
                    mr.as_mut_slice()
                        .copy_from_slice(&u64::from(next).to_le_bytes());
                    let p = a.post_send(mr, 0..8, Some(next)).unwrap();
                    in_flight.insert(p.wr_id(), (next, p));
                    next += 1;
                }
                waits += 1;
                let n = send_cq
                    .wait(Some(30 * SECOND), |wc| {
                        assert!(wc.is_success(), "{wc:?}");
                        let (seq, p) = in_flight
                            .remove(&wc.wr_id())
                            .expect("a send completion seen once");
                        assert!(!std::mem::replace(&mut done[seq as usize], true));
                        free.push(p.complete(&wc).unwrap());
                        completed += 1;
                    })
                    .unwrap();
                assert!(n > 0, "sender stalled at {completed}/{total}");
            }
            assert!(done.iter().all(|&d| d));
            (waits, send_ch.events_read())
        });

        let mut seen = vec![false; total as usize];
        let (mut received, mut waits) = (0u32, 0u64);
        while received < total {
            waits += 1;
            let mut reposts = Vec::new();
            let n = recv_cq
                .wait(Some(30 * SECOND), |wc| {
                    assert!(wc.is_success(), "{wc:?}");
                    let p = recvs
                        .remove(&wc.wr_id())
                        .expect("a recv completion seen once");
                    let seq = wc.imm_data().expect("immediate data");
                    let mr = p.complete(&wc).unwrap();
                    assert_eq!(mr.as_slice(), u64::from(seq).to_le_bytes());
                    assert!(
                        !std::mem::replace(&mut seen[seq as usize], true),
                        "message {seq} received twice"
                    );
                    received += 1;
                    reposts.push(mr);
                })
                .unwrap();
            assert!(n > 0, "receiver stalled at {received}/{total}");
            for mr in reposts {
                let r = b.post_recv(mr, 0..8).unwrap();
                recvs.insert(r.wr_id(), r);
            }
        }
        assert!(seen.iter().all(|&s| s), "a message was lost");
        (sender.join().unwrap(), waits)
    });
    let elapsed = start.elapsed();
    let recv_events = recv_ch.events_read();
    eprintln!(
        "{total} messages = {} completions in {elapsed:.2?} (window {window}): {:.0} completions/s; \
         receiver: {recv_waits} waits, {recv_events} CQ events read; sender: {} waits, {} events; \
         pending acks at end {} + {} (batch {ACK_BATCH})",
        2 * u64::from(total),
        2.0 * f64::from(total) / elapsed.as_secs_f64(),
        sender_stats.0,
        sender_stats.1,
        send_cq.pending_acks(),
        recv_cq.pending_acks(),
    );
    assert!(
        recv_events > 0,
        "the receiver never slept on its channel: not event-driven"
    );
}

/// `req_notify(true)` (solicited only): an ordinary send completes silently, a solicited one
/// raises the event.
#[test]
fn solicited_only_arming() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, ch) = loopback(&ctx);
    let (send_cq, recv_cq) = (Cq::new(&ch, 16).unwrap(), Cq::new(&ch, 16).unwrap());
    let (a, b) = rc_pair(&gid, &pd, (&send_cq, &send_cq), (&recv_cq, &recv_cq));
    let mut posted = Vec::new();
    for _ in 0..2 {
        posted.push(recv(&pd, &b, 8));
    }
    recv_cq.req_notify(true).unwrap();
    posted.push(send(&pd, &a, vec![1u8; 8], None));
    let quiet = ch
        .get_cq_event_timeout(&[&send_cq, &recv_cq], Duration::from_millis(500))
        .unwrap();
    assert!(quiet.is_none(), "an unsolicited receive raised {quiet:?}");
    posted.push(
        a.post_send_solicited(pd.reg_mr(vec![2u8; 8]).unwrap(), 0..8, Some(2))
            .unwrap(),
    );
    let ev = ch
        .get_cq_event_timeout(&[&send_cq, &recv_cq], 10 * SECOND)
        .unwrap()
        .expect("the solicited receive raises an event");
    assert_eq!(ev.index(), 1);
    ev.ack();
    let mut wcs = Vec::new();
    while wcs.len() < 4 {
        recv_cq.poll(&mut wcs, 4).unwrap();
        send_cq.poll(&mut wcs, 4).unwrap();
    }
    let imms: Vec<_> = wcs
        .iter()
        .filter(|wc| wc.opcode() == Some(WcOpcode::Recv))
        .map(WorkCompletion::imm_data)
        .collect();
    assert_eq!(imms, [None, Some(2)]);
    for p in posted {
        let wc = wcs.iter().find(|wc| p.is_completed_by(wc)).unwrap();
        assert!(p.complete(wc).is_ok());
    }
}

/// Acks are counted per CQ and flushed with one ibv_ack_cq_events call at ACK_BATCH.
#[test]
fn acks_are_batched_and_flushed_at_the_threshold() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, ch) = loopback(&ctx);
    let cq = Cq::new(&ch, 16).unwrap();
    let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));
    let (mut rx_mr, mut tx_mr) = (
        Some(pd.reg_mr(vec![0u8; 8]).unwrap()),
        Some(pd.reg_mr(vec![0u8; 8]).unwrap()),
    );
    let mut history = Vec::new();
    for round in 0..(ACK_BATCH + 5) {
        let rx = b.post_recv(rx_mr.take().unwrap(), 0..8).unwrap();
        cq.req_notify(false).unwrap();
        let tx = a.post_send(tx_mr.take().unwrap(), 0..8, None).unwrap();
        let ev = ch
            .get_cq_event_timeout(&[&cq], 10 * SECOND)
            .unwrap()
            .unwrap_or_else(|| panic!("no event in round {round}"));
        drop(ev); // ack on drop
        history.push(cq.pending_acks());
        let mut wcs = Vec::new();
        while wcs.len() < 2 {
            cq.poll(&mut wcs, 2).unwrap();
        }
        // Any event raised meanwhile by the second completion is drained and acked.
        while let Some(ev) = ch.try_get_cq_event(&[&cq]).unwrap() {
            ev.ack();
        }
        let (rx, tx) = (
            rx.complete(&wcs[0]).or_else(|rx| rx.complete(&wcs[1])),
            tx.complete(&wcs[0]).or_else(|tx| tx.complete(&wcs[1])),
        );
        rx_mr = Some(rx.unwrap());
        tx_mr = Some(tx.unwrap());
    }
    eprintln!("pending acks after each event: {history:?}");
    assert!(
        history.iter().all(|&p| p < ACK_BATCH),
        "flushed at {ACK_BATCH}"
    );
    assert!(
        history.windows(2).any(|w| w[1] < w[0]),
        "a batch was flushed"
    );
    let before = cq.pending_acks();
    assert!(before > 0);
    cq.flush_acks();
    assert_eq!(cq.pending_acks(), 0);
}

/// Completion errors come back as typed work completions: a receive buffer too small, and a
/// send to a QP that was destroyed.
#[test]
fn completion_errors_are_typed() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, ch) = loopback(&ctx);
    let cq = Cq::new(&ch, 64).unwrap();

    // Receive buffer too small: 8 bytes posted, 64 sent.
    {
        let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));
        let rx = recv(&pd, &b, 8);
        let tx = send(&pd, &a, vec![7u8; 64], None);
        let wcs = wait_for(&cq, 2, 20 * SECOND);
        let recv = wcs.iter().find(|wc| rx.is_completed_by(wc)).unwrap();
        let send = wcs.iter().find(|wc| tx.is_completed_by(wc)).unwrap();
        eprintln!(
            "too small: recv {:?}, send {:?}",
            recv.status(),
            send.status()
        );
        // The IB spec's status is LOC_LEN_ERR; soft-RoCE (Linux 6.1) reports LOC_QP_OP_ERR.
        assert!(
            matches!(
                recv.status(),
                WcStatus::LocalLength | WcStatus::LocalQpOperation
            ),
            "{recv:?}"
        );
        assert_eq!(recv.opcode(), None);
        assert!(!send.is_success());
        assert!(rx.complete(recv).is_ok() && tx.complete(send).is_ok());
    }

    // Send to a destroyed QP: no answer, retries exhausted.
    {
        let fast_fail = RtsAttr {
            timeout: 8, // 4.096 µs × 2^8 ≈ 1 ms
            retry_cnt: 1,
            rnr_retry: 1,
            ..RtsAttr::default()
        };
        let (a, b) = rc_pair_with(
            &gid,
            &pd,
            (&cq, &cq),
            (&cq, &cq),
            QpCaps::default(),
            fast_fail,
        );
        drop(b);
        let rx = recv(&pd, &a, 8);
        let tx = send(&pd, &a, vec![7u8; 16], None);
        let mut wcs = Vec::new();
        let start = Instant::now();
        while !wcs.iter().any(|wc| tx.is_completed_by(wc)) {
            assert!(cq.wait(Some(30 * SECOND), |wc| wcs.push(wc)).unwrap() > 0);
        }
        let send = *wcs.iter().find(|wc| tx.is_completed_by(wc)).unwrap();
        eprintln!(
            "destroyed peer: {:?} after {:?}",
            send.status(),
            start.elapsed()
        );
        assert_eq!(send.status(), WcStatus::RetryExceeded);
        assert_eq!(send.qp_num(), a.qp_num());
        assert!(tx.complete(&send).is_ok());
        // Moving the QP to ERROR flushes the outstanding receive.
        a.modify_to_error().unwrap();
        assert_eq!(a.state(), QpState::Error);
        while !wcs.iter().any(|wc| rx.is_completed_by(wc)) {
            assert!(cq.wait(Some(10 * SECOND), |wc| wcs.push(wc)).unwrap() > 0);
        }
        let recv = *wcs.iter().find(|wc| rx.is_completed_by(wc)).unwrap();
        eprintln!("receive on the errored QP: {:?}", recv.status());
        assert_eq!(recv.status(), WcStatus::WrFlush);
        assert!(rx.complete(&recv).is_ok());
        // Async events the errors raised (if the driver raises any) name the QP; they are
        // acked at read, so destroying the QP afterwards cannot wait on them.
        let qp_num = a.qp_num();
        while let Some(ev) = ctx.try_get_async_event().unwrap() {
            eprintln!("async event after the errors: {ev:?} (a = {qp_num})");
        }
        within(Duration::from_secs(20), "destroying the errored QP", || {
            drop(a)
        });
    }
}

/// ibv_destroy_cq waits until every event read for the CQ is acked; with acks pending in the
/// batch, dropping (or destroying) the CQ must flush them first and never hang.
#[test]
fn destroy_cq_with_pending_acks_never_hangs() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, ch) = loopback(&ctx);
    for explicit in [false, true] {
        let cq = Cq::new(&ch, 64).unwrap();
        {
            let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));
            // A few events, each read and acked into the batch (fewer than ACK_BATCH).
            for _ in 0..3 {
                let rx = recv(&pd, &b, 8);
                cq.req_notify(false).unwrap();
                let tx = send(&pd, &a, vec![0u8; 8], None);
                let ev = ch
                    .get_cq_event_timeout(&[&cq], 10 * SECOND)
                    .unwrap()
                    .unwrap();
                ev.ack();
                let wcs = wait_for(&cq, 2, 10 * SECOND);
                let _ = rx.complete(&wcs[0]).or_else(|rx| rx.complete(&wcs[1]));
                let _ = tx.complete(&wcs[0]).or_else(|tx| tx.complete(&wcs[1]));
            }
        }
        let pending = cq.pending_acks();
        assert!(pending > 0 && pending < ACK_BATCH, "pending {pending}");
        within(
            Duration::from_secs(20),
            "destroying a CQ with pending acks",
            || {
                if explicit {
                    cq.destroy().expect("ibv_destroy_cq");
                } else {
                    drop(cq);
                }
            },
        );
        eprintln!(
            "CQ with {pending} pending acks destroyed ({})",
            if explicit { "destroy" } else { "drop" }
        );
    }
}

/// EBUSY from ibv_destroy_comp_channel needs a CQ alive on the channel, which the borrow
/// checker rules out (see tests/ui/verbs_channel_dropped_while_cq_lives.rs); here, a channel
/// that had CQs with events read and acks pending is destroyed without error.
#[test]
fn destroy_comp_channel_never_ebusy() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, ch) = loopback(&ctx);
    {
        let cqs: Vec<Cq<'_>> = (0..4).map(|_| Cq::new(&ch, 16).unwrap()).collect();
        let (a, b) = rc_pair(&gid, &pd, (&cqs[0], &cqs[1]), (&cqs[2], &cqs[3]));
        let refs: Vec<&Cq<'_>> = cqs.iter().collect();
        let rx = recv(&pd, &b, 8);
        let tx = send(&pd, &a, vec![0u8; 8], None);
        let mut wcs = Vec::new();
        while wcs.len() < 2 {
            ch.wait(&refs, Some(10 * SECOND), |_, wc| wcs.push(wc))
                .unwrap();
        }
        drop((rx, tx));
        // Qp, then CQs in creation order (reverse of declaration drop order would also do).
    }
    within(Duration::from_secs(20), "destroying the channel", || {
        ch.destroy().expect("ibv_destroy_comp_channel: no EBUSY");
    });
}

/// An event for a CQ that is not in the list given is acked and reported, never leaked.
#[test]
fn unlisted_cq_event_is_acked_and_reported() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, ch) = loopback(&ctx);
    let (c0, c1) = (Cq::new(&ch, 16).unwrap(), Cq::new(&ch, 16).unwrap());
    let (a, b) = rc_pair(&gid, &pd, (&c1, &c1), (&c1, &c1));
    c1.req_notify(false).unwrap();
    let rx = recv(&pd, &b, 8);
    let tx = send(&pd, &a, vec![0u8; 8], None);
    evchan_sys::fd::poll_readable(ch.fd(), Some(10 * SECOND)).unwrap();
    match ch.get_cq_event(&[&c0]) {
        Err(evchan_core::verbs::Error::UnlistedCq(id)) => assert_eq!(id, c1.id()),
        other => panic!("expected UnlistedCq, got {other:?}"),
    }
    assert_eq!(c1.pending_acks(), 0, "acked at once, not counted");
    let mut wcs = Vec::new();
    while wcs.len() < 2 {
        c1.poll(&mut wcs, 4).unwrap();
    }
    drop((rx, tx, a, b));
    within(Duration::from_secs(20), "destroying the CQ", || drop(c1));
}

/// What `ibv_destroy_qp` does to the QP's work in the CQs it used, which evchan's docs leave to
/// the provider: rdma-core's mlx5 provider removes the QP's completions from its CQs in the
/// destroy (`__mlx5_cq_clean`), and rxe (Linux 6.1, observed here) leaves them. Neither flushes
/// the receives still posted. A completion that is still there after the destroy completes its
/// `Posted`, which holds the region, not the QP.
#[test]
fn a_destroyed_qps_completions_left_in_its_cq() {
    require_device!();
    let ctx = open_device();
    let rxe = ctx.name().starts_with("rxe");
    let (gid, pd, ch) = loopback(&ctx);
    let (a_cq, b_cq) = (Cq::new(&ch, 16).unwrap(), Cq::new(&ch, 16).unwrap());
    let (a, b) = rc_pair(&gid, &pd, (&a_cq, &a_cq), (&b_cq, &b_cq));
    let b_num = b.qp_num();
    let delivered = recv(&pd, &b, 64);
    let never = recv(&pd, &b, 64);
    let tx = send(&pd, &a, b"before the destroy".to_vec(), None);
    // The send completes once the peer acknowledged it, after its receive completion went into
    // b's CQ, which nothing has polled yet.
    let (_, wc) = complete(&a_cq, tx);
    assert_eq!(wc.status(), WcStatus::Success);
    drop(b);
    let mut left = Vec::new();
    b_cq.poll(&mut left, 16).unwrap();
    eprintln!(
        "{}: {} completion(s) of the destroyed QP left in its CQ: {left:?}",
        ctx.name(),
        left.len()
    );
    assert!(
        left.len() <= 1,
        "a receive still posted was flushed: {left:?}"
    );
    assert!(!rxe || left.len() == 1, "rxe kept no completion: {left:?}");
    if let Some(wc) = left.first() {
        assert_eq!(wc.qp_num(), b_num);
        assert_eq!(wc.status(), WcStatus::Success);
        let mr = delivered.complete(wc).unwrap();
        assert_eq!(&mr.as_slice()[..18], b"before the destroy");
    }
    // The other receive never completes; its region stays with it.
    drop(never);
    drop(a);
}
