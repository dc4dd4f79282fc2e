//! Latency of getting one rdma_cm event: `evchan-core` against raw librdmacm, in the same run.
//!
//! - `cm_event/resolve_addr`: one whole cycle per iteration: create an id, `rdma_resolve_addr`
//!   to 169.254.77.1 (the VM's address), read its `ADDR_RESOLVED`, check kind, status and id,
//!   ack, destroy the id.
//!   `async` is the same cycle with the wait done by tokio (a current_thread runtime, the
//!   channel registered through `evchan_core::Readable`): read, and on `None` await readiness,
//!   clear it and read again; its baseline is the same `raw`.
//! - `cm_event/queued_ack`: reading and acking an event that is already queued, per event:
//!   [`QUEUED`] ids resolve their addresses (untimed), then the channel is drained, each event
//!   read, its kind checked and acked (timed); the ids are destroyed after (untimed). A read
//!   that finds its event not queued yet stops the clock while it waits. `async` drains the
//!   same queue the way a tokio user reads the channel (the read of `resolve_addr`'s `async`,
//!   below, which awaits readiness only when a read finds nothing), each block of reads in one
//!   `block_on` of a current_thread runtime, started after every event is queued.
//! - `cm_event/empty_read`: a non-blocking read of an empty channel (`try_get_event` → `None`,
//!   and `rdma_get_cm_event` on an `O_NONBLOCK` descriptor → `EAGAIN`): the wrapper's own cost.
//!
//! With `EVCHAN_BENCH_OPS=FIGURE/VARIANT:N` (e.g. `resolve_addr/raw:200`) the program runs no
//! criterion: it makes the figure's setup, then the operation `N` times inside
//! `evchan_measured`, for `valgrind --tool=callgrind --toggle-collect='*evchan_measured*'`
//! (`cargo xtask bench` does that: instructions per operation).
//!
//! With `EVCHAN_BENCH_PAIRED=FIGURE/VARIANT:BLOCK:PAIRS` (e.g. `queued_ack/evchan:100:20`) it
//! runs no criterion either: it times PAIRS pairs of blocks of BLOCK operations, the variant's
//! and `raw`'s right after each other, and prints the median and quartiles of the pairs' ratios
//! (`support::paired`; `cargo xtask bench` runs it: the paired ratio).
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
//! The raw-FFI baseline cannot be written without `unsafe`: this file, `cq_event.rs` and
//! `examples/tools_cm.rs` (the raw rows against cmtime) are the allowed exceptions to "no
//! `unsafe` outside evchan-sys and evchan-core's `ffi`". Every block
//! has its `// SAFETY:` comment, and the raw code serves only as the baseline.

use std::hint::black_box;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::ptr::{self, NonNull};
use std::time::{Duration, Instant};

use criterion::Criterion;
use evchan_core::cm::{EventKind, PortSpace};
use evchan_core::{CmEvent as Event, CmId, EventChannel, Readable};
use evchan_sys as sys;

mod support;

/// The VM's address on `dummy0` (rxe0), the destination of every resolution.
const DST: Ipv4Addr = Ipv4Addr::new(169, 254, 77, 1);
const PORT: u16 = 7471;
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Events queued before each drain of `cm_event/queued_ack`.
const QUEUED: usize = 32;

fn main() {
    if !support::device_present() {
        return;
    }
    if let Some((figure, variant, n)) = support::ops_mode() {
        ops(&figure, &variant, n);
        return;
    }
    if let Some((figure, variant, block, pairs)) = support::paired_mode() {
        paired(&figure, &variant, block, pairs);
        return;
    }
    let mut c = support::criterion();
    resolve_addr(&mut c);
    queued_ack(&mut c);
    empty_read(&mut c);
    c.final_summary();
}

/// The callgrind mode (module docs): `n` operations of `figure/variant` inside
/// [`support::evchan_measured`].
fn ops(figure: &str, variant: &str, n: u64) {
    let dst = SocketAddr::from((DST, PORT));
    let channel = EventChannel::new().expect("rdma_create_event_channel");
    let raw = RawChannel::new();
    let mut sin = sockaddr_in(DST, PORT);
    let timeout_ms = i32::try_from(RESOLVE_TIMEOUT.as_millis()).expect("a small timeout");
    match (figure, variant) {
        ("resolve_addr", "evchan") => {
            support::evchan_measured(n, || resolve_cycle(&channel, dst));
        }
        ("resolve_addr", "async") => {
            let rt = support::runtime();
            let readable = rt.block_on(async { channel.readable() }).expect("AsyncFd");
            // The runtime's own work between polls is counted too: one block_on, measured.
            support::evchan_measured(1, || {
                rt.block_on(async {
                    for _ in 0..n {
                        resolve_cycle_async(&channel, &readable, dst).await;
                    }
                });
            });
        }
        ("resolve_addr", "raw") => {
            support::evchan_measured(n, || raw.resolve_cycle(&mut sin, timeout_ms));
        }
        ("queued_ack", "evchan") => {
            let n = usize::try_from(n).expect("a count that fits usize");
            let ids = queue_evchan(&channel, dst, n);
            support::wait_queued();
            support::evchan_measured(n as u64, || drain_one_evchan(&channel));
            drop(ids);
        }
        ("queued_ack", "async") => {
            let n = usize::try_from(n).expect("a count that fits usize");
            let rt = support::runtime();
            let readable = rt.block_on(async { channel.readable() }).expect("AsyncFd");
            let ids = queue_evchan(&channel, dst, n);
            support::wait_queued();
            // As for `resolve_addr`: one block_on, the runtime's own work counted too.
            support::evchan_measured(1, || drain_async(&rt, &channel, &readable, n));
            drop(ids);
        }
        ("queued_ack", "raw") => {
            raw.set_nonblocking();
            let ids = raw.queue(&mut sin, timeout_ms, usize::try_from(n).expect("usize"));
            support::wait_queued();
            support::evchan_measured(n, || raw.drain_one());
            raw.destroy_ids(ids);
        }
        ("empty_read", "evchan") => {
            support::evchan_measured(n, || empty_read_evchan(&channel));
        }
        ("empty_read", "raw") => {
            raw.set_nonblocking();
            support::evchan_measured(n, || raw.empty_read());
        }
        _ => panic!("no operation {figure}/{variant} in cm_event"),
    }
}

/// The paired mode (module docs): `pairs` pairs of blocks of `block` operations, `variant`
/// against `raw` in turns, each block timed as criterion times one iteration of the figure.
fn paired(figure: &str, variant: &str, block: u64, pairs: usize) {
    let dst = SocketAddr::from((DST, PORT));
    let channel = EventChannel::new().expect("rdma_create_event_channel");
    let raw = RawChannel::new();
    let mut sin = sockaddr_in(DST, PORT);
    let timeout_ms = i32::try_from(RESOLVE_TIMEOUT.as_millis()).expect("a small timeout");
    let rt = support::runtime();
    let readable = rt.block_on(async { channel.readable() }).expect("AsyncFd");
    let n = usize::try_from(block).expect("a block that fits usize");
    support::paired(figure, variant, block, pairs, |v, _| match (figure, v) {
        ("resolve_addr", "evchan") => support::timed_block(block, || resolve_cycle(&channel, dst)),
        ("resolve_addr", "async") => support::timed(|| {
            rt.block_on(async {
                for _ in 0..n {
                    resolve_cycle_async(&channel, &readable, dst).await;
                }
            });
        }),
        ("resolve_addr", "raw") => {
            support::timed_block(block, || raw.resolve_cycle(&mut sin, timeout_ms))
        }
        ("queued_ack", "evchan") => {
            let ids = queue_evchan(&channel, dst, n);
            support::wait_queued();
            let took = support::timed_block(block, || drain_one_evchan(&channel));
            drop(ids);
            took
        }
        ("queued_ack", "async") => {
            let ids = queue_evchan(&channel, dst, n);
            support::wait_queued();
            let took = support::timed(|| drain_async(&rt, &channel, &readable, n));
            drop(ids);
            took
        }
        ("queued_ack", "raw") => {
            raw.set_nonblocking();
            let ids = raw.queue(&mut sin, timeout_ms, n);
            support::wait_queued();
            let took = support::timed_block(block, || raw.drain_one());
            raw.destroy_ids(ids);
            took
        }
        ("empty_read", "evchan") => support::timed_block(block, || empty_read_evchan(&channel)),
        ("empty_read", "raw") => {
            raw.set_nonblocking();
            support::timed_block(block, || raw.empty_read())
        }
        _ => panic!("no operation {figure}/{v} in cm_event"),
    });
}

/// One cycle of `cm_event/resolve_addr/evchan`.
fn resolve_cycle(channel: &EventChannel, dst: SocketAddr) {
    let id = CmId::new(channel, PortSpace::Tcp).expect("rdma_create_id");
    let id = id
        .resolve_addr(None, dst, RESOLVE_TIMEOUT)
        .expect("rdma_resolve_addr");
    let event = channel.get_event().expect("rdma_get_cm_event");
    let id = id.addr_resolved(&event).expect("ADDR_RESOLVED");
    event.ack();
    drop(black_box(id));
}

/// One cycle of `cm_event/resolve_addr/async`: the wait is tokio's.
async fn resolve_cycle_async(channel: &EventChannel, readable: &Readable<'_>, dst: SocketAddr) {
    let id = CmId::new(channel, PortSpace::Tcp).expect("rdma_create_id");
    let id = id
        .resolve_addr(None, dst, RESOLVE_TIMEOUT)
        .expect("rdma_resolve_addr");
    let event = next_event_async(channel, readable).await;
    let id = id.addr_resolved(&event).expect("ADDR_RESOLVED");
    event.ack();
    drop(black_box(id));
}

/// The next event, read as a tokio user reads the channel: a read, and on `None` await
/// readiness, clear it and read again.
async fn next_event_async<'c>(channel: &'c EventChannel, readable: &Readable<'_>) -> Event<'c> {
    loop {
        if let Some(event) = channel.try_get_event().expect("rdma_get_cm_event") {
            return event;
        }
        let mut guard = readable.ready().await.expect("readiness");
        match channel.try_get_event().expect("rdma_get_cm_event") {
            Some(event) => return event,
            None => guard.clear_ready(),
        }
    }
}

/// `n` reads of `cm_event/queued_ack/async` (their events queued), in one `block_on`.
fn drain_async(
    rt: &tokio::runtime::Runtime,
    channel: &EventChannel,
    readable: &Readable<'_>,
    n: usize,
) {
    rt.block_on(async {
        for _ in 0..n {
            check_and_ack(next_event_async(channel, readable).await);
        }
    });
}

/// One read of `cm_event/empty_read/evchan`.
fn empty_read_evchan(channel: &EventChannel) {
    let ev = channel.try_get_event().expect("rdma_get_cm_event");
    assert!(black_box(ev).is_none(), "an event on an idle channel");
}

/// `n` ids, each resolving its address: `n` `ADDR_RESOLVED` events on their way.
fn queue_evchan(channel: &EventChannel, dst: SocketAddr, n: usize) -> Vec<impl Sized + '_> {
    (0..n)
        .map(|_| {
            CmId::new(channel, PortSpace::Tcp)
                .expect("rdma_create_id")
                .resolve_addr(None, dst, RESOLVE_TIMEOUT)
                .expect("rdma_resolve_addr")
        })
        .collect()
}

/// Reads one queued event, checks it and acks it; `false` when none was queued yet (nothing
/// read).
fn try_drain_one_evchan(channel: &EventChannel) -> bool {
    match channel.try_get_event().expect("rdma_get_cm_event") {
        Some(event) => {
            check_and_ack(event);
            true
        }
        None => false,
    }
}

/// A queued event's check (`ADDR_RESOLVED`, status 0) and ack.
fn check_and_ack(event: Event<'_>) {
    assert!(
        event.kind() == EventKind::AddrResolved && event.raw_status() == 0,
        "unexpected {event:?}"
    );
    event.ack();
}

/// The events of `ids` (one each), waited for and acked.
fn drain_evchan<T>(channel: &EventChannel, ids: &[T]) {
    for _ in ids {
        drain_one_evchan(channel);
    }
}

/// [`try_drain_one_evchan`], waiting (in `poll`) for the event when it is not queued yet.
fn drain_one_evchan(channel: &EventChannel) {
    while !try_drain_one_evchan(channel) {
        support::wait_readable(channel.as_fd());
    }
}

fn resolve_addr(c: &mut Criterion) {
    let mut group = c.benchmark_group("cm_event/resolve_addr");

    let channel = EventChannel::new().expect("rdma_create_event_channel");
    let dst = SocketAddr::from((DST, PORT));
    group.bench_function("evchan", |b| {
        b.iter(|| resolve_cycle(&channel, dst));
    });

    let rt = support::runtime();
    let readable = rt.block_on(async { channel.readable() }).expect("AsyncFd");
    group.bench_function("async", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    resolve_cycle_async(&channel, &readable, dst).await;
                }
                start.elapsed()
            })
        });
    });
    drop(readable);

    let raw = RawChannel::new();
    let mut sin = sockaddr_in(DST, PORT);
    let timeout_ms = i32::try_from(RESOLVE_TIMEOUT.as_millis()).expect("a small timeout");
    group.bench_function("raw", |b| {
        b.iter(|| raw.resolve_cycle(&mut sin, timeout_ms));
    });
    group.finish();
}

fn queued_ack(c: &mut Criterion) {
    let mut group = c.benchmark_group("cm_event/queued_ack");
    support::slow_setup(&mut group);
    let dst = SocketAddr::from((DST, PORT));
    let channel = EventChannel::new().expect("rdma_create_event_channel");
    group.bench_function("evchan", |b| {
        b.iter_custom(|iters| {
            in_blocks(iters, |n| {
                let ids = queue_evchan(&channel, dst, n);
                let took = timed_drain(
                    n,
                    || try_drain_one_evchan(&channel),
                    || support::wait_readable(channel.as_fd()),
                );
                drop(ids);
                took
            })
        });
    });

    // The async read awaits only when a read finds nothing, so its blocks are timed whole
    // (runtime included) once every event is known to be queued: a witness id on a channel of
    // its own resolves after the block's ids, and ib_addr's ordered workqueue (`addr_wq`)
    // queues a local resolution's event at once, in the order asked, so the witness's event
    // comes after theirs.
    let rt = support::runtime();
    let readable = rt.block_on(async { channel.readable() }).expect("AsyncFd");
    let witness = EventChannel::new().expect("rdma_create_event_channel");
    group.bench_function("async", |b| {
        b.iter_custom(|iters| {
            in_blocks(iters, |n| {
                let ids = queue_evchan(&channel, dst, n);
                drain_evchan(&witness, &queue_evchan(&witness, dst, 1));
                let took = support::timed(|| drain_async(&rt, &channel, &readable, n));
                drop(ids);
                took
            })
        });
    });
    drop(readable);

    let raw = RawChannel::new();
    raw.set_nonblocking();
    let mut sin = sockaddr_in(DST, PORT);
    let timeout_ms = i32::try_from(RESOLVE_TIMEOUT.as_millis()).expect("a small timeout");
    group.bench_function("raw", |b| {
        b.iter_custom(|iters| {
            in_blocks(iters, |n| {
                let ids = raw.queue(&mut sin, timeout_ms, n);
                let took = timed_drain(
                    n,
                    || raw.try_drain_one(),
                    || support::wait_readable(raw.fd()),
                );
                raw.destroy_ids(ids);
                took
            })
        });
    });
    group.finish();
}

/// `iters` operations of `cm_event/queued_ack` in blocks of at most [`QUEUED`]: `block(n)`
/// queues `n` events, reads them and returns the time its reads took.
fn in_blocks(iters: u64, mut block: impl FnMut(usize) -> Duration) -> Duration {
    let mut took = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = QUEUED.min(usize::try_from(left).unwrap_or(QUEUED));
        took += block(n);
        left -= n as u64;
    }
    took
}

/// The time `try_one` takes to read `n` events; a read that finds none stops the clock while
/// `wait` waits for the next.
fn timed_drain(n: usize, mut try_one: impl FnMut() -> bool, mut wait: impl FnMut()) -> Duration {
    let mut took = Duration::ZERO;
    let mut done = 0;
    while done < n {
        let start = Instant::now();
        while done < n && try_one() {
            done += 1;
        }
        took += start.elapsed();
        if done < n {
            // Not queued yet: wait with the clock stopped.
            wait();
        }
    }
    took
}

fn empty_read(c: &mut Criterion) {
    let mut group = c.benchmark_group("cm_event/empty_read");

    let channel = EventChannel::new().expect("rdma_create_event_channel");
    group.bench_function("evchan", |b| {
        b.iter(|| empty_read_evchan(&channel));
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

    fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel is live (self), so its `fd` field is readable.
        let fd = unsafe { self.0.as_ref() }.fd;
        // SAFETY: the descriptor stays open until rdma_destroy_event_channel in Drop, after the
        // borrow of self ends.
        unsafe { BorrowedFd::borrow_raw(fd) }
    }

    fn set_nonblocking(&self) {
        sys::fd::set_nonblocking(self.fd(), true).expect("fcntl(O_NONBLOCK)");
    }

    /// `n` ids, each resolving its address (`n` `ADDR_RESOLVED` events on their way).
    fn queue(
        &self,
        dst: &mut libc::sockaddr_in,
        timeout_ms: i32,
        n: usize,
    ) -> Vec<*mut sys::rdma_cm_id> {
        let dst: *mut libc::sockaddr_in = dst;
        (0..n)
            .map(|_| {
                let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
                // SAFETY: live channel; `id` is a valid out-pointer; no context pointer.
                let ret = unsafe {
                    sys::rdma_create_id(
                        self.0.as_ptr(),
                        &mut id,
                        ptr::null_mut(),
                        sys::rdma_port_space::RDMA_PS_TCP,
                    )
                };
                assert_eq!(ret, 0, "rdma_create_id: {}", io::Error::last_os_error());
                // SAFETY: `id` was just created; `dst` is a valid sockaddr_in, only read.
                let ret =
                    unsafe { sys::rdma_resolve_addr(id, ptr::null_mut(), dst.cast(), timeout_ms) };
                assert_eq!(ret, 0, "rdma_resolve_addr: {}", io::Error::last_os_error());
                id
            })
            .collect()
    }

    /// Reads one queued event (non-blocking channel), checks and acks it; `false` on `EAGAIN`.
    fn try_drain_one(&self) -> bool {
        let mut event: *mut sys::rdma_cm_event = ptr::null_mut();
        // SAFETY: live channel; `event` is a valid out-pointer.
        let ret = unsafe { sys::rdma_get_cm_event(self.0.as_ptr(), &mut event) };
        if ret != 0 {
            let err = io::Error::last_os_error();
            assert_eq!(
                err.kind(),
                io::ErrorKind::WouldBlock,
                "rdma_get_cm_event: {err}"
            );
            return false;
        }
        // SAFETY: a successful rdma_get_cm_event hands out an event valid until its ack.
        let ev = unsafe { &*event };
        assert!(
            ev.event == sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED && ev.status == 0,
            "unexpected event {} (status {})",
            ev.event,
            ev.status
        );
        // SAFETY: the event was read above and is acked exactly once.
        let ret = unsafe { sys::rdma_ack_cm_event(event) };
        assert_eq!(ret, 0, "rdma_ack_cm_event");
        true
    }

    /// [`Self::try_drain_one`], waiting (in `poll`) for the event when it is not queued yet.
    fn drain_one(&self) {
        while !self.try_drain_one() {
            support::wait_readable(self.fd());
        }
    }

    /// Destroys ids made by [`Self::queue`] whose events were all acked.
    fn destroy_ids(&self, ids: Vec<*mut sys::rdma_cm_id>) {
        for id in ids {
            // SAFETY: an id of `queue`, its one event acked; destroyed once.
            let ret = unsafe { sys::rdma_destroy_id(id) };
            assert_eq!(ret, 0, "rdma_destroy_id");
        }
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
