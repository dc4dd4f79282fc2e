//! The verbs objects an rdma_cm id gives access to: borrowed views of its device context and
//! protection domain, and the capacities of the QP it creates.

use std::fmt;

use crate::ffi::verbs as ffi;

/// A device context (`struct ibv_context`) borrowed from the rdma_cm id that holds it
/// ([`CmId::verbs`](crate::CmId::verbs)): its name and identity.
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
/// ([`CmId::pd`](crate::CmId::pd)).
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

/// The capacities of the QP `rdma_create_qp` creates (`struct ibv_qp_init_attr`'s `cap`).
///
/// ```
/// let init = evchan_core::verbs::QpInit::new().max_send_wr(32);
/// # let _ = init;
/// ```
#[doc(alias = "ibv_qp_init_attr")]
#[derive(Debug, Clone, Copy)]
pub struct QpInit {
    caps: crate::ffi::cm::QpCaps,
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
            caps: crate::ffi::cm::QpCaps {
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

    pub(crate) fn caps(&self) -> crate::ffi::cm::QpCaps {
        self.caps
    }
}
