//! A connection's setup as the shards make it: the connection parameters, the slot and queue
//! sizes a [`Config`] gives, and rdma_cm's failure events as this crate's [`Error`]s.

use std::io;

use evchan_core::cm::{ConnParam, RejectReason, Status};
use evchan_core::verbs::{QpInit, WcStatus};
use evchan_core::CmEvent;

use crate::config::Config;
use crate::error::{Error, Lost, Step};
use crate::proto::{self, Handshake, Peer, ProtocolError};

impl Config {
    /// The handshake this side sends: its first data receives, its most, its control
    /// receives and their size.
    pub(crate) fn handshake(&self) -> Handshake {
        Handshake {
            initial: self.recv_initial.min(self.recv_depth),
            data_slots: self.recv_depth,
            ctrl_slots: self.ctrl_slots,
            max_message: self.max_message,
        }
    }

    /// A connection's QP: `send_depth` data sends and `recv_depth` data receives, each with
    /// `ctrl_slots` more for control messages.
    pub(crate) fn qp_init(&self) -> QpInit {
        let ctrl = u32::from(self.ctrl_slots);
        QpInit::new()
            .max_send_wr(self.send_depth + ctrl)
            .max_recv_wr(self.recv_depth + ctrl)
            .max_sge(1)
    }

    /// The receives a connection posts before it connects or accepts: the handshake's
    /// initial data receives and the control receives.
    pub(crate) fn first_recvs(&self) -> u32 {
        self.handshake().initial + u32::from(self.ctrl_slots)
    }

    /// The receives kept posted toward a plain librdmacm peer (no credits of ours).
    pub(crate) fn plain_recvs(&self) -> u32 {
        self.recv_depth + u32::from(self.ctrl_slots)
    }
}

/// The RDMA READs and atomics a connection takes (as target) and issues at once, at most: a
/// window of READs in flight, as perftest's `ib_read_bw` keeps, at a small cost per QP in the
/// device (rdma_rxe keeps a responder record per READ in flight).
pub(crate) const READ_DEPTH: u8 = 16;

/// [`READ_DEPTH`] within a device's limits ([`evchan_core::verbs::Context::max_reads`]), 1 if
/// they cannot be read.
pub(crate) fn read_depth(ctx: &evchan_core::verbs::Context) -> u8 {
    ctx.max_reads().map_or(1, |(responder, initiator)| {
        READ_DEPTH.min(responder).min(initiator).max(1)
    })
}

/// The connection parameters of both sides: `wire` as private data, RNR retried without
/// end, as plain librdmacm programs expect (evchan peers never cause an RNR: credits), the
/// transport's retries (`Config::retry_count`; the IB CM takes the connecting side's for both),
/// and `reads` READs and atomics taken and issued at once (librdmacm keeps the QP's issuing
/// depth within what the peer's reply or request grants).
pub(crate) fn conn_param(wire: &[u8], retry_count: u8, reads: u8) -> ConnParam<'_> {
    ConnParam::new()
        .private_data(wire)
        .rnr_retry_count(7)
        .retry_count(retry_count)
        .responder_resources(reads)
        .initiator_depth(reads)
}

/// `ADDR_ERROR` / `ROUTE_ERROR` (and their timeouts) of `step`.
pub(crate) fn status_error(step: Step, status: Status) -> Error {
    match status.io_error() {
        Some(e) if e.raw_os_error() == Some(libc_etimedout()) => Error::TimedOut(step),
        Some(source) => Error::Resolve { step, source },
        None => Error::Resolve {
            step,
            source: io::Error::other(status.to_string()),
        },
    }
}

/// An immediate failure of `rdma_resolve_addr` / `rdma_resolve_route` (e.g. `ENETUNREACH`).
pub(crate) fn resolve_failed(step: Step, e: evchan_core::Error) -> Error {
    match e {
        evchan_core::Error::Os { source, .. } => Error::Resolve { step, source },
        e => e.into(),
    }
}

/// `REJECTED`: its reason and the user's part of its private data.
pub(crate) fn rejected(event: &CmEvent<'_>) -> Error {
    let private_data = match proto::decode(event.private_data()) {
        Ok(Peer::Evchan(_, user)) => user,
        _ => trim_zeros(event.private_data()),
    };
    Error::Rejected {
        reason: event
            .status()
            .reject_reason()
            .unwrap_or(RejectReason(event.raw_status())),
        busy: crate::Busy::from_private_data(&private_data),
        private_data,
    }
}

/// `UNREACHABLE`: a timeout of the connect, or the peer unreachable.
pub(crate) fn unreachable(status: Status) -> Error {
    match status.io_error() {
        Some(e) if e.raw_os_error() == Some(libc_etimedout()) => Error::TimedOut(Step::Connect),
        _ => Error::Unreachable(status.to_string()),
    }
}

fn libc_etimedout() -> i32 {
    io::Error::from(io::ErrorKind::TimedOut)
        .raw_os_error()
        .unwrap_or(110)
}

/// The padding RoCE adds to private data, taken off a plain peer's reject data.
fn trim_zeros(data: &[u8]) -> Vec<u8> {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    data[..end].to_vec()
}

/// Why a failed work request (a receive when `recv`) ends its connection. A receive that fails
/// with a local length error held a message above this side's maximum `max`, which an evchan
/// peer never sends.
pub(crate) fn wc_failure(recv: bool, status: WcStatus, max: u32) -> Lost {
    match (recv, status) {
        (true, WcStatus::LocalLength) => Lost::Protocol(ProtocolError::Overrun { max }),
        _ => Lost::WorkCompletion(status),
    }
}
