//! The whole life of one connection on the synchronous core layer (`evchan-core`, no async
//! runtime), printing every rdma_cm event as it arrives.
//!
//! One event channel carries both sides: a listening id, and an active id that connects to
//! it in the same process. Events of both come in on that channel, so each is routed by the id
//! it is for ([`CmEvent::is_for`]); each id's state is in its type, and each transition checks
//! the event's kind, status and id.
//!
//! ```text
//! cargo build --example events
//! cargo xtask vm -- target/debug/examples/events        # or natively: events IP[:PORT]
//! ```
//!
//! The address (default 169.254.77.1:7472, the soft-RoCE VM's) must exist on an RDMA port.

use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use evchan_core::cm::{ConnParam, EventKind, IdKey, PortSpace};
use evchan_core::verbs::QpInit;
use evchan_core::{CmEvent, CmId, EventChannel};

const TIMEOUT: Duration = Duration::from_secs(5);

const USAGE: &str = "usage: events [IP[:PORT]]";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let addr = match (args.next(), args.next()) {
        (None, _) => SocketAddr::from(([169, 254, 77, 1], 7472)),
        (Some(a), None) => match a
            .parse()
            .or_else(|_| a.parse().map(|ip| SocketAddr::new(ip, 7472)))
        {
            // The client connects to the listener's port: 0 would be none.
            Ok(addr) if addr.port() == 0 => {
                eprintln!("events: the argument's port must not be 0\n{USAGE}");
                return ExitCode::from(2);
            }
            Ok(addr) => addr,
            Err(e) => {
                eprintln!("events: the argument must be IP or IP:PORT, not `{a}`: {e}\n{USAGE}");
                return ExitCode::from(2);
            }
        },
        (Some(_), Some(extra)) => {
            eprintln!("events: unexpected argument `{extra}`\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(addr) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("events: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Names the ids for the printout.
struct Log {
    start: Instant,
    names: Vec<(IdKey, &'static str)>,
}

impl Log {
    fn name(&self, key: IdKey) -> &'static str {
        self.names
            .iter()
            .find(|(k, _)| *k == key)
            .map_or("a new id", |(_, n)| n)
    }

    fn note(&self, what: &str) {
        println!("{:>9}  {what}", ms(self.start.elapsed()));
    }

    /// Waits for the next event on `channel` (rdma_get_cm_event, with a timeout) and prints it.
    fn next<'ch>(&self, channel: &'ch EventChannel) -> evchan_core::Result<CmEvent<'ch>> {
        let Some(event) = channel.get_event_timeout(TIMEOUT)? else {
            return Err(evchan_core::Error::Os {
                call: "rdma_get_cm_event",
                source: io::Error::new(io::ErrorKind::TimedOut, "no event within 5 s"),
            });
        };
        let whose = match event.listener() {
            // A CONNECT_REQUEST counts against the listener; it carries a new id.
            Some(listener) => format!("{} (a new id)", self.name(listener)),
            None => self.name(event.id()).to_owned(),
        };
        let data = event.private_data();
        let data = &data[..data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)];
        let data = if data.is_empty() {
            String::new()
        } else {
            format!(", private data {:?}", String::from_utf8_lossy(data))
        };
        println!(
            "{:>9}  {:<16} for {whose:<24} {}{data}",
            ms(self.start.elapsed()),
            event.kind().name(),
            event.status(),
        );
        Ok(event)
    }
}

fn run(addr: SocketAddr) -> evchan_core::Result<()> {
    let mut log = Log {
        start: Instant::now(),
        names: Vec::new(),
    };
    let channel = EventChannel::new()?; // rdma_create_event_channel
    log.note("event channel created (librdmacm's first call also opens the devices)");
    connection(&channel, addr, &mut log)?;
    // rdma_destroy_event_channel: after every id made on it (the other order does not
    // compile) and every event read from it.
    drop(channel);
    log.note("channel destroyed");
    Ok(())
}

/// One connection between two ids of `channel`, from listen to TIMEWAIT_EXIT.
fn connection(channel: &EventChannel, addr: SocketAddr, log: &mut Log) -> evchan_core::Result<()> {
    // The passive side: rdma_create_id, rdma_bind_addr, rdma_listen.
    let listener = CmId::new(channel, PortSpace::Tcp)?.bind(addr)?.listen(8)?;
    log.names.push((listener.key(), "the listener"));
    log.note(&format!("listening on {addr}"));

    // The active side: resolve the address, then the route; each event is checked by the
    // transition (kind, status, id) and acked when dropped.
    let client = CmId::new(channel, PortSpace::Tcp)?;
    log.names.push((client.key(), "the client"));
    let client = client.resolve_addr(None, addr, TIMEOUT)?;
    let event = log.next(channel)?;
    let client = client.addr_resolved(&event)?;
    drop(event); // rdma_ack_cm_event
    let client = client.resolve_route(TIMEOUT)?;
    let event = log.next(channel)?;
    let mut client = client.route_resolved(&event)?;
    event.ack(); // the same, explicitly
    client.create_qp(&QpInit::new())?; // rdma_create_qp on the id's device
    let client = client.connect(&ConnParam::new().private_data(b"hello"))?;
    log.note("the client connects (rdma_connect)");

    // The listener's CONNECT_REQUEST hands over a new id for the connection.
    let mut event = log.next(channel)?;
    if event.kind() != EventKind::ConnectRequest {
        // The client's REJECTED, UNREACHABLE or CONNECT_ERROR: its transition says which.
        return client.established(&event).map(drop).map_err(Into::into);
    }
    let mut server = event
        .take_request()
        .expect("a CONNECT_REQUEST carries its new id");
    event.ack(); // the new id does not depend on the event: it may outlive the ack
    log.names.push((server.key(), "the server"));
    server.create_qp(&QpInit::new())?;
    let server = server.accept(&ConnParam::new().private_data(b"welcome"))?;
    log.note("the server accepts (rdma_accept)");

    // ESTABLISHED on both sides, in whichever order they come: routed by id.
    let (mut client, mut server) = (Some(client), Some(server));
    let (mut client_up, mut server_up) = (None, None);
    while client_up.is_none() || server_up.is_none() {
        let event = log.next(channel)?;
        if let Some(c) = client.take_if(|c| event.is_for(c)) {
            client_up = Some(c.established(&event)?);
        } else if let Some(s) = server.take_if(|s| event.is_for(s)) {
            server_up = Some(s.established(&event)?);
        } else {
            log.note("(an event for no id of ours)");
        }
    }
    let (client, server) = (client_up.expect("up"), server_up.expect("up"));

    // The client disconnects (a DREQ); the server sees DISCONNECTED and answers with its own
    // rdma_disconnect (the DREP); then the client sees DISCONNECTED. Then each QP leaves
    // timewait (TIMEWAIT_EXIT).
    let client = client.disconnect()?;
    log.note("the client disconnects (rdma_disconnect)");
    let mut server = Some(server);
    let mut server_down = None;
    let (mut disconnected, mut timewait_exits) = (0, 0);
    while disconnected < 2 || timewait_exits < 2 {
        let event = log.next(channel)?;
        match event.kind() {
            EventKind::Disconnected => disconnected += 1,
            EventKind::TimewaitExit => timewait_exits += 1,
            _ => {}
        }
        if let Some(s) = server.take_if(|s| event.is_for(s)) {
            drop(event); // ack it, then answer
            server_down = Some(s.disconnect()?);
            log.note("the server disconnects (rdma_disconnect)");
        }
    }

    // rdma_destroy_id for each id (dropping does it; so would `destroy()`).
    drop((client, server_down, listener));
    log.note("ids destroyed");
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
