//! Protection domains, memory regions, and regions lent to posted work requests.

use std::io;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use evchan_sys as sys;
use libc::{c_int, c_uint};

use super::*;

// ---------------------------------------------------------------------------------------------
// Protection domain
// ---------------------------------------------------------------------------------------------

/// `ibv_alloc_pd` / `ibv_dealloc_pd`.
#[derive(Debug)]
pub(crate) struct Pd<'ctx> {
    pub(in crate::ffi) ptr: NonNull<sys::ibv_pd>,
    _ctx: PhantomData<&'ctx Context>,
}

// SAFETY: PDs are thread-safe libibverbs objects.
unsafe impl Send for Pd<'_> {}
// SAFETY: as above.
unsafe impl Sync for Pd<'_> {}

impl<'ctx> Pd<'ctx> {
    pub(crate) fn new(ctx: &'ctx Context) -> io::Result<Self> {
        // SAFETY: live context.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.ptr.as_ptr()) };
        Ok(Pd {
            ptr: NonNull::new(pd).ok_or_else(null_err)?,
            _ctx: PhantomData,
        })
    }
}

impl Drop for Pd<'_> {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs borrow the PD, so none is alive (a leaked MR makes this fail with
        // EBUSY, which only leaks the PD). Deallocated once.
        let _ = unsafe { sys::ibv_dealloc_pd(self.ptr.as_ptr()) };
    }
}

// ---------------------------------------------------------------------------------------------
// Memory regions
// ---------------------------------------------------------------------------------------------

/// A buffer that can be registered as a memory region: its bytes stay at one address while the
/// value lives, even when the value itself is moved.
///
/// Implemented for `Vec<u8>`, `Box<[u8]>` and `&mut [u8]`. A `Vec` inside a memory region is
/// never resized (only its bytes are reachable), so its heap allocation does not move.
///
/// # Safety
///
/// `as_mut_slice` (and `as_slice`) must return the same address and length on every call, and
/// those bytes must stay allocated until the value is dropped, however the value is moved.
pub unsafe trait MrBuffer {
    /// The registered bytes.
    fn as_slice(&self) -> &[u8];
    /// The registered bytes, mutably.
    fn as_mut_slice(&mut self) -> &mut [u8];

    /// The address and length `ibv_reg_mr` registers: those of `as_mut_slice`. Only this crate
    /// can call or override it (its argument cannot be named outside): a
    /// [`SlotPool`](crate::verbs::SlotPool) registers bytes it never shows as a slice.
    #[doc(hidden)]
    fn registered_bytes(&mut self, _: Sealed) -> (*mut u8, usize) {
        let bytes = self.as_mut_slice();
        (bytes.as_mut_ptr(), bytes.len())
    }
}

/// The argument of [`MrBuffer::registered_bytes`]: public, but in a private module and with a
/// private field, so that no other crate can call or override that method.
#[derive(Debug)]
pub struct Sealed(pub(super) ());

// SAFETY: a Vec's heap buffer does not move when the Vec is moved, and is not reallocated
// because only its bytes (not the Vec) are reachable through the trait.
unsafe impl MrBuffer for Vec<u8> {
    fn as_slice(&self) -> &[u8] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }
}

// SAFETY: a boxed slice's heap buffer does not move when the box is moved.
unsafe impl MrBuffer for Box<[u8]> {
    fn as_slice(&self) -> &[u8] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }
}

// SAFETY: the borrowed bytes cannot move or be freed while the borrow lives.
unsafe impl MrBuffer for &mut [u8] {
    fn as_slice(&self) -> &[u8] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }
}

/// `ibv_reg_mr` / `ibv_dereg_mr`, owning (or exclusively borrowing) the registered buffer.
///
/// The buffer is dropped only after `ibv_dereg_mr` succeeded; if deregistration fails, the
/// buffer is leaked rather than freed under a live registration.
pub(crate) struct Mr<'pd, B: MrBuffer> {
    pub(in crate::ffi) ptr: NonNull<sys::ibv_mr>,
    buf: std::mem::ManuallyDrop<B>,
    _pd: PhantomData<&'pd Pd<'pd>>,
}

// SAFETY: MRs are thread-safe libibverbs objects; the handle only reads lkey/rkey; the buffer
// is Send.
unsafe impl<B: MrBuffer + Send> Send for Mr<'_, B> {}
// SAFETY: shared access reads lkey/rkey and `&B`.
unsafe impl<B: MrBuffer + Sync> Sync for Mr<'_, B> {}

impl<'pd, B: MrBuffer> Mr<'pd, B> {
    /// Registers `buf` with `access` (`enum ibv_access_flags`).
    ///
    /// Registration pins the pages. The device touches them only through work requests, whose
    /// posting is `unsafe` or goes through [`Qp::post_send_owned`]/[`Qp::post_recv_owned`],
    /// which take the whole region by value until the completion. The safe layer passes remote
    /// rights only for an `ExposedMem` and the `Alias`es of its mapping (`verbs::Exposed` and
    /// its grants), whose bytes are never lent as a slice while registered; every other
    /// buffer is registered with local rights alone.
    pub(crate) fn new(pd: &'pd Pd<'_>, mut buf: B, access: c_uint) -> Result<Self, (io::Error, B)> {
        let (addr, len) = buf.registered_bytes(Sealed(()));
        // SAFETY: live PD; `addr..addr+len` is the buffer, kept alive and in place by `self`.
        let mr = unsafe { sys::ibv_reg_mr(pd.ptr.as_ptr(), addr.cast(), len, access as c_int) };
        match NonNull::new(mr) {
            Some(ptr) => Ok(Mr {
                ptr,
                buf: std::mem::ManuallyDrop::new(buf),
                _pd: PhantomData,
            }),
            None => Err((null_err(), buf)),
        }
    }

    /// The registered buffer.
    pub(crate) fn buffer(&self) -> &B {
        &self.buf
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: live MR; `lkey` is written once at registration.
        unsafe { (*self.ptr.as_ptr()).lkey }
    }

    /// The PD the region is registered with (`ibv_mr::pd`, written once at registration), for
    /// comparison only (see `QpPtr::pd_of_qp`).
    pub(crate) fn pd_of_mr(&self) -> *mut sys::ibv_pd {
        // SAFETY: live MR; `pd` is written once at registration.
        unsafe { (*self.ptr.as_ptr()).pd }
    }

    /// The registered range (`ibv_mr::addr`, `ibv_mr::length`, written once at registration),
    /// read without forming a reference to the buffer, which the device may be writing.
    pub(crate) fn addr_len(&self) -> (*mut libc::c_void, usize) {
        // SAFETY: live MR; `addr` is written once at registration.
        let addr = unsafe { (*self.ptr.as_ptr()).addr };
        // SAFETY: live MR; `length` is written once at registration.
        let len = unsafe { (*self.ptr.as_ptr()).length };
        (addr, len)
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: live MR; `rkey` is written once at registration.
        unsafe { (*self.ptr.as_ptr()).rkey }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }

    /// Deregisters and gives the buffer back; if `ibv_dereg_mr` fails the buffer is leaked
    /// (the device may still reach it) and the error returned.
    pub(crate) fn into_inner(self) -> io::Result<B> {
        let mut me = std::mem::ManuallyDrop::new(self);
        // SAFETY: registered by ibv_reg_mr and deregistered once (Drop does not run: the value
        // is in ManuallyDrop).
        let ret = unsafe { sys::ibv_dereg_mr(me.ptr.as_ptr()) };
        sys::cvt_errno(ret)?;
        // SAFETY: `me.buf` is taken once and `me` is never used or dropped again.
        Ok(unsafe { std::mem::ManuallyDrop::take(&mut me.buf) })
    }
}

impl<B: MrBuffer> std::fmt::Debug for Mr<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (addr, len) = self.addr_len();
        f.debug_struct("Mr")
            .field("addr", &addr)
            .field("len", &len)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .finish()
    }
}

impl<B: MrBuffer> Drop for Mr<'_, B> {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once. Once ibv_dereg_mr has returned
        // success the device can no longer reach the pages (the kernel invalidates the region
        // and unpins them; a device writing there afterwards would corrupt kernel memory), so
        // the buffer may be freed even if a work request on it is still queued.
        let ret = unsafe { sys::ibv_dereg_mr(self.ptr.as_ptr()) };
        if ret == 0 {
            // SAFETY: dropped once, here; `self` is being dropped and never reads it again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.buf) };
        }
        // else: the registration may live on, so the buffer is leaked, never freed.
    }
}

/// The high bit marks work request ids chosen by [`Qp::post_send_owned`]/[`Qp::post_recv_owned`].
pub(crate) const OWNED_WR_ID_BIT: u64 = 1 << 63;
pub(super) static NEXT_OWNED_WR_ID: AtomicU64 = AtomicU64::new(0);

/// A fresh work request id of the owned posts (top bit set).
pub(crate) fn fresh_owned_wr_id() -> u64 {
    OWNED_WR_ID_BIT | NEXT_OWNED_WR_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A memory region handed to the device by a posted work request, until its completion.
pub(crate) struct Posted<'pd, B: MrBuffer> {
    pub(super) mr: Mr<'pd, B>,
    pub(super) qp_num: u32,
    pub(super) wr_id: u64,
    pub(super) len: usize,
}

impl<'pd, B: MrBuffer> Posted<'pd, B> {
    pub(crate) fn wr_id(&self) -> u64 {
        self.wr_id
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Gives the region back when `wc` is this work request's completion (any status: a
    /// completion means the device is done with the buffer).
    pub(crate) fn complete(self, wc: &RawWc) -> Result<Mr<'pd, B>, Self> {
        if wc.qp_num == self.qp_num && wc.wr_id == self.wr_id {
            Ok(self.mr)
        } else {
            Err(self)
        }
    }
}

impl<B: MrBuffer> std::fmt::Debug for Posted<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Address and length only: the device may be writing the buffer right now, so no
        // `&[u8]` over it may be formed here.
        let (addr, len) = self.mr.addr_len();
        f.debug_struct("Posted")
            .field("addr", &addr)
            .field("region_len", &len)
            .field("lkey", &self.mr.lkey())
            .field("qp_num", &self.qp_num)
            .field("wr_id", &self.wr_id)
            .field("len", &self.len)
            .finish()
    }
}
