//! The handshakes besides an RC connect with an `rdma_create_qp` QP: a connect whose id has no
//! QP (`CONNECT_RESPONSE`, then `rdma_establish`), and UD service ID resolution (SIDR) for UDP
//! ids.

use super::param::ConnParam;
use super::state::{Connected, Connecting, Datagram, Requested};
use super::{Event, EventKind, Id, PortSpace, Transition, UdInfo};
use crate::error::{Error, Message};

impl<'ch> Id<'ch, Connecting> {
    /// `rdma_establish`: completes the connect of an id *without* a QP with its
    /// `CONNECT_RESPONSE` event.
    ///
    /// An id with no QP from [`Id::create_qp`] (its QP is one the caller manages, announced with
    /// [`ConnParam::qp_num`]) gets `CONNECT_RESPONSE` instead of `ESTABLISHED` when the peer
    /// accepts; the caller then readies its QP and calls this, which sends the RTU that gives the
    /// peer its `ESTABLISHED`. The event carries the peer's reply ([`Event::conn_info`],
    /// [`Event::private_data`]); read it before the ack.
    ///
    /// # Errors
    /// [`Error::UnexpectedEvent`] for any other event (an id with a QP gets `ESTABLISHED`: use
    /// [`Id::established`]); the OS error of the call. The id comes back.
    ///
    /// # References
    /// `rdma_establish(3)`.
    #[doc(alias = "rdma_establish")]
    #[doc(alias = "RDMA_CM_EVENT_CONNECT_RESPONSE")]
    pub fn establish(self, event: &Event<'_>) -> Transition<'ch, Connecting, Id<'ch, Connected>> {
        if let Err(e) = self.expect_event(event, EventKind::ConnectResponse) {
            return Err(self.fail(e));
        }
        self.run("rdma_establish", crate::ffi::cm::Id::establish)
    }

    /// Completes the connect of a UDP id (a SIDR request) with its `ESTABLISHED` event, and
    /// returns, with the id, the peer's UD parameters: QP number, QKey and address vector
    /// (`param.ud`). The peer's private data is in the event ([`Event::private_data`]).
    ///
    /// # Errors
    /// [`Error::WrongPortSpace`] for an id that is not UDP (use [`Id::established`]);
    /// [`Error::UnexpectedEvent`] for any other event (e.g. `UNREACHABLE` when nobody listens,
    /// `REJECTED`). The id comes back.
    #[doc(alias = "rdma_ud_param")]
    pub fn established_datagram(
        self,
        event: &Event<'_>,
    ) -> Transition<'ch, Connecting, (Id<'ch, Datagram>, UdInfo)> {
        if self.port_space() != PortSpace::Udp {
            let port_space = self.port_space();
            return Err(self.fail(Error::WrongPortSpace {
                call: "established_datagram",
                port_space,
                hint: "a connected id completes with `established` (or `establish`)",
            }));
        }
        if let Err(e) = self.expect_event(event, EventKind::Established) {
            return Err(self.fail(e));
        }
        match event.ud_info() {
            Some(info) => Ok((self.into_state(), info)),
            // librdmacm always fills `param.ud` for a UD id's ESTABLISHED.
            None => Err(self.fail(Error::os(
                "rdma_get_cm_event",
                std::io::Error::from_raw_os_error(libc::EPROTO),
            ))),
        }
    }
}

impl<'ch> Id<'ch, Requested> {
    /// `rdma_accept` of a UDP id's request (a SIDR REQ): answers it with a SIDR REP carrying the
    /// id's QP number (or [`ConnParam::qp_num`] without one), its QKey and `param`'s private data
    /// (at most 136 bytes). The call completes the exchange — no event follows on this side — so
    /// the id is in state [`Datagram`] at once.
    ///
    /// # Errors
    /// [`Error::WrongPortSpace`] for an id that is not UDP (use [`Id::accept`]) and
    /// [`Error::PrivateDataTooLong`], both before the call; the OS error. The id comes back.
    ///
    /// # References
    /// `rdma_accept(3)`.
    #[doc(alias = "rdma_accept")]
    pub fn accept_datagram(
        self,
        param: &ConnParam<'_>,
    ) -> Transition<'ch, Requested, Id<'ch, Datagram>> {
        let port_space = self.port_space();
        if port_space != PortSpace::Udp {
            return Err(self.fail(Error::WrongPortSpace {
                call: "accept_datagram",
                port_space,
                hint: "a connection request is accepted with `accept`",
            }));
        }
        self.send(Message::Accept, param.data(), "rdma_accept", |raw| {
            raw.accept(param.to_raw())
        })
    }
}
