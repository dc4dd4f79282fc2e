//! The raw posts of the public API (`Qp::post_send_raw`, `CmId::post_recv_raw`, …).
//!
//! They are `unsafe fn`s of public types whose safe methods live in `crate::verbs`; their
//! inherent impls sit here so that every `unsafe` of the crate stays under `ffi`. Each one
//! states the caller's contract (memory registered, kept alive and untouched until the
//! completion) and forwards to `QpPtr`'s posts, whose contract it is.

use crate::cm::state::State;
use crate::verbs::{Error, Qp, Result, SendFlags, Sge};
use crate::CmId;

impl Qp<'_> {
    /// `ibv_post_send` of one SEND work request made of `sges`, raw (with immediate data
    /// when `imm` is `Some`).
    ///
    /// # Safety
    ///
    /// - every [`Sge`](crate::verbs::Sge) lies inside a memory region registered with this QP's [`Pd`](crate::verbs::Pd), under that
    ///   region's `lkey` (e.g. from [`Mr::sge`](crate::verbs::Mr::sge));
    /// - that memory stays allocated, registered, and unwritten by anyone until the work
    ///   request has completed: its completion (or, unsignaled, that of a later signaled send
    ///   on this QP) has been polled, or the QP has been destroyed;
    /// - `wr_id` does not have its top bit set (those ids are reserved for [`Posted`](crate::verbs::Posted)).
    ///
    /// # Errors
    /// [`Error::Io`](crate::verbs::Error::Io) with the `ibv_post_send` error.
    #[doc(alias = "ibv_post_send")]
    pub unsafe fn post_send_raw(
        &self,
        wr_id: u64,
        sges: &[Sge],
        imm: Option<u32>,
        flags: SendFlags,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract, which is ffi's.
        unsafe { self.ffi_ptr().post_send(wr_id, sges, imm, flags) }
            .map_err(Error::io("ibv_post_send"))
    }

    /// `ibv_post_recv` of one receive work request into `sges`, raw.
    ///
    /// # Safety
    ///
    /// - every [`Sge`](crate::verbs::Sge) lies inside a memory region registered with this QP's [`Pd`](crate::verbs::Pd), under that
    ///   region's `lkey`;
    /// - that memory stays allocated, registered, and neither read nor written by anyone until
    ///   the work request's completion has been polled or the QP destroyed: the device writes
    ///   into it;
    /// - `wr_id` does not have its top bit set.
    ///
    /// # Errors
    /// [`Error::Io`](crate::verbs::Error::Io) with the `ibv_post_recv` error.
    #[doc(alias = "ibv_post_recv")]
    pub unsafe fn post_recv_raw(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        // SAFETY: the caller upholds this function's contract, which is ffi's.
        unsafe { self.ffi_ptr().post_recv(wr_id, sges) }.map_err(Error::io("ibv_post_recv"))
    }
}

impl<S: State> CmId<'_, S> {
    /// `ibv_post_send` of one SEND work request made of `sges` on the id's QP, raw; as
    /// [`Qp::post_send_raw`](crate::verbs::Qp::post_send_raw).
    ///
    /// # Safety
    ///
    /// As [`Qp::post_send_raw`](crate::verbs::Qp::post_send_raw): every [`Sge`](crate::verbs::Sge) lies in a region
    /// registered with the QP's PD under its `lkey`; that memory stays allocated, registered and
    /// unwritten until the work request has completed (or the id is dropped, which destroys the
    /// QP); `wr_id` does not have its top bit set.
    ///
    /// # Errors
    /// [`Error::Io`](crate::verbs::Error::Io): no QP from [`create_qp_with`](Self::create_qp_with), a UD QP (as for
    /// [`post_send`](Self::post_send)), or the `ibv_post_send` error.
    #[doc(alias = "ibv_post_send")]
    pub unsafe fn post_send_raw(
        &self,
        wr_id: u64,
        sges: &[Sge],
        imm: Option<u32>,
        flags: SendFlags,
    ) -> Result<()> {
        let qp = self.user_qp("ibv_post_send")?;
        // SAFETY: the caller upholds this function's contract, which is ffi's.
        unsafe { qp.post_send(wr_id, sges, imm, flags) }.map_err(Error::io("ibv_post_send"))
    }

    /// `ibv_post_recv` of one receive work request into `sges` on the id's QP, raw; as
    /// [`Qp::post_recv_raw`](crate::verbs::Qp::post_recv_raw).
    ///
    /// # Safety
    ///
    /// As [`Qp::post_recv_raw`](crate::verbs::Qp::post_recv_raw): the memory of every [`Sge`](crate::verbs::Sge) is
    /// registered with the QP's PD, and stays allocated, registered and untouched by anyone
    /// until the work request's completion has been polled or the id dropped; `wr_id` does not
    /// have its top bit set.
    ///
    /// # Errors
    /// [`Error::Io`](crate::verbs::Error::Io): no QP from [`create_qp_with`](Self::create_qp_with), or the
    /// `ibv_post_recv` error.
    #[doc(alias = "ibv_post_recv")]
    pub unsafe fn post_recv_raw(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        let qp = self.user_qp("ibv_post_recv")?;
        // SAFETY: the caller upholds this function's contract, which is ffi's.
        unsafe { qp.post_recv(wr_id, sges) }.map_err(Error::io("ibv_post_recv"))
    }
}
