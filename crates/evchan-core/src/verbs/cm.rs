//! The verbs side of an rdma_cm id: borrowed views of its context and PD, its device context
//! held open for the caller's own objects, and its QP on the caller's PD and CQs, with the same
//! posts as a [`Qp`](super::Qp).
//!
//! One story for both halves of the crate: a [`Context`] is either opened by the caller
//! ([`Context::open`]) or taken from an id after address resolution ([`CmId::context`]); on
//! either, [`Pd`], [`CompChannel`](super::CompChannel), [`Cq`] and [`Mr`] are made the same way.
//! An RC QP is then either created and connected by hand ([`Qp`](super::Qp)) or by the id
//! ([`CmId::create_qp_with`], then `connect`/`accept`), and posted to the same way.

use std::fmt;
use std::io;
use std::ops::Range;

use crate::cm::state::{Bound, CanCreateQp, HasDevice, Listening, State};
use crate::ffi::verbs as ffi;
use crate::CmId;

use super::qp::{no_qp, post_recv_on, post_send_on};
use super::{
    Context, Cq, Error, Mr, MrBuffer, OwnedCq, OwnedPd, Pd, PostError, Posted, QpCaps, QpHandle,
    Result,
};

/// A device context (`struct ibv_context`) borrowed from the rdma_cm id that holds it
/// ([`CmId::verbs`]): its name and identity. To create objects on it, take the owned
/// [`Context`] of the id with [`CmId::context`].
///
/// # References
/// `rdma_cm(7)` (`struct rdma_cm_id`'s `verbs`), `ibv_get_device_name(3)`.
#[doc(alias = "ibv_context")]
#[derive(Clone, Copy)]
pub struct ContextRef<'a> {
    raw: ffi::ContextRef<'a>,
}

impl<'a> ContextRef<'a> {
    pub(crate) fn new(raw: ffi::ContextRef<'a>) -> Self {
        Self { raw }
    }

    /// `ibv_get_device_name`: the device's name, e.g. `"rxe0"`.
    #[doc(alias = "ibv_get_device_name")]
    #[must_use]
    pub fn name(&self) -> String {
        self.raw.name()
    }
}

impl fmt::Debug for ContextRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextRef")
            .field("device", &self.name())
            .finish()
    }
}

impl PartialEq for ContextRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.raw.key() == other.raw.key()
    }
}

impl Eq for ContextRef<'_> {}

/// A protection domain (`struct ibv_pd`) borrowed from the rdma_cm id that holds it
/// ([`CmId::pd`]).
///
/// # References
/// `rdma_cm(7)` (`struct rdma_cm_id`'s `pd`), `ibv_alloc_pd(3)`.
#[doc(alias = "ibv_pd")]
#[derive(Clone, Copy)]
pub struct PdRef<'a> {
    raw: ffi::PdRef<'a>,
}

impl<'a> PdRef<'a> {
    pub(crate) fn new(raw: ffi::PdRef<'a>) -> Self {
        Self { raw }
    }

    /// `ibv_pd::handle`: the kernel's handle of the PD.
    #[must_use]
    pub fn handle(&self) -> u32 {
        self.raw.handle()
    }

    /// Whether the PD belongs to `context`'s device (`ibv_pd::context`).
    #[must_use]
    pub fn belongs_to(&self, context: &ContextRef<'_>) -> bool {
        self.raw.context_key() == context.raw.key()
    }
}

impl fmt::Debug for PdRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PdRef")
            .field("handle", &self.handle())
            .finish()
    }
}

/// The capacities of the QP `rdma_create_qp` creates (`struct ibv_qp_init_attr`'s `cap`, and
/// `sq_sig_all`), for [`CmId::create_qp`](crate::CmId::create_qp) and
/// [`CmId::create_qp_with`]. The work queue sizes of a [`Qp`](super::Qp) made by hand,
/// [`QpCaps`], convert into it.
///
/// ```
/// use evchan_core::verbs::{QpCaps, QpInit};
///
/// let init = QpInit::new().max_send_wr(32);
/// let same_as_a_hand_made_qp = QpInit::from(QpCaps::default());
/// # let _ = (init, same_as_a_hand_made_qp);
/// ```
#[doc(alias = "ibv_qp_init_attr")]
#[derive(Debug, Clone, Copy)]
pub struct QpInit {
    caps: ffi::QpCaps,
}

impl Default for QpInit {
    fn default() -> Self {
        Self::new()
    }
}

impl QpInit {
    /// 16 send and 16 receive work requests, one scatter/gather entry each, no inline data,
    /// every send signalled.
    #[must_use]
    pub fn new() -> Self {
        Self {
            caps: ffi::QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
                sq_sig_all: true,
            },
        }
    }

    /// `cap.max_send_wr`.
    #[must_use]
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.caps.max_send_wr = n;
        self
    }

    /// `cap.max_recv_wr`.
    #[must_use]
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.caps.max_recv_wr = n;
        self
    }

    /// `cap.max_send_sge` and `cap.max_recv_sge`.
    #[must_use]
    pub fn max_sge(mut self, n: u32) -> Self {
        self.caps.max_send_sge = n;
        self.caps.max_recv_sge = n;
        self
    }

    /// `cap.max_inline_data`.
    #[must_use]
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.caps.max_inline_data = n;
        self
    }

    /// `sq_sig_all`: whether every send completes with a work completion, asked for or not
    /// (the owned-buffer posts always ask).
    #[must_use]
    pub fn signal_all(mut self, yes: bool) -> Self {
        self.caps.sq_sig_all = yes;
        self
    }

    pub(crate) fn caps(&self) -> ffi::QpCaps {
        self.caps
    }
}

impl From<QpCaps> for QpInit {
    /// The work queue sizes of `caps`, sends signalled only when asked (as for
    /// [`Qp::new_rc`](super::Qp::new_rc)).
    fn from(caps: QpCaps) -> Self {
        QpInit {
            caps: ffi::QpCaps {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: caps.max_send_sge,
                max_recv_sge: caps.max_recv_sge,
                max_inline_data: caps.max_inline_data,
                sq_sig_all: false,
            },
        }
    }
}

impl<'ch, S: State> CmId<'ch, S> {
    /// `rdma_cm_id::verbs`, held open: the device context librdmacm opened for the id, as an
    /// owned [`Context`] on which to create the [`Pd`], [`CompChannel`](super::CompChannel),
    /// [`Cq`]s and [`Mr`]s that [`create_qp_with`](Self::create_qp_with) takes.
    ///
    /// The handle does not borrow the id: it holds a reference on the device through
    /// `rdma_get_devices` (given back by `rdma_free_devices` on drop), so the context stays
    /// open while the id changes state, is migrated or is gone. It is never
    /// `ibv_close_device`d: librdmacm owns it. Its async event fd is shared with anything else
    /// in the process that uses the device, so its flags are left alone (no `O_NONBLOCK`):
    /// [`Context::try_get_async_event`] polls it with a zero timeout before it reads, and
    /// evchan's readers of such contexts take turns, so none of them waits in the read for an
    /// event another one took. (A reader outside evchan taking the event between the poll and
    /// the read would make the read wait for the next event.)
    ///
    /// # Errors
    /// [`Error::Io`] with the `rdma_get_devices` error; `ENODEV` when the device is being
    /// removed.
    #[doc(alias = "rdma_get_devices")]
    #[doc(alias = "rdma_free_devices")]
    pub fn context(&self) -> Result<Context>
    where
        S: HasDevice,
    {
        let verbs = self.raw.verbs().ok_or_else(|| {
            Error::io("rdma_get_devices")(io::Error::from_raw_os_error(libc::ENODEV))
        })?;
        let raw = ffi::Context::of_cm_device(verbs).map_err(Error::io("rdma_get_devices"))?;
        Context::from_raw(raw)
    }

    /// `rdma_create_qp` on the caller's `pd`, completing sends on `send_cq` and receives on
    /// `recv_cq` (which may be the same CQ), so that completions arrive on the caller's
    /// [`CompChannel`](super::CompChannel). The QP type follows the port space (RC for TCP
    /// and IB); librdmacm moves it through INIT, RTR and RTS on `connect`/`accept`. Post on it
    /// with [`post_send`](Self::post_send) and [`post_recv`](Self::post_recv).
    ///
    /// The id borrows `pd` and both CQs for `'ch`, its own lifetime: they cannot be dropped
    /// while the id (in any later state) lives, and dropping the id destroys the QP
    /// (`rdma_destroy_qp`) at once, before they can go — even when the destroy of the id itself
    /// is deferred to an event's ack. While the QP lives, [`migrate`](Self::migrate) is refused
    /// (`EBUSY`): the migrated id would no longer carry these borrows.
    ///
    /// `pd` and the CQs must be of the id's device ([`context`](Self::context)). Bind the id
    /// *after* them (`let mut id = id;` is enough), so that it is dropped first, also when a
    /// panic unwinds; the compiler insists.
    ///
    /// # Errors
    /// The OS error: `EINVAL` when the id already has a QP, `pd` is of another device context
    /// than the id's (use the [`Context`] from [`CmId::context`]), or the CQs are of another
    /// device context than `pd` (checked before the call: the kernel would look their handles
    /// up among `pd`'s context's objects and could bind the QP to some other CQ).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use evchan_core::{cm, CmId, EventChannel};
    /// use evchan_core::verbs::{CompChannel, Cq, Pd, QpInit};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let channel = EventChannel::new()?;
    /// let t = Duration::from_secs(2);
    /// // A failed transition gives the id back (`e.id`); here only its error is kept.
    /// let id = CmId::new(&channel, cm::PortSpace::Tcp)?
    ///     .resolve_addr(None, ([169, 254, 77, 1], 7471).into(), t)
    ///     .map_err(|e| e.error)?;
    /// let id = id.addr_resolved(&channel.get_event()?).map_err(|e| e.error)?;
    /// let ctx = id.context()?;
    /// let (pd, comp) = (Pd::new(&ctx)?, CompChannel::new(&ctx)?);
    /// let cq = Cq::new(&comp, 64)?;
    /// let id = id.resolve_route(t).map_err(|e| e.error)?;
    /// // Bound after the PD and CQ it will borrow, so that it is dropped before them.
    /// let mut id = id.route_resolved(&channel.get_event()?).map_err(|e| e.error)?;
    /// id.create_qp_with(&pd, &cq, &cq, &QpInit::new())?;
    /// let rx = id.post_recv(pd.reg_mr(vec![0u8; 64])?, 0..64).map_err(|e| e.source)?;
    /// let id = id.connect(&cm::ConnParam::new()).map_err(|e| e.error)?;
    /// let id = id.established(&channel.get_event()?).map_err(|e| e.error)?;
    /// let tx = id.post_send(pd.reg_mr(b"hello".to_vec())?, 0..5, None).map_err(|e| e.source)?;
    /// cq.wait(Some(t), |wc| println!("{:?} {}", wc.status(), tx.is_completed_by(&wc)))?;
    /// # drop((rx, id));
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "rdma_create_qp")]
    pub fn create_qp_with(
        &mut self,
        pd: &'ch Pd<'_>,
        send_cq: &'ch Cq<'_>,
        recv_cq: &'ch Cq<'_>,
        init: &QpInit,
    ) -> crate::Result<()>
    where
        S: CanCreateQp,
    {
        self.raw
            .create_qp_with(&pd.raw, &send_cq.raw, &recv_cq.raw, init.caps())
            .map_err(|e| crate::Error::os("rdma_create_qp", e))
    }

    /// `rdma_create_qp` on owned objects ([`owned`](super::owned)): the owned form of
    /// [`create_qp_with`](Self::create_qp_with), for a QP posted to from `'static` handles.
    ///
    /// The id keeps clones of `pd` and both CQs until the QP is destroyed, so they outlive it
    /// however the handles are dropped, and nothing is borrowed: [`migrate`](Self::migrate)
    /// is allowed. The QP is destroyed as one from `create_qp_with` is: when the id goes
    /// (never deferred), or by [`destroy_qp`](Self::destroy_qp). The returned [`QpHandle`]
    /// (and its clones) posts on the QP from anywhere until then, and fails with
    /// [`Error::QpDestroyed`] after; the id's own posts ([`post_send_slot`](Self::post_send_slot)
    /// …) work too.
    ///
    /// # Errors
    /// As [`create_qp_with`](Self::create_qp_with).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use evchan_core::{cm, CmId, EventChannel};
    /// use evchan_core::verbs::{OwnedCompChannel, OwnedCq, OwnedMr, OwnedPd, QpInit, SlotPool};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let channel = EventChannel::new()?;
    /// let t = Duration::from_secs(2);
    /// let id = CmId::new(&channel, cm::PortSpace::Tcp)?
    ///     .resolve_addr(None, ([169, 254, 77, 1], 7471).into(), t)
    ///     .map_err(|e| e.error)?;
    /// let id = id.addr_resolved(&channel.get_event()?).map_err(|e| e.error)?;
    /// let ctx = Arc::new(id.context()?);
    /// let pd = OwnedPd::new(ctx.clone())?;
    /// let cq = OwnedCq::new(&OwnedCompChannel::new(ctx)?, 64)?;
    /// let id = id.resolve_route(t).map_err(|e| e.error)?;
    /// let mut id = id.route_resolved(&channel.get_event()?).map_err(|e| e.error)?;
    /// let qp = id.create_qp_owned(&pd, &cq, &cq, &QpInit::new())?;
    /// let (pool, mut slots) = SlotPool::new(4, 64)?;
    /// let mr = OwnedMr::new(&pd, pool)?;
    /// // The handle, the CQ and the region are 'static: another thread posts and polls.
    /// let posted = std::thread::spawn(move || qp.post_recv_slot(mr.mr(), slots.pop().unwrap()))
    ///     .join()
    ///     .unwrap()?;
    /// drop(id); // destroys the QP; the handle's later posts fail with QpDestroyed
    /// # drop(posted);
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "rdma_create_qp")]
    pub fn create_qp_owned(
        &mut self,
        pd: &OwnedPd,
        send_cq: &OwnedCq,
        recv_cq: &OwnedCq,
        init: &QpInit,
    ) -> crate::Result<QpHandle>
    where
        S: CanCreateQp,
    {
        self.raw
            .create_qp_owned(pd.cell(), send_cq.cell(), recv_cq.cell(), init.caps())
            .map(QpHandle::new)
            .map_err(|e| crate::Error::os("rdma_create_qp", e))
    }

    pub(crate) fn user_qp(&self, call: &'static str) -> Result<ffi::QpPtr<'_>> {
        self.raw.user_qp().ok_or_else(|| Error::io(call)(no_qp()))
    }

    /// `ibv_post_send` on the id's QP: a signaled SEND of `mr`'s bytes `range` (with
    /// immediate data when `imm` is `Some`), as [`Qp::post_send`](super::Qp::post_send). The
    /// region stays with the returned [`Posted`] until the completion.
    ///
    /// # Errors
    /// [`PostError`], with the region: the id has no QP from
    /// [`create_qp_with`](Self::create_qp_with), the id is of the UDP port space (its QP is
    /// UD, whose sends need an address handle, not supported yet; refused before the call),
    /// the region is registered with another PD than the QP's ([`ForeignPd`](super::ForeignPd),
    /// refused before the call), the range is outside the region, or the `ibv_post_send` error (`EINVAL` before the
    /// connection is established).
    #[doc(alias = "ibv_post_send")]
    pub fn post_send<'pd, B: MrBuffer + 'static>(
        &self,
        mr: Mr<'pd, B>,
        range: Range<usize>,
        imm: Option<u32>,
    ) -> std::result::Result<Posted<'pd, B>, PostError<'pd, B>> {
        post_send_on(self.raw.user_qp(), mr, range, imm, false)
    }

    /// [`post_send`](Self::post_send) with `IBV_SEND_SOLICITED`.
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
        post_send_on(self.raw.user_qp(), mr, range, imm, true)
    }

    /// `ibv_post_recv` on the id's QP into `mr`'s bytes `range`, as
    /// [`Qp::post_recv`](super::Qp::post_recv). Receives may be posted before `connect` /
    /// `accept`, and should be: a SEND that finds no receive waits for RNR retries.
    ///
    /// # Errors
    /// [`PostError`], with the region: no QP from [`create_qp_with`](Self::create_qp_with), a
    /// region of another PD than the QP's ([`ForeignPd`](super::ForeignPd), refused before the
    /// call), a range outside the region, or the `ibv_post_recv` error.
    #[doc(alias = "ibv_post_recv")]
    pub fn post_recv<'pd, B: MrBuffer + 'static>(
        &self,
        mr: Mr<'pd, B>,
        range: Range<usize>,
    ) -> std::result::Result<Posted<'pd, B>, PostError<'pd, B>> {
        post_recv_on(self.raw.user_qp(), mr, range)
    }
}

/// A bound or listening id's device context, when its address names one device.
macro_rules! bound_context {
    ($($state:ident),*) => {$(
        impl<'ch> CmId<'ch, $state> {
            /// The device context of the address the id is bound to (`rdma_cm_id::verbs`,
            /// set by `rdma_bind_addr` when the address belongs to an RDMA device), held open
            /// as [`CmId::context`] holds it; `Ok(None)` for a wildcard address
            /// (`0.0.0.0`, `::`), which names no device.
            ///
            /// It is librdmacm's own context of that device, the one every id taken from this
            /// listener's `CONNECT_REQUEST`s uses (also one of
            /// [`Context::rdma_cm_devices`]), so a [`Pd`], [`CompChannel`](super::CompChannel)
            /// and [`Cq`]s made on it before the first request are accepted by
            /// [`create_qp_with`](CmId::create_qp_with) on those ids.
            ///
            /// # Errors
            /// [`Error::Io`] with the `rdma_get_devices` error; `ENODEV` when the device is
            /// being removed.
            #[doc(alias = "rdma_get_devices")]
            pub fn bound_context(&self) -> Result<Option<Context>> {
                let Some(verbs) = self.raw.verbs() else {
                    return Ok(None);
                };
                let raw =
                    ffi::Context::of_cm_device(verbs).map_err(Error::io("rdma_get_devices"))?;
                Context::from_raw(raw).map(Some)
            }
        }
    )*};
}

bound_context!(Bound, Listening);
