//! Decoding of rdma_cm event fields as the kernel hands them over: any event code, any status,
//! any port space and message. Nothing may panic; codes must round-trip.
//!
//! Run: `cargo +nightly fuzz run cm_event_decode` (in `fuzz/`).
#![no_main]

use evchan_core::cm::{EventKind, Message, PortSpace, Status};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u32, i32, u32, u8)| {
    let (code, raw_status, ps_code, message) = input;

    let kind = EventKind::from_code(code);
    assert_eq!(kind.code(), code, "event codes round-trip");
    assert!(!kind.name().is_empty());
    assert!(kind.to_string().starts_with("RDMA_CM_EVENT_"));

    let status = Status::new(kind, raw_status);
    assert_eq!(status.is_success(), raw_status == 0);
    if kind == EventKind::Rejected && raw_status != 0 {
        assert_eq!(status.reject_reason().map(|r| r.0), Some(raw_status));
    }
    let _ = status.io_error();
    let _ = status.to_string();

    let ps = PortSpace::from_code(ps_code);
    assert_eq!(ps.code(), ps_code, "port-space codes round-trip");
    let message = match message % 3 {
        0 => Message::Connect,
        1 => Message::Accept,
        _ => Message::Reject,
    };
    let limit = ps.private_data_limit(message);
    assert!((56..=196).contains(&limit), "limit {limit} for {ps:?} {message}");
});
