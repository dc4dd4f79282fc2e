//! Slots shared by a shard's connections on one device (by slot size): a connection takes a
//! slot when it posts a message, a control message, a one-sided operation or a receive, keeps
//! it as a spare after the completion (a received message's once the application is done with
//! it), and gives its spares back at its keepalive's next look or its release, so an idle
//! connection holds no send memory and only the receives its credits need. (Its bounds,
//! `Config::send_depth` data and `ctrl_slots` control work requests in flight, and the
//! receives its credits ask for, are counts on its path.)
//!
//! The slots come in chunks, each a mapping registered once on the device's PD (made outside
//! the pool's lock). A new chunk is made when every slot is taken. A chunk whose slots have
//! all been back for [`IDLE_TICKS`] looks of its runtime's thread ([`trim_all`], every 50 ms,
//! so about a second) is unmapped, but for the pool's first chunk while a connection uses the
//! pool; every chunk with all its slots back goes when the last connection using the pool is
//! released (nothing stays registered for a device nobody uses). A load that comes and goes
//! within the second does not register and unmap in turn.
//!
//! The lock is the pool's own, taken under a connection's path lock (never the other way
//! round), for a `Vec` push or pop.

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

/// Looks of the runtime's thread a chunk stays with all its slots back before it goes.
const IDLE_TICKS: u32 = 20;

/// Every pool of the process, for [`trim_all`].
static POOLS: Mutex<Vec<std::sync::Weak<SharedPool>>> = Mutex::new(Vec::new());

/// One look at every pool of the process: unmaps the chunks idle for [`IDLE_TICKS`] looks
/// (module docs). Called by each runtime's thread at every look at its devices.
pub(crate) fn trim_all() {
    let pools: Vec<Arc<SharedPool>> = {
        let mut all = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(std::sync::Weak::upgrade).collect()
    };
    for pool in pools {
        pool.trim();
    }
}

/// One registered mapping of slots, with those not taken.
struct Chunk {
    mr: Arc<OwnedMr<SlotPool>>,
    /// The address of slot 0: slot `i` is at `base + i × size`.
    base: usize,
    count: usize,
    free: Vec<Slot>,
    /// Looks since a slot was last taken from it with all its slots back.
    idle: u32,
}

struct Chunks {
    chunks: Vec<Chunk>,
    /// Connections using the pool (made, not yet released).
    users: usize,
}

/// A shard's slots of one size on one device (module docs).
pub(crate) struct SharedPool {
    pd: OwnedPd,
    size: usize,
    inner: Mutex<Chunks>,
}

impl std::fmt::Debug for SharedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPool")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Where a slot's bytes begin, less its index's offset: its chunk's `base`.
fn base_of(slot: &Slot, size: usize) -> usize {
    (slot.as_slice().as_ptr() as usize).wrapping_sub(slot.index() * size)
}

impl SharedPool {
    pub(crate) fn new(pd: OwnedPd, size: usize) -> Arc<Self> {
        let pool = Arc::new(Self {
            pd,
            size,
            inner: Mutex::new(Chunks {
                chunks: Vec::new(),
                users: 0,
            }),
        });
        POOLS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::downgrade(&pool));
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Chunks> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection starts using the pool; [`PoolUser`]'s drop ends it.
    pub(crate) fn user(self: &Arc<Self>) -> PoolUser {
        self.lock().users += 1;
        PoolUser(Arc::clone(self))
    }

    /// A free slot (length 0) and its chunk's region, a new chunk made (outside the lock) when
    /// none is free.
    ///
    /// # Errors
    /// A chunk that could not be mapped or registered.
    pub(crate) fn take(&self) -> Result<(Arc<OwnedMr<SlotPool>>, Slot)> {
        if let Some(taken) = self.take_free() {
            return Ok(taken);
        }
        let count = chunk_slots(self.size);
        let (pool, mut slots) = SlotPool::new(count, self.size)?;
        let mr = Arc::new(OwnedMr::new(&self.pd, pool)?);
        let base = base_of(&slots[0], self.size);
        debug_assert!(slots.iter().all(|s| base_of(s, self.size) == base));
        // Taken from the end, slot 0 last.
        slots.reverse();
        let slot = slots.pop().expect("a chunk has slots");
        self.lock().chunks.push(Chunk {
            mr: Arc::clone(&mr),
            base,
            count,
            free: slots,
            idle: 0,
        });
        Ok((mr, slot))
    }

    /// A free slot of a chunk there is, if any: the first chunks first, so that the last ones
    /// empty out and can go.
    fn take_free(&self) -> Option<(Arc<OwnedMr<SlotPool>>, Slot)> {
        let mut inner = self.lock();
        let c = inner.chunks.iter_mut().find(|c| !c.free.is_empty())?;
        c.idle = 0;
        let slot = c.free.pop().expect("found non-empty");
        Some((Arc::clone(&c.mr), slot))
    }

    /// A slot back (its work request completed, or was never posted, or its QP is destroyed).
    pub(crate) fn give(&self, mut slot: Slot) {
        let _ = slot.set_len(0);
        let base = base_of(&slot, self.size);
        let mut inner = self.lock();
        if let Some(c) = inner.chunks.iter_mut().find(|c| c.base == base) {
            c.free.push(slot);
        }
        // (Else not one of ours, which cannot happen: dropped, its mapping kept by the slot.)
    }

    /// One look: chunks with all their slots back count one more idle look, and go after
    /// [`IDLE_TICKS`] (but the first while the pool has users).
    fn trim(&self) {
        let dropped: Vec<Chunk> = {
            let mut inner = self.lock();
            let keep_first = inner.users > 0;
            let mut dropped = Vec::new();
            let mut i = 0;
            while i < inner.chunks.len() {
                let c = &mut inner.chunks[i];
                if c.free.len() < c.count {
                    c.idle = 0;
                } else {
                    c.idle = c.idle.saturating_add(1);
                }
                if c.idle >= IDLE_TICKS && !(keep_first && i == 0) {
                    dropped.push(inner.chunks.remove(i));
                } else {
                    i += 1;
                }
            }
            dropped
        };
        // Deregistered and unmapped after the lock.
        drop(dropped);
    }
}

/// A connection's use of a [`SharedPool`]: the last one's drop lets every chunk with all its
/// slots back go.
#[derive(Debug)]
pub(crate) struct PoolUser(Arc<SharedPool>);

impl PoolUser {
    pub(crate) fn pool(&self) -> &SharedPool {
        &self.0
    }

    /// The pool itself, for the slots that outlive the connection's use of it (messages the
    /// application still holds).
    pub(crate) fn shared(&self) -> Arc<SharedPool> {
        Arc::clone(&self.0)
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
