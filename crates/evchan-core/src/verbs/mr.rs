//! Memory regions.

use std::fmt;
use std::ops::Range;

use crate::ffi::verbs as ffi;

use super::{Error, MrBuffer, Pd, Result, Sge};

/// `IBV_ACCESS_LOCAL_WRITE`: the only right `Mr::new` grants (receives write locally); remote
/// rights are [`Exposed`](super::Exposed)'s alone.
const LOCAL_WRITE: u32 = 1;

/// A registered memory region (`ibv_reg_mr` / `ibv_dereg_mr`) that owns or exclusively borrows
/// its buffer `B` (`Vec<u8>`, `Box<[u8]>` or `&mut [u8]`).
///
/// While the region value lives, its buffer can neither be freed nor moved: an owned buffer is
/// inside it, a borrowed one is borrowed mutably for as long as the value lives. Dropping the
/// region deregisters it and then drops the buffer; [`Mr::into_inner`] deregisters and gives
/// the buffer back. Registration grants local write access only (no remote keys are usable).
///
/// What holds when the value is leaked instead (`mem::forget`, a cycle of `Rc`s): the region
/// stays registered (`rdma resource show mr` lists it) until its PD's context is closed or the
/// process ends. An owned buffer is leaked with it, so it is never freed. A *borrowed* buffer's
/// borrow ends at the leak, so the buffer may then be written, moved or freed while it is still
/// registered. Safe code cannot make the device reach such memory: the owned posts
/// ([`Qp::post_send`](super::Qp::post_send), [`Qp::post_recv`](super::Qp::post_recv)) take only
/// `'static` buffers (a `&'static mut [u8]` is never freed), every other post is `unsafe`, and
/// no remote access is granted. An `unsafe` post naming a leaked region's lkey is the caller's
/// responsibility, as its `# Safety` section says.
///
/// # Example
///
/// ```no_run
/// use evchan_core::verbs::{Context, Pd};
///
/// # fn main() -> Result<(), evchan_core::verbs::Error> {
/// let ctx = Context::open_first()?;
/// let pd = Pd::new(&ctx)?;
///
/// let mut owned = pd.reg_mr(vec![0u8; 64])?;
/// owned.as_mut_slice()[0] = 1;
///
/// let mut array = [0u8; 64];
/// let borrowed = pd.reg_mr(&mut array[..])?;
/// // `array` cannot be touched, moved or freed until `borrowed` is gone.
/// drop(borrowed);
/// array[0] = 2;
/// # Ok(())
/// # }
/// ```
///
/// # References
///
/// [`ibv_reg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
#[doc(alias = "ibv_mr")]
#[doc(alias = "ibv_reg_mr")]
#[doc(alias = "ibv_dereg_mr")]
pub struct Mr<'pd, B: MrBuffer> {
    pub(crate) raw: ffi::Mr<'pd, B>,
}

impl<'pd> Pd<'pd> {
    /// `ibv_reg_mr`: registers `buf` (local write access), see [`Mr`].
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_reg_mr` error (e.g. `ENOMEM` past `ulimit -l`); the buffer is
    /// dropped. Use [`Mr::new`] to get it back on failure.
    #[doc(alias = "ibv_reg_mr")]
    pub fn reg_mr<B: MrBuffer>(&self, buf: B) -> Result<Mr<'_, B>> {
        Mr::new(self, buf).map_err(|(e, _)| e)
    }
}

impl<'pd, B: MrBuffer> Mr<'pd, B> {
    /// `ibv_reg_mr`: registers `buf` with `pd` (local write access).
    ///
    /// # Errors
    /// The `ibv_reg_mr` error, with the buffer.
    #[doc(alias = "ibv_reg_mr")]
    pub fn new(pd: &'pd Pd<'_>, buf: B) -> std::result::Result<Self, (Error, B)> {
        ffi::Mr::new(&pd.raw, buf, LOCAL_WRITE)
            .map(|raw| Mr { raw })
            .map_err(|(e, b)| (Error::io("ibv_reg_mr")(e), b))
    }

    /// `ibv_reg_mr` with `access` (`ibv_access_flags`): the remote registrations of
    /// [`Exposed`](super::Exposed), whose buffer shows no bytes.
    pub(crate) fn with_access(
        pd: &'pd Pd<'_>,
        buf: B,
        access: u32,
    ) -> std::result::Result<Self, (Error, B)> {
        ffi::Mr::new(&pd.raw, buf, access)
            .map(|raw| Mr { raw })
            .map_err(|(e, b)| (Error::io("ibv_reg_mr")(e), b))
    }

    /// The registered buffer.
    pub(crate) fn buffer(&self) -> &B {
        self.raw.buffer()
    }

    /// The local key (`ibv_mr::lkey`), for [`Sge`]s of raw work requests.
    #[must_use]
    pub fn lkey(&self) -> u32 {
        self.raw.lkey()
    }

    /// The remote key (`ibv_mr::rkey`). The region is registered without remote access, so a
    /// peer cannot use it.
    #[must_use]
    pub fn rkey(&self) -> u32 {
        self.raw.rkey()
    }

    /// The registered bytes.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        self.raw.bytes()
    }

    /// The registered bytes, mutably.
    #[must_use]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.raw.bytes_mut()
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.raw.bytes().len()
    }

    /// Whether the region is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The scatter/gather element of `range` of this region, for the `unsafe` raw posts
    /// ([`Qp::post_send_raw`](super::Qp::post_send_raw)). Making one is safe; posting it is not.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `range` is not inside the region or longer than 4 GiB.
    pub fn sge(&self, range: Range<usize>) -> Result<Sge> {
        ffi::sge_of(&self.raw, range)
            .map_err(|_| Error::InvalidArgument("range outside the memory region"))
    }

    /// `ibv_dereg_mr`, then gives the buffer back.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_dereg_mr` error; the buffer is then leaked, not freed, since
    /// the registration may still be in force. (Dropping the region does the same.)
    #[doc(alias = "ibv_dereg_mr")]
    pub fn into_inner(self) -> Result<B> {
        self.raw.into_inner().map_err(Error::io("ibv_dereg_mr"))
    }
}

impl<B: MrBuffer> fmt::Debug for Mr<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.raw.fmt(f)
    }
}
