//! Device test of async events: a port state change, made by bringing the VM's `dummy0` (the
//! netdev under rxe0) down and up again. Run it in the soft-RoCE VM only: it changes the link.

mod verbs_support;

use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use evchan_core::verbs::{AsyncElement, AsyncEventKind, Context, PortState};

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
    let ctx = require_device!("port_state_change_is_an_async_event");
    if ctx.name() != "rxe0"
        || Command::new("ip")
            .args(["link", "show", "dummy0"])
            .output()
            .map_or(true, |o| !o.status.success())
    {
        assert!(
            !verbs_support::device_required(),
            "needs the VM's rxe0 on dummy0"
        );
        eprintln!("skipping port_state_change_is_an_async_event: needs the VM's rxe0 on dummy0");
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
