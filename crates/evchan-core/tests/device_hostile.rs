//! Device tests of what a hostile reading of evchan-core found (issue 7): waits that stay
//! bounded when safe code clears `O_NONBLOCK` through a dup of a channel's descriptor (the
//! readiness proxy the channels hand out, through which no event can be read either), the
//! proxy's one documented limit (a descriptor added to it through a dup: spurious readiness
//! only), a
//! foreign PD's memory region refused by the owned posts, a listening id that
//! cannot be migrated away from a queued `CONNECT_REQUEST`, and a server that makes its PD and
//! CQs before it listens and accepts on them.
//!
//! Run in the soft-RoCE VM (`cargo xtask test`); skipped natively without a device, failed
//! without one when `EVCHAN_REQUIRE_DEVICE=1`.
#![forbid(unsafe_code)]

mod support;

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use evchan_core::cm::{ConnParam, EventKind, PortSpace};
use evchan_core::verbs::{
    CompChannel, Context, Cq, ForeignPd, Pd, Qp, QpCaps, QpInit, QpState, RtsAttr, WcStatus,
};
use evchan_core::{CmId, EventChannel};
use support::verbs::*;
use support::*;

/// How long a call that must not wait for a future event may take (TCG is slow, but not this).
const PROMPT: Duration = Duration::from_secs(5);

/// Clears `O_NONBLOCK` on the open file behind `fd` through a dup of it, as safe code can
/// (std's `UnixStream::set_nonblocking(false)` on the dup does the same).
fn clear_nonblocking_through_a_dup(fd: std::os::fd::BorrowedFd<'_>) {
    let dup = fd.try_clone_to_owned().expect("dup");
    evchan_sys::fd::set_nonblocking(dup.as_fd(), false).expect("fcntl on the dup");
    assert!(
        !evchan_sys::fd::is_nonblocking(fd).unwrap(),
        "the dup shares the file, so the original is blocking now"
    );
}

/// The sequence the issue reproduced: an event-loop thread in `get_event`, a control thread
/// dropping an old id, the channel's file made blocking through a dup. Before the fix the
/// reader waited inside `rdma_get_cm_event` holding the channel's gate, and the drop hung.
#[test]
fn id_drop_does_not_hang_while_a_reader_waits_on_a_channel_made_blocking() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    clear_nonblocking_through_a_dup(channel.as_fd());
    let empty = within(PROMPT, "try_get_event on a blocking file", || {
        channel.try_get_event().unwrap().is_none()
    });
    assert!(empty, "nothing was queued");
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let ev = channel.get_event().expect("get_event");
            let kind = ev.kind();
            ev.ack();
            kind
        });
        // Let the reader get into `get_event` (and, before the fix, into the read).
        std::thread::sleep(Duration::from_millis(500));
        let old = CmId::new(&channel, PortSpace::Tcp).unwrap();
        within(
            PROMPT,
            "drop(id) while another thread waits in get_event",
            || drop(old),
        );
        // Events still flow: the reader gets the next one.
        let id = CmId::new(&channel, PortSpace::Tcp)
            .unwrap()
            .resolve_addr(None, v4(port(1)), RESOLVE_TIMEOUT)
            .unwrap();
        let kind = within(EVENT_TIMEOUT, "the reader's ADDR_RESOLVED", || {
            reader.join().unwrap()
        });
        assert_eq!(kind, EventKind::AddrResolved);
        drop(id);
    });
}

/// Runs `wait(timeout)`, a timed read of an idle channel that says whether it got something,
/// within [`PROMPT`]: it must get nothing, and not before `timeout` has passed.
fn waits_out_idle(what: &str, timeout: Duration, wait: impl FnOnce(Duration) -> bool) {
    let start = Instant::now();
    let got = within(PROMPT, what, || wait(timeout));
    assert!(!got, "{what}: something on an idle channel");
    assert!(
        start.elapsed() >= timeout,
        "{what}: no early None, the wait lasts its timeout"
    );
}

#[test]
fn cm_timed_read_is_bounded_on_a_channel_made_blocking() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    clear_nonblocking_through_a_dup(channel.as_fd());
    waits_out_idle(
        "get_event_timeout(1 s) on an idle channel",
        Duration::from_secs(1),
        |t| channel.get_event_timeout(t).unwrap().is_some(),
    );
}

#[test]
fn cq_event_reads_are_bounded_on_a_comp_channel_made_blocking() {
    require_device!();
    let ctx = open_device();
    let comp = CompChannel::new(&ctx).unwrap();
    let cq = Cq::new(&comp, 16).unwrap();
    clear_nonblocking_through_a_dup(comp.as_fd());
    let none = within(PROMPT, "try_get_cq_event on a blocking file", || {
        comp.try_get_cq_event(&[&cq]).unwrap().is_none()
    });
    assert!(none);
    waits_out_idle(
        "get_cq_event_timeout(1 s) on an idle channel",
        Duration::from_secs(1),
        |t| comp.get_cq_event_timeout(&[&cq], t).unwrap().is_some(),
    );
    let n = within(PROMPT, "wait(200 ms) on an idle channel", || {
        comp.wait(&[&cq], Some(Duration::from_millis(200)), |_, _| {})
            .unwrap()
    });
    assert_eq!(n, 0);
}

/// Reads one byte through a dup of `fd`, as safe code can (`File` from the dup): what the
/// channels hand out is a readiness proxy, which refuses reads (`EINVAL`).
fn read_through_a_dup(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Error {
    use std::io::Read;
    let dup = fd.try_clone_to_owned().expect("dup");
    std::fs::File::from(dup)
        .read(&mut [0u8; 64])
        .expect_err("a read through the handed-out descriptor")
}

#[test]
fn the_cm_descriptor_handed_out_can_neither_take_events_nor_make_reads_wait() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, v4(port(7)), RESOLVE_TIMEOUT)
        .unwrap();
    assert!(
        evchan_sys::fd::poll_readable(channel.as_fd(), Some(EVENT_TIMEOUT)).unwrap(),
        "the proxy reports the queued ADDR_RESOLVED"
    );
    clear_nonblocking_through_a_dup(channel.as_fd());
    let err = read_through_a_dup(channel.as_fd());
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    // The event is still the channel's, and the channel's reads still never wait.
    let ev = within(PROMPT, "try_get_event of the queued event", || {
        channel.try_get_event().unwrap()
    })
    .expect("the event was not taken through the dup");
    let id = id.addr_resolved(&ev).unwrap();
    ev.ack();
    let empty = within(PROMPT, "try_get_event on an empty channel", || {
        channel.try_get_event().unwrap().is_none()
    });
    assert!(empty);
    drop(id);
}

/// Registers a descriptor that stays readable (a socket with a byte queued) with the epoll
/// instance behind `proxy`, through a dup of it, as safe code can (rustix's or nix's epoll
/// wrappers take any `AsFd`; here evchan-sys's safe one). Returns the socket pair, which must
/// outlive the check.
fn add_a_readable_fd_through_a_dup(
    proxy: std::os::fd::BorrowedFd<'_>,
) -> (
    std::os::unix::net::UnixStream,
    std::os::unix::net::UnixStream,
) {
    use std::io::Write;
    let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    a.write_all(&[1]).unwrap();
    let dup = proxy.try_clone_to_owned().expect("dup");
    evchan_sys::fd::epoll_add_readable(dup.as_fd(), b.as_fd()).expect("epoll_ctl through the dup");
    assert!(
        evchan_sys::fd::poll_readable(proxy, Some(Duration::ZERO)).unwrap(),
        "the proxy reports the foreign descriptor's readiness"
    );
    (a, b)
}

/// The documented limit of the readiness proxy, attacked: a descriptor added to its epoll
/// instance through a dup makes the proxy report readiness the channel does not have; the
/// channel's own reads and waits are unaffected (no wait, no early return, events still come).
#[test]
fn a_descriptor_added_to_the_cm_proxy_gives_only_spurious_readiness() {
    require_device!();
    let channel = EventChannel::new().unwrap();
    let _pair = add_a_readable_fd_through_a_dup(channel.as_fd());
    let empty = within(PROMPT, "try_get_event on an empty channel", || {
        channel.try_get_event().unwrap().is_none()
    });
    assert!(empty);
    waits_out_idle(
        "get_event_timeout(300 ms) on an idle channel",
        Duration::from_millis(300),
        |t| channel.get_event_timeout(t).unwrap().is_some(),
    );
    let id = CmId::new(&channel, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, v4(port(8)), RESOLVE_TIMEOUT)
        .unwrap();
    let ev = within(EVENT_TIMEOUT, "get_event of ADDR_RESOLVED", || {
        channel.get_event().unwrap()
    });
    assert_eq!(ev.kind(), EventKind::AddrResolved);
    let id = id.addr_resolved(&ev).unwrap();
    ev.ack();
    drop(id);
}

#[test]
fn a_descriptor_added_to_the_comp_proxy_gives_only_spurious_readiness() {
    require_device!();
    let ctx = open_device();
    let comp = CompChannel::new(&ctx).unwrap();
    let cq = Cq::new(&comp, 16).unwrap();
    let _pair = add_a_readable_fd_through_a_dup(comp.fd());
    let none = within(PROMPT, "try_get_cq_event", || {
        comp.try_get_cq_event(&[&cq]).unwrap().is_none()
    });
    assert!(none);
    waits_out_idle(
        "get_cq_event_timeout(300 ms) on an idle channel",
        Duration::from_millis(300),
        |t| comp.get_cq_event_timeout(&[&cq], t).unwrap().is_some(),
    );
}

#[test]
fn the_comp_descriptor_handed_out_cannot_read_events() {
    require_device!();
    let ctx = open_device();
    let comp = CompChannel::new(&ctx).unwrap();
    let cq = Cq::new(&comp, 16).unwrap();
    let err = read_through_a_dup(comp.fd());
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    assert_eq!(
        comp.fd().as_raw_fd(),
        comp.as_fd().as_raw_fd(),
        "fd() and AsFd give the same proxy"
    );
    let none = within(PROMPT, "try_get_cq_event", || {
        comp.try_get_cq_event(&[&cq]).unwrap().is_none()
    });
    assert!(none);
}

#[test]
fn async_event_reads_are_bounded_on_a_context_made_blocking() {
    require_device!();
    let ctx = open_device();
    clear_nonblocking_through_a_dup(ctx.as_fd());
    let none = within(PROMPT, "try_get_async_event on a blocking file", || {
        ctx.try_get_async_event().unwrap().is_none()
    });
    assert!(none);
    let none = within(
        PROMPT,
        "get_async_event_timeout(1 s) on an idle context",
        || {
            ctx.get_async_event_timeout(Duration::from_secs(1))
                .unwrap()
                .is_none()
        },
    );
    assert!(none);
}

/// The owned posts refuse a region of another PD than the QP's, before posting, and give it
/// back; the QP's own PD's regions still go through. Also: the QP's state follows its modifies
/// (kept by the handle, not read from `ibv_qp::state`), and a `Posted` prints its address and
/// length, not its bytes.
#[test]
fn a_foreign_pd_region_is_refused_by_the_owned_posts() {
    require_device!();
    let ctx = open_device();
    let (gid, pd, comp) = loopback(&ctx);
    let other_pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&comp, 16).unwrap();
    let probe = Qp::new_rc(&pd, &cq, &cq, QpCaps::default()).unwrap();
    assert_eq!(probe.state(), QpState::Reset);
    probe.modify_to_init(1).unwrap();
    assert_eq!(probe.state(), QpState::Init);
    // INIT -> RTS skips RTR: refused by the driver, and the recorded state does not move.
    assert!(probe.modify_to_rts(&RtsAttr::default()).is_err());
    assert_eq!(probe.state(), QpState::Init);
    probe.modify_to_error().unwrap();
    assert_eq!(probe.state(), QpState::Error);

    let (a, b) = rc_pair(&gid, &pd, (&cq, &cq), (&cq, &cq));
    assert_eq!(a.state(), QpState::Rts);
    let foreign = other_pd.reg_mr(b"12345678".to_vec()).unwrap();
    let err = a.post_send(foreign, 0..8, None).unwrap_err();
    assert!(err.is_foreign_pd(), "{err:?}");
    assert!(err.source.get_ref().is_some_and(|e| e.is::<ForeignPd>()));
    assert_eq!(
        err.mr.as_slice(),
        b"12345678",
        "the region comes back unchanged"
    );
    let err = b
        .post_recv(other_pd.reg_mr(vec![0u8; 8]).unwrap(), 0..8)
        .unwrap_err();
    assert!(err.is_foreign_pd(), "{err:?}");

    let rx = recv(&pd, &b, 8);
    let shown = format!("{rx:?}");
    assert!(
        shown.contains("addr") && shown.contains("region_len"),
        "{shown}"
    );
    let tx = send(&pd, &a, b"abcdefgh".to_vec(), None);
    let shown = format!("{tx:?}");
    assert!(!shown.contains("97, 98"), "no bytes in {shown}");
    let all = complete_all(&cq, vec![rx, tx]);
    let (mr, wc) = &all[0];
    assert_eq!(wc.status(), WcStatus::Success);
    assert_eq!(mr.as_slice(), b"abcdefgh");
}

/// A server that makes its PD, completion channel and CQ before it listens, on librdmacm's own
/// context of the device (`Context::rdma_cm_devices`, and the same as the listener's
/// `bound_context`), then accepts a connection on them and receives a message.
#[test]
fn a_server_sets_up_before_listening_and_accepts_on_its_objects() {
    require_device!();
    let addr = v4(port(3));
    let contexts = Context::rdma_cm_devices().unwrap();
    let ctx = contexts
        .iter()
        .find(|c| c.name() == "rxe0")
        .or(contexts.first())
        .expect("a device");
    let (spd, scomp) = objects(ctx);
    let scq = Cq::new(&scomp, 64).unwrap();
    let (cpd, ccomp) = objects(ctx);
    let ccq = Cq::new(&ccomp, 64).unwrap();
    let (sch, cch) = channels();

    // A wildcard address names no device; the VM's address names rxe0.
    let wildcard = CmId::new(&cch, PortSpace::Tcp)
        .unwrap()
        .bind(SocketAddr::from(([0, 0, 0, 0], port(4))))
        .unwrap();
    assert!(wildcard.bound_context().unwrap().is_none());
    drop(wildcard);
    let bound = CmId::new(&sch, PortSpace::Tcp).unwrap().bind(addr).unwrap();
    let bound_ctx = bound.bound_context().unwrap().expect("a device's address");
    assert_eq!(bound_ctx.name(), ctx.name());
    let listening = bound.listen(8).unwrap();
    let listen_ctx = listening.bound_context().unwrap().expect("still bound");
    assert_eq!(listen_ctx.name(), ctx.name());

    // Client, on the same device's librdmacm context.
    let id = resolved(&cch, PortSpace::Tcp, addr);
    let id = id.resolve_route(RESOLVE_TIMEOUT).unwrap();
    let ev = expect_event(&cch, EventKind::RouteResolved);
    let mut client = id.route_resolved(&ev).unwrap();
    ev.ack();
    client
        .create_qp_with(&cpd, &ccq, &ccq, &QpInit::new())
        .unwrap();
    let client = client.connect(&ConnParam::new()).unwrap();

    // Server: the request's id takes the objects made before `listen`.
    let mut req = expect_event(&sch, EventKind::ConnectRequest);
    let mut server = req.take_request().expect("the request's id");
    req.ack();
    server
        .create_qp_with(&spd, &scq, &scq, &QpInit::new())
        .expect("a QP on the PD and CQ made before listening");
    // A region of the client's PD is refused on the server's QP.
    let err = server
        .post_recv(cpd.reg_mr(vec![0u8; 8]).unwrap(), 0..8)
        .unwrap_err();
    assert!(err.is_foreign_pd(), "{err:?}");
    let rx = server
        .post_recv(spd.reg_mr(vec![0u8; 64]).unwrap(), 0..64)
        .unwrap();
    let server = server.accept(&ConnParam::new()).unwrap();
    let (client, _) = established(&cch, client);
    let (server, _) = established(&sch, server);

    let tx = client
        .post_send(cpd.reg_mr(b"hello".to_vec()).unwrap(), 0..5, None)
        .unwrap();
    let (_, wc) = complete(&ccq, tx);
    assert_eq!(wc.status(), WcStatus::Success);
    let (mr, wc) = complete(&scq, rx);
    assert_eq!(wc.status(), WcStatus::Success);
    assert_eq!(&mr.as_slice()[..5], b"hello");
    disconnect_pair(&sch, &cch, server, client);
    drop(listening);
}

/// A `CONNECT_REQUEST` queued, unread, on a listener's channel is delivered there (the listener
/// cannot be migrated away from it: `tests/ui/migrate_listening_id.rs`; what the migrate does
/// in C is shown with librdmacm alone in evchan-sys's `tests/device_raw.rs`), and the id it
/// hands over migrates to another channel, where its `ESTABLISHED` then arrives.
#[test]
fn a_queued_request_is_delivered_and_its_new_id_migrates() {
    require_device!();
    let (sch, cch) = channels();
    let other = EventChannel::new().unwrap();
    let addr = v4(port(5));
    let listening = listener(&sch, PortSpace::Tcp, addr);
    let client = connecting(&cch, PortSpace::Tcp, addr, &ConnParam::new());
    assert!(
        evchan_sys::fd::poll_readable(sch.as_fd(), Some(EVENT_TIMEOUT)).unwrap(),
        "the request is queued on the listener's channel"
    );
    let mut req = expect_event(&sch, EventKind::ConnectRequest);
    let server = req.take_request().expect("the request's id");
    // Migrated while the request that handed it over is still unacked.
    let mut server = server.migrate(&other).unwrap();
    req.ack();
    server.create_qp(&QpInit::new()).unwrap();
    let server = server.accept(&ConnParam::new()).unwrap();
    let (client, _) = established(&cch, client);
    let (server, _) = established(&other, server);
    assert!(
        sch.try_get_event().unwrap().is_none(),
        "nothing on the old channel"
    );
    disconnect_pair(&other, &cch, server, client);
    drop(listening);
}
