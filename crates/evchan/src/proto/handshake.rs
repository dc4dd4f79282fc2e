//! The versioned handshake carried in the private data of `rdma_connect` and `rdma_accept`.
//!
//! ```text
//! 0      4        5          6            8         10           12        16
//! | EVCH | version | user_len | ctrl_slots | initial | data_slots | max_msg | user private data …
//! ```
//! Integers are big-endian. `initial` receives for data of `max_msg` bytes each, plus
//! `ctrl_slots` more, are posted by the side that sends the handshake before it connects or
//! accepts: the peer's first credits. It grants more as it posts more receives, with at most
//! `data_slots` data messages in flight toward it or held ([`super::Credits`]). The user's own
//! private data follows, `user_len` bytes of it: RoCE/IB pads private data with zeros to the
//! message's full size, so the length must travel with it.
//!
//! Version 1 (evchan 0.1's) had no `initial`: its peer posted all `data_slots` at once and
//! returned a credit per message consumed. The two do not mix; a version 1 peer is refused
//! with [`HandshakeError::Version`].
//!
//! A peer whose private data does not start with the magic is a plain librdmacm program: it
//! gets no flow control of ours ([`Peer::Plain`]). A peer whose data starts with the magic but
//! is malformed is refused with a typed [`HandshakeError`]; decoding never panics, whatever the
//! bytes.

use std::fmt;

/// The four bytes that open an evchan handshake.
pub const MAGIC: [u8; 4] = *b"EVCH";
/// The only protocol version this crate speaks.
pub const VERSION: u8 = 2;
/// Size of the handshake header in bytes; the user's private data follows it.
pub const HEADER_LEN: usize = 16;
/// The fewest control slots a peer may offer: credit updates and the close message need a
/// budget of their own that can never be taken by data (see [`super::Credits`]).
pub const MIN_CTRL_SLOTS: u16 = 3;
/// The most data slots one side may offer (the credit counters wrap at 2^15).
pub const MAX_DATA_SLOTS: u32 = 1 << 13;

/// What one side tells the other it can receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handshake {
    /// Receives for data posted before the connection: the peer's first data credits.
    pub initial: u32,
    /// The most data messages in flight toward this side or held by its application.
    pub data_slots: u32,
    /// Receives posted for control messages (credit updates, close).
    pub ctrl_slots: u16,
    /// The largest message, in bytes, each receive holds.
    pub max_message: u32,
}

/// The peer, as its private data shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// An evchan peer: its handshake and the user data after it.
    Evchan(Handshake, Vec<u8>),
    /// A plain librdmacm program (no magic): all of its private data is user data.
    Plain(Vec<u8>),
}

/// A malformed handshake from a peer that sent the magic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Fewer bytes than the header.
    #[error("handshake truncated: {0} bytes, the header has 16")]
    Truncated(usize),
    /// A version this crate does not speak.
    #[error("handshake version {0} is not supported (this side speaks version 2)")]
    Version(u8),
    /// The user data length points past the private data.
    #[error("handshake user data of {claimed} bytes, but only {present} bytes follow the header")]
    UserLen {
        /// What the header says.
        claimed: usize,
        /// What is there.
        present: usize,
    },
    /// Zero or too many data slots, an initial grant outside `1..=data_slots`, too few
    /// control slots, or a zero maximum message size.
    #[error("handshake offers {initial} of {data_slots} data slots, {ctrl_slots} control slots, {max_message} B messages: outside 1..=8192, >= 3, >= 1")]
    Limits {
        /// Data credits granted at first.
        initial: u32,
        /// Data slots offered.
        data_slots: u32,
        /// Control slots offered.
        ctrl_slots: u16,
        /// Maximum message size offered.
        max_message: u32,
    },
}

impl Handshake {
    /// Checks the limits a peer's handshake must satisfy.
    ///
    /// # Errors
    /// [`HandshakeError::Limits`].
    pub fn validate(self) -> Result<Self, HandshakeError> {
        let ok = (1..=MAX_DATA_SLOTS).contains(&self.data_slots)
            && (1..=self.data_slots).contains(&self.initial)
            && self.ctrl_slots >= MIN_CTRL_SLOTS
            && self.max_message >= 1;
        if ok {
            Ok(self)
        } else {
            Err(HandshakeError::Limits {
                initial: self.initial,
                data_slots: self.data_slots,
                ctrl_slots: self.ctrl_slots,
                max_message: self.max_message,
            })
        }
    }

    /// The header followed by `user` (the caller checks `user` against the message's limit
    /// less [`HEADER_LEN`]; at most 255 bytes are ever needed on RoCE/IB).
    #[must_use]
    pub fn encode(&self, user: &[u8]) -> Vec<u8> {
        let user_len = u8::try_from(user.len()).unwrap_or(u8::MAX);
        let mut out = Vec::with_capacity(HEADER_LEN + user.len());
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(user_len);
        out.extend_from_slice(&self.ctrl_slots.to_be_bytes());
        // Both at most MAX_DATA_SLOTS once validated; saturated otherwise (then refused).
        let u16_of = |n: u32| u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes();
        out.extend_from_slice(&u16_of(self.initial));
        out.extend_from_slice(&u16_of(self.data_slots));
        out.extend_from_slice(&self.max_message.to_be_bytes());
        out.extend_from_slice(&user[..usize::from(user_len)]);
        out
    }
}

/// Decodes a peer's private data, as untrusted input.
///
/// # Errors
/// [`HandshakeError`] when the data starts with the magic but is not a valid handshake.
pub fn decode(data: &[u8]) -> Result<Peer, HandshakeError> {
    if data.len() < MAGIC.len() || data[..4] != MAGIC {
        return Ok(Peer::Plain(data.to_vec()));
    }
    let Some(header) = data.get(..HEADER_LEN) else {
        return Err(HandshakeError::Truncated(data.len()));
    };
    if header[4] != VERSION {
        return Err(HandshakeError::Version(header[4]));
    }
    let user_len = usize::from(header[5]);
    let ctrl_slots = u16::from_be_bytes([header[6], header[7]]);
    let initial = u32::from(u16::from_be_bytes([header[8], header[9]]));
    let data_slots = u32::from(u16::from_be_bytes([header[10], header[11]]));
    let max_message = u32::from_be_bytes([header[12], header[13], header[14], header[15]]);
    let rest = &data[HEADER_LEN..];
    let user = rest.get(..user_len).ok_or(HandshakeError::UserLen {
        claimed: user_len,
        present: rest.len(),
    })?;
    let hs = Handshake {
        initial,
        data_slots,
        ctrl_slots,
        max_message,
    }
    .validate()?;
    Ok(Peer::Evchan(hs, user.to_vec()))
}

impl fmt::Display for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} data slots ({} at first) of {} B, {} control slots",
            self.data_slots, self.initial, self.max_message, self.ctrl_slots
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HS: Handshake = Handshake {
        initial: 2,
        data_slots: 16,
        ctrl_slots: 4,
        max_message: 4096,
    };

    #[test]
    fn round_trip_with_padding() {
        let mut wire = HS.encode(b"hello");
        wire.resize(56, 0); // RoCE pads the REQ's private data with zeros
        assert_eq!(decode(&wire), Ok(Peer::Evchan(HS, b"hello".to_vec())));
    }

    #[test]
    fn plain_peer() {
        assert_eq!(decode(&[0; 56]), Ok(Peer::Plain(vec![0; 56])));
        assert_eq!(decode(b"EV"), Ok(Peer::Plain(b"EV".to_vec())));
    }

    #[test]
    fn malformed() {
        assert_eq!(decode(b"EVCH\x02"), Err(HandshakeError::Truncated(5)));
        let mut wire = HS.encode(b"");
        wire[4] = 9;
        assert_eq!(decode(&wire), Err(HandshakeError::Version(9)));
        let mut wire = HS.encode(b"");
        wire[5] = 10;
        assert!(matches!(
            decode(&wire),
            Err(HandshakeError::UserLen {
                claimed: 10,
                present: 0
            })
        ));
        let bad = Handshake {
            ctrl_slots: 2,
            ..HS
        };
        assert!(matches!(
            decode(&bad.encode(b"")),
            Err(HandshakeError::Limits { .. })
        ));
        for (initial, data_slots) in [(0, 16), (17, 16), (1, 0), (1, MAX_DATA_SLOTS + 1)] {
            let bad = Handshake {
                initial,
                data_slots,
                ..HS
            };
            assert!(matches!(
                decode(&bad.encode(b"")),
                Err(HandshakeError::Limits { .. })
            ));
        }
        // Version 1's header, as evchan 0.1 sent it.
        let mut v1 = HS.encode(b"");
        v1[4] = 1;
        assert_eq!(decode(&v1), Err(HandshakeError::Version(1)));
    }

    proptest! {
        #[test]
        fn decode_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&data);
        }

        #[test]
        fn decode_with_magic_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut data = MAGIC.to_vec();
            data.extend(tail);
            if let Ok(Peer::Evchan(hs, user)) = decode(&data) {
                prop_assert!(hs.validate().is_ok());
                prop_assert!(user.len() + HEADER_LEN <= data.len());
            }
        }

        #[test]
        fn round_trip((data_slots, initial) in (1..=MAX_DATA_SLOTS).prop_flat_map(|d| (Just(d), 1..=d)), ctrl_slots in MIN_CTRL_SLOTS.., max_message in 1u32.., user in proptest::collection::vec(any::<u8>(), 0..40)) {
            let hs = Handshake { initial, data_slots, ctrl_slots, max_message };
            prop_assert_eq!(decode(&hs.encode(&user)), Ok(Peer::Evchan(hs, user)));
        }
    }
}
