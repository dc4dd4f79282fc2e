//! The async API's untrusted input from a peer: the private-data handshake
//! (`evchan::proto::decode`) and the immediate data of every message a hostile peer sends
//! (`evchan::proto::Credits::on_receive`), decoded by the same functions the driver uses.
//!
//! Checked: decoding never panics; a decoded handshake satisfies the limits and exposes no
//! more user data than follows the header; however the peer's messages are forged, the
//! receiver never holds more data messages than it granted, and the sender never believes
//! it has more credits than the peer offered.
//!
//! Run: `cargo xtask fuzz handshake`.
#![no_main]

use evchan::proto::{self, handshake::HEADER_LEN, Credits, Handshake, Kind, Peer};
use libfuzzer_sys::fuzz_target;

mod input;
use input::Input;

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    // A handshake from the first bytes, as it arrives in CONNECT_REQUEST / ESTABLISHED.
    let len = usize::from(input.u8());
    let wire: Vec<u8> = (0..len).map(|_| input.u8()).collect();
    let peer = match proto::decode(&wire) {
        Ok(Peer::Evchan(hs, user)) => {
            assert!(hs.validate().is_ok());
            assert!(user.len() + HEADER_LEN <= wire.len());
            hs
        }
        Ok(Peer::Plain(user)) => {
            assert_eq!(user, wire);
            return;
        }
        Err(_) => return,
    };
    // Then that peer's messages: each an immediate value and a length.
    let data_slots = 1 + u32::from(input.u8() % 8);
    let mine = Handshake {
        initial: 1 + u32::from(input.u8()) % data_slots,
        data_slots,
        ctrl_slots: 3 + u16::from(input.u8() % 3),
        max_message: 64,
    };
    let mut credits = Credits::new(mine, peer);
    for _ in 0..64 {
        if input.0.is_empty() {
            break;
        }
        let imm = match input.u8() % 4 {
            0 => None,
            _ => Some(input.u32()),
        };
        let len = u32::from(input.u8());
        match credits.on_receive(imm, len) {
            Ok(Kind::Data) => {
                assert!(credits.data_held() + credits.data_granted() <= mine.data_slots);
                if input.u8() % 2 == 0 {
                    credits.consumed();
                }
            }
            Ok(_) => {}
            Err(_) => return, // the connection is dropped
        }
        assert!(credits.data_credits() <= peer.data_slots);
        let n = credits.receives_wanted();
        credits.granted(n);
        assert!(credits.data_held() + credits.data_granted() <= mine.data_slots);
        if input.u8() % 2 == 0 {
            let _ = credits.send_data();
        }
        let _ = credits.credit_update();
    }
});
