//! Device list, contexts (opened here or held through librdmacm), and the borrowed views of an
//! rdma_cm id's context and PD.

use std::ffi::CStr;
use std::io;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use evchan_sys as sys;
use libc::c_int;

use super::{null_err, Borrowed, ContextRef, PdRef, RawAsyncEvent};

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
        Ok(Context {
            ptr,
            owner: Owner::Opened,
        })
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

/// A device context: `ibv_open_device` / `ibv_close_device`, or librdmacm's context of an
/// rdma_cm id's device, held open by a `rdma_get_devices` list (see the module docs).
#[derive(Debug)]
pub(crate) struct Context {
    pub(super) ptr: NonNull<sys::ibv_context>,
    owner: Owner,
}

/// Who keeps a [`Context`] open.
#[derive(Debug)]
enum Owner {
    /// We opened it (`ibv_open_device`): `ibv_close_device` on drop.
    Opened,
    /// librdmacm opened it; this `rdma_get_devices` list holds a reference on its device until
    /// `rdma_free_devices` on drop. Never `ibv_close_device`d here.
    RdmaCm(NonNull<*mut sys::ibv_context>),
}

// SAFETY: libibverbs contexts are thread-safe: every verb on them takes the locks it needs.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// The context librdmacm opened for an id's device (`rdma_cm_id::verbs`), held open by a
    /// `rdma_get_devices` list for as long as the handle lives, independently of the id.
    ///
    /// `ENODEV` when the device is no longer in librdmacm's list (it is being removed).
    pub(crate) fn of_cm_device(verbs: ContextRef<'_>) -> io::Result<Self> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; returns NULL with errno on failure. On success every device
        // in the list has its librdmacm reference count raised until `rdma_free_devices`.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        let list = NonNull::new(list).ok_or_else(null_err)?;
        let count = usize::try_from(n).unwrap_or(0);
        // SAFETY: the list holds `n` contexts followed by a NULL, valid until it is freed.
        let contexts = unsafe { std::slice::from_raw_parts(list.as_ptr(), count) };
        if contexts.contains(&verbs.ptr.as_ptr()) {
            Ok(Context {
                ptr: verbs.ptr,
                owner: Owner::RdmaCm(list),
            })
        } else {
            // SAFETY: from `rdma_get_devices`, freed once (here; no handle keeps it).
            unsafe { sys::rdma_free_devices(list.as_ptr()) };
            Err(io::Error::from_raw_os_error(libc::ENODEV))
        }
    }

    /// Every context in librdmacm's device list (`rdma_get_devices`), each held open by a list
    /// of its own (as [`Context::of_cm_device`]); an empty list when there is no device.
    pub(crate) fn all_cm_devices() -> io::Result<Vec<Self>> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; NULL with errno on failure; freed below.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        let list = NonNull::new(list).ok_or_else(null_err)?;
        let count = usize::try_from(n).unwrap_or(0);
        // SAFETY: the list holds `n` contexts followed by a NULL, valid until it is freed; the
        // pointers are copied out before that.
        let ptrs: Vec<_> = unsafe { std::slice::from_raw_parts(list.as_ptr(), count) }.to_vec();
        let contexts = ptrs
            .into_iter()
            .filter_map(NonNull::new)
            .map(|ptr| {
                Self::of_cm_device(Borrowed {
                    ptr,
                    _owner: PhantomData,
                })
            })
            .collect();
        // SAFETY: from `rdma_get_devices` above, freed once; each context holds its own list.
        unsafe { sys::rdma_free_devices(list.as_ptr()) };
        contexts
    }

    /// The borrowed view of this context.
    pub(crate) fn as_ref(&self) -> ContextRef<'_> {
        // Closed (or given back) only in `Drop`, after every borrow of `self` has ended.
        Borrowed {
            ptr: self.ptr,
            _owner: PhantomData,
        }
    }

    pub(crate) fn async_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `async_fd` is opened by ibv_open_device and closed by ibv_close_device, which
        // runs only in Drop, after every borrow of self has ended.
        unsafe { BorrowedFd::borrow_raw(self.raw_async_fd()) }
    }

    fn raw_async_fd(&self) -> RawFd {
        // SAFETY: `ptr` is a live context; `async_fd` is written once at open.
        unsafe { (*self.ptr.as_ptr()).async_fd }
    }

    /// Whether we opened the context ourselves (`ibv_open_device`), so that nothing else in the
    /// process uses it; `false` for librdmacm's, which every user of its device shares.
    pub(crate) fn is_own(&self) -> bool {
        matches!(self.owner, Owner::Opened)
    }

    pub(crate) fn name(&self) -> String {
        self.as_ref().name()
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

    /// `ibv_query_device`'s `max_qp_rd_atom` and `max_qp_init_rd_atom`.
    pub(crate) fn read_atomic_limits(&self) -> io::Result<(i32, i32)> {
        let mut attr = MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: live context, `attr` is a valid out-pointer of the right type.
        let ret = unsafe { sys::ibv_query_device(self.ptr.as_ptr(), attr.as_mut_ptr()) };
        sys::cvt_errno(ret)?;
        // SAFETY: zero-initialised, then filled by a successful ibv_query_device.
        let attr = unsafe { attr.assume_init() };
        Ok((attr.max_qp_rd_atom, attr.max_qp_init_rd_atom))
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
            sys::_ibv_query_gid_ex(
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

    /// `ibv_get_async_event` without waiting: `Ok(None)` when no event is ready.
    ///
    /// The read is done only once `poll` with a zero timeout says an event is ready, and such
    /// reads are serialised process-wide, so that two of ours never both see one event and the
    /// loser then waits in the read. That holds whatever the fd's flags: our own context's fd is
    /// set `O_NONBLOCK` by the safe layer, but safe code can dup it and clear the flag on the
    /// shared file; librdmacm's context is shared with whatever else in the process uses the
    /// device, so its fd's flags are left alone (setting `O_NONBLOCK` would make every other
    /// blocking reader of it fail with `EAGAIN`). A reader outside evchan that takes the event
    /// between the poll and the read makes this call wait for the next event: the price of not
    /// owning every reader of the file.
    pub(crate) fn get_async_event(&self) -> io::Result<Option<RawAsyncEvent>> {
        static READS: Mutex<()> = Mutex::new(());
        let _serial = READS.lock().unwrap_or_else(PoisonError::into_inner);
        if !sys::fd::poll_readable(self.async_fd(), Some(Duration::ZERO))? {
            return Ok(None);
        }
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
        match self.owner {
            Owner::Opened => {
                // SAFETY: every child object borrows the context, so none is alive; closed
                // once. A failure cannot be acted upon here (the handle is gone either way).
                let _ = unsafe { sys::ibv_close_device(self.ptr.as_ptr()) };
            }
            Owner::RdmaCm(list) => {
                // SAFETY: every child object borrows the context, so none is alive; the list
                // came from `rdma_get_devices` and is freed once. librdmacm may close the
                // context afterwards (device removed and no reference left), never before.
                unsafe { sys::rdma_free_devices(list.as_ptr()) };
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Borrowed views of what an rdma_cm id holds
// ---------------------------------------------------------------------------------------------

impl ContextRef<'_> {
    /// `ibv_get_device_name(context->device)`.
    pub(crate) fn name(&self) -> String {
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
}

impl PdRef<'_> {
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
