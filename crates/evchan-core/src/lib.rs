//! Safe, synchronous core of evchan.
#![deny(unsafe_code)]

mod ffi;
pub mod verbs;
