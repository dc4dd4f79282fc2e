//! Memory exposed to peers (the unsafe half of `crate::verbs::remote`).
//!
//! # Safety
//!
//! An [`ExposedMem`] is an anonymous mapping of its own, reached only through raw pointers.
//! While it is registered with remote access, a peer's device may write any of its bytes at
//! any time, so no `&[u8]` or `&mut [u8]` over them is ever made: the buffer shows the empty
//! slice as an [`MrBuffer`] (as a slot pool does), and its bytes are read and written only
//! through `AtomicU64` accesses of the aligned words that hold them, one size for every access
//! (Rust's model makes racing atomic accesses of different sizes to overlapping bytes
//! undefined): a byte is copied out of a word's load, and copied in by a compare-and-swap loop
//! on its word (a whole word by a store). The mapping is whole pages, page aligned, so the
//! word of every byte of `len` lies inside it. The slices of
//! [`revoked_bytes`](ExposedMem::revoked_bytes) are made only once every registration of the
//! mapping is gone: `Revoked` holds the buffer only after `ibv_dereg_mr` returned for each
//! ([`Grants::into_inner`]: the further registrations, then the first).

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::mr::{MrBuffer, Sealed};

/// A zeroed anonymous mapping of `len` bytes (whole pages mapped).
pub(crate) struct ExposedMem {
    base: NonNull<u8>,
    len: usize,
    mapped: usize,
}

// SAFETY: plain memory, reached only through atomics (or, revoked, through `&self`/`&mut self`
// borrows of the owner).
unsafe impl Send for ExposedMem {}
// SAFETY: `&ExposedMem` reaches the bytes only through atomic accesses.
unsafe impl Sync for ExposedMem {}

impl ExposedMem {
    /// Maps `len` (at least 1) zeroed bytes.
    pub(crate) fn new(len: usize) -> io::Result<Self> {
        let page = super::slots::page_size();
        let mapped = len
            .checked_next_multiple_of(page)
            .filter(|&n| n > 0 && isize::try_from(n).is_ok())
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let base = super::slots::map_zeroed(mapped)?;
        Ok(Self { base, len, mapped })
    }

    pub(crate) fn addr(&self) -> *const u8 {
        self.base.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The word `w` (< `mapped / 8`) as an atomic.
    fn atomic(&self, w: usize) -> &AtomicU64 {
        debug_assert!(w < self.mapped / 8);
        let word = self.base.as_ptr().wrapping_add(w * 8).cast::<u64>();
        // SAFETY: inside the live mapping (w * 8 + 8 <= mapped), which lives as long as
        // `&self`; 8-byte aligned (the mapping is page aligned); every access to it while
        // shared is a `u64` atomic (module docs).
        unsafe { AtomicU64::from_ptr(word) }
    }

    /// The words that hold `offset..offset + len`, each with the part of it in the range:
    /// `(word, first byte in the word, bytes, their index in the range)`; `Err` when the range
    /// is not inside.
    #[allow(clippy::type_complexity)]
    fn spans(
        &self,
        offset: usize,
        len: usize,
    ) -> Result<impl Iterator<Item = (&AtomicU64, usize, usize, usize)>, ()> {
        let end = offset.checked_add(len).ok_or(())?;
        if end > self.len {
            return Err(());
        }
        let mut at = offset;
        Ok(std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let (w, first) = (at / 8, at % 8);
            let n = (8 - first).min(end - at);
            let span = (self.atomic(w), first, n, at - offset);
            at += n;
            Some(span)
        }))
    }

    /// Copies `offset..offset + out.len()` out; `Err` when the range is not inside.
    pub(crate) fn load(&self, offset: usize, out: &mut [u8]) -> Result<(), ()> {
        for (word, first, n, i) in self.spans(offset, out.len())? {
            let bytes = word.load(Ordering::Relaxed).to_ne_bytes();
            out[i..i + n].copy_from_slice(&bytes[first..first + n]);
        }
        Ok(())
    }

    /// Copies `data` in at `offset`; `Err` when the range is not inside.
    pub(crate) fn store(&self, offset: usize, data: &[u8]) -> Result<(), ()> {
        for (word, first, n, i) in self.spans(offset, data.len())? {
            let part = &data[i..i + n];
            if n == 8 {
                word.store(
                    u64::from_ne_bytes(part.try_into().expect("8 bytes")),
                    Ordering::Relaxed,
                );
            } else {
                // Only this word's other bytes are kept: a peer's write to them meanwhile is
                // not lost (the swap fails and is made again).
                let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                    let mut bytes = old.to_ne_bytes();
                    bytes[first..first + n].copy_from_slice(part);
                    Some(u64::from_ne_bytes(bytes))
                });
            }
        }
        Ok(())
    }

    /// The aligned 8-byte word at `offset`, inside; `None` otherwise.
    pub(crate) fn word(&self, offset: usize) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8) || offset.checked_add(8)? > self.len {
            return None;
        }
        Some(self.atomic(offset / 8))
    }

    /// The bytes, once revoked (see the module docs: only `Revoked` calls it).
    pub(crate) fn revoked_bytes(&self) -> &[u8] {
        // SAFETY: no registration reaches the mapping any more (the caller holds it only after
        // `ibv_dereg_mr`), and every other access borrows `self`.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }

    /// As [`revoked_bytes`](Self::revoked_bytes), mutably.
    pub(crate) fn revoked_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }
}

impl Drop for ExposedMem {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length, unmapped once. The owner drops the buffer
        // only after its deregistration succeeded (`Mr` leaks it otherwise), so no device can
        // reach it.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped) };
    }
}

/// `MrBuffer` for a view of a mapping (`base`, `len`) that shows no bytes: the slices are
/// empty (no byte is ever borrowed through them), and `registered_bytes` is the mapping's
/// `len` bytes, at one address for the buffer's life however it is moved.
/// Each use says why its mapping outlives the registrations.
macro_rules! shows_no_bytes {
    ($t:ty) => {
        // SAFETY: the slices are empty and `registered_bytes` is the mapping's `len` bytes at
        // a fixed address; the mapping's life is the invoking site's SAFETY comment.
        unsafe impl MrBuffer for $t {
            fn as_slice(&self) -> &[u8] {
                // SAFETY: an empty slice at a non-null pointer.
                unsafe { std::slice::from_raw_parts(self.base.as_ptr(), 0) }
            }

            fn as_mut_slice(&mut self) -> &mut [u8] {
                // SAFETY: as above; an empty slice aliases nothing.
                unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), 0) }
            }

            fn registered_bytes(&mut self, _: Sealed) -> (*mut u8, usize) {
                (self.base.as_ptr(), self.len)
            }
        }
    };
}

// SAFETY: the buffer owns the mapping, unmapped only in its drop (after its registration is
// gone: `Mr` leaks it otherwise).
shows_no_bytes!(ExposedMem);

/// A second registration of an [`ExposedMem`]'s mapping, which it does not own: only
/// [`Grants`] makes one, and deregisters it before the mapping can go.
pub(crate) struct Alias {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory reached only through the device (the alias shows no bytes).
unsafe impl Send for Alias {}
// SAFETY: as above.
unsafe impl Sync for Alias {}

// SAFETY: the mapping stays mapped for as long as the alias is registered: only `Grants`
// makes one, and it deregisters every alias before the mapping can go (leaking the mapping
// if one fails).
shows_no_bytes!(Alias);

/// An exposed mapping's registrations: the first (which owns the mapping) and further ones
/// over the same bytes, each with its own rkey and deregistered alone. The mapping is unmapped
/// only once every registration of it is gone: the further ones are deregistered first (in
/// [`into_inner`](Self::into_inner) and in the drop), and if any deregistration ever failed
/// (that registration may still be in force), the mapping is leaked, never unmapped.
pub(crate) struct Grants {
    /// Deregistered before the first registration, one by one, by `release_more` (in
    /// `into_inner` and in the drop), which leaks the mapping if one of them fails: the
    /// vector is never dropped with an alias in it.
    more: Vec<crate::ffi::owned::MrCell<Alias>>,
    first: Option<crate::ffi::owned::MrCell<ExposedMem>>,
    /// A deregistration failed: the mapping must never be unmapped.
    poisoned: bool,
}

impl Grants {
    pub(crate) fn new(first: crate::ffi::owned::MrCell<ExposedMem>) -> Self {
        Self {
            more: Vec::new(),
            first: Some(first),
            poisoned: false,
        }
    }

    /// The first registration (its buffer is the mapping).
    pub(crate) fn first(&self) -> &crate::ffi::owned::MrCell<ExposedMem> {
        self.first.as_ref().expect("present until into_inner")
    }

    /// Registers the mapping once more on the first registration's PD with `access`: the
    /// new registration's rkey.
    pub(crate) fn add(&mut self, access: u32) -> crate::verbs::Result<u32> {
        let first = self.first();
        let mem = first.mr().buffer();
        let alias = Alias {
            base: NonNull::new(mem.addr().cast_mut()).expect("a mapping is not null"),
            len: mem.len(),
        };
        let cell = crate::ffi::owned::MrCell::with_access(Arc::clone(first.pd()), alias, access)
            .map_err(|(e, _)| e)?;
        let rkey = cell.mr().rkey();
        self.more.push(cell);
        Ok(rkey)
    }

    /// The further registrations' rkeys.
    pub(crate) fn rkeys(&self) -> impl Iterator<Item = u32> + '_ {
        self.more.iter().map(|c| c.mr().rkey())
    }

    /// Deregisters the further registration with `rkey`; `Ok(false)` when there is none.
    pub(crate) fn remove(&mut self, rkey: u32) -> crate::verbs::Result<bool> {
        let Some(i) = self.more.iter().position(|c| c.mr().rkey() == rkey) else {
            return Ok(false);
        };
        let cell = self.more.swap_remove(i);
        cell.into_inner()
            .map(|_| true)
            .inspect_err(|_| self.poisoned = true)
    }

    /// Deregisters every registration (the further ones first) and gives the mapping back;
    /// on a failure the mapping is leaked and the error returned.
    pub(crate) fn into_inner(mut self) -> crate::verbs::Result<ExposedMem> {
        self.release_more()?;
        let first = self.first.take().expect("present until into_inner");
        first.into_inner()
    }

    fn release_more(&mut self) -> crate::verbs::Result<()> {
        let mut result = Ok(());
        for cell in self.more.drain(..) {
            if let Err(e) = cell.into_inner() {
                self.poisoned = true;
                result = Err(e);
            }
        }
        if self.poisoned {
            // A further registration may still be in force: the mapping stays, for good. The
            // first registration goes all the same (its rkey is refused from now on); only
            // its memory is leaked.
            if let Some(first) = self.first.take() {
                if let Ok(mem) = first.into_inner() {
                    std::mem::forget(mem);
                }
            }
            return result.and(Err(crate::verbs::Error::InvalidArgument(
                "a deregistration failed earlier: the memory is never given back",
            )));
        }
        result
    }
}

impl Drop for Grants {
    fn drop(&mut self) {
        // The further registrations first; the first one (and the mapping) after, unless one
        // of them may still be in force.
        let _ = self.release_more();
    }
}
