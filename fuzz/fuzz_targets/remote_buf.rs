//! A peer's remote buffer descriptor (`evchan_core::verbs::RemoteBuf::from_bytes`), the
//! untrusted input of one-sided access, and the sub-ranges (`slice`) made from it; the posts'
//! range checks (crate-private) are property-tested in `verbs::remote`.
//!
//! Checked: decoding never panics; a decoded descriptor is not empty and does not wrap; its
//! wire form round-trips; no slice made from it, in any sequence, names a byte outside the
//! range its bytes gave.
//!
//! Run: `cargo xtask fuzz remote_buf`.
#![no_main]

use evchan_core::verbs::{RemoteBuf, RemoteRead, RemoteReadWrite};
use libfuzzer_sys::fuzz_target;

mod input;
use input::Input;

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let len = usize::from(input.u8() % 24);
    let wire: Vec<u8> = (0..len).map(|_| input.u8()).collect();
    let _ = RemoteBuf::<RemoteReadWrite>::from_bytes(&wire);
    let Ok(d) = RemoteBuf::<RemoteRead>::from_bytes(&wire) else {
        return;
    };
    assert!(!d.is_empty());
    let (lo, hi) = (d.addr(), d.addr().checked_add(u64::from(d.len())).expect("no wrap"));
    assert_eq!(RemoteBuf::<RemoteRead>::from_bytes(&d.to_bytes()), Ok(d));
    let mut cur = d;
    while !input.0.is_empty() {
        let offset = u64::from(input.u32());
        let n = input.u32();
        if let Ok(s) = cur.slice(offset, n) {
            assert!(s.addr() >= lo && s.addr() + u64::from(s.len()) <= hi);
            assert_eq!(s.rkey(), d.rkey());
            cur = s;
        }
    }
});
