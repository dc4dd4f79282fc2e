//! Device tests of registered slot pools ([`SlotPool`], [`Slot`], [`PostedSlot`]): sends and
//! receives through slots on a loopback QP pair and on an rdma_cm connection, and the attacks
//! on their guarantees that safe code can make (a slot outliving its region, PD and context;
//! a slot of another pool; a region of another PD; forgotten and dropped posted slots).
//!
//! Run them in the soft-RoCE VM (`cargo xtask vm --env EVCHAN_REQUIRE_DEVICE=1 --
//! target/debug/deps/device_slots-… --test-threads=1`); natively without a device they skip
//! (or fail with `EVCHAN_REQUIRE_DEVICE=1`).
#![forbid(unsafe_code)]

mod support;

use std::collections::HashMap;
use std::time::Duration;

use evchan_core::cm::{ConnParam, EventKind, PortSpace};
use evchan_core::verbs::{
    Context, Cq, Error, Pd, PostedSlot, Qp, QpCaps, QpInit, Slot, SlotPool, WcOpcode, WcStatus,
    WorkCompletion,
};
use support::verbs::{connect_qps, loopback, objects, open_device, rc_pair, WC_TIMEOUT};
use support::*;

/// What `bytes::Bytes::from_owner` asks of its owner.
fn owner<T: AsRef<[u8]> + Send + 'static>(t: T) -> T {
    t
}

/// Waits on `cq` (event-driven) until every one of `posted` has completed; returns the slots
/// with their completions, by wr_id. A completion of none of them fails the test.
fn complete_slots(cq: &Cq<'_>, posted: Vec<PostedSlot>) -> HashMap<u64, (Slot, WorkCompletion)> {
    let mut pending: HashMap<u64, PostedSlot> =
        posted.into_iter().map(|p| (p.wr_id(), p)).collect();
    let mut done = HashMap::new();
    while !pending.is_empty() {
        let n = cq
            .wait(Some(WC_TIMEOUT), |wc| {
                let p = pending
                    .remove(&wc.wr_id())
                    .unwrap_or_else(|| panic!("unexpected completion {wc:?}"));
                assert!(p.is_completed_by(&wc));
                match p.complete(&wc) {
                    Ok(slot) => {
                        done.insert(wc.wr_id(), (slot, wc));
                    }
                    Err(p) => panic!("{wc:?} does not complete {p:?}"),
                }
            })
            .unwrap();
        assert!(
            n > 0,
            "no completion within {WC_TIMEOUT:?}; {} outstanding",
            pending.len()
        );
    }
    done
}

/// Waits until `n` completions came on `cq`, whatever they are.
fn drain(cq: &Cq<'_>, n: usize) -> Vec<WorkCompletion> {
    support::verbs::wait_for(cq, n, WC_TIMEOUT)
}

/// Sends with data, with `len() == 0` and immediate data, and of a whole slot, received into
/// slots of the same pool; mixed with an owned post, whose wr_id is never confused.
#[test]
fn send_and_receive_slots() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, comp) = loopback(&ctx);
    let cq = Cq::new(&comp, 64).unwrap();
    let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));

    let (pool, mut slots) = SlotPool::new(8, 256).unwrap();
    let mr = pd.reg_mr(pool).unwrap();
    assert_eq!(mr.len(), 0, "the region of a pool shows no bytes");
    assert!(mr.as_slice().is_empty());

    // Three receives into slots, one owned receive (a Vec region) beside them.
    let rx: Vec<PostedSlot> = (0..3)
        .map(|_| b.post_recv_slot(&mr, slots.pop().unwrap()).unwrap())
        .collect();
    let owned_rx = support::verbs::recv(&pd, &b, 64);
    assert!(rx.iter().all(|p| p.is_recv()));

    let mut data = slots.pop().unwrap();
    data.copy_from(b"hello through a slot").unwrap();
    let empty = slots.pop().unwrap();
    assert_eq!(empty.len(), 0);
    let mut full = slots.pop().unwrap();
    for (i, byte) in full.buf_mut().iter_mut().enumerate() {
        *byte = i as u8;
    }
    full.set_len(256).unwrap();
    let tx = vec![
        a.post_send_slot(&mr, data, None).unwrap(),
        a.post_send_slot(&mr, empty, Some(0xC0FFEE)).unwrap(),
        a.post_send_slot(&mr, full, Some(7)).unwrap(),
    ];
    // One owned send too, to fill the owned receive.
    let owned_tx = support::verbs::send(&pd, &a, b"owned".to_vec(), None);
    let mut ids: Vec<u64> = rx.iter().chain(&tx).map(PostedSlot::wr_id).collect();
    ids.extend([owned_rx.wr_id(), owned_tx.wr_id()]);
    assert!(ids.iter().all(|id| id >> 63 == 1), "{ids:x?}");
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "every wr_id is distinct");

    // Wait for everything; the owned ones are picked out by their own `complete`.
    let (mut orx, mut otx) = (Some(owned_rx), Some(owned_tx));
    let mut pending: Vec<PostedSlot> = rx.into_iter().chain(tx).collect();
    let mut got: Vec<(Slot, WorkCompletion)> = Vec::new();
    let mut owned_bytes = Vec::new();
    while !pending.is_empty() || orx.is_some() || otx.is_some() {
        let k = cq
            .wait(Some(WC_TIMEOUT), |wc| {
                assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
                if let Some(p) = orx.take() {
                    match p.complete(&wc) {
                        Ok(mr) => {
                            owned_bytes = mr.as_slice()[..wc.byte_len() as usize].to_vec();
                            return;
                        }
                        Err(p) => orx = Some(p),
                    }
                }
                if let Some(p) = otx.take() {
                    match p.complete(&wc) {
                        Ok(_) => return,
                        Err(p) => otx = Some(p),
                    }
                }
                let i = pending
                    .iter()
                    .position(|p| p.is_completed_by(&wc))
                    .unwrap_or_else(|| panic!("unexpected {wc:?}"));
                let slot = pending.swap_remove(i).complete(&wc).unwrap();
                got.push((slot, wc));
            })
            .unwrap();
        assert!(k > 0, "no completion within {WC_TIMEOUT:?}");
    }
    assert_eq!(owned_bytes, b"owned");
    assert!(cq.poll_one().unwrap().is_none(), "nothing left over");

    // The receives, in posting order (RC delivers in order).
    let (mut received, sent): (Vec<_>, Vec<_>) = got
        .into_iter()
        .partition(|(_, wc)| wc.opcode() == Some(WcOpcode::Recv));
    received.sort_by_key(|(_, wc)| wc.wr_id());
    assert_eq!(received.len(), 3);
    assert_eq!(sent.len(), 3);
    let (s, wc) = &received[0];
    assert_eq!(s.as_slice(), b"hello through a slot");
    assert_eq!(wc.imm_data(), None);
    let (s, wc) = &received[1];
    assert_eq!(s.len(), 0);
    assert!(s.as_slice().is_empty());
    assert_eq!(wc.byte_len(), 0);
    assert_eq!(wc.imm_data(), Some(0xC0FFEE));
    let (s, wc) = &received[2];
    assert_eq!(s.len(), 256);
    assert!(s.as_slice().iter().enumerate().all(|(i, &b)| b == i as u8));
    assert_eq!(wc.imm_data(), Some(7));
    assert_eq!(
        format!("{s:?}"),
        format!("Slot {{ index: {}, len: 256 }}", s.index())
    );
    // A sent slot keeps its length.
    assert!(sent
        .iter()
        .any(|(s, _)| s.as_slice() == b"hello through a slot"));

    // Every slot is back, each once: indices 0..8.
    let mut idx: Vec<usize> = received
        .iter()
        .chain(&sent)
        .map(|(s, _)| s.index())
        .chain(slots.iter().map(Slot::index))
        .collect();
    idx.sort_unstable();
    assert_eq!(idx, (0..8).collect::<Vec<_>>());

    // Slots posted again, the region reused: a receive and a full-length send.
    let (mut again, _) = received.pop().unwrap();
    again.set_len(5).unwrap();
    let rx = b.post_recv_slot(&mr, received.pop().unwrap().0).unwrap();
    let tx = a.post_send_slot(&mr, again, None).unwrap();
    let rx_id = rx.wr_id();
    let done = complete_slots(&cq, vec![rx, tx]);
    assert_eq!(done[&rx_id].0.as_slice(), &[0, 1, 2, 3, 4]);
    drop((a, b));
    drop(mr);
}

/// A received slot outlives its region, the QPs, the CQ, the PD and the device context, and
/// still reads its bytes; as an owner of the kind `Bytes::from_owner` takes.
#[test]
fn slot_outlives_mr_pd_and_context() {
    require_device!();
    let (pool, mut slots) = SlotPool::new(4, 128).unwrap();
    let kept = {
        let ctx = open_device();
        let (gid, pd, comp) = loopback(&ctx);
        let cq = Cq::new(&comp, 16).unwrap();
        let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));
        let mr = pd.reg_mr(pool).unwrap();
        let rx = b.post_recv_slot(&mr, slots.pop().unwrap()).unwrap();
        let mut tx = slots.pop().unwrap();
        tx.copy_from(b"bytes that outlive the connection").unwrap();
        let tx = a.post_send_slot(&mr, tx, Some(1)).unwrap();
        let rx_id = rx.wr_id();
        let mut done = complete_slots(&cq, vec![rx, tx]);
        let (slot, wc) = done.remove(&rx_id).unwrap();
        assert_eq!(wc.imm_data(), Some(1));
        drop((a, b));
        // The pool comes back from its region (deregistered) and goes too.
        let pool = mr.into_inner().unwrap();
        assert_eq!(pool.count(), 4);
        drop(pool);
        drop(cq);
        drop(comp);
        drop(pd);
        drop(ctx);
        drop(done);
        owner(slot)
    };
    drop(slots);
    assert_eq!(kept.as_slice(), b"bytes that outlive the connection");
    assert_eq!(kept.as_ref(), b"bytes that outlive the connection");
    let sent_elsewhere = std::thread::spawn(move || kept.as_slice().to_vec())
        .join()
        .unwrap();
    assert_eq!(sent_elsewhere, b"bytes that outlive the connection");
}

/// A slot posted with the region of another pool is refused before the call, on both posts,
/// and comes back unchanged; with its own pool's region it posts.
#[test]
fn slot_of_another_pool_refused() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, comp) = loopback(&ctx);
    let cq = Cq::new(&comp, 16).unwrap();
    let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));
    let (p1, _s1) = SlotPool::new(2, 64).unwrap();
    let (p2, mut s2) = SlotPool::new(2, 64).unwrap();
    let (mr1, mr2) = (pd.reg_mr(p1).unwrap(), pd.reg_mr(p2).unwrap());

    let mut slot = s2.pop().unwrap();
    slot.copy_from(b"mine").unwrap();
    let e = b.post_recv_slot(&mr1, slot).unwrap_err();
    assert!(matches!(e.error, Error::InvalidArgument(_)), "{e}");
    assert!(!e.is_queue_full());
    assert_eq!(e.slot.index(), 1);
    assert_eq!(e.slot.as_slice(), b"mine", "unchanged");
    let e = a.post_send_slot(&mr1, e.slot, None).unwrap_err();
    assert!(matches!(e.error, Error::InvalidArgument(_)), "{e}");
    let io: std::io::Error = SlotPool::new(0, 1).unwrap_err().into();
    assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);

    // Nothing was posted: the CQ stays empty.
    assert!(cq.poll_one().unwrap().is_none());
    // With its own region it goes through.
    let rx = b.post_recv_slot(&mr2, s2.pop().unwrap()).unwrap();
    let tx = a.post_send_slot(&mr2, e.slot, None).unwrap();
    let rx_id = rx.wr_id();
    let done = complete_slots(&cq, vec![rx, tx]);
    assert_eq!(done[&rx_id].0.as_slice(), b"mine");
    drop((a, b));
}

/// A region of another PD than the QP's is refused before the call (the slot comes back): of
/// another PD of the same context, and of a PD of another open of the device. A QP on the
/// region's own PD takes the same slot.
#[test]
fn region_of_another_pd_refused() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, comp) = loopback(&ctx);
    let cq = Cq::new(&comp, 16).unwrap();
    let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));

    // Another PD of the same context.
    let pd2 = Pd::new(&ctx).unwrap();
    let (pool, mut slots) = SlotPool::new(4, 64).unwrap();
    let mr2 = pd2.reg_mr(pool).unwrap();
    let mut slot = slots.pop().unwrap();
    slot.copy_from(b"foreign").unwrap();
    let e = b.post_recv_slot(&mr2, slot).unwrap_err();
    assert!(matches!(e.error, Error::InvalidArgument(_)), "{e}");
    assert_eq!(e.slot.as_slice(), b"foreign");
    let e = a.post_send_slot(&mr2, e.slot, Some(3)).unwrap_err();
    assert!(matches!(e.error, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("PD"), "{e}");
    let slot = e.slot;

    // A PD of another open of the device (another context): refused the same way.
    let other = Context::open(&ctx.name()).unwrap();
    let pd3 = Pd::new(&other).unwrap();
    let (pool3, mut slots3) = SlotPool::new(1, 64).unwrap();
    let mr3 = pd3.reg_mr(pool3).unwrap();
    let e = a
        .post_send_slot(&mr3, slots3.pop().unwrap(), None)
        .unwrap_err();
    assert!(matches!(e.error, Error::InvalidArgument(_)), "{e}");
    let e = b.post_recv_slot(&mr3, e.slot).unwrap_err();
    assert!(matches!(e.error, Error::InvalidArgument(_)), "{e}");

    assert!(cq.poll_one().unwrap().is_none(), "nothing was posted");

    // A second QP pair on pd2, where mr2 belongs: the same slot goes through.
    let cq2 = Cq::new(&comp, 16).unwrap();
    let (c, d) = rc_pair(&gid, &pd2, (&cq2, &cq2), (&cq2, &cq2));
    let rx = d.post_recv_slot(&mr2, slots.pop().unwrap()).unwrap();
    let tx = c.post_send_slot(&mr2, slot, Some(3)).unwrap();
    let rx_id = rx.wr_id();
    let done = complete_slots(&cq2, vec![rx, tx]);
    let (s, wc) = &done[&rx_id];
    assert_eq!(s.as_slice(), b"foreign");
    assert_eq!(wc.imm_data(), Some(3));
    drop((c, d, a, b));
}

/// A forgotten and a dropped `PostedSlot`: nothing crashes, messages into the forgotten
/// receive land where no one can read them, and everything is destroyed normally.
#[test]
fn forgotten_posted_slot() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, comp) = loopback(&ctx);
    let cq = Cq::new(&comp, 16).unwrap();
    let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));
    let (pool, mut slots) = SlotPool::new(4, 64).unwrap();
    let mr = pd.reg_mr(pool).unwrap();

    // Forgotten receive: a message lands in it; its completion is claimed by no one.
    std::mem::forget(b.post_recv_slot(&mr, slots.pop().unwrap()).unwrap());
    let mut tx = slots.pop().unwrap();
    tx.copy_from(b"into the void").unwrap();
    let tx = a.post_send_slot(&mr, tx, None).unwrap();
    let tx_id = tx.wr_id();
    let mut tx = Some(tx);
    let mut seen = 0;
    while seen < 2 {
        seen += cq
            .wait(Some(WC_TIMEOUT), |wc| {
                assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
                if wc.wr_id() == tx_id {
                    slots.push(tx.take().unwrap().complete(&wc).unwrap());
                }
            })
            .unwrap();
    }

    // Dropped receive, still posted: flushed when the QP goes to ERROR.
    let dropped = b.post_recv_slot(&mr, slots.pop().unwrap()).unwrap();
    drop(dropped);
    b.modify_to_error().unwrap();
    let wcs = drain(&cq, 1);
    assert_eq!(wcs[0].status(), WcStatus::WrFlush, "{wcs:?}");

    // Destroy in the usual order; the region's bytes are kept by the forgotten token.
    drop((a, b));
    drop(mr);
    drop(slots);
    drop(cq);
    drop(comp);
    drop(pd);
}

/// The region is deregistered while a receive into one of its slots is still posted and its
/// `PostedSlot` dropped, so its memory is freed: a message that then arrives finds no region
/// (a protection error), and never writes into freed memory.
#[test]
fn posted_slot_after_its_region_is_gone() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, comp) = loopback(&ctx);
    let cq = Cq::new(&comp, 16).unwrap();
    let caps = QpCaps::default();
    let rts = evchan_core::verbs::RtsAttr {
        retry_cnt: 1,
        rnr_retry: 1,
        timeout: 8,
        ..Default::default()
    };
    let a = Qp::new_rc(&pd, &cq, &cq, caps).unwrap();
    let b = Qp::new_rc(&pd, &cq, &cq, caps).unwrap();
    connect_qps(&a, &b, &gid, rts);

    let (pool, mut slots) = SlotPool::new(1, 1 << 16).unwrap();
    let mr = pd.reg_mr(pool).unwrap();
    drop(b.post_recv_slot(&mr, slots.pop().unwrap()).unwrap());
    drop(mr); // deregistered; with no slot left, the memory is freed
    assert!(slots.is_empty());
    // Likely the same pages again (a large allocation): they must stay untouched.
    let canary = vec![0xA5u8; 1 << 16];

    let (tpool, mut tslots) = SlotPool::new(1, 64).unwrap();
    let tmr = pd.reg_mr(tpool).unwrap();
    let mut tx = tslots.pop().unwrap();
    tx.copy_from(&[0x11; 64]).unwrap();
    let tx = a.post_send_slot(&tmr, tx, None).unwrap();
    let tx_id = tx.wr_id();
    let mut tx = Some(tx);
    let mut statuses = Vec::new();
    while tx.is_some() {
        let n = cq
            .wait(Some(Duration::from_secs(60)), |wc| {
                statuses.push((wc.wr_id() == tx_id, wc.status()));
                if let Some(p) = tx.take() {
                    tx = p.complete(&wc).err();
                }
            })
            .unwrap();
        assert!(n > 0, "no completion; {statuses:?}");
    }
    eprintln!("completions after the region went (is the send, status): {statuses:?}");
    assert!(
        statuses.iter().all(|(_, s)| *s != WcStatus::Success),
        "nothing can succeed into a deregistered region: {statuses:?}"
    );
    assert!(
        canary.iter().all(|&x| x == 0xA5),
        "freed memory was written"
    );
    drop((a, b));
}

/// Slots through an rdma_cm connection whose QPs are on the caller's PDs and CQs: receives
/// posted before connect/accept, a send with data and immediate data one way, an
/// immediate-only (empty) send back; refusals: no QP yet, a region of the other side's PD.
#[test]
fn cm_connection_with_slots() {
    require_device!();
    let addr = v4(port(1));
    let (sch, cch) = channels();
    let listening = listener(&sch, PortSpace::Tcp, addr);

    let id = resolved(&cch, PortSpace::Tcp, addr);
    let cctx = id.context().unwrap();
    let (cpd, ccomp) = objects(&cctx);
    let ccq = Cq::new(&ccomp, 64).unwrap();
    let (cpool, mut cslots) = SlotPool::new(4, 512).unwrap();
    let cmr = cpd.reg_mr(cpool).unwrap();
    let id = id.resolve_route(RESOLVE_TIMEOUT).unwrap();
    let ev = expect_event(&cch, EventKind::RouteResolved);
    let mut client = id.route_resolved(&ev).unwrap();
    ev.ack();

    // No QP of the caller's yet: refused, the slot back.
    let e = client
        .post_recv_slot(&cmr, cslots.pop().unwrap())
        .unwrap_err();
    assert!(matches!(e.error, Error::Io { .. }), "{e}");
    cslots.push(e.slot);

    client
        .create_qp_with(&cpd, &ccq, &ccq, &QpInit::new())
        .unwrap();
    let crx = client.post_recv_slot(&cmr, cslots.pop().unwrap()).unwrap();
    let client = client.connect(&ConnParam::new()).unwrap();

    let mut req = expect_event(&sch, EventKind::ConnectRequest);
    let server = req.take_request().expect("the request's id");
    req.ack();
    let sctx = server.context().unwrap();
    let (spd, scomp) = objects(&sctx);
    let scq = Cq::new(&scomp, 64).unwrap();
    let (spool, mut sslots) = SlotPool::new(4, 512).unwrap();
    let smr = spd.reg_mr(spool).unwrap();
    let mut server = server;
    server
        .create_qp_with(&spd, &scq, &scq, &QpInit::new())
        .unwrap();
    // The client's region on the server's QP: another PD, refused.
    let e = server
        .post_recv_slot(&cmr, cslots.pop().unwrap())
        .unwrap_err();
    assert!(matches!(e.error, Error::InvalidArgument(_)), "{e}");
    cslots.push(e.slot);
    let srx = server.post_recv_slot(&smr, sslots.pop().unwrap()).unwrap();
    let server = server.accept(&ConnParam::new()).unwrap();
    let (client, _) = established(&cch, client);
    let (server, _) = established(&sch, server);

    // Client → server: data and immediate data.
    let mut m = cslots.pop().unwrap();
    m.copy_from(b"a slot over rdma_cm").unwrap();
    let ctx_ = client.post_send_slot(&cmr, m, Some(42)).unwrap();
    let srx_id = srx.wr_id();
    let got = complete_slots(&scq, vec![srx]);
    let (s, wc) = &got[&srx_id];
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    assert_eq!(wc.qp_num(), server.qp_num().unwrap());
    assert_eq!(s.as_slice(), b"a slot over rdma_cm");
    assert_eq!(wc.imm_data(), Some(42));
    cslots.extend(
        complete_slots(&ccq, vec![ctx_])
            .into_values()
            .map(|(s, _)| s),
    );

    // Server → client: an immediate-only message (a credit update).
    let credit = sslots.pop().unwrap();
    assert_eq!(credit.len(), 0);
    let stx = server.post_send_slot(&smr, credit, Some(16)).unwrap();
    let crx_id = crx.wr_id();
    let got = complete_slots(&ccq, vec![crx]);
    let (s, wc) = &got[&crx_id];
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    assert_eq!(s.len(), 0);
    assert_eq!(wc.imm_data(), Some(16));
    sslots.extend(
        complete_slots(&scq, vec![stx])
            .into_values()
            .map(|(s, _)| s),
    );

    // One receive left posted on the server, flushed at disconnect.
    let srx = server.post_recv_slot(&smr, sslots.pop().unwrap()).unwrap();
    let (server, client) = disconnect_pair(&sch, &cch, server, client);
    let srx_id = srx.wr_id();
    let got = complete_slots(&scq, vec![srx]);
    let (s, wc) = &got[&srx_id];
    assert_eq!(wc.status(), WcStatus::WrFlush, "{wc:?}");
    assert_eq!(s.len(), 0, "a failed receive brings no bytes");

    let ev = expect_event(&sch, EventKind::TimewaitExit);
    ev.ack();
    drop(client);
    drop(server);
    drop(cmr);
    drop(smr);
    // The received slot outlives both connections' objects.
    let kept = got.into_values().map(|(s, _)| s).next().unwrap();
    drop(ccq);
    drop(scq);
    drop(ccomp);
    drop(scomp);
    drop(cpd);
    drop(spd);
    drop(cctx);
    drop(sctx);
    assert_eq!(kept.capacity(), 512);
    assert_eq!(kept.len(), 0);
    drop(listening);
}

/// An id of the UDP port space has a UD QP: slot posts are refused there, both ways, before
/// the call, and the slot comes back.
#[test]
fn slots_on_a_udp_ids_ud_qp_are_refused() {
    require_device!();
    let channel = evchan_core::EventChannel::new().unwrap();
    let id = resolved(&channel, PortSpace::Udp, v4(port(2)));
    let ctx = id.context().unwrap();
    let (pd, comp) = objects(&ctx);
    let cq = Cq::new(&comp, 16).unwrap();
    let (pool, mut slots) = SlotPool::new(2, 64).unwrap();
    let mr = pd.reg_mr(pool).unwrap();
    let mut id = id;
    id.create_qp_with(&pd, &cq, &cq, &QpInit::new()).unwrap();
    let e = id
        .post_send_slot(&mr, slots.pop().unwrap(), None)
        .unwrap_err();
    assert!(matches!(e.error, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("UD"), "{e}");
    let e = id.post_recv_slot(&mr, e.slot).unwrap_err();
    assert!(e.to_string().contains("UD"), "{e}");
    assert_eq!(e.slot.index(), 1);
    assert!(cq.poll_one().unwrap().is_none());
}
