//! Device tests of the one context/PD/QP story: an rdma_cm connection whose QPs live on the
//! caller's own PD and CQs, on the caller's completion channels, created on the contexts the ids
//! hand out ([`CmId::context`]); messages both ways with the safe owned-buffer posts, waited for
//! with the event-driven wait helper ([`Cq::wait`]).
//!
//! Run them in the soft-RoCE VM (`cargo xtask vm --env EVCHAN_REQUIRE_DEVICE=1 --
//! target/debug/deps/device_cm_verbs-… --test-threads=1`); natively without a device they skip
//! (or fail with `EVCHAN_REQUIRE_DEVICE=1`).
#![forbid(unsafe_code)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use evchan_core::cm::{ConnParam, EventKind, PortSpace};
use evchan_core::verbs::{CompChannel, Context, Cq, Pd, QpInit, WcOpcode, WcStatus};
use evchan_core::EventChannel;
use support::verbs::{complete, objects};
use support::*;

/// Client and server over rdma_cm at `addr`, each with its own completion channel, CQ, PD and
/// memory regions; `rounds` ping-pongs; disconnect.
fn exchange(addr: SocketAddr, rounds: u32) {
    let (sch, cch) = channels();
    let listening = listener(&sch, PortSpace::Tcp, addr);

    // Client: after address resolution its id hands out the device context.
    let id = resolved(&cch, PortSpace::Tcp, addr);
    let cctx = id.context().unwrap();
    assert_eq!(cctx.name(), id.verbs().name());
    let (cpd, ccomp) = objects(&cctx);
    let ccq = Cq::new(&ccomp, 64).unwrap();
    let id = id.resolve_route(RESOLVE_TIMEOUT).unwrap();
    let ev = expect_event(&cch, EventKind::RouteResolved);
    let mut client = id.route_resolved(&ev).unwrap();
    ev.ack();

    // Posting before there is a QP of the caller's is refused, the region given back.
    let err = client
        .post_recv(cpd.reg_mr(vec![0u8; 8]).unwrap(), 0..8)
        .unwrap_err();
    assert_eq!(err.mr.len(), 8);

    client
        .create_qp_with(&cpd, &ccq, &ccq, &QpInit::new())
        .unwrap();
    let cqpn = client.qp_num().expect("the client has a QP");
    // The id's PD is now the caller's.
    assert!(client.pd().unwrap().belongs_to(&client.verbs()));
    // A second QP on the same id is refused.
    assert!(client
        .create_qp_with(&cpd, &ccq, &ccq, &QpInit::new())
        .is_err());
    let mut crx = Some(
        client
            .post_recv(cpd.reg_mr(vec![0u8; 256]).unwrap(), 0..256)
            .unwrap(),
    );
    let client = client.connect(&ConnParam::new()).unwrap();

    // Objects of a context opened with ibv_open_device, not the id's (borrowed by the server's
    // failed `create_qp_with` below, so declared before it).
    let own = Context::open(&cctx.name()).unwrap();
    let own_pd = Pd::new(&own).unwrap();

    // Server: the new id of the request hands out its context too.
    let mut req = expect_event(&sch, EventKind::ConnectRequest);
    let server = req.take_request().expect("the request's id");
    req.ack();
    let sctx = server.context().unwrap();
    assert_eq!(sctx.name(), cctx.name(), "one device in the VM");
    let (spd, scomp) = objects(&sctx);
    let scq_send = Cq::new(&scomp, 64).unwrap();
    let scq_recv = Cq::new(&scomp, 64).unwrap();
    // The id that will borrow them is bound after them, so that it is dropped first (also
    // when a panic unwinds): the client's got that from `route_resolved`.
    let mut server = server;

    // A PD of a context we opened ourselves is of another device context: librdmacm refuses
    // it (EINVAL).
    let e = server
        .create_qp_with(&own_pd, &scq_send, &scq_recv, &QpInit::new())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");

    server
        .create_qp_with(&spd, &scq_send, &scq_recv, &QpInit::new())
        .unwrap();
    let sqpn = server.qp_num().expect("the server has a QP");
    let mut srx = Some(
        server
            .post_recv(spd.reg_mr(vec![0u8; 256]).unwrap(), 0..256)
            .unwrap(),
    );
    let server = server.accept(&ConnParam::new()).unwrap();

    let ev = expect_event(&cch, EventKind::Established);
    let client = client.established(&ev).unwrap();
    ev.ack();
    let ev = expect_event(&sch, EventKind::Established);
    let server = server.established(&ev).unwrap();
    ev.ack();

    let mut ctx_buf = Some(cpd.reg_mr(vec![0u8; 256]).unwrap());
    let mut stx_buf = Some(spd.reg_mr(vec![0u8; 256]).unwrap());
    for round in 0..rounds {
        // Client → server, with immediate data; completions on the client's CQ (send) and the
        // server's receive CQ.
        let ping = format!("ping {round} from the client");
        let mut mr = ctx_buf.take().unwrap();
        mr.as_mut_slice()[..ping.len()].copy_from_slice(ping.as_bytes());
        let tx = client.post_send(mr, 0..ping.len(), Some(round)).unwrap();
        let (mr, wc) = complete(&scq_recv, srx.take().unwrap());
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        assert_eq!(wc.opcode(), Some(WcOpcode::Recv));
        assert_eq!(wc.qp_num(), sqpn);
        assert_eq!(wc.imm_data(), Some(round));
        assert_eq!(&mr.as_slice()[..wc.byte_len() as usize], ping.as_bytes());
        srx = Some(server.post_recv(mr, 0..256).unwrap());
        let (mr, wc) = complete(&ccq, tx);
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        assert_eq!(wc.opcode(), Some(WcOpcode::Send));
        assert_eq!(wc.qp_num(), cqpn);
        ctx_buf = Some(mr);

        // Server → client; completions on the server's send CQ and the client's CQ.
        let pong = format!("pong {round} from the server");
        let mut mr = stx_buf.take().unwrap();
        mr.as_mut_slice()[..pong.len()].copy_from_slice(pong.as_bytes());
        let tx = server.post_send(mr, 0..pong.len(), None).unwrap();
        let (mr, wc) = complete(&ccq, crx.take().unwrap());
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        assert_eq!(wc.opcode(), Some(WcOpcode::Recv));
        assert_eq!(wc.imm_data(), None);
        assert_eq!(&mr.as_slice()[..wc.byte_len() as usize], pong.as_bytes());
        crx = Some(client.post_recv(mr, 0..256).unwrap());
        let (mr, wc) = complete(&scq_send, tx);
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        assert_eq!(wc.qp_num(), sqpn);
        stx_buf = Some(mr);
    }
    assert!(scq_recv.poll_one().unwrap().is_none(), "nothing left over");

    // Migrating an id whose QP uses the caller's objects is refused (the migrated id would no
    // longer borrow them); the id comes back.
    let other = EventChannel::new().unwrap();
    let server = match server.migrate(&other) {
        Ok(_) => panic!("migrate of an id with the caller's QP must be refused"),
        Err(e) => {
            assert_eq!(e.error.raw_os_error(), Some(libc::EBUSY), "{}", e.error);
            e.into_id()
        }
    };

    // Disconnect: DISCONNECTED on both sides. The receives still posted complete with
    // WR_FLUSH_ERR (`WrFlush`) once the QPs leave RTS.
    let client = client.disconnect().unwrap();
    let ev = expect_event(&sch, EventKind::Disconnected);
    ev.ack();
    let server = server.disconnect().unwrap();
    let ev = expect_event(&cch, EventKind::Disconnected);
    let (mr, wc) = complete(&ccq, crx.take().unwrap());
    assert_eq!(wc.status(), WcStatus::WrFlush, "{wc:?}");
    drop(mr);

    // Drop the client id while one of its events (DISCONNECTED) is still unacked: the destroy
    // of the id is deferred to the ack, but its QP goes at once, so the CQ (and then the
    // channel) can be destroyed right away: no EBUSY, no hang.
    drop(client);
    ccq.destroy().expect("the client's QP is gone with its id");
    ccomp.destroy().unwrap();
    ev.ack();

    let ev = expect_event(&sch, EventKind::TimewaitExit);
    ev.ack();
    drop(server);
    drop(srx);
    scq_recv.destroy().unwrap();
    scq_send.destroy().unwrap();
    scomp.destroy().unwrap();
    drop(listening);
}

#[test]
fn cm_connection_on_own_cqs_ipv4() {
    require_device!();
    exchange(v4(port(1)), 50);
}

#[test]
fn cm_connection_on_own_cqs_ipv6_link_local() {
    require_device!();
    exchange(v6(port(2)), 5);
}

/// The id's context outlives the id: objects made on it stay usable after the id is gone.
#[test]
fn context_outlives_its_id() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    let id = resolved(&channel, PortSpace::Tcp, v4(port(3)));
    let ctx = id.context().unwrap();
    drop(id);
    let pd = Pd::new(&ctx).unwrap();
    let comp = CompChannel::new(&ctx).unwrap();
    let cq = Cq::new(&comp, 8).unwrap();
    let mr = pd.reg_mr(vec![1u8; 4096]).unwrap();
    assert_eq!(mr.len(), 4096);
    assert!(ctx.port(1).is_ok());
    drop(mr);
    drop(cq);
    drop(comp);
    drop(pd);
    // Another context handle of the same device, then both gone: librdmacm keeps its own.
    let again = resolved(&channel, PortSpace::Tcp, v4(port(4)))
        .context()
        .unwrap();
    assert_eq!(again.name(), ctx.name());
    drop(ctx);
    assert!(Pd::new(&again).is_ok());
}

/// An id's context shares librdmacm's async-event descriptor: evchan leaves its flags alone
/// (it stays blocking for everyone else in the process), yet the non-blocking and timed reads
/// still never wait past what they promise.
#[test]
fn id_context_async_reads_leave_the_shared_fd_blocking() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    let id = resolved(&channel, PortSpace::Tcp, v4(port(5)));
    let ctx = id.context().unwrap();
    let fd = std::os::fd::AsFd::as_fd(&ctx);
    assert!(!evchan_sys::fd::is_nonblocking(fd).unwrap());
    within(Duration::from_secs(20), "non-blocking async reads", || {
        for _ in 0..100 {
            assert!(ctx.try_get_async_event().unwrap().is_none());
        }
        let timeout = Duration::from_millis(50);
        let start = std::time::Instant::now();
        assert!(ctx.get_async_event_timeout(timeout).unwrap().is_none());
        assert!(start.elapsed() >= timeout, "timed read returned early");
    });
    assert!(!evchan_sys::fd::is_nonblocking(std::os::fd::AsFd::as_fd(&ctx)).unwrap());
}
