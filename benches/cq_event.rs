//! Latency of an event-driven completion: `evchan-core` against raw libibverbs, in the same run.
//!
//! Two RC QPs of one device, connected to each other over soft-RoCE's loopback (`a` sends, `b`
//! receives), once through the safe layer (`evchan`) and once in raw `ibv_*` calls (`raw`).
//!
//! - `cq_event/send_completion`: from a posted send to its completion, waiting on the event:
//!   arm `a`'s CQ → post one 64-byte SEND → wait for and read the CQ event → ack it (batched,
//!   [`ACK_BATCH`] at a time, in both) → poll the completion and check it. Only that is timed;
//!   the receive on `b` is posted before and reaped after each timed part, untimed, the same
//!   way in both.
//!   `async` is the same round with the wait done by tokio (a current_thread runtime, the
//!   channel registered through `evchan_core::Readable`): read, and on `None` await
//!   readiness, clear it and read again; its baseline is the same `raw`.
//! - `cq_event/poll_empty`: one `ibv_poll_cq` of an empty CQ (`Cq::poll_one` → `None`): the
//!   wrapper's own cost.
//!
//! With `EVCHAN_BENCH_OPS=FIGURE/VARIANT:N` (e.g. `poll_empty/raw:10000`) the program runs no
//! criterion: it makes the setup, then the operation `N` times inside `evchan_measured`, for
//! `valgrind --tool=callgrind --toggle-collect='*evchan_measured*'` (`cargo xtask bench` does
//! that: instructions per operation; the untimed receive of each round is counted too, the
//! same in both).
//!
//! With `EVCHAN_BENCH_PAIRED=FIGURE/VARIANT:BLOCK:PAIRS` (e.g. `poll_empty/evchan:20000:30`) it
//! runs no criterion either: it times PAIRS pairs of blocks of BLOCK operations, the variant's
//! and `raw`'s right after each other, and prints the median and quartiles of the pairs' ratios
//! (`support::paired`; `cargo xtask bench` runs it: the paired ratio).
//!
//! The baseline is the plain C idiom: a blocking channel, and `ibv_get_cq_event` waits in its
//! `read`. What differs, on purpose (it is what the safe layer costs): evchan's channel is always
//! `O_NONBLOCK`; its `get_cq_event` reads first and waits in `poll(2)` only on `EAGAIN`. On
//! soft-RoCE's loopback the event is already there when `ibv_post_send` returns (rxe runs the
//! send inside the post's doorbell call; seen in 1000 of 1000 rounds in the VM), so both make
//! the same one read; where an event comes later, evchan makes an `EAGAIN` read and a `poll`
//! more. evchan's post also takes the region by value and gives it back for the completion
//! (`Posted::complete` checks the completion's wr_id), its poll copies the completion into its
//! own type, and the event is routed to its CQ by token.
//!
//! Without an RDMA device this prints a skip line and exits 0 (fails under
//! `EVCHAN_REQUIRE_DEVICE=1`); `cargo xtask bench` runs it in the soft-RoCE VM.
//!
//! # Unsafe code
//!
//! The raw-FFI baseline cannot be written without `unsafe`: this file, `cm_event.rs` and
//! `examples/tools_cm.rs` (the raw rows against cmtime) are the allowed exceptions to "no
//! `unsafe` outside evchan-sys and evchan-core's `ffi`". Every block
//! has its `// SAFETY:` comment, and the raw code serves only as the baseline.

use std::ffi::CStr;
use std::hint::black_box;
use std::mem::MaybeUninit;
use std::net::Ipv4Addr;
use std::ptr::{self, NonNull};
use std::time::{Duration, Instant};

use evchan_core::verbs::{
    CompChannel, Context, Cq, DeviceList, Gid, GidType, Mr, Pd, Qp, QpCaps, RtrAttr, RtsAttr,
    ACK_BATCH,
};
use evchan_core::Readable;
use evchan_sys as sys;
use libc::{c_int, c_void};

mod support;

/// Bytes per SEND.
const LEN: usize = 64;
const CQ_ENTRIES: u32 = 64;
/// The port every QP uses.
const PORT: u8 = 1;
/// The VM's address on `dummy0`; its RoCE v2 GID is the loopback route.
const VM_IPV4: Ipv4Addr = Ipv4Addr::new(169, 254, 77, 1);
/// How long an untimed receive may take before the benchmark gives up (TCG is slow).
const RECV_TIMEOUT: Duration = Duration::from_secs(20);

fn main() {
    if !support::device_present() {
        return;
    }
    let mut c = support::criterion();
    let ctx = open_device();
    let gid = loopback_gid(&ctx);
    let name = ctx.name();

    let pd = Pd::new(&ctx).expect("ibv_alloc_pd");
    let channel = CompChannel::new(&ctx).expect("ibv_create_comp_channel");
    let cq_a = Cq::new(&channel, CQ_ENTRIES).expect("ibv_create_cq");
    let cq_b = Cq::new(&channel, CQ_ENTRIES).expect("ibv_create_cq");
    let safe = Safe::new(&gid, &pd, &channel, &cq_a, &cq_b);

    let mut raw = Raw::new(&name, &gid);

    if let Some((figure, variant, n)) = support::ops_mode() {
        ops(&figure, &variant, n, &safe, &mut raw);
        return;
    }
    if let Some((figure, variant, block, pairs)) = support::paired_mode() {
        paired(&figure, &variant, block, pairs, &safe, &mut raw);
        return;
    }

    let mut group = c.benchmark_group("cq_event/send_completion");
    let mut send = safe.buffers();
    group.bench_function("evchan", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| safe.round(&mut send)).sum());
    });
    let rt = support::runtime();
    let readable = rt
        .block_on(async { safe.channel.readable() })
        .expect("AsyncFd");
    group.bench_function("async", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    took += safe.round_async(&readable, &mut send).await;
                }
                took
            })
        });
    });
    drop(readable);
    group.bench_function("raw", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| raw.round()).sum());
    });
    group.finish();

    let mut group = c.benchmark_group("cq_event/poll_empty");
    group.bench_function("evchan", |b| b.iter(|| safe.poll_empty()));
    group.bench_function("raw", |b| b.iter(|| raw.poll_empty()));
    group.finish();

    drop(raw);
    drop(send);
    drop(safe);
    c.final_summary();
}

/// The callgrind mode (module docs): `n` operations of `figure/variant` inside
/// [`support::evchan_measured`].
fn ops(figure: &str, variant: &str, n: u64, safe: &Safe<'_>, raw: &mut Raw) {
    let mut send = safe.buffers();
    match (figure, variant) {
        ("send_completion", "evchan") => support::evchan_measured(n, || {
            safe.round(&mut send);
        }),
        ("send_completion", "async") => {
            let rt = support::runtime();
            let readable = rt
                .block_on(async { safe.channel.readable() })
                .expect("AsyncFd");
            // The runtime's own work between polls is counted too: one block_on, measured.
            support::evchan_measured(1, || {
                rt.block_on(async {
                    for _ in 0..n {
                        safe.round_async(&readable, &mut send).await;
                    }
                });
            });
        }
        ("send_completion", "raw") => support::evchan_measured(n, || {
            raw.round();
        }),
        ("poll_empty", "evchan") => support::evchan_measured(n, || safe.poll_empty()),
        ("poll_empty", "raw") => support::evchan_measured(n, || raw.poll_empty()),
        _ => panic!("no operation {figure}/{variant} in cq_event"),
    }
}

/// The paired mode (module docs): `pairs` pairs of blocks of `block` operations, `variant`
/// against `raw` in turns, each block timed as criterion times one iteration of the figure.
fn paired(figure: &str, variant: &str, block: u64, pairs: usize, safe: &Safe<'_>, raw: &mut Raw) {
    let mut send = safe.buffers();
    let rt = support::runtime();
    let readable = rt
        .block_on(async { safe.channel.readable() })
        .expect("AsyncFd");
    support::paired(figure, variant, block, pairs, |v, n| match (figure, v) {
        ("send_completion", "evchan") => (0..n).map(|_| safe.round(&mut send)).sum(),
        ("send_completion", "async") => rt.block_on(async {
            let mut took = Duration::ZERO;
            for _ in 0..n {
                took += safe.round_async(&readable, &mut send).await;
            }
            took
        }),
        ("send_completion", "raw") => (0..n).map(|_| raw.round()).sum(),
        ("poll_empty", "evchan") => support::timed_block(n, || safe.poll_empty()),
        ("poll_empty", "raw") => support::timed_block(n, || raw.poll_empty()),
        _ => panic!("no operation {figure}/{v} in cq_event"),
    });
}

/// Opens `rxe0` (the VM's device), or else the first device.
fn open_device() -> Context {
    let list = DeviceList::new().expect("ibv_get_device_list");
    let dev = list
        .find("rxe0")
        .or_else(|| list.iter().next())
        .expect("an RDMA device, as the probe found");
    dev.open().expect("ibv_open_device")
}

/// The RoCE v2 GID of 169.254.77.1 on port 1, or else any RoCE v2 GID, or else the last GID.
fn loopback_gid(ctx: &Context) -> Gid {
    let gids = ctx.gids(PORT).expect("ibv_query_gid_ex on port 1");
    let v2 = |g: &&Gid| g.gid_type == GidType::RoceV2;
    gids.iter()
        .filter(v2)
        .find(|g| g.ipv4() == Some(VM_IPV4))
        .or_else(|| gids.iter().find(v2))
        .or(gids.last())
        .copied()
        .expect("port 1 has a GID")
}

// ---------------------------------------------------------------------------------------------
// The safe layer
// ---------------------------------------------------------------------------------------------

/// Two connected RC QPs through evchan-core: `a` completes on `cq_a` (armed, on `channel`), `b`
/// on `cq_b` (polled only).
struct Safe<'r> {
    pd: &'r Pd<'r>,
    channel: &'r CompChannel<'r>,
    cq_a: &'r Cq<'r>,
    cq_b: &'r Cq<'r>,
    a: Qp<'r>,
    b: Qp<'r>,
}

/// The two registered buffers, between rounds (each round lends them to the device).
type Buffers<'pd> = (Option<Mr<'pd, Vec<u8>>>, Option<Mr<'pd, Vec<u8>>>);

impl<'r> Safe<'r> {
    fn new(
        gid: &Gid,
        pd: &'r Pd<'r>,
        channel: &'r CompChannel<'r>,
        cq_a: &'r Cq<'r>,
        cq_b: &'r Cq<'r>,
    ) -> Self {
        let a = Qp::new_rc(pd, cq_a, cq_a, QpCaps::default()).expect("ibv_create_qp");
        let b = Qp::new_rc(pd, cq_b, cq_b, QpCaps::default()).expect("ibv_create_qp");
        for (qp, peer) in [(&a, &b), (&b, &a)] {
            qp.modify_to_init(PORT).expect("RESET -> INIT");
            qp.modify_to_rtr(&RtrAttr::new(PORT, peer.qp_num(), gid, gid.raw))
                .expect("INIT -> RTR");
            qp.modify_to_rts(&RtsAttr::default()).expect("RTR -> RTS");
        }
        Safe {
            pd,
            channel,
            cq_a,
            cq_b,
            a,
            b,
        }
    }

    /// A send and a receive buffer, registered.
    fn buffers(&self) -> Buffers<'r> {
        let reg = |fill| Some(self.pd.reg_mr(vec![fill; LEN]).expect("ibv_reg_mr"));
        (reg(0x5a), reg(0))
    }

    /// One send, timed from the arm to its polled completion; returns the time.
    fn round(&self, (send, recv): &mut Buffers<'r>) -> Duration {
        let rx = self
            .b
            .post_recv(recv.take().expect("the receive buffer"), 0..LEN)
            .map_err(|e| e.source)
            .expect("ibv_post_recv");

        let start = Instant::now();
        self.cq_a.req_notify(false).expect("ibv_req_notify_cq");
        let tx = self
            .a
            .post_send(send.take().expect("the send buffer"), 0..LEN, None)
            .map_err(|e| e.source)
            .expect("ibv_post_send");
        let event = self
            .channel
            .get_cq_event(&[self.cq_a])
            .expect("ibv_get_cq_event");
        event.ack();
        let wc = self
            .cq_a
            .poll_one()
            .expect("ibv_poll_cq")
            .expect("the send's completion, after its event");
        assert!(wc.is_success(), "{wc:?}");
        *send = Some(tx.complete(&wc).expect("the send's own completion"));
        let took = start.elapsed();

        let deadline = Instant::now() + RECV_TIMEOUT;
        let wc = loop {
            if let Some(wc) = self.cq_b.poll_one().expect("ibv_poll_cq") {
                break wc;
            }
            assert!(Instant::now() < deadline, "no receive completion");
        };
        assert!(wc.is_success(), "{wc:?}");
        *recv = Some(rx.complete(&wc).expect("the receive's own completion"));
        took
    }

    /// [`Self::round`], the wait for the event done by tokio.
    async fn round_async(
        &self,
        readable: &Readable<'_>,
        (send, recv): &mut Buffers<'r>,
    ) -> Duration {
        let rx = self
            .b
            .post_recv(recv.take().expect("the receive buffer"), 0..LEN)
            .map_err(|e| e.source)
            .expect("ibv_post_recv");

        let start = Instant::now();
        self.cq_a.req_notify(false).expect("ibv_req_notify_cq");
        let tx = self
            .a
            .post_send(send.take().expect("the send buffer"), 0..LEN, None)
            .map_err(|e| e.source)
            .expect("ibv_post_send");
        let event = loop {
            let read = self.channel.try_get_cq_event(&[self.cq_a]);
            if let Some(event) = read.expect("ibv_get_cq_event") {
                break event;
            }
            let mut guard = readable.ready().await.expect("readiness");
            let read = self.channel.try_get_cq_event(&[self.cq_a]);
            match read.expect("ibv_get_cq_event") {
                Some(event) => break event,
                None => guard.clear_ready(),
            }
        };
        event.ack();
        let wc = self
            .cq_a
            .poll_one()
            .expect("ibv_poll_cq")
            .expect("the send's completion, after its event");
        assert!(wc.is_success(), "{wc:?}");
        *send = Some(tx.complete(&wc).expect("the send's own completion"));
        let took = start.elapsed();

        let deadline = Instant::now() + RECV_TIMEOUT;
        let wc = loop {
            if let Some(wc) = self.cq_b.poll_one().expect("ibv_poll_cq") {
                break wc;
            }
            assert!(Instant::now() < deadline, "no receive completion");
        };
        assert!(wc.is_success(), "{wc:?}");
        *recv = Some(rx.complete(&wc).expect("the receive's own completion"));
        took
    }

    /// One `ibv_poll_cq` of the empty `cq_a`. Like the raw variant, which black-boxes the
    /// count it checks, this black-boxes what it checks (that no completion came), not the
    /// whole `Option<WorkCompletion>` (which would add a copy of it to memory that the raw
    /// variant has no counterpart of).
    #[inline(always)]
    fn poll_empty(&self) {
        let wc = self.cq_a.poll_one().expect("ibv_poll_cq");
        assert!(black_box(wc.is_none()), "a completion on an idle CQ");
    }
}

// ---------------------------------------------------------------------------------------------
// The raw baseline
// ---------------------------------------------------------------------------------------------

const SEND_WR_ID: u64 = 1;
const RECV_WR_ID: u64 = 2;

/// The same objects in raw libibverbs, on a context of its own (same device), all destroyed in
/// Drop in the order libibverbs needs.
struct Raw {
    ctx: NonNull<sys::ibv_context>,
    pd: NonNull<sys::ibv_pd>,
    channel: NonNull<sys::ibv_comp_channel>,
    cq_a: NonNull<sys::ibv_cq>,
    cq_b: NonNull<sys::ibv_cq>,
    a: NonNull<sys::ibv_qp>,
    b: NonNull<sys::ibv_qp>,
    send_buf: Vec<u8>,
    recv_buf: Vec<u8>,
    send_mr: NonNull<sys::ibv_mr>,
    recv_mr: NonNull<sys::ibv_mr>,
    /// CQ events of `cq_a` read and not yet acked (acked [`ACK_BATCH`] at a time, as evchan).
    unacked: u32,
    wc: sys::ibv_wc,
}

/// `ptr`, or a panic that names the call and errno.
fn nonnull<T>(ptr: *mut T, call: &str) -> NonNull<T> {
    NonNull::new(ptr).unwrap_or_else(|| panic!("{call}: {}", std::io::Error::last_os_error()))
}

/// A `0 / errno` return of libibverbs, or a panic that names the call.
fn check(ret: c_int, call: &str) {
    if let Err(e) = sys::cvt_errno(ret) {
        panic!("{call}: {e}");
    }
}

impl Raw {
    fn new(device: &str, gid: &Gid) -> Self {
        let ctx = open_raw(device);
        let ctx_ptr = ctx.as_ptr();
        // SAFETY: live context.
        let pd = nonnull(unsafe { sys::ibv_alloc_pd(ctx_ptr) }, "ibv_alloc_pd");
        // SAFETY: live context.
        let channel = unsafe { sys::ibv_create_comp_channel(ctx_ptr) };
        // Left blocking, as in plain C: ibv_get_cq_event waits in its read.
        let channel = nonnull(channel, "ibv_create_comp_channel");
        let cqe = CQ_ENTRIES as c_int;
        let cq = |tag: usize| {
            // SAFETY: live context and channel; the CQ context is an opaque tag.
            let cq = unsafe {
                sys::ibv_create_cq(ctx_ptr, cqe, tag as *mut c_void, channel.as_ptr(), 0)
            };
            nonnull(cq, "ibv_create_cq")
        };
        let (cq_a, cq_b) = (cq(1), cq(2));
        let qp = |cq: NonNull<sys::ibv_cq>| {
            let caps = QpCaps::default();
            let mut attr = sys::ibv_qp_init_attr {
                qp_context: ptr::null_mut(),
                send_cq: cq.as_ptr(),
                recv_cq: cq.as_ptr(),
                srq: ptr::null_mut(),
                cap: sys::ibv_qp_cap {
                    max_send_wr: caps.max_send_wr,
                    max_recv_wr: caps.max_recv_wr,
                    max_send_sge: caps.max_send_sge,
                    max_recv_sge: caps.max_recv_sge,
                    max_inline_data: caps.max_inline_data,
                },
                qp_type: sys::ibv_qp_type::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            // SAFETY: live PD and CQ; `attr` is fully initialised.
            nonnull(
                unsafe { sys::ibv_create_qp(pd.as_ptr(), &mut attr) },
                "ibv_create_qp",
            )
        };
        let (a, b) = (qp(cq_a), qp(cq_b));
        connect_raw(a, b, gid);
        connect_raw(b, a, gid);

        let mut send_buf = vec![0x5a_u8; LEN];
        let mut recv_buf = vec![0_u8; LEN];
        let access = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as c_int;
        let reg = |buf: &mut Vec<u8>| {
            let addr = buf.as_mut_ptr().cast::<c_void>();
            // SAFETY: live PD; the buffer is allocated for LEN bytes and is neither moved nor
            // freed before ibv_dereg_mr in Drop (the Vec's heap block stays where it is).
            nonnull(
                unsafe { sys::ibv_reg_mr(pd.as_ptr(), addr, LEN, access) },
                "ibv_reg_mr",
            )
        };
        let send_mr = reg(&mut send_buf);
        let recv_mr = reg(&mut recv_buf);
        Raw {
            ctx,
            pd,
            channel,
            cq_a,
            cq_b,
            a,
            b,
            send_buf,
            recv_buf,
            send_mr,
            recv_mr,
            unacked: 0,
            // SAFETY: ibv_wc is plain data (integers and a union of integers): all-zero is valid.
            wc: unsafe { MaybeUninit::zeroed().assume_init() },
        }
    }

    fn sge(&self, mr: NonNull<sys::ibv_mr>) -> sys::ibv_sge {
        // SAFETY: the MR is live (deregistered only in Drop); its fields are written at creation.
        let mr = unsafe { mr.as_ref() };
        sys::ibv_sge {
            addr: mr.addr as u64,
            length: LEN as u32,
            lkey: mr.lkey,
        }
    }

    /// One `ibv_poll_cq` of one entry into `self.wc`; the number polled.
    fn poll(&mut self, cq: NonNull<sys::ibv_cq>) -> c_int {
        // SAFETY: live CQ; `self.wc` has room for the one entry asked for.
        unsafe { sys::ibv_poll_cq(cq.as_ptr(), 1, &mut self.wc) }
    }

    /// The same round as [`Safe::round`], in raw calls; returns the timed part.
    fn round(&mut self) -> Duration {
        let mut sge = self.sge(self.recv_mr);
        // SAFETY: ibv_recv_wr is plain data (integers and raw pointers): all-zero is valid.
        let mut rwr: sys::ibv_recv_wr = unsafe { MaybeUninit::zeroed().assume_init() };
        rwr.wr_id = RECV_WR_ID;
        rwr.sg_list = &mut sge;
        rwr.num_sge = 1;
        let mut bad_r: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: live QP; `rwr` and `sge` outlive the call (the provider copies them); the
        // receive buffer is registered, and nothing touches it until its completion is polled
        // below.
        let ret = unsafe { sys::ibv_post_recv(self.b.as_ptr(), &mut rwr, &mut bad_r) };
        check(ret, "ibv_post_recv");

        let mut sge = self.sge(self.send_mr);
        // SAFETY: ibv_send_wr is plain data (integers, raw pointers, unions of those): all-zero
        // is valid (no next, no remote address).
        let mut swr: sys::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
        swr.wr_id = SEND_WR_ID;
        swr.sg_list = &mut sge;
        swr.num_sge = 1;
        swr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND;
        swr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad_s: *mut sys::ibv_send_wr = ptr::null_mut();

        let start = Instant::now();
        // SAFETY: live CQ.
        check(
            unsafe { sys::ibv_req_notify_cq(self.cq_a.as_ptr(), 0) },
            "ibv_req_notify_cq",
        );
        // SAFETY: live QP; `swr` and `sge` outlive the call; the send buffer is registered and
        // unwritten until the completion is polled below.
        let ret = unsafe { sys::ibv_post_send(self.a.as_ptr(), &mut swr, &mut bad_s) };
        check(ret, "ibv_post_send");
        let mut cq: *mut sys::ibv_cq = ptr::null_mut();
        let mut cq_context: *mut c_void = ptr::null_mut();
        // SAFETY: live channel (blocking: waits for the event); both out-pointers are valid.
        let ret = unsafe { sys::ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut cq_context) };
        assert_eq!(
            ret,
            0,
            "ibv_get_cq_event: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(cq, self.cq_a.as_ptr(), "an event of another CQ");
        self.unacked += 1;
        if self.unacked >= ACK_BATCH {
            // SAFETY: live CQ; `unacked` events were read for it and not acked yet.
            unsafe { sys::ibv_ack_cq_events(self.cq_a.as_ptr(), self.unacked) };
            self.unacked = 0;
        }
        let n = self.poll(self.cq_a);
        assert!(
            n == 1 && self.wc.status == sys::ibv_wc_status::IBV_WC_SUCCESS,
            "the send's completion, after its event: {n} (status {})",
            self.wc.status
        );
        assert_eq!(self.wc.wr_id, SEND_WR_ID, "the send's own completion");
        let took = start.elapsed();

        let deadline = Instant::now() + RECV_TIMEOUT;
        while self.poll(self.cq_b) == 0 {
            assert!(Instant::now() < deadline, "no receive completion");
        }
        assert!(
            self.wc.status == sys::ibv_wc_status::IBV_WC_SUCCESS && self.wc.wr_id == RECV_WR_ID,
            "the receive's completion (status {})",
            self.wc.status
        );
        black_box(&self.recv_buf);
        took
    }

    /// One `ibv_poll_cq` of the empty `cq_a`. Both variants are inlined into the measuring
    /// loop (the compiler inlined this one and not the other by itself: a call more).
    #[inline(always)]
    fn poll_empty(&mut self) {
        let n = self.poll(self.cq_a);
        assert_eq!(black_box(n), 0, "a completion on an idle CQ");
    }
}

/// Opens the device named `name` with `ibv_open_device`.
fn open_raw(name: &str) -> NonNull<sys::ibv_context> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer.
    let list = nonnull(
        unsafe { sys::ibv_get_device_list(&mut n) },
        "ibv_get_device_list",
    );
    let mut ctx = None;
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` device pointers (and a NULL after them): `i` is in bounds.
        let slot = unsafe { list.as_ptr().add(i) };
        // SAFETY: an initialised slot of the live list.
        let dev = unsafe { *slot };
        // SAFETY: a device of the live list.
        let dev_name = unsafe { sys::ibv_get_device_name(dev) };
        // SAFETY: the device's name, a NUL-terminated string that lives as long as the list.
        let dev_name = unsafe { CStr::from_ptr(dev_name) };
        if dev_name.to_bytes() == name.as_bytes() {
            // SAFETY: a device of the live list.
            ctx = Some(nonnull(
                unsafe { sys::ibv_open_device(dev) },
                "ibv_open_device",
            ));
            break;
        }
    }
    // SAFETY: the list came from ibv_get_device_list and is freed once; an open context keeps
    // its device.
    unsafe { sys::ibv_free_device_list(list.as_ptr()) };
    ctx.unwrap_or_else(|| panic!("no device {name} in ibv_get_device_list"))
}

/// RESET → INIT → RTR → RTS of `qp` towards `peer`, with the same attributes as evchan's
/// `modify_to_init(1)`, `RtrAttr::new(1, …)` and `RtsAttr::default()`.
fn connect_raw(qp: NonNull<sys::ibv_qp>, peer: NonNull<sys::ibv_qp>, gid: &Gid) {
    use sys::ibv_qp_attr_mask as m;
    // SAFETY: the peer QP is live; `qp_num` is written at creation.
    let peer_num = unsafe { peer.as_ref() }.qp_num;
    let modify = |f: &dyn Fn(&mut sys::ibv_qp_attr), mask: m, what: &str| {
        // SAFETY: ibv_qp_attr is plain data (integers, unions of byte arrays, unused pointers):
        // all-zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        f(&mut attr);
        // SAFETY: live QP; `attr` is initialised for every field the mask names.
        let ret = unsafe { sys::ibv_modify_qp(qp.as_ptr(), &mut attr, mask.0 as c_int) };
        check(ret, what);
    };
    modify(
        &|a| {
            a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
            a.port_num = PORT;
        },
        m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
        "RESET -> INIT",
    );
    let sgid_index = u8::try_from(gid.index).expect("a GID index below 256");
    modify(
        &|a| {
            a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
            a.path_mtu = sys::ibv_mtu::IBV_MTU_1024;
            a.dest_qp_num = peer_num;
            a.rq_psn = 0;
            a.max_dest_rd_atomic = 1;
            a.min_rnr_timer = 12;
            a.ah_attr.port_num = PORT;
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = sys::ibv_gid { raw: gid.raw };
            a.ah_attr.grh.sgid_index = sgid_index;
            a.ah_attr.grh.hop_limit = 64;
        },
        m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER,
        "INIT -> RTR",
    );
    let rts = RtsAttr::default();
    modify(
        &|a| {
            a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
            a.sq_psn = rts.sq_psn;
            a.timeout = rts.timeout;
            a.retry_cnt = rts.retry_cnt;
            a.rnr_retry = rts.rnr_retry;
            a.max_rd_atomic = 1;
        },
        m::IBV_QP_STATE
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_MAX_QP_RD_ATOMIC,
        "RTR -> RTS",
    );
}

impl Drop for Raw {
    fn drop(&mut self) {
        // The order libibverbs needs: QPs before their CQs and PD, every CQ event acked before
        // its CQ, CQs before their channel, MRs before the PD, the PD before the context.
        // SAFETY: live QPs with no work outstanding (each round reaped its completions);
        // destroyed once.
        check(
            unsafe { sys::ibv_destroy_qp(self.a.as_ptr()) },
            "ibv_destroy_qp",
        );
        // SAFETY: as above.
        check(
            unsafe { sys::ibv_destroy_qp(self.b.as_ptr()) },
            "ibv_destroy_qp",
        );
        if self.unacked > 0 {
            // SAFETY: live CQ; `unacked` events were read for it and not acked yet.
            unsafe { sys::ibv_ack_cq_events(self.cq_a.as_ptr(), self.unacked) };
        }
        // SAFETY: no QP uses the CQs any more and every event is acked; destroyed once.
        check(
            unsafe { sys::ibv_destroy_cq(self.cq_a.as_ptr()) },
            "ibv_destroy_cq",
        );
        // SAFETY: as above.
        check(
            unsafe { sys::ibv_destroy_cq(self.cq_b.as_ptr()) },
            "ibv_destroy_cq",
        );
        // SAFETY: both of its CQs are destroyed; destroyed once.
        let ret = unsafe { sys::ibv_destroy_comp_channel(self.channel.as_ptr()) };
        check(ret, "ibv_destroy_comp_channel");
        // SAFETY: no work request uses the MRs any more; deregistered once, before their
        // buffers (fields of self) are freed.
        check(
            unsafe { sys::ibv_dereg_mr(self.send_mr.as_ptr()) },
            "ibv_dereg_mr",
        );
        // SAFETY: as above.
        check(
            unsafe { sys::ibv_dereg_mr(self.recv_mr.as_ptr()) },
            "ibv_dereg_mr",
        );
        // SAFETY: no QP or MR is left on the PD; deallocated once.
        check(
            unsafe { sys::ibv_dealloc_pd(self.pd.as_ptr()) },
            "ibv_dealloc_pd",
        );
        // SAFETY: every object of the context is gone; closed once.
        check(
            unsafe { sys::ibv_close_device(self.ctx.as_ptr()) },
            "ibv_close_device",
        );
        black_box(&self.send_buf);
    }
}
