//! Connection setup, step by step as rdma-core's `cmtime` (rdma-core 44) reports it, in one of
//! evchan's layers; `cargo xtask bench --tools` runs it against `cmtime -b ADDR` (the server of
//! every row, `cmtime`'s own client included) in the soft-RoCE VM.
//!
//! ```text
//! tools_cm --layer raw|raw-percq|core|core-shared|async [--addr IP:PORT] [--connections N]
//! ```
//!
//! As `cmtime -s ADDR -c N` does, every step runs for all N connections before the next one
//! starts, with all N in flight at once: create N ids; resolve N addresses and wait for every
//! `ADDR_RESOLVED`; resolve N routes (`ROUTE_RESOLVED`); create N QPs (one send and one receive
//! work request); `rdma_connect` N times and wait for every `ESTABLISHED`; `rdma_disconnect` and
//! `rdma_destroy_qp` N times and wait for every `DISCONNECTED`; destroy the N ids. One thread
//! posts and then reads the events (cmtime reads them on a second thread).
//!
//! Per step it prints the step's wall time, the wall time per connection (cmtime's `us / conn`,
//! the figure compared) and the per-connection times (each connection's call to its own event).
//!
//! - `raw`: plain librdmacm through `evchan-sys`, like cmtime 44 also in its one quirk:
//!   `rdma_create_qp` copies the CQs librdmacm made for the first QP back into the shared
//!   `ibv_qp_init_attr`, so every later QP uses them (one send and one receive CQ for all).
//! - `raw-percq`: the same with a fresh `ibv_qp_init_attr` per QP: librdmacm makes two
//!   completion channels and two CQs for every QP.
//! - `core`: `evchan-core`'s `CmId::create_qp` (CQs per QP, as `raw-percq`).
//! - `core-shared`: `evchan-core` with `create_qp_with` on one PD and one CQ made before the
//!   timing (from a probe id's device context), shared by every QP: the like-for-like row of
//!   `raw` and cmtime. In both core rows the disconnect step is `Id::disconnect` and
//!   `Id::destroy_qp`, as cmtime's `rdma_disconnect` and `rdma_destroy_qp`.
//! - `async`: the `evchan` API has no steps: `full_connect` is N `Connection::connect`s at once
//!   (each: id, address, route, QP, its memory, connect, handshake), `close` N `close`s at once.
//!   One connection made before the timing (and closed after it) starts evchan's runtime.
//!
//! # Unsafe code
//!
//! The `raw` rows are the baseline and cannot be written without `unsafe`; like
//! `benches/cm_event.rs`, this file is an allowed exception to "no `unsafe` outside evchan-sys
//! and evchan-core's `ffi`". Every block has its `// SAFETY:` comment.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod tools_support;
use tools_support::{emit, fail, us, Cli, Stats};

const PROGRAM: &str = "tools_cm";
const USAGE: &str = "usage: tools_cm --layer raw|raw-percq|core|core-shared|async \
                     [--addr IP:PORT] [--connections N]";
const CLI: Cli = Cli {
    program: PROGRAM,
    usage: USAGE,
};
/// The `--layer` values.
const LAYERS: &[&str] = &["raw", "raw-percq", "core", "core-shared", "async"];
/// At most this many connections: each takes a local port.
const MAX_CONNECTIONS: usize = 65_535;
/// cmtime's resolve timeout (`-t`, default 2000 ms) and retry count (`-r`, default 2).
const TIMEOUT: Duration = Duration::from_millis(2000);
const RETRIES: u8 = 2;

/// One step: its wall time (first call to last event) and each connection's time.
struct Step {
    name: &'static str,
    wall: Duration,
    each: Vec<Duration>,
}

/// Per-connection start and end of one step.
struct Clock {
    start: Vec<Instant>,
    end: Vec<Option<Instant>>,
    t0: Instant,
}

impl Clock {
    fn new(n: usize) -> Self {
        let now = Instant::now();
        Clock {
            start: vec![now; n],
            end: vec![None; n],
            t0: now,
        }
    }
    fn begin(&mut self, i: usize) {
        self.start[i] = Instant::now();
    }
    fn done(&mut self, i: usize) {
        self.end[i] = Some(Instant::now());
    }
    fn step(self, name: &'static str) -> Step {
        let wall = self.t0.elapsed();
        let each = self
            .start
            .iter()
            .zip(&self.end)
            .map(|(s, e)| {
                e.unwrap_or_else(|| fail(PROGRAM, format!("{name}: a step never ended")))
                    .duration_since(*s)
            })
            .collect();
        Step { name, wall, each }
    }
}

fn main() -> ExitCode {
    let mut layer = None;
    let mut addr = SocketAddr::from(([169, 254, 77, 1], 7471));
    let mut conns = 100usize;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| CLI.error(format_args!("{flag} needs a value")));
        match flag.as_str() {
            "--layer" if LAYERS.contains(&value.as_str()) => layer = Some(value),
            "--layer" => CLI.error(format_args!("--layer: unknown layer `{value}`")),
            "--addr" => addr = CLI.peer(&flag, &value),
            "--connections" => conns = CLI.number(&flag, &value, 1..=MAX_CONNECTIONS),
            _ => CLI.error(format_args!("unknown argument `{flag}`")),
        }
    }
    let Some(layer) = layer else {
        CLI.error("--layer is needed")
    };
    let SocketAddr::V4(v4) = addr else {
        CLI.error("--addr: an IPv4 address (cmtime's form)")
    };
    if !tools_support::device_present(PROGRAM) {
        return ExitCode::SUCCESS;
    }
    let steps = match layer.as_str() {
        "raw" => raw::run(v4, conns, true),
        "raw-percq" => raw::run(v4, conns, false),
        "core" => core(addr, conns, false),
        "core-shared" => core(addr, conns, true),
        "async" => asynchronous(addr, conns),
        other => fail(PROGRAM, format!("unknown layer `{other}`\n{USAGE}")),
    };
    for s in &steps {
        let micros: Vec<f64> = s.each.iter().map(|d| us(*d)).collect();
        let stats = Stats::of(&micros).expect("at least one connection");
        emit(
            "cm",
            &[
                ("layer", layer.clone()),
                ("step", s.name.to_owned()),
                ("conns", conns.to_string()),
                ("total_us", format!("{:.1}", us(s.wall))),
                ("per_conn_us", format!("{:.2}", us(s.wall) / conns as f64)),
                ("stats", stats.fields().replace(' ', ",")),
            ],
        );
    }
    ExitCode::SUCCESS
}

/// The `core` and `core-shared` rows (see the file's doc).
fn core(dst: SocketAddr, n: usize, shared: bool) -> Vec<Step> {
    use evchan_core::cm::{ConnParam, IdKey, PortSpace};
    use evchan_core::verbs::{CompChannel, Cq, Pd, QpInit};
    use evchan_core::{CmEvent, CmId, EventChannel};

    let die =
        |what: &str, e: &dyn std::fmt::Display| -> ! { fail(PROGRAM, format!("{what}: {e}")) };
    let channel = EventChannel::new().unwrap_or_else(|e| die("rdma_create_event_channel", &e));
    // core-shared: the device context of a probe id, resolved before the timing.
    let ctx = shared.then(|| {
        let id = CmId::new(&channel, PortSpace::Tcp).unwrap_or_else(|e| die("rdma_create_id", &e));
        let id = id
            .resolve_addr(None, dst, TIMEOUT)
            .unwrap_or_else(|e| die("rdma_resolve_addr", &e.error));
        let ev = channel
            .get_event()
            .unwrap_or_else(|e| die("rdma_get_cm_event", &e));
        let id = id
            .addr_resolved(&ev)
            .unwrap_or_else(|e| die("ADDR_RESOLVED", &e.error));
        ev.ack();
        id.context().unwrap_or_else(|e| die("context", &e))
    });
    let pd = ctx
        .as_ref()
        .map(|c| Pd::new(c).unwrap_or_else(|e| die("ibv_alloc_pd", &e)));
    let comp = ctx
        .as_ref()
        .map(|c| CompChannel::new(c).unwrap_or_else(|e| die("ibv_create_comp_channel", &e)));
    let cq = comp
        .as_ref()
        .map(|c| Cq::new(c, 1).unwrap_or_else(|e| die("ibv_create_cq", &e)));
    let init = QpInit::new().max_send_wr(1).max_recv_wr(1);

    // Reads events until every connection in `from` has had its own, handing each to `next`.
    fn drain<'ch, A, B>(
        channel: &'ch EventChannel,
        keys: &HashMap<IdKey, usize>,
        from: Vec<A>,
        clock: &mut Clock,
        mut next: impl FnMut(A, &CmEvent<'ch>) -> Result<B, String>,
    ) -> Vec<B> {
        let mut from: Vec<Option<A>> = from.into_iter().map(Some).collect();
        let mut to: Vec<Option<B>> = from.iter().map(|_| None).collect();
        let mut left = from.len();
        while left > 0 {
            let ev = channel
                .get_event()
                .unwrap_or_else(|e| fail(PROGRAM, format!("rdma_get_cm_event: {e}")));
            // After a disconnect the kernel may report an id's TIMEWAIT_EXIT, before other
            // ids' DISCONNECTED; cmtime ignores it, so do we.
            if ev.kind() == evchan_core::cm::EventKind::TimewaitExit {
                ev.ack();
                continue;
            }
            let Some(&i) = keys.get(&ev.id()) else {
                fail(
                    PROGRAM,
                    format!("an event of an unknown id: {:?}", ev.kind()),
                )
            };
            let Some(id) = from[i].take() else {
                fail(
                    PROGRAM,
                    format!("a second event for one id: {:?}", ev.kind()),
                )
            };
            clock.done(i);
            to[i] = Some(next(id, &ev).unwrap_or_else(|e| fail(PROGRAM, e)));
            ev.ack();
            left -= 1;
        }
        to.into_iter()
            .map(|b| b.expect("every id had its event"))
            .collect()
    }

    let mut steps = Vec::new();
    let mut clock = Clock::new(n);
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        clock.begin(i);
        ids.push(CmId::new(&channel, PortSpace::Tcp).unwrap_or_else(|e| die("rdma_create_id", &e)));
        clock.done(i);
    }
    steps.push(clock.step("create_id"));
    let keys: HashMap<IdKey, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.key(), i))
        .collect();

    let mut clock = Clock::new(n);
    let mut resolving = Vec::with_capacity(n);
    for (i, id) in ids.into_iter().enumerate() {
        clock.begin(i);
        resolving.push(
            id.resolve_addr(None, dst, TIMEOUT)
                .unwrap_or_else(|e| die("rdma_resolve_addr", &e.error)),
        );
    }
    let ids = drain(&channel, &keys, resolving, &mut clock, |id, ev| {
        id.addr_resolved(ev)
            .map_err(|e| format!("ADDR_RESOLVED: {}", e.error))
    });
    steps.push(clock.step("resolve_addr"));

    let mut clock = Clock::new(n);
    let mut resolving = Vec::with_capacity(n);
    for (i, id) in ids.into_iter().enumerate() {
        clock.begin(i);
        resolving.push(
            id.resolve_route(TIMEOUT)
                .unwrap_or_else(|e| die("rdma_resolve_route", &e.error)),
        );
    }
    let mut ids = drain(&channel, &keys, resolving, &mut clock, |id, ev| {
        id.route_resolved(ev)
            .map_err(|e| format!("ROUTE_RESOLVED: {}", e.error))
    });
    steps.push(clock.step("resolve_route"));

    let mut clock = Clock::new(n);
    for (i, id) in ids.iter_mut().enumerate() {
        clock.begin(i);
        let made = match (&pd, &cq) {
            (Some(pd), Some(cq)) => id.create_qp_with(pd, cq, cq, &init),
            _ => id.create_qp(&init),
        };
        made.unwrap_or_else(|e| die("rdma_create_qp", &e));
        clock.done(i);
    }
    steps.push(clock.step("create_qp"));

    let mut clock = Clock::new(n);
    let param = ConnParam::new()
        .responder_resources(1)
        .initiator_depth(1)
        .retry_count(RETRIES);
    let mut connecting = Vec::with_capacity(n);
    for (i, id) in ids.into_iter().enumerate() {
        clock.begin(i);
        connecting.push(
            id.connect(&param)
                .unwrap_or_else(|e| die("rdma_connect", &e.error)),
        );
    }
    let ids = drain(&channel, &keys, connecting, &mut clock, |id, ev| {
        id.established(ev)
            .map_err(|e| format!("ESTABLISHED: {}", e.error))
    });
    steps.push(clock.step("connect"));

    let mut clock = Clock::new(n);
    let mut closing = Vec::with_capacity(n);
    for (i, id) in ids.into_iter().enumerate() {
        clock.begin(i);
        let mut id = id
            .disconnect()
            .unwrap_or_else(|e| die("rdma_disconnect", &e.error));
        id.destroy_qp()
            .unwrap_or_else(|e| die("rdma_destroy_qp", &e));
        closing.push(id);
    }
    let ids = drain(&channel, &keys, closing, &mut clock, |id, ev| {
        if ev.kind() == evchan_core::cm::EventKind::Disconnected {
            Ok(id)
        } else {
            Err(format!("expected DISCONNECTED, got {:?}", ev.kind()))
        }
    });
    steps.push(clock.step("disconnect"));

    let mut clock = Clock::new(n);
    for (i, id) in ids.into_iter().enumerate() {
        clock.begin(i);
        id.destroy();
        clock.done(i);
    }
    steps.push(clock.step("destroy"));
    steps
}

/// The `async` row: N connects at once, then N closes at once.
fn asynchronous(dst: SocketAddr, n: usize) -> Vec<Step> {
    use evchan::{Config, Connection};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(PROGRAM, format!("tokio: {e}")));
    rt.block_on(async move {
        let config = Config::new().connect_timeout(Duration::from_secs(60));
        let connect = move |config: Config| async move {
            let t = Instant::now();
            let conn = Connection::builder()
                .config(config)
                .connect(dst)
                .await
                .unwrap_or_else(|e| fail(PROGRAM, format!("connect: {e}")));
            (conn, t.elapsed())
        };
        // Starts the runtime (devices, CQs, shard threads) before the timing. Closed only at
        // the end: it is the server's first id, and cmtime 44's server frees the CQs all its
        // QPs share with that id (later requests would be rejected).
        let warm = connect(config.clone()).await.0;

        let t0 = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let c = config.clone();
            set.spawn(async move { (i, connect(c).await) });
        }
        let mut conns = Vec::with_capacity(n);
        let mut each = vec![Duration::ZERO; n];
        while let Some(joined) = set.join_next().await {
            let (i, (conn, took)) = joined.unwrap_or_else(|e| fail(PROGRAM, e));
            each[i] = took;
            conns.push(conn);
        }
        let connect_step = Step {
            name: "full_connect",
            wall: t0.elapsed(),
            each,
        };

        let t0 = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for conn in conns {
            set.spawn(async move {
                let t = Instant::now();
                conn.close().await.unwrap_or_else(|e| fail(PROGRAM, e));
                t.elapsed()
            });
        }
        let mut each = Vec::with_capacity(n);
        while let Some(joined) = set.join_next().await {
            each.push(joined.unwrap_or_else(|e| fail(PROGRAM, e)));
        }
        warm.close().await.unwrap_or_else(|e| fail(PROGRAM, e));
        vec![
            connect_step,
            Step {
                name: "close",
                wall: t0.elapsed(),
                each,
            },
        ]
    })
}

/// The `raw` and `raw-percq` rows: librdmacm through `evchan-sys`.
mod raw {
    use std::ffi::c_void;
    use std::io;
    use std::net::SocketAddrV4;
    use std::ptr;

    use evchan_sys as sys;

    use super::{fail, Clock, Step, PROGRAM, RETRIES, TIMEOUT};

    fn check(ret: i32, call: &str) {
        if ret != 0 {
            fail(PROGRAM, format!("{call}: {}", io::Error::last_os_error()));
        }
    }

    /// Reads events until each of `n` ids had one of kind `expect`; stamps its end.
    fn drain(ch: *mut sys::rdma_event_channel, n: usize, expect: u32, clock: &mut Clock) {
        let mut seen = vec![false; n];
        let mut left = n;
        while left > 0 {
            let mut event: *mut sys::rdma_cm_event = ptr::null_mut();
            // SAFETY: `ch` is live until the end of `run`; `event` is a valid out-pointer.
            check(
                unsafe { sys::rdma_get_cm_event(ch, &mut event) },
                "rdma_get_cm_event",
            );
            // SAFETY: a read event stays valid until its ack below.
            let ev = unsafe { &*event };
            // SAFETY: the event's id is one of `run`'s ids, live until the destroy step.
            let context = unsafe { &*ev.id }.context as usize;
            let (kind, status) = (ev.event, ev.status);
            // SAFETY: read above, acked once; nothing of it is used after.
            check(
                unsafe { sys::rdma_ack_cm_event(event) },
                "rdma_ack_cm_event",
            );
            let i = context.wrapping_sub(1);
            // A TIMEWAIT_EXIT after a disconnect may come before other ids' DISCONNECTED;
            // cmtime ignores it, so do we.
            if kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT {
                continue;
            }
            if kind != expect || status != 0 || i >= n || seen[i] {
                fail(
                    PROGRAM,
                    format!("expected event {expect}, got {kind} (status {status}) for id {i}"),
                );
            }
            seen[i] = true;
            left -= 1;
            clock.done(i);
        }
    }

    pub fn run(dst: SocketAddrV4, n: usize, shared_cq: bool) -> Vec<Step> {
        use sys::rdma_cm_event_type as ev;
        // SAFETY: no arguments; NULL is checked.
        let ch = unsafe { sys::rdma_create_event_channel() };
        if ch.is_null() {
            fail(
                PROGRAM,
                format!("rdma_create_event_channel: {}", io::Error::last_os_error()),
            );
        }
        let mut sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: dst.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(dst.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        let dst_ptr: *mut libc::sockaddr_in = &mut sin;
        let timeout_ms = i32::try_from(TIMEOUT.as_millis()).expect("a small timeout");
        let mut steps = Vec::new();

        let mut clock = Clock::new(n);
        let mut ids: Vec<*mut sys::rdma_cm_id> = vec![ptr::null_mut(); n];
        for (i, id) in ids.iter_mut().enumerate() {
            clock.begin(i);
            // SAFETY: live channel; `id` is a valid out-pointer; the context is an index + 1,
            // never dereferenced.
            let ret = unsafe {
                sys::rdma_create_id(
                    ch,
                    id,
                    (i + 1) as *mut c_void,
                    sys::rdma_port_space::RDMA_PS_TCP,
                )
            };
            check(ret, "rdma_create_id");
            clock.done(i);
        }
        steps.push(clock.step("create_id"));

        let mut clock = Clock::new(n);
        for (i, &id) in ids.iter().enumerate() {
            clock.begin(i);
            // SAFETY: a live id; `dst_ptr` points to a sockaddr_in librdmacm only reads.
            let ret =
                unsafe { sys::rdma_resolve_addr(id, ptr::null_mut(), dst_ptr.cast(), timeout_ms) };
            check(ret, "rdma_resolve_addr");
        }
        drain(ch, n, ev::RDMA_CM_EVENT_ADDR_RESOLVED, &mut clock);
        steps.push(clock.step("resolve_addr"));

        let mut clock = Clock::new(n);
        for (i, &id) in ids.iter().enumerate() {
            clock.begin(i);
            // SAFETY: a live id with its address resolved.
            check(
                unsafe { sys::rdma_resolve_route(id, timeout_ms) },
                "rdma_resolve_route",
            );
        }
        drain(ch, n, ev::RDMA_CM_EVENT_ROUTE_RESOLVED, &mut clock);
        steps.push(clock.step("resolve_route"));

        // cmtime's attributes: one send and one receive work request of one SGE, RC.
        let fresh = || sys::ibv_qp_init_attr {
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
        let mut shared = fresh();
        let mut clock = Clock::new(n);
        for (i, &id) in ids.iter().enumerate() {
            let mut own = fresh();
            // With `shared_cq`, as cmtime 44: one attr for all, into which librdmacm copies the
            // CQs it made for the first QP.
            let attr: *mut sys::ibv_qp_init_attr = if shared_cq { &mut shared } else { &mut own };
            clock.begin(i);
            // SAFETY: a live id with its route resolved; `attr` is a valid init attr; NULL PD
            // takes librdmacm's per-device PD.
            check(
                unsafe { sys::rdma_create_qp(id, ptr::null_mut(), attr) },
                "rdma_create_qp",
            );
            clock.done(i);
        }
        steps.push(clock.step("create_qp"));

        let mut clock = Clock::new(n);
        let mut param = sys::rdma_conn_param {
            private_data: ptr::null(),
            private_data_len: 0,
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: 0,
            retry_count: RETRIES,
            rnr_retry_count: 0,
            srq: 0,
            qp_num: 0,
        };
        for (i, &id) in ids.iter().enumerate() {
            clock.begin(i);
            // SAFETY: a live id with a QP; `param` is valid for the call.
            check(unsafe { sys::rdma_connect(id, &mut param) }, "rdma_connect");
        }
        drain(ch, n, ev::RDMA_CM_EVENT_ESTABLISHED, &mut clock);
        steps.push(clock.step("connect"));

        // As cmtime: disconnect and destroy the QP; in reverse order, so that the first id's
        // QP, whose CQs the others share, goes last (the cost per connection is the same).
        let mut clock = Clock::new(n);
        for (i, &id) in ids.iter().enumerate().rev() {
            clock.begin(i);
            // SAFETY: a live, connected id.
            check(unsafe { sys::rdma_disconnect(id) }, "rdma_disconnect");
            // SAFETY: the id's QP, no longer used; with shared CQs, every QP on them after
            // this one is already destroyed before the first id's QP and CQs go.
            unsafe { sys::rdma_destroy_qp(id) };
        }
        drain(ch, n, ev::RDMA_CM_EVENT_DISCONNECTED, &mut clock);
        steps.push(clock.step("disconnect"));

        let mut clock = Clock::new(n);
        for (i, &id) in ids.iter().enumerate() {
            clock.begin(i);
            // SAFETY: every event of the id is acked; destroyed once.
            check(unsafe { sys::rdma_destroy_id(id) }, "rdma_destroy_id");
            clock.done(i);
        }
        steps.push(clock.step("destroy"));
        // SAFETY: every id of the channel is destroyed and every event acked.
        unsafe { sys::rdma_destroy_event_channel(ch) };
        steps
    }
}
