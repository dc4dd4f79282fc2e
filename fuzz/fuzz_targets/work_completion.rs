//! A raw `ibv_wc` with every field from the input, decoded as `Cq::poll` decodes what
//! `ibv_poll_cq` returns (`evchan_core::fuzzing::work_completion`) into `WorkCompletion`.
//!
//! Checked: unknown statuses and opcodes come through as values; the fields libibverbs leaves
//! undefined on an error status (opcode, immediate data) are hidden; the rest is copied as is.
//!
//! Run: `cargo xtask fuzz work_completion`.
#![no_main]

use std::mem::MaybeUninit;

use evchan_core::verbs::{WcOpcode, WcStatus};
use evchan_sys as sys;
use libfuzzer_sys::fuzz_target;

mod input;
use input::Input;

/// `IBV_WC_WITH_IMM`
const WITH_IMM: u32 = 2;

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    // SAFETY: `ibv_wc` is plain data (u32 codes, integers, a u32 union): all zeros is valid.
    let mut wc: sys::ibv_wc = unsafe { MaybeUninit::zeroed().assume_init() };
    wc.wr_id = input.u64();
    wc.status = input.code(24);
    wc.opcode = match input.u8() % 4 {
        0 => input.code(10),
        1 => 128u32.wrapping_add(input.code(2)),
        _ => input.u32(),
    };
    wc.vendor_err = input.u32();
    wc.byte_len = input.u32();
    let imm = input.u32();
    wc.imm_data_invalidated_rkey_union.imm_data = imm;
    wc.qp_num = input.u32();
    wc.src_qp = input.u32();
    wc.wc_flags = input.u32();
    wc.pkey_index = input.u16();
    wc.slid = input.u16();
    wc.sl = input.u8();
    wc.dlid_path_bits = input.u8();

    let c = evchan_core::fuzzing::work_completion(&wc);
    assert_eq!(c.status().to_raw(), wc.status);
    assert_eq!(c.status(), WcStatus::from_raw(wc.status));
    assert_eq!(c.is_success(), wc.status == 0);
    assert_eq!(c.is_success(), c.status() == WcStatus::Success);
    match c.opcode() {
        Some(op) => {
            assert!(c.is_success(), "an opcode on an error status");
            assert_eq!(op, WcOpcode::from_raw(wc.opcode));
            assert_eq!(op.to_raw(), wc.opcode);
        }
        None => assert!(!c.is_success()),
    }
    let want_imm = (wc.status == 0 && wc.wc_flags & WITH_IMM != 0).then(|| u32::from_be(imm));
    assert_eq!(c.imm_data(), want_imm);
    assert_eq!(
        (c.wr_id(), c.byte_len(), c.qp_num(), c.src_qp(), c.vendor_err(), c.wc_flags()),
        (wc.wr_id, wc.byte_len, wc.qp_num, wc.src_qp, wc.vendor_err, wc.wc_flags)
    );
    let _ = format!("{c:?}");
});
