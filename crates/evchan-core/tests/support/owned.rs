//! Owned-style connections for the device tests: a side's `'static` objects (PD, CQ on a
//! channel of its own, a slot pool's region and slots, the id's `QpHandle`), a connected pair of
//! them, and a wait on an owned CQ.

use std::sync::Arc;

use evchan_core::cm::state::{Connected, Connecting};
use evchan_core::cm::{ConnParam, PortSpace};
use evchan_core::verbs::{
    OwnedCompChannel, OwnedCq, OwnedMr, OwnedPd, PostedSlot, QpHandle, QpInit, Slot, SlotPool,
    WorkCompletion,
};
use evchan_core::{CmId, EventChannel};

use super::*;

/// One side's owned objects: a PD, a CQ on a channel of its own, a slot pool's region and its
/// free slots, the id's QP handle.
pub struct Side {
    pub pd: OwnedPd,
    pub cq: OwnedCq,
    pub mr: OwnedMr<SlotPool>,
    pub slots: Vec<Slot>,
    pub qp: QpHandle,
}

/// Owned objects on `id`'s device (`ctx`) and the id's QP on them.
pub fn side<S: evchan_core::cm::state::CanCreateQp + evchan_core::cm::state::HasDevice>(
    id: &mut CmId<'_, S>,
    slots: usize,
    max_recv_wr: u32,
) -> Side {
    let ctx = Arc::new(id.context().unwrap());
    let pd = OwnedPd::new(ctx.clone()).unwrap();
    let cq = OwnedCq::new(&OwnedCompChannel::new(ctx).unwrap(), 256).unwrap();
    let qp = id
        .create_qp_owned(&pd, &cq, &cq, &QpInit::new().max_recv_wr(max_recv_wr))
        .unwrap();
    let (pool, slots) = SlotPool::new(slots, 64).unwrap();
    let mr = OwnedMr::new(&pd, pool).unwrap();
    Side {
        pd,
        cq,
        mr,
        slots,
        qp,
    }
}

/// A connection over owned QPs: the listener's id and the client's id, each with its side; the
/// server has a receive posted (returned too).
pub fn owned_pair<'s, 'c>(
    sch: &'s EventChannel,
    cch: &'c EventChannel,
    port_n: u16,
) -> (
    CmId<'s, Connected>,
    Side,
    PostedSlot,
    CmId<'c, Connected>,
    Side,
) {
    let addr = v4(port(port_n));
    let _l = listener(sch, PortSpace::Tcp, addr);
    let mut client = routed(cch, PortSpace::Tcp, addr);
    let c_side = side(&mut client, 8, 16);
    let client: CmId<'_, Connecting> = client.connect(&ConnParam::new()).unwrap();
    let (mut server, _) = request(sch);
    let mut s_side = side(&mut server, 8, 16);
    let rx = s_side
        .qp
        .post_recv_slot(s_side.mr.mr(), s_side.slots.pop().unwrap())
        .unwrap();
    let server = server.accept(&ConnParam::new()).unwrap();
    let (client, _) = established(cch, client);
    let (server, _) = established(sch, server);
    (server, s_side, rx, client, c_side)
}

/// Waits on `cq` through a `CqWaiter` on a current-thread tokio runtime until a completion
/// comes (within [`EVENT_TIMEOUT`]).
pub fn wait_owned(cq: &OwnedCq) -> Vec<WorkCompletion> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let waiter = cq.channel().waiter().unwrap();
        let cqs = [cq.cq()];
        let mut wcs = Vec::new();
        let n = tokio::time::timeout(
            EVENT_TIMEOUT,
            waiter.waiter().wait(&cqs, |_, wc| wcs.push(wc)),
        )
        .await
        .expect("a completion in time")
        .unwrap();
        assert_eq!(n, wcs.len());
        wcs
    })
}
