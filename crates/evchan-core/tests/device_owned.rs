//! Device tests of the owned style (`evchan_core::verbs::owned`): `'static` PD, completion
//! channel, CQ, memory region and tokio waiter that keep their parents alive by reference
//! count, and the revocable `QpHandle` of an rdma_cm id's QP.
//!
//! What each test attacks, with safe code only: a connection posted and reaped from other
//! threads and a tokio runtime, its handles dropped parents first; a `QpHandle` that outlives
//! its id (its posts fail cleanly, the CQ and PD stay until their last handle); posts racing
//! the id's destroy on four threads; every owned handle leaked with `mem::forget` (only its
//! objects leak, nothing hangs, the QP still goes with its id); an id migrated with its owned
//! QP (allowed: nothing is borrowed); posted slots reclaimed from a destroyed QP, and only
//! from it.
//!
//! Run in the soft-RoCE VM (`cargo xtask test`); skipped natively without a device, failed
//! without one when `EVCHAN_REQUIRE_DEVICE=1`. The tests take turns (they count the process's
//! kernel objects).
#![forbid(unsafe_code)]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use evchan_core::cm::PortSpace;
use evchan_core::verbs::{Error as VerbsError, OwnedCompChannel, Slot};
use evchan_core::EventChannel;
use support::owned::{owned_pair, side, wait_owned, Side};
use support::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

#[test]
fn owned_objects_carry_a_connection_across_threads() {
    require_device!();
    let _serial = serial();
    let (sch, cch) = channels();
    let (server, s_side, rx, client, mut c_side) = owned_pair(&sch, &cch, 1);
    // A thread of its own posts the client's send through the QP handle.
    let mut tx = c_side.slots.pop().unwrap();
    tx.copy_from(b"owned hello").unwrap();
    let (qp, mr) = (c_side.qp.clone(), c_side.mr);
    let (posted, mr) = std::thread::spawn(move || (qp.post_send_slot(mr.mr(), tx, None), mr))
        .join()
        .unwrap();
    let posted = posted.unwrap();
    // Another thread waits for the server's receive through tokio's reactor.
    let s_cq = s_side.cq.clone();
    let wcs = std::thread::spawn(move || wait_owned(&s_cq))
        .join()
        .unwrap();
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    let got = rx.complete(&wcs[0]).expect("the receive's completion");
    assert_eq!(got.as_slice(), b"owned hello");
    // The client's send completes on its CQ, reaped by yet another thread.
    let c_cq = c_side.cq.clone();
    let wcs = std::thread::spawn(move || wait_owned(&c_cq))
        .join()
        .unwrap();
    assert!(wcs[0].is_success(), "{wcs:?}");
    assert!(posted.complete(&wcs[0]).is_ok());
    // Parents first: the PD and CQ handles go before the regions and the ids; nothing waits.
    within(EVENT_TIMEOUT, "dropping parents first", move || {
        drop((s_side.pd, s_side.cq, c_side.pd, c_side.cq));
        drop((s_side.mr, mr));
        drop((server, client, s_side.qp, c_side.qp, got));
    });
}

#[test]
fn qp_handle_outlives_its_id() {
    require_device!();
    let _serial = serial();
    let count = |kind| rdma_objects_of_process(kind).expect("the rdma tool");
    let before = (count("qp"), count("cq"), count("pd"), count("mr"));
    let (sch, cch) = channels();
    let (server, s_side, rx, client, mut c_side) = owned_pair(&sch, &cch, 2);
    assert_eq!(count("qp"), before.0 + 2);
    assert!(c_side.qp.is_alive());
    drop((server, client));
    // Both QPs went with their ids; the handles refuse every post and give the slot back.
    assert_eq!(count("qp"), before.0, "the QPs went with their ids");
    assert!(!c_side.qp.is_alive());
    let slot = c_side.slots.pop().unwrap();
    let index = slot.index();
    let e = c_side
        .qp
        .post_send_slot(c_side.mr.mr(), slot, Some(7))
        .unwrap_err();
    assert!(matches!(e.error, VerbsError::QpDestroyed), "{e:?}");
    assert_eq!(e.slot.index(), index, "the slot comes back");
    let e = s_side
        .qp
        .post_recv_slot(s_side.mr.mr(), e.slot)
        .unwrap_err();
    assert!(matches!(e.error, VerbsError::QpDestroyed), "{e:?}");
    assert_eq!(
        std::io::Error::from(e.error).kind(),
        std::io::ErrorKind::NotConnected
    );
    // The CQs, PDs and regions stay while their handles do, and go with the last one.
    assert_eq!(count("cq"), before.1 + 2);
    assert_eq!(count("pd"), before.2 + 2);
    drop((rx, c_side, s_side));
    assert_eq!(
        (count("qp"), count("cq"), count("pd"), count("mr")),
        before,
        "everything went with the last handle"
    );
}

/// `QpHandle::reclaim` gives a posted slot back without its completion only once its own QP is
/// destroyed: not while the QP lives, not through another QP's handle (even a destroyed one);
/// then a receive's slot comes back empty and a send's with its length.
#[test]
fn posted_slots_come_back_by_reclaim_once_their_qp_is_destroyed() {
    require_device!();
    let _serial = serial();
    let (sch, cch) = channels();
    let (server, mut s_side, rx, client, mut c_side) = owned_pair(&sch, &cch, 6);
    let rx_index = rx.index();
    // A send the server posts: the client has no receive posted, so it waits on the peer (or
    // fails); either way its slot comes back once the QP is gone, completed or not.
    let mut tx = s_side.slots.pop().unwrap();
    tx.copy_from(b"twelve bytes").unwrap();
    let tx_index = tx.index();
    let tx = s_side.qp.post_send_slot(s_side.mr.mr(), tx, None).unwrap();
    // While the QP lives: refused, unchanged.
    let rx = s_side.qp.reclaim(rx).expect_err("the QP is alive");
    assert_eq!(rx.index(), rx_index);
    // Another QP's handle, alive then destroyed: refused.
    let rx = c_side.qp.reclaim(rx).expect_err("another QP's handle");
    drop(client);
    assert!(!c_side.qp.is_alive());
    let rx = c_side
        .qp
        .reclaim(rx)
        .expect_err("another QP's handle, destroyed");
    // The client's own posts through its handle come back once its QP went.
    let c_rx = c_side.slots.pop().unwrap();
    let e = c_side
        .qp
        .post_recv_slot(c_side.mr.mr(), c_rx)
        .expect_err("the client's QP is gone");
    assert!(matches!(e.error, VerbsError::QpDestroyed), "{e:?}");
    // The server's QP destroyed with its id: both come back.
    drop(server);
    assert!(!s_side.qp.is_alive());
    let slot = s_side
        .qp
        .reclaim(rx)
        .expect("destroyed: the receive's slot");
    assert_eq!((slot.index(), slot.len()), (rx_index, 0));
    let slot = s_side.qp.reclaim(tx).expect("destroyed: the send's slot");
    assert_eq!((slot.index(), slot.len()), (tx_index, 12));
    assert_eq!(slot.as_slice(), b"twelve bytes");
}

#[test]
fn posts_racing_a_destroy() {
    require_device!();
    let _serial = serial();
    let (sch, cch) = channels();
    let addr = v4(port(3));
    let _l = listener(&sch, PortSpace::Tcp, addr);
    let mut id = routed(&cch, PortSpace::Tcp, addr);
    let Side {
        pd,
        cq,
        mr,
        slots,
        qp,
    } = side(&mut id, 4096, 64);
    let mr = Arc::new(mr);
    let go = Arc::new(AtomicBool::new(false));
    let mut per_thread: Vec<Vec<Slot>> = (0..4).map(|_| Vec::new()).collect();
    for (i, slot) in slots.into_iter().enumerate() {
        per_thread[i % 4].push(slot);
    }
    let posters: Vec<_> = per_thread
        .into_iter()
        .map(|mut mine| {
            let (qp, mr, go) = (qp.clone(), mr.clone(), go.clone());
            std::thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                let (mut posted, mut full, mut refused) = (Vec::new(), 0u32, 0u32);
                let start = Instant::now();
                while let Some(slot) = mine.pop() {
                    match qp.post_recv_slot(mr.mr(), slot) {
                        Ok(p) => posted.push(p),
                        Err(e) if e.is_queue_full() => {
                            full += 1;
                            mine.push(e.slot);
                        }
                        Err(e) => {
                            assert!(matches!(e.error, VerbsError::QpDestroyed), "{e:?}");
                            refused += 1;
                            mine.push(e.slot);
                            break;
                        }
                    }
                    assert!(start.elapsed() < EVENT_TIMEOUT, "no destroy seen");
                }
                (posted.len(), full, refused, mine.len())
            })
        })
        .collect();
    go.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(50));
    within(
        EVENT_TIMEOUT,
        "the destroy racing four posters",
        move || drop(id),
    );
    let mut total_posted = 0;
    for t in posters {
        let (posted, full, refused, left) = t.join().unwrap();
        // Each poster either ran out of slots first or saw the destroy (4096 slots on a receive
        // queue of at least 64: most come back as queue full, until the destroy).
        assert!(
            refused == 1 || left == 0,
            "{posted} {full} {refused} {left}"
        );
        total_posted += posted;
    }
    assert!(
        (64..4096).contains(&total_posted),
        "{total_posted} receives posted before the destroy filled the queue"
    );
    assert!(!qp.is_alive());
    drop((pd, cq, mr, qp));
}

#[test]
fn forgotten_owned_handles_leak_and_nothing_hangs() {
    require_device!();
    let _serial = serial();
    let count = |kind| rdma_objects_of_process(kind).expect("the rdma tool");
    let qps = count("qp");
    let (sch, cch) = channels();
    let (server, s_side, rx, client, c_side) = owned_pair(&sch, &cch, 4);
    let waiter = waiter_on_a_runtime_gone(&c_side.cq.channel());
    std::mem::forget(c_side.pd.clone());
    std::mem::forget(c_side.cq.clone());
    std::mem::forget(c_side.cq.channel());
    std::mem::forget(c_side.qp.clone());
    std::mem::forget(waiter);
    let Side {
        pd,
        cq,
        mr,
        slots,
        qp,
    } = c_side;
    std::mem::forget(mr);
    std::mem::forget(rx);
    within(
        EVENT_TIMEOUT,
        "dropping around forgotten handles",
        move || {
            drop((server, client, s_side, pd, cq, slots, qp));
        },
    );
    assert_eq!(count("qp"), qps, "the QPs still went with their ids");
}

/// A waiter registered with a runtime that is gone right after.
fn waiter_on_a_runtime_gone(channel: &OwnedCompChannel) -> evchan_core::verbs::CqWaiter {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _enter = rt.enter();
    channel.waiter().unwrap()
}

#[test]
fn id_with_an_owned_qp_migrates() {
    require_device!();
    let _serial = serial();
    let (sch, cch) = channels();
    let addr = v4(port(5));
    let _l = listener(&sch, PortSpace::Tcp, addr);
    let mut id = routed(&cch, PortSpace::Tcp, addr);
    let mut side = side(&mut id, 2, 16);
    let other = EventChannel::new().unwrap();
    let id = id
        .migrate(&other)
        .expect("nothing borrowed: the migrate is allowed");
    let posted = side
        .qp
        .post_recv_slot(side.mr.mr(), side.slots.pop().unwrap())
        .expect("the handle posts on the migrated id's QP");
    drop(id);
    assert!(!side.qp.is_alive());
    drop((posted, side));
}
