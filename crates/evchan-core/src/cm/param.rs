//! Port spaces, connection parameters and private-data limits.

use crate::error::{Message, PrivateDataTooLong};
use crate::ffi::cm::ConnParamRaw;
use evchan_sys::rdma_port_space as ps;

/// The port space of an id: `enum rdma_port_space`.
#[doc(alias = "rdma_port_space")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC QPs), IP addressing.
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagrams (UD QPs), IP addressing.
    Udp,
    /// `RDMA_PS_IB`: any QP type, no rdma_cm header in the private data.
    Ib,
    /// A port space this crate does not know, as its code.
    Other(u32),
}

impl PortSpace {
    /// The C code.
    #[must_use]
    pub fn code(self) -> u32 {
        match self {
            Self::Tcp => ps::RDMA_PS_TCP,
            Self::Udp => ps::RDMA_PS_UDP,
            Self::Ib => ps::RDMA_PS_IB,
            Self::Other(c) => c,
        }
    }

    /// The port space of C code `code`.
    #[must_use]
    pub fn from_code(code: u32) -> Self {
        match code {
            ps::RDMA_PS_TCP => Self::Tcp,
            ps::RDMA_PS_UDP => Self::Udp,
            ps::RDMA_PS_IB => Self::Ib,
            c => Self::Other(c),
        }
    }

    /// The most private data `message` carries in this port space on RoCE and InfiniBand: the
    /// IB CM message's private data less the 36-byte rdma_cm header of the IP port spaces.
    ///
    /// | port space | connect | accept | reject |
    /// |---|---|---|---|
    /// | TCP | 56 | 196 | 148 |
    /// | UDP | 180 | 136 | 136 |
    /// | IB | 92 | 196 | 148 |
    #[must_use]
    pub fn private_data_limit(self, message: Message) -> usize {
        match (self, message) {
            (Self::Udp, Message::Connect) => 180,
            (Self::Udp, Message::Accept | Message::Reject) => 136,
            (Self::Tcp, Message::Connect) => 56,
            (Self::Ib | Self::Other(_), Message::Connect) => 92,
            (_, Message::Accept) => 196,
            (_, Message::Reject) => 148,
        }
    }
}

/// Checks `data` against the limit of `message` in `ps`.
pub(crate) fn check_private_data(
    ps: PortSpace,
    message: Message,
    data: &[u8],
) -> Result<(), PrivateDataTooLong> {
    let max = ps.private_data_limit(message);
    if data.len() > max {
        return Err(PrivateDataTooLong {
            message,
            port_space: ps,
            len: data.len(),
            max,
        });
    }
    Ok(())
}

/// Connection parameters for `rdma_connect` / `rdma_accept` (`struct rdma_conn_param`).
///
/// The defaults are those of rdma-core's examples: one outstanding RDMA read each way, seven
/// retries, seven RNR retries. The QP number is taken from the id's QP.
///
/// ```
/// use evchan_core::cm::ConnParam;
/// let p = ConnParam::new().private_data(b"hello").retry_count(5);
/// assert_eq!(p.data(), b"hello");
/// ```
#[doc(alias = "rdma_conn_param")]
#[derive(Debug, Clone, Copy)]
pub struct ConnParam<'a> {
    raw: ConnParamRaw<'a>,
}

impl Default for ConnParam<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> ConnParam<'a> {
    /// The defaults: no private data, responder resources 1, initiator depth 1, retry count 7,
    /// RNR retry count 7.
    #[must_use]
    pub fn new() -> Self {
        Self {
            raw: ConnParamRaw {
                private_data: &[],
                responder_resources: 1,
                initiator_depth: 1,
                flow_control: 1,
                retry_count: 7,
                rnr_retry_count: 7,
                srq: false,
                qp_num: 0,
            },
        }
    }

    /// `private_data`: sent with the request or reply; limited per port space (see
    /// [`PortSpace::private_data_limit`]).
    #[must_use]
    pub fn private_data(mut self, data: &'a [u8]) -> Self {
        self.raw.private_data = data;
        self
    }

    /// `responder_resources`.
    #[must_use]
    pub fn responder_resources(mut self, n: u8) -> Self {
        self.raw.responder_resources = n;
        self
    }

    /// `initiator_depth`.
    #[must_use]
    pub fn initiator_depth(mut self, n: u8) -> Self {
        self.raw.initiator_depth = n;
        self
    }

    /// `retry_count` (0–7).
    #[must_use]
    pub fn retry_count(mut self, n: u8) -> Self {
        self.raw.retry_count = n.min(7);
        self
    }

    /// `rnr_retry_count` (0–7; 7 retries forever).
    #[must_use]
    pub fn rnr_retry_count(mut self, n: u8) -> Self {
        self.raw.rnr_retry_count = n.min(7);
        self
    }

    /// The private data set.
    #[must_use]
    pub fn data(&self) -> &'a [u8] {
        self.raw.private_data
    }

    pub(crate) fn to_raw(self) -> ConnParamRaw<'a> {
        self.raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_port_space() {
        use Message::*;
        let t = |ps: PortSpace| [Connect, Accept, Reject].map(|m| ps.private_data_limit(m));
        assert_eq!(t(PortSpace::Tcp), [56, 196, 148]);
        assert_eq!(t(PortSpace::Udp), [180, 136, 136]);
        assert_eq!(t(PortSpace::Ib), [92, 196, 148]);
    }

    #[test]
    fn check_accepts_the_limit_and_refuses_one_more() {
        for (ps, m, max) in [
            (PortSpace::Tcp, Message::Connect, 56),
            (PortSpace::Tcp, Message::Accept, 196),
            (PortSpace::Tcp, Message::Reject, 148),
            (PortSpace::Udp, Message::Connect, 180),
            (PortSpace::Udp, Message::Accept, 136),
        ] {
            assert!(check_private_data(ps, m, &vec![0; max]).is_ok());
            let e = check_private_data(ps, m, &vec![0; max + 1]).unwrap_err();
            assert_eq!(
                (e.len, e.max, e.message, e.port_space),
                (max + 1, max, m, ps)
            );
        }
    }

    #[test]
    fn port_space_codes_round_trip() {
        for ps in [
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ib,
            PortSpace::Other(2),
        ] {
            assert_eq!(PortSpace::from_code(ps.code()), ps);
        }
    }

    #[test]
    fn conn_param_builder() {
        let p = ConnParam::new()
            .private_data(b"abc")
            .retry_count(9)
            .initiator_depth(4);
        let r = p.to_raw();
        assert_eq!(r.private_data, b"abc");
        assert_eq!(r.retry_count, 7);
        assert_eq!(r.initiator_depth, 4);
    }
}
