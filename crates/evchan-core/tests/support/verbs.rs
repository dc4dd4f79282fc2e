//! Verbs helpers: the device context, two RC QPs of one device connected to each other over
//! soft-RoCE's loopback, and event-driven waits for posted work requests.

use std::collections::HashMap;
use std::time::Duration;

use evchan_core::verbs::{
    CompChannel, Context, Cq, DeviceList, Gid, GidType, Mr, Pd, Posted, Qp, QpCaps, RtrAttr,
    RtsAttr, WorkCompletion,
};

use super::VM_IPV4;

/// How long one completion may take (TCG is slow).
pub const WC_TIMEOUT: Duration = Duration::from_secs(20);

/// Opens the VM's `rxe0` (or else the first device). Call it after [`require_device!`].
pub fn open_device() -> Context {
    let list = DeviceList::new().expect("ibv_get_device_list");
    let dev = list
        .find("rxe0")
        .or_else(|| list.iter().next())
        .expect("a device, as require_device! found");
    dev.open().expect("ibv_open_device")
}

/// The RoCE v2 GID of 169.254.77.1 on port 1, or else any RoCE v2 GID, or else the last GID.
pub fn loopback_gid(ctx: &Context) -> Gid {
    let gids = ctx.gids(1).expect("ibv_query_gid_ex on port 1");
    let v2 = |g: &&Gid| g.gid_type == GidType::RoceV2;
    gids.iter()
        .filter(v2)
        .find(|g| g.ipv4() == Some(VM_IPV4))
        .or_else(|| gids.iter().find(v2))
        .or(gids.last())
        .copied()
        .expect("port 1 has a GID")
}

/// Connects two RC QPs of one device to each other (RESET → INIT → RTR → RTS), over `gid`:
/// rxe loops the traffic back internally.
pub fn connect_qps(a: &Qp<'_>, b: &Qp<'_>, gid: &Gid, rts: RtsAttr) {
    for (qp, peer) in [(a, b), (b, a)] {
        qp.modify_to_init(1).expect("RESET -> INIT");
        qp.modify_to_rtr(&RtrAttr::new(1, peer.qp_num(), gid, gid.raw))
            .expect("INIT -> RTR");
        qp.modify_to_rts(&rts).expect("RTR -> RTS");
    }
}

/// Waits on `cq` (event-driven) until `posted`'s completion arrives; returns it with the region.
/// Any other completion on the way fails the test.
pub fn complete<'pd>(
    cq: &Cq<'_>,
    posted: Posted<'pd, Vec<u8>>,
) -> (Mr<'pd, Vec<u8>>, WorkCompletion) {
    let mut all = complete_all(cq, vec![posted]);
    all.pop().unwrap()
}

/// Waits on `cq` (event-driven) until every one of `posted` has completed, in any order;
/// returns the regions with their completions in completion order. A completion of none of
/// them fails the test, as does [`WC_TIMEOUT`] without one.
pub fn complete_all<'pd>(
    cq: &Cq<'_>,
    posted: Vec<Posted<'pd, Vec<u8>>>,
) -> Vec<(Mr<'pd, Vec<u8>>, WorkCompletion)> {
    let mut pending: HashMap<u64, Posted<'pd, Vec<u8>>> =
        posted.into_iter().map(|p| (p.wr_id(), p)).collect();
    let mut done = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let n = cq
            .wait(Some(WC_TIMEOUT), |wc| {
                let p = pending
                    .remove(&wc.wr_id())
                    .unwrap_or_else(|| panic!("unexpected completion {wc:?}"));
                match p.complete(&wc) {
                    Ok(mr) => done.push((mr, wc)),
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

/// Two RC QPs on `pd`, `a` completing on `a_cqs` (send, receive) and `b` on `b_cqs`, connected
/// to each other over `gid` ([`connect_qps`]) with default caps and RTS attributes.
pub fn rc_pair<'r>(
    gid: &Gid,
    pd: &'r Pd<'_>,
    a_cqs: (&'r Cq<'_>, &'r Cq<'_>),
    b_cqs: (&'r Cq<'_>, &'r Cq<'_>),
) -> (Qp<'r>, Qp<'r>) {
    rc_pair_with(gid, pd, a_cqs, b_cqs, QpCaps::default(), RtsAttr::default())
}

/// [`rc_pair`] with `caps` for both QPs and `rts` for both transitions to RTS.
pub fn rc_pair_with<'r>(
    gid: &Gid,
    pd: &'r Pd<'_>,
    a_cqs: (&'r Cq<'_>, &'r Cq<'_>),
    b_cqs: (&'r Cq<'_>, &'r Cq<'_>),
    caps: QpCaps,
    rts: RtsAttr,
) -> (Qp<'r>, Qp<'r>) {
    let a = Qp::new_rc(pd, a_cqs.0, a_cqs.1, caps).unwrap();
    let b = Qp::new_rc(pd, b_cqs.0, b_cqs.1, caps).unwrap();
    connect_qps(&a, &b, gid, rts);
    (a, b)
}

/// `qp.post_recv` into a fresh, zeroed `len`-byte region of `pd`.
pub fn recv<'pd>(pd: &'pd Pd<'_>, qp: &Qp<'_>, len: usize) -> Posted<'pd, Vec<u8>> {
    qp.post_recv(pd.reg_mr(vec![0u8; len]).unwrap(), 0..len)
        .unwrap()
}

/// `qp.post_send` of `bytes`, registered in a fresh region of `pd`, with immediate data `imm`.
pub fn send<'pd>(
    pd: &'pd Pd<'_>,
    qp: &Qp<'_>,
    bytes: Vec<u8>,
    imm: Option<u32>,
) -> Posted<'pd, Vec<u8>> {
    let len = bytes.len();
    qp.post_send(pd.reg_mr(bytes).unwrap(), 0..len, imm)
        .unwrap()
}

/// One side's verbs objects on `ctx` (for an rdma_cm id: the context it hands out): a PD and a
/// completion channel.
pub fn objects(ctx: &Context) -> (Pd<'_>, CompChannel<'_>) {
    (Pd::new(ctx).unwrap(), CompChannel::new(ctx).unwrap())
}

/// What every loopback test starts from on `ctx`: the loopback GID, a PD and a completion
/// channel.
pub fn loopback(ctx: &Context) -> (Gid, Pd<'_>, CompChannel<'_>) {
    (
        loopback_gid(ctx),
        Pd::new(ctx).unwrap(),
        CompChannel::new(ctx).unwrap(),
    )
}

/// Waits on `cq` (event-driven) until at least `n` completions have arrived, each wait at most
/// `timeout`; fails the test when one brings none.
pub fn wait_for(cq: &Cq<'_>, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
    let mut wcs = Vec::new();
    while wcs.len() < n {
        let got = cq.wait(Some(timeout), |wc| wcs.push(wc)).unwrap();
        assert!(
            got > 0,
            "no completion within {timeout:?}; {} of {n}",
            wcs.len()
        );
    }
    wcs
}
