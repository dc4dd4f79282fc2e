//! The one module of evchan-core that calls C.
#![allow(unsafe_code)]
