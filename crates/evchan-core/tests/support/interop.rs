//! Helpers of the interop tests (`device_interop.rs`): ids that talk to rdma-core's tools,
//! cmtime's procedure and table, a passive side for many connections, and the posts and
//! completion checks of the message exchanges.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use evchan_core::cm::state::{Connected, Connecting, Disconnected, RouteResolved, State};
use evchan_core::cm::{AnyId, ConnParam, EventKind, IdKey, PortSpace, RejectReason, Status};
use evchan_core::verbs::{Context, Mr, Pd, Posted, QpInit, WcOpcode, WcStatus, WorkCompletion};
use evchan_core::{CmEvent, CmId, EventChannel};

use super::tool::{Output, Tool};
use super::{next_event, port, resolved, routed, v4, RESOLVE_TIMEOUT};

/// Gives a routed id librdmacm's own QP (`rdma_create_qp` with default caps): the `prepare`
/// of [`connect_when_listening`] and [`connect_all`] for tests that post nothing.
pub fn librdmacm_qp(id: &mut CmId<'_, RouteResolved>) {
    id.create_qp(&QpInit::new()).unwrap();
}

/// Connects to a tool's server that may not listen yet: a connect refused for want of a
/// listener (`REJECTED` reason 8; `UNREACHABLE` for UDP) is retried until it listens. Each
/// attempt's id is given its QP by `prepare` (post nothing there: a refused attempt's id is
/// dropped). Returns the id, still connecting, and its completing event (ESTABLISHED).
pub fn connect_when_listening<'ch>(
    ch: &'ch EventChannel,
    ps: PortSpace,
    dst: SocketAddr,
    server: &mut Tool,
    mut prepare: impl FnMut(&mut CmId<'ch, RouteResolved>),
) -> (CmId<'ch, Connecting>, CmEvent<'ch>) {
    let start = Instant::now();
    loop {
        server.assert_running();
        let mut id = routed(ch, ps, dst);
        prepare(&mut id);
        let id = id.connect(&ConnParam::new()).unwrap();
        let ev = next_event(ch, "ESTABLISHED from the tool's server");
        assert!(ev.is_for(&id), "{ev:?}");
        let no_listener = match ev.kind() {
            EventKind::Established => return (id, ev),
            EventKind::Rejected => ev.status() == Status::Rejected(RejectReason::NO_LISTENER),
            EventKind::Unreachable => ps == PortSpace::Udp,
            _ => false,
        };
        assert!(no_listener, "connecting to the tool's server: {ev:?}");
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the tool's server never listened"
        );
        drop(ev);
        drop(id);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads one event for each of `ids`, in any order, and applies `f` to the id and its event.
pub fn gather<'ch, S: State, T>(
    ch: &'ch EventChannel,
    ids: Vec<CmId<'ch, S>>,
    what: &str,
    mut f: impl FnMut(CmId<'ch, S>, &CmEvent<'ch>) -> T,
) -> Vec<T> {
    let mut waiting: HashMap<IdKey, CmId<'ch, S>> =
        ids.into_iter().map(|id| (id.key(), id)).collect();
    let mut out = Vec::with_capacity(waiting.len());
    while !waiting.is_empty() {
        let ev = next_event(ch, what);
        let id = waiting
            .remove(&ev.id())
            .unwrap_or_else(|| panic!("{ev:?} is for none of the ids waiting for {what}"));
        out.push(f(id, &ev));
    }
    out
}

/// Starts `n` connects to `dst` on `ch` step by step for all ids at once (resolve all, route
/// all, then connect all), so that no step reads another id's event; `prepare` gives each
/// routed id its QP (and may post receives). Returns the connecting ids.
pub fn connect_all<'ch>(
    ch: &'ch EventChannel,
    ps: PortSpace,
    dst: SocketAddr,
    n: usize,
    param: &ConnParam<'_>,
    mut prepare: impl FnMut(&mut CmId<'ch, RouteResolved>),
) -> Vec<CmId<'ch, Connecting>> {
    let ids: Vec<_> = (0..n)
        .map(|_| {
            CmId::new(ch, ps)
                .unwrap()
                .resolve_addr(None, dst, RESOLVE_TIMEOUT)
                .unwrap()
        })
        .collect();
    // Each step starts only once every id has finished the one before: started from inside
    // `gather`, an early id's next event (ROUTE_RESOLVED, ESTABLISHED) could arrive while a
    // later id's event of this step is still awaited.
    let ids = gather(ch, ids, "ADDR_RESOLVED", |id, ev| {
        id.addr_resolved(ev).unwrap()
    });
    let ids = ids
        .into_iter()
        .map(|id| id.resolve_route(RESOLVE_TIMEOUT).unwrap())
        .collect();
    let ids = gather(ch, ids, "ROUTE_RESOLVED", |id, ev| {
        id.route_resolved(ev).unwrap()
    });
    ids.into_iter()
        .map(|mut id| {
            prepare(&mut id);
            id.connect(param).unwrap()
        })
        .collect()
}

/// Asserts a tool's run went well: exit 0 and none of its failure lines.
pub fn assert_clean(out: &Output) {
    assert!(out.status.success(), "tool failed: {out}");
    for bad in ["error", "fail", "UNREACHABLE", "REJECTED"] {
        assert!(!out.stdout.contains(bad), "tool reported `{bad}`: {out}");
    }
}

/// The most a whole exchange with a tool may take.
pub const TOOL_DEADLINE: Duration = Duration::from_secs(90);

/// Per-connection time of each step, in µs, as cmtime reports it (step total / connections).
pub type Steps = Vec<(&'static str, f64)>;

pub fn per_conn(t: Instant, n: usize) -> f64 {
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// cmtime's client procedure with our API: each step for all `n` ids, then the next step;
/// returns the µs per connection of each step.
pub fn timed_client(ch: &EventChannel, dst: SocketAddr, n: usize) -> Steps {
    let mut steps = Steps::new();
    let t = Instant::now();
    let ids: Vec<_> = (0..n)
        .map(|_| CmId::new(ch, PortSpace::Tcp).unwrap())
        .collect();
    steps.push(("create id", per_conn(t, n)));

    let t = Instant::now();
    let ids: Vec<_> = ids
        .into_iter()
        .map(|id| id.resolve_addr(None, dst, RESOLVE_TIMEOUT).unwrap())
        .collect();
    let ids = gather(ch, ids, "ADDR_RESOLVED", |id, ev| {
        id.addr_resolved(ev).unwrap()
    });
    steps.push(("resolve addr", per_conn(t, n)));

    let t = Instant::now();
    let ids: Vec<_> = ids
        .into_iter()
        .map(|id| id.resolve_route(RESOLVE_TIMEOUT).unwrap())
        .collect();
    let mut ids = gather(ch, ids, "ROUTE_RESOLVED", |id, ev| {
        id.route_resolved(ev).unwrap()
    });
    steps.push(("resolve route", per_conn(t, n)));

    let t = Instant::now();
    let init = QpInit::new().max_send_wr(1).max_recv_wr(1);
    for id in &mut ids {
        id.create_qp(&init).unwrap();
    }
    steps.push(("create qp", per_conn(t, n)));

    let t = Instant::now();
    let ids: Vec<_> = ids
        .into_iter()
        .map(|id| id.connect(&ConnParam::new()).unwrap())
        .collect();
    let ids = gather(ch, ids, "ESTABLISHED", |id, ev| {
        let info = ev.conn_info().expect("RC parameters");
        assert_ne!(info.qp_num, 0, "the server's QP number");
        id.established(ev).unwrap()
    });
    steps.push(("connect", per_conn(t, n)));

    let t = Instant::now();
    let ids: Vec<_> = ids.into_iter().map(|id| id.disconnect().unwrap()).collect();
    let ids = gather(ch, ids, "DISCONNECTED", |id, ev| {
        assert_eq!(ev.kind(), EventKind::Disconnected, "{ev:?}");
        id
    });
    steps.push(("disconnect", per_conn(t, n)));

    let t = Instant::now();
    drop(ids);
    steps.push(("destroy", per_conn(t, n)));
    steps
}

/// cmtime's table (`step: total ms, max ms, min us, us / conn`) as `(step, us / conn)`.
pub fn cmtime_steps(stdout: &str) -> Steps {
    let names = [
        "create id",
        "bind addr",
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
        "destroy",
    ];
    stdout
        .lines()
        .filter_map(|l| {
            let (step, nums) = l.split_once(':')?;
            let name = names.iter().find(|n| **n == step.trim())?;
            let us = nums.split_whitespace().last()?.parse().ok()?;
            Some((*name, us))
        })
        .collect()
}

pub fn print_table(title: &str, c: &Steps, ours: &Steps) {
    eprintln!("{title}\nstep            cmtime us/conn   evchan us/conn   ratio");
    for (step, us) in ours {
        let theirs = c
            .iter()
            .find(|(s, _)| s == step)
            .map_or(f64::NAN, |(_, u)| *u);
        eprintln!("{step:<15} {theirs:>14.1} {us:>16.1} {:>7.2}", us / theirs);
    }
}

/// Our passive side for `n` connections from a tool's client, all ids in one map of [`AnyId`]:
/// accept each request; with `we_disconnect`, disconnect all once all are established (else
/// wait for the client's disconnect and answer it). Ends when every id has seen TIMEWAIT_EXIT;
/// asserts each id's event sequence.
pub fn serve(ch: &EventChannel, client: &mut Tool, n: usize, we_disconnect: bool) {
    let mut ids: HashMap<IdKey, AnyId<'_>> = HashMap::new();
    let mut log: HashMap<IdKey, Vec<EventKind>> = HashMap::new();
    let (mut established, mut gone) = (0, 0);
    // Where the server's time goes: waiting for events, `rdma_create_qp`, `rdma_accept`.
    let (mut waiting, mut creating, mut accepting) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let start = Instant::now();
    while gone < n {
        assert!(
            start.elapsed() < TOOL_DEADLINE,
            "server: {gone} of {n} connections done after {TOOL_DEADLINE:?}; log {log:?}"
        );
        let t = Instant::now();
        let got = ch.get_event_timeout(Duration::from_millis(200)).unwrap();
        waiting += t.elapsed();
        let Some(mut ev) = got else {
            if let Some(status) = client.try_status() {
                assert!(
                    status.success() || gone == n,
                    "the tool's client ended: {status}"
                );
            }
            continue;
        };
        let key = ev.id();
        log.entry(key).or_default().push(ev.kind());
        assert!(ev.status().is_success(), "{ev:?}");
        match ev.kind() {
            EventKind::ConnectRequest => {
                assert!(ev.conn_info().is_some());
                let mut id = ev.take_request().unwrap();
                let t = Instant::now();
                id.create_qp(&QpInit::new()).unwrap();
                creating += t.elapsed();
                let t = Instant::now();
                let id = id
                    .accept(&ConnParam::new().private_data(b"evchan"))
                    .unwrap();
                accepting += t.elapsed();
                ids.insert(key, id.erase());
            }
            EventKind::Established => {
                let id = ids.remove(&key).expect("ESTABLISHED of one of ours");
                let id = id.complete(&ev).unwrap();
                assert!(id.is::<Connected>());
                ids.insert(key, id);
                established += 1;
                if we_disconnect && established == n {
                    let keys: Vec<_> = ids.keys().copied().collect();
                    for k in keys {
                        let id = ids.remove(&k).unwrap().disconnect().unwrap();
                        ids.insert(k, id);
                    }
                }
            }
            EventKind::Disconnected => {
                let mut id = ids.remove(&key).expect("DISCONNECTED of one of ours");
                if id.is::<Connected>() {
                    assert!(!we_disconnect, "the client disconnected first");
                    id = id.disconnect().unwrap(); // the reply (DREP)
                }
                ids.insert(key, id);
            }
            EventKind::TimewaitExit => {
                drop(ids.remove(&key).expect("TIMEWAIT_EXIT of one of ours"));
                gone += 1;
            }
            other => panic!("server: unexpected {other} in {ev:?}"),
        }
    }
    eprintln!(
        "server, {n} connections in {:?}: waiting for events {waiting:?}, rdma_create_qp \
         {creating:?}, rdma_accept {accepting:?}",
        start.elapsed()
    );
    assert_eq!(log.len(), n, "{log:?}");
    for (key, kinds) in &log {
        assert_eq!(
            kinds,
            &[
                EventKind::ConnectRequest,
                EventKind::Established,
                EventKind::Disconnected,
                EventKind::TimewaitExit
            ],
            "events of {key:?}"
        );
    }
}

/// Our receive buffers: larger than any message a tool sends, pre-filled, so that the length
/// and the bytes of a completion are the sender's.
pub const RX_LEN: usize = 256;

/// The device context of the VM's address, from an id resolved to it on a channel of its own
/// (before any tool can put events on the test's channels).
pub fn vm_context() -> Context {
    let ch = EventChannel::new().unwrap();
    let id = resolved(&ch, PortSpace::Tcp, v4(port(19)));
    id.context().unwrap()
}

/// A posted receive of [`RX_LEN`] bytes, filled with 0xee, on `id`'s QP.
pub fn post_rx<'pd, S: State>(id: &CmId<'_, S>, pd: &'pd Pd<'_>) -> Posted<'pd, Vec<u8>> {
    id.post_recv(pd.reg_mr(vec![0xee; RX_LEN]).unwrap(), 0..RX_LEN)
        .unwrap()
}

/// A posted SEND of `bytes` on `id`'s QP.
pub fn post_tx<'pd, S: State>(
    id: &CmId<'_, S>,
    pd: &'pd Pd<'_>,
    bytes: &[u8],
) -> Posted<'pd, Vec<u8>> {
    id.post_send(pd.reg_mr(bytes.to_vec()).unwrap(), 0..bytes.len(), None)
        .unwrap()
}

/// Asserts a receive completion of `len` bytes (no immediate data) and returns its bytes.
pub fn received(mr: &Mr<'_, Vec<u8>>, wc: &WorkCompletion, len: usize) -> Vec<u8> {
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    assert_eq!(wc.opcode(), Some(WcOpcode::Recv), "{wc:?}");
    assert_eq!(wc.byte_len() as usize, len, "{wc:?}");
    assert_eq!(wc.imm_data(), None, "{wc:?}");
    mr.as_slice()[..len].to_vec()
}

/// Asserts a successful send completion.
pub fn sent(wc: &WorkCompletion) {
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    assert_eq!(wc.opcode(), Some(WcOpcode::Send), "{wc:?}");
}

/// The end of a run where the tool disconnects first: it disconnects every one of `ids`, each
/// answers (`rdma_disconnect`, the DREP), the tool exits cleanly ([`assert_clean`]), every id
/// leaves timewait. Returns the tool's output for more checks.
pub fn answer_disconnects<'ch>(
    ch: &'ch EventChannel,
    ids: Vec<CmId<'ch, Connected>>,
    tool: Tool,
) -> Output {
    let ids = gather(ch, ids, "DISCONNECTED", |id, ev| {
        assert_eq!(ev.kind(), EventKind::Disconnected, "{ev:?}");
        id.disconnect().unwrap()
    });
    finish(ch, ids, tool)
}

/// The end of a run where we disconnect first: every one of `ids` disconnects, each gets the
/// tool's answer (`DISCONNECTED`), the tool exits cleanly, every id leaves timewait. Returns the
/// tool's output.
pub fn disconnect_all<'ch>(
    ch: &'ch EventChannel,
    ids: Vec<CmId<'ch, Connected>>,
    tool: Tool,
) -> Output {
    let ids: Vec<_> = ids.into_iter().map(|id| id.disconnect().unwrap()).collect();
    let ids = gather(ch, ids, "DISCONNECTED", |id, ev| {
        assert_eq!(ev.kind(), EventKind::Disconnected, "{ev:?}");
        id
    });
    finish(ch, ids, tool)
}

fn finish<'ch>(ch: &'ch EventChannel, ids: Vec<CmId<'ch, Disconnected>>, tool: Tool) -> Output {
    let out = tool.wait(TOOL_DEADLINE);
    assert_clean(&out);
    gather(ch, ids, "TIMEWAIT_EXIT", |_, ev| {
        assert_eq!(ev.kind(), EventKind::TimewaitExit, "{ev:?}");
    });
    out
}
