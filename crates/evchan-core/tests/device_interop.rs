//! Interop with rdma-core's own programs, in the VM: our passive side against their clients and
//! our active side against their servers, with the tools' exit status and our event sequence
//! asserted, and every tool killed on a deadline.
//!
//! - `cmtime` (rdmacm-utils): RC connections in bulk, with per-step timings; its server never
//!   exits on its own (it is killed, after checking it still runs), its client disconnects
//!   first. Our client's timings are printed next to cmtime's own client's, measured in the
//!   same run against the same server. Two steps are not alike: cmtime passes one
//!   `ibv_qp_init_attr` to every `rdma_create_qp`, which writes the first QP's CQs back into
//!   it, so cmtime creates (and destroys) two CQs once where we do it for every QP (`create
//!   qp`, `destroy`); and cmtime destroys its QPs in `disconnect`, we in `destroy`.
//! - `ucmatose -C 0` (rdmacm-utils): RC connections with no messages (`-C 0` posts no work
//!   requests, so no verbs beyond `rdma_create_qp` are needed); its server disconnects first and
//!   exits 0 when all are gone.
//! - `udaddy -C 0` (rdmacm-utils): UD service ID resolution (SIDR) on the UDP port space, no
//!   messages; its server exits 0 after answering every request, its client after every
//!   `ESTABLISHED`.
//!
//! `rping`, `rdma_server`/`rdma_client` and `ucmatose`/`udaddy` with messages need RDMA send,
//! receive and read, which come with the verbs work; they are not used here. The tools take only
//! the IPv4 address (169.254.77.1), not `fe80::…%dummy0`.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use evchan_core::cm::state::{Connected, Connecting, Disconnected, State};
use evchan_core::cm::{AnyId, ConnParam, EventKind, IdKey, PortSpace};
use evchan_core::verbs::QpInit;
use evchan_core::{CmEvent, CmId, EventChannel};
use support::interop::*;
use support::tool::Tool;
use support::*;

/// Connections per run (TCG is slow; cmtime's default of 100 would work too).
const N: usize = 16;
/// Connections of the timed comparison with cmtime (SOFTROCE.md's C figures use 100 too).
const TIMING_N: usize = 100;
/// The most a whole exchange with a tool may take.
const TOOL_DEADLINE: Duration = Duration::from_secs(90);
/// udaddy's port, fixed (its `-p` is the port space).
const UDADDY_PORT: u16 = 7174;
/// `RDMA_UDP_QKEY`, the QKey rdma_cm gives UD QPs of the UDP port space.
const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Per-connection time of each step, in µs, as cmtime reports it (step total / connections).
type Steps = Vec<(&'static str, f64)>;

fn per_conn(t: Instant, n: usize) -> f64 {
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// cmtime's client procedure with our API: each step for all `n` ids, then the next step;
/// returns the µs per connection of each step.
fn timed_client(ch: &EventChannel, dst: SocketAddr, n: usize) -> Steps {
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
fn cmtime_steps(stdout: &str) -> Steps {
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

fn print_table(title: &str, c: &Steps, ours: &Steps) {
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
fn serve(ch: &EventChannel, client: &mut Tool, n: usize, we_disconnect: bool) {
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

#[test]
fn cmtime_client_against_our_listener() {
    require_device!();
    let cmtime = require_tool!("cmtime", "rdmacm-utils");
    let p = port(1);
    let ch = EventChannel::new().unwrap();
    let _listening = listener(&ch, PortSpace::Tcp, v4(p));
    let n = TIMING_N.to_string();
    let mut client = Tool::spawn(&cmtime, &["-s", VM_V4, "-p", &p.to_string(), "-c", &n]);
    serve(&ch, &mut client, TIMING_N, false);
    let out = client.wait(TOOL_DEADLINE);
    assert_clean(&out);
    let steps = cmtime_steps(&out.stdout);
    assert!(
        steps.iter().any(|(s, _)| *s == "connect"),
        "cmtime printed no timings: {out}"
    );
    eprintln!(
        "cmtime client -> evchan server, {N} connections:\n{}",
        out.stdout
    );
}

#[test]
fn our_client_against_cmtime_server_next_to_cmtime_client() {
    require_device!();
    let cmtime = require_tool!("cmtime", "rdmacm-utils");
    let p = port(2);
    let ps = p.to_string();
    let mut server = Tool::spawn(&cmtime, &["-b", VM_V4, "-p", &ps]);
    let ch = EventChannel::new().unwrap();

    // One connection once the server listens. It stays up until the end: cmtime's server
    // (rdma-core 44) passes one global `ibv_qp_init_attr` to every `rdma_create_qp`, which
    // writes the first id's CQs back into it, so once that first id is gone every later QP
    // fails and the server rejects (reason 28) every request.
    let (probe, ev) = connect_when_listening(&ch, PortSpace::Tcp, v4(p), &mut server);
    let probe = probe.established(&ev).unwrap();
    drop(ev);

    // cmtime's own client against the same server, then ours, the same way.
    let n = TIMING_N.to_string();
    let c_client = Tool::spawn(&cmtime, &["-s", VM_V4, "-p", &ps, "-c", &n]);
    let out = c_client.wait(TOOL_DEADLINE);
    assert_clean(&out);
    let c = cmtime_steps(&out.stdout);
    let ours = timed_client(&ch, v4(p), TIMING_N);
    server.assert_running();
    print_table(
        &format!(
            "{TIMING_N} connections to cmtime's server (TCG: compare ratios only; cmtime's \
             `disconnect` includes rdma_destroy_qp, ours is in `destroy`)"
        ),
        &c,
        &ours,
    );
    let probe = probe.disconnect().unwrap();
    let ev = expect_event(&ch, EventKind::Disconnected);
    assert!(ev.is_for(&probe));
    drop(ev);
    server.assert_running();
    let out = server.kill();
    assert!(!out.stdout.contains("failing"), "{out}");
}

#[test]
fn ucmatose_client_against_our_listener_we_disconnect() {
    require_device!();
    let ucmatose = require_tool!("ucmatose", "rdmacm-utils");
    let p = port(3);
    let ch = EventChannel::new().unwrap();
    let _listening = listener(&ch, PortSpace::Tcp, v4(p));
    let n = N.to_string();
    let mut client = Tool::spawn(
        &ucmatose,
        &["-s", VM_V4, "-p", &p.to_string(), "-c", &n, "-C", "0"],
    );
    serve(&ch, &mut client, N, true);
    let out = client.wait(TOOL_DEADLINE);
    assert_clean(&out);
}

#[test]
fn our_client_against_ucmatose_server_it_disconnects() {
    require_device!();
    let ucmatose = require_tool!("ucmatose", "rdmacm-utils");
    let p = port(4);
    let n = N.to_string();
    let mut server = Tool::spawn(
        &ucmatose,
        &["-b", VM_V4, "-p", &p.to_string(), "-c", &n, "-C", "0"],
    );
    let ch = EventChannel::new().unwrap();
    let (first, ev) = connect_when_listening(&ch, PortSpace::Tcp, v4(p), &mut server);
    let mut connected = vec![first.established(&ev).unwrap()];
    drop(ev);
    let param = ConnParam::new().private_data(b"evchan");
    let rest = connect_all(&ch, PortSpace::Tcp, v4(p), N - 1, &param);
    connected.extend(gather(&ch, rest, "ESTABLISHED", |id, ev| {
        id.established(ev).unwrap()
    }));
    // All N are up: the server disconnects each; we answer.
    let ids = gather(&ch, connected, "DISCONNECTED", |id, ev| {
        assert_eq!(ev.kind(), EventKind::Disconnected, "{ev:?}");
        id.disconnect().unwrap()
    });
    let out = server.wait(TOOL_DEADLINE);
    assert_clean(&out);
    assert!(out.stdout.contains("disconnected"), "{out}");
    gather(&ch, ids, "TIMEWAIT_EXIT", |_, ev| {
        assert_eq!(ev.kind(), EventKind::TimewaitExit, "{ev:?}");
    });
}

#[test]
fn ucmatose_ib_port_space_client_against_our_listener() {
    require_device!();
    let ucmatose = require_tool!("ucmatose", "rdmacm-utils");
    let p = port(7);
    let ch = EventChannel::new().unwrap();
    let _listening = listener(&ch, PortSpace::Ib, v4(p));
    let mut client = Tool::spawn(
        &ucmatose,
        &[
            "-s",
            VM_V4,
            "-p",
            &p.to_string(),
            "-P",
            "ib",
            "-c",
            "4",
            "-C",
            "0",
        ],
    );
    serve(&ch, &mut client, 4, true);
    let out = client.wait(TOOL_DEADLINE);
    assert_clean(&out);
}

#[test]
fn udaddy_client_against_our_udp_listener() {
    require_device!();
    let udaddy = require_tool!("udaddy", "rdmacm-utils");
    let ch = EventChannel::new().unwrap();
    let listening = listener(&ch, PortSpace::Udp, v4(UDADDY_PORT));
    let n = N.to_string();
    let mut client = Tool::spawn(&udaddy, &["-s", VM_V4, "-c", &n, "-C", "0"]);
    let mut answered = Vec::new();
    let start = Instant::now();
    while answered.len() < N {
        assert!(
            start.elapsed() < TOOL_DEADLINE,
            "{} of {N} answered",
            answered.len()
        );
        let Some(mut ev) = ch.get_event_timeout(Duration::from_millis(200)).unwrap() else {
            if let Some(status) = client.try_status() {
                panic!(
                    "udaddy ended after {} of {N} requests: {status}",
                    answered.len()
                );
            }
            continue;
        };
        assert_eq!(ev.kind(), EventKind::ConnectRequest, "{ev:?}");
        assert!(ev.is_for(&listening));
        assert!(ev.ud_info().is_some(), "a UDP request has UD parameters");
        let mut id = ev.take_request().unwrap();
        drop(ev);
        id.create_qp(&QpInit::new()).unwrap();
        let id = id
            .accept_datagram(&ConnParam::new().private_data(b"evchan sidr"))
            .unwrap();
        answered.push(id);
    }
    let out = client.wait(TOOL_DEADLINE);
    assert_clean(&out);
    // No event follows a SIDR answer.
    assert!(ch
        .get_event_timeout(Duration::from_millis(200))
        .unwrap()
        .is_none());
}

#[test]
fn our_udp_client_against_udaddy_server() {
    require_device!();
    let udaddy = require_tool!("udaddy", "rdmacm-utils");
    let p = UDADDY_PORT;
    let n = N.to_string();
    let mut server = Tool::spawn(&udaddy, &["-b", VM_V4, "-c", &n, "-C", "0"]);
    let ch = EventChannel::new().unwrap();
    let check = |ev: &CmEvent<'_>| {
        let info = ev.ud_info().expect("UD parameters");
        assert_ne!(info.qp_num, 0, "the server's QP number");
        assert_eq!(info.qkey, RDMA_UDP_QKEY);
        assert!(
            info.ah_attr.global.is_some(),
            "RoCE address vectors are global"
        );
    };
    let (first, ev) = connect_when_listening(&ch, PortSpace::Udp, v4(p), &mut server);
    check(&ev);
    let (first, info) = first.established_datagram(&ev).unwrap();
    drop(ev);
    let mut done = vec![(first, info)];
    let param = ConnParam::new().private_data(b"evchan");
    let rest = connect_all(&ch, PortSpace::Udp, v4(p), N - 1, &param);
    done.extend(gather(&ch, rest, "ESTABLISHED", |id, ev| {
        check(ev);
        id.established_datagram(ev).unwrap()
    }));
    assert_eq!(done.len(), N);
    let out = server.wait(TOOL_DEADLINE);
    assert_clean(&out);
}

/// Runs natively: a missing tool is reported with the Debian package that has it.
#[test]
fn a_missing_tool_names_its_debian_package() {
    let err = support::tool::find("no-such-rdma-tool", "rdmacm-utils").unwrap_err();
    assert!(err.contains("`no-such-rdma-tool`"), "{err}");
    assert!(err.contains("apt-get install rdmacm-utils"), "{err}");
    assert!(support::tool::find("sh", "dash").is_ok());
}

/// Our passive side read by four threads at once (a non-blocking channel, as documented for
/// several readers) against cmtime's client: a request's new id is adopted by whichever thread
/// reads the request, its later events are read by any thread, and every event is counted
/// against the right id — the listener ends with nothing unacked and no destroy hangs.
#[test]
fn cmtime_client_against_our_listener_read_by_four_threads() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    require_device!();
    let cmtime = require_tool!("cmtime", "rdmacm-utils");
    const CONNS: usize = 32;
    let p = port(8);
    let ch = EventChannel::new().unwrap();
    ch.set_nonblocking(true).unwrap();
    let listening = listener(&ch, PortSpace::Tcp, v4(p));
    let ids: Mutex<HashMap<IdKey, AnyId<'_>>> = Mutex::new(HashMap::new());
    let log: Mutex<Vec<(IdKey, EventKind)>> = Mutex::new(Vec::new());
    let gone = AtomicUsize::new(0);
    let n = CONNS.to_string();
    let client = Tool::spawn(&cmtime, &["-s", VM_V4, "-p", &p.to_string(), "-c", &n]);
    let start = Instant::now();

    // The id of `key` out of the map once it is in state `S`. Several readers may handle one
    // id's events out of order (its ESTABLISHED and DISCONNECTED read by two threads at once),
    // so each waits for the state the previous event leads to.
    fn take<'ch, S: State>(
        ids: &Mutex<HashMap<IdKey, AnyId<'ch>>>,
        key: IdKey,
        start: Instant,
    ) -> AnyId<'ch> {
        loop {
            {
                let mut map = ids.lock().unwrap();
                if map.get(&key).is_some_and(AnyId::is::<S>) {
                    return map.remove(&key).unwrap();
                }
            }
            assert!(
                start.elapsed() < TOOL_DEADLINE,
                "{key:?} never reached {}",
                S::NAME
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while gone.load(Ordering::SeqCst) < CONNS {
                    assert!(
                        start.elapsed() < TOOL_DEADLINE,
                        "log: {:?}",
                        log.lock().unwrap()
                    );
                    let Some(mut ev) = ch.get_event_timeout(Duration::from_millis(100)).unwrap()
                    else {
                        continue;
                    };
                    assert!(ev.status().is_success(), "{ev:?}");
                    let key = ev.id();
                    log.lock().unwrap().push((key, ev.kind()));
                    let id = match ev.kind() {
                        EventKind::ConnectRequest => {
                            let mut id = ev.take_request().unwrap();
                            drop(ev);
                            id.create_qp(&QpInit::new()).unwrap();
                            id.accept(&ConnParam::new()).unwrap().erase()
                        }
                        EventKind::Established => {
                            let id = take::<Connecting>(&ids, key, start);
                            // At least this event (another thread may hold a later one).
                            assert!(
                                id.unacked_events() >= 1,
                                "ESTABLISHED counts against its id"
                            );
                            id.complete(&ev).unwrap()
                        }
                        EventKind::Disconnected => {
                            let id = take::<Connected>(&ids, key, start);
                            assert!(id.unacked_events() >= 1);
                            id.disconnect().unwrap()
                        }
                        EventKind::TimewaitExit => {
                            // The destroy is deferred to this event's ack.
                            drop(take::<Disconnected>(&ids, key, start));
                            gone.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        other => panic!("unexpected {other}: {ev:?}"),
                    };
                    ids.lock().unwrap().insert(key, id);
                }
            });
        }
    });
    assert_eq!(listening.unacked_events(), 0);
    assert!(ids.lock().unwrap().is_empty());
    let log = log.into_inner().unwrap();
    assert_eq!(log.len(), 4 * CONNS, "{log:?}");
    let out = client.wait(TOOL_DEADLINE);
    assert_clean(&out);
}
