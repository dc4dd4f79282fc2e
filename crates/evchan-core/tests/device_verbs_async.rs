//! Device test of async events: a port state change, made by bringing the VM's `dummy0` (the
//! netdev under rxe0) down and up again. Run it in the soft-RoCE VM only: it changes the link.
#![forbid(unsafe_code)]

mod support;

use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use evchan_core::verbs::{AsyncElement, AsyncEventKind, Context, PortState};
use support::verbs::{connect_qps, loopback, open_device, recv};
use support::within;

fn ip_link(state: &str) {
    let st = Command::new("ip")
        .args(["link", "set", "dummy0", state])
        .status()
        .expect("run ip");
    assert!(st.success(), "ip link set dummy0 {state}: {st}");
}

/// Brings dummy0 back up however the test ends.
struct LinkUp;
impl Drop for LinkUp {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "set", "dummy0", "up"])
            .status();
    }
}

/// Waits for an async event of `kind`, printing the others it sees.
fn expect_event(ctx: &Context, kind: AsyncEventKind, limit: Duration) -> AsyncElement {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = ctx
            .get_async_event_timeout(left)
            .unwrap()
            .unwrap_or_else(|| panic!("no {kind:?} event within {limit:?}"));
        eprintln!("async event: {ev:?}");
        if ev.kind() == kind {
            let element = ev.element();
            ev.ack();
            return element;
        }
    }
}

#[test]
fn port_state_change_is_an_async_event() {
    require_device!();
    let ctx = open_device();
    if ctx.name() != "rxe0"
        || Command::new("ip")
            .args(["link", "show", support::VM_IF])
            .output()
            .map_or(true, |o| !o.status.success())
    {
        support::skip("needs the VM's rxe0 on dummy0");
        return;
    }
    // The async fd is non-blocking: nothing pending now.
    assert!(evchan_sys::fd::is_nonblocking(ctx.as_fd()).unwrap());
    while let Some(ev) = ctx.try_get_async_event().unwrap() {
        eprintln!("(earlier event: {ev:?})");
    }
    assert_eq!(ctx.port(1).unwrap().state, PortState::Active);

    let _restore = LinkUp;
    let t = Instant::now();
    ip_link("down");
    let element = expect_event(&ctx, AsyncEventKind::PortErr, Duration::from_secs(20));
    eprintln!("PORT_ERR after {:?}", t.elapsed());
    assert_eq!(element, AsyncElement::Port(1));
    assert_ne!(ctx.port(1).unwrap().state, PortState::Active);

    let t = Instant::now();
    ip_link("up");
    let element = expect_event(&ctx, AsyncEventKind::PortActive, Duration::from_secs(20));
    eprintln!("PORT_ACTIVE after {:?}", t.elapsed());
    assert_eq!(element, AsyncElement::Port(1));
    let deadline = Instant::now() + Duration::from_secs(20);
    while ctx.port(1).unwrap().state != PortState::Active {
        assert!(Instant::now() < deadline, "port 1 not ACTIVE again");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A timed wait with nothing to report returns Ok(None) after the timeout.
    let t = Instant::now();
    while let Some(ev) = ctx
        .get_async_event_timeout(Duration::from_millis(200))
        .unwrap()
    {
        eprintln!("(later event: {ev:?})");
    }
    assert!(t.elapsed() >= Duration::from_millis(200));
}

/// A CQ overrun raises IBV_EVENT_CQ_ERR naming the CQ. libibverbs' ibv_destroy_cq waits until
/// every async event naming the CQ is acked; the event is acked as soon as it is read, so
/// dropping the CQ afterwards cannot hang, even with the guard still alive.
#[test]
fn cq_overrun_is_a_cq_err_async_event() {
    use evchan_core::verbs::{Cq, Qp, QpCaps, RtsAttr};

    require_device!();
    let ctx = open_device();
    while let Some(ev) = ctx.try_get_async_event().unwrap() {
        eprintln!("(earlier event: {ev:?})");
    }
    let (gid, pd, ch) = loopback(&ctx);
    let recv_cq = Cq::new(&ch, 256).unwrap();
    let small = Cq::new(&ch, 1).unwrap();
    let capacity = small.capacity();
    eprintln!("a CQ of 1 entry has capacity {capacity}");
    let overflow = capacity + 4;
    let caps = QpCaps {
        max_send_wr: overflow + 4,
        max_recv_wr: overflow + 4,
        ..QpCaps::default()
    };
    // Not `rc_pair`: `a` and its CQ are dropped below while `b` lives.
    let a = Qp::new_rc(&pd, &small, &small, caps).unwrap();
    let b = Qp::new_rc(&pd, &recv_cq, &recv_cq, caps).unwrap();
    connect_qps(&a, &b, &gid, RtsAttr::default());
    let mut posted = Vec::new();
    for _ in 0..overflow {
        posted.push(recv(&pd, &b, 8));
    }
    for _ in 0..overflow {
        match a.post_send(pd.reg_mr(vec![0u8; 8]).unwrap(), 0..8, None) {
            Ok(p) => posted.push(p),
            Err(e) => {
                eprintln!("post_send after the overrun: {e}");
                break;
            }
        }
    }
    let element = {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = ctx
                .get_async_event_timeout(left)
                .unwrap()
                .expect("a CQ_ERR event within 20 s");
            eprintln!("async event: {ev:?}");
            if ev.kind() == AsyncEventKind::CqErr {
                // The guard stays alive across the drop below: it no longer holds the ack.
                break (ev.element(), ev);
            }
        }
    };
    assert_eq!(element.0, AsyncElement::Cq(small.id()));
    drop(posted);
    within(Duration::from_secs(20), "destroying the QP", || drop(a));
    within(Duration::from_secs(20), "destroying the overrun CQ", || {
        drop(small);
    });
    element.1.ack();
}
