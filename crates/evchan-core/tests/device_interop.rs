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
//! - `rdma_server` / `rdma_client` (librdmacm/examples): one RC connection and one 16-byte
//!   message each way, the client first; our side on its own PD, CQ and completion channel
//!   ([`CmId::create_qp_with`], the owned-buffer posts, [`Cq::wait`]).
//! - `ucmatose` with messages: the server sends first, the client replies (with the same
//!   buffer it received into, so its replies echo the server's last message).
//!
//! The tools take only the IPv4 address (169.254.77.1), not `fe80::…%dummy0`.
#![forbid(unsafe_code)]

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use evchan_core::cm::state::{Connected, Connecting, Disconnected, State};
use evchan_core::cm::{AnyId, ConnParam, EventKind, IdKey, PortSpace};
use evchan_core::verbs::{Cq, QpInit, WcOpcode};
use evchan_core::{CmEvent, CmId, EventChannel};
use support::interop::*;
use support::tool::Tool;
use support::verbs::{complete, complete_all, objects};
use support::*;

/// Connections per run (TCG is slow; cmtime's default of 100 would work too).
const N: usize = 16;
/// Connections of the timed comparison with cmtime (SOFTROCE.md's C figures use 100 too).
const TIMING_N: usize = 100;
/// udaddy's port, fixed (its `-p` is the port space).
const UDADDY_PORT: u16 = 7174;

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
    let (probe, ev) = connect_when_listening(&ch, PortSpace::Tcp, v4(p), &mut server, librdmacm_qp);
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
    let (first, ev) = connect_when_listening(&ch, PortSpace::Tcp, v4(p), &mut server, librdmacm_qp);
    let mut connected = vec![first.established(&ev).unwrap()];
    drop(ev);
    let param = ConnParam::new().private_data(b"evchan");
    let rest = connect_all(&ch, PortSpace::Tcp, v4(p), N - 1, &param, librdmacm_qp);
    connected.extend(gather(&ch, rest, "ESTABLISHED", |id, ev| {
        id.established(ev).unwrap()
    }));
    // All N are up: the server disconnects each; we answer.
    let out = answer_disconnects(&ch, connected, server);
    assert!(out.stdout.contains("disconnected"), "{out}");
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
    let (first, ev) = connect_when_listening(&ch, PortSpace::Udp, v4(p), &mut server, librdmacm_qp);
    check(&ev);
    let (first, info) = first.established_datagram(&ev).unwrap();
    drop(ev);
    let mut done = vec![(first, info)];
    let param = ConnParam::new().private_data(b"evchan");
    let rest = connect_all(&ch, PortSpace::Udp, v4(p), N - 1, &param, librdmacm_qp);
    done.extend(gather(&ch, rest, "ESTABLISHED", |id, ev| {
        check(ev);
        id.established_datagram(ev).unwrap()
    }));
    assert_eq!(done.len(), N);
    let out = server.wait(TOOL_DEADLINE);
    assert_clean(&out);
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

/// rdma_client's and rdma_server's message: 16 bytes each way, from static buffers that are
/// never written (all zeros), received into 16-byte buffers.
const EXAMPLE_MSG: usize = 16;

/// rdma_server's protocol, from our side: connect with no private data, send 16 bytes, receive
/// its 16-byte reply (zeros), answer its disconnect. It exits 0 once its send completed.
#[test]
fn our_client_against_rdma_server() {
    require_device!();
    let tool = require_tool!("rdma_server", "rdmacm-utils");
    let p = port(9);
    let mut server = Tool::spawn(&tool, &["-s", VM_V4, "-p", &p.to_string()]);
    let ctx = vm_context();
    let (pd, comp) = objects(&ctx);
    let cq = Cq::new(&comp, 8).unwrap();
    let ch = EventChannel::new().unwrap();
    let (id, ev) = connect_when_listening(&ch, PortSpace::Tcp, v4(p), &mut server, |id| {
        id.create_qp_with(&pd, &cq, &cq, &QpInit::new()).unwrap();
    });
    // rdma_accept(id, NULL): no private data in the reply.
    assert!(ev.private_data().iter().all(|&b| b == 0), "{ev:?}");
    let id = id.established(&ev).unwrap();
    ev.ack();

    // It sends only once it has our message, so our receive may be posted now.
    let rx = post_rx(&id, &pd);
    let msg = *b"evchan to server";
    assert_eq!(msg.len(), EXAMPLE_MSG);
    let tx = post_tx(&id, &pd, &msg);
    // Its reply may come before our send's completion is read: one wait for both.
    let tx_id = tx.wr_id();
    for (mr, wc) in complete_all(&cq, vec![tx, rx]) {
        assert_eq!(wc.qp_num(), id.qp_num().unwrap());
        if wc.wr_id() == tx_id {
            sent(&wc);
            assert_eq!(mr.as_slice(), msg);
        } else {
            assert_eq!(received(&mr, &wc, EXAMPLE_MSG), [0; EXAMPLE_MSG]);
        }
    }

    // Its send completed: it disconnects, we answer, it exits 0.
    let ev = expect_event(&ch, EventKind::Disconnected);
    assert!(ev.is_for(&id));
    ev.ack();
    let id = id.disconnect().unwrap();
    let out = server.wait(TOOL_DEADLINE);
    assert_clean(&out);
    assert!(out.stdout.contains("rdma_server: end 0"), "{out}");
    // rxe gave its QP the 16 bytes of inline data it asks for: it sent inline.
    assert!(!out.stdout.contains("IBV_SEND_INLINE"), "{out}");
    let ev = expect_event(&ch, EventKind::TimewaitExit);
    assert!(ev.is_for(&id));
}

/// rdma_client's protocol, from our side: accept with no private data, receive its 16 bytes
/// (zeros), reply with 16, answer its disconnect. It exits 0 once it has our reply.
#[test]
fn rdma_client_against_our_listener() {
    require_device!();
    let tool = require_tool!("rdma_client", "rdmacm-utils");
    let p = port(10);
    let ctx = vm_context();
    let (pd, comp) = objects(&ctx);
    let cq = Cq::new(&comp, 8).unwrap();
    let ch = EventChannel::new().unwrap();
    let listening = listener(&ch, PortSpace::Tcp, v4(p));
    let client = Tool::spawn(&tool, &["-s", VM_V4, "-p", &p.to_string()]);

    let mut req = expect_event(&ch, EventKind::ConnectRequest);
    assert!(req.is_for(&listening));
    // rdma_connect(id, NULL): no private data (beyond the kernel's own header, consumed).
    assert!(req.private_data().iter().all(|&b| b == 0), "{req:?}");
    assert_ne!(req.conn_info().expect("RC parameters").qp_num, 0);
    let mut id = req.take_request().unwrap();
    req.ack();
    id.create_qp_with(&pd, &cq, &cq, &QpInit::new()).unwrap();
    // Posted before the accept: the client sends as soon as it is connected.
    let rx = post_rx(&id, &pd);
    let id = id.accept(&ConnParam::new()).unwrap();
    let ev = expect_event(&ch, EventKind::Established);
    let id = id.established(&ev).unwrap();
    ev.ack();

    let (mr, wc) = complete(&cq, rx);
    assert_eq!(received(&mr, &wc, EXAMPLE_MSG), [0; EXAMPLE_MSG]);
    let reply = *b"evchan to client";
    let (_, wc) = complete(&cq, post_tx(&id, &pd, &reply));
    sent(&wc);

    // With our reply in, it disconnects and exits 0.
    let ev = expect_event(&ch, EventKind::Disconnected);
    assert!(ev.is_for(&id));
    ev.ack();
    let _id = id.disconnect().unwrap();
    let out = client.wait(TOOL_DEADLINE);
    assert_clean(&out);
    assert!(out.stdout.contains("rdma_client: end 0"), "{out}");
    assert!(!out.stdout.contains("IBV_SEND_INLINE"), "{out}");
}

/// ucmatose's message exchange: connections, messages per connection, message size (`-c`,
/// `-C`, `-S`; its defaults for the last two).
const UCM_CONNS: usize = 4;
const UCM_MSGS: usize = 10;
const UCM_SIZE: usize = 100;

/// ucmatose's arguments for the exchange above, after `role` (`-s`/`-b`) and the address.
fn ucmatose_args(role: &'static str, p: &str) -> Vec<String> {
    let n = |v: usize| v.to_string();
    [role, VM_V4, "-p", p]
        .map(str::to_owned)
        .into_iter()
        .chain(["-c".into(), n(UCM_CONNS), "-C".into(), n(UCM_MSGS)])
        .chain(["-S".into(), n(UCM_SIZE)])
        .collect()
}

/// Our clients against ucmatose's server with messages: it sends `UCM_MSGS` to each
/// connection once all are up; each of ours then replies as many; it disconnects.
#[test]
fn our_clients_against_ucmatose_server_with_messages() {
    require_device!();
    let ucmatose = require_tool!("ucmatose", "rdmacm-utils");
    let p = port(11);
    let args = ucmatose_args("-b", &p.to_string());
    let mut server = Tool::spawn(
        &ucmatose,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let ctx = vm_context();
    let (pd, comp) = objects(&ctx);
    let cq = Cq::new(&comp, 4 * (UCM_CONNS * UCM_MSGS) as u32).unwrap();
    let ch = EventChannel::new().unwrap();
    let init = QpInit::new();

    // The first connection once it listens, its receives posted after: the server sends only
    // when all are up, and the others are not even started yet.
    let (first, ev) = connect_when_listening(&ch, PortSpace::Tcp, v4(p), &mut server, |id| {
        id.create_qp_with(&pd, &cq, &cq, &init).unwrap();
    });
    let first = first.established(&ev).unwrap();
    drop(ev);
    let mut rx: Vec<_> = (0..UCM_MSGS).map(|_| post_rx(&first, &pd)).collect();
    let rest = connect_all(
        &ch,
        PortSpace::Tcp,
        v4(p),
        UCM_CONNS - 1,
        &ConnParam::new(),
        |id| {
            id.create_qp_with(&pd, &cq, &cq, &init).unwrap();
            rx.extend((0..UCM_MSGS).map(|_| post_rx(id, &pd)));
        },
    );
    let mut ids = vec![first];
    ids.extend(gather(&ch, rest, "ESTABLISHED", |id, ev| {
        id.established(ev).unwrap()
    }));

    // Its messages: UCM_MSGS of UCM_SIZE bytes on every connection.
    let mut per_qp: HashMap<u32, usize> = HashMap::new();
    for (mr, wc) in complete_all(&cq, rx) {
        received(&mr, &wc, UCM_SIZE);
        *per_qp.entry(wc.qp_num()).or_default() += 1;
    }
    let want: HashMap<u32, usize> = ids
        .iter()
        .map(|id| (id.qp_num().unwrap(), UCM_MSGS))
        .collect();
    assert_eq!(per_qp, want);

    // Our replies, a pattern per connection.
    let mut tx = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let msg = [b'a' + i as u8; UCM_SIZE];
        tx.extend((0..UCM_MSGS).map(|_| post_tx(id, &pd, &msg)));
    }
    for (_, wc) in complete_all(&cq, tx) {
        sent(&wc);
    }

    // It has them all: it disconnects every connection, we answer, it exits 0.
    let out = answer_disconnects(&ch, ids, server);
    assert!(out.stdout.contains("data transfers complete"), "{out}");
    assert!(out.stdout.contains("return status 0"), "{out}");
}

/// ucmatose's clients against our listener with messages: once all are up we send
/// `UCM_MSGS` on each connection (a pattern per connection); each client replies as many
/// from the buffer it received into, so every reply is that connection's pattern; we
/// disconnect.
#[test]
fn ucmatose_clients_against_our_listener_with_messages() {
    require_device!();
    let ucmatose = require_tool!("ucmatose", "rdmacm-utils");
    let p = port(12);
    let ctx = vm_context();
    let (pd, comp) = objects(&ctx);
    let cq = Cq::new(&comp, 4 * (UCM_CONNS * UCM_MSGS) as u32).unwrap();
    let ch = EventChannel::new().unwrap();
    let listening = listener(&ch, PortSpace::Tcp, v4(p));
    let args = ucmatose_args("-s", &p.to_string());
    let client = Tool::spawn(
        &ucmatose,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );

    // Accept every request with UCM_MSGS receives posted; requests and ESTABLISHED events
    // interleave (its clients connect in parallel).
    let mut connecting: HashMap<IdKey, CmId<'_, Connecting>> = HashMap::new();
    let mut ids = Vec::new();
    let mut rx = Vec::new();
    while ids.len() < UCM_CONNS {
        let mut ev = next_event(&ch, "CONNECT_REQUEST or ESTABLISHED");
        assert!(ev.status().is_success(), "{ev:?}");
        match ev.kind() {
            EventKind::ConnectRequest => {
                assert!(ev.is_for(&listening));
                let mut id = ev.take_request().unwrap();
                drop(ev);
                id.create_qp_with(&pd, &cq, &cq, &QpInit::new()).unwrap();
                rx.extend((0..UCM_MSGS).map(|_| post_rx(&id, &pd)));
                connecting.insert(id.key(), id.accept(&ConnParam::new()).unwrap());
            }
            EventKind::Established => {
                let id = connecting
                    .remove(&ev.id())
                    .expect("ESTABLISHED of one of ours");
                ids.push(id.established(&ev).unwrap());
            }
            other => panic!("unexpected {other}: {ev:?}"),
        }
    }

    // We send first; the replies may come in while our sends complete: one wait for all.
    let pattern: HashMap<u32, u8> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.qp_num().unwrap(), b'A' + i as u8))
        .collect();
    let mut posted = rx;
    for id in &ids {
        let msg = [pattern[&id.qp_num().unwrap()]; UCM_SIZE];
        posted.extend((0..UCM_MSGS).map(|_| post_tx(id, &pd, &msg)));
    }
    let (mut sends, mut replies) = (0, HashMap::<u32, usize>::new());
    for (mr, wc) in complete_all(&cq, posted) {
        if wc.opcode() == Some(WcOpcode::Send) {
            sent(&wc);
            sends += 1;
            continue;
        }
        let bytes = received(&mr, &wc, UCM_SIZE);
        let want = pattern[&wc.qp_num()];
        assert!(
            bytes.iter().all(|&b| b == want),
            "reply on {wc:?}: {bytes:?}"
        );
        *replies.entry(wc.qp_num()).or_default() += 1;
    }
    assert_eq!(sends, UCM_CONNS * UCM_MSGS);
    assert_eq!(replies.len(), UCM_CONNS, "{replies:?}");
    assert!(replies.values().all(|&n| n == UCM_MSGS), "{replies:?}");

    // We disconnect; each client answers and it exits 0.
    let out = disconnect_all(&ch, ids, client);
    assert!(out.stdout.contains("data transfers complete"), "{out}");
    assert!(out.stdout.contains("return status 0"), "{out}");
}
