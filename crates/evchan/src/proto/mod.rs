//! The connection protocol as a sans-IO state machine: the handshake in the private data and
//! the credit-based flow control, with no descriptors and no clock. The driver feeds it events
//! and performs what it returns; the property tests drive it without a device.

pub mod credits;
pub mod handshake;

pub use credits::{Credits, Kind, ProtocolError};
pub use handshake::{decode, Handshake, HandshakeError, Peer};
