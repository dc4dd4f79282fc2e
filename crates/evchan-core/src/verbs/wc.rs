//! Work completions.

use crate::ffi::verbs::RawWc;

/// `IBV_WC_WITH_IMM`
const WITH_IMM: u32 = 2;

/// One work completion (`struct ibv_wc`), as polled from a [`Cq`](super::Cq).
///
/// Only [`Cq::poll`](super::Cq::poll) and the wait helpers make these, so a completion is
/// always real (which is what lets a [`Posted`](super::Posted) region come back for it).
///
/// On an error status, libibverbs defines only `wr_id`, `status`, `qp_num` and `vendor_err`;
/// [`opcode`](Self::opcode) is then `None`.
///
/// # Example
///
/// ```no_run
/// use evchan_core::verbs::{CompChannel, Context, Cq, WcStatus};
///
/// # fn main() -> Result<(), evchan_core::verbs::Error> {
/// # let ctx = Context::open_first()?;
/// # let channel = CompChannel::new(&ctx)?;
/// # let cq = Cq::new(&channel, 16)?;
/// let mut wcs = Vec::new();
/// cq.poll(&mut wcs, 16)?;
/// for wc in &wcs {
///     match wc.status() {
///         WcStatus::Success => println!("{} bytes in wr {}", wc.byte_len(), wc.wr_id()),
///         err => eprintln!("wr {} failed: {err:?}", wc.wr_id()),
///     }
/// }
/// # Ok(())
/// # }
/// ```
///
/// # References
///
/// [`ibv_poll_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_poll_cq.3.html)
#[doc(alias = "ibv_wc")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    pub(crate) raw: RawWc,
}

impl WorkCompletion {
    /// The work request id given when posting (`wr_id`).
    #[must_use]
    pub fn wr_id(&self) -> u64 {
        self.raw.wr_id
    }

    /// The status (`status`).
    #[must_use]
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.raw.status)
    }

    /// Whether the status is [`WcStatus::Success`].
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.raw.status == 0
    }

    /// What completed (`opcode`); `None` on an error status, where the field is undefined.
    #[must_use]
    pub fn opcode(&self) -> Option<WcOpcode> {
        self.is_success()
            .then(|| WcOpcode::from_raw(self.raw.opcode))
    }

    /// Bytes received (`byte_len`; meaningful for receives).
    #[must_use]
    pub fn byte_len(&self) -> u32 {
        self.raw.byte_len
    }

    /// The immediate data, in host order, when the completion carries one
    /// (`wc_flags & IBV_WC_WITH_IMM`).
    #[must_use]
    pub fn imm_data(&self) -> Option<u32> {
        (self.is_success() && self.raw.wc_flags & WITH_IMM != 0)
            .then(|| u32::from_be(self.raw.imm_or_rkey))
    }

    /// The local QP number the work request belonged to (`qp_num`).
    #[must_use]
    pub fn qp_num(&self) -> u32 {
        self.raw.qp_num
    }

    /// The remote QP number (`src_qp`; UD receives).
    #[must_use]
    pub fn src_qp(&self) -> u32 {
        self.raw.src_qp
    }

    /// The vendor's error code (`vendor_err`), meaningful on an error status.
    #[must_use]
    pub fn vendor_err(&self) -> u32 {
        self.raw.vendor_err
    }

    /// The raw `wc_flags`.
    #[must_use]
    pub fn wc_flags(&self) -> u32 {
        self.raw.wc_flags
    }
}

macro_rules! c_enum {
    (
        $(#[$m:meta])* pub enum $name:ident {
            $($(#[doc = $d:literal])* $c:literal => $var:ident,)*
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $($(#[doc = $d])* $var,)*
            /// A value this crate does not know (a newer library or driver).
            Unknown(u32),
        }

        impl $name {
            /// From the C value; unknown values become `Unknown`.
            #[must_use]
            pub fn from_raw(v: u32) -> Self {
                match v {
                    $($c => $name::$var,)*
                    v => $name::Unknown(v),
                }
            }

            /// The C value.
            #[must_use]
            pub fn to_raw(self) -> u32 {
                match self {
                    $($name::$var => $c,)*
                    $name::Unknown(v) => v,
                }
            }
        }
    };
}

c_enum! {
    /// Completion status (`enum ibv_wc_status`).
    #[doc(alias = "ibv_wc_status")]
    pub enum WcStatus {
        /// `IBV_WC_SUCCESS`
        0 => Success,
        /// `IBV_WC_LOC_LEN_ERR`: e.g. a receive buffer too small for the message.
        1 => LocalLength,
        /// `IBV_WC_LOC_QP_OP_ERR`
        2 => LocalQpOperation,
        /// `IBV_WC_LOC_EEC_OP_ERR`
        3 => LocalEecOperation,
        /// `IBV_WC_LOC_PROT_ERR`: the memory is not registered (any more) for this access.
        4 => LocalProtection,
        /// `IBV_WC_WR_FLUSH_ERR`: flushed because the QP entered the error state.
        5 => WrFlush,
        /// `IBV_WC_MW_BIND_ERR`
        6 => MwBind,
        /// `IBV_WC_BAD_RESP_ERR`
        7 => BadResponse,
        /// `IBV_WC_LOC_ACCESS_ERR`
        8 => LocalAccess,
        /// `IBV_WC_REM_INV_REQ_ERR`: the responder found the request invalid (e.g. too long).
        9 => RemoteInvalidRequest,
        /// `IBV_WC_REM_ACCESS_ERR`
        10 => RemoteAccess,
        /// `IBV_WC_REM_OP_ERR`
        11 => RemoteOperation,
        /// `IBV_WC_RETRY_EXC_ERR`: no answer from the remote QP (e.g. it was destroyed).
        12 => RetryExceeded,
        /// `IBV_WC_RNR_RETRY_EXC_ERR`: the remote QP had no receive posted.
        13 => RnrRetryExceeded,
        /// `IBV_WC_LOC_RDD_VIOL_ERR`
        14 => LocalRddViolation,
        /// `IBV_WC_REM_INV_RD_REQ_ERR`
        15 => RemoteInvalidRdRequest,
        /// `IBV_WC_REM_ABORT_ERR`
        16 => RemoteAbort,
        /// `IBV_WC_INV_EECN_ERR`
        17 => InvalidEecn,
        /// `IBV_WC_INV_EEC_STATE_ERR`
        18 => InvalidEecState,
        /// `IBV_WC_FATAL_ERR`
        19 => Fatal,
        /// `IBV_WC_RESP_TIMEOUT_ERR`
        20 => ResponseTimeout,
        /// `IBV_WC_GENERAL_ERR`
        21 => General,
        /// `IBV_WC_TM_ERR`
        22 => TagMatching,
        /// `IBV_WC_TM_RNDV_INCOMPLETE`
        23 => TagMatchingRndvIncomplete,
    }
}

c_enum! {
    /// What a completion completed (`enum ibv_wc_opcode`).
    #[doc(alias = "ibv_wc_opcode")]
    pub enum WcOpcode {
        /// `IBV_WC_SEND`
        0 => Send,
        /// `IBV_WC_RDMA_WRITE`
        1 => RdmaWrite,
        /// `IBV_WC_RDMA_READ`
        2 => RdmaRead,
        /// `IBV_WC_COMP_SWAP`
        3 => CompareSwap,
        /// `IBV_WC_FETCH_ADD`
        4 => FetchAdd,
        /// `IBV_WC_BIND_MW`
        5 => BindMw,
        /// `IBV_WC_LOCAL_INV`
        6 => LocalInvalidate,
        /// `IBV_WC_TSO`
        7 => Tso,
        /// `IBV_WC_ATOMIC_WRITE`
        9 => AtomicWrite,
        /// `IBV_WC_RECV`
        128 => Recv,
        /// `IBV_WC_RECV_RDMA_WITH_IMM`
        129 => RecvRdmaWithImm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(status: u32, opcode: u32, flags: u32, imm: u32) -> WorkCompletion {
        WorkCompletion {
            raw: RawWc {
                wr_id: 7,
                status,
                opcode,
                byte_len: 5,
                imm_or_rkey: imm,
                qp_num: 9,
                wc_flags: flags,
                ..RawWc::default()
            },
        }
    }

    #[test]
    fn status_round_trips_and_unknown_is_a_value() {
        for v in 0..=40 {
            assert_eq!(WcStatus::from_raw(v).to_raw(), v);
        }
        assert_eq!(WcStatus::from_raw(1), WcStatus::LocalLength);
        assert_eq!(WcStatus::from_raw(12), WcStatus::RetryExceeded);
        assert_eq!(WcStatus::from_raw(999), WcStatus::Unknown(999));
        assert_eq!(WcOpcode::from_raw(128), WcOpcode::Recv);
        assert_eq!(WcOpcode::from_raw(8), WcOpcode::Unknown(8));
        assert_eq!(WcOpcode::from_raw(u32::MAX).to_raw(), u32::MAX);
    }

    #[test]
    fn fields_undefined_on_error_are_hidden() {
        let ok = wc(0, 128, WITH_IMM, 0x1234_5678u32.to_be());
        assert_eq!(ok.opcode(), Some(WcOpcode::Recv));
        assert_eq!(ok.imm_data(), Some(0x1234_5678));
        assert_eq!((ok.wr_id(), ok.qp_num(), ok.byte_len()), (7, 9, 5));
        let err = wc(5, 128, WITH_IMM, 1);
        assert_eq!(err.status(), WcStatus::WrFlush);
        assert_eq!(err.opcode(), None);
        assert_eq!(err.imm_data(), None);
        assert_eq!(wc(0, 0, 0, 1).imm_data(), None);
    }
}
