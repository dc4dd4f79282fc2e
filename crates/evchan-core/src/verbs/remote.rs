//! One-sided access: what a peer may do to our memory ([`Access`]), the descriptor that tells
//! it where ([`RemoteBuf`]), and memory exposed to it ([`Exposed`]).
//!
//! # The target side
//!
//! Once a peer holds a region's rkey, its device may write the bytes at any moment; a `&[u8]`
//! or `&mut [u8]` over them would then be undefined behaviour. So an [`Exposed`] region shows
//! no slice. While exposed, its bytes are reached only through `AtomicU64` accesses of their
//! aligned words, one size for every access (atomics of different sizes racing on the same
//! bytes are undefined in Rust's model): [`Exposed::read_at`] copies out of word loads,
//! [`Exposed::write_at`] copies in with word stores and, for a word it fills in part, a
//! compare-and-swap loop (the peer's bytes beside it are kept), and [`Exposed::atomic_u64`]
//! lends the `AtomicU64` of a word the peer's atomics use. What they see of a peer's write in
//! progress may be torn (part old, part new bytes).
//!
//! The bytes are ours again only after a revocation: [`Exposed::revoke`] deregisters the
//! region (`ibv_dereg_mr`) and only when that succeeded gives the memory back as a
//! [`Revoked`] buffer, a plain `[u8]`. What holds then, step by step:
//!
//! - After `ibv_dereg_mr` the device refuses the rkey for every new request (the peer gets a
//!   remote access error). `ibv_dereg_mr(3)` does not say what becomes of a request the
//!   device is processing at that moment.
//! - rdma_rxe (Linux 6.1, the soft-RoCE VM's kernel) looks the region up by its rkey for
//!   every packet of a READ, WRITE or atomic (`check_rkey` in `rxe_resp.c`), and holds a
//!   reference to it only while that packet is processed (`cleanup`). Its deregistration
//!   takes the region out of the lookup table first, so no later packet finds it, then waits
//!   until the references held are dropped (`__rxe_cleanup`: at most 50 s, with a kernel
//!   warning past that). So once `revoke` returned, no packet of the peer's places data in
//!   the bytes, a multi-packet WRITE in progress included: its remaining packets are refused
//!   (the peer's WRITE fails with a remote access error and both QPs enter the error state),
//!   and what it placed before stays. (Read in the driver's source; no test here races a
//!   revocation with a WRITE in flight.)
//! - Other providers: not established here.
//!
//! # The initiator side
//!
//! [`RemoteBuf`] names a peer's range and what it may do there (its type). The posts
//! ([`QpHandle::post_write_slot`](super::QpHandle::post_write_slot),
//! [`post_read_slot`](super::QpHandle::post_read_slot),
//! [`post_fetch_add_slot`](super::QpHandle::post_fetch_add_slot),
//! [`post_compare_swap_slot`](super::QpHandle::post_compare_swap_slot)) take the local bytes
//! as a [`Slot`](super::Slot), which belongs to the work request until its completion (the
//! same discipline as a send), check the range against the descriptor before posting (a typed
//! [`RemoteError`], nothing posted), and need the access in the descriptor's type:
//!
//! ```compile_fail
//! # use evchan_core::verbs::{QpHandle, Mr, SlotPool, Slot, RemoteBuf, RemoteRead};
//! # fn f(qp: &QpHandle, mr: &Mr<'_, SlotPool>, slot: Slot, buf: &RemoteBuf<RemoteRead>) {
//! let _ = qp.post_write_slot(mr, slot, buf, 0, None); // a read-only descriptor
//! # }
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;

use crate::ffi::owned::MrCell;
use crate::ffi::verbs::exposed::{ExposedMem, Grants};

use super::{Error, OwnedPd, Result};

mod sealed {
    pub trait Sealed {}
}

/// What a peer may do to exposed memory: [`RemoteRead`], [`RemoteWrite`],
/// [`RemoteReadWrite`] or [`RemoteAtomic`] (sealed).
pub trait Access: sealed::Sealed + Send + Sync + 'static {
    /// The `ibv_access_flags` of the registration (with `IBV_ACCESS_LOCAL_WRITE`, which remote
    /// write and atomic access need).
    #[doc(hidden)]
    const FLAGS: u32;
    /// The access bits of the wire form: 1 read, 2 write, 4 atomic.
    const WIRE: u8;
}

/// An access that lets the peer RDMA READ.
pub trait AllowsRead: Access {}
/// An access that lets the peer RDMA WRITE.
pub trait AllowsWrite: Access {}
/// An access that lets the peer run 8-byte atomics.
pub trait AllowsAtomic: Access {}

const LOCAL_WRITE: u32 = 1;
const REMOTE_WRITE: u32 = 2;
const REMOTE_READ: u32 = 4;
const REMOTE_ATOMIC: u32 = 8;

macro_rules! access {
    ($(#[$doc:meta])* $name:ident, $flags:expr, $wire:expr, [$($allows:ident),*]) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl Access for $name {
            const FLAGS: u32 = $flags;
            const WIRE: u8 = $wire;
        }
        $(impl $allows for $name {})*
    };
}

access!(
    /// The peer may read (`IBV_ACCESS_REMOTE_READ`).
    RemoteRead, LOCAL_WRITE | REMOTE_READ, 1, [AllowsRead]
);
access!(
    /// The peer may write (`IBV_ACCESS_REMOTE_WRITE`).
    RemoteWrite, LOCAL_WRITE | REMOTE_WRITE, 2, [AllowsWrite]
);
access!(
    /// The peer may read and write.
    RemoteReadWrite, LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE, 3, [AllowsRead, AllowsWrite]
);
access!(
    /// The peer may run 8-byte atomics (`IBV_ACCESS_REMOTE_ATOMIC`) on aligned words.
    RemoteAtomic, LOCAL_WRITE | REMOTE_ATOMIC, 4, [AllowsAtomic]
);

/// A peer's exposed range: its address, length and rkey, and in its type what we may do
/// there.
///
/// # Wire form
///
/// [`WIRE_LEN`](Self::WIRE_LEN) = 20 bytes, integers big-endian:
///
/// | bytes | field |
/// |---|---|
/// | 0–1 | `b"RB"` |
/// | 2 | version, 1 |
/// | 3 | access bits: 1 read, 2 write, 4 atomic (the others 0) |
/// | 4–11 | address |
/// | 12–15 | length |
/// | 16–19 | rkey |
///
/// [`from_bytes`](Self::from_bytes) takes untrusted bytes and checks what it can: the form,
/// that the access bits grant at least `A`'s, a length above 0, and a range that does not
/// wrap. A descriptor that lies can make our operations reach only what the peer's device
/// lets its rkey reach: outside the region it names they fail with a remote access error (a
/// lie naming another region of the peer's, with its rkey, succeeds there). It cannot make
/// them touch our own memory beyond their local slot.
pub struct RemoteBuf<A: Access> {
    addr: u64,
    len: u32,
    rkey: u32,
    access: u8,
    _access: PhantomData<fn() -> A>,
}

impl<A: Access> Clone for RemoteBuf<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A: Access> Copy for RemoteBuf<A> {}

impl<A: Access> PartialEq for RemoteBuf<A> {
    fn eq(&self, other: &Self) -> bool {
        (self.addr, self.len, self.rkey, self.access)
            == (other.addr, other.len, other.rkey, other.access)
    }
}

impl<A: Access> Eq for RemoteBuf<A> {}

impl<A: Access> fmt::Debug for RemoteBuf<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteBuf")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .finish()
    }
}

/// Why bytes are not a [`RemoteBuf`], or a range is not inside one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// Not [`RemoteBuf::WIRE_LEN`] bytes.
    #[error("a remote buffer descriptor is {expected} bytes, not {got}")]
    Length {
        /// The bytes given.
        got: usize,
        /// [`RemoteBuf::WIRE_LEN`].
        expected: usize,
    },
    /// Not a descriptor (its first bytes are not `RB`), or of a version this crate does not
    /// know.
    #[error("not a remote buffer descriptor (or an unknown version)")]
    Form,
    /// The descriptor grants less than the type asks, or has unknown access bits.
    #[error("the descriptor grants access {granted:#x}, not {needed:#x}")]
    Access {
        /// Its access bits.
        granted: u8,
        /// What the type needs.
        needed: u8,
    },
    /// A length of 0.
    #[error("an empty remote buffer")]
    Empty,
    /// The range wraps around the address space.
    #[error("the remote range wraps around the address space")]
    Wraps,
    /// A range (`offset`, `len`) that is not inside the descriptor's `remote_len` bytes.
    #[error("bytes {offset}..{offset}+{len} are outside the remote buffer's {remote_len}")]
    OutOfBounds {
        /// The offset asked.
        offset: u64,
        /// The length asked.
        len: u64,
        /// The descriptor's length.
        remote_len: u32,
    },
    /// The local slot holds fewer bytes than the operation moves.
    #[error("the local slot has {capacity} bytes, the operation moves {need}")]
    LocalTooSmall {
        /// The bytes the operation moves.
        need: usize,
        /// The slot's capacity.
        capacity: usize,
    },
    /// An atomic at an address that is not 8-byte aligned.
    #[error("a remote atomic needs an 8-byte aligned address, not {addr:#x}")]
    Misaligned {
        /// The address.
        addr: u64,
    },
}

impl<A: Access> RemoteBuf<A> {
    /// The length of the wire form.
    pub const WIRE_LEN: usize = 20;

    pub(crate) fn new(addr: u64, len: u32, rkey: u32) -> Self {
        Self {
            addr,
            len,
            rkey,
            access: A::WIRE,
            _access: PhantomData,
        }
    }

    /// The peer's address of the first byte.
    #[must_use]
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The length in bytes.
    #[must_use]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the length is 0 (never, for a descriptor this crate made or decoded).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The remote key.
    #[must_use]
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The wire form (see the type's docs).
    #[must_use]
    pub fn to_bytes(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        b[..2].copy_from_slice(b"RB");
        b[2] = 1;
        b[3] = self.access;
        b[4..12].copy_from_slice(&self.addr.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b
    }

    /// A descriptor from its wire form, from untrusted bytes: see the type's docs for what is
    /// checked. A descriptor that grants more than `A` is taken as `A` (read-write as read).
    ///
    /// # Errors
    /// [`RemoteError::Length`], [`Form`](RemoteError::Form),
    /// [`Access`](RemoteError::Access), [`Empty`](RemoteError::Empty),
    /// [`Wraps`](RemoteError::Wraps).
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, RemoteError> {
        let b: &[u8; 20] = bytes.try_into().map_err(|_| RemoteError::Length {
            got: bytes.len(),
            expected: Self::WIRE_LEN,
        })?;
        if &b[..2] != b"RB" || b[2] != 1 {
            return Err(RemoteError::Form);
        }
        let access = b[3];
        if access & !7 != 0 || access & A::WIRE != A::WIRE {
            return Err(RemoteError::Access {
                granted: access,
                needed: A::WIRE,
            });
        }
        let addr = u64::from_be_bytes(b[4..12].try_into().expect("8 bytes"));
        let len = u32::from_be_bytes(b[12..16].try_into().expect("4 bytes"));
        let rkey = u32::from_be_bytes(b[16..20].try_into().expect("4 bytes"));
        if len == 0 {
            return Err(RemoteError::Empty);
        }
        if addr.checked_add(u64::from(len)).is_none() {
            return Err(RemoteError::Wraps);
        }
        Ok(Self {
            addr,
            len,
            rkey,
            access: A::WIRE,
            _access: PhantomData,
        })
    }

    /// A descriptor from a peer's address, length and rkey as another protocol carries them
    /// (rping's `struct rping_rdma_info`, say): untrusted, with the checks of
    /// [`from_bytes`](Self::from_bytes) but the form's. The access `A` is the caller's claim;
    /// a peer's device refuses what its rkey does not allow.
    ///
    /// # Errors
    /// [`RemoteError::Empty`], [`RemoteError::Wraps`].
    pub fn from_parts(addr: u64, len: u32, rkey: u32) -> std::result::Result<Self, RemoteError> {
        Self::from_bytes(&Self::new(addr, len, rkey).to_bytes())
    }

    /// The sub-range `offset..offset + len` (to hand a peer part of a grant).
    ///
    /// # Errors
    /// [`RemoteError::OutOfBounds`], [`RemoteError::Empty`] for a length of 0.
    pub fn slice(&self, offset: u64, len: u32) -> std::result::Result<Self, RemoteError> {
        if len == 0 {
            return Err(RemoteError::Empty);
        }
        let addr = self.range(offset, u64::from(len))?;
        Ok(Self { addr, len, ..*self })
    }

    /// The peer's address of `offset`, once `offset..offset + len` is inside the buffer (the
    /// check the posts make).
    ///
    /// # Errors
    /// [`RemoteError::OutOfBounds`].
    pub fn range(&self, offset: u64, len: u64) -> std::result::Result<u64, RemoteError> {
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > u64::from(self.len)) {
            return Err(RemoteError::OutOfBounds {
                offset,
                len,
                remote_len: self.len,
            });
        }
        // Inside a range that does not wrap (checked when made).
        Ok(self.addr + offset)
    }

    /// As [`range`](Self::range), for an operation that moves `len` bytes, at least 1 (a READ,
    /// or a WRITE without immediate data).
    ///
    /// # Errors
    /// [`RemoteError::Empty`] for 0 bytes; [`RemoteError::OutOfBounds`].
    pub fn bytes_range(&self, offset: u64, len: usize) -> std::result::Result<u64, RemoteError> {
        if len == 0 {
            return Err(RemoteError::Empty);
        }
        self.range(offset, len as u64)
    }

    /// The address of the aligned 8-byte word at `offset` (the check the atomics make).
    ///
    /// # Errors
    /// [`RemoteError::OutOfBounds`], [`RemoteError::Misaligned`].
    pub fn word(&self, offset: u64) -> std::result::Result<u64, RemoteError> {
        let addr = self.range(offset, 8)?;
        if addr % 8 != 0 {
            return Err(RemoteError::Misaligned { addr });
        }
        Ok(addr)
    }
}

/// Memory exposed to peers with access `A`: a zeroed mapping of its own, registered with that
/// access on an [`OwnedPd`]. See the [module docs](crate::verbs::remote) for what holds while
/// it is exposed.
///
/// Each peer may get a grant of its own ([`grant`](Self::grant)), revoked alone
/// ([`revoke_grant`](Self::revoke_grant)).
///
/// Dropping it deregisters every grant, then unmaps the memory (if an `ibv_dereg_mr` fails, the
/// memory is leaked instead: that registration may still be in force).
/// [`mem::forget`](std::mem::forget) leaks the registrations and the memory, which are then
/// never reused: the peer may go on using its rkey, on memory nothing else will ever hold.
///
/// ```compile_fail
/// # fn f(e: &evchan_core::verbs::Exposed<evchan_core::verbs::RemoteWrite>) {
/// let bytes: &[u8] = &e[..]; // no slice of exposed bytes
/// # }
/// ```
pub struct Exposed<A: Access> {
    grants: Grants,
    /// The rkeys of the grants revoked alone, which a later grant never gets.
    revoked: Vec<u32>,
    _access: PhantomData<fn() -> A>,
}

impl<A: Access> Exposed<A> {
    /// Maps `len` zeroed bytes (whole pages) and registers them on `pd` with access `A`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or more than `u32::MAX` bytes; [`Error::Io`] with the
    /// `mmap` or `ibv_reg_mr` error (`ENOMEM` past `ulimit -l`; `EINVAL` where the device
    /// does not support the access, e.g. atomics).
    pub fn new(pd: &OwnedPd, len: usize) -> Result<Self> {
        if len == 0 || u32::try_from(len).is_err() {
            return Err(Error::InvalidArgument(
                "an exposed region has 1..=u32::MAX bytes",
            ));
        }
        let mem = ExposedMem::new(len).map_err(Error::io("mmap"))?;
        let cell = MrCell::with_access(std::sync::Arc::clone(pd.cell()), mem, A::FLAGS)
            .map_err(|(e, _)| e)?;
        Ok(Self {
            grants: Grants::new(cell),
            revoked: Vec::new(),
            _access: PhantomData,
        })
    }

    /// The descriptor of the whole region, to hand to the peer (in a message, or the private
    /// data of a connect or accept: 20 bytes in its wire form).
    #[must_use]
    pub fn descriptor(&self) -> RemoteBuf<A> {
        let mem = self.grants.first().mr().buffer();
        RemoteBuf::new(
            mem.addr() as u64,
            u32::try_from(mem.len()).expect("checked by new"),
            self.grants.first().mr().rkey(),
        )
    }

    /// The length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.grants.first().mr().buffer().len()
    }

    /// Whether the length is 0 (never).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies bytes `offset..offset + out.len()` out, by relaxed atomic loads of their words
    /// (a write of the peer's in progress may be seen in part).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range is not inside the region.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.grants
            .first()
            .mr()
            .buffer()
            .load(offset, out)
            .map_err(|()| Error::InvalidArgument("range outside the exposed region"))
    }

    /// Copies `data` in at `offset`, by relaxed atomic stores of whole words and
    /// compare-and-swap of partial ones (a peer reading meanwhile may see it in part).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range is not inside the region.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.grants
            .first()
            .mr()
            .buffer()
            .store(offset, data)
            .map_err(|()| Error::InvalidArgument("range outside the exposed region"))
    }

    /// The 8-byte word at `offset` (a multiple of 8) as an `AtomicU64`: for the words the
    /// peer's atomics use. Whether the device's atomics are atomic with the CPU's depends on
    /// the device (`IBV_ATOMIC_GLOB` says they are); with `IBV_ATOMIC_HCA` (rdma_rxe, which
    /// applies them under a lock of its own, as a plain read and store of the word) a load
    /// sees the old or the new value on aligned words in practice (x86-64, arm64), and a CPU
    /// read-modify-write racing a peer's atomic can lose one of the two updates.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the word is not inside the region or not aligned.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        self.grants
            .first()
            .mr()
            .buffer()
            .word(offset)
            .ok_or(Error::InvalidArgument(
                "an atomic word is 8-byte aligned and inside the exposed region",
            ))
    }

    /// Grants access to the same bytes once more, through a registration of their own: the
    /// new grant's descriptor, whose rkey [`revoke_grant`](Self::revoke_grant) revokes alone
    /// (a peer using it afterwards gets a remote access error) while the other grants stay.
    /// One grant per peer makes each revocable on its own. This is the fallback the verbs
    /// offer where memory windows are not used (evchan uses none: on rdma_rxe, Linux 6.1, a
    /// type-2 window does not limit the range a peer reaches): one registration per grant.
    /// Like the first, each grant is valid on every QP of the protection domain, not only on
    /// one connection's.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_reg_mr` error (`ENOMEM` past `ulimit -l`).
    #[doc(alias = "ibv_reg_mr")]
    pub fn grant(&mut self) -> Result<RemoteBuf<A>> {
        // A device may hand a revoked rkey out again (rdma_rxe: an index and 8 random bits):
        // never one this memory's revoked grants had, which would revive their descriptors.
        let mut reused = Vec::new();
        let rkey = loop {
            let rkey = self.grants.add(A::FLAGS)?;
            if !self.revoked.contains(&rkey) {
                break rkey;
            }
            reused.push(rkey);
        };
        for r in reused {
            self.grants.remove(r)?;
        }
        let first = self.descriptor();
        Ok(RemoteBuf::new(first.addr(), first.len(), rkey))
    }

    /// Revokes the grant `grant` (from [`grant`](Self::grant)) alone: once this returned, a
    /// peer's request with its rkey is refused (a remote access error at the peer) and places
    /// no data, as for [`revoke`](Self::revoke), and no later grant of this memory gets that
    /// rkey again; the bytes stay exposed through the other grants.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `grant` is not a further grant of this memory (the
    /// first one goes only with [`revoke`](Self::revoke)); [`Error::Io`] with the
    /// `ibv_dereg_mr` error: that registration may still be in force, so the memory is never
    /// given back (`revoke` then deregisters the other grants and fails, and a drop leaks
    /// it), and [`grants`](Self::grants) no longer counts it.
    #[doc(alias = "ibv_dereg_mr")]
    pub fn revoke_grant(&mut self, grant: &RemoteBuf<A>) -> Result<()> {
        if grant.addr() != self.descriptor().addr() || !self.grants.remove(grant.rkey())? {
            return Err(Error::InvalidArgument(
                "not a further grant of this exposed memory",
            ));
        }
        self.revoked.push(grant.rkey());
        Ok(())
    }

    /// How many grants are in force: the first, and those of [`grant`](Self::grant) not
    /// revoked.
    #[must_use]
    pub fn grants(&self) -> usize {
        1 + self.grants.rkeys().count()
    }

    /// Revokes every peer's access (`ibv_dereg_mr` of every grant) and gives the memory back,
    /// once nothing can reach it (see the [module docs](crate::verbs::remote)).
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_dereg_mr` error; the memory is then leaked (that
    /// registration may still be in force). After a failed
    /// [`revoke_grant`](Self::revoke_grant), [`Error::InvalidArgument`]: every other grant is
    /// deregistered, and the memory leaked.
    pub fn revoke(self) -> Result<Revoked> {
        self.grants.into_inner().map(Revoked)
    }
}

impl<A: Access> fmt::Debug for Exposed<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exposed")
            .field("descriptor", &self.descriptor())
            .finish()
    }
}

/// Memory whose exposure was revoked ([`Exposed::revoke`]): no device can reach it any more,
/// so it is plain bytes again.
pub struct Revoked(ExposedMem);

impl std::ops::Deref for Revoked {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.0.revoked_bytes()
    }
}

impl std::ops::DerefMut for Revoked {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.revoked_bytes_mut()
    }
}

impl fmt::Debug for Revoked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Revoked").field("len", &self.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_form_round_trips_and_downgrades() {
        let d = RemoteBuf::<RemoteReadWrite>::new(0x1000, 4096, 0xabcd);
        let b = d.to_bytes();
        assert_eq!(&b[..4], b"RB\x01\x03");
        assert_eq!(RemoteBuf::<RemoteReadWrite>::from_bytes(&b), Ok(d));
        let r = RemoteBuf::<RemoteRead>::from_bytes(&b).unwrap();
        assert_eq!((r.addr(), r.len(), r.rkey()), (0x1000, 4096, 0xabcd));
        assert!(matches!(
            RemoteBuf::<RemoteAtomic>::from_bytes(&b),
            Err(RemoteError::Access {
                granted: 3,
                needed: 4
            })
        ));
    }

    #[test]
    fn bad_descriptors_are_typed_errors() {
        let good = RemoteBuf::<RemoteWrite>::new(8, 8, 1).to_bytes();
        assert!(matches!(
            RemoteBuf::<RemoteWrite>::from_bytes(&good[..19]),
            Err(RemoteError::Length { got: 19, .. })
        ));
        let mut b = good;
        b[0] = b'X';
        assert_eq!(
            RemoteBuf::<RemoteWrite>::from_bytes(&b),
            Err(RemoteError::Form)
        );
        let mut b = good;
        b[2] = 2;
        assert_eq!(
            RemoteBuf::<RemoteWrite>::from_bytes(&b),
            Err(RemoteError::Form)
        );
        let mut b = good;
        b[3] = 0x12;
        assert!(matches!(
            RemoteBuf::<RemoteWrite>::from_bytes(&b),
            Err(RemoteError::Access { .. })
        ));
        let mut b = good;
        b[12..16].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(
            RemoteBuf::<RemoteWrite>::from_bytes(&b),
            Err(RemoteError::Empty)
        );
        let mut b = good;
        b[4..12].copy_from_slice(&(u64::MAX - 3).to_be_bytes());
        assert_eq!(
            RemoteBuf::<RemoteWrite>::from_bytes(&b),
            Err(RemoteError::Wraps)
        );
    }

    #[test]
    fn ranges_are_checked_against_the_descriptor() {
        let d = RemoteBuf::<RemoteAtomic>::new(0x1000, 64, 7);
        assert_eq!(d.range(0, 64), Ok(0x1000));
        assert_eq!(d.range(60, 4), Ok(0x103c));
        assert!(d.range(60, 5).is_err());
        assert!(d.range(u64::MAX, 2).is_err());
        assert_eq!(d.bytes_range(60, 4), Ok(0x103c));
        assert_eq!(d.bytes_range(0, 0), Err(RemoteError::Empty));
        assert!(d.bytes_range(60, 5).is_err());
        assert_eq!(d.word(8), Ok(0x1008));
        assert!(matches!(d.word(4), Err(RemoteError::Misaligned { .. })));
        assert!(d.word(64).is_err());
        let s = d.slice(16, 16).unwrap();
        assert_eq!((s.addr(), s.len(), s.rkey()), (0x1010, 16, 7));
        assert!(d.slice(56, 16).is_err());
        assert!(d.slice(0, 0).is_err());
        let p = RemoteBuf::<RemoteWrite>::from_parts(0x2000, 64, 9).unwrap();
        assert_eq!((p.addr(), p.len(), p.rkey()), (0x2000, 64, 9));
        assert_eq!(
            RemoteBuf::<RemoteWrite>::from_parts(0x2000, 0, 9),
            Err(RemoteError::Empty)
        );
        assert_eq!(
            RemoteBuf::<RemoteRead>::from_parts(u64::MAX - 7, 16, 9),
            Err(RemoteError::Wraps)
        );
    }

    proptest::proptest! {
        /// No decoded descriptor, sliced and ranged any way, names a byte outside the range
        /// its wire form gave; decoding never panics.
        #[test]
        fn nothing_decoded_reaches_outside_its_range(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24),
            addr: u64, len: u32, ops in proptest::collection::vec((0u64..1 << 33, 0u64..1 << 33), 0..8),
        ) {
            let _ = RemoteBuf::<RemoteRead>::from_bytes(&bytes);
            let mut wire = RemoteBuf::<RemoteReadWrite>::new(addr, len, 1).to_bytes();
            if let Ok(d) = RemoteBuf::<RemoteReadWrite>::from_bytes(&wire) {
                let (lo, hi) = (d.addr(), d.addr() + u64::from(d.len()));
                let mut cur = d;
                for (off, n) in ops {
                    if let Ok(a) = cur.range(off, n) {
                        proptest::prop_assert!(a >= lo && a + n <= hi);
                    }
                    if let Ok(s) = cur.slice(off, u32::try_from(n).unwrap_or(u32::MAX)) {
                        proptest::prop_assert!(s.addr() >= lo && s.addr() + u64::from(s.len()) <= hi);
                        cur = s;
                    }
                }
            }
            wire[3] = 1;
            let _ = RemoteBuf::<RemoteWrite>::from_bytes(&wire);
        }
    }
}
