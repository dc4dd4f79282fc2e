//! An `rdma_cm_event` whose every field comes from the input, decoded by the library's own
//! code (`evchan_core::fuzzing::cm_event`, the path of `EventChannel::get_event`) into the
//! typed `cm::Event`.
//!
//! The event is built as librdmacm could hand it over, with everything else arbitrary: any
//! event code (unknown ones too), any status, an id of any QP type (UD for the UDP/IPoIB port
//! spaces, RC, any value) or none, arbitrary bytes in the whole `param` union, and
//! `private_data_len` 0–255 with the pointer null or to exactly that many bytes — into the
//! input when it has them, else into an allocation of exactly that size — so that the address
//! sanitizer sees any read past what exists. For `MULTICAST_JOIN`/`MULTICAST_ERROR` librdmacm
//! puts the join's user context in `param.ud.private_data`: here a one-byte allocation.
//!
//! Checked: nothing panics or reads out of bounds; the private data is exactly what exists
//! (none for multicast events, a null pointer or a zero length); the union member read is the
//! one librdmacm filled (`ud` for UD ids and multicast events, `conn` otherwise).
//!
//! Run: `cargo xtask fuzz cm_event` (or `cargo fuzz run cm_event` in the repository root).
#![no_main]

use std::mem::{offset_of, size_of, MaybeUninit};
use std::ptr::{addr_of_mut, NonNull};

use evchan_core::cm::{EventKind, Status};
use evchan_sys as sys;
use libfuzzer_sys::fuzz_target;

mod input;
use input::Input;

const MULTICAST_JOIN: u32 = 12;
const MULTICAST_ERROR: u32 = 13;

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let flags = input.u8();
    let code = input.code(20);
    let status = input.i32();
    let qp_type = match flags & 3 {
        0 => sys::ibv_qp_type::IBV_QPT_RC,
        1 => sys::ibv_qp_type::IBV_QPT_UD,
        2 => input.u32(),
        _ => sys::ibv_qp_type::IBV_QPT_UC,
    };
    let has_id = flags & 4 == 0;
    let has_listen_id = flags & 8 == 0;
    let null_private_data = flags & 16 != 0;
    let union_bytes = input.take(size_of::<sys::param_t>());

    // The ids: only `qp_type` of `id` is read; the rest is zero (never dereferenced).
    let mut id = MaybeUninit::<sys::rdma_cm_id>::zeroed();
    // SAFETY: writing one field of our own zeroed struct.
    unsafe { addr_of_mut!((*id.as_mut_ptr()).qp_type).write(qp_type) };
    let mut listen_id = MaybeUninit::<sys::rdma_cm_id>::zeroed();

    let mut event = MaybeUninit::<sys::rdma_cm_event>::zeroed();
    let ev = event.as_mut_ptr();
    // Layout facts the model relies on: both members keep the private data in one place.
    assert_eq!(
        offset_of!(sys::rdma_conn_param, private_data_len),
        offset_of!(sys::rdma_ud_param, private_data_len)
    );
    assert_eq!(offset_of!(sys::rdma_conn_param, private_data), 0);
    assert_eq!(offset_of!(sys::rdma_ud_param, private_data), 0);
    let multicast = matches!(code, MULTICAST_JOIN | MULTICAST_ERROR);
    let user_context = Box::new(0x5au8);
    let len;
    let mut exact: Vec<u8>;
    let expected: &[u8];
    // SAFETY: `ev` points to our own zeroed event; every field written is plain data or a
    // pointer we own, and the union is written byte by byte within its size.
    unsafe {
        addr_of_mut!((*ev).id).write(if has_id { id.as_mut_ptr() } else { std::ptr::null_mut() });
        addr_of_mut!((*ev).listen_id).write(if has_listen_id {
            listen_id.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        });
        addr_of_mut!((*ev).event).write(code);
        addr_of_mut!((*ev).status).write(status);
        let param = addr_of_mut!((*ev).param).cast::<u8>();
        param.copy_from_nonoverlapping(union_bytes.as_ptr(), union_bytes.len());
        len = usize::from(addr_of_mut!((*ev).param.conn.private_data_len).read());
        let pointer: *const u8 = if multicast {
            expected = &[];
            if null_private_data {
                std::ptr::null()
            } else {
                &*user_context
            }
        } else if null_private_data {
            expected = &[];
            std::ptr::null()
        } else {
            let rest = input.rest();
            if rest.len() >= len {
                expected = &rest[..len];
            } else {
                // As RoCE pads a short message: what came, then zeros; exactly `len` bytes.
                exact = rest.to_vec();
                exact.resize(len, 0);
                expected = &exact;
            }
            expected.as_ptr()
        };
        addr_of_mut!((*ev).param.conn.private_data).write(pointer.cast());
    }
    let ud = has_id && qp_type == sys::ibv_qp_type::IBV_QPT_UD;
    // What librdmacm wrote, read through the member it wrote.
    // SAFETY: the union is fully initialised (zeroed, then written); both members are plain
    // data apart from the pointer, which is only copied.
    let (conn, ud_param) = unsafe { ((*ev).param.conn, (*ev).param.ud) };

    // SAFETY: laid out as librdmacm hands events over (see above); the ids, the private data
    // and the user context outlive the call.
    unsafe {
        evchan_core::fuzzing::cm_event(NonNull::new_unchecked(ev), |e| {
            let kind = e.kind();
            assert_eq!(kind.code(), code, "event codes round-trip");
            assert_eq!(kind == EventKind::from_code(code), true);
            assert!(kind.to_string().starts_with("RDMA_CM_EVENT_"));
            assert_eq!(e.raw_status(), status);
            assert_eq!(e.status(), Status::new(kind, status));
            assert_eq!(e.status().is_success(), status == 0);
            let _ = e.status().to_string();

            let data = e.private_data();
            // Read every byte here, in instrumented code (std's own loops, e.g. in `==` or
            // `Debug`, are not), so that the sanitizer sees a read past what exists.
            for b in data {
                std::hint::black_box(*b);
            }
            assert!(
                data.len() <= len,
                "{} bytes of private data exposed, {len} exist",
                data.len()
            );
            if len == 0 {
                assert!(data.is_empty());
            } else {
                assert_eq!(data, expected, "the private data is exactly what exists");
            }

            assert_eq!(e.conn_info().is_some(), !ud && !multicast, "{e:?}");
            assert_eq!(e.ud_info().is_some(), ud || multicast, "{e:?}");
            if let Some(c) = e.conn_info() {
                assert_eq!(c.qp_num, conn.qp_num);
                assert_eq!(c.srq, conn.srq != 0);
                assert_eq!(c.responder_resources, conn.responder_resources);
                assert_eq!(c.rnr_retry_count, conn.rnr_retry_count);
            }
            if let Some(u) = e.ud_info() {
                assert_eq!((u.qp_num, u.qkey), (ud_param.qp_num, ud_param.qkey));
                let a = ud_param.ah_attr;
                assert_eq!(u.ah_attr.dlid, a.dlid);
                assert_eq!(u.ah_attr.port_num, a.port_num);
                assert_eq!(u.ah_attr.global.is_some(), a.is_global != 0);
                if let Some(g) = u.ah_attr.global {
                    assert_eq!(g.dgid, a.grh.dgid.raw);
                    assert_eq!(g.flow_label, a.grh.flow_label);
                    let _ = g.dgid_ip();
                }
            }
            assert_eq!(e.listener().is_some(), has_listen_id);
            assert!(!e.has_request());
            assert!(e.take_request().is_none());
            let _ = format!("{e:?}");
        });
    }
    drop(user_context);
});
