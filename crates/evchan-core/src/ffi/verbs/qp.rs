//! Queue pairs, and posting work requests on any QP (ours or an rdma_cm id's).

use std::io;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use evchan_sys as sys;
use libc::c_int;

use super::*;

// ---------------------------------------------------------------------------------------------
// Queue pairs and posting
// ---------------------------------------------------------------------------------------------

/// The capacities of a new QP (`struct ibv_qp_init_attr`'s `cap`, and `sq_sig_all`), for
/// `ibv_create_qp` ([`Qp::new`]) and `rdma_create_qp` (`ffi::cm::Id::create_qp`) alike.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpCaps {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
    pub(crate) sq_sig_all: bool,
}

impl QpCaps {
    /// `struct ibv_qp_init_attr` of a QP of type `qp_type` (`enum ibv_qp_type`) with these
    /// capacities, completing on `send_cq` and `recv_cq` (NULL for `rdma_create_qp` to make
    /// them), with no SRQ and no QP context.
    pub(crate) fn init_attr(
        self,
        qp_type: u32,
        send_cq: *mut sys::ibv_cq,
        recv_cq: *mut sys::ibv_cq,
    ) -> sys::ibv_qp_init_attr {
        sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq,
            recv_cq,
            srq: ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: self.max_send_wr,
                max_recv_wr: self.max_recv_wr,
                max_send_sge: self.max_send_sge,
                max_recv_sge: self.max_recv_sge,
                max_inline_data: self.max_inline_data,
            },
            qp_type,
            sq_sig_all: c_int::from(self.sq_sig_all),
        }
    }
}

/// Whether the PD and both CQs belong to one device context.
///
/// libibverbs passes the CQs to the kernel as *handles*, which the kernel looks up among the
/// objects of the PD's context (its own file). A CQ of another context (another
/// `ibv_open_device` of the device, or librdmacm's context while the CQ is on one opened here)
/// names there either nothing (`EINVAL`) or, worse, some other CQ of that context with the same
/// handle number — which the QP would then complete on, and which our borrow does not keep
/// alive (its destroy then fails with `EBUSY`, and ours succeeds under a QP still using it in
/// the driver's eyes). So a QP is only created when this holds.
pub(crate) fn same_context(pd: &Pd<'_>, send_cq: &Cq<'_>, recv_cq: &Cq<'_>) -> bool {
    // SAFETY: live PD (borrowed); `context` is written once, at its creation.
    let pd_ctx = unsafe { (*pd.ptr.as_ptr()).context };
    // SAFETY: live CQ (borrowed); as above.
    let send_ctx = unsafe { (*send_cq.ptr.as_ptr()).context };
    // SAFETY: live CQ (borrowed); as above.
    let recv_ctx = unsafe { (*recv_cq.ptr.as_ptr()).context };
    send_ctx == pd_ctx && recv_ctx == pd_ctx
}

/// [`same_context`], as the `EINVAL` that librdmacm gives for a PD of another context.
pub(crate) fn check_same_context(
    pd: &Pd<'_>,
    send_cq: &Cq<'_>,
    recv_cq: &Cq<'_>,
) -> io::Result<()> {
    if same_context(pd, send_cq, recv_cq) {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }
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
///
/// The QP's state is kept here, not read from `ibv_qp::state`: libibverbs writes that field
/// (plainly, not atomically) in `ibv_modify_qp`, which may run on another thread (`Qp` is
/// `Sync`), so reading it would be a data race. Every modify of this QP goes through
/// [`Qp::modify`], which records the new state after the call succeeded, under a lock that
/// orders the modifies.
#[derive(Debug)]
pub(crate) struct Qp<'res> {
    ptr: NonNull<sys::ibv_qp>,
    /// The state the last successful modify set (`enum ibv_qp_state`; RESET at creation).
    state: AtomicU32,
    /// Held across `ibv_modify_qp` and the update of `state`.
    modifying: Mutex<()>,
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

impl Sge {
    /// The element in C's layout.
    #[inline]
    fn to_c(self) -> sys::ibv_sge {
        sys::ibv_sge {
            addr: self.addr,
            length: self.length,
            lkey: self.lkey,
        }
    }
}

impl<'res> Qp<'res> {
    /// `ibv_create_qp` of a QP of type `qp_type` on `pd`.
    pub(crate) fn new(
        pd: &'res Pd<'_>,
        send_cq: &'res Cq<'_>,
        recv_cq: &'res Cq<'_>,
        qp_type: u32,
        caps: QpCaps,
    ) -> io::Result<Self> {
        check_same_context(pd, send_cq, recv_cq)?;
        let mut attr = caps.init_attr(qp_type, send_cq.ptr.as_ptr(), recv_cq.ptr.as_ptr());
        // SAFETY: live PD and CQs (borrowed for 'res) of one device context (checked above);
        // `attr` is fully initialised.
        let qp = unsafe { sys::ibv_create_qp(pd.ptr.as_ptr(), &mut attr) };
        Ok(Qp {
            ptr: NonNull::new(qp).ok_or_else(null_err)?,
            state: AtomicU32::new(sys::ibv_qp_state::IBV_QPS_RESET),
            modifying: Mutex::new(()),
            _res: PhantomData,
        })
    }

    /// The state the last successful [`modify`](Self::modify) set (RESET before any).
    pub(crate) fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// `ibv_modify_qp`, recording the new state when `m` sets one and the call succeeded.
    pub(crate) fn modify(&self, m: &QpModify) -> io::Result<()> {
        let _one_at_a_time = self
            .modifying
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.ptr().modify(m)?;
        if m.mask & sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int != 0 {
            self.state.store(m.state, Ordering::Release);
        }
        Ok(())
    }

    /// The borrowed QP, to post and modify through.
    pub(crate) fn ptr(&self) -> QpPtr<'_> {
        // Destroyed only in `Drop`, after every borrow of `self` has ended.
        Borrowed {
            ptr: self.ptr,
            _owner: PhantomData,
        }
    }
}

impl QpPtr<'_> {
    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: live QP; `qp_num` is written at creation.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    /// `ibv_qp::qp_type` (`enum ibv_qp_type`).
    pub(crate) fn qp_type(&self) -> u32 {
        // SAFETY: live QP; `qp_type` is written at creation.
        unsafe { (*self.ptr.as_ptr()).qp_type }
    }

    /// The PD the QP was created on (`ibv_qp::pd`, written once at creation), for comparison
    /// only: a memory region posted on the QP must be registered with it
    /// ([`Mr::pd_of_mr`]). For an rdma_cm id's QP it is the PD given to `rdma_create_qp`, or
    /// librdmacm's own PD of the id's device.
    pub(crate) fn pd_of_qp(&self) -> *mut sys::ibv_pd {
        // SAFETY: live QP; `pd` is written once, at creation.
        unsafe { (*self.ptr.as_ptr()).pd }
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

    /// `ibv_post_send` of one signaled one-sided work request: `op` against the peer's
    /// memory, with `sges` as the local side (the source of a WRITE, the destination of a READ
    /// or of an atomic's original value). Refused on a UD QP, as [`post_send`](Self::post_send).
    ///
    /// # Safety
    ///
    /// As [`post_send`](Self::post_send), and the device *writes* the local memory of a READ
    /// or an atomic: it must be registered with local write access and not be read or written
    /// by anyone else until the completion. The remote address and key are the peer's
    /// business: a wrong one fails the request at the peer (a remote access error), never
    /// reaching local memory beyond `sges`.
    #[inline]
    pub(crate) unsafe fn post_remote(
        &self,
        wr_id: u64,
        sges: &[Sge],
        op: RemoteOp,
    ) -> io::Result<()> {
        if self.qp_type() != sys::ibv_qp_type::IBV_QPT_RC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "one-sided operations need a reliable connected (RC) QP",
            ));
        }
        let (mut sg, num_sge) = c_sg_list(sges)?;
        // SAFETY: ibv_send_wr is plain data (integers, raw pointers, unions of those); all-zero
        // is valid (NULL next).
        let mut wr: sys::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
        wr.wr_id = wr_id;
        wr.sg_list = sg.as_mut_ptr();
        wr.num_sge = num_sge;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        match op {
            RemoteOp::Write { addr, rkey, imm } => {
                wr.opcode = match imm {
                    Some(imm) => {
                        wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                        sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
                    }
                    None => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                };
                wr.wr.rdma = sys::rdma_t {
                    remote_addr: addr,
                    rkey,
                };
            }
            RemoteOp::Read { addr, rkey } => {
                wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
                wr.wr.rdma = sys::rdma_t {
                    remote_addr: addr,
                    rkey,
                };
            }
            RemoteOp::FetchAdd { addr, rkey, add } => {
                wr.opcode = sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
                wr.wr.atomic = sys::atomic_t {
                    remote_addr: addr,
                    compare_add: add,
                    swap: 0,
                    rkey,
                };
            }
            RemoteOp::CompareSwap {
                addr,
                rkey,
                compare,
                swap,
            } => {
                wr.opcode = sys::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
                wr.wr.atomic = sys::atomic_t {
                    remote_addr: addr,
                    compare_add: compare,
                    swap,
                    rkey,
                };
            }
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: live QP; `wr` and `sg` outlive the call (the provider copies them); the
        // local memory they name is the caller's contract.
        let ret = unsafe { sys::ibv_post_send(self.ptr.as_ptr(), &mut wr, &mut bad) };
        sys::cvt_errno(ret)
    }

    /// `ibv_post_send` of one work request.
    ///
    /// Refused (`InvalidInput`, before the call) on a UD QP (an rdma_cm id of the UDP port
    /// space): a UD send names its destination by an address handle (`wr.ud.ah`), which this
    /// work request does not carry, and the providers dereference that handle unchecked (rxe's
    /// `to_rah(wr->wr.ud.ah)->ah_num`, mlx5's `to_mah(wr->wr.ud.ah)->av`): with NULL, the
    /// process would crash inside libibverbs.
    ///
    /// # Safety
    ///
    /// Every `sge` must lie in memory registered (under its `lkey`) with this QP's PD, and that
    /// memory must stay allocated, registered and not written by anyone else until the work
    /// request's completion has been polled (or the QP is destroyed). Without
    /// `flags.signaled` (and without `sq_sig_all`) no completion comes on success; then until
    /// a later signaled one on the same QP has completed.
    #[inline]
    pub(crate) unsafe fn post_send(
        &self,
        wr_id: u64,
        sges: &[Sge],
        imm: Option<u32>,
        flags: SendFlags,
    ) -> io::Result<()> {
        let (mut sg, num_sge) = c_sg_list(sges)?;
        // SAFETY: `sg` holds `num_sge` elements and outlives the call; the memory they name is
        // the caller's contract.
        unsafe { self.post_send_c(wr_id, sg.as_mut_ptr(), num_sge, imm, flags) }
    }

    /// [`post_send`](Self::post_send) of a C scatter/gather list: what the slice form and the
    /// owned posts (one element, no [`SgList`]) share.
    ///
    /// # Safety
    ///
    /// `sg_list` points to `num_sge` initialised elements that live until the call returns,
    /// and each of them meets [`post_send`](Self::post_send)'s contract.
    #[inline]
    unsafe fn post_send_c(
        &self,
        wr_id: u64,
        sg_list: *mut sys::ibv_sge,
        num_sge: c_int,
        imm: Option<u32>,
        flags: SendFlags,
    ) -> io::Result<()> {
        if self.qp_type() == sys::ibv_qp_type::IBV_QPT_UD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "sends on a UD QP need an address handle, which evchan does not support yet",
            ));
        }
        // SAFETY: ibv_send_wr is plain data (integers, raw pointers, unions of those); all-zero
        // is valid (NULL next, no remote address).
        let mut wr: sys::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
        wr.wr_id = wr_id;
        wr.sg_list = sg_list;
        wr.num_sge = num_sge;
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
        // SAFETY: live QP; `wr` and the list it points to outlive the call (the provider copies
        // them); the memory they name is the caller's contract.
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
    #[inline]
    pub(crate) unsafe fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> io::Result<()> {
        let (mut sg, num_sge) = c_sg_list(sges)?;
        // SAFETY: `sg` holds `num_sge` elements and outlives the call; the memory they name is
        // the caller's contract.
        unsafe { self.post_recv_c(wr_id, sg.as_mut_ptr(), num_sge) }
    }

    /// [`post_recv`](Self::post_recv) of a C scatter/gather list (see
    /// [`post_send_c`](Self::post_send_c)).
    ///
    /// # Safety
    ///
    /// `sg_list` points to `num_sge` initialised elements that live until the call returns,
    /// and each of them meets [`post_recv`](Self::post_recv)'s contract.
    #[inline]
    unsafe fn post_recv_c(
        &self,
        wr_id: u64,
        sg_list: *mut sys::ibv_sge,
        num_sge: c_int,
    ) -> io::Result<()> {
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list,
            num_sge,
        };
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: live QP; `wr` and the list it points to outlive the call; the memory is the
        // caller's contract.
        let ret = unsafe { sys::ibv_post_recv(self.ptr.as_ptr(), &mut wr, &mut bad) };
        sys::cvt_errno(ret)
    }

    /// Posts a send of `mr`'s bytes `range` and keeps the region until the completion.
    ///
    /// `B: 'static`: a forgotten [`Posted`] then leaks the buffer instead of freeing memory the
    /// device may still read (a borrowed buffer's borrow would end at the `forget`).
    #[inline]
    pub(crate) fn post_send_owned<'pd, B: MrBuffer + 'static>(
        &self,
        mr: Mr<'pd, B>,
        range: std::ops::Range<usize>,
        imm: Option<u32>,
        solicited: bool,
    ) -> Result<Posted<'pd, B>, (io::Error, Mr<'pd, B>)> {
        let flags = SendFlags {
            signaled: true,
            solicited,
        };
        self.post_owned(mr, range, |wr_id, sge| {
            // SAFETY: `sge` is one element that outlives the call, and lies in `mr`, registered
            // with the QP's PD (checked by `post_owned`); `mr` (and so its buffer) moves
            // into the Posted that `post_owned` returns, which gives it back only for this
            // work request's completion (signaled, so there is one), or deregisters it before
            // freeing it (no DMA after ibv_dereg_mr), or leaks it.
            unsafe { self.post_send_c(wr_id, sge, 1, imm, flags) }
        })
    }

    /// Posts a receive into `mr`'s bytes `range` and keeps the region until the completion.
    ///
    /// `B: 'static` for the reason given at [`post_send_owned`](Self::post_send_owned).
    #[inline]
    pub(crate) fn post_recv_owned<'pd, B: MrBuffer + 'static>(
        &self,
        mr: Mr<'pd, B>,
        range: std::ops::Range<usize>,
    ) -> Result<Posted<'pd, B>, (io::Error, Mr<'pd, B>)> {
        self.post_owned(mr, range, |wr_id, sge| {
            // SAFETY: as in post_send_owned; the device writes only into `range` of `mr`, which
            // nobody else can reach while Posted holds it.
            unsafe { self.post_recv_c(wr_id, sge, 1) }
        })
    }

    /// The part both owned posts share: `range` of `mr` checked into one C element, a fresh
    /// owned `wr_id` (top bit set), `post` of them, and `mr` kept in the [`Posted`] on success
    /// or given back with the error.
    #[inline]
    fn post_owned<'pd, B: MrBuffer + 'static>(
        &self,
        mr: Mr<'pd, B>,
        range: std::ops::Range<usize>,
        post: impl FnOnce(u64, &mut sys::ibv_sge) -> io::Result<()>,
    ) -> Result<Posted<'pd, B>, (io::Error, Mr<'pd, B>)> {
        if mr.pd_of_mr() != self.pd_of_qp() {
            // The HCA's PD check would refuse it on one device; across two devices the lkey
            // could name a region of the other one.
            let e = io::Error::new(io::ErrorKind::InvalidInput, crate::verbs::ForeignPd);
            return Err((e, mr));
        }
        let sge = match sge_of(&mr, range) {
            Ok(s) => s,
            Err(e) => return Err((e, mr)),
        };
        let wr_id = super::mr::fresh_owned_wr_id();
        // The one element, straight in C's layout: no list to build.
        let mut c_sge = sge.to_c();
        match post(wr_id, &mut c_sge) {
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

/// How many scatter/gather elements [`SgList`] keeps on the stack (the slice posts of the slot
/// pools and `post_*_raw` have one; the owned posts build their one element without a list).
const INLINE_SGES: usize = 4;

/// A work request's C scatter/gather list: on the stack up to [`INLINE_SGES`] elements (no
/// allocation per post), on the heap beyond.
enum SgList {
    Inline([sys::ibv_sge; INLINE_SGES]),
    Heap(Vec<sys::ibv_sge>),
}

impl SgList {
    /// The first element, for `sg_list`; valid while `self` is neither moved nor dropped.
    fn as_mut_ptr(&mut self) -> *mut sys::ibv_sge {
        match self {
            SgList::Inline(a) => a.as_mut_ptr(),
            SgList::Heap(v) => v.as_mut_ptr(),
        }
    }
}

/// `sges` as the C scatter/gather list of a work request, and its length as `num_sge`
/// (`EINVAL` past `c_int`).
#[inline]
fn c_sg_list(sges: &[Sge]) -> io::Result<(SgList, c_int)> {
    let num_sge =
        c_int::try_from(sges.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let sg = if sges.len() <= INLINE_SGES {
        let mut a = [sys::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; INLINE_SGES];
        for (slot, s) in a.iter_mut().zip(sges) {
            *slot = s.to_c();
        }
        SgList::Inline(a)
    } else {
        SgList::Heap(sges.iter().map(|s| s.to_c()).collect())
    };
    Ok((sg, num_sge))
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

/// A one-sided operation against the peer's memory ([`QpPtr::post_remote`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RemoteOp {
    /// RDMA WRITE (with immediate data when `imm` is `Some`).
    Write {
        addr: u64,
        rkey: u32,
        imm: Option<u32>,
    },
    /// RDMA READ.
    Read { addr: u64, rkey: u32 },
    /// 8-byte fetch-and-add.
    FetchAdd { addr: u64, rkey: u32, add: u64 },
    /// 8-byte compare-and-swap.
    CompareSwap {
        addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
}
