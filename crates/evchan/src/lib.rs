//! Async RDMA connections on tokio (in progress: see the issues).
#![forbid(unsafe_code)]

pub use evchan_core as core;
