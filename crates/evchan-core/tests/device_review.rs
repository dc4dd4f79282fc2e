//! Device tests of what the soundness review fixed: timeouts too long for `Instant` (they used
//! to panic in `Instant + Duration`), a QP refused when its PD and CQs come from different
//! device contexts (the kernel would look the CQ handles up in the PD's context and could bind
//! the QP to some other CQ there), an id's addresses read while another thread reads the
//! channel's events, and `Id::destroy_qp` (a QP destroyed before its id, also while another
//! thread reads the channel, and the migrate it then allows).
//!
//! Run in the soft-RoCE VM (`cargo xtask test`); skipped natively without a device, failed
//! without one when `EVCHAN_REQUIRE_DEVICE=1`.
// Denied, not forbidden: one test allows it to call the core's `unsafe fn post_send_raw`.
#![deny(unsafe_code)]

mod support;

use std::time::Duration;

use evchan_core::cm::{EventKind, PortSpace};
use evchan_core::verbs::{CompChannel, Cq, Error as VerbsError, Pd, Qp, QpCaps, QpState};
use evchan_core::{CmId, EventChannel};
use support::verbs::*;
use support::*;

/// `resolved(&channel, ps, v4(port(n)))`, then a PD and a 16-entry CQ on the id's device, the
/// id rebound after them so that it is dropped first (it may borrow them for a QP):
/// `id_on_device!(channel, ps, n => id, pd, cq)` binds `id` (mutable), `pd` and `cq`.
macro_rules! id_on_device {
    ($channel:ident, $ps:expr, $n:expr => $id:ident, $pd:ident, $cq:ident) => {
        let $id = resolved(&$channel, $ps, v4(port($n)));
        let ctx = $id.context().unwrap();
        let ($pd, comp) = objects(&ctx);
        let $cq = Cq::new(&comp, 16).unwrap();
        let mut $id = $id;
    };
}

#[test]
fn event_channel_timeout_of_duration_max_waits_instead_of_panicking() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, v4(port(61)), RESOLVE_TIMEOUT)
        .unwrap();
    let ev = within(
        EVENT_TIMEOUT,
        "ADDR_RESOLVED with a Duration::MAX timeout",
        || {
            channel
                .get_event_timeout(Duration::MAX)
                .unwrap()
                .expect("an event, not a timeout")
        },
    );
    assert_eq!(ev.kind(), EventKind::AddrResolved);
    let _id = id.addr_resolved(&ev).unwrap();
    ev.ack();
    // Nothing is ready: a short timeout still expires.
    assert!(channel
        .get_event_timeout(Duration::from_millis(20))
        .unwrap()
        .is_none());
}

#[test]
fn cq_wait_and_async_timeouts_of_duration_max_do_not_panic() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, comp) = loopback(&ctx);
    let cq = Cq::new(&comp, 16).unwrap();
    let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));
    let rx = recv(&pd, &b, 8);
    let tx = send(&pd, &a, b"12345678".to_vec(), None);
    let mut wcs = Vec::new();
    within(
        EVENT_TIMEOUT,
        "completions with a Duration::MAX wait",
        || {
            while wcs.len() < 2 {
                cq.wait(Some(Duration::MAX), |wc| wcs.push(wc)).unwrap();
            }
        },
    );
    assert!(wcs.iter().all(|wc| wc.is_success()), "{wcs:?}");
    assert!(wcs.iter().any(|wc| tx.is_completed_by(wc)));
    assert!(wcs.iter().any(|wc| rx.is_completed_by(wc)));
    // A completion event was read, so this returns at once with one (or, drained, with none).
    let _ = comp
        .get_cq_event_timeout(&[&cq], Duration::from_millis(1))
        .unwrap();
    // No async event is due: a short timeout expires; Duration::MAX is not tried here, as it
    // would wait for one forever.
    assert!(ctx
        .get_async_event_timeout(Duration::from_millis(1))
        .unwrap()
        .is_none());
}

#[test]
fn qp_on_cqs_of_another_context_is_refused() {
    require_device!();
    // Two opens of one device: two contexts, each with its own kernel handle table. The first
    // CQ of each has the same handle number, so without the check the kernel binds a QP on
    // `pd_a` with `cq_b` to `cq_a` instead.
    let ctx_a = open_device();
    let ctx_b = open_device();
    let pd_a = Pd::new(&ctx_a).unwrap();
    let _pd_b = Pd::new(&ctx_b).unwrap(); // the same objects in the same order on both
    let comp_a = CompChannel::new(&ctx_a).unwrap();
    let comp_b = CompChannel::new(&ctx_b).unwrap();
    let cq_a = Cq::new(&comp_a, 16).unwrap();
    let cq_b = Cq::new(&comp_b, 16).unwrap();

    for (send, recv) in [(&cq_b, &cq_b), (&cq_a, &cq_b), (&cq_b, &cq_a)] {
        let err = Qp::new_rc(&pd_a, send, recv, QpCaps::default()).unwrap_err();
        assert!(matches!(err, VerbsError::InvalidArgument(_)), "{err:?}");
        assert!(
            err.to_string().contains("different device contexts"),
            "{err}"
        );
    }

    // On one context it works, and the CQs go cleanly afterwards.
    let qp = Qp::new_rc(&pd_a, &cq_a, &cq_a, QpCaps::default()).unwrap();
    assert_eq!(qp.state(), QpState::Reset);
    drop(qp);
    cq_a.destroy().unwrap();
    cq_b.destroy().unwrap();
}

#[test]
fn cm_qp_on_a_pd_of_another_context_is_refused() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    // Our own open of the device: another context than librdmacm's (the id's).
    let own = open_device();
    let pd = Pd::new(&own).unwrap();
    let comp = CompChannel::new(&own).unwrap();
    let cq = Cq::new(&comp, 16).unwrap();
    let mut id = resolved(&channel, PortSpace::Tcp, v4(port(62)));
    let err = id
        .create_qp_with(&pd, &cq, &cq, &Default::default())
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    assert_eq!(id.qp_num(), None);

    // The id's context, with the CQs of our own open: refused too.
    let ctx = id.context().unwrap();
    let id_pd = Pd::new(&ctx).unwrap();
    let mut id2 = resolved(&channel, PortSpace::Tcp, v4(port(63)));
    // (Before the check, librdmacm accepted this, and the kernel looked the CQ handles up in
    // the id's context.)
    let err = id2
        .create_qp_with(&id_pd, &cq, &cq, &Default::default())
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    assert_eq!(id2.qp_num(), None);
}

#[test]
fn addresses_read_while_another_thread_reads_events() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    const N: u16 = 8;
    let ids: Vec<_> = (0..N)
        .map(|i| {
            CmId::new(&channel, PortSpace::Tcp)
                .unwrap()
                .resolve_addr(None, v4(port(70 + i)), RESOLVE_TIMEOUT)
                .unwrap()
        })
        .collect();
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut n = 0;
            while n < N {
                let ev = channel.get_event_timeout(EVENT_TIMEOUT).unwrap();
                let ev = ev.expect("ADDR_RESOLVED for every id");
                assert_eq!(ev.kind(), EventKind::AddrResolved);
                n += 1;
            }
        });
        // The owner reads the fields librdmacm rewrites while the reader processes the
        // events (under the channel's gate now, so never at the same time).
        while !reader.is_finished() {
            for id in &ids {
                let _ = id.local_addr();
                let _ = id.peer_addr();
            }
        }
        reader.join().unwrap();
    });
    for (i, id) in (0..N).zip(&ids) {
        assert_eq!(id.peer_addr(), Some(v4(port(70 + i))));
    }
}

#[test]
fn destroying_a_cq_whose_event_guard_was_leaked_does_not_hang() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, comp) = loopback(&ctx);
    for explicit in [false, true] {
        let cq = Cq::new(&comp, 16).unwrap();
        {
            let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));
            let rx = recv(&pd, &b, 8);
            cq.req_notify(false).unwrap();
            let tx = send(&pd, &a, vec![7u8; 8], None);
            let ev = comp
                .get_cq_event_timeout(&[&cq], EVENT_TIMEOUT)
                .unwrap()
                .expect("a completion event");
            // `mem::forget` is safe: the guard never acks, and ibv_destroy_cq used to wait for
            // that ack forever.
            std::mem::forget(ev);
            let wcs = wait_for(&cq, 2, EVENT_TIMEOUT);
            assert!(wcs.iter().any(|wc| rx.is_completed_by(wc)));
            assert!(wcs.iter().any(|wc| tx.is_completed_by(wc)));
        }
        within(
            EVENT_TIMEOUT,
            "destroying a CQ after a leaked CqEvent",
            || {
                if explicit {
                    cq.destroy().expect("ibv_destroy_cq");
                } else {
                    drop(cq);
                }
            },
        );
    }
    comp.destroy().expect("no CQ left on the channel");
}

/// The one test of evchan-core's tests that needs `unsafe`: it calls the core's own `unsafe fn`
/// `post_send_raw`, whose refusal it checks.
#[test]
#[allow(unsafe_code)]
fn send_on_a_udp_ids_ud_qp_is_refused_not_a_crash() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    id_on_device!(channel, PortSpace::Udp, 64 => id, pd, cq);
    id.create_qp_with(&pd, &cq, &cq, &Default::default())
        .unwrap();
    // A UD send needs an address handle (`wr.ud.ah`); the work request evchan builds has
    // none, and the provider would dereference the NULL handle (a crash, before the fix).
    let err = id
        .post_send(pd.reg_mr(vec![1u8; 8]).unwrap(), 0..8, None)
        .unwrap_err();
    assert!(err.to_string().contains("UD QP"), "{err}");
    let mr = err.mr;
    // SAFETY: refused before the call: the device never sees the region.
    let raw = unsafe { id.post_send_raw(1, &[mr.sge(0..8).unwrap()], None, Default::default()) };
    assert!(raw.unwrap_err().to_string().contains("UD QP"));
    // Receives need no address handle: posting one works.
    let rx = id
        .post_recv(pd.reg_mr(vec![0u8; 64]).unwrap(), 0..64)
        .unwrap();
    drop((rx, mr));
}

#[test]
fn destroy_qp_destroys_the_qp_before_the_id_once() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    let mut id = resolved(&channel, PortSpace::Tcp, v4(port(65)));
    // No QP yet: refused.
    let err = id.destroy_qp().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");

    // A QP on librdmacm's CQs: destroyed with them, once.
    id.create_qp(&Default::default()).unwrap();
    assert!(id.qp_num().is_some());
    id.destroy_qp().unwrap();
    assert_eq!(id.qp_num(), None);
    let err = id.destroy_qp().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");

    // A QP on our PD and CQ, with a receive posted: the QP goes, our CQ stays (destroyed by
    // us below, which fails with EBUSY while a QP still uses it), and the id can make another
    // QP.
    let ctx = id.context().unwrap();
    let (pd, comp) = objects(&ctx);
    let cq = Cq::new(&comp, 16).unwrap();
    let cq2 = Cq::new(&comp, 16).unwrap();
    {
        let mut id = id;
        id.create_qp_with(&pd, &cq, &cq, &Default::default())
            .unwrap();
        let first = id.qp_num().unwrap();
        let rx = id
            .post_recv(pd.reg_mr(vec![0u8; 64]).unwrap(), 0..64)
            .unwrap();
        assert_eq!(rx.qp_num(), first);
        id.destroy_qp().unwrap();
        assert_eq!(id.qp_num(), None);
        // The receive never completes; its region stays with it.
        drop(rx);
        let err = id.destroy_qp().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
        // The id's own PD is back: a QP on librdmacm's CQs (and its PD) can follow.
        id.create_qp(&Default::default()).unwrap();
        id.destroy_qp().unwrap();
        id.create_qp_with(&pd, &cq2, &cq2, &Default::default())
            .unwrap();
        assert!(id.qp_num().is_some());
        // Posting after a destroy and a new QP goes to the new one.
        let rx = id
            .post_recv(pd.reg_mr(vec![0u8; 64]).unwrap(), 0..64)
            .unwrap();
        assert_eq!(Some(rx.qp_num()), id.qp_num());
        drop(rx);
        // The id (and its second QP) go here, before the CQs.
    }
    // No QP uses either CQ any more: both destroys succeed.
    cq.destroy().unwrap();
    cq2.destroy().unwrap();
}

#[test]
fn an_id_migrates_once_its_qp_on_our_cq_is_destroyed() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    let other = EventChannel::new().unwrap();
    id_on_device!(channel, PortSpace::Tcp, 66 => id, pd, cq);
    id.create_qp_with(&pd, &cq, &cq, &Default::default())
        .unwrap();
    // With the QP on our CQ the migrate is refused (the migrated id would not borrow it).
    let mut id = match id.migrate(&other) {
        Ok(_) => panic!("migrate of an id with a QP on the caller's CQ must be refused"),
        Err(e) => {
            assert_eq!(e.error.raw_os_error(), Some(libc::EBUSY), "{}", e.error);
            e.into_id()
        }
    };
    id.destroy_qp().unwrap();
    let id = id.migrate(&other).unwrap();
    // Its next event arrives on the new channel, none on the old one.
    let id = id.resolve_route(RESOLVE_TIMEOUT).unwrap();
    let ev = expect_event(&other, EventKind::RouteResolved);
    let id = id.route_resolved(&ev).unwrap();
    ev.ack();
    assert!(channel.try_get_event().unwrap().is_none());
    drop(id);
    cq.destroy().unwrap();
}

#[test]
fn qps_destroyed_while_another_thread_reads_the_channel() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    id_on_device!(channel, PortSpace::Tcp, 67 => id, pd, cq);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        // A reader inside `rdma_get_cm_event` while the QPs come and go (the gate orders them).
        let reader = s.spawn(|| {
            started.wait();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(
                    channel.try_get_event().unwrap().is_none(),
                    "no event is due"
                );
            }
        });
        started.wait();
        for i in 0..50 {
            if i % 2 == 0 {
                id.create_qp_with(&pd, &cq, &cq, &Default::default())
                    .unwrap();
            } else {
                id.create_qp(&Default::default()).unwrap();
            }
            assert!(id.qp_num().is_some());
            id.destroy_qp().unwrap();
            assert_eq!(id.qp_num(), None);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        reader.join().unwrap();
    });
    drop(id);
    cq.destroy().unwrap();
}
