//! A peer made with evchan-core alone, blocking (run it in `spawn_blocking`): address and
//! route resolution and a connect with any private data.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use evchan_core::cm::state::{RouteResolved, State};
use evchan_core::cm::{ConnParam, EventKind, PortSpace};
use evchan_core::{CmEvent, CmId, EventChannel};

/// How long each of the peer's events may take.
pub const EVENT: Duration = Duration::from_secs(30);

/// The next event of `id` on `ch` (others are acked and dropped).
pub fn event_for<'ch, S: State>(ch: &'ch EventChannel, id: &CmId<'ch, S>) -> CmEvent<'ch> {
    let start = Instant::now();
    loop {
        let left = EVENT
            .checked_sub(start.elapsed())
            .expect("the hostile peer's event within 30 s");
        let ev = ch
            .get_event_timeout(left)
            .unwrap()
            .expect("the hostile peer's event within 30 s");
        if ev.is_for(id) {
            return ev;
        }
        ev.ack();
    }
}

/// A TCP id on `ch` with its address and route to `addr` resolved.
pub fn routed(ch: &EventChannel, addr: SocketAddr) -> CmId<'_, RouteResolved> {
    let id = CmId::new(ch, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, addr, EVENT)
        .map_err(|e| e.error)
        .unwrap();
    let ev = event_for(ch, &id);
    let id = id.addr_resolved(&ev).map_err(|e| e.error).unwrap();
    ev.ack();
    let id = id.resolve_route(EVENT).map_err(|e| e.error).unwrap();
    let ev = event_for(ch, &id);
    let id = id.route_resolved(&ev).map_err(|e| e.error).unwrap();
    ev.ack();
    id
}

/// What a connect without a QP came to: the event's kind, status and private data.
pub fn connect_only(addr: SocketAddr, private_data: &[u8]) -> (EventKind, i32, Vec<u8>) {
    let ch = EventChannel::new().unwrap();
    let id = routed(&ch, addr);
    let id = id
        .connect(&ConnParam::new().private_data(private_data))
        .map_err(|e| e.error)
        .unwrap();
    let ev = event_for(&ch, &id);
    let out = (ev.kind(), ev.raw_status(), ev.private_data().to_vec());
    ev.ack();
    out
}
