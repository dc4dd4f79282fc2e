//! Queue pairs and posting work requests.

use std::fmt;
use std::io;
use std::ops::Range;

use crate::ffi::verbs as ffi;

use super::{Cq, Error, Gid, Mr, MrBuffer, Mtu, Pd, PostError, QpInit, Result, WorkCompletion};

/// `IBV_QPT_RC`
const QPT_RC: u32 = 2;

// `enum ibv_qp_attr_mask`
const QP_STATE: i32 = 1;
const QP_ACCESS_FLAGS: i32 = 8;
const QP_PKEY_INDEX: i32 = 16;
const QP_PORT: i32 = 32;
const QP_AV: i32 = 128;
const QP_PATH_MTU: i32 = 256;
const QP_TIMEOUT: i32 = 512;
const QP_RETRY_CNT: i32 = 1024;
const QP_RNR_RETRY: i32 = 2048;
const QP_RQ_PSN: i32 = 4096;
const QP_MAX_QP_RD_ATOMIC: i32 = 8192;
const QP_MIN_RNR_TIMER: i32 = 32768;
const QP_SQ_PSN: i32 = 65536;
const QP_MAX_DEST_RD_ATOMIC: i32 = 131_072;
const QP_DEST_QPN: i32 = 1_048_576;

/// Work queue sizes of a new QP (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather elements per send.
    pub max_send_sge: u32,
    /// Scatter/gather elements per receive.
    pub max_recv_sge: u32,
    /// Bytes that may be sent inline.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// QP state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QpState {
    /// `IBV_QPS_RESET`
    Reset,
    /// `IBV_QPS_INIT`
    Init,
    /// `IBV_QPS_RTR`: ready to receive.
    Rtr,
    /// `IBV_QPS_RTS`: ready to send.
    Rts,
    /// `IBV_QPS_SQD`
    Sqd,
    /// `IBV_QPS_SQE`
    Sqe,
    /// `IBV_QPS_ERR`
    Error,
    /// A value this crate does not know.
    Unknown(u32),
}

impl QpState {
    fn from_raw(v: u32) -> Self {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Error,
            v => QpState::Unknown(v),
        }
    }
}

/// What INIT → RTR needs: the remote QP and the route to it (RoCE: a global route by GID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttr {
    /// The local port (1-based).
    pub port: u8,
    /// The remote QP number.
    pub dest_qp_num: u32,
    /// The first packet sequence number expected from the remote side (24 bits).
    pub rq_psn: u32,
    /// The remote GID (for RoCE, the remote interface address).
    pub dgid: [u8; 16],
    /// Index of the local GID to send from ([`Gid::index`]; at most 255).
    pub sgid_index: u32,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Minimal RNR NAK timer code (`min_rnr_timer`, 0..=31).
    pub min_rnr_timer: u8,
}

impl RtrAttr {
    /// A route to `dest_qp_num` at `dgid`, sent from local GID `sgid`, with PSN 0,
    /// MTU 1024 and an RNR timer of 12 (0.64 ms).
    #[must_use]
    pub fn new(port: u8, dest_qp_num: u32, sgid: &Gid, dgid: [u8; 16]) -> Self {
        RtrAttr {
            port,
            dest_qp_num,
            rq_psn: 0,
            dgid,
            sgid_index: sgid.index,
            path_mtu: Mtu::Mtu1024,
            min_rnr_timer: 12,
        }
    }
}

/// What RTR → RTS needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// The first packet sequence number sent (24 bits).
    pub sq_psn: u32,
    /// Local ACK timeout code: 4.096 µs × 2^`timeout` (0 = infinite).
    pub timeout: u8,
    /// Retries on timeout (0..=7).
    pub retry_cnt: u8,
    /// Retries on RNR NAK (0..=7; 7 = infinite).
    pub rnr_retry: u8,
}

impl Default for RtsAttr {
    fn default() -> Self {
        RtsAttr {
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

/// A reliable-connected queue pair (`ibv_create_qp` / `ibv_destroy_qp`).
///
/// It borrows its [`Pd`] and both [`Cq`]s, so neither can be destroyed before it
/// (`ibv_destroy_cq` and `ibv_dealloc_pd` would fail with `EBUSY`).
///
/// Work requests come in two forms:
/// - safe, owned: [`post_send`](Self::post_send) / [`post_recv`](Self::post_recv) take an [`Mr`]
///   by value and return a [`Posted`] that gives it back only for this request's completion;
/// - raw: [`post_send_raw`](Self::post_send_raw) / [`post_recv_raw`](Self::post_recv_raw) take
///   [`Sge`](super::Sge)s and are `unsafe`: the caller keeps the memory alive and untouched until the
///   completion.
///
/// Dropping it destroys it (`ibv_destroy_qp`). A destroyed QP owes no completion for the work
/// requests still posted on it, so their [`Posted`]s keep their regions. Whether the QP's completions already in
/// its CQs survive the destroy is the provider's choice: rdma-core's mlx5 provider removes them,
/// rxe (Linux 6.1) leaves them to be polled. Reap what you need before the drop.
///
/// # Example
///
/// ```no_run
/// use evchan_core::verbs::{CompChannel, Context, Cq, Pd, Qp, QpCaps, RtrAttr, RtsAttr};
///
/// # fn main() -> Result<(), evchan_core::verbs::Error> {
/// let ctx = Context::open_first()?;
/// let pd = Pd::new(&ctx)?;
/// let channel = CompChannel::new(&ctx)?;
/// let cq = Cq::new(&channel, 256)?;
/// let (a, b) = (Qp::new_rc(&pd, &cq, &cq, QpCaps::default())?,
///               Qp::new_rc(&pd, &cq, &cq, QpCaps::default())?);
/// let gid = ctx.gids(1)?.into_iter().last().expect("a GID");
/// for (qp, peer) in [(&a, &b), (&b, &a)] {
///     qp.modify_to_init(1)?;
///     qp.modify_to_rtr(&RtrAttr::new(1, peer.qp_num(), &gid, gid.raw))?;
///     qp.modify_to_rts(&RtsAttr::default())?;
/// }
/// let rx = b.post_recv(pd.reg_mr(vec![0u8; 64])?, 0..64).map_err(|e| e.source).unwrap();
/// let tx = a.post_send(pd.reg_mr(b"hello".to_vec())?, 0..5, None).map_err(|e| e.source).unwrap();
/// let (mut rx, mut tx) = (Some(rx), Some(tx));
/// while rx.is_some() || tx.is_some() {
///     cq.wait(None, |wc| {
///         if let Some(p) = rx.take() {
///             match p.complete(&wc) {
///                 Ok(mr) => println!("received {:?}", &mr.as_slice()[..wc.byte_len() as usize]),
///                 Err(p) => rx = Some(p),
///             }
///         }
///         if let Some(p) = tx.take() {
///             tx = p.complete(&wc).err();
///         }
///     })?;
/// }
/// # Ok(())
/// # }
/// ```
///
/// # References
///
/// [`ibv_create_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp.3.html),
/// [`ibv_modify_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_qp.3.html),
/// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html),
/// [`ibv_post_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html)
#[doc(alias = "ibv_qp")]
#[doc(alias = "ibv_create_qp")]
#[doc(alias = "ibv_destroy_qp")]
pub struct Qp<'res> {
    raw: ffi::Qp<'res>,
}

impl<'res> Qp<'res> {
    /// `ibv_create_qp` of an RC QP on `pd`, completing sends on `send_cq` and receives on
    /// `recv_cq` (which may be the same CQ). Sends are signaled unless asked otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the PD and the CQs are not all of one
    /// [`Context`](super::Context) (each is its own open of a device, with its own kernel
    /// handles; the call is not made); [`Error::Io`] with the `ibv_create_qp` error (e.g.
    /// `EINVAL` for caps past the device's).
    #[doc(alias = "ibv_create_qp")]
    pub fn new_rc(
        pd: &'res Pd<'_>,
        send_cq: &'res Cq<'_>,
        recv_cq: &'res Cq<'_>,
        caps: QpCaps,
    ) -> Result<Self> {
        // The same capacities an rdma_cm id's QP gets from these caps.
        let caps = QpInit::from(caps).caps();
        if !ffi::same_context(&pd.raw, &send_cq.raw, &recv_cq.raw) {
            return Err(Error::InvalidArgument(
                "the PD and the CQs belong to different device contexts (make them on one `Context`)",
            ));
        }
        Ok(Qp {
            raw: ffi::Qp::new(&pd.raw, &send_cq.raw, &recv_cq.raw, QPT_RC, caps)
                .map_err(Error::io("ibv_create_qp"))?,
        })
    }

    /// The QP number (`ibv_qp::qp_num`), what a peer's [`RtrAttr::dest_qp_num`] names.
    #[must_use]
    pub fn qp_num(&self) -> u32 {
        self.raw.ptr().qp_num()
    }

    /// The state the last successful modify through this handle set (RESET after creation).
    ///
    /// Kept by the handle, not read from `ibv_qp::state` (libibverbs writes that field plainly
    /// in `ibv_modify_qp`, so reading it while another thread modifies would be a data race).
    /// Like that field, it does not follow a move to ERROR made by the device itself (a
    /// completion error); such a move shows in the completions' status.
    #[must_use]
    pub fn state(&self) -> QpState {
        QpState::from_raw(self.raw.state())
    }

    /// `ibv_modify_qp` RESET → INIT on `port`, P_Key index 0, local access only.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_modify_qp` error.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify_to_init(&self, port: u8) -> Result<()> {
        self.modify(&ffi::QpModify {
            mask: QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS,
            state: 1,
            port_num: port,
            ..Default::default()
        })
    }

    /// `ibv_modify_qp` INIT → RTR towards the remote QP of `attr`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a PSN over 24 bits; [`Error::Io`] with the
    /// `ibv_modify_qp` error.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        if attr.rq_psn >= 1 << 24 {
            return Err(Error::InvalidArgument("a PSN has 24 bits"));
        }
        let sgid_index = u8::try_from(attr.sgid_index)
            .map_err(|_| Error::InvalidArgument("a route's GID index is at most 255"))?;
        self.modify(&ffi::QpModify {
            mask: QP_STATE
                | QP_AV
                | QP_PATH_MTU
                | QP_DEST_QPN
                | QP_RQ_PSN
                | QP_MAX_DEST_RD_ATOMIC
                | QP_MIN_RNR_TIMER,
            state: 2,
            port_num: attr.port,
            path_mtu: attr.path_mtu.to_raw(),
            dest_qp_num: attr.dest_qp_num,
            rq_psn: attr.rq_psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: attr.min_rnr_timer,
            grh: Some((attr.dgid, sgid_index, 64)),
            ..Default::default()
        })
    }

    /// `ibv_modify_qp` RTR → RTS.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a PSN over 24 bits; [`Error::Io`] with the
    /// `ibv_modify_qp` error.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()> {
        if attr.sq_psn >= 1 << 24 {
            return Err(Error::InvalidArgument("a PSN has 24 bits"));
        }
        self.modify(&ffi::QpModify {
            mask: QP_STATE
                | QP_TIMEOUT
                | QP_RETRY_CNT
                | QP_RNR_RETRY
                | QP_SQ_PSN
                | QP_MAX_QP_RD_ATOMIC,
            state: 3,
            sq_psn: attr.sq_psn,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            max_rd_atomic: 1,
            ..Default::default()
        })
    }

    /// `ibv_modify_qp` to ERROR: outstanding work requests complete with
    /// [`WcStatus::WrFlush`](super::WcStatus::WrFlush).
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_modify_qp` error.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify_to_error(&self) -> Result<()> {
        self.modify(&to_error())
    }

    fn modify(&self, m: &ffi::QpModify) -> Result<()> {
        self.raw.modify(m).map_err(Error::io("ibv_modify_qp"))
    }

    /// `ibv_post_send` of a signaled SEND of `mr`'s bytes `range` (with immediate data when
    /// `imm` is `Some`). The region stays with the returned [`Posted`] until the completion.
    ///
    /// The buffer must be owned (`'static`), e.g. `Vec<u8>` or `Box<[u8]>`; borrowed buffers go
    /// through [`post_send_raw`](Self::post_send_raw).
    ///
    /// # Errors
    /// [`PostError`], with the region, for a region registered with another PD than the QP's
    /// ([`ForeignPd`](super::ForeignPd), checked before the call), a range outside it, or the
    /// `ibv_post_send` error (e.g. `ENOMEM` when the send queue is full).
    #[doc(alias = "ibv_post_send")]
    pub fn post_send<'pd, B: MrBuffer + 'static>(
        &self,
        mr: Mr<'pd, B>,
        range: Range<usize>,
        imm: Option<u32>,
    ) -> std::result::Result<Posted<'pd, B>, PostError<'pd, B>> {
        post_send_on(Some(self.raw.ptr()), mr, range, imm, false)
    }

    /// [`post_send`](Self::post_send) with `IBV_SEND_SOLICITED`: wakes a receiver whose CQ is
    /// armed with `req_notify(true)` ([`Cq::req_notify`]).
    ///
    /// # Errors
    /// As [`post_send`](Self::post_send).
    #[doc(alias = "ibv_post_send")]
    #[doc(alias = "IBV_SEND_SOLICITED")]
    pub fn post_send_solicited<'pd, B: MrBuffer + 'static>(
        &self,
        mr: Mr<'pd, B>,
        range: Range<usize>,
        imm: Option<u32>,
    ) -> std::result::Result<Posted<'pd, B>, PostError<'pd, B>> {
        post_send_on(Some(self.raw.ptr()), mr, range, imm, true)
    }

    /// `ibv_post_recv` into `mr`'s bytes `range`. The region stays with the returned
    /// [`Posted`] until the completion; owned buffers only, as for
    /// [`post_send`](Self::post_send).
    ///
    /// # Errors
    /// [`PostError`], with the region, for a region registered with another PD than the QP's
    /// ([`ForeignPd`](super::ForeignPd), checked before the call), a range outside it, or the
    /// `ibv_post_recv` error.
    #[doc(alias = "ibv_post_recv")]
    pub fn post_recv<'pd, B: MrBuffer + 'static>(
        &self,
        mr: Mr<'pd, B>,
        range: Range<usize>,
    ) -> std::result::Result<Posted<'pd, B>, PostError<'pd, B>> {
        post_recv_on(Some(self.raw.ptr()), mr, range)
    }

    /// The QP for the raw posts in `ffi` (`Qp::post_send_raw`, `Qp::post_recv_raw`).
    pub(crate) fn ffi_ptr(&self) -> ffi::QpPtr<'_> {
        self.raw.ptr()
    }
}

/// The safe owned-buffer send behind [`Qp::post_send`] and
/// [`CmId::post_send`](crate::CmId::post_send) (and their `_solicited` forms); `qp` is `None`
/// for an id without a QP from `create_qp_with`.
#[inline]
pub(super) fn post_send_on<'pd, B: MrBuffer + 'static>(
    qp: Option<ffi::QpPtr<'_>>,
    mr: Mr<'pd, B>,
    range: Range<usize>,
    imm: Option<u32>,
    solicited: bool,
) -> std::result::Result<Posted<'pd, B>, PostError<'pd, B>> {
    post_owned("ibv_post_send", qp, mr, |qp, mr| {
        qp.post_send_owned(mr, range, imm, solicited)
    })
}

/// The safe owned-buffer receive behind [`Qp::post_recv`] and
/// [`CmId::post_recv`](crate::CmId::post_recv); `qp` as for [`post_send_on`].
#[inline]
pub(super) fn post_recv_on<'pd, B: MrBuffer + 'static>(
    qp: Option<ffi::QpPtr<'_>>,
    mr: Mr<'pd, B>,
    range: Range<usize>,
) -> std::result::Result<Posted<'pd, B>, PostError<'pd, B>> {
    post_owned("ibv_post_recv", qp, mr, |qp, mr| {
        qp.post_recv_owned(mr, range)
    })
}

type RawPost<'pd, B> = std::result::Result<ffi::Posted<'pd, B>, (io::Error, ffi::Mr<'pd, B>)>;

#[inline]
fn post_owned<'q, 'pd, B: MrBuffer + 'static>(
    call: &'static str,
    qp: Option<ffi::QpPtr<'q>>,
    mr: Mr<'pd, B>,
    post: impl FnOnce(ffi::QpPtr<'q>, ffi::Mr<'pd, B>) -> RawPost<'pd, B>,
) -> std::result::Result<Posted<'pd, B>, PostError<'pd, B>> {
    let result = match qp {
        Some(qp) => post(qp, mr.raw),
        None => Err((no_qp(), mr.raw)),
    };
    result
        .map(|raw| Posted { raw })
        .map_err(|(source, raw)| PostError {
            call,
            source,
            mr: Mr { raw },
        })
}

/// The error of a post on an rdma_cm id without a QP of the caller's.
pub(super) fn no_qp() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "the id has no QP on the caller's CQs (create it with `create_qp_with`)",
    )
}

impl fmt::Debug for Qp<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &self.qp_num())
            .field("state", &self.state())
            .finish()
    }
}

/// A memory region lent to the device by [`Qp::post_send`] / [`Qp::post_recv`].
///
/// [`complete`](Self::complete) gives the region back for this work request's completion (any
/// status). Dropping it before deregisters the region first, so the device can no longer reach
/// the buffer, then frees it (the work request then fails with a protection error); forgetting
/// it leaks the buffer. Either way no memory the device may still touch is ever freed.
#[must_use = "the memory region comes back with `complete`"]
pub struct Posted<'pd, B: MrBuffer> {
    raw: ffi::Posted<'pd, B>,
}

impl<'pd, B: MrBuffer> Posted<'pd, B> {
    /// The `wr_id` the work request was posted with (chosen by the QP, top bit set).
    #[must_use]
    pub fn wr_id(&self) -> u64 {
        self.raw.wr_id()
    }

    /// The QP it was posted on.
    #[must_use]
    pub fn qp_num(&self) -> u32 {
        self.raw.qp_num()
    }

    /// How many bytes were posted.
    #[must_use]
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether zero bytes were posted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.raw.len() == 0
    }

    /// Whether `wc` is this work request's completion.
    #[must_use]
    pub fn is_completed_by(&self, wc: &WorkCompletion) -> bool {
        wc.qp_num() == self.qp_num() && wc.wr_id() == self.wr_id()
    }

    /// The region back, when `wc` is this work request's completion; `Err(self)` otherwise.
    ///
    /// # Errors
    /// `self`, when `wc` is another work request's completion.
    pub fn complete(self, wc: &WorkCompletion) -> std::result::Result<Mr<'pd, B>, Self> {
        self.raw
            .complete(&wc.raw)
            .map(|raw| Mr { raw })
            .map_err(|raw| Posted { raw })
    }
}

impl<B: MrBuffer> fmt::Debug for Posted<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.raw.fmt(f)
    }
}

/// `ibv_modify_qp`'s attributes that move a QP to `IBV_QPS_ERR`.
pub(crate) fn to_error() -> ffi::QpModify {
    ffi::QpModify {
        mask: QP_STATE,
        state: 6,
        ..Default::default()
    }
}
