//! Send slots shared by a shard's connections on one device (by slot size): a connection
//! takes a slot when it posts a message, a control message or a one-sided operation, and
//! gives it back at the completion, so a connection with nothing in flight holds no send
//! memory. (Its bound, `Config::send_depth` data and `ctrl_slots` control work requests in
//! flight, is a count on its path.)
//!
//! The slots come in chunks, each a mapping registered once on the device's PD. A new chunk
//! is made when every slot is taken; a chunk whose slots have all come back is unmapped once
//! the other chunks have a chunk's worth of free slots (so a steady load does not register
//! and unmap in turn), and every chunk with all its slots back goes when the last connection
//! using the pool is released (nothing is kept registered for a device nobody uses).
//!
//! The lock is the pool's own, taken under a connection's path lock (never the other way
//! round), for a `Vec` push or pop: held no longer than that, but for the rare chunk made
//! (registered) or dropped.

use std::sync::{Arc, Mutex, PoisonError};

use evchan_core::verbs::{OwnedMr, OwnedPd, Slot, SlotPool};

use crate::error::Result;

/// The bytes a chunk aims at: 256 KiB (64 slots of the default 4 KiB), at least 4 slots and
/// at most 64.
const CHUNK_BYTES: usize = 256 * 1024;

/// Slots per chunk for slots of `size` bytes.
fn chunk_slots(size: usize) -> usize {
    (CHUNK_BYTES / size.max(1)).clamp(4, 64)
}

/// One registered mapping of slots, with those not taken.
struct Chunk {
    mr: Arc<OwnedMr<SlotPool>>,
    /// The address of slot 0: slot `i` is at `base + i × size`.
    base: usize,
    count: usize,
    free: Vec<Slot>,
}

struct Chunks {
    chunks: Vec<Chunk>,
    /// Connections using the pool (made, not yet released).
    users: usize,
}

/// A shard's send slots of one size on one device (module docs).
pub(crate) struct SendPool {
    pd: OwnedPd,
    size: usize,
    inner: Mutex<Chunks>,
}

impl std::fmt::Debug for SendPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendPool")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Where a slot's bytes begin, less its index's offset: its chunk's `base`.
fn base_of(slot: &Slot, size: usize) -> usize {
    (slot.as_slice().as_ptr() as usize).wrapping_sub(slot.index() * size)
}

impl SendPool {
    pub(crate) fn new(pd: OwnedPd, size: usize) -> Arc<Self> {
        Arc::new(Self {
            pd,
            size,
            inner: Mutex::new(Chunks {
                chunks: Vec::new(),
                users: 0,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Chunks> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection starts using the pool; [`PoolUser`]'s drop ends it.
    pub(crate) fn user(self: &Arc<Self>) -> PoolUser {
        self.lock().users += 1;
        PoolUser(Arc::clone(self))
    }

    /// A free slot (length 0) and its chunk's region, a new chunk made when none is free.
    ///
    /// # Errors
    /// A chunk that could not be mapped or registered.
    pub(crate) fn take(&self) -> Result<(Arc<OwnedMr<SlotPool>>, Slot)> {
        let mut inner = self.lock();
        // The first chunks first: the last ones empty out and can go.
        if let Some(c) = inner.chunks.iter_mut().find(|c| !c.free.is_empty()) {
            let slot = c.free.pop().expect("found non-empty");
            return Ok((Arc::clone(&c.mr), slot));
        }
        let count = chunk_slots(self.size);
        let (pool, mut slots) = SlotPool::new(count, self.size)?;
        let mr = Arc::new(OwnedMr::new(&self.pd, pool)?);
        let base = base_of(&slots[0], self.size);
        debug_assert!(slots.iter().all(|s| base_of(s, self.size) == base));
        // Taken from the end, slot 0 last.
        slots.reverse();
        let slot = slots.pop().expect("a chunk has slots");
        inner.chunks.push(Chunk {
            mr: Arc::clone(&mr),
            base,
            count,
            free: slots,
        });
        Ok((mr, slot))
    }

    /// A slot back (its work request completed, or was never posted, or its QP is destroyed).
    pub(crate) fn give(&self, mut slot: Slot) {
        let _ = slot.set_len(0);
        let base = base_of(&slot, self.size);
        let dropped = {
            let mut inner = self.lock();
            let Some(i) = inner.chunks.iter().position(|c| c.base == base) else {
                // Not one of ours (cannot happen): dropped, its mapping kept by the slot.
                return;
            };
            let c = &mut inner.chunks[i];
            c.free.push(slot);
            let empty = c.free.len() == c.count;
            let spare: usize = inner
                .chunks
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, c)| c.free.len())
                .sum();
            (empty && (inner.users == 0 || spare >= chunk_slots(self.size)))
                .then(|| inner.chunks.remove(i))
        };
        // Deregistered and unmapped after the lock.
        drop(dropped);
    }
}

/// A connection's use of a [`SendPool`]: the last one's drop lets every chunk with all its
/// slots back go.
#[derive(Debug)]
pub(crate) struct PoolUser(Arc<SendPool>);

impl PoolUser {
    pub(crate) fn pool(&self) -> &SendPool {
        &self.0
    }
}

impl Drop for PoolUser {
    fn drop(&mut self) {
        let dropped: Vec<Chunk> = {
            let mut inner = self.0.lock();
            inner.users = inner.users.saturating_sub(1);
            if inner.users > 0 {
                return;
            }
            let (empty, kept) = std::mem::take(&mut inner.chunks)
                .into_iter()
                .partition(|c| c.free.len() == c.count);
            inner.chunks = kept;
            empty
        };
        drop(dropped);
    }
}
