//! Device tests of [`AsyncWaiter`](evchan_core::verbs::AsyncWaiter), the completion channel's
//! wait loop on tokio (feature `tokio`): run them in the soft-RoCE VM (`cargo xtask test`).
//! Natively without a device they skip (or fail with `EVCHAN_REQUIRE_DEVICE=1`).
#![forbid(unsafe_code)]

mod support;

use std::time::Duration;

use evchan_core::verbs::{
    AsyncWaiter, CompChannel, Cq, Mr, Pd, Posted, Qp, WcOpcode, WorkCompletion,
};
use support::verbs::{loopback, open_device, rc_pair, recv, send, WC_TIMEOUT};

/// A current-thread runtime with its I/O and time drivers, running `f`.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Runs `test` on a channel with two CQs, `cqs[0]` for QP `qps[0]` and `cqs[1]` for `qps[1]`,
/// the two QPs connected over rxe's loopback; then drops the QPs and CQs, which hangs if an
/// event read was not acked.
fn on_a_pair(test: impl FnOnce(&CompChannel<'_>, &Pd<'_>, [&Cq<'_>; 2], [&Qp<'_>; 2])) {
    let ctx = open_device();
    let (gid, pd, channel) = loopback(&ctx);
    let cq_a = Cq::new(&channel, 16).unwrap();
    let cq_b = Cq::new(&channel, 16).unwrap();
    let (a, b) = rc_pair(&gid, &pd, (&cq_a, &cq_a), (&cq_b, &cq_b));
    test(&channel, &pd, [&cq_a, &cq_b], [&a, &b]);
    drop((a, b));
    drop((cq_a, cq_b));
}

/// Waits (each wait within [`WC_TIMEOUT`]) until `wcs` holds `n` completions.
async fn wait_until(
    waiter: &AsyncWaiter<'_, '_>,
    cqs: [&Cq<'_>; 2],
    wcs: &mut Vec<(usize, WorkCompletion)>,
    n: usize,
) {
    while wcs.len() < n {
        let got = tokio::time::timeout(WC_TIMEOUT, waiter.wait(&cqs, |i, wc| wcs.push((i, wc))))
            .await
            .expect("a completion within WC_TIMEOUT")
            .unwrap();
        assert!(got > 0);
    }
}

/// Hands `posted` back their regions: each completion in `wcs` completes the one it is for.
fn complete_each<'pd>(
    posted: Vec<Posted<'pd, Vec<u8>>>,
    wcs: &[(usize, WorkCompletion)],
) -> Vec<Mr<'pd, Vec<u8>>> {
    assert_eq!(wcs.len(), posted.len(), "{wcs:?}");
    posted
        .into_iter()
        .map(|p| {
            let (_, wc) = wcs
                .iter()
                .find(|(_, wc)| wc.wr_id() == p.wr_id())
                .unwrap_or_else(|| panic!("no completion for {p:?} in {wcs:?}"));
            assert!(wc.is_success(), "{wc:?}");
            p.complete(wc).unwrap()
        })
        .collect()
}

#[test]
fn async_wait_sleeps_until_the_completions_come_and_reads_their_events() {
    require_device!();
    on_a_pair(|channel, pd, cqs, [a, b]| {
        block_on(async {
            let waiter = channel.async_waiter().unwrap();
            let rx = recv(pd, b, 64);
            let mut wcs = Vec::new();
            // The send goes out only once the wait has found nothing and is asleep.
            let ((), tx) = tokio::join!(wait_until(&waiter, cqs, &mut wcs, 2), async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                send(pd, a, b"over the loop".to_vec(), Some(7))
            });
            let send_wc = wcs.iter().find(|(_, wc)| wc.wr_id() == tx.wr_id()).unwrap();
            assert_eq!(send_wc.0, 0, "the send's completion comes from cqs[0]");
            let recv_wc = wcs.iter().find(|(_, wc)| wc.wr_id() == rx.wr_id()).unwrap();
            assert_eq!(recv_wc.0, 1, "the receive's completion comes from cqs[1]");
            assert_eq!(recv_wc.1.opcode(), Some(WcOpcode::Recv));
            assert_eq!(recv_wc.1.imm_data(), Some(7));
            assert_eq!(recv_wc.1.byte_len(), 13);
            // The completions came first; the events that announced them are read by the
            // next wait that finds the CQs empty, before it arms them and sleeps.
            let idle = tokio::time::timeout(
                Duration::from_millis(100),
                wait_until(&waiter, cqs, &mut wcs, 3),
            )
            .await;
            assert!(idle.is_err(), "nothing more was posted, yet {idle:?}");
            assert!(
                channel.events_read() >= 1,
                "the wait slept on the channel and read its event"
            );
            assert!(
                channel.try_get_cq_event(&cqs).unwrap().is_none(),
                "an event was left unread"
            );
            let mrs = complete_each(vec![tx, rx], &wcs);
            assert_eq!(&mrs[1].as_slice()[..13], b"over the loop");
        });
    });
}

#[test]
fn a_cancelled_async_wait_loses_nothing() {
    require_device!();
    on_a_pair(|channel, pd, cqs, [a, b]| {
        block_on(async {
            let waiter = channel.async_waiter().unwrap();
            let mut wcs = Vec::new();
            let nothing = Duration::from_millis(100);
            // Nothing posted: the wait arms both CQs, sleeps, and is dropped by the timeout.
            let early = tokio::time::timeout(nothing, wait_until(&waiter, cqs, &mut wcs, 1)).await;
            assert!(early.is_err(), "nothing was posted, yet {early:?}");
            assert!(wcs.is_empty());
            assert_eq!(channel.events_read(), 0);
            // The work completes while nobody waits: the armed CQs raise their events then.
            let rx = recv(pd, b, 64);
            let tx = send(pd, a, vec![1; 8], None);
            tokio::time::sleep(Duration::from_millis(200)).await;
            wait_until(&waiter, cqs, &mut wcs, 2).await;
            complete_each(vec![tx, rx], &wcs);
            // Those events are read (and acked) by the next wait that finds the CQs empty;
            // nothing is left readable after it, and it sleeps: 300 ms of waiting cost the
            // thread next to no CPU time (a wait that spun on readiness it never cleared would
            // cost all of it).
            let ticks = support::thread_cpu_ticks();
            let idle = tokio::time::timeout(
                Duration::from_millis(300),
                wait_until(&waiter, cqs, &mut wcs, 3),
            )
            .await;
            assert!(idle.is_err(), "nothing more was posted, yet {idle:?}");
            let spent = support::thread_cpu_ticks() - ticks;
            assert!(
                spent < 15,
                "an idle wait used {spent} ticks of CPU in 300 ms"
            );
            assert_eq!(wcs.len(), 2);
            assert_eq!(channel.events_read(), 2, "one event per armed CQ");
        });
    });
}
