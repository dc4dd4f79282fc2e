//! Owning handles of libibverbs objects, and the only calls into libibverbs.
//!
//! One file on purpose, past the usual size: every `unsafe` of the verbs side is here, to be
//! reviewed together (the rdma_cm side keeps its own files next to it).
//!
//! # Safety
//!
//! Each handle owns one C object and frees it on drop. The lifetimes say what a C object needs
//! alive, so that drop order is enforced by the borrow checker:
//!
//! | handle | borrows | because |
//! |---|---|---|
//! | [`Context`] | nothing (the device list may be freed once a device is open) | |
//! | [`Pd<'ctx>`] | the context | `ibv_dealloc_pd` needs the context |
//! | [`CompChannel<'ctx>`] | the context | `ibv_destroy_comp_channel` locks `context->mutex` |
//! | [`Cq<'ch>`] | the completion channel | `ibv_destroy_comp_channel` fails with `EBUSY` while a CQ uses it |
//! | [`Mr<'pd, B>`] | the PD, and owns or exclusively borrows its buffer `B` | `ibv_dealloc_pd` fails with `EBUSY` while an MR uses it |
//! | [`Qp<'res>`] | the PD and both CQs | `ibv_destroy_cq` fails with `EBUSY` while a QP uses it |
//!
//! Acks are the other half. libibverbs' `ibv_destroy_cq` (and `ibv_destroy_qp`) wait on a
//! condition variable until every completion event (resp. async event) already read for the
//! object is acked; an event read but never acked makes the destroy hang forever. So:
//!
//! - a completion event read from a channel is a [`CqEventAck`], which acks itself at once on
//!   drop, or is [`CqEventAck::defer`]red into its [`Cq`]'s pending count; [`Cq`]'s drop acks the
//!   pending count before `ibv_destroy_cq`. Acks are never counted for an event that was not read
//!   (over-acking would make the destroy wait forever too: it waits for equality).
//! - an async event naming a CQ, QP, SRQ or WQ is acked as soon as it has been read and the
//!   object's identity copied out ([`RawAsyncEvent`]), so no destroy can wait on it.

use std::ffi::CStr;
use std::io;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use evchan_sys as sys;
use libc::{c_int, c_uint, c_void};

/// Acks are flushed with one `ibv_ack_cq_events` call once this many are pending for a CQ.
pub(crate) const ACK_BATCH: u32 = 64;

/// The most work completions one `ibv_poll_cq` call of [`Cq::poll`] asks for.
pub(crate) const POLL_BATCH: usize = 32;

fn null_err() -> io::Error {
    let e = sys::last_error();
    // libibverbs sometimes returns NULL without setting errno; never report "success".
    if e.raw_os_error() == Some(0) {
        io::Error::from_raw_os_error(libc::ENOMEM)
    } else {
        e
    }
}

// ---------------------------------------------------------------------------------------------
// Device list and context
// ---------------------------------------------------------------------------------------------

/// `ibv_get_device_list` / `ibv_free_device_list`.
#[derive(Debug)]
pub(crate) struct DeviceList {
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

// SAFETY: the list is an immutable array of device pointers; libibverbs' device functions used
// on them (`ibv_get_device_name`, `ibv_get_device_guid`, `ibv_open_device`) are thread-safe.
unsafe impl Send for DeviceList {}
// SAFETY: as above; nothing mutates the list after creation.
unsafe impl Sync for DeviceList {}

impl DeviceList {
    pub(crate) fn new() -> io::Result<Self> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the returned array is owned until freed in Drop.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        let list = NonNull::new(list).ok_or_else(null_err)?;
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn device(&self, i: usize) -> Option<*mut sys::ibv_device> {
        if i >= self.len {
            return None;
        }
        // SAFETY: `i < len`: inside the array of `len` device pointers (plus a NULL).
        let slot = unsafe { self.list.as_ptr().add(i) };
        // SAFETY: `slot` points at an initialised element of the live array.
        let dev = unsafe { *slot };
        (!dev.is_null()).then_some(dev)
    }

    pub(crate) fn name(&self, i: usize) -> Option<String> {
        let dev = self.device(i)?;
        // SAFETY: `dev` is a device of this live list; the name is a NUL-terminated string
        // owned by the device, copied out before the borrow ends.
        let name = unsafe { sys::ibv_get_device_name(dev) };
        if name.is_null() {
            return None;
        }
        // SAFETY: non-NULL, NUL-terminated, alive as long as the list.
        Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    pub(crate) fn guid(&self, i: usize) -> Option<u64> {
        let dev = self.device(i)?;
        // SAFETY: `dev` is a device of this live list.
        Some(u64::from_be(unsafe { sys::ibv_get_device_guid(dev) }))
    }

    pub(crate) fn open(&self, i: usize) -> io::Result<Context> {
        let dev = self
            .device(i)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))?;
        // SAFETY: `dev` is a device of this live list; the context stays valid after the list is
        // freed (libibverbs keeps a reference on the device).
        let ctx = unsafe { sys::ibv_open_device(dev) };
        let ptr = NonNull::new(ctx).ok_or_else(null_err)?;
        Ok(Context { ptr })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { sys::ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// Port attributes, as plain numbers (`ibv_query_port`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawPort {
    pub(crate) state: u32,
    pub(crate) max_mtu: u32,
    pub(crate) active_mtu: u32,
    pub(crate) gid_tbl_len: i32,
    pub(crate) lid: u16,
    pub(crate) link_layer: u8,
}

/// One GID table entry (`_ibv_query_gid_ex`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawGid {
    pub(crate) raw: [u8; 16],
    pub(crate) index: u32,
    pub(crate) gid_type: u32,
    pub(crate) ndev_ifindex: u32,
}

// rdma-core exports this since libibverbs 1.11 (rdma-core 31); the header wraps it in the inline
// `ibv_query_gid_ex`, which rdma-sys does not bind.
extern "C" {
    fn _ibv_query_gid_ex(
        context: *mut sys::ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut sys::ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> c_int;
}

/// `ibv_open_device` / `ibv_close_device`.
#[derive(Debug)]
pub(crate) struct Context {
    ptr: NonNull<sys::ibv_context>,
}

// SAFETY: libibverbs contexts are thread-safe: every verb on them takes the locks it needs.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    pub(crate) fn async_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `async_fd` is opened by ibv_open_device and closed by ibv_close_device, which
        // runs only in Drop, after every borrow of self has ended.
        unsafe { BorrowedFd::borrow_raw(self.raw_async_fd()) }
    }

    fn raw_async_fd(&self) -> RawFd {
        // SAFETY: `ptr` is a live context; `async_fd` is written once at open.
        unsafe { (*self.ptr.as_ptr()).async_fd }
    }

    pub(crate) fn name(&self) -> String {
        // SAFETY: a live context's `device` is valid while the context is open.
        let dev = unsafe { (*self.ptr.as_ptr()).device };
        // SAFETY: `dev` is a valid device; the name is NUL-terminated and owned by it.
        let name = unsafe { sys::ibv_get_device_name(dev) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated, alive while the context is open.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// `ibv_query_device`'s `phys_port_cnt`.
    pub(crate) fn port_count(&self) -> io::Result<u8> {
        let mut attr = MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: live context, `attr` is a valid out-pointer of the right type.
        let ret = unsafe { sys::ibv_query_device(self.ptr.as_ptr(), attr.as_mut_ptr()) };
        sys::cvt_errno(ret)?;
        // SAFETY: zero-initialised, then filled by a successful ibv_query_device.
        Ok(unsafe { attr.assume_init() }.phys_port_cnt)
    }

    pub(crate) fn query_port(&self, port: u8) -> io::Result<RawPort> {
        let mut attr = MaybeUninit::<sys::ibv_port_attr>::zeroed();
        // SAFETY: live context, `attr` is a zeroed ibv_port_attr the size of which is passed to
        // the provider by the inline wrapper (as the C header's inline ibv_query_port does).
        let ret = unsafe { sys::___ibv_query_port(self.ptr.as_ptr(), port, attr.as_mut_ptr()) };
        sys::cvt_errno(ret)?;
        // SAFETY: zero-initialised plain-integer struct, filled by the call.
        let a = unsafe { attr.assume_init() };
        Ok(RawPort {
            state: a.state,
            max_mtu: a.max_mtu,
            active_mtu: a.active_mtu,
            gid_tbl_len: a.gid_tbl_len,
            lid: a.lid,
            link_layer: a.link_layer,
        })
    }

    pub(crate) fn query_gid(&self, port: u8, index: u32) -> io::Result<RawGid> {
        let mut entry = MaybeUninit::<sys::ibv_gid_entry>::zeroed();
        // SAFETY: live context; `entry` is a valid out-pointer whose size we pass.
        let ret = unsafe {
            _ibv_query_gid_ex(
                self.ptr.as_ptr(),
                u32::from(port),
                index,
                entry.as_mut_ptr(),
                0,
                size_of::<sys::ibv_gid_entry>(),
            )
        };
        sys::cvt_errno(ret)?;
        // SAFETY: zero-initialised plain-data struct (the gid union is 16 bytes of integers).
        let e = unsafe { entry.assume_init() };
        // SAFETY: both union members are plain bytes; `raw` covers all 16.
        let raw = unsafe { e.gid.raw };
        Ok(RawGid {
            raw,
            index: e.gid_index,
            gid_type: e.gid_type,
            ndev_ifindex: e.ndev_ifindex,
        })
    }

    /// `ibv_get_async_event` on the (non-blocking) async fd: `Ok(None)` on `EAGAIN`.
    pub(crate) fn get_async_event(&self) -> io::Result<Option<RawAsyncEvent>> {
        loop {
            let mut ev = MaybeUninit::<sys::ibv_async_event>::zeroed();
            // SAFETY: live context; `ev` is a valid out-pointer. The call only writes the
            // element union and the event type as a C `enum` (a u32), read back as a u32.
            let ret = unsafe { sys::ibv_get_async_event(self.ptr.as_ptr(), ev.as_mut_ptr()) };
            if ret == 0 {
                return Ok(Some(RawAsyncEvent::read(ev)));
            }
            let e = sys::last_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(None),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child object borrows the context, so none is alive; closed once.
        // A failure cannot be acted upon here (the handle is gone either way).
        let _ = unsafe { sys::ibv_close_device(self.ptr.as_ptr()) };
    }
}

// ---------------------------------------------------------------------------------------------
// Async events
// ---------------------------------------------------------------------------------------------

/// What an async event names, copied out of the C event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawElement {
    /// The `cq_context` token of the CQ.
    Cq(u64),
    /// The QP number.
    Qp(u32),
    /// The SRQ (no safe handle exists yet; its address, for identification only).
    Srq(usize),
    /// The WQ (likewise).
    Wq(usize),
    /// A port number.
    Port(i32),
    /// The device as a whole.
    Device,
}

/// One event from `ibv_get_async_event`. Object events are acked at once (see the module
/// docs); the others are acked on drop.
pub(crate) struct RawAsyncEvent {
    event_type: u32,
    element: RawElement,
    /// The unacked C event, for kinds that name no object. Kept as `MaybeUninit` and only
    /// passed by pointer: its `event_type` may hold a value outside rdma-sys's Rust enum.
    pending: Option<MaybeUninit<sys::ibv_async_event>>,
}

impl std::fmt::Debug for RawAsyncEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawAsyncEvent")
            .field("event_type", &self.event_type)
            .field("element", &self.element)
            .field("acked", &self.pending.is_none())
            .finish()
    }
}

// SAFETY: a pending event names only a port or the device (plain integers); acking it from
// another thread is allowed by libibverbs.
unsafe impl Send for RawAsyncEvent {}
// SAFETY: no interior mutability; shared access only reads copied integers.
unsafe impl Sync for RawAsyncEvent {}

impl RawAsyncEvent {
    fn read(mut ev: MaybeUninit<sys::ibv_async_event>) -> Self {
        let base = ev.as_ptr().cast::<u8>();
        let type_at = base
            .wrapping_add(std::mem::offset_of!(sys::ibv_async_event, event_type))
            .cast::<u32>();
        let element_at = base.wrapping_add(std::mem::offset_of!(sys::ibv_async_event, element));
        // SAFETY: `ev` was filled by ibv_get_async_event. `event_type` is a C enum, stored as 4
        // aligned bytes; rdma-sys types it as a Rust enum with values 0..=19, so it is read as
        // a u32 (never as the Rust enum, which would be UB for a newer kernel's value).
        let event_type = unsafe { type_at.read() };
        // SAFETY: the element union is 8 aligned bytes of plain data written by the call.
        let element_ptr = unsafe { element_at.cast::<*mut c_void>().read() };
        let element = match event_type {
            0 => {
                let cq = element_ptr.cast::<sys::ibv_cq>();
                // SAFETY: for CQ_ERR the element is a CQ that cannot be freed before this event
                // is acked (ibv_destroy_cq waits for it).
                let token = unsafe { (*cq).cq_context } as u64;
                RawElement::Cq(token)
            }
            1..=7 | 16 => {
                let qp = element_ptr.cast::<sys::ibv_qp>();
                // SAFETY: for QP events the element is a QP that cannot be freed before this
                // event is acked (ibv_destroy_qp waits for it).
                RawElement::Qp(unsafe { (*qp).qp_num })
            }
            14 | 15 => RawElement::Srq(element_ptr as usize),
            19 => RawElement::Wq(element_ptr as usize),
            8 => RawElement::Device,
            _ => {
                // SAFETY: for every other kind the element is the `port_num` int, at offset 0 of
                // the (8-aligned) union.
                RawElement::Port(unsafe { element_at.cast::<c_int>().read() })
            }
        };
        match element {
            RawElement::Cq(_) | RawElement::Qp(_) | RawElement::Srq(_) | RawElement::Wq(_) => {
                // SAFETY: the event came from ibv_get_async_event and is acked exactly once, here;
                // C reads it through the pointer as the C type (a u32 enum), never as Rust's.
                unsafe { sys::ibv_ack_async_event(ev.as_mut_ptr()) };
                RawAsyncEvent {
                    event_type,
                    element,
                    pending: None,
                }
            }
            RawElement::Port(_) | RawElement::Device => RawAsyncEvent {
                event_type,
                element,
                pending: Some(ev),
            },
        }
    }

    pub(crate) fn event_type(&self) -> u32 {
        self.event_type
    }

    pub(crate) fn element(&self) -> RawElement {
        self.element
    }
}

impl Drop for RawAsyncEvent {
    fn drop(&mut self) {
        if let Some(ev) = self.pending.as_mut() {
            // SAFETY: the event came from ibv_get_async_event and was not acked (object events
            // were acked at read and have no pending event); acked exactly once, here.
            unsafe { sys::ibv_ack_async_event(ev.as_mut_ptr()) };
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Protection domain
// ---------------------------------------------------------------------------------------------

/// `ibv_alloc_pd` / `ibv_dealloc_pd`.
#[derive(Debug)]
pub(crate) struct Pd<'ctx> {
    ptr: NonNull<sys::ibv_pd>,
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
}

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
    ptr: NonNull<sys::ibv_mr>,
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
    /// which take the whole region by value until the completion. The safe layer only passes
    /// `access` with local rights (remote peers would need the rkey, which a safe program can
    /// only hand out deliberately, and cannot post remote operations on this QP type).
    pub(crate) fn new(pd: &'pd Pd<'_>, mut buf: B, access: c_uint) -> Result<Self, (io::Error, B)> {
        let bytes = buf.as_mut_slice();
        let (addr, len) = (bytes.as_mut_ptr(), bytes.len());
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

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: live MR; `lkey` is written once at registration.
        unsafe { (*self.ptr.as_ptr()).lkey }
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
        let bytes = self.buf.as_slice();
        f.debug_struct("Mr")
            .field("addr", &bytes.as_ptr())
            .field("len", &bytes.len())
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
static NEXT_OWNED_WR_ID: AtomicU64 = AtomicU64::new(0);

/// A memory region handed to the device by a posted work request, until its completion.
pub(crate) struct Posted<'pd, B: MrBuffer> {
    mr: Mr<'pd, B>,
    qp_num: u32,
    wr_id: u64,
    len: usize,
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
        f.debug_struct("Posted")
            .field("mr", &self.mr)
            .field("qp_num", &self.qp_num)
            .field("wr_id", &self.wr_id)
            .field("len", &self.len)
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------
// Completion channel, CQ, CQ events
// ---------------------------------------------------------------------------------------------

/// `ibv_create_comp_channel` / `ibv_destroy_comp_channel`. Its fd is set `O_NONBLOCK`.
#[derive(Debug)]
pub(crate) struct CompChannel<'ctx> {
    ptr: NonNull<sys::ibv_comp_channel>,
    events_read: AtomicU64,
    _ctx: PhantomData<&'ctx Context>,
}

// SAFETY: completion channels are thread-safe (reads of one fd; ibv_get_cq_event takes no lock
// that another thread could hold forever).
unsafe impl Send for CompChannel<'_> {}
// SAFETY: as above.
unsafe impl Sync for CompChannel<'_> {}

impl<'ctx> CompChannel<'ctx> {
    pub(crate) fn new(ctx: &'ctx Context) -> io::Result<Self> {
        // SAFETY: live context.
        let ch = unsafe { sys::ibv_create_comp_channel(ctx.ptr.as_ptr()) };
        let ch = CompChannel {
            ptr: NonNull::new(ch).ok_or_else(null_err)?,
            events_read: AtomicU64::new(0),
            _ctx: PhantomData,
        };
        sys::fd::set_nonblocking(ch.fd(), true)?;
        Ok(ch)
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: live channel; `fd` is written once at creation.
        let fd = unsafe { (*self.ptr.as_ptr()).fd };
        // SAFETY: the channel's fd is open from creation until ibv_destroy_comp_channel, which
        // runs only in Drop, after every borrow of self has ended.
        unsafe { BorrowedFd::borrow_raw(fd) }
    }

    /// How many events `get_cq_event` has read from this channel.
    pub(crate) fn events_read(&self) -> u64 {
        self.events_read.load(Ordering::Relaxed)
    }

    /// `ibv_get_cq_event` on the non-blocking fd: `Ok(None)` on `EAGAIN`.
    pub(crate) fn get_cq_event(&self) -> io::Result<Option<CqEventAck>> {
        let mut cq: *mut sys::ibv_cq = ptr::null_mut();
        let mut cq_context: *mut c_void = ptr::null_mut();
        loop {
            // SAFETY: live channel; both out-pointers are valid.
            let ret = unsafe { sys::ibv_get_cq_event(self.ptr.as_ptr(), &mut cq, &mut cq_context) };
            if ret == 0 {
                break;
            }
            let e = sys::last_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(None),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        self.events_read.fetch_add(1, Ordering::Relaxed);
        match NonNull::new(cq) {
            Some(cq) => Ok(Some(CqEventAck {
                cq,
                token: cq_context as u64,
            })),
            None => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

impl CompChannel<'_> {
    /// `ibv_destroy_comp_channel`, reporting its result (Drop ignores it).
    pub(crate) fn destroy(self) -> io::Result<()> {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: as in Drop, which will not run (ManuallyDrop): destroyed once.
        let ret = unsafe { sys::ibv_destroy_comp_channel(me.ptr.as_ptr()) };
        sys::cvt_errno(ret)
    }
}

impl Drop for CompChannel<'_> {
    fn drop(&mut self) {
        // SAFETY: every CQ on the channel borrows it, so none is alive and the C refcount is
        // zero: EBUSY cannot happen. Destroyed once; this also closes the fd.
        let _ = unsafe { sys::ibv_destroy_comp_channel(self.ptr.as_ptr()) };
    }
}

static NEXT_CQ_TOKEN: AtomicU64 = AtomicU64::new(1);

/// `ibv_create_cq` / `ibv_destroy_cq`, with the pending (deferred) ack count of its events.
#[derive(Debug)]
pub(crate) struct Cq<'ch> {
    ptr: NonNull<sys::ibv_cq>,
    token: u64,
    pending_acks: AtomicU32,
    _ch: PhantomData<&'ch CompChannel<'ch>>,
}

// SAFETY: CQs are thread-safe libibverbs objects (providers lock poll/arm); the ack count is
// atomic.
unsafe impl Send for Cq<'_> {}
// SAFETY: as above.
unsafe impl Sync for Cq<'_> {}

/// One plain-data work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawWc {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) opcode: u32,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`, per `wc_flags`.
    pub(crate) imm_or_rkey: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: u32,
}

impl<'ch> Cq<'ch> {
    pub(crate) fn new(ch: &'ch CompChannel<'_>, cqe: c_int) -> io::Result<Self> {
        let token = NEXT_CQ_TOKEN.fetch_add(1, Ordering::Relaxed);
        // SAFETY: live channel; its `context` is the live context it was created on.
        let ctx = unsafe { (*ch.ptr.as_ptr()).context };
        // SAFETY: live context and channel; `cq_context` is an opaque token, never dereferenced.
        let cq = unsafe { sys::ibv_create_cq(ctx, cqe, token as *mut c_void, ch.ptr.as_ptr(), 0) };
        Ok(Cq {
            ptr: NonNull::new(cq).ok_or_else(null_err)?,
            token,
            pending_acks: AtomicU32::new(0),
            _ch: PhantomData,
        })
    }

    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    pub(crate) fn capacity(&self) -> i32 {
        // SAFETY: live CQ; `cqe` is written at creation.
        unsafe { (*self.ptr.as_ptr()).cqe }
    }

    /// `ibv_req_notify_cq`.
    pub(crate) fn req_notify(&self, solicited_only: bool) -> io::Result<()> {
        // SAFETY: live CQ.
        let ret = unsafe { sys::ibv_req_notify_cq(self.ptr.as_ptr(), c_int::from(solicited_only)) };
        sys::cvt_errno(ret)
    }

    /// `ibv_poll_cq` for at most `min(out.len(), POLL_BATCH)` completions.
    pub(crate) fn poll(&self, out: &mut [RawWc]) -> io::Result<usize> {
        let n = out.len().min(POLL_BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut wcs: [MaybeUninit<sys::ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        // SAFETY: live CQ; `wcs` has room for `n <= POLL_BATCH` entries.
        let got =
            unsafe { sys::ibv_poll_cq(self.ptr.as_ptr(), n as c_int, wcs.as_mut_ptr().cast()) };
        let got = usize::try_from(got)
            .map_err(|_| io::Error::from_raw_os_error(got.unsigned_abs() as i32))?;
        for (slot, wc) in out.iter_mut().zip(&wcs[..got.min(n)]) {
            // SAFETY: ibv_poll_cq initialised the first `got` entries.
            let wc = unsafe { wc.assume_init_ref() };
            // SAFETY: both members of the union are u32.
            let imm_or_rkey = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
            *slot = RawWc {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                vendor_err: wc.vendor_err,
                byte_len: wc.byte_len,
                imm_or_rkey,
                qp_num: wc.qp_num,
                src_qp: wc.src_qp,
                wc_flags: wc.wc_flags,
            };
        }
        Ok(got.min(n))
    }

    /// Acks every deferred event now (`ibv_ack_cq_events` with the count).
    pub(crate) fn flush_acks(&self) {
        let n = self.pending_acks.swap(0, Ordering::AcqRel);
        if n > 0 {
            // SAFETY: live CQ; `n` events were read for it and not yet acked.
            unsafe { sys::ibv_ack_cq_events(self.ptr.as_ptr(), n) };
        }
    }

    pub(crate) fn pending_acks(&self) -> u32 {
        self.pending_acks.load(Ordering::Acquire)
    }
}

impl Cq<'_> {
    /// Flushes the pending acks, then `ibv_destroy_cq`, reporting its result (Drop ignores it).
    pub(crate) fn destroy(self) -> io::Result<()> {
        self.flush_acks();
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: as in Drop, which will not run (ManuallyDrop): destroyed once, acks flushed.
        let ret = unsafe { sys::ibv_destroy_cq(me.ptr.as_ptr()) };
        sys::cvt_errno(ret)
    }
}

impl Drop for Cq<'_> {
    fn drop(&mut self) {
        // Every event read for this CQ is either deferred into `pending_acks` (flushed here) or
        // still held by a CqEventAck, which acks on drop without needing this handle. The public
        // guard borrows the Cq, so in safe code none is alive now: ibv_destroy_cq cannot wait.
        self.flush_acks();
        // SAFETY: QPs borrow the CQ, so none uses it; destroyed once.
        let _ = unsafe { sys::ibv_destroy_cq(self.ptr.as_ptr()) };
    }
}

/// One completion event read from a channel and not yet acked.
///
/// Dropping it acks it at once; [`defer`](Self::defer) moves the ack into its CQ's batch.
#[derive(Debug)]
pub(crate) struct CqEventAck {
    cq: NonNull<sys::ibv_cq>,
    token: u64,
}

// SAFETY: acking from another thread is allowed; the CQ cannot be freed while this is unacked.
unsafe impl Send for CqEventAck {}
// SAFETY: shared access only reads the token.
unsafe impl Sync for CqEventAck {}

impl CqEventAck {
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// Adds this event to `cq`'s pending acks (flushing at [`ACK_BATCH`]), or, when `cq` is not
    /// the event's CQ, gives the event back.
    pub(crate) fn defer(self, cq: &Cq<'_>) -> Result<(), Self> {
        if cq.ptr != self.cq {
            return Err(self);
        }
        std::mem::forget(self);
        if cq.pending_acks.fetch_add(1, Ordering::AcqRel) + 1 >= ACK_BATCH {
            cq.flush_acks();
        }
        Ok(())
    }
}

impl Drop for CqEventAck {
    fn drop(&mut self) {
        // SAFETY: the event was read for this CQ and not acked (defer forgets self), so the CQ
        // is still allocated: ibv_destroy_cq waits for this very ack before freeing it.
        unsafe { sys::ibv_ack_cq_events(self.cq.as_ptr(), 1) };
    }
}

// ---------------------------------------------------------------------------------------------
// Queue pairs and posting
// ---------------------------------------------------------------------------------------------

/// Plain QP creation attributes (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpInit {
    pub(crate) qp_type: u32,
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
    pub(crate) sq_sig_all: bool,
}

/// Plain QP modify attributes: the subset of `struct ibv_qp_attr` the safe layer sets.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QpModify {
    pub(crate) mask: c_int,
    pub(crate) state: u32,
    pub(crate) pkey_index: u16,
    pub(crate) port_num: u8,
    pub(crate) access: u32,
    pub(crate) path_mtu: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) qkey: u32,
    /// `Some((dgid, sgid_index, hop_limit))` for a global route.
    pub(crate) grh: Option<([u8; 16], u8, u8)>,
    pub(crate) dlid: u16,
}

/// `ibv_create_qp` / `ibv_destroy_qp`.
#[derive(Debug)]
pub(crate) struct Qp<'res> {
    ptr: NonNull<sys::ibv_qp>,
    _res: PhantomData<(&'res Pd<'res>, &'res Cq<'res>)>,
}

// SAFETY: QPs are thread-safe libibverbs objects (providers lock post/modify).
unsafe impl Send for Qp<'_> {}
// SAFETY: as above.
unsafe impl Sync for Qp<'_> {}

/// Flags of a send work request (`enum ibv_send_flags`, the ones evchan supports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendFlags {
    /// `IBV_SEND_SIGNALED`: a completion also on success (failures always complete).
    pub signaled: bool,
    /// `IBV_SEND_SOLICITED`: the receiver's CQ, armed with `solicited_only`, raises an event.
    pub solicited: bool,
}

impl Default for SendFlags {
    /// Signaled, not solicited.
    fn default() -> Self {
        SendFlags {
            signaled: true,
            solicited: false,
        }
    }
}

/// One scatter/gather element (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Start address of the registered memory to use.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The local key of the memory region that covers `addr..addr + length`.
    pub lkey: u32,
}

impl<'res> Qp<'res> {
    pub(crate) fn new(
        pd: &'res Pd<'_>,
        send_cq: &'res Cq<'_>,
        recv_cq: &'res Cq<'_>,
        init: QpInit,
    ) -> io::Result<Self> {
        let mut attr = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.ptr.as_ptr(),
            recv_cq: recv_cq.ptr.as_ptr(),
            srq: ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: init.max_send_wr,
                max_recv_wr: init.max_recv_wr,
                max_send_sge: init.max_send_sge,
                max_recv_sge: init.max_recv_sge,
                max_inline_data: init.max_inline_data,
            },
            qp_type: init.qp_type,
            sq_sig_all: c_int::from(init.sq_sig_all),
        };
        // SAFETY: live PD and CQs (borrowed for 'res); `attr` is fully initialised.
        let qp = unsafe { sys::ibv_create_qp(pd.ptr.as_ptr(), &mut attr) };
        Ok(Qp {
            ptr: NonNull::new(qp).ok_or_else(null_err)?,
            _res: PhantomData,
        })
    }

    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: live QP; `qp_num` is written at creation.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    pub(crate) fn state(&self) -> u32 {
        let at = self
            .ptr
            .as_ptr()
            .cast::<u8>()
            .wrapping_add(std::mem::offset_of!(sys::ibv_qp, state))
            .cast::<u32>();
        // SAFETY: live QP; `state` is an aligned u32 that libibverbs updates on modify; a
        // volatile read of it is only a hint, never torn.
        unsafe { at.read_volatile() }
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify(&self, m: &QpModify) -> io::Result<()> {
        // SAFETY: ibv_qp_attr is plain data (integers, a union of byte arrays, pointers unused
        // here); all-zero is a valid value.
        let mut attr: sys::ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.qp_state = m.state;
        attr.pkey_index = m.pkey_index;
        attr.port_num = m.port_num;
        attr.qp_access_flags = m.access;
        attr.path_mtu = m.path_mtu;
        attr.dest_qp_num = m.dest_qp_num;
        attr.rq_psn = m.rq_psn;
        attr.sq_psn = m.sq_psn;
        attr.max_dest_rd_atomic = m.max_dest_rd_atomic;
        attr.max_rd_atomic = m.max_rd_atomic;
        attr.min_rnr_timer = m.min_rnr_timer;
        attr.timeout = m.timeout;
        attr.retry_cnt = m.retry_cnt;
        attr.rnr_retry = m.rnr_retry;
        attr.qkey = m.qkey;
        attr.ah_attr.port_num = m.port_num;
        attr.ah_attr.dlid = m.dlid;
        if let Some((dgid, sgid_index, hop_limit)) = m.grh {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = sys::ibv_gid { raw: dgid };
            attr.ah_attr.grh.sgid_index = sgid_index;
            attr.ah_attr.grh.hop_limit = hop_limit;
        }
        // SAFETY: live QP; `attr` is initialised for every field the mask names.
        let ret = unsafe { sys::ibv_modify_qp(self.ptr.as_ptr(), &mut attr, m.mask) };
        sys::cvt_errno(ret)
    }

    /// `ibv_post_send` of one work request.
    ///
    /// # Safety
    ///
    /// Every `sge` must lie in memory registered (under its `lkey`) with this QP's PD, and that
    /// memory must stay allocated, registered and not written by anyone else until the work
    /// request's completion has been polled (or the QP is destroyed). Without
    /// `flags.signaled` (and without `sq_sig_all`) no completion comes on success; then until
    /// a later signaled one on the same QP has completed.
    pub(crate) unsafe fn post_send(
        &self,
        wr_id: u64,
        sges: &[Sge],
        imm: Option<u32>,
        flags: SendFlags,
    ) -> io::Result<()> {
        let mut sg: Vec<sys::ibv_sge> = sges
            .iter()
            .map(|s| sys::ibv_sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect();
        // SAFETY: ibv_send_wr is plain data (integers, raw pointers, unions of those); all-zero
        // is valid (NULL next, no remote address).
        let mut wr: sys::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
        wr.wr_id = wr_id;
        wr.sg_list = sg.as_mut_ptr();
        wr.num_sge =
            c_int::try_from(sg.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut bits = 0;
        if flags.signaled {
            bits |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if flags.solicited {
            bits |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        wr.send_flags = bits;
        match imm {
            Some(imm) => {
                wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            None => wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND,
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: live QP; `wr` and `sg` outlive the call (the provider copies them); the memory
        // they name is the caller's contract.
        let ret = unsafe { sys::ibv_post_send(self.ptr.as_ptr(), &mut wr, &mut bad) };
        sys::cvt_errno(ret)
    }

    /// `ibv_post_recv` of one work request.
    ///
    /// # Safety
    ///
    /// Every `sge` must lie in memory registered (under its `lkey`, with local write access)
    /// with this QP's PD, and that memory must stay allocated, registered and unaccessed by
    /// anyone else until the work request's completion has been polled (or the QP is destroyed):
    /// the device writes into it.
    pub(crate) unsafe fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> io::Result<()> {
        let mut sg: Vec<sys::ibv_sge> = sges
            .iter()
            .map(|s| sys::ibv_sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect();
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: sg.as_mut_ptr(),
            num_sge: c_int::try_from(sg.len())
                .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
        };
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: live QP; `wr` and `sg` outlive the call; the memory is the caller's contract.
        let ret = unsafe { sys::ibv_post_recv(self.ptr.as_ptr(), &mut wr, &mut bad) };
        sys::cvt_errno(ret)
    }
}

impl Qp<'_> {
    /// Posts a send of `mr`'s bytes `range` and keeps the region until the completion.
    ///
    /// `B: 'static`: a forgotten [`Posted`] then leaks the buffer instead of freeing memory the
    /// device may still read (a borrowed buffer's borrow would end at the `forget`).
    pub(crate) fn post_send_owned<'pd, B: MrBuffer + 'static>(
        &self,
        mr: Mr<'pd, B>,
        range: std::ops::Range<usize>,
        imm: Option<u32>,
        solicited: bool,
    ) -> Result<Posted<'pd, B>, (io::Error, Mr<'pd, B>)> {
        let sge = match sge_of(&mr, range) {
            Ok(s) => s,
            Err(e) => return Err((e, mr)),
        };
        let wr_id = OWNED_WR_ID_BIT | NEXT_OWNED_WR_ID.fetch_add(1, Ordering::Relaxed);
        let flags = SendFlags {
            signaled: true,
            solicited,
        };
        // SAFETY: `sge` lies in `mr`, registered with a PD; `mr` (and so its buffer) moves into
        // the returned Posted, which gives it back only for this work request's completion
        // (signaled, so there is one), or deregisters it before freeing it (no DMA after
        // ibv_dereg_mr), or leaks it.
        match unsafe { self.post_send(wr_id, &[sge], imm, flags) } {
            Ok(()) => Ok(Posted {
                mr,
                qp_num: self.qp_num(),
                wr_id,
                len: sge.length as usize,
            }),
            Err(e) => Err((e, mr)),
        }
    }

    /// Posts a receive into `mr`'s bytes `range` and keeps the region until the completion.
    ///
    /// `B: 'static` for the reason given at [`post_send_owned`](Self::post_send_owned).
    pub(crate) fn post_recv_owned<'pd, B: MrBuffer + 'static>(
        &self,
        mr: Mr<'pd, B>,
        range: std::ops::Range<usize>,
    ) -> Result<Posted<'pd, B>, (io::Error, Mr<'pd, B>)> {
        let sge = match sge_of(&mr, range) {
            Ok(s) => s,
            Err(e) => return Err((e, mr)),
        };
        let wr_id = OWNED_WR_ID_BIT | NEXT_OWNED_WR_ID.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as in post_send_owned; the device writes only into `range` of `mr`, which
        // nobody else can reach while Posted holds it.
        match unsafe { self.post_recv(wr_id, &[sge]) } {
            Ok(()) => Ok(Posted {
                mr,
                qp_num: self.qp_num(),
                wr_id,
                len: sge.length as usize,
            }),
            Err(e) => Err((e, mr)),
        }
    }
}

/// The scatter/gather element of `range` of `mr`, checked.
pub(crate) fn sge_of<B: MrBuffer>(
    mr: &Mr<'_, B>,
    range: std::ops::Range<usize>,
) -> io::Result<Sge> {
    let bytes = mr.bytes();
    let inval = || io::Error::from_raw_os_error(libc::EINVAL);
    let sub = bytes.get(range).ok_or_else(inval)?;
    Ok(Sge {
        addr: sub.as_ptr() as u64,
        length: u32::try_from(sub.len()).map_err(|_| inval())?,
        lkey: mr.lkey(),
    })
}

impl Drop for Qp<'_> {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once. Async events naming it are acked
        // at read (RawAsyncEvent), so ibv_destroy_qp cannot wait on one.
        let _ = unsafe { sys::ibv_destroy_qp(self.ptr.as_ptr()) };
    }
}
