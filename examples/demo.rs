//! A smoke run through the layers: an event channel, an id, address and route resolution.
//!
//! Run it with `cargo xtask demo` (in the soft-RoCE VM, or natively on a host with an RDMA
//! device). It resolves the VM's soft-RoCE address, 169.254.77.1 (override with the first
//! argument, an IP address that exists on one of this host's RDMA ports), and prints each event.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use evchan_core::cm::PortSpace;
use evchan_core::{CmEvent, CmId, EventChannel};

const TIMEOUT: Duration = Duration::from_secs(5);

const USAGE: &str = "usage: demo [IP]";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let ip: IpAddr = match (args.next(), args.next()) {
        (None, _) => Ipv4Addr::new(169, 254, 77, 1).into(),
        (Some(a), None) => match a.parse() {
            Ok(ip) => ip,
            Err(e) => {
                eprintln!("demo: the argument must be an IP address, not `{a}`: {e}\n{USAGE}");
                return ExitCode::from(2);
            }
        },
        (Some(_), Some(extra)) => {
            eprintln!("demo: unexpected argument `{extra}`\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(SocketAddr::new(ip, 7471)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(dst: SocketAddr) -> evchan_core::Result<()> {
    // rdma_create_event_channel: fails with a NoDevice error that says how to get a device.
    let channel = EventChannel::new()?;
    println!(
        "event channel: fd {}",
        std::os::fd::AsRawFd::as_raw_fd(&channel)
    );

    // rdma_create_id + rdma_resolve_addr; the id's state is in its type.
    let id = CmId::new(&channel, PortSpace::Tcp)?;
    let id = id.resolve_addr(None, dst, TIMEOUT)?;
    let event = next(&channel)?;
    let id = id.addr_resolved(&event)?; // checks that it is ADDR_RESOLVED, for this id
    event.ack(); // rdma_ack_cm_event (dropping the event would ack it too)
    println!(
        "  device {} port {}, {} -> {}",
        id.verbs().name(),
        id.port_num(),
        fmt_addr(id.local_addr()),
        fmt_addr(id.peer_addr()),
    );

    // rdma_resolve_route
    let id = id.resolve_route(TIMEOUT)?;
    let event = next(&channel)?;
    let id = id.route_resolved(&event)?;
    drop(event);

    // Dropping the id destroys it (rdma_destroy_id); the channel goes after it — the other
    // order does not compile.
    drop(id);
    drop(channel);
    println!("done: both events received and acked, id and channel destroyed");
    Ok(())
}

/// Reads the next event (rdma_get_cm_event) and prints it. Blocking is safe here: rdma_cm
/// always reports a resolution, as success or error, within the timeout given to it.
fn next(channel: &EventChannel) -> evchan_core::Result<CmEvent<'_>> {
    let event = channel.get_event()?;
    println!("event {:?} (status {:?})", event.kind(), event.status());
    Ok(event)
}

fn fmt_addr(a: Option<SocketAddr>) -> String {
    a.map_or_else(|| "?".to_owned(), |a| a.to_string())
}
