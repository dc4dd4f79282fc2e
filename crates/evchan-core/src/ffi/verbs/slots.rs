//! Registered slot pools: the allocation, the slot tokens' access to their bytes, and posting a
//! slot (the unsafe half of `crate::verbs::slots`).
//!
//! # Safety
//!
//! A [`SlotRegion`] is one zeroed, page-aligned mapping (`mmap`) of `count × size` bytes behind a raw
//! pointer: Rust code holds no reference to its bytes except through a [`RawSlot`], the one
//! token of one slot (`index`), made exactly once per index, when the region is created, and
//! never cloned. So the references a token hands out (`bytes`, `bytes_mut`, for `&self` /
//! `&mut self`) cover only its own slot and follow the borrow rules of the token itself.
//!
//! The device reaches the bytes only through a registration (`ibv_reg_mr` of the whole region,
//! by [`MrBuffer::registered_bytes`] of the [`SlotPool`]) and only where a posted work request
//! names them. [`post_slot`] posts exactly one slot's bytes, after checking that the slot is of
//! the region the memory region registered and that the memory region is of the QP's PD, and
//! returns the token *moved into* the posted request's record: while the device may read or
//! write the slot, its token is inside a `PostedSlot`, which shows no bytes, and gives the token
//! back only for that work request's completion (after which the device no longer touches it).
//! A `PostedSlot` that is dropped or forgotten never gives it back: nothing can read those bytes
//! again.
//!
//! The region is freed when the last `Arc` of it goes: the [`SlotPool`]'s (inside a registered
//! `Mr` until `ibv_dereg_mr` succeeded, leaked if it failed) and every token's (including those
//! inside posted requests). So it is never freed while registered — and once deregistered, the
//! device can no longer reach it, posted or not (a request still queued fails with a protection
//! error); it is never freed while a token, posted or not, could still reach it.
//!
//! As an [`MrBuffer`], a [`SlotPool`] shows *no* bytes (`as_slice`/`as_mut_slice` are the empty
//! slice at the region's start): a slice of the whole pool would alias the tokens' slices, and
//! the bytes of posted slots.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use evchan_sys as sys;

use super::mr::Sealed;
use super::{Mr, MrBuffer, QpPtr, SendFlags, Sge};
use crate::verbs::{SlotError, SlotPool};

/// One mapping of `count` slots of `size` bytes, zeroed and page-aligned, reached only
/// through raw pointers (see the module's docs).
///
/// The bytes are an anonymous private mapping of their own (`mmap`), unmapped when the region
/// goes: so a pool's memory goes back to the system when the pool is freed, which memory from
/// the allocator does not (glibc keeps a freed pool's pages in its arenas, and raises its
/// mapping threshold after each freed mapping, so a burst of connections would leave the
/// process at its peak for good).
pub(crate) struct SlotRegion {
    base: NonNull<u8>,
    /// The mapping's length: the slots' bytes rounded up to whole pages.
    mapped: usize,
    count: usize,
    size: usize,
}

// SAFETY: the region is plain memory; every access to its bytes goes through a `RawSlot` (whose
// own borrows order it) or through the device (ordered by posting and completions).
unsafe impl Send for SlotRegion {}
// SAFETY: `&SlotRegion` reads only the immutable fields (base, count, size), never the bytes.
unsafe impl Sync for SlotRegion {}

/// A new anonymous private mapping of `len` (at least 1) zeroed bytes, readable and writable.
pub(crate) fn map_zeroed(len: usize) -> io::Result<NonNull<u8>> {
    if len == 0 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: an anonymous private mapping of a non-zero length at an address of the kernel's
    // choice: it touches no existing memory. Its pages read as zero.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

impl SlotRegion {
    /// The length of the mapping of `count` slots of `size` bytes (whole pages); `None` for
    /// sizes that `new` refuses.
    pub(crate) fn mapped_bytes(count: usize, size: usize) -> Option<usize> {
        if count == 0 || size == 0 || u32::try_from(size).is_err() {
            return None;
        }
        count
            .checked_mul(size)?
            .checked_next_multiple_of(page_size())
            .filter(|&n| isize::try_from(n).is_ok())
    }

    /// Allocates the region and makes every slot's token, once, each wrapped by `wrap`.
    pub(crate) fn new<T>(
        count: usize,
        size: usize,
        wrap: impl FnMut(RawSlot) -> T,
    ) -> Result<(Arc<Self>, Vec<T>), SlotError> {
        if count == 0 {
            return Err(SlotError::NoSlots);
        }
        if size == 0 {
            return Err(SlotError::EmptySlot);
        }
        if u32::try_from(size).is_err() {
            return Err(SlotError::SlotTooLarge { size });
        }
        let rounded =
            Self::mapped_bytes(count, size).ok_or(SlotError::PoolTooLarge { count, size })?;
        // The tokens' vector first, so that its failure is an error too, not an abort.
        let mut slots = Vec::new();
        slots
            .try_reserve_exact(count)
            .map_err(|_| SlotError::OutOfMemory {
                bytes: count.saturating_mul(std::mem::size_of::<T>()),
            })?;
        let base = map_zeroed(rounded).map_err(|_| SlotError::OutOfMemory { bytes: rounded })?;
        let region = Arc::new(SlotRegion {
            base,
            mapped: rounded,
            count,
            size,
        });
        slots.extend(
            (0..count)
                .map(|index| RawSlot {
                    region: Arc::clone(&region),
                    index,
                })
                .map(wrap),
        );
        Ok((region, slots))
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }

    pub(crate) fn slot_size(&self) -> usize {
        self.size
    }

    /// The first byte (as an address, for `Debug` and identity; never dereferenced as such).
    pub(crate) fn addr(&self) -> *const u8 {
        self.base.as_ptr()
    }
}

impl Drop for SlotRegion {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length, unmapped once. The last `Arc` is gone: no
        // token can reach the bytes, and the pool is out of any memory region (a registered
        // `Mr` owns it until `ibv_dereg_mr` succeeded, and leaks it otherwise), so the device
        // cannot reach them either. A failure (only `EINVAL` for arguments `new` made valid)
        // would leave the mapping in place: a leak, nothing unsound.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped) };
    }
}

/// The exclusive token of slot `index` of `region`: made once per index by
/// [`SlotRegion::new`], never cloned.
pub(crate) struct RawSlot {
    region: Arc<SlotRegion>,
    index: usize,
}

impl RawSlot {
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn capacity(&self) -> usize {
        self.region.size
    }

    pub(crate) fn region(&self) -> &SlotRegion {
        &self.region
    }

    fn start(&self) -> *mut u8 {
        // In bounds: index < count, and count × size bytes are allocated.
        self.region
            .base
            .as_ptr()
            .wrapping_add(self.index * self.region.size)
    }

    /// The first `len` bytes of the slot (at most its capacity).
    pub(crate) fn bytes(&self, len: usize) -> &[u8] {
        let len = len.min(self.region.size);
        // SAFETY: the slot's bytes are allocated (this token holds the region), initialised
        // (zeroed at allocation, then written as bytes only), and reachable only through this
        // token, which is not posted (a posted token is inside its `PostedSlot`, which never
        // lends it out): the device does not write them while `&self` lives.
        unsafe { std::slice::from_raw_parts(self.start(), len) }
    }

    /// The whole slot, mutably.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` on the slot's only token makes this the only
        // reference to these bytes.
        unsafe { std::slice::from_raw_parts_mut(self.start(), self.region.size) }
    }
}

// SAFETY: `as_slice`/`as_mut_slice` are the empty slice at the region's start on every call,
// so they alias no slot; `registered_bytes` is the whole region, at one address for the pool's
// life (the allocation never moves, and the pool's `Arc` keeps it allocated until the pool is
// dropped, however the pool is moved).
unsafe impl MrBuffer for SlotPool {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: an empty slice at a non-null, aligned (u8) pointer of a live allocation.
        unsafe { std::slice::from_raw_parts(self.raw.base.as_ptr(), 0) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; an empty slice aliases nothing.
        unsafe { std::slice::from_raw_parts_mut(self.raw.base.as_ptr(), 0) }
    }

    fn registered_bytes(&mut self, _: Sealed) -> (*mut u8, usize) {
        (self.raw.base.as_ptr(), self.raw.count * self.raw.size)
    }
}

/// What to post a slot for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SlotOp {
    /// A receive into the whole slot.
    Recv,
    /// A signaled SEND of the slot's first `len` bytes (none: no scatter/gather element), with
    /// immediate data when `imm` is `Some`.
    Send { len: usize, imm: Option<u32> },
    /// A signaled one-sided operation with the slot's first `len` bytes as its local side.
    Remote { len: usize, op: super::qp::RemoteOp },
}

/// Why a slot was not posted.
#[derive(Debug)]
pub(crate) enum SlotRefusal {
    /// The slot is not of the pool that the memory region registered.
    NotOfPool,
    /// The memory region is of another PD than the QP's.
    ForeignPd,
    /// A UD QP, or the `ibv_post_*` error.
    Io(io::Error),
}

/// The PD of a memory region.
fn mr_pd(mr: &Mr<'_, SlotPool>) -> *mut sys::ibv_pd {
    // SAFETY: live MR (borrowed); `pd` is written once, at registration.
    unsafe { (*mr.ptr.as_ptr()).pd }
}

/// The PD of a QP.
fn qp_pd(qp: QpPtr<'_>) -> *mut sys::ibv_pd {
    // SAFETY: live QP (borrowed); `pd` is written at creation.
    unsafe { (*qp.ptr.as_ptr()).pd }
}

/// Posts `slot` on `qp` for `op`, with a fresh owned `wr_id` (top bit set, the counter of the
/// owned posts): `Ok(wr_id)`, the token to be kept in the posted request's record until its
/// completion; or the refusal with the token back.
///
/// Refused before the call: a slot not of the region `mr` registered (compared by the region's
/// address, which `mr`'s buffer shows and keeps allocated), an `mr` of another PD than `qp`'s
/// (across two devices an lkey of one could name memory of the other), a UD QP (a receive there
/// starts with a 40-byte GRH and a send needs an address handle).
pub(crate) fn post_slot(
    qp: QpPtr<'_>,
    mr: &Mr<'_, SlotPool>,
    slot: RawSlot,
    op: SlotOp,
) -> Result<(u64, RawSlot), (SlotRefusal, RawSlot)> {
    if mr.bytes().as_ptr() != slot.region.addr() {
        return Err((SlotRefusal::NotOfPool, slot));
    }
    if mr_pd(mr) != qp_pd(qp) {
        return Err((SlotRefusal::ForeignPd, slot));
    }
    if qp.qp_type() == sys::ibv_qp_type::IBV_QPT_UD {
        return Err((
            SlotRefusal::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "slots are posted on connected (RC) QPs only; this QP is UD",
            )),
            slot,
        ));
    }
    let len = match op {
        SlotOp::Recv => slot.capacity(),
        SlotOp::Send { len, .. } | SlotOp::Remote { len, .. } => len.min(slot.capacity()),
    };
    let one = [Sge {
        addr: slot.start() as u64,
        // At most the slot size, which `SlotRegion::new` checked fits in a u32.
        length: u32::try_from(len).unwrap_or(u32::MAX),
        lkey: mr.lkey(),
    }];
    let sges: &[Sge] = if len == 0 { &[] } else { &one };
    let wr_id = super::mr::fresh_owned_wr_id();
    // SAFETY: the element lies in slot `index` of the region `mr` registered (checked above:
    // same region; index < count and len ≤ size, so inside the `count × size` registered
    // bytes), under `mr`'s lkey, and `mr` is of `qp`'s PD (checked). The caller keeps the token
    // in the request's record, which shows no bytes and gives the token back only for this
    // request's completion, so nobody else reads or writes the slot meanwhile; the token keeps
    // the region allocated, and a registered `Mr` keeps it allocated too. If the `Mr` is
    // deregistered first, the device can no longer reach the bytes (the request fails with a
    // protection error), which is as safe. Every pool is registered with local write access.
    let posted = unsafe { post_op(qp, wr_id, sges, op) };
    match posted {
        Ok(()) => Ok((wr_id, slot)),
        Err(e) => Err((SlotRefusal::Io(e), slot)),
    }
}

/// Posts `op` (signaled) with `sges` as its local side: a receive into them, a SEND of them,
/// or a one-sided operation whose local side they are.
///
/// # Safety
///
/// `sges` lie in memory registered (with local write access, unless `op` is a SEND) under
/// their lkeys on `qp`'s PD, which nobody else reads or writes until the request's
/// completion, and which stays allocated until then (or until its region is deregistered).
pub(crate) unsafe fn post_op(
    qp: QpPtr<'_>,
    wr_id: u64,
    sges: &[Sge],
    op: SlotOp,
) -> io::Result<()> {
    match op {
        // SAFETY: the caller's contract.
        SlotOp::Recv => unsafe { qp.post_recv(wr_id, sges) },
        // SAFETY: the caller's contract; the device only reads. Signaled: a completion comes.
        SlotOp::Send { imm, .. } => unsafe {
            qp.post_send(
                wr_id,
                sges,
                imm,
                SendFlags {
                    signaled: true,
                    solicited: false,
                },
            )
        },
        // SAFETY: the caller's contract: read by a WRITE, written by a READ or an atomic.
        // Signaled.
        SlotOp::Remote { op, .. } => unsafe { qp.post_remote(wr_id, sges, op) },
    }
}
