//! A raw `ibv_async_event` of any type, unknown ones included, decoded as
//! `Context::get_async_event` decodes what `ibv_get_async_event` returns
//! (`evchan_core::fuzzing::async_event`, acks included) into the typed `AsyncEvent`.
//!
//! The element is what libibverbs puts there for the type: a CQ, QP, SRQ or WQ (objects made
//! here, zeroed but for the fields read, with glibc's zero-initialised mutex and condition
//! variable for the ack), else the port number — with the union's other bytes arbitrary, so
//! that reading a port number as a pointer crashes.
//!
//! Run: `cargo xtask fuzz async_event`.
#![no_main]

use std::mem::{offset_of, MaybeUninit};
use std::ptr::addr_of_mut;

use evchan_core::verbs::{AsyncElement, AsyncEventKind};
use evchan_sys as sys;
use libfuzzer_sys::fuzz_target;

mod input;
use input::Input;

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let event_type = input.code(20);
    let element_bytes: [u8; 8] = input.bytes();
    let token = input.u64();
    let qp_num = input.u32();

    let mut cq = MaybeUninit::<sys::ibv_cq>::zeroed();
    let mut qp = MaybeUninit::<sys::ibv_qp>::zeroed();
    let mut srq = MaybeUninit::<sys::ibv_srq>::zeroed();
    let mut wq = MaybeUninit::<sys::ibv_wq>::zeroed();
    // SAFETY: writing fields of our own zeroed structs.
    unsafe {
        addr_of_mut!((*cq.as_mut_ptr()).cq_context).write(token as usize as *mut _);
        addr_of_mut!((*qp.as_mut_ptr()).qp_num).write(qp_num);
    }
    let object: Option<*mut u8> = match event_type {
        0 => Some(cq.as_mut_ptr().cast()),
        1..=7 | 16 => Some(qp.as_mut_ptr().cast()),
        14 | 15 => Some(srq.as_mut_ptr().cast()),
        19 => Some(wq.as_mut_ptr().cast()),
        _ => None,
    };
    let port = i32::from_le_bytes(element_bytes[..4].try_into().unwrap());

    let mut event = MaybeUninit::<sys::ibv_async_event>::zeroed();
    let base = event.as_mut_ptr().cast::<u8>();
    // SAFETY: byte writes inside our own event: the 8-byte element union, and `event_type` as
    // the C enum's 4 bytes (never as rdma-sys's Rust enum, which a newer value would break).
    unsafe {
        let element = base.add(offset_of!(sys::ibv_async_event, element));
        match object {
            Some(p) => element.cast::<*mut u8>().write_unaligned(p),
            None => element.copy_from_nonoverlapping(element_bytes.as_ptr(), 8),
        }
        base.add(offset_of!(sys::ibv_async_event, event_type))
            .cast::<u32>()
            .write_unaligned(event_type);
    }

    // SAFETY: laid out as libibverbs fills it (see above); the objects outlive the call.
    unsafe {
        evchan_core::fuzzing::async_event(event, |e| {
            assert_eq!(e.kind().to_raw(), event_type);
            assert_eq!(e.kind(), AsyncEventKind::from_raw(event_type));
            let want = match event_type {
                0 => AsyncElement::Cq(e_cq(e)),
                1..=7 | 16 => AsyncElement::Qp(qp_num),
                14 | 15 => AsyncElement::Srq,
                19 => AsyncElement::Wq,
                8 => AsyncElement::Device,
                _ => AsyncElement::Port(u8::try_from(port).unwrap_or(0)),
            };
            assert_eq!(e.element(), want);
            if let AsyncElement::Cq(id) = e.element() {
                assert_eq!(id.get(), token);
            }
            let _ = format!("{e:?}");
        });
    }
});

/// The CQ id the event names (checked against the token separately).
fn e_cq(e: &evchan_core::verbs::AsyncEvent<'_>) -> evchan_core::verbs::CqId {
    match e.element() {
        AsyncElement::Cq(id) => id,
        other => panic!("a CQ event names {other:?}"),
    }
}
