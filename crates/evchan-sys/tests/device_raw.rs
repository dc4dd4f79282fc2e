//! Device tests of librdmacm itself, called raw through this crate: C behaviour that a
//! guarantee of evchan-core's types guards against, shown with the C calls alone (raw FFI
//! belongs here, not in the safe layer's tests).
//!
//! Run in the soft-RoCE VM (`cargo xtask test`); skipped natively without a device, failed
//! without one when `EVCHAN_REQUIRE_DEVICE=1` (the skip rule of every device test; this crate
//! has its own copy of it, [`require_device!`], since it cannot use evchan-core's).

use std::net::Ipv4Addr;
use std::os::fd::BorrowedFd;
use std::ptr;
use std::time::Duration;

use evchan_sys as sys;
use sys::rdma_cm_event_type as kind;

/// The soft-RoCE VM's IPv4 address (on `dummy0`).
const VM_IPV4: Ipv4Addr = Ipv4Addr::new(169, 254, 77, 1);
/// How long any one event may take to arrive before a test fails (TCG is slow).
const EVENT_TIMEOUT: Duration = Duration::from_secs(20);
/// The timeout given to address and route resolution, in milliseconds.
const RESOLVE_TIMEOUT_MS: i32 = 5000;

/// Whether `EVCHAN_REQUIRE_DEVICE=1`: a missing device fails the test.
fn device_required() -> bool {
    std::env::var("EVCHAN_REQUIRE_DEVICE").is_ok_and(|v| v == "1")
}

/// `Err(reason)` when there is no usable device: no event channel can be made (librdmacm
/// reports `ENODEV` without one), or `rdma_get_devices` lists none.
fn probe() -> Result<(), String> {
    // SAFETY: no arguments; NULL on failure (checked).
    let ch = unsafe { sys::rdma_create_event_channel() };
    if ch.is_null() {
        return Err(format!(
            "no RDMA device: rdma_create_event_channel failed: {}",
            sys::last_error()
        ));
    }
    // SAFETY: the channel just made, with no id on it; destroyed once.
    unsafe { sys::rdma_destroy_event_channel(ch) };
    let mut n = 0;
    // SAFETY: valid out-pointer; NULL on failure (checked).
    let list = unsafe { sys::rdma_get_devices(&mut n) };
    if list.is_null() {
        return Err(format!("rdma_get_devices failed: {}", sys::last_error()));
    }
    // SAFETY: the list `rdma_get_devices` returned, freed once.
    unsafe { sys::rdma_free_devices(list) };
    if n < 1 {
        return Err("no RDMA device: rdma_get_devices lists none".to_owned());
    }
    Ok(())
}

/// The one skip rule: prints `skipping <test>: <reason>`, or fails the test with `reason` when
/// `EVCHAN_REQUIRE_DEVICE=1`. The caller returns from the test after it.
#[track_caller]
fn skip(reason: &str) {
    let current = std::thread::current();
    let test = current.name().unwrap_or("<unnamed test>");
    assert!(
        !device_required(),
        "{test}: EVCHAN_REQUIRE_DEVICE=1 but {reason}"
    );
    eprintln!("skipping {test}: {reason}");
}

/// Skips (returns from) the calling test without a device, or fails it when
/// `EVCHAN_REQUIRE_DEVICE=1`.
macro_rules! require_device {
    () => {
        if let Err(reason) = probe() {
            skip(&reason);
            return;
        }
    };
}

/// A port for one test: evchan-core's test scheme (`20000 + (pid % 1000) * 20 + n`), with
/// values of `n` that no evchan-core test binary uses (13–18).
fn port(n: u16) -> u16 {
    20000 + (std::process::id() % 1000) as u16 * 20 + n
}

/// `169.254.77.1:port` as a C socket address.
fn vm_addr(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(VM_IPV4).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// A new event channel (asserted).
fn new_channel() -> *mut sys::rdma_event_channel {
    // SAFETY: no arguments; NULL on failure (checked).
    let ch = unsafe { sys::rdma_create_event_channel() };
    assert!(
        !ch.is_null(),
        "rdma_create_event_channel: {}",
        sys::last_error()
    );
    ch
}

/// The next event on `ch` (whose descriptor is `fd`) within [`EVENT_TIMEOUT`], asserted to be
/// `expect` with status 0, then acked.
fn expect_event(ch: *mut sys::rdma_event_channel, fd: BorrowedFd<'_>, expect: u32) {
    assert!(
        sys::fd::poll_readable(fd, Some(EVENT_TIMEOUT)).unwrap(),
        "no event within {EVENT_TIMEOUT:?} while waiting for event {expect}"
    );
    let mut event = ptr::null_mut();
    // SAFETY: a live channel (the caller's), readable, so the read does not wait; valid
    // out-pointer.
    let rc = unsafe { sys::rdma_get_cm_event(ch, &mut event) };
    assert_eq!(rc, 0, "rdma_get_cm_event: {}", sys::last_error());
    // SAFETY: an event just read, valid until its ack below.
    let ev = unsafe { &*event };
    let (code, status) = (ev.event, ev.status);
    // SAFETY: read above, acked once; nothing of it is used after.
    assert_eq!(unsafe { sys::rdma_ack_cm_event(event) }, 0);
    assert_eq!((code, status), (expect, 0), "event {code}, status {status}");
}

/// A client id on `ch` (descriptor `fd`) that connects to `169.254.77.1:port`: its address
/// and route resolved, librdmacm's QP made (NULL PD: the library's; library-made CQs), and
/// `rdma_connect` called. The caller destroys its QP, then the id.
fn connecting(
    ch: *mut sys::rdma_event_channel,
    fd: BorrowedFd<'_>,
    port: u16,
) -> *mut sys::rdma_cm_id {
    let mut id = ptr::null_mut();
    // SAFETY: a live channel, a valid out-pointer; no context.
    let rc = unsafe {
        sys::rdma_create_id(
            ch,
            &mut id,
            ptr::null_mut(),
            sys::rdma_port_space::RDMA_PS_TCP,
        )
    };
    assert_eq!(rc, 0, "rdma_create_id: {}", sys::last_error());
    let mut dst = vm_addr(port);
    // SAFETY: a live id; `dst` is a valid IPv4 socket address that librdmacm only reads during
    // the call.
    let rc = unsafe {
        sys::rdma_resolve_addr(
            id,
            ptr::null_mut(),
            ptr::addr_of_mut!(dst).cast(),
            RESOLVE_TIMEOUT_MS,
        )
    };
    assert_eq!(rc, 0, "rdma_resolve_addr: {}", sys::last_error());
    expect_event(ch, fd, kind::RDMA_CM_EVENT_ADDR_RESOLVED);
    // SAFETY: a live id with its address resolved.
    let rc = unsafe { sys::rdma_resolve_route(id, RESOLVE_TIMEOUT_MS) };
    assert_eq!(rc, 0, "rdma_resolve_route: {}", sys::last_error());
    expect_event(ch, fd, kind::RDMA_CM_EVENT_ROUTE_RESOLVED);
    let mut attr = sys::ibv_qp_init_attr {
        qp_context: ptr::null_mut(),
        send_cq: ptr::null_mut(),
        recv_cq: ptr::null_mut(),
        srq: ptr::null_mut(),
        cap: sys::ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: sys::ibv_qp_type::IBV_QPT_RC,
        sq_sig_all: 0,
    };
    // SAFETY: a live id with its route resolved; `attr` is a valid init attr for the call;
    // NULL PD takes librdmacm's per-device PD.
    let rc = unsafe { sys::rdma_create_qp(id, ptr::null_mut(), &mut attr) };
    assert_eq!(rc, 0, "rdma_create_qp: {}", sys::last_error());
    let mut param = sys::rdma_conn_param {
        private_data: ptr::null(),
        private_data_len: 0,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    };
    // SAFETY: a live id with its route resolved and a QP; `param` is valid for the call.
    let rc = unsafe { sys::rdma_connect(id, &mut param) };
    assert_eq!(rc, 0, "rdma_connect: {}", sys::last_error());
    id
}

/// The C behaviour that the compile error on migrating a listening id guards against, with
/// librdmacm directly: a listener migrated while a `CONNECT_REQUEST` is queued on its channel.
/// The kernel moves the request to the new channel (it is readable there), but the new
/// connection's kernel context stays on the old channel's file; librdmacm's query of the new
/// id through the new channel fails (`EINVAL`), so `rdma_get_cm_event` drops the request and
/// reads on: nothing arrives on either channel, and the peer is not answered.
#[test]
fn c_migrate_of_a_listener_with_a_queued_request_loses_the_request() {
    require_device!();
    let cch = new_channel();
    let addr = port(13);
    let old = new_channel();
    let new = new_channel();
    // SAFETY: a live channel (until destroyed at the end).
    let raw_cch_fd = unsafe { (*cch).fd };
    // SAFETY: as above.
    let raw_old_fd = unsafe { (*old).fd };
    // SAFETY: as above.
    let raw_new_fd = unsafe { (*new).fd };
    // SAFETY: the fd is open until the channel is destroyed at the end, after its last use.
    let cch_fd = unsafe { BorrowedFd::borrow_raw(raw_cch_fd) };
    // SAFETY: as above.
    let old_fd = unsafe { BorrowedFd::borrow_raw(raw_old_fd) };
    // SAFETY: as above.
    let new_fd = unsafe { BorrowedFd::borrow_raw(raw_new_fd) };
    sys::fd::set_nonblocking(new_fd, true).unwrap();
    let mut id = ptr::null_mut();
    // SAFETY: live channel, valid out-pointer.
    let rc = unsafe {
        sys::rdma_create_id(
            old,
            &mut id,
            ptr::null_mut(),
            sys::rdma_port_space::RDMA_PS_TCP,
        )
    };
    assert_eq!(rc, 0);
    let mut sin = vm_addr(addr);
    // SAFETY: live id; `sin` is a valid IPv4 socket address for the call's duration.
    let rc = unsafe { sys::rdma_bind_addr(id, ptr::addr_of_mut!(sin).cast()) };
    assert_eq!(rc, 0);
    // SAFETY: live, bound id.
    assert_eq!(unsafe { sys::rdma_listen(id, 8) }, 0);

    let client = connecting(cch, cch_fd, addr);
    assert!(
        sys::fd::poll_readable(old_fd, Some(EVENT_TIMEOUT)).unwrap(),
        "the CONNECT_REQUEST is queued on the listener's channel"
    );
    // SAFETY: live id and channel; no event of the id has been read, so nothing to wait for.
    assert_eq!(unsafe { sys::rdma_migrate_id(id, new) }, 0);
    assert!(
        sys::fd::poll_readable(new_fd, Some(Duration::ZERO)).unwrap(),
        "the kernel moved the request to the new channel"
    );
    let mut event = ptr::null_mut();
    // SAFETY: live channel (non-blocking), valid out-pointer.
    let rc = unsafe { sys::rdma_get_cm_event(new, &mut event) };
    let err = std::io::Error::last_os_error();
    if rc == 0 {
        // SAFETY: an event just read from `new`, acked once.
        let code = unsafe { (*event).event };
        // SAFETY: as above.
        unsafe { sys::rdma_ack_cm_event(event) };
        panic!("an event arrived (code {code}): librdmacm or the kernel no longer loses it");
    }
    assert_eq!(err.raw_os_error(), Some(libc::EAGAIN), "{err}");
    assert!(!sys::fd::poll_readable(new_fd, Some(Duration::ZERO)).unwrap());
    assert!(!sys::fd::poll_readable(old_fd, Some(Duration::ZERO)).unwrap());
    // The peer hears nothing for a while (its CM retries until it gives up, much later).
    assert!(
        !sys::fd::poll_readable(cch_fd, Some(Duration::from_secs(2))).unwrap(),
        "the client got an event"
    );
    // SAFETY: the client's QP, made by `rdma_create_qp`, never posted to; destroyed once.
    unsafe { sys::rdma_destroy_qp(client) };
    // SAFETY: every event of the client was acked (in `connecting`); destroyed once.
    assert_eq!(unsafe { sys::rdma_destroy_id(client) }, 0);
    // SAFETY: live id with no event read and unacked; destroyed once.
    assert_eq!(unsafe { sys::rdma_destroy_id(id) }, 0);
    // SAFETY: no id left on the channel; destroyed once.
    unsafe { sys::rdma_destroy_event_channel(new) };
    // SAFETY: as above (the orphaned kernel context on its file goes with the file).
    unsafe { sys::rdma_destroy_event_channel(old) };
    // SAFETY: no id left on the channel (the client was destroyed above); destroyed once.
    unsafe { sys::rdma_destroy_event_channel(cch) };
}
