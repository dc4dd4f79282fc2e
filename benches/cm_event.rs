//! Latency of getting one rdma_cm event: `evchan-core` against raw librdmacm, in the same run.
//!
//! - `cm_event/resolve_addr`: one whole cycle per iteration: create an id, `rdma_resolve_addr`
//!   to 169.254.77.1 (the VM's address), read its `ADDR_RESOLVED`, check kind, status and id,
//!   ack, destroy the id.
//! - `cm_event/empty_read`: a non-blocking read of an empty channel (`try_get_event` → `None`,
//!   and `rdma_get_cm_event` on an `O_NONBLOCK` descriptor → `EAGAIN`): the wrapper's own cost.
//!
//! `evchan` is the safe layer, `raw` the same work in plain librdmacm calls through `evchan-sys`.
//! What differs, on purpose (it is what the safe layer costs): evchan's descriptor is always
//! `O_NONBLOCK` and `get_event` waits in `poll(2)`, so a read that comes before the event is one
//! `EAGAIN` read plus a `poll` more than the raw baseline's one blocking `rdma_get_cm_event`
//! (the plain C idiom); evchan also keeps its per-id bookkeeping (unacked events, deferred
//! destroy) and checks the event's id through its typestate transition.
//!
//! Without an RDMA device this prints a skip line and exits 0 (fails under
//! `EVCHAN_REQUIRE_DEVICE=1`); `cargo xtask bench` runs it in the soft-RoCE VM.
//!
//! # Unsafe code
//!
//! The raw-FFI baseline cannot be written without `unsafe`: this file (with `cq_event.rs`) is the
//! one allowed exception to "no `unsafe` outside evchan-sys and evchan-core's `ffi`". Every block
//! has its `// SAFETY:` comment, and the raw code serves only as the baseline.

use std::hint::black_box;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::ptr::{self, NonNull};
use std::time::Duration;

use criterion::Criterion;
use evchan_core::cm::PortSpace;
use evchan_core::{CmId, EventChannel};
use evchan_sys as sys;

mod support;

/// The VM's address on `dummy0` (rxe0), the destination of every resolution.
const DST: Ipv4Addr = Ipv4Addr::new(169, 254, 77, 1);
const PORT: u16 = 7471;
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

fn main() {
    if !support::device_present() {
        return;
    }
    let mut c = support::criterion();
    resolve_addr(&mut c);
    empty_read(&mut c);
    c.final_summary();
}

fn resolve_addr(c: &mut Criterion) {
    let mut group = c.benchmark_group("cm_event/resolve_addr");

    let channel = EventChannel::new().expect("rdma_create_event_channel");
    let dst = SocketAddr::from((DST, PORT));
    group.bench_function("evchan", |b| {
        b.iter(|| {
            let id = CmId::new(&channel, PortSpace::Tcp).expect("rdma_create_id");
            let id = id
                .resolve_addr(None, dst, RESOLVE_TIMEOUT)
                .expect("rdma_resolve_addr");
            let event = channel.get_event().expect("rdma_get_cm_event");
            let id = id.addr_resolved(&event).expect("ADDR_RESOLVED");
            event.ack();
            drop(black_box(id));
        });
    });

    let raw = RawChannel::new();
    let mut sin = sockaddr_in(DST, PORT);
    let timeout_ms = i32::try_from(RESOLVE_TIMEOUT.as_millis()).expect("a small timeout");
    group.bench_function("raw", |b| {
        b.iter(|| raw.resolve_cycle(&mut sin, timeout_ms));
    });
    group.finish();
}

fn empty_read(c: &mut Criterion) {
    let mut group = c.benchmark_group("cm_event/empty_read");

    let channel = EventChannel::new().expect("rdma_create_event_channel");
    group.bench_function("evchan", |b| {
        b.iter(|| {
            let ev = channel.try_get_event().expect("rdma_get_cm_event");
            assert!(black_box(ev).is_none(), "an event on an idle channel");
        });
    });

    let raw = RawChannel::new();
    raw.set_nonblocking();
    group.bench_function("raw", |b| {
        b.iter(|| raw.empty_read());
    });
    group.finish();
}

/// `struct sockaddr_in` of `ip:port`.
fn sockaddr_in(ip: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    }
}

/// The baseline: a channel of plain librdmacm, destroyed on drop.
struct RawChannel(NonNull<sys::rdma_event_channel>);

impl RawChannel {
    fn new() -> Self {
        // SAFETY: no arguments; a NULL result is checked below.
        let ch = unsafe { sys::rdma_create_event_channel() };
        RawChannel(NonNull::new(ch).expect("rdma_create_event_channel"))
    }

    fn set_nonblocking(&self) {
        // SAFETY: the channel is live (self), so its `fd` field is readable.
        let fd = unsafe { self.0.as_ref() }.fd;
        // SAFETY: the descriptor stays open until rdma_destroy_event_channel in Drop, after this
        // borrow ends.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        sys::fd::set_nonblocking(fd, true).expect("fcntl(O_NONBLOCK)");
    }

    /// create id → resolve addr → get event (blocking) → check → ack → destroy id.
    fn resolve_cycle(&self, dst: &mut libc::sockaddr_in, timeout_ms: i32) {
        let ch = self.0.as_ptr();
        let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
        // SAFETY: live channel; `id` is a valid out-pointer; no context pointer.
        let ret = unsafe {
            sys::rdma_create_id(
                ch,
                &mut id,
                ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        assert_eq!(ret, 0, "rdma_create_id: {}", io::Error::last_os_error());
        let dst: *mut libc::sockaddr_in = dst;
        // SAFETY: `id` was just created; `dst` is a valid sockaddr_in that librdmacm only reads.
        let ret = unsafe { sys::rdma_resolve_addr(id, ptr::null_mut(), dst.cast(), timeout_ms) };
        assert_eq!(ret, 0, "rdma_resolve_addr: {}", io::Error::last_os_error());
        let mut event: *mut sys::rdma_cm_event = ptr::null_mut();
        // SAFETY: live channel (blocking descriptor); `event` is a valid out-pointer.
        let ret = unsafe { sys::rdma_get_cm_event(ch, &mut event) };
        assert_eq!(ret, 0, "rdma_get_cm_event: {}", io::Error::last_os_error());
        // SAFETY: a successful rdma_get_cm_event hands out an event that stays valid until it is
        // acked, which happens after this borrow's last use.
        let ev = unsafe { &*event };
        // The same checks as evchan's `addr_resolved`: kind, status, and that it is this id's.
        assert!(
            ev.event == sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED
                && ev.status == 0
                && ev.id == id,
            "unexpected event {} (status {})",
            ev.event,
            ev.status
        );
        // SAFETY: the event was read above and is acked exactly once.
        let ret = unsafe { sys::rdma_ack_cm_event(event) };
        assert_eq!(ret, 0, "rdma_ack_cm_event");
        // SAFETY: the id's only event is acked, so rdma_destroy_id does not wait; destroyed once.
        let ret = unsafe { sys::rdma_destroy_id(black_box(id)) };
        assert_eq!(ret, 0, "rdma_destroy_id");
    }

    /// rdma_get_cm_event on the empty non-blocking channel: EAGAIN.
    fn empty_read(&self) {
        let mut event: *mut sys::rdma_cm_event = ptr::null_mut();
        // SAFETY: live channel; `event` is a valid out-pointer.
        let ret = unsafe { sys::rdma_get_cm_event(self.0.as_ptr(), &mut event) };
        let err = io::Error::last_os_error();
        assert!(
            ret == -1 && err.kind() == io::ErrorKind::WouldBlock,
            "an idle non-blocking channel read {ret} ({err})"
        );
        black_box(event);
    }
}

impl Drop for RawChannel {
    fn drop(&mut self) {
        // SAFETY: every id created on the channel was destroyed and every event acked in the
        // cycle that made it; destroyed once.
        unsafe { sys::rdma_destroy_event_channel(self.0.as_ptr()) };
    }
}
