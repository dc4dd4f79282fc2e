//! Async RDMA connections on tokio.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod proto;

pub use evchan_core as core;
