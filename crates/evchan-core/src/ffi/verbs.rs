//! libibverbs objects reachable from an rdma_cm id: the device context and its protection
//! domain. (The completion channel and CQs of the verbs layer extend this module.)

use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr::NonNull;

use evchan_sys as sys;

/// A borrowed `struct ibv_context` (an open device), valid for `'a`.
#[derive(Clone, Copy)]
pub(crate) struct Context<'a> {
    ptr: NonNull<sys::ibv_context>,
    _owner: PhantomData<&'a sys::ibv_context>,
}

impl Context<'_> {
    /// Borrows `ptr`, or `None` when it is NULL.
    ///
    /// # Safety
    ///
    /// `ptr` is NULL or a device context that stays open for the chosen lifetime.
    pub(crate) unsafe fn from_raw(ptr: *mut sys::ibv_context) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| Self {
            ptr,
            _owner: PhantomData,
        })
    }

    /// `ibv_get_device_name(context->device)`.
    pub(crate) fn device_name(&self) -> String {
        // SAFETY: the context is open (type invariant), so its `device` is valid.
        let dev = unsafe { (*self.ptr.as_ptr()).device };
        if dev.is_null() {
            return String::new();
        }
        // SAFETY: `dev` is a valid device; the name is NULL or a NUL-terminated string owned by
        // the device, which outlives this call.
        let name = unsafe { sys::ibv_get_device_name(dev) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated, valid for the duration of this call.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// The context's address, as an opaque key (equal contexts, equal keys).
    pub(crate) fn key(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

/// A borrowed `struct ibv_pd`, valid for `'a`.
#[derive(Clone, Copy)]
pub(crate) struct ProtectionDomain<'a> {
    ptr: NonNull<sys::ibv_pd>,
    _owner: PhantomData<&'a sys::ibv_pd>,
}

impl ProtectionDomain<'_> {
    /// Borrows `ptr`, or `None` when it is NULL.
    ///
    /// # Safety
    ///
    /// `ptr` is NULL or a protection domain that stays allocated for the chosen lifetime.
    pub(crate) unsafe fn from_raw(ptr: *mut sys::ibv_pd) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| Self {
            ptr,
            _owner: PhantomData,
        })
    }

    /// `ibv_pd::handle`: the kernel's handle of the PD.
    pub(crate) fn handle(&self) -> u32 {
        // SAFETY: the PD is allocated (type invariant).
        unsafe { (*self.ptr.as_ptr()).handle }
    }

    /// The device context the PD belongs to.
    pub(crate) fn context_key(&self) -> usize {
        // SAFETY: the PD is allocated (type invariant).
        unsafe { (*self.ptr.as_ptr()).context as usize }
    }
}
