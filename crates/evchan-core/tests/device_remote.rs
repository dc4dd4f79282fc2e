//! Device tests of one-sided access (`evchan_core::verbs::remote`): memory exposed by one side
//! of an rdma_cm connection over owned QPs, written, read and updated atomically by the other.
//!
//! What each test attacks, with safe code only:
//! - the operations land where the descriptor says, and the target sees them through its
//!   atomic accessors only;
//! - a range outside the descriptor, a misaligned atomic word, a READ longer than the slot,
//!   an empty READ or WRITE: refused before anything is posted, the slot back;
//! - a descriptor that lies (a range past the exposed bytes, with the right rkey): the
//!   operation fails at the initiator with a remote access error, the exposed bytes are
//!   untouched, and the connection is over (a later request fails);
//! - a revoked region: the peer's old rkey gets a remote access error, and the memory given
//!   back holds what was written before the revocation.
//! - registered buffers as the local side (`post_write_mr`, `post_read_mr`, `post_send_mr`):
//!   a WRITE and a READ larger than any slot move the bytes without a copy, the region coming
//!   back only with the completion; a range outside, a length beyond the buffer and a buffer of
//!   another PD are refused before posting, the region back.
//!
//! The target's bytes are read right after the initiator's completion: rdma_rxe places a
//! WRITE's data before it acknowledges it (the verbs do not promise that order to the target's
//! CPU in general).
//!
//! Run in the soft-RoCE VM (`cargo xtask test`); skipped natively without a device, failed
//! without one when `EVCHAN_REQUIRE_DEVICE=1`.
#![forbid(unsafe_code)]

mod support;

use std::sync::{Mutex, PoisonError};

use evchan_core::verbs::{
    atomic_result, Error as VerbsError, Exposed, MrPostError, OwnedMr, PostedMr, RemoteAtomic,
    RemoteBuf, RemoteError, RemoteRead, RemoteReadWrite, RemoteWrite, Slot, WcStatus,
    WorkCompletion,
};
use evchan_core::EventChannel;
use support::owned::{owned_pair, wait_owned, Side};

static SERIAL: Mutex<()> = Mutex::new(());

/// Posts with `post` and waits for its completion on `side`'s CQ: the completion and the slot.
fn run(
    side: &Side,
    post: impl FnOnce(
        &Side,
    ) -> Result<evchan_core::verbs::PostedSlot, evchan_core::verbs::SlotPostError>,
) -> (WorkCompletion, Slot) {
    let posted = post(side).unwrap_or_else(|e| panic!("post: {e}"));
    let mut wcs = wait_owned(&side.cq);
    assert_eq!(wcs.len(), 1, "one completion: {wcs:?}");
    let wc = wcs.pop().unwrap();
    let slot = posted.complete(&wc).expect("its own completion");
    (wc, slot)
}

fn slot_with(side: &mut Side, data: &[u8]) -> Slot {
    let mut slot = side.slots.pop().expect("a free slot");
    slot.copy_from(data).unwrap();
    slot
}

#[test]
fn write_read_and_atomics_land_where_the_descriptor_says() {
    require_device!();
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (sch, cch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (_server, s, _rx, _client, mut c) = owned_pair(&sch, &cch, 1);
    let buf = Exposed::<RemoteReadWrite>::new(&s.pd, 4096).unwrap();
    let words = Exposed::<RemoteAtomic>::new(&s.pd, 64).unwrap();
    // The descriptors travel in their wire form, as they would in a message.
    let rw = RemoteBuf::<RemoteReadWrite>::from_bytes(&buf.descriptor().to_bytes()).unwrap();
    let at = RemoteBuf::<RemoteAtomic>::from_bytes(&words.descriptor().to_bytes()).unwrap();
    assert_eq!(rw, buf.descriptor());

    // WRITE: the target sees the bytes, and nothing around them.
    let slot = slot_with(&mut c, b"hello");
    let (wc, slot) = run(&c, |c| {
        c.qp.post_write_slot(c.mr.mr(), slot, &rw, 100, None)
    });
    assert!(wc.is_success(), "{:?}", wc.status());
    c.slots.push(slot);
    let mut seen = [0u8; 9];
    buf.read_at(98, &mut seen).unwrap();
    assert_eq!(&seen, b"\0\0hello\0\0");

    // READ: what the target wrote comes back in the slot, with its length.
    buf.write_at(200, b"world").unwrap();
    let slot = c.slots.pop().unwrap();
    let (wc, slot) = run(&c, |c| c.qp.post_read_slot(c.mr.mr(), slot, &rw, 200, 5));
    assert!(wc.is_success(), "{:?}", wc.status());
    assert_eq!(slot.as_slice(), b"world");
    c.slots.push(slot);

    // Atomics: exact previous values, and the target's AtomicU64 sees the result.
    for (add, before) in [(5u64, 0u64), (5, 5)] {
        let slot = c.slots.pop().unwrap();
        let (wc, slot) = run(&c, |c| {
            c.qp.post_fetch_add_slot(c.mr.mr(), slot, &at, 8, add)
        });
        assert!(wc.is_success(), "{:?}", wc.status());
        assert_eq!(atomic_result(&slot), Some(before));
        c.slots.push(slot);
    }
    let word = words.atomic_u64(8).unwrap();
    assert_eq!(word.load(std::sync::atomic::Ordering::Relaxed), 10);
    for (compare, swap, before, after) in [(10u64, 42u64, 10u64, 42u64), (10, 7, 42, 42)] {
        let slot = c.slots.pop().unwrap();
        let (wc, slot) = run(&c, |c| {
            c.qp.post_compare_swap_slot(c.mr.mr(), slot, &at, 8, compare, swap)
        });
        assert!(wc.is_success(), "{:?}", wc.status());
        assert_eq!(atomic_result(&slot), Some(before));
        assert_eq!(word.load(std::sync::atomic::Ordering::Relaxed), after);
        c.slots.push(slot);
    }
    assert_eq!(
        words
            .atomic_u64(0)
            .unwrap()
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[test]
fn bad_ranges_are_refused_before_posting() {
    require_device!();
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (sch, cch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (_server, s, _rx, _client, mut c) = owned_pair(&sch, &cch, 2);
    let buf = Exposed::<RemoteWrite>::new(&s.pd, 100).unwrap();
    let words = Exposed::<RemoteAtomic>::new(&s.pd, 16).unwrap();
    let readable = Exposed::<RemoteRead>::new(&s.pd, 100).unwrap();
    let (w, at, w_read) = (buf.descriptor(), words.descriptor(), readable.descriptor());
    let refused = |e: evchan_core::verbs::SlotPostError| match e.error {
        VerbsError::Remote(r) => (r, e.slot),
        other => panic!("expected a remote range error, got {other}"),
    };

    let slot = slot_with(&mut c, b"0123456789");
    let (why, slot) = refused(
        c.qp.post_write_slot(c.mr.mr(), slot, &w, 91, None)
            .unwrap_err(),
    );
    assert_eq!(
        why,
        RemoteError::OutOfBounds {
            offset: 91,
            len: 10,
            remote_len: 100
        }
    );
    assert_eq!(
        slot.as_slice(),
        b"0123456789",
        "the slot comes back unchanged"
    );
    let (why, slot) = refused(
        c.qp.post_fetch_add_slot(c.mr.mr(), slot, &at, 4, 1)
            .unwrap_err(),
    );
    assert!(matches!(why, RemoteError::Misaligned { .. }), "{why:?}");
    let (why, slot) = refused(
        c.qp.post_fetch_add_slot(c.mr.mr(), slot, &at, 16, 1)
            .unwrap_err(),
    );
    assert!(matches!(why, RemoteError::OutOfBounds { .. }), "{why:?}");
    // A READ longer than the slot (64 bytes), and an empty one.
    let (why, slot) = refused(
        c.qp.post_read_slot(c.mr.mr(), slot, &w_read, 0, 65)
            .unwrap_err(),
    );
    assert_eq!(
        why,
        RemoteError::LocalTooSmall {
            need: 65,
            capacity: 64
        }
    );
    let (why, mut slot) = refused(
        c.qp.post_read_slot(c.mr.mr(), slot, &w_read, 0, 0)
            .unwrap_err(),
    );
    assert_eq!(why, RemoteError::Empty);
    // An empty WRITE without immediate data (it would skip the key check).
    slot.set_len(0).unwrap();
    let (why, slot) = refused(
        c.qp.post_write_slot(c.mr.mr(), slot, &w, 0, None)
            .unwrap_err(),
    );
    assert_eq!(why, RemoteError::Empty);
    c.slots.push(slot);
    // Nothing was posted: the CQ is empty, and the connection still works.
    let mut wcs = Vec::new();
    assert_eq!(c.cq.cq().poll(&mut wcs, 8).unwrap(), 0);
    let slot = slot_with(&mut c, b"ok");
    let (wc, _slot) = run(&c, |c| c.qp.post_write_slot(c.mr.mr(), slot, &w, 98, None));
    assert!(wc.is_success(), "{:?}", wc.status());
    let mut seen = [0u8; 2];
    buf.read_at(98, &mut seen).unwrap();
    assert_eq!(&seen, b"ok");
}

#[test]
fn a_lying_descriptor_fails_at_the_initiator_and_touches_nothing() {
    require_device!();
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (sch, cch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (_server, s, _rx, _client, mut c) = owned_pair(&sch, &cch, 3);
    // Two regions side by side in the target's address space may follow each other: the lie
    // names the 64 bytes right after the exposed 4096, with the exposed region's rkey.
    let buf = Exposed::<RemoteWrite>::new(&s.pd, 4096).unwrap();
    let d = buf.descriptor();
    let mut wire = d.to_bytes();
    wire[4..12].copy_from_slice(&(d.addr() + 4096).to_be_bytes());
    wire[12..16].copy_from_slice(&64u32.to_be_bytes());
    let lie = RemoteBuf::<RemoteWrite>::from_bytes(&wire).unwrap();
    let slot = slot_with(&mut c, &[0xee; 64]);
    let (wc, _slot) = run(&c, |c| c.qp.post_write_slot(c.mr.mr(), slot, &lie, 0, None));
    assert_eq!(wc.status(), WcStatus::RemoteAccess, "the lie's write");
    let mut all = vec![0u8; 4096];
    buf.read_at(0, &mut all).unwrap();
    assert!(
        all.iter().all(|&b| b == 0),
        "the exposed bytes are untouched"
    );
    // The connection is over: the initiator's QP goes to the error state, so the next request
    // fails (flushed, or, posted before the QP's state changed, unanswered by the peer's QP
    // in error); it never lands.
    let slot = slot_with(&mut c, b"x");
    let (wc, _slot) = run(&c, |c| c.qp.post_write_slot(c.mr.mr(), slot, &d, 0, None));
    assert!(
        matches!(wc.status(), WcStatus::WrFlush | WcStatus::RetryExceeded),
        "a request after the error: {:?}",
        wc.status()
    );
    let mut first = [0u8; 1];
    buf.read_at(0, &mut first).unwrap();
    assert_eq!(first, [0], "the request after the error did not land");
}

#[test]
fn a_revoked_region_is_out_of_reach_and_keeps_what_was_written() {
    require_device!();
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (sch, cch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (_server, s, _rx, _client, mut c) = owned_pair(&sch, &cch, 4);
    let buf = Exposed::<RemoteWrite>::new(&s.pd, 256).unwrap();
    let d = buf.descriptor();
    let slot = slot_with(&mut c, b"before");
    let (wc, slot) = run(&c, |c| c.qp.post_write_slot(c.mr.mr(), slot, &d, 0, None));
    assert!(wc.is_success(), "{:?}", wc.status());
    c.slots.push(slot);
    let mut back = buf.revoke().unwrap();
    assert_eq!(&back[..6], b"before");
    assert_eq!(back.len(), 256);
    back[0] = b'B'; // ours now: a plain slice
    let slot = slot_with(&mut c, b"after!");
    let (wc, _slot) = run(&c, |c| c.qp.post_write_slot(c.mr.mr(), slot, &d, 0, None));
    assert_eq!(
        wc.status(),
        WcStatus::RemoteAccess,
        "a write with the revoked rkey"
    );
    assert_eq!(&back[..6], b"Before");
}

/// Posts from a registered buffer with `post`, waits for the completion on `side`'s CQ: the
/// completion and the region back.
fn run_mr(
    side: &Side,
    post: impl FnOnce(&Side) -> Result<PostedMr<Vec<u8>>, MrPostError<Vec<u8>>>,
) -> (WorkCompletion, OwnedMr<Vec<u8>>) {
    let posted = post(side).unwrap_or_else(|e| panic!("post: {e}"));
    let mut wcs = wait_owned(&side.cq);
    assert_eq!(wcs.len(), 1, "one completion: {wcs:?}");
    let wc = wcs.pop().unwrap();
    let mr = posted.complete(&wc).expect("its own completion");
    (wc, mr)
}

#[test]
fn registered_buffers_are_the_local_side_without_a_copy() {
    require_device!();
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (sch, cch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (_server, s, rx, _client, c) = owned_pair(&sch, &cch, 5);
    let exposed = Exposed::<RemoteReadWrite>::new(&s.pd, 8192).unwrap();
    let rw = exposed.descriptor();

    // A WRITE of 5,000 bytes (the slots here are 64) from a buffer, and a READ of them back
    // into another.
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 253) as u8).collect();
    let out = OwnedMr::new(&c.pd, data.clone()).unwrap();
    let (wc, out) = run_mr(&c, |c| c.qp.post_write_mr(out, 5000, &rw, 100, None));
    assert!(wc.is_success(), "{:?}", wc.status());
    let mut seen = vec![0u8; 5002];
    exposed.read_at(99, &mut seen).unwrap();
    assert_eq!(
        (seen[0], seen[5001]),
        (0, 0),
        "bytes around the write changed"
    );
    assert_eq!(&seen[1..5001], &data[..]);
    let back = OwnedMr::new(&c.pd, vec![0u8; 5000]).unwrap();
    let (wc, back) = run_mr(&c, |c| c.qp.post_read_mr(back, 5000, &rw, 100));
    assert!(wc.is_success(), "{:?}", wc.status());
    assert_eq!(back.mr().as_slice(), &data[..]);

    // Refused before posting, the region back: a range outside the descriptor, a length
    // beyond the buffer, a buffer of another PD than the QP's.
    let e = c.qp.post_read_mr(back, 100, &rw, 8100).unwrap_err();
    assert!(
        matches!(e.error, VerbsError::Remote(RemoteError::OutOfBounds { .. })),
        "{e}"
    );
    let e = c.qp.post_write_mr(e.mr, 5001, &rw, 0, None).unwrap_err();
    assert!(
        matches!(
            e.error,
            VerbsError::Remote(RemoteError::LocalTooSmall { .. })
        ),
        "{e}"
    );
    let foreign = OwnedMr::new(&s.pd, vec![1u8; 16]).unwrap();
    let e = c.qp.post_send_mr(foreign, 16, None).unwrap_err();
    assert!(matches!(e.error, VerbsError::InvalidArgument(_)), "{e}");
    assert!(!e.is_queue_full());

    // A SEND of a buffer's first 11 bytes lands in the peer's posted receive.
    let (wc, out) = run_mr(&c, |c| c.qp.post_send_mr(out, 11, Some(7)));
    assert!(wc.is_success(), "{:?}", wc.status());
    let mut wcs = wait_owned(&s.cq);
    let got = rx
        .complete(&wcs.pop().expect("the receive"))
        .expect("its completion");
    assert_eq!(got.as_slice(), &data[..11]);
    drop(out);
}

#[test]
fn a_grant_revoked_alone_is_out_of_reach_and_the_others_stay() {
    require_device!();
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (sch, cch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (_server, s, _rx, _client, mut c) = owned_pair(&sch, &cch, 6);
    let mut buf = Exposed::<RemoteWrite>::new(&s.pd, 256).unwrap();
    let first = buf.descriptor();
    let second = buf.grant().unwrap();
    let third = buf.grant().unwrap();
    assert_eq!((second.addr(), second.len()), (first.addr(), first.len()));
    assert!(first.rkey() != second.rkey() && second.rkey() != third.rkey());
    assert_eq!(buf.grants(), 3);
    for (d, at, what) in [
        (&first, 0, b"first!"),
        (&second, 8, b"second"),
        (&third, 16, b"third!"),
    ] {
        let slot = slot_with(&mut c, what);
        let (wc, slot) = run(&c, |c| c.qp.post_write_slot(c.mr.mr(), slot, d, at, None));
        assert!(wc.is_success(), "{:?}", wc.status());
        c.slots.push(slot);
    }
    buf.revoke_grant(&second).unwrap();
    assert_eq!(buf.grants(), 2);
    // Not a further grant (any more): refused, nothing changes.
    assert!(matches!(
        buf.revoke_grant(&second),
        Err(VerbsError::InvalidArgument(_))
    ));
    assert!(matches!(
        buf.revoke_grant(&first),
        Err(VerbsError::InvalidArgument(_))
    ));
    let slot = slot_with(&mut c, b"third2");
    let (wc, slot) = run(&c, |c| {
        c.qp.post_write_slot(c.mr.mr(), slot, &third, 16, None)
    });
    assert!(wc.is_success(), "{:?}", wc.status());
    c.slots.push(slot);
    // The revoked grant's rkey: refused at the peer, nothing placed.
    let slot = slot_with(&mut c, b"STALE!");
    let (wc, _slot) = run(&c, |c| {
        c.qp.post_write_slot(c.mr.mr(), slot, &second, 8, None)
    });
    assert_eq!(
        wc.status(),
        WcStatus::RemoteAccess,
        "a write with a revoked grant"
    );
    let back = buf.revoke().unwrap();
    assert_eq!(&back[..22], b"first!\0\0second\0\0third2");
}
